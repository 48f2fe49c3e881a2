// A reader of torch.save's zip format: data.pkl (a pickle, protocol 2 by default) whose tensors
// point at raw storages in data/<key>. Only the data subset of pickle is interpreted; a call to
// anything but the tensor and dict constructors torch.save uses is kept as an opaque object.
// The file is untrusted: every size it declares is checked before anything is allocated for it.
#include "model/torch_save.h"

#include <c10/util/Exception.h>

#include <new>
#include <string>
#include <utility>
#include <vector>

#include "model/torch_save_unpickler.h"

namespace trainer::detail {

std::string PyValue::type_name() const {
  switch (kind) {
    case Kind::None:
      return "None";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::Bytes:
      return "bytes";
    case Kind::Tuple:
      return "tuple";
    case Kind::List:
      return "list";
    case Kind::Dict:
      return "dict";
    case Kind::Tensor:
      return "Tensor";
    case Kind::Storage:
      return "storage";
    case Kind::Global:
      return "global " + text;
    case Kind::Object:
      return text + " object";
  }
  return "?";
}

PyValue::~PyValue() {
  std::vector<std::shared_ptr<PyValue>> pending;
  auto take_children = [&pending](PyValue& v) {
    for (auto& i : v.items) pending.push_back(std::move(i));
    for (auto& [k, x] : v.entries) {
      pending.push_back(std::move(k));
      pending.push_back(std::move(x));
    }
    v.items.clear();
    v.entries.clear();
  };
  take_children(*this);
  while (!pending.empty()) {
    std::shared_ptr<PyValue> v = std::move(pending.back());
    pending.pop_back();
    if (v && v.use_count() == 1) take_children(*v);  // freed childless at the end of this iteration
  }
}

PyRef read_torch_save(const ZipArchive& zip) {
  if (!zip.has("data.pkl")) throw TorchSaveError("a zip archive without data.pkl: not written by torch.save");
  if (zip.has("byteorder")) {  // written since PyTorch 2.1
    if (zip.size("byteorder") > 16 || zip.read("byteorder") != "little") {
      throw TorchSaveError("tensors stored big-endian; re-save the file on a little-endian machine");
    }
  }
  try {
    std::string pickle = zip.read("data.pkl");  // no larger than the file: ZipArchive checked it
    return Unpickler(zip, std::move(pickle)).run();
  } catch (const c10::Error& e) {
    throw TorchSaveError(std::string("data LibTorch refuses (") + e.what_without_backtrace() + ")");
  } catch (const std::bad_alloc&) {
    throw TorchSaveError("more data than this machine's memory");
  }
}

}  // namespace trainer::detail
