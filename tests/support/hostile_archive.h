#pragma once
// A hostile "checkpoint": a 1 KB TorchScript archive whose class declares __setstate__, which
// torch::jit::load (InputArchive::load_from) compiles and runs while reading the file. Its
// __setstate__ creates the file `marker` (torch.from_file with shared=True opens it with
// O_CREAT), standing for anything else such code may do to the user's files. As Python's
// torch.jit.script(module).save(path) writes it (Debian's torch 1.13), the marker path in its
// data.pkl.
#include <string>

#include "support/zip_writer.h"

namespace trainer::testing {

/// The archive's bytes.
inline std::string hostile_archive(const std::string& marker) {
  const std::string code =
      "class Evil(Module):\n"
      "  __parameters__ = []\n"
      "  __buffers__ = []\n"
      "  w : Tensor\n"
      "  training : bool\n"
      "  marker : str\n"
      "  def __getstate__(self: __torch__.Evil) -> Tuple[str, bool]:\n"
      "    return (self.marker, self.training)\n"
      "  def __setstate__(self: __torch__.Evil,\n"
      "    state: Tuple[str, bool]) -> NoneType:\n"
      "    self.marker = (state)[0]\n"
      "    self.training = (state)[1]\n"
      "    self.w = torch.from_file(self.marker, True, 2, dtype=6)\n"
      "    return None\n";
  // Evil.__new__(Evil) built from the state (marker, True): BUILD runs __setstate__.
  const std::string data = std::string("\x80\x02") + "c__torch__\nEvil\n" + ")\x81" + "X" + le(marker.size(), 4) +
                           marker + "\x88" + "\x86" + "b.";
  return zip_archive({{"data.pkl", data, false, std::nullopt, -1},
                      {"code/__torch__.py", code, false, std::nullopt, -1},
                      {"constants.pkl", std::string("\x80\x02).", 4), false, std::nullopt, -1},
                      {"version", "3\n", false, std::nullopt, -1}},
                     "evil");
}

}  // namespace trainer::testing
