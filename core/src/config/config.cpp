#include "trainer/config.h"

#include <fmt/format.h>
#include <toml.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <sstream>
#include <type_traits>

#include "config/config_numbers.h"
#include "trainer/error.h"
#include "trainer/json.h"

namespace trainer {
namespace detail {

struct ConfigNode {
  bool is_table = true;
  ConfigValue value;
  std::map<std::string, std::shared_ptr<ConfigNode>> children;
  std::string origin;
};

}  // namespace detail

using detail::ConfigNode;

namespace {

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : key) {
    if (c == '.') {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!key.empty()) parts.push_back(cur);
  return parts;
}

std::string join_key(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

using TomlValue = toml::basic_value<toml::discard_comments, std::map, std::vector>;

std::string location_of(const TomlValue& v) {
  const auto loc = v.location();
  return loc.file_name() + ":" + std::to_string(loc.line());
}

/// toml11 reads a number literal past its type's range as the range's limit (a float that
/// underflows as 0) without an error; only then is the literal's text read. "" when fine.
std::string number_problem(const TomlValue& v) {
  using I = std::numeric_limits<std::int64_t>;
  const auto loc = v.location();
  if (loc.column() < 1 || !(v.is_integer() || v.is_floating())) return {};
  if (v.is_integer()) {
    if (v.as_integer() != I::max() && v.as_integer() != I::min()) return {};
    return detail::integer_literal_overflows(loc.line_str(), loc.column() - 1)
               ? fmt::format("integer outside the range [{}, {}]", I::min(), I::max())
               : std::string();
  }
  if (std::fabs(v.as_floating()) != std::numeric_limits<double>::max() && v.as_floating() != 0.0) return {};
  return detail::float_literal_out_of_range(loc.line_str(), loc.column() - 1);
}

std::shared_ptr<ConfigNode> leaf(ConfigValue v, std::string origin) {
  auto n = std::make_shared<ConfigNode>();
  n->is_table = false;
  n->value = std::move(v);
  n->origin = std::move(origin);
  return n;
}

// NOTE: arrays keep one element type: all integers → integer list, numbers with at least
// one float → float list, strings → string list. An empty array is stored as an empty
// string list and accepted wherever any list is expected.
void convert(const TomlValue& v, const std::string& key, std::shared_ptr<ConfigNode>& out,
             std::vector<std::string>& errors) {
  const std::string where = location_of(v);
  switch (v.type()) {
    case toml::value_t::table: {
      if (!out || !out->is_table) out = std::make_shared<ConfigNode>();
      out->origin = where;
      for (const auto& kv : v.as_table()) {
        auto& child = out->children[kv.first];
        convert(kv.second, join_key(key, kv.first), child, errors);
        if (!child) out->children.erase(kv.first);
      }
      return;
    }
    case toml::value_t::integer:
    case toml::value_t::floating:
      if (const std::string bad = number_problem(v); !bad.empty()) {
        errors.push_back(fmt::format("{}: key '{}': {}", where, key, bad));
        out = nullptr;
      } else if (v.is_integer()) {
        out = leaf(static_cast<std::int64_t>(v.as_integer()), where);
      } else {
        out = leaf(static_cast<double>(v.as_floating()), where);
      }
      return;
    case toml::value_t::boolean:
      out = leaf(static_cast<bool>(v.as_boolean()), where);
      return;
    case toml::value_t::string:
      out = leaf(static_cast<std::string>(v.as_string()), where);
      return;
    case toml::value_t::array: {
      const auto& arr = v.as_array();
      bool all_int = true, all_num = true, all_str = true;
      for (const auto& e : arr) {
        all_int = all_int && e.is_integer();
        all_num = all_num && (e.is_integer() || e.is_floating());
        all_str = all_str && e.is_string();
      }
      if (arr.empty()) {
        out = leaf(std::vector<std::string>{}, where);
      } else if (const auto bad = std::find_if(arr.begin(), arr.end(),
                                               [](const TomlValue& e) { return !number_problem(e).empty(); });
                 bad != arr.end()) {
        errors.push_back(
            fmt::format("{}: key '{}': element {}: {}", where, key, bad - arr.begin(), number_problem(*bad)));
        out = nullptr;
      } else if (all_int) {
        std::vector<std::int64_t> xs;
        for (const auto& e : arr) xs.push_back(e.as_integer());
        out = leaf(xs, where);
      } else if (all_num) {
        std::vector<double> xs;
        for (const auto& e : arr) xs.push_back(e.is_integer() ? double(e.as_integer()) : e.as_floating());
        out = leaf(xs, where);
      } else if (all_str) {
        std::vector<std::string> xs;
        for (const auto& e : arr) xs.push_back(e.as_string());
        out = leaf(xs, where);
      } else {
        errors.push_back(fmt::format("{}: key '{}': arrays must hold only numbers or only strings", where, key));
        out = nullptr;
      }
      return;
    }
    default:
      errors.push_back(fmt::format(
          "{}: key '{}': unsupported value type ({}); use integers, floats, bools, strings or arrays of them", where,
          key, toml::stringize(v.type())));
      out = nullptr;
  }
}

// JSON string escapes are valid TOML basic-string escapes.
std::string quote(const std::string& s) { return json_quote(s); }

std::string bare_or_quoted_key(const std::string& k) {
  bool bare = !k.empty();
  for (char c : k) bare = bare && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-');
  return bare ? k : quote(k);
}

std::shared_ptr<ConfigNode> deep_copy(const std::shared_ptr<ConfigNode>& n) {
  auto c = std::make_shared<ConfigNode>(*n);
  for (auto& kv : c->children) kv.second = deep_copy(kv.second);
  return c;
}

void merge_into(ConfigNode& dst, const ConfigNode& src) {
  for (const auto& kv : src.children) {
    auto it = dst.children.find(kv.first);
    if (it != dst.children.end() && it->second->is_table && kv.second->is_table) {
      merge_into(*it->second, *kv.second);
    } else {
      dst.children[kv.first] = deep_copy(kv.second);
    }
  }
}

void emit_table(const ConfigNode& node, const std::string& path, std::ostringstream& os) {
  bool header_written = path.empty();
  for (const auto& kv : node.children) {
    if (kv.second->is_table) continue;
    if (!header_written) {
      os << "\n[" << path << "]\n";
      header_written = true;
    }
    os << bare_or_quoted_key(kv.first) << " = " << config_value_to_toml(kv.second->value) << "\n";
  }
  for (const auto& kv : node.children) {
    if (!kv.second->is_table) continue;
    const std::string sub = join_key(path, bare_or_quoted_key(kv.first));
    if (kv.second->children.empty()) {
      os << "\n[" << sub << "]\n";
      continue;
    }
    emit_table(*kv.second, sub, os);
  }
}

void collect_leaves(const ConfigNode& node, const std::string& prefix, std::vector<std::string>& out) {
  for (const auto& kv : node.children) {
    const std::string k = join_key(prefix, kv.first);
    if (kv.second->is_table) {
      collect_leaves(*kv.second, k, out);
    } else {
      out.push_back(k);
    }
  }
}

/// "integer", "float", ... for messages.
template <typename T>
constexpr const char* type_name() {
  if constexpr (std::is_same_v<T, std::int64_t>) return "integer";
  if constexpr (std::is_same_v<T, double>) return "float";
  if constexpr (std::is_same_v<T, bool>) return "bool";
  if constexpr (std::is_same_v<T, std::string>) return "string";
  if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) return "integer list";
  if constexpr (std::is_same_v<T, std::vector<double>>) return "float list";
  if constexpr (std::is_same_v<T, std::vector<std::string>>) return "string list";
}

}  // namespace

