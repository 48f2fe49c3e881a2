#include "util/paths.h"

#include <dlfcn.h>

#include <filesystem>

namespace trainer::detail {

std::string core_library_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&core_library_dir), &info) && info.dli_fname) {
    return std::filesystem::absolute(info.dli_fname).lexically_normal().parent_path().string();
  }
  return {};
}

}  // namespace trainer::detail
