// Which std::filesystem this program calls. A pip torch's libtorch.so exports a copy of
// libstdc++'s std::filesystem whose remove_all crashes on a folder that is not empty; the
// build names the system's libstdc++ first in every program so that its definitions are the
// ones bound (CMakeLists.txt), by its path: the shared library, also where the toolchain's own
// folder holds only a static one. Here that is checked where it matters: in a program.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "support/test_util.h"

namespace trainer {
namespace {

using testing::TempDir;
using testing::write_file;

TEST(Linking, StdFilesystemIsTheSystemLibstdcxxsNotLibTorchsCopy) {
  // The address this program's calls of remove_all reach (through the GOT in a PIE), and the
  // library that defines it.
  std::uintmax_t (*const remove_all)(const std::filesystem::path&) = &std::filesystem::remove_all;
  Dl_info info{};
  ASSERT_NE(::dladdr(reinterpret_cast<void*>(remove_all), &info), 0);
  const std::string library = info.dli_fname ? info.dli_fname : "";
  EXPECT_EQ(library.find("libtorch"), std::string::npos)
      << "std::filesystem::remove_all is bound to " << library
      << ": the program names LibTorch before libstdc++ (see CMakeLists.txt)";
  // The shared libstdc++, not a static copy linked into the program (a toolchain whose own
  // folder holds only libstdc++.a links that for -lstdc++; then no program names libstdc++).
  EXPECT_NE(library.find("libstdc++.so"), std::string::npos)
      << "std::filesystem::remove_all is bound to " << library << ", not to the shared libstdc++";
  // And what that copy gets wrong: a folder with files and a folder in it, removed.
  TempDir tmp;
  write_file(tmp / "a/b/c.txt", "x");
  write_file(tmp / "a/d.txt", "y");
  EXPECT_EQ(std::filesystem::remove_all(tmp / "a"), 4u);
  EXPECT_FALSE(std::filesystem::exists(tmp / "a"));
}

}  // namespace
}  // namespace trainer
