// The shim's one out-of-line piece: an explicit instantiation that names a private member may
// appear once in a program, so it lives in this file alone.
#include "util/torch_compat.h"

#include <torch/serialize/input-archive.h>

#include <utility>

namespace trainer::compat {

// torch::serialize::InputArchive holds what it reads in a private jit::Module `module_` (1.13
// to 2.11 at least) that only load_from (torch::jit::load, which runs the archive's code) fills.
// trainer reads archives itself (model/script_archive.h) and places the module it built there,
// naming the member the one way C++ allows: an explicit instantiation may take the address of a
// private member, and a friend defined in it hands that address out. A LibTorch whose
// InputArchive holds something else fails to compile here, the one place to change.
namespace archive_access {
template <class Tag, typename Tag::Type Member>
struct Expose {
  friend typename Tag::Type member(Tag) { return Member; }
};
struct InputArchiveModule {
  using Type = torch::jit::Module torch::serialize::InputArchive::*;
  friend Type member(InputArchiveModule);
};
template struct Expose<InputArchiveModule, &torch::serialize::InputArchive::module_>;
}  // namespace archive_access

/// Fills `archive` with `module` (a tree of attributes, submodules and tensors), as load_from
/// fills it with what torch::jit::load returns.
void set_archive_module(torch::serialize::InputArchive& archive, torch::jit::Module module) {
  archive.*member(archive_access::InputArchiveModule{}) = std::move(module);
}

}  // namespace trainer::compat
