// trainer's checkpoints and adapter files, read without running them: 1. the zip, 2. its code/
// (checked to declare no method, never compiled) and constants.pkl (empty), 3. data.pkl through
// the unpickler's TorchScript dialect, 4. the module tree InputArchive holds, built from that.
#include "model/script_archive.h"

#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/api/module.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/torch_save_unpickler.h"
#include "trainer/memory.h"
#include "util/torch_compat.h"

namespace trainer::detail {

namespace {

using Kind = PyValue::Kind;

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

/// Where `line` holds the keyword `def` outside a string literal, or npos.
std::size_t def_keyword(const std::string& line) {
  const auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  char quote = 0;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote) {
      if (c == '\\') {
        ++i;  // an escaped character, the quote included
      } else if (c == quote) {
        quote = 0;
      }
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (line.compare(i, 3, "def") == 0 && (i == 0 || !word(line[i - 1])) && i + 3 < line.size() &&
               (line[i + 3] == ' ' || line[i + 3] == '\t')) {
      return i;
    }
  }
  return std::string::npos;
}

/// code/ holds the classes' declarations; jit::load compiles them, and a method declared there
/// (`def __setstate__`) runs. The modules OutputArchive writes declare attributes only.
void check_script_code(const ZipArchive& zip) {
  for (const std::string& name : zip.names()) {
    if (!starts_with(name, "code/") || name.size() < 3 || name.compare(name.size() - 3, 3, ".py") != 0) continue;
    const std::string text = zip.read(name);  // within kMaxInflatedBytes, all records together
    for (std::size_t at = 0; at < text.size();) {
      std::size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(at, end - at);
      if (const std::size_t def = def_keyword(line); def != std::string::npos) {
        throw ArchiveCodeError(name + " declares a method, which torch::jit::load would compile and may run: \"" +
                               line.substr(def, kMaxNameBytes) + "\"");
      }
      at = end + 1;
    }
  }
}

/// constants.pkl holds the constants code/ refers to: none, where there is no code.
void check_script_constants(const ZipArchive& zip, const c10::Device& device) {
  PyRef constants =
      Unpickler(zip, zip.read("constants.pkl"), {"constants.pkl", "constants/", PickleDialect::TorchScript, device})
          .run();
  if (constants->kind != Kind::Tuple || !constants->items.empty()) {
    throw ArchiveCodeError("constants.pkl holds code constants (a " + constants->type_name() + " of " +
                           std::to_string(constants->items.size()) + "), which only code reads");
  }
}

/// A TorchScript type tag of the types an archive's values have: Tensor, int, float, bool, str,
/// NoneType, Any, List[T], Optional[T], Dict[K, V], Tuple[T, ...] (Tuple[()] when empty).
class ScriptTypeTag {
 public:
  explicit ScriptTypeTag(const std::string& text) : text_(text) {}
  c10::TypePtr parse() {
    c10::TypePtr t = type(1);
    if (pos_ != text_.size()) refuse("text after the type");
    return t;
  }

 private:
  c10::TypePtr type(std::int64_t depth) {
    if (depth > kMaxScriptNesting) refuse("nested more than " + std::to_string(kMaxScriptNesting) + " deep");
    const std::string name = word();
    if (name != "List" && name != "Optional" && name != "Dict" && name != "Tuple" && name != "Tensor" &&
        name != "int" && name != "float" && name != "bool" && name != "str" && name != "NoneType" && name != "Any") {
      refuse("'" + name + "'");
    }
    if (name == "Tensor") return c10::TensorType::get();
    if (name == "int") return c10::IntType::get();
    if (name == "float") return c10::FloatType::get();
    if (name == "bool") return c10::BoolType::get();
    if (name == "str") return c10::StringType::get();
    if (name == "NoneType") return c10::NoneType::get();
    if (name == "Any") return c10::AnyType::get();
    expect('[');
    std::vector<c10::TypePtr> args;
    if (name == "Tuple" && eat('(')) {
      expect(')');
    } else {
      do {
        args.push_back(type(depth + 1));
      } while (eat(','));
    }
    expect(']');
    if (name == "List" && args.size() == 1) return c10::ListType::create(args[0]);
    if (name == "Optional" && args.size() == 1) return c10::OptionalType::create(args[0]);
    if (name == "Dict" && args.size() == 2) return dict_type(args[0], args[1]);
    if (name == "Tuple") return c10::TupleType::create(std::move(args));
    refuse("'" + name + "' of " + std::to_string(args.size()) + " types");
  }
  std::string word() {
    skip_spaces();
    const std::size_t from = pos_;
    while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) ++pos_;
    if (pos_ == from) refuse("no type name");
    return text_.substr(from, pos_ - from);
  }
  bool eat(char c) {
    skip_spaces();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) refuse(std::string("no '") + c + "'");
  }
  void skip_spaces() {
    while (pos_ < text_.size() && text_[pos_] == ' ') ++pos_;
  }
  /// Dict[key, value], through LibTorch's own IValue::type(), which refuses keys a dict may not
  /// have. (DictType::create is inline, and under UBSan's vptr check needs the typeinfo of a
  /// type LibTorch does not export.)
  static c10::TypePtr dict_type(const c10::TypePtr& key, const c10::TypePtr& value) {
    return c10::IValue(c10::impl::GenericDict(key, value)).type();
  }
  [[noreturn]] void refuse(const std::string& what) const {
    throw TorchSaveError(
        "a list or dict of type \"" + text_ + "\": " + what + " at character " + std::to_string(pos_) +
        " (types an archive's values have: Tensor, int, float, bool, str, List, Dict, Tuple, Optional)");
  }

  const std::string& text_;
  std::size_t pos_ = 0;
};