std::string config_value_type_name(const ConfigValue& v) {
  return std::visit([](const auto& x) { return std::string(type_name<std::decay_t<decltype(x)>>()); }, v);
}

namespace {
struct TomlVisitor {
  std::string operator()(std::int64_t x) const { return std::to_string(x); }
  std::string operator()(double x) const { return detail::format_double(x); }
  std::string operator()(bool x) const { return x ? "true" : "false"; }
  std::string operator()(const std::string& x) const { return quote(x); }
  template <typename T>
  std::string operator()(const std::vector<T>& xs) const {
    std::string s = "[";
    for (std::size_t i = 0; i < xs.size(); ++i) s += (i ? ", " : "") + (*this)(static_cast<T>(xs[i]));
    return s + "]";
  }
};
}  // namespace

std::string config_value_to_toml(const ConfigValue& v) { return std::visit(TomlVisitor{}, v); }

Config::Config() : root_(std::make_shared<ConfigNode>()) {}
Config::Config(std::shared_ptr<ConfigNode> root) : root_(std::move(root)) {}

Config Config::parse(const std::string& toml_text, const std::string& source) {
  // TOML is UTF-8. Checked here because toml11 3.7 reads out of bounds when it reports invalid
  // UTF-8 inside a literal string (found by tests/fuzz/recipe_fuzz).
  if (const std::string bad = detail::utf8_problem(toml_text, source); !bad.empty()) throw ConfigError({bad});
  std::istringstream is(toml_text);
  TomlValue parsed;
  try {
    parsed = toml::parse<toml::discard_comments, std::map, std::vector>(is, source);
  } catch (const std::exception& e) {
    throw ConfigError({fmt::format("cannot parse {}:\n{}", source, e.what())});
  }
  std::vector<std::string> errors;
  auto root = std::make_shared<ConfigNode>();
  convert(parsed, "", root, errors);
  if (!errors.empty()) throw ConfigError(errors);
  return Config(root);
}

