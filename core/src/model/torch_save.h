#pragma once
// Private: reads what Python's torch.save wrote (the zip format of PyTorch >= 1.6) without
// Python and without executing anything from the file.
//
// NOTE: LibTorch 1.13's torch::jit::pickle_load turns collections.OrderedDict into None, so it
// cannot read a state_dict saved with torch.save(model.state_dict(), path); this reader can,
// and reads only data: dicts, lists, tuples, numbers, strings and tensors.
//
// Weight files come from the internet: everything here is bounded. A file of N bytes makes the
// reader allocate at most its records (each checked against the file before it is allocated,
// so together at most N: see zip_archive.h) plus the unpickled values (at most
// kMaxPickleValues, under 200 bytes each) plus the central directory's index (a small multiple
// of its size, itself part of N). The caps below are named where they apply.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/zip_archive.h"  // the ZipArchive read_torch_save reads; TorchSaveError, which both throw

namespace trainer::detail {

/// Values (every push onto the unpickler's stack, every memo entry, and each dimension of a
/// tensor) one data.pkl may create. A state_dict takes about 35 per tensor (ResNet-50's 320
/// tensors: 10,898 opcodes), a training checkpoint with AdamW's state about 130 per tensor
/// (ViT-B/16 with its optimizer: 19,586 opcodes): a million is 50 times that, and keeps the
/// unpickler's own memory to about 200 MB whatever the file says (measured: a million empty
/// lists, the costliest values per byte of pickle, take 172 MB).
inline constexpr std::int64_t kMaxPickleValues = 1'000'000;

/// Nesting of lists, tuples and dicts (and of pickle's MARKs). Python's pickle recurses per
/// level and stops at its recursion limit (1000 frames, several per level), so nothing
/// torch.save wrote is this deep.
inline constexpr std::int64_t kMaxPickleNesting = 1000;

/// Dimensions of one tensor. LibTorch's CUDA kernels take at most 25; no model has more than a
/// handful. Bounds the size and stride vectors each tensor copies out of the pickle.
inline constexpr std::int64_t kMaxTensorDims = 64;

/// Bytes kept of a global's or an object's name ("collections.OrderedDict"); longer names are
/// cut. Such names are only shown in messages or compared with the few this reader knows (all
/// shorter), and a name built from two memoized strings must not copy megabytes per opcode.
inline constexpr std::size_t kMaxNameBytes = 100;

/// Bytes of a TorchScript type tag ("Dict[str, Tensor]", "List[Tuple[float, float]]") that
/// LibTorch's pickler writes beside each list and dict. A value is checked against its tag at a
/// cost of up to the tag's length; the tags LibTorch writes for what an archive holds are far
/// shorter.
inline constexpr std::size_t kMaxTypeTagBytes = 1000;

/// Who wrote a pickle, and so what the unpickler accepts from it.
enum class PickleDialect {
  /// Python's torch.save: a call to anything but the few constructors of tensors and dicts it
  /// uses becomes an opaque Object named after the callable (never run).
  TorchSave,
  /// LibTorch's TorchScript pickler (data.pkl of a torch::serialize archive, which trainer's
  /// checkpoints and adapter files are): modules as `__torch__` objects built from attribute
  /// dicts, tensors, and its typed-list and type-tag helpers. Any other call, and an object
  /// built from anything but an attribute dict, is refused with ArchiveCodeError.
  TorchScript,
};

/// A pickle that calls what trainer does not call, or an archive holding code: what only
/// running code could make of it. A TorchSaveError, so that one catch refuses every file;
/// thrown apart so that a caller may refuse such a file outright where it would pass over a
/// damaged one.
class ArchiveCodeError : public TorchSaveError {
 public:
  using TorchSaveError::TorchSaveError;
};

/// One unpickled value. Calls to anything but the few constructors of tensors and dicts that
/// torch.save uses become an opaque Object named after the callable (never run).
struct PyValue {
  enum class Kind { None, Bool, Int, Float, String, Bytes, Tuple, List, Dict, Tensor, Storage, Global, Object };
  Kind kind = Kind::None;
  bool boolean = false;
  std::int32_t nesting = 0;  ///< levels of lists, tuples and dicts, itself included, as far as the reader has seen
  std::int64_t integer = 0;
  double real = 0.0;
  std::string text;  ///< String, Bytes; Global/Object: "module.name"; List/Dict: a TorchScript type tag
  std::vector<std::shared_ptr<PyValue>> items;  ///< Tuple, List; Object: its BUILD state (TorchScript)
  std::vector<std::pair<std::shared_ptr<PyValue>, std::shared_ptr<PyValue>>> entries;  ///< Dict, in order
  at::Tensor tensor;                                                                   ///< Tensor; Storage (flat)

  /// Python's name of the type ("dict", "Tensor", "int" ...; an Object's class name).
  std::string type_name() const;
  /// True for Tuple, List, Dict and Object (its state): the kinds that hold other values.
  bool is_container() const {
    return kind == Kind::Tuple || kind == Kind::List || kind == Kind::Dict || kind == Kind::Object;
  }

  PyValue() = default;
  PyValue(const PyValue&) = delete;
  PyValue& operator=(const PyValue&) = delete;
  /// Releases nested values iteratively: a file of a million nested tuples must not overflow
  /// the stack when it is freed. (Values that contain themselves are refused, and their
  /// cycles broken, by read_torch_save.)
  ~PyValue();
};
using PyRef = std::shared_ptr<PyValue>;

/// The object torch.save wrote into the archive `zip`. Throws TorchSaveError (no data.pkl, a
/// damaged record, a pickle opcode outside the data subset, more than kMaxPickleValues values
/// or kMaxPickleNesting levels, a value that contains itself, a storage whose declared size
/// is not its record's, a tensor outside its storage, a storage type that is not a tensor
/// dtype).
PyRef read_torch_save(const ZipArchive& zip);

}  // namespace trainer::detail
