// The unpickler's storages (data/<key> records read into flat tensors), the tensors that view
// them, and the few callables (REDUCE) it interprets: tensor, parameter and dict constructors.
#include "model/torch_save_unpickler.h"

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

namespace trainer::detail {

namespace {

c10::ScalarType storage_dtype(const std::string& name) {
  static const std::map<std::string, c10::ScalarType> types = {{"torch.FloatStorage", at::kFloat},
                                                               {"torch.DoubleStorage", at::kDouble},
                                                               {"torch.HalfStorage", at::kHalf},
                                                               {"torch.BFloat16Storage", at::kBFloat16},
                                                               {"torch.LongStorage", at::kLong},
                                                               {"torch.IntStorage", at::kInt},
                                                               {"torch.ShortStorage", at::kShort},
                                                               {"torch.CharStorage", at::kChar},
                                                               {"torch.ByteStorage", at::kByte},
                                                               {"torch.BoolStorage", at::kBool},
                                                               {"torch.ComplexFloatStorage", at::kComplexFloat},
                                                               {"torch.ComplexDoubleStorage", at::kComplexDouble}};
  const auto it = types.find(name);
  if (it == types.end()) throw TorchSaveError("a storage of type " + name + ", which is not a tensor dtype");
  return it->second;
}

}  // namespace

PyRef Unpickler::storage(const PyValue& pid) {
  if (pid.kind != Kind::Tuple || pid.items.size() != 5 || pid.items[0]->kind != Kind::String ||
      pid.items[0]->text != "storage" || pid.items[1]->kind != Kind::Global || pid.items[2]->kind != Kind::String ||
      pid.items[4]->kind != Kind::Int) {
    malformed("a persistent id that is not ('storage', type, key, location, size)");
  }
  const c10::ScalarType dtype = storage_dtype(pid.items[1]->text);
  const std::string& key = pid.items[2]->text;
  const std::string record = source_.records + key;
  const std::int64_t numel = pid.items[4]->integer;
  const auto it = storages_.find(key);
  if (it != storages_.end()) {
    const at::Tensor& flat = it->second->tensor;
    if (flat.scalar_type() != dtype || flat.numel() != numel) {
      throw TorchSaveError(record + " is declared as " + std::to_string(flat.numel()) + " " +
                           c10::toString(flat.scalar_type()) + " and as " + std::to_string(numel) + " " +
                           c10::toString(dtype));
    }
    return it->second;
  }
  if (!zip_.has(record)) throw TorchSaveError("no " + record + " in the archive for a tensor's storage");
  const std::uint64_t bytes = zip_.size(record);  // no more than the file: ZipArchive checked it
  const std::uint64_t item = c10::elementSize(dtype);
  std::uint64_t declared = 0;
  if (numel < 0 || __builtin_mul_overflow(static_cast<std::uint64_t>(numel), item, &declared) || declared != bytes) {
    throw TorchSaveError(record + " holds " + std::to_string(bytes) + " bytes, but its storage declares " +
                         std::to_string(numel) + " elements of " + c10::toString(dtype) + " (" + std::to_string(item) +
                         " bytes each)");
  }
  at::Tensor flat = at::empty({numel}, at::TensorOptions().dtype(dtype));
  if (bytes > 0) zip_.read(record, flat.data_ptr());
  // Onto the device the caller asked for, a storage at a time (as LibTorch's reader maps them):
  // the host holds one storage's copy at most, and views of one storage stay views of one.
  if (source_.device != flat.device()) flat = flat.to(source_.device);
  auto v = make(Kind::Storage);
  v->tensor = flat;
  storages_.emplace(key, v);
  return v;
}

std::vector<std::int64_t> Unpickler::ints(const PyValue& t, const char* what) {
  if (t.kind != Kind::Tuple) throw TorchSaveError(std::string("a tensor whose ") + what + " is not a tuple");
  if (t.items.size() > static_cast<std::size_t>(kMaxTensorDims)) {
    throw TorchSaveError("a tensor of " + std::to_string(t.items.size()) + " dimensions (at most " +
                         std::to_string(kMaxTensorDims) + ")");
  }
  std::vector<std::int64_t> out;
  for (const auto& i : t.items) {
    if (i->kind != Kind::Int)
      throw TorchSaveError(std::string("a tensor whose ") + what + " holds a " + i->type_name());
    out.push_back(i->integer);
  }
  return out;
}

PyRef Unpickler::tensor(const PyValue& args) {
  if (args.kind != Kind::Tuple || args.items.size() < 4 || args.items[0]->kind != Kind::Storage ||
      args.items[1]->kind != Kind::Int) {
    malformed("tensor arguments");
  }
  // LibTorch's pickler writes (storage, offset, size, stride, requires_grad, empty hooks).
  if (script() && (args.items.size() != 6 || args.items[4]->kind != Kind::Bool || args.items[5]->kind != Kind::Dict ||
                   !args.items[5]->entries.empty())) {
    malformed("tensor arguments other than LibTorch's");
  }
  const at::Tensor& flat = args.items[0]->tensor;
  const std::int64_t offset = args.items[1]->integer;
  const auto size = ints(*args.items[2], "size"), stride = ints(*args.items[3], "stride");
  if (size.size() != stride.size())
    throw TorchSaveError("a tensor with " + std::to_string(size.size()) + " sizes and " +
                         std::to_string(stride.size()) + " strides");
  // The last element's index, offset + sum((size - 1) * stride), and the number of elements,
  // without overflowing.
  const std::string past = "a tensor that reaches past its storage (" + std::to_string(flat.numel()) + " elements)";
  std::int64_t last = offset, numel = 1;
  for (std::size_t d = 0; d < size.size(); ++d) {
    count_value();  // each dimension too: past 5 the tensor keeps its sizes and strides on the heap
    if (size[d] < 0 || stride[d] < 0) throw TorchSaveError("a tensor with a negative size or stride");
    if (__builtin_mul_overflow(numel, size[d], &numel)) throw TorchSaveError("a tensor of more than 2^63 elements");
    std::int64_t span = 0;
    if (size[d] > 0 &&
        (__builtin_mul_overflow(size[d] - 1, stride[d], &span) || __builtin_add_overflow(last, span, &last))) {
      throw TorchSaveError(past);
    }
  }
  if (offset < 0 || offset > flat.numel() || (numel > 0 && last >= flat.numel())) throw TorchSaveError(past);
  auto v = make(Kind::Tensor);
  v->tensor = flat.as_strided(size, stride, offset);
  return v;
}

PyRef Unpickler::reduce(const PyValue& fn, const PyValue& args) {
  if (script()) return script_call(fn, args);
  if (fn.kind != Kind::Global) return object(fn.type_name());
  const std::string& name = fn.text;
  if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor") return tensor(args);
  if (name == "torch._utils._rebuild_parameter" || name == "torch._utils._rebuild_parameter_with_state") {
    if (args.kind != Kind::Tuple || args.items.empty() || args.items[0]->kind != Kind::Tensor) {
      malformed("parameter arguments");
    }
    return args.items[0];
  }
  if (name == "collections.OrderedDict" || name == "builtins.dict") return make(Kind::Dict);
  if (name == "torch.Size" && args.kind == Kind::Tuple && args.items.size() == 1) return args.items[0];
  return object(name);  // never called: only named
}

}  // namespace trainer::detail
