#pragma once
// Private: the unpickler of data.pkl that read_torch_save (torch_save.cpp) and read_script_archive
// (script_archive.cpp) run. Its opcode loop is in torch_save_pickle.cpp, its values in
// torch_save_values.cpp, its tensors in torch_save_tensors.cpp, the objects and calls of the
// TorchScript dialect in torch_save_script.cpp.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "model/torch_save.h"

namespace trainer::detail {

// ---- The pickle --------------------------------------------------------------------------

/// A pickle record of an archive and how to read it.
struct PickleSource {
  std::string name = "data.pkl";  ///< its record, named in messages
  std::string records = "data/";  ///< the folder of the records its storages name
  PickleDialect dialect = PickleDialect::TorchSave;
  c10::Device device = c10::kCPU;  ///< where its storages are placed
};

class Unpickler {
 public:
  Unpickler(const ZipArchive& zip, std::string pickle, PickleSource source = {})
      : zip_(zip), data_(std::move(pickle)), source_(std::move(source)) {}
  Unpickler(const Unpickler&) = delete;
  Unpickler& operator=(const Unpickler&) = delete;
  /// Breaks what the result does not hold (everything, after an error): lists and dicts
  /// that were made to contain themselves are freed too.
  ~Unpickler();
  PyRef run();

 private:
  using Kind = PyValue::Kind;

  [[noreturn]] void malformed(const std::string& what) const;
  const char* take(std::size_t n);
  std::uint8_t u8();
  std::uint64_t le(std::size_t n);
  std::string line();

  /// Every value counts against kMaxPickleValues; lists, tuples and dicts are remembered so
  /// that the destructor can break what the result does not hold.
  PyRef make(Kind k);
  /// `container` now holds `child`: its nesting is at least one more than the child's. (A
  /// container already inside another does not pass this on; check_nesting() finds the rest.)
  void nest(PyValue& container, const PyValue& child) const;
  [[noreturn]] void too_deep() const;
  void add_items(PyValue& l, const std::vector<PyRef>& items);
  PyRef boolean(bool b);
  PyRef integer(std::int64_t i);
  /// LONG1/LONG4: n little-endian two's-complement bytes; up to 8 fit an int64. Longer ones
  /// (a seed of 2^64 - 1 in a training checkpoint) are kept opaque, unread.
  PyRef long_int(std::uint64_t n);
  PyRef real();
  /// A string or bytes of `n` bytes, checked against what is left of data.pkl before anything
  /// is allocated for it.
  PyRef string(Kind k, std::uint64_t n);
  PyRef global(const std::string& name);
  PyRef object(const std::string& name);
  /// The class name of NEWOBJ's class argument (a global, normally), never a copy of a string.
  static std::string name_of(const PyValue& cls);
  PyRef tuple_of(std::vector<PyRef> items);

  void push(PyRef v);
  void count_value();
  PyRef top();
  PyRef pop();
  std::vector<PyRef> pop_n(std::size_t n);
  std::vector<PyRef> pop_mark();
  PyRef list(const PyRef& v);
  PyRef dict(const PyRef& v);
  void set_items(PyValue& d, const std::vector<PyRef>& kvs);
  void memo(std::uint64_t index);
  PyRef recall(std::uint64_t index);

  /// Refuses a result that contains itself (a list appended to itself: it would never be
  /// freed) or nests lists, tuples and dicts deeper than kMaxPickleNesting, and remembers what
  /// it holds for the destructor. Iterative, each container visited once.
  void check_nesting(const PyRef& root);

  /// ('storage', torch.<Type>Storage, key, location, numel): the raw bytes of data/<key>, which
  /// must be numel elements of the type exactly.
  PyRef storage(const PyValue& pid);

  static std::vector<std::int64_t> ints(const PyValue& t, const char* what);

  /// _rebuild_tensor(_v2)(storage, offset, size, stride, ...): a view of the storage, bounds checked.
  PyRef tensor(const PyValue& args);

  PyRef reduce(const PyValue& fn, const PyValue& args);

  // The TorchScript dialect (torch_save_script.cpp).
  bool script() const { return source_.dialect == PickleDialect::TorchScript; }
  /// NEWOBJ of `cls` with `args` (nullptr: NEWOBJ_EX's keyword form). TorchScript: a module of a
  /// `__torch__` class, of no arguments; torch.save: an opaque object.
  PyRef new_object(const PyValue& cls, const PyValue* args);
  /// BUILD of the object on the stack with `state`. TorchScript: a module's attribute dict, once;
  /// torch.save: dropped.
  void build(const PyRef& state);
  /// REDUCE in the TorchScript dialect: tensors, their hooks' empty OrderedDict, the typed lists
  /// and type tags of containers; anything else is refused.
  PyRef script_call(const PyValue& fn, const PyValue& args);
  /// torch.jit._pickle.build_<type>list((list,)): the list, its items checked, tagged List[type].
  PyRef typed_list(const PyValue& args, const std::string& helper);
  /// torch.jit._pickle.restore_type_tag((container, "type")): the container, tagged.
  PyRef type_tag(const PyValue& args);
  [[noreturn]] void refuse_code(const std::string& what) const;

  const ZipArchive& zip_;
  std::string data_;
  PickleSource source_;
  std::size_t pos_ = 0;
  std::vector<PyRef> stack_;
  std::vector<std::size_t> marks_;
  std::map<std::uint64_t, PyRef> memo_;
  std::map<std::string, PyRef> storages_;
  std::int64_t values_ = 0;                         ///< pushes and memo entries so far
  std::vector<std::weak_ptr<PyValue>> containers_;  ///< every list, tuple and dict made
  std::unordered_set<const PyValue*> reachable_;    ///< the containers the result holds
};

}  // namespace trainer::detail
