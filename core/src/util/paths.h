#pragma once
// Private: where libtrainer_core.so lives, so an installed tree can be relocated.
#include <string>

namespace trainer::detail {

/// Directory of the loaded libtrainer_core.so ("" if unknown).
std::string core_library_dir();

}  // namespace trainer::detail