/// The module tree of an archive, built from data.pkl's objects as OutputArchive builds it:
/// attributes, submodules and tensors on modules of fresh class types. What the pickle shares
/// (a memoized module or container) is built once and shared.
class ScriptModuleTree {
 public:
  torch::jit::Module module(const PyValue& object, std::int64_t depth) {
    if (const auto it = modules_.find(&object); it != modules_.end()) return it->second;
    if (depth > kMaxScriptNesting) too_deep();
    if (object.kind != Kind::Object || !starts_with(object.text, "__torch__.")) {
      throw TorchSaveError("data.pkl holds a " + object.type_name() + " where a module belongs");
    }
    if (object.items.empty()) throw TorchSaveError("data.pkl holds a module whose attributes are never set");
    if (made_++ >= kMaxScriptModules) {
      throw TorchSaveError("data.pkl holds more than " + std::to_string(kMaxScriptModules) + " modules");
    }
    torch::jit::Module m("__torch__.Module", cu_, /*shouldMangle=*/true);
    const auto& attributes = object.items[0]->entries;  // string keys: checked by the unpickler
    // LibTorch's class type looks an attribute up name by name: adding the n-th compares n names.
    const auto n = static_cast<std::int64_t>(attributes.size());
    lookups_ += n * (n + 1) / 2;
    if (lookups_ > kMaxScriptAttributeLookups) {
      throw TorchSaveError("data.pkl holds modules of too many attributes (" + std::to_string(n) +
                           " in one): more than LibTorch's modules are built from in a few seconds");
    }
    for (const auto& [key, v] : attributes) {
      const std::string& name = key->text;
      if (m.hasattr(name)) throw TorchSaveError("data.pkl sets attribute '" + name + "' of a module twice");
      if (v->kind == Kind::Object) {
        m.register_module(name, module(*v, depth + 1));
      } else {
        // A tensor is an attribute of type Tensor, as OutputArchive registers it (a parameter
        // or a buffer alike: InputArchive reads both the same).
        m.register_attribute(name, v->kind == Kind::Tensor ? c10::TensorType::get() : type_of(*v, depth + 1),
                             value(*v, depth + 1));
      }
    }
    modules_.emplace(&object, m);
    return m;
  }

 private:
  c10::IValue value(const PyValue& v, std::int64_t depth) {
    switch (v.kind) {
      case Kind::None:
        return {};
      case Kind::Bool:
        return v.boolean;
      case Kind::Int:
        return v.integer;
      case Kind::Float:
        return v.real;
      case Kind::String:
        return v.text;
      case Kind::Tensor:
        return v.tensor;
      case Kind::Tuple:
      case Kind::List:
      case Kind::Dict:
        return container(v, depth);
      default:
        throw TorchSaveError("data.pkl holds a " + v.type_name() + " as a value; an archive's values are tensors, " +
                             "numbers, strings, None, tuples, lists and dicts");
    }
  }

  c10::IValue container(const PyValue& v, std::int64_t depth) {
    if (const auto it = containers_.find(&v); it != containers_.end()) return it->second;
    if (depth > kMaxScriptNesting) too_deep();
    c10::IValue out;
    if (v.kind == Kind::Tuple) {
      std::vector<c10::IValue> items;
      for (const auto& i : v.items) items.push_back(value(*i, depth + 1));
      out = c10::ivalue::Tuple::create(std::move(items));
    } else if (v.kind == Kind::List) {
      const c10::TypePtr element = tag(v)->containedTypes().at(0);
      c10::impl::GenericList list(element);
      for (const auto& i : v.items) list.push_back(checked(*i, element, v, depth));
      out = std::move(list);
    } else {
      const auto contained = tag(v)->containedTypes();
      c10::impl::GenericDict dict(contained.at(0), contained.at(1));
      for (const auto& [k, x] : v.entries) {
        if (!dict.insert(checked(*k, contained[0], v, depth), checked(*x, contained[1], v, depth)).second) {
          throw TorchSaveError("data.pkl holds a dict with a key twice");
        }
      }
      out = std::move(dict);
    }
    containers_.emplace(&v, out);
    return out;
  }

