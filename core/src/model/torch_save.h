#pragma once
// Private: reads what Python's torch.save wrote (the zip format of PyTorch >= 1.6) without
// Python and without executing anything from the file.
//
// NOTE: LibTorch 1.13's torch::jit::pickle_load turns collections.OrderedDict into None, so it
// cannot read a state_dict saved with torch.save(model.state_dict(), path); this reader can,
// and reads only data: dicts, lists, tuples, numbers, strings and tensors.
#include <ATen/core/Tensor.h>
#include <caffe2/serialize/inline_container.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace trainer::detail {

/// One unpickled value. Calls to anything but the few constructors of tensors and dicts that
/// torch.save uses become an opaque Object named after the callable (never run).
struct PyValue {
  enum class Kind { None, Bool, Int, Float, String, Bytes, Tuple, List, Dict, Tensor, Storage, Global, Object };
  Kind kind = Kind::None;
  bool boolean = false;
  std::int64_t integer = 0;
  double real = 0.0;
  std::string text;                                                         ///< String, Bytes; Global/Object: "module.name"
  std::vector<std::shared_ptr<PyValue>> items;                              ///< Tuple, List
  std::vector<std::pair<std::shared_ptr<PyValue>, std::shared_ptr<PyValue>>> entries;  ///< Dict, in order
  at::Tensor tensor;                                                        ///< Tensor; Storage (flat)

  /// Python's name of the type ("dict", "Tensor", "int" ...; an Object's class name).
  std::string type_name() const;

  PyValue() = default;
  PyValue(const PyValue&) = delete;
  PyValue& operator=(const PyValue&) = delete;
  /// Releases nested values iteratively: a file of a million nested tuples must not overflow
  /// the stack when it is freed. (A value that contains itself, built through the memo, is
  /// not freed; its memory is bounded by the file's size.)
  ~PyValue();
};
using PyRef = std::shared_ptr<PyValue>;

/// A file that is not what torch.save writes, or that holds something this reader refuses.
class TorchSaveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The object torch.save wrote into the opened archive `zip`. Throws TorchSaveError (no
/// data.pkl, a damaged record, a pickle opcode outside the data subset, a tensor outside its
/// storage, a storage type that is not a tensor dtype).
PyRef read_torch_save(caffe2::serialize::PyTorchStreamReader& zip);

}  // namespace trainer::detail
