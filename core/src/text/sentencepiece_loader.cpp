// Opens libtrainer_sentencepiece.so once, with RTLD_LOCAL | RTLD_DEEPBIND (sentencepiece_model.h
// says why), and
// never closes it: the models it makes live as long as their tokenizers.
#include <dlfcn.h>

#include <filesystem>
#include <mutex>

#include "text/sentencepiece_model.h"
#include "trainer/error.h"

namespace trainer::text::detail {

namespace {

namespace fs = std::filesystem;

using Load = SentencePieceModel* (*)(const char*, std::size_t, const char**);

// AddressSanitizer refuses RTLD_DEEPBIND; its builds (scripts/sanitize.sh) open the module
// without it, which works only in a program without LibTorch's libprotobuf (the tests skip the
// SentencePiece cases there: tests/support/sentencepiece_skip.h).
#if defined(__SANITIZE_ADDRESS__)
constexpr int kDeepBind = 0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr int kDeepBind = 0;
#else
constexpr int kDeepBind = RTLD_DEEPBIND;
#endif
#else
constexpr int kDeepBind = RTLD_DEEPBIND;
#endif

constexpr const char* kModule = "libtrainer_sentencepiece.so";

/// Where the module may be: beside the binary holding this code (libtrainer_core.so, installed
/// or built), else the build tree's when this code is in a program of the build tree (tests,
/// benchmarks), else the installed library directory.
std::vector<fs::path> module_paths() {
  std::vector<fs::path> paths;
  // The binary holding this code, its symbolic links resolved: a shared library's path is
  // absolute; a program's is argv[0], perhaps relative to a directory left since, so a program
  // is found through /proc/self/exe (never the working directory).
  Dl_info info{};
  fs::path here;
  std::error_code ec;
  if (dladdr(reinterpret_cast<void*>(&module_paths), &info) != 0 && info.dli_fname != nullptr &&
      fs::path(info.dli_fname).is_absolute()) {
    here = fs::canonical(info.dli_fname, ec);
  }
  if (here.empty()) here = fs::canonical("/proc/self/exe", ec);
  if (!here.empty()) paths.push_back(here.parent_path() / kModule);
#ifdef TRAINER_SENTENCEPIECE_BUILD_DIR
  const fs::path build = fs::weakly_canonical(TRAINER_SENTENCEPIECE_BUILD_DIR, ec);
  const std::string tree = build.parent_path().string() + "/";
  if (!here.empty() && here.string().compare(0, tree.size(), tree) == 0) paths.push_back(build / kModule);
#endif
#ifdef TRAINER_SENTENCEPIECE_INSTALL_DIR
  paths.push_back(fs::path(TRAINER_SENTENCEPIECE_INSTALL_DIR) / kModule);
#endif
  return paths;
}

Load open_module() {
  std::string tried;
  for (const auto& p : module_paths()) {
    std::error_code ec;
    if (!fs::is_regular_file(p, ec)) {
      tried += (tried.empty() ? "" : ", ") + p.string();
      continue;
    }
    void* handle = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL | kDeepBind);
    TRAINER_CHECK(handle != nullptr, "cannot load ", p.string(), " for SentencePiece models: ", dlerror());
    const auto load = reinterpret_cast<Load>(dlsym(handle, "trainer_sentencepiece_load_v1"));
    TRAINER_CHECK(load != nullptr, p.string(),
                  " has no trainer_sentencepiece_load_v1: a module of another version of trainer");
    return load;
  }
  TRAINER_CHECK(false, "SentencePiece models need ", kModule, ", which is not installed (looked for ", tried, ")");
  return nullptr;
}

}  // namespace

std::unique_ptr<SentencePieceModel> load_sentencepiece(const std::string& bytes, const std::string& name) {
  static std::once_flag once;
  static Load load = nullptr;
  std::call_once(once, [] { load = open_module(); });
  const char* error = "";
  std::unique_ptr<SentencePieceModel> m(load(bytes.data(), bytes.size(), &error));
  TRAINER_CHECK_T(UsageError, m != nullptr, name, ": not a SentencePiece model (", error, ")");
  return m;
}

}  // namespace trainer::text::detail
