// The unpickler's TorchScript dialect: what LibTorch's pickler writes into a torch::serialize
// archive's data.pkl, and nothing more. A module is NEWOBJ of a `__torch__` class with no
// arguments, then BUILD with the dict of its attributes; a tensor is _rebuild_tensor_v2 of a
// storage; a list or dict carries its TorchScript type, either as torch.jit._pickle's
// build_<type>list or restore_type_tag. Any other call, any other object, and an object built
// from anything but an attribute dict (what a class with __setstate__ pickles) is refused: only
// running code could make them, and nothing here runs.
#include <string>

#include "model/torch_save_unpickler.h"

namespace trainer::detail {

namespace {

/// The prefix of the classes TorchScript serializes (modules among them).
const std::string kScriptClassPrefix = "__torch__.";

bool script_class(const PyValue& v) {
  return (v.kind == PyValue::Kind::Global || v.kind == PyValue::Kind::Object) &&
         v.text.compare(0, kScriptClassPrefix.size(), kScriptClassPrefix) == 0;
}

}  // namespace

void Unpickler::refuse_code(const std::string& what) const {
  throw ArchiveCodeError(source_.name + " " + what + " (at byte " + std::to_string(pos_) +
                         "); a TorchScript archive of trainer's holds modules of tensors and values, nothing that "
                         "code would build");
}

PyRef Unpickler::new_object(const PyValue& cls, const PyValue* args) {
  if (!script()) return object(name_of(cls));
  if (cls.kind != Kind::Global || !script_class(cls)) refuse_code("makes an object of " + cls.type_name());
  if (args == nullptr || args->kind != Kind::Tuple || !args->items.empty()) {
    refuse_code("makes a " + cls.text + " with arguments");
  }
  return object(cls.text);
}

void Unpickler::build(const PyRef& state) {
  PyRef target = top();
  if (!script()) return;  // torch.save: an object's state; nothing of it is needed
  if (target->kind != Kind::Object || !script_class(*target)) refuse_code("sets the state of a " + target->type_name());
  if (!target->items.empty()) refuse_code("sets the state of a " + target->text + " twice");
  if (state->kind != Kind::Dict) {
    refuse_code("builds a " + target->text + " from a " + state->type_name() +
                ", not from the dict of its attributes (what a class with __setstate__ pickles)");
  }
  for (const auto& [key, value] : state->entries) {
    if (key->kind != Kind::String)
      refuse_code("names an attribute of a " + target->text + " with a " + key->type_name());
  }
  nest(*target, *state);
  target->items.push_back(state);
}

PyRef Unpickler::script_call(const PyValue& fn, const PyValue& args) {
  if (fn.kind != Kind::Global) refuse_code("calls a " + fn.type_name());
  const std::string& name = fn.text;
  if (name == "torch._utils._rebuild_tensor_v2") return tensor(args);
  // A tensor's backward hooks: always none.
  if (name == "collections.OrderedDict" && args.kind == Kind::Tuple && args.items.empty()) return make(Kind::Dict);
  const std::string helpers = "torch.jit._pickle.";
  if (name.compare(0, helpers.size(), helpers) == 0) {
    const std::string helper = name.substr(helpers.size());
    if (helper == "restore_type_tag") return type_tag(args);
    if (helper == "build_intlist" || helper == "build_doublelist" || helper == "build_boollist" ||
        helper == "build_tensorlist") {
      return typed_list(args, helper);
    }
  }
  refuse_code("calls " + name);
}

PyRef Unpickler::typed_list(const PyValue& args, const std::string& helper) {
  if (args.kind != Kind::Tuple || args.items.size() != 1 || args.items[0]->kind != Kind::List) {
    malformed(helper + " of something else than a list");
  }
  // build_<type>list: int, double (Python's float), bool, tensor.
  const std::string type = helper.substr(6, helper.size() - 6 - 4);
  const Kind kind = type == "int"      ? Kind::Int
                    : type == "double" ? Kind::Float
                    : type == "bool"   ? Kind::Bool
                                       : Kind::Tensor;
  PyRef list = args.items[0];
  for (const auto& item : list->items) {
    if (item->kind != kind) malformed(helper + " of a list holding a " + item->type_name());
  }
  list->text = kind == Kind::Int     ? "List[int]"
               : kind == Kind::Float ? "List[float]"
               : kind == Kind::Bool  ? "List[bool]"
                                     : "List[Tensor]";
  return list;
}

PyRef Unpickler::type_tag(const PyValue& args) {
  if (args.kind != Kind::Tuple || args.items.size() != 2 || args.items[1]->kind != Kind::String ||
      (args.items[0]->kind != Kind::List && args.items[0]->kind != Kind::Dict)) {
    malformed("restore_type_tag of something else than a list or dict and its type");
  }
  PyRef container = args.items[0];
  const std::string& tag = args.items[1]->text;
  if (tag.size() > kMaxTypeTagBytes) {
    malformed("a type tag of " + std::to_string(tag.size()) + " bytes (at most " + std::to_string(kMaxTypeTagBytes) +
              ")");
  }
  if (!container->text.empty() && container->text != tag) {
    malformed("a " + container->type_name() + " tagged as two types");
  }
  container->text = tag;
  return container;
}

}  // namespace trainer::detail
