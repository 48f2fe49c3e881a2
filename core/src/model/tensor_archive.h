#pragma once
// Private: tensors by dotted name in a TorchScript archive (torch::serialize), nested one
// sub-archive per name component as Module::save nests submodules, so that Python reads the
// file with torch.jit.load(path).<entry>.state_dict() and load_weights() reads it as a
// trainer checkpoint's model.
#include <ATen/core/Tensor.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <map>
#include <string>

namespace trainer::detail {

using NamedTensors = std::map<std::string, at::Tensor>;

/// Writes `tensors` into `archive`: "a.b.c" becomes tensor "c" of sub-archive "b" of
/// sub-archive "a". Tensors are written detached, on the CPU.
void write_nested(torch::serialize::OutputArchive& archive, const NamedTensors& tensors);

/// Every tensor of `archive` and its sub-archives by dotted name (the inverse of write_nested).
void read_nested(torch::serialize::InputArchive& archive, const std::string& prefix, NamedTensors& out);

/// Saves `archive` to `path` durably (write_atomic: a temporary file created new, fsync, rename,
/// fsync of the directory).
void save_archive(torch::serialize::OutputArchive& archive, const std::string& path);

}  // namespace trainer::detail
