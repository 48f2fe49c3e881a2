// A reader of torch.save's zip format: data.pkl (a pickle, protocol 2 by default) whose tensors
// point at raw storages in data/<key>. Only the data subset of pickle is interpreted; a call to
// anything but the tensor and dict constructors torch.save uses is kept as an opaque object.
// The file is untrusted: every size it declares is checked before anything is allocated for it.
#include "model/torch_save.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

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

// ---- The pickle --------------------------------------------------------------------------

namespace {

using Kind = PyValue::Kind;

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
  Unpickler(const ZipArchive& zip, std::string pickle) : zip_(zip), data_(std::move(pickle)) {}
  Unpickler(const Unpickler&) = delete;
  Unpickler& operator=(const Unpickler&) = delete;
  /// Breaks what the result does not hold (everything, after an error): lists and dicts
  /// that were made to contain themselves are freed too.
  ~Unpickler() {
    for (const auto& weak : containers_) {
      if (auto v = weak.lock(); v && !reachable_.count(v.get())) {
        v->items.clear();
        v->entries.clear();
      }
    }
  }

  PyRef run() {
    for (;;) {
      const std::uint8_t op = u8();
      switch (op) {
        case 0x80: u8(); break;          // PROTO
        case 0x95: take(8); break;       // FRAME (protocol 4)
        case '.': {                      // STOP
          PyRef result = pop();
          check_nesting(result);
          return result;
        }
        case '(':                        // MARK
          if (marks_.size() >= static_cast<std::size_t>(kMaxPickleNesting)) {
            throw TorchSaveError("data.pkl nests more than " + std::to_string(kMaxPickleNesting) +
                                 " MARKs (at byte " + std::to_string(pos_ - 1) + "); Python's pickle never writes that deep");
          }
          marks_.push_back(stack_.size());
          break;
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
        case 0x8e: push(string(Kind::Bytes, le(8))); break;                // BINBYTES8
        case ')': push(make(Kind::Tuple)); break;
        case 0x85: case 0x86: case 0x87: push(tuple_of(pop_n(op - 0x84))); break;  // TUPLE1..3
        case 't': push(tuple_of(pop_mark())); break;
        case ']': push(make(Kind::List)); break;
        case 'l': { auto l = make(Kind::List); add_items(*l, pop_mark()); push(l); break; }  // LIST
        case 'a': { auto v = pop(); add_items(*list(top()), {v}); break; }                   // APPEND
        case 'e': { auto vs = pop_mark(); add_items(*list(top()), vs); break; }              // APPENDS
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
          push(global(module->text.substr(0, kMaxNameBytes) + "." + name->text.substr(0, kMaxNameBytes)));
          break;
        }
        case 'R': { auto args = pop(); auto fn = pop(); push(reduce(*fn, *args)); break; }  // REDUCE
        case 0x81: { pop(); auto cls = pop(); push(object(name_of(*cls))); break; }        // NEWOBJ
        case 'b': pop(); break;  // BUILD: an object's state; nothing of it is needed
        // Protocol 4/5 containers and constructors that a state_dict never holds: kept opaque.
        case 0x8f: push(object("set")); break;                        // EMPTY_SET
        case 0x90: pop_mark(); top(); break;                          // ADDITEMS
        case 0x91: pop_mark(); push(object("frozenset")); break;      // FROZENSET
        case 0x92: { pop(); pop(); auto cls = pop(); push(object(name_of(*cls))); break; }  // NEWOBJ_EX
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
    std::string s = data_.substr(pos_, std::min(end - pos_, kMaxNameBytes));
    pos_ = end + 1;
    return s;
  }

  /// Every value counts against kMaxPickleValues; lists, tuples and dicts are remembered so
  /// that the destructor can break what the result does not hold.
  PyRef make(Kind k) {
    auto v = std::make_shared<PyValue>();
    v->kind = k;
    if (v->is_container()) {
      v->nesting = 1;
      containers_.push_back(v);
    }
    return v;
  }
  /// `container` now holds `child`: its nesting is at least one more than the child's. (A
  /// container already inside another does not pass this on; check_nesting() finds the rest.)
  static void nest(PyValue& container, const PyValue& child) {
    if (child.nesting >= container.nesting) {
      container.nesting = child.nesting + 1;
      if (container.nesting > kMaxPickleNesting) too_deep();
    }
  }
  [[noreturn]] static void too_deep() {
    throw TorchSaveError("data.pkl nests lists, tuples and dicts more than " + std::to_string(kMaxPickleNesting) +
                         " deep; Python's pickle never writes that deep");
  }
  void add_items(PyValue& l, const std::vector<PyRef>& items) {
    for (const auto& i : items) nest(l, *i);
    l.items.insert(l.items.end(), items.begin(), items.end());
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
  /// LONG1/LONG4: n little-endian two's-complement bytes; up to 8 fit an int64. Longer ones
  /// (a seed of 2^64 - 1 in a training checkpoint) are kept opaque, unread.
  PyRef long_int(std::uint64_t n) {
    if (n > 8) {
      if (n > data_.size() - pos_) malformed("an integer of " + std::to_string(n) + " bytes past the end");
      take(n);
      return object("int of " + std::to_string(n) + " bytes");
    }
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
  /// A string or bytes of `n` bytes, checked against what is left of data.pkl before anything
  /// is allocated for it.
  PyRef string(Kind k, std::uint64_t n) {
    if (n > data_.size() - pos_) {
      malformed((k == Kind::String ? "a string of " : "bytes of ") + std::to_string(n) + " bytes, " +
                std::to_string(data_.size() - pos_) + " left in data.pkl,");
    }
    auto v = make(k);
    v->text.assign(take(n), n);
    return v;
  }
  PyRef global(const std::string& name) {
    auto v = make(Kind::Global);
    v->text = name.substr(0, kMaxNameBytes);
    return v;
  }
  PyRef object(const std::string& name) {
    auto v = make(Kind::Object);
    v->text = name.substr(0, kMaxNameBytes);
    return v;
  }
  /// The class name of NEWOBJ's class argument (a global, normally), never a copy of a string.
  static std::string name_of(const PyValue& cls) {
    return cls.kind == Kind::Global || cls.kind == Kind::Object ? cls.text : cls.type_name();
  }
  PyRef tuple_of(std::vector<PyRef> items) {
    auto v = make(Kind::Tuple);
    add_items(*v, items);
    return v;
  }

  void push(PyRef v) {
    count_value();
    stack_.push_back(std::move(v));
  }
  void count_value() {
    if (++values_ > kMaxPickleValues) {
      throw TorchSaveError("data.pkl makes more than " + std::to_string(kMaxPickleValues) + " values (at byte " +
                           std::to_string(pos_) + "), more than a state_dict or training checkpoint holds");
    }
  }
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
    for (std::size_t i = 0; i < kvs.size(); i += 2) {
      nest(d, *kvs[i]);
      nest(d, *kvs[i + 1]);
      d.entries.emplace_back(kvs[i], kvs[i + 1]);
    }
  }
  void memo(std::uint64_t index) {
    PyRef v = top();
    count_value();
    memo_[index] = std::move(v);
  }
  PyRef recall(std::uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) malformed("memo entry " + std::to_string(index) + " read before it is written");
    return it->second;
  }

  /// Refuses a result that contains itself (a list appended to itself: it would never be
  /// freed) or nests lists, tuples and dicts deeper than kMaxPickleNesting, and remembers what
  /// it holds for the destructor. Iterative, each container visited once.
  void check_nesting(const PyRef& root) {
    if (!root->is_container()) return;
    struct Frame {
      const PyValue* value;
      std::size_t next = 0;      // the next child to look at: items, then keys and values
      std::int64_t below = 0;    // the deepest nesting seen below it
    };
    const auto child = [](const PyValue& v, std::size_t i) -> const PyValue* {
      if (i < v.items.size()) return v.items[i].get();
      i -= v.items.size();
      if (i / 2 < v.entries.size()) return (i % 2 == 0 ? v.entries[i / 2].first : v.entries[i / 2].second).get();
      return nullptr;
    };
    std::unordered_map<const PyValue*, std::int64_t> depth;  // finished containers: levels, themselves included
    std::unordered_set<const PyValue*> on_path;
    std::vector<Frame> path{{root.get()}};
    on_path.insert(root.get());
    while (!path.empty()) {
      Frame& f = path.back();
      if (const PyValue* c = child(*f.value, f.next++)) {
        if (!c->is_container()) continue;
        if (on_path.count(c)) throw TorchSaveError("data.pkl holds a " + c->type_name() + " that contains itself");
        if (const auto it = depth.find(c); it != depth.end()) {
          f.below = std::max(f.below, it->second);
          if (static_cast<std::int64_t>(path.size()) + it->second > kMaxPickleNesting) too_deep();
          continue;
        }
        if (static_cast<std::int64_t>(path.size()) >= kMaxPickleNesting) too_deep();
        on_path.insert(c);
        path.push_back({c});
        continue;
      }
      const std::int64_t levels = f.below + 1;
      depth.emplace(f.value, levels);
      on_path.erase(f.value);
      path.pop_back();
      if (!path.empty()) path.back().below = std::max(path.back().below, levels);
    }
    for (const auto& [v, levels] : depth) reachable_.insert(v);
  }

  /// ('storage', torch.<Type>Storage, key, location, numel): the raw bytes of data/<key>, which
  /// must be numel elements of the type exactly.
  PyRef storage(const PyValue& pid) {
    if (pid.kind != Kind::Tuple || pid.items.size() != 5 || pid.items[0]->kind != Kind::String ||
        pid.items[0]->text != "storage" || pid.items[1]->kind != Kind::Global || pid.items[2]->kind != Kind::String ||
        pid.items[4]->kind != Kind::Int) {
      malformed("a persistent id that is not ('storage', type, key, location, size)");
    }
    const c10::ScalarType dtype = storage_dtype(pid.items[1]->text);
    const std::string& key = pid.items[2]->text;
    const std::string record = "data/" + key;
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
                           std::to_string(numel) + " elements of " + c10::toString(dtype) + " (" +
                           std::to_string(item) + " bytes each)");
    }
    at::Tensor flat = at::empty({numel}, at::TensorOptions().dtype(dtype));
    if (bytes > 0) zip_.read(record, flat.data_ptr());
    auto v = make(Kind::Storage);
    v->tensor = flat;
    storages_.emplace(key, v);
    return v;
  }

  static std::vector<std::int64_t> ints(const PyValue& t, const char* what) {
    if (t.kind != Kind::Tuple) throw TorchSaveError(std::string("a tensor whose ") + what + " is not a tuple");
    if (t.items.size() > static_cast<std::size_t>(kMaxTensorDims)) {
      throw TorchSaveError("a tensor of " + std::to_string(t.items.size()) + " dimensions (at most " +
                           std::to_string(kMaxTensorDims) + ")");
    }
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
    // The last element's index, offset + sum((size - 1) * stride), and the number of elements,
    // without overflowing.
    const std::string past = "a tensor that reaches past its storage (" + std::to_string(flat.numel()) + " elements)";
    std::int64_t last = offset, numel = 1;
    for (std::size_t d = 0; d < size.size(); ++d) {
      count_value();  // each dimension too: past 5 the tensor keeps its sizes and strides on the heap
      if (size[d] < 0 || stride[d] < 0) throw TorchSaveError("a tensor with a negative size or stride");
      if (__builtin_mul_overflow(numel, size[d], &numel)) throw TorchSaveError("a tensor of more than 2^63 elements");
      std::int64_t span = 0;
      if (size[d] > 0 && (__builtin_mul_overflow(size[d] - 1, stride[d], &span) ||
                          __builtin_add_overflow(last, span, &last))) {
        throw TorchSaveError(past);
      }
    }
    if (offset < 0 || offset > flat.numel() || (numel > 0 && last >= flat.numel())) throw TorchSaveError(past);
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

  const ZipArchive& zip_;
  std::string data_;
  std::size_t pos_ = 0;
  std::vector<PyRef> stack_;
  std::vector<std::size_t> marks_;
  std::map<std::uint64_t, PyRef> memo_;
  std::map<std::string, PyRef> storages_;
  std::int64_t values_ = 0;                          ///< pushes and memo entries so far
  std::vector<std::weak_ptr<PyValue>> containers_;   ///< every list, tuple and dict made
  std::unordered_set<const PyValue*> reachable_;     ///< the containers the result holds
};

}  // namespace

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