Config Config::parse_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError({fmt::format("{}: cannot open file (does it exist?)", path)});
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

namespace {
const ConfigNode* find_node(const ConfigNode* root, const std::string& key) {
  if (key.empty()) return root;
  const ConfigNode* n = root;
  for (const auto& part : split_key(key)) {
    if (!n->is_table) return nullptr;
    auto it = n->children.find(part);
    if (it == n->children.end()) return nullptr;
    n = it->second.get();
  }
  return n;
}
}  // namespace

bool Config::has(const std::string& key) const { return find_node(root_.get(), key) != nullptr; }

bool Config::is_table(const std::string& key) const {
  const auto* n = find_node(root_.get(), key);
  return n && n->is_table;
}

const ConfigValue& Config::value(const std::string& key) const {
  const auto* n = find_node(root_.get(), key);
  if (!n) throw ConfigError({fmt::format("missing config key '{}'", key)});
  if (n->is_table) throw ConfigError({fmt::format("{}: key '{}' is a table, not a value", n->origin, key)});
  return n->value;
}

template <typename T>
T Config::get(const std::string& key) const {
  const ConfigValue& v = value(key);
  if (const T* x = std::get_if<T>(&v)) return *x;
  if constexpr (std::is_same_v<T, double>) {
    if (const auto* i = std::get_if<std::int64_t>(&v)) return static_cast<double>(*i);
  }
  if constexpr (std::is_same_v<T, std::vector<double>>) {
    if (const auto* is = std::get_if<std::vector<std::int64_t>>(&v)) return T(is->begin(), is->end());
  }
  if constexpr (std::is_same_v<T, std::vector<std::int64_t>> || std::is_same_v<T, std::vector<double>> ||
                std::is_same_v<T, std::vector<std::string>>) {
    if (const auto* s = std::get_if<std::vector<std::string>>(&v); s && s->empty()) return T{};
  }
  throw ConfigError({fmt::format("{}: key '{}': expected {}, got {} {}", origin(key), key, type_name<T>(),
                                 config_value_type_name(v), config_value_to_toml(v))});
}

template TRAINER_API std::int64_t Config::get<std::int64_t>(const std::string&) const;
template TRAINER_API double Config::get<double>(const std::string&) const;
template TRAINER_API bool Config::get<bool>(const std::string&) const;
template TRAINER_API std::string Config::get<std::string>(const std::string&) const;
template TRAINER_API std::vector<std::int64_t> Config::get<std::vector<std::int64_t>>(const std::string&) const;
template TRAINER_API std::vector<double> Config::get<std::vector<double>>(const std::string&) const;
template TRAINER_API std::vector<std::string> Config::get<std::vector<std::string>>(const std::string&) const;

std::vector<std::string> Config::keys(const std::string& table) const {
  std::vector<std::string> out;
  const auto* n = find_node(root_.get(), table);
  if (!n || !n->is_table) return out;
  for (const auto& kv : n->children) out.push_back(kv.first);
  return out;
}

std::vector<std::string> Config::leaf_keys(const std::string& table) const {
  std::vector<std::string> out;
  const auto* n = find_node(root_.get(), table);
  if (n && n->is_table) collect_leaves(*n, table, out);
  return out;
}

Config Config::sub(const std::string& key) const {
  const auto* n = find_node(root_.get(), key);
  if (!n || !n->is_table) return Config();
  // Aliasing constructor: the view keeps the whole tree alive.
  return Config(std::shared_ptr<ConfigNode>(root_, const_cast<ConfigNode*>(n)));
}

std::string Config::origin(const std::string& key) const {
  const auto* n = find_node(root_.get(), key);
  return n ? n->origin : std::string("<absent>");
}

void Config::set(const std::string& key, ConfigValue value, const std::string& origin) {
  const auto parts = split_key(key);
  TRAINER_ASSERT(!parts.empty(), "empty config key");
  ConfigNode* n = root_.get();
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    auto& child = n->children[parts[i]];
    if (!child || !child->is_table) {
      child = std::make_shared<ConfigNode>();
      child->origin = origin;
    }
    n = child.get();
  }
  n->children[parts.back()] = leaf(std::move(value), origin);
}

bool Config::erase(const std::string& key) {
  const auto parts = split_key(key);
  if (parts.empty()) return false;
  ConfigNode* n = root_.get();
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    auto it = n->children.find(parts[i]);
    if (it == n->children.end() || !it->second->is_table) return false;
    n = it->second.get();
  }
  return n->children.erase(parts.back()) > 0;
}

void Config::merge(const Config& other) { merge_into(*root_, *other.root_); }

Config Config::clone() const { return Config(deep_copy(root_)); }

std::string Config::to_toml() const {
  std::ostringstream os;
  emit_table(*root_, "", os);
  std::string s = os.str();
  if (!s.empty() && s.front() == '\n') s.erase(0, 1);
  return s;
}

}  // namespace trainer
