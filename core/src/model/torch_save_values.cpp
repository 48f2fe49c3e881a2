// The unpickler's values, its stack and memo, and the check that the result neither contains
// itself nor nests lists, tuples and dicts too deep.
#include "model/torch_save_unpickler.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace trainer::detail {

Unpickler::~Unpickler() {
  for (const auto& weak : containers_) {
    if (auto v = weak.lock(); v && !reachable_.count(v.get())) {
      v->items.clear();
      v->entries.clear();
    }
  }
}

PyRef Unpickler::make(Kind k) {
  auto v = std::make_shared<PyValue>();
  v->kind = k;
  if (v->is_container()) {
    v->nesting = 1;
    containers_.push_back(v);
  }
  return v;
}

void Unpickler::nest(PyValue& container, const PyValue& child) const {
  if (child.nesting >= container.nesting) {
    container.nesting = child.nesting + 1;
    if (container.nesting > kMaxPickleNesting) too_deep();
  }
}

void Unpickler::too_deep() const {
  throw TorchSaveError(source_.name + " nests lists, tuples and dicts more than " + std::to_string(kMaxPickleNesting) +
                       " deep; Python's pickle never writes that deep");
}

void Unpickler::add_items(PyValue& l, const std::vector<PyRef>& items) {
  for (const auto& i : items) nest(l, *i);
  l.items.insert(l.items.end(), items.begin(), items.end());
}

PyRef Unpickler::boolean(bool b) {
  auto v = make(Kind::Bool);
  v->boolean = b;
  return v;
}

PyRef Unpickler::integer(std::int64_t i) {
  auto v = make(Kind::Int);
  v->integer = i;
  return v;
}

PyRef Unpickler::global(const std::string& name) {
  auto v = make(Kind::Global);
  v->text = name.substr(0, kMaxNameBytes);
  return v;
}

PyRef Unpickler::object(const std::string& name) {
  auto v = make(Kind::Object);
  v->text = name.substr(0, kMaxNameBytes);
  return v;
}

std::string Unpickler::name_of(const PyValue& cls) {
  return cls.kind == Kind::Global || cls.kind == Kind::Object ? cls.text : cls.type_name();
}

PyRef Unpickler::tuple_of(std::vector<PyRef> items) {
  auto v = make(Kind::Tuple);
  add_items(*v, items);
  return v;
}

void Unpickler::push(PyRef v) {
  count_value();
  stack_.push_back(std::move(v));
}

void Unpickler::count_value() {
  if (++values_ > kMaxPickleValues) {
    throw TorchSaveError(source_.name + " makes more than " + std::to_string(kMaxPickleValues) + " values (at byte " +
                         std::to_string(pos_) + "), more than a state_dict or training checkpoint holds");
  }
}

PyRef Unpickler::top() {
  if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) malformed("stack underflow");
  return stack_.back();
}

PyRef Unpickler::pop() {
  PyRef v = top();
  stack_.pop_back();
  return v;
}

std::vector<PyRef> Unpickler::pop_n(std::size_t n) {
  if (stack_.size() < n || (!marks_.empty() && stack_.size() - n < marks_.back())) malformed("stack underflow");
  std::vector<PyRef> v(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
  stack_.resize(stack_.size() - n);
  return v;
}

std::vector<PyRef> Unpickler::pop_mark() {
  if (marks_.empty()) malformed("no MARK");
  const std::size_t m = marks_.back();
  marks_.pop_back();
  std::vector<PyRef> v(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
  stack_.resize(m);
  return v;
}

PyRef Unpickler::list(const PyRef& v) {
  if (v->kind != Kind::List) malformed("APPEND to a " + v->type_name());
  return v;
}

PyRef Unpickler::dict(const PyRef& v) {
  // BUILD-less objects (an opaque class instance filled with SETITEMS) take the items unread;
  // LibTorch's pickler sets a module's attributes only through BUILD.
  if (v->kind != Kind::Dict && (v->kind != Kind::Object || script())) malformed("SETITEM on a " + v->type_name());
  return v;
}

void Unpickler::set_items(PyValue& d, const std::vector<PyRef>& kvs) {
  if (kvs.size() % 2 != 0) malformed("an odd number of dict items");
  if (d.kind != Kind::Dict) return;
  for (std::size_t i = 0; i < kvs.size(); i += 2) {
    nest(d, *kvs[i]);
    nest(d, *kvs[i + 1]);
    d.entries.emplace_back(kvs[i], kvs[i + 1]);
  }
}

void Unpickler::memo(std::uint64_t index) {
  PyRef v = top();
  count_value();
  memo_[index] = std::move(v);
}

PyRef Unpickler::recall(std::uint64_t index) {
  const auto it = memo_.find(index);
  if (it == memo_.end()) malformed("memo entry " + std::to_string(index) + " read before it is written");
  return it->second;
}

void Unpickler::check_nesting(const PyRef& root) {
  if (!root->is_container()) return;
  struct Frame {
    const PyValue* value;
    std::size_t next = 0;    // the next child to look at: items, then keys and values
    std::int64_t below = 0;  // the deepest nesting seen below it
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
      if (on_path.count(c)) throw TorchSaveError(source_.name + " holds a " + c->type_name() + " that contains itself");
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

}  // namespace trainer::detail
