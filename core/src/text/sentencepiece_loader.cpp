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

constexpr const char* kModule = "libtrainer_sentencepiece.so";

/// Where the module may be: beside the binary holding this code (libtrainer_core.so, installed
/// or built), else the build tree's when this code is in a program of the build tree (tests,
/// benchmarks), else the installed library directory.
std::vector<fs::path> module_paths() {
  std::vector<fs::path> paths;
  Dl_info info{};
  fs::path here;
  if (dladdr(reinterpret_cast<void*>(&module_paths), &info) != 0 && info.dli_fname != nullptr) {
    here = fs::absolute(info.dli_fname).lexically_normal();
    paths.push_back(here.parent_path() / kModule);
  }
#ifdef TRAINER_SENTENCEPIECE_BUILD_DIR
  const std::string build = TRAINER_SENTENCEPIECE_BUILD_DIR;
  const std::string tree = fs::path(build).parent_path().string() + "/";
  if (here.string().compare(0, tree.size(), tree) == 0) paths.push_back(fs::path(build) / kModule);
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
    void* handle = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    TRAINER_CHECK(handle != nullptr, "cannot load ", p.string(), " for SentencePiece models: ", dlerror());
    const auto load = reinterpret_cast<Load>(dlsym(handle, "trainer_sentencepiece_load"));
    TRAINER_CHECK(load != nullptr, p.string(), " has no trainer_sentencepiece_load");
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
