// A reader of torch.save's zip format: data.pkl (a pickle, protocol 2 by default) whose tensors
// point at raw storages in data/<key>. Only the data subset of pickle is interpreted; a call to
// anything but the tensor and dict constructors torch.save uses is kept as an opaque object.
#include "model/torch_save.h"

#include <ATen/ATen.h>

#include <cstring>
#include <tuple>
#include <map>
#include <sstream>

namespace trainer::detail {

std::string PyValue::type_name() const {
  switch (kind) {
    case Kind::None: return "None";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::Bytes: return "bytes";
    case Kind::Tuple: return "tuple";
    case Kind::List: return "list";
    case Kind::Dict: return "dict";
    case Kind::Tensor: return "Tensor";
    case Kind::Storage: return "storage";
    case Kind::Global: return "global " + text;
    case Kind::Object: return text + " object";
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

namespace {

using Kind = PyValue::Kind;

PyRef make(Kind k) {
  auto v = std::make_shared<PyValue>();
  v->kind = k;
  return v;
}

c10::ScalarType storage_dtype(const std::string& name) {
  static const std::map<std::string, c10::ScalarType> types = {
      {"torch.FloatStorage", at::kFloat},          {"torch.DoubleStorage", at::kDouble},
      {"torch.HalfStorage", at::kHalf},            {"torch.BFloat16Storage", at::kBFloat16},
      {"torch.LongStorage", at::kLong},            {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort},          {"torch.CharStorage", at::kChar},
      {"torch.ByteStorage", at::kByte},            {"torch.BoolStorage", at::kBool},
      {"torch.ComplexFloatStorage", at::kComplexFloat}, {"torch.ComplexDoubleStorage", at::kComplexDouble}};
  const auto it = types.find(name);
  if (it == types.end()) throw TorchSaveError("a storage of type " + name + ", which is not a tensor dtype");
  return it->second;
}

class Unpickler {
 public:
  Unpickler(caffe2::serialize::PyTorchStreamReader& zip, std::string pickle) : zip_(zip), data_(std::move(pickle)) {}

  PyRef run() {
    for (;;) {
      const std::uint8_t op = u8();
      switch (op) {
        case 0x80: u8(); break;          // PROTO
        case 0x95: take(8); break;       // FRAME (protocol 4)
        case '.': return pop();          // STOP
        case '(': marks_.push_back(stack_.size()); break;
        case '0': pop(); break;          // POP
        case '1': pop_mark(); break;     // POP_MARK
        case '2': push(top()); break;    // DUP
        case 'N': push(make(Kind::None)); break;
        case 0x88: push(boolean(true)); break;
        case 0x89: push(boolean(false)); break;
        case 'J': push(integer(static_cast<std::int32_t>(le(4)))); break;  // BININT
        case 'K': push(integer(static_cast<std::int64_t>(le(1)))); break;  // BININT1
        case 'M': push(integer(static_cast<std::int64_t>(le(2)))); break;  // BININT2
        case 0x8a: push(long_int(u8())); break;                            // LONG1
        case 0x8b: push(long_int(le(4))); break;                           // LONG4
        case 'G': push(real()); break;                                     // BINFLOAT
        case 'X': push(string(Kind::String, le(4))); break;                // BINUNICODE
        case 0x8c: push(string(Kind::String, u8())); break;                // SHORT_BINUNICODE
        case 0x8d: push(string(Kind::String, le(8))); break;               // BINUNICODE8
        case 'B': push(string(Kind::Bytes, le(4))); break;                 // BINBYTES
        case 'C': push(string(Kind::Bytes, u8())); break;                  // SHORT_BINBYTES
        case ')': push(make(Kind::Tuple)); break;
        case 0x85: case 0x86: case 0x87: push(tuple_of(pop_n(op - 0x84))); break;  // TUPLE1..3
        case 't': push(tuple_of(pop_mark())); break;
        case ']': push(make(Kind::List)); break;
        case 'l': { auto l = make(Kind::List); l->items = pop_mark(); push(l); break; }  // LIST
        case 'a': { auto v = pop(); list(top())->items.push_back(v); break; }           // APPEND
        case 'e': { auto vs = pop_mark(); auto& l = list(top())->items; l.insert(l.end(), vs.begin(), vs.end()); break; }
        case '}': push(make(Kind::Dict)); break;
        case 'd': { auto d = make(Kind::Dict); set_items(*d, pop_mark()); push(d); break; }  // DICT
        case 's': { auto v = pop(); auto k = pop(); set_items(*dict(top()), {k, v}); break; }
        case 'u': { auto kvs = pop_mark(); set_items(*dict(top()), kvs); break; }
        case 'q': memo(le(1)); break;      // BINPUT
        case 'r': memo(le(4)); break;      // LONG_BINPUT
        case 0x94: memo(memo_.size()); break;  // MEMOIZE
        case 'h': push(recall(le(1))); break;  // BINGET
        case 'j': push(recall(le(4))); break;  // LONG_BINGET
        case 'c': {                            // GLOBAL "module\nname\n"
          const std::string module = line(), name = line();
          push(global(module + "." + name));
          break;
        }
        case 0x93: {                           // STACK_GLOBAL
          auto name = pop(), module = pop();
          if (module->kind != Kind::String || name->kind != Kind::String) malformed("STACK_GLOBAL without strings");
          push(global(module->text + "." + name->text));
          break;
        }
        case 'R': { auto args = pop(); auto fn = pop(); push(reduce(*fn, *args)); break; }  // REDUCE
        case 0x81: { pop(); auto cls = pop(); push(object(cls->text)); break; }            // NEWOBJ
        case 'b': pop(); break;  // BUILD: an object's state; nothing of it is needed
        // Protocol 4/5 containers and constructors that a state_dict never holds: kept opaque.
        case 0x8f: push(object("set")); break;                        // EMPTY_SET
        case 0x90: pop_mark(); top(); break;                          // ADDITEMS
        case 0x91: pop_mark(); push(object("frozenset")); break;      // FROZENSET
        case 0x92: { pop(); pop(); auto cls = pop(); push(object(cls->text)); break; }  // NEWOBJ_EX
        case 0x96: push(string(Kind::Bytes, le(8))); break;           // BYTEARRAY8
        case 'Q': push(storage(*pop())); break;  // BINPERSID
        default: {
          std::ostringstream os;
          os << "pickle opcode 0x" << std::hex << int(op) << " at byte " << std::dec << (pos_ - 1)
             << " of data.pkl, outside the data that torch.save writes";
          throw TorchSaveError(os.str());
        }
      }
    }
  }

 private:
  [[noreturn]] void malformed(const std::string& what) const {
    throw TorchSaveError("data.pkl is malformed (" + what + " at byte " + std::to_string(pos_) + ")");
  }
  const char* take(std::size_t n) {
    if (n > data_.size() - pos_) malformed("truncated");
    const char* p = data_.data() + pos_;
    pos_ += n;
    return p;
  }
  std::uint8_t u8() { return static_cast<std::uint8_t>(*take(1)); }
  std::uint64_t le(std::size_t n) {
    const auto* p = reinterpret_cast<const unsigned char*>(take(n));
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t(p[i]) << (8 * i);
    return v;
  }
  std::string line() {
    const std::size_t end = data_.find('\n', pos_);
    if (end == std::string::npos) malformed("GLOBAL without a newline");
    std::string s = data_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }

  PyRef boolean(bool b) {
    auto v = make(Kind::Bool);
    v->boolean = b;
    return v;
  }
  PyRef integer(std::int64_t i) {
    auto v = make(Kind::Int);
    v->integer = i;
    return v;
  }
  /// LONG1/LONG4: n little-endian two's-complement bytes; up to 8 fit an int64.
  PyRef long_int(std::uint64_t n) {
    if (n > 8) malformed("an integer of " + std::to_string(n) + " bytes");
    std::uint64_t v = le(n);
    if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~std::uint64_t(0) << (8 * n);  // sign-extend
    return integer(static_cast<std::int64_t>(v));
  }
  PyRef real() {
    const auto* p = reinterpret_cast<const unsigned char*>(take(8));
    std::uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits = bits << 8 | p[i];  // big-endian
    double d;
    std::memcpy(&d, &bits, sizeof d);
    auto v = make(Kind::Float);
    v->real = d;
    return v;
  }
  PyRef string(Kind k, std::uint64_t n) {
    auto v = make(k);
    v->text.assign(take(n), n);
    return v;
  }
  PyRef global(const std::string& name) {
    auto v = make(Kind::Global);
    v->text = name;
    return v;
  }
  PyRef object(const std::string& name) {
    auto v = make(Kind::Object);
    v->text = name;
    return v;
  }
  static PyRef tuple_of(std::vector<PyRef> items) {
    auto v = make(Kind::Tuple);
    v->items = std::move(items);
    return v;
  }

  void push(PyRef v) { stack_.push_back(std::move(v)); }
  PyRef top() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) malformed("stack underflow");
    return stack_.back();
  }
  PyRef pop() {
    PyRef v = top();
    stack_.pop_back();
    return v;
  }
  std::vector<PyRef> pop_n(std::size_t n) {
    if (stack_.size() < n || (!marks_.empty() && stack_.size() - n < marks_.back())) malformed("stack underflow");
    std::vector<PyRef> v(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
    stack_.resize(stack_.size() - n);
    return v;
  }
  std::vector<PyRef> pop_mark() {
    if (marks_.empty()) malformed("no MARK");
    const std::size_t m = marks_.back();
    marks_.pop_back();
    std::vector<PyRef> v(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return v;
  }
  PyRef list(const PyRef& v) {
    if (v->kind != Kind::List) malformed("APPEND to a " + v->type_name());
    return v;
  }
  PyRef dict(const PyRef& v) {
    // BUILD-less objects (an opaque class instance filled with SETITEMS) take the items unread.
    if (v->kind != Kind::Dict && v->kind != Kind::Object) malformed("SETITEM on a " + v->type_name());
    return v;
  }
  void set_items(PyValue& d, const std::vector<PyRef>& kvs) {
    if (kvs.size() % 2 != 0) malformed("an odd number of dict items");
    if (d.kind != Kind::Dict) return;
    for (std::size_t i = 0; i < kvs.size(); i += 2) d.entries.emplace_back(kvs[i], kvs[i + 1]);
  }
  void memo(std::uint64_t index) { memo_[index] = top(); }
  PyRef recall(std::uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) malformed("memo entry " + std::to_string(index) + " read before it is written");
    return it->second;
  }

  /// ('storage', torch.<Type>Storage, key, location, numel): the raw bytes of data/<key>.
  PyRef storage(const PyValue& pid) {
    if (pid.kind != Kind::Tuple || pid.items.size() < 3 || pid.items[0]->text != "storage" ||
        pid.items[1]->kind != Kind::Global || pid.items[2]->kind != Kind::String) {
      malformed("a persistent id that is not a storage");
    }
    const std::string& key = pid.items[2]->text;
    auto& cached = storages_[key];
    if (!cached) {
      const c10::ScalarType dtype = storage_dtype(pid.items[1]->text);
      const std::string record = "data/" + key;
      if (!zip_.hasRecord(record)) throw TorchSaveError("no " + record + " in the archive for a tensor's storage");
      at::DataPtr ptr;
      std::size_t bytes = 0;
      try {
        std::tie(ptr, bytes) = zip_.getRecord(record);
      } catch (const c10::Error& e) {
        throw TorchSaveError(record + " cannot be read (" + e.what_without_backtrace() + ")");
      }
      const std::size_t item = c10::elementSize(dtype);
      if (bytes % item != 0) throw TorchSaveError(record + " is not a whole number of " + c10::toString(dtype));
      at::Tensor flat = at::empty({static_cast<std::int64_t>(bytes / item)}, at::TensorOptions().dtype(dtype));
      if (bytes > 0) std::memcpy(flat.data_ptr(), ptr.get(), bytes);
      cached = make(Kind::Storage);
      cached->tensor = flat;
    }
    return cached;
  }

  static std::vector<std::int64_t> ints(const PyValue& t, const char* what) {
    if (t.kind != Kind::Tuple) throw TorchSaveError(std::string("a tensor whose ") + what + " is not a tuple");
    std::vector<std::int64_t> out;
    for (const auto& i : t.items) {
      if (i->kind != Kind::Int) throw TorchSaveError(std::string("a tensor whose ") + what + " holds a " + i->type_name());
      out.push_back(i->integer);
    }
    return out;
  }

  /// _rebuild_tensor(_v2)(storage, offset, size, stride, ...): a view of the storage, bounds checked.
  PyRef tensor(const PyValue& args) {
    if (args.kind != Kind::Tuple || args.items.size() < 4 || args.items[0]->kind != Kind::Storage ||
        args.items[1]->kind != Kind::Int) {
      malformed("tensor arguments");
    }
    const at::Tensor& flat = args.items[0]->tensor;
    const std::int64_t offset = args.items[1]->integer;
    const auto size = ints(*args.items[2], "size"), stride = ints(*args.items[3], "stride");
    if (size.size() != stride.size()) throw TorchSaveError("a tensor with " + std::to_string(size.size()) +
                                                           " sizes and " + std::to_string(stride.size()) + " strides");
    // The last element's index, offset + sum((size - 1) * stride), without overflowing.
    const std::string past = "a tensor that reaches past its storage (" + std::to_string(flat.numel()) + " elements)";
    std::int64_t last = offset;
    bool empty = false;
    for (std::size_t d = 0; d < size.size(); ++d) {
      if (size[d] < 0 || stride[d] < 0) throw TorchSaveError("a tensor with a negative size or stride");
      if (size[d] == 0) empty = true;
      std::int64_t span = 0;
      if (size[d] > 0 && (__builtin_mul_overflow(size[d] - 1, stride[d], &span) ||
                          __builtin_add_overflow(last, span, &last))) {
        throw TorchSaveError(past);
      }
    }
    if (offset < 0 || offset > flat.numel() || (!empty && last >= flat.numel())) throw TorchSaveError(past);
    auto v = make(Kind::Tensor);
    v->tensor = flat.as_strided(size, stride, offset);
    return v;
  }

  PyRef reduce(const PyValue& fn, const PyValue& args) {
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

  caffe2::serialize::PyTorchStreamReader& zip_;
  std::string data_;
  std::size_t pos_ = 0;
  std::vector<PyRef> stack_;
  std::vector<std::size_t> marks_;
  std::map<std::uint64_t, PyRef> memo_;
  std::map<std::string, PyRef> storages_;
};

}  // namespace

PyRef read_torch_save(caffe2::serialize::PyTorchStreamReader& zip) {
  if (!zip.hasRecord("data.pkl")) throw TorchSaveError("a zip archive without data.pkl: not written by torch.save");
  std::string pickle;
  try {
    if (zip.hasRecord("byteorder")) {  // written since PyTorch 2.1
      auto [order, n] = zip.getRecord("byteorder");
      if (std::string(static_cast<const char*>(order.get()), n) != "little") {
        throw TorchSaveError("tensors stored big-endian; re-save the file on a little-endian machine");
      }
    }
    auto [ptr, bytes] = zip.getRecord("data.pkl");
    pickle.assign(static_cast<const char*>(ptr.get()), bytes);
  } catch (const c10::Error& e) {
    throw TorchSaveError(std::string("a damaged archive (") + e.what_without_backtrace() + ")");
  }
  try {
    return Unpickler(zip, std::move(pickle)).run();
  } catch (const c10::Error& e) {
    throw TorchSaveError(std::string("data LibTorch refuses (") + e.what_without_backtrace() + ")");
  } catch (const std::bad_alloc&) {
    throw TorchSaveError("more data than this machine's memory");
  }
}

}  // namespace trainer::detail