  /// Item `item` of `container`, which must be of `type` (its tag's).
  c10::IValue checked(const PyValue& item, const c10::TypePtr& type, const PyValue& container, std::int64_t depth) {
    if (!type_of(item, depth + 1)->isSubtypeOf(*type)) {
      throw TorchSaveError("data.pkl holds a " + item.type_name() + " in a " + container.type_name() + " of type \"" +
                           container.text + "\"");
    }
    return value(item, depth + 1);
  }

  /// The type of `v`, computed once per value (IValue::type() would walk a shared tuple once
  /// per path to it).
  c10::TypePtr type_of(const PyValue& v, std::int64_t depth) {
    if (const auto it = types_.find(&v); it != types_.end()) return it->second;
    if (depth > kMaxScriptNesting) too_deep();
    c10::TypePtr t;
    switch (v.kind) {
      case Kind::None:
        t = c10::NoneType::get();
        break;
      case Kind::Bool:
        t = c10::BoolType::get();
        break;
      case Kind::Int:
        t = c10::IntType::get();
        break;
      case Kind::Float:
        t = c10::FloatType::get();
        break;
      case Kind::String:
        t = c10::StringType::get();
        break;
      case Kind::Tensor:
        t = c10::TensorType::get();
        break;
      case Kind::Tuple: {
        std::vector<c10::TypePtr> items;
        for (const auto& i : v.items) items.push_back(type_of(*i, depth + 1));
        t = c10::TupleType::create(std::move(items));
        break;
      }
      case Kind::List:
      case Kind::Dict:
        t = tag(v);
        break;
      default:
        throw TorchSaveError("data.pkl holds a " + v.type_name() + " as a value; an archive's values are tensors, " +
                             "numbers, strings, None, tuples, lists and dicts");
    }
    types_.emplace(&v, t);
    return t;
  }

  /// The type a list or dict is tagged with: List[...] for a list, Dict[...] for a dict.
  c10::TypePtr tag(const PyValue& v) {
    if (v.text.empty()) throw TorchSaveError("data.pkl holds a " + v.type_name() + " without its TorchScript type");
    auto it = tags_.find(v.text);
    if (it == tags_.end()) it = tags_.emplace(v.text, ScriptTypeTag(v.text).parse()).first;
    const bool fits = v.kind == Kind::List ? it->second->kind() == c10::TypeKind::ListType
                                           : it->second->kind() == c10::TypeKind::DictType;
    if (!fits) throw TorchSaveError("data.pkl holds a " + v.type_name() + " tagged \"" + v.text + "\"");
    return it->second;
  }

  [[noreturn]] static void too_deep() {
    throw TorchSaveError("data.pkl nests modules, tuples, lists and dicts more than " +
                         std::to_string(kMaxScriptNesting) + " deep; trainer's archives nest about 10");
  }

  std::shared_ptr<torch::jit::CompilationUnit> cu_ = std::make_shared<torch::jit::CompilationUnit>();
  std::int64_t made_ = 0;     ///< modules made so far, the ones being built included
  std::int64_t lookups_ = 0;  ///< attribute names LibTorch compares to build them
  std::unordered_map<const PyValue*, torch::jit::Module> modules_;
  std::unordered_map<const PyValue*, c10::IValue> containers_;
  std::unordered_map<const PyValue*, c10::TypePtr> types_;
  std::unordered_map<std::string, c10::TypePtr> tags_;
};

torch::serialize::InputArchive read_records(const std::string& path, const c10::Device& device) {
  ZipLayout layout;
  layout.inflate_code = true;
  const std::unique_ptr<ZipArchive> zip = ZipArchive::open(path, layout);
  if (!zip) throw TorchSaveError("it is not a zip archive (the format LibTorch writes)");
  for (const char* record : {"data.pkl", "constants.pkl"}) {
    if (!zip->has(record)) throw TorchSaveError(std::string("no ") + record + " record: not a TorchScript archive");
  }
  check_script_code(*zip);
  check_script_constants(*zip, device);
  PyRef root = Unpickler(*zip, zip->read("data.pkl"), {"data.pkl", "data/", PickleDialect::TorchScript, device}).run();
  torch::serialize::InputArchive archive;
  compat::set_archive_module(archive, ScriptModuleTree().module(*root, 1));
  return archive;
}

}  // namespace

torch::serialize::InputArchive read_script_archive(const std::string& path, const c10::Device& device) {
  try {
    return read_records(path, device);
  } catch (const c10::Error& e) {
    if (is_out_of_memory(e)) throw;
    throw TorchSaveError(std::string("data LibTorch refuses (") + e.what_without_backtrace() + ")");
  }
}

}  // namespace trainer::detail
