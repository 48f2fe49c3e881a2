// The study record of a study's journal against this study's (declared in study_journal.h):
// every difference a resume must not accept (study_differences), and the overrides it may.
#include "study_journal.h"

#include <fmt/ranges.h>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "trainer/error.h"
#include "trainer/recipe.h"

namespace trainer::tune {

using json = nlohmann::json;

// The study record against this study's, on a resume.

namespace {

/// "training.epochs" of an override ("" when it is not one that sets a key), for comparing.
std::string override_key(const std::string& text) {
  try {
    return parse_override(text).key;
  } catch (const Error&) {
    return text;  // compared as it is
  }
}

/// A field of a record; null when absent.
const json& field_of(const json& record, const std::string& field) {
  static const json none;
  return record.is_object() && record.contains(field) ? record[field] : none;
}

/// A value of a study record in a message: absent -> "nothing".
std::string value_text(const json& record, const std::string& field) {
  if (!record.contains(field)) return "nothing";
  return record[field].is_string() ? record[field].get<std::string>() : record[field].dump();
}

/// A parameter of a space record as "choice [\"0.01\",\"0.1\"]", "log_uniform 0.0001..0.01".
std::string param_text(const json& p) {
  if (p.is_null()) return "nothing";
  json q = p;
  if (q.is_object()) q.erase("key");
  return q.dump();
}

/// Each difference of two flat objects of name -> value, as "name: journal has X, now Y".
void compare_objects(const json& past, const json& now, const std::string& prefix, std::vector<std::string>& out) {
  std::set<std::string> keys;
  for (const auto& [k, v] : past.items()) keys.insert(k);
  for (const auto& [k, v] : now.items()) keys.insert(k);
  for (const auto& k : keys) {
    const std::string a = value_text(past, k), b = value_text(now, k);
    if (a != b) out.push_back(prefix + k + ": journal has " + a + ", now " + b);
  }
}

/// The overrides of a study record that a resume compares, by the key each sets, in order.
std::map<std::string, std::vector<std::string>> compared_overrides(const json& record) {
  std::map<std::string, std::vector<std::string>> out;
  if (!record.contains("overrides")) return out;
  for (const auto& o : record["overrides"]) {
    const std::string text = o.get<std::string>();
    if (!resume_may_change(text)) out[override_key(text)].push_back(text);
  }
  return out;
}

}  // namespace

bool resume_may_change(const std::string& override_text) {
  const std::string key = override_key(override_text);
  return key == "sweep.n_trials" || key == "sweep.parallel" || key == "sweep.dir";
}

std::vector<std::string> study_differences(const json& past, const json& now) {
  std::vector<std::string> out;
  const bool current = past.contains("version");
  if (current) {
    if (field_of(past, "recipe") != field_of(now, "recipe")) {
      out.push_back("recipe: journal has " + value_text(past, "recipe") + ", now " + value_text(now, "recipe"));
    }
    // The resolved config (the recipe, its config groups, the overrides), key by key; the hash
    // catches what the keys cannot show.
    std::vector<std::string> keys;
    compare_objects(field_of(past, "config"), field_of(now, "config"), "", keys);
    out.insert(out.end(), keys.begin(), keys.end());
    if (keys.empty() && field_of(past, "config_hash") != field_of(now, "config_hash")) {
      out.push_back("resolved config (content hash): journal has " + value_text(past, "config_hash") + ", now " +
                    value_text(now, "config_hash"));
    }
  }
  const auto po = compared_overrides(past), no = compared_overrides(now);
  std::set<std::string> okeys;
  for (const auto& [k, v] : po) okeys.insert(k);
  for (const auto& [k, v] : no) okeys.insert(k);
  for (const auto& k : okeys) {
    const auto a = po.count(k) ? fmt::to_string(fmt::join(po.at(k), " ")) : std::string("nothing");
    const auto b = no.count(k) ? fmt::to_string(fmt::join(no.at(k), " ")) : std::string("nothing");
    if (a != b) out.push_back("override " + k + ": journal has " + a + ", now " + b);
  }
  for (const char* k : {"objective", "direction", "sampler", "seed"}) {
    if (field_of(past, k) != field_of(now, k)) {
      out.push_back(std::string("sweep.") + k + ": journal has " + value_text(past, k) + ", now " + value_text(now, k));
    }
  }
  if (current) compare_objects(field_of(past, "settings"), field_of(now, "settings"), "", out);
  if (past.contains("space") && field_of(past, "space") != field_of(now, "space")) {
    // Parameter by parameter, by key.
    std::map<std::string, json> a, b;
    for (const auto& p : field_of(past, "space"))
      a[p.is_object() && p.contains("key") ? p["key"].dump() : p.dump()] = p;
    for (const auto& p : field_of(now, "space")) b[p.is_object() && p.contains("key") ? p["key"].dump() : p.dump()] = p;
    std::set<std::string> keys;
    for (const auto& [k, v] : a) keys.insert(k);
    for (const auto& [k, v] : b) keys.insert(k);
    std::size_t said = out.size();
    for (const auto& k : keys) {
      const json pa = a.count(k) ? a[k] : json(), pb = b.count(k) ? b[k] : json();
      if (pa == pb) continue;
      const json name = json::parse(k, nullptr, false);
      const std::string param = name.is_string() ? name.get<std::string>() : k;
      out.push_back("search space [sweep.space] " + param + ": journal has " + param_text(pa) + ", now " +
                    param_text(pb));
    }
    if (out.size() == said) out.push_back("search space [sweep.space]: its parameters are in another order");
  }
  return out;
}

}  // namespace trainer::tune
