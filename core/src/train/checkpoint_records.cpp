// What a checkpoint records beside the model and the optimizer: the data order a resume
// checks (data_order_of, Checkpointer::check_data_order) and the plugins' states.
#include <fmt/ranges.h>
#include <torch/serialize.h>

#include <map>
#include <sstream>
#include <variant>

#include "train/checkpoint.h"
#include "trainer/config.h"
#include "trainer/error.h"

namespace trainer {

namespace {

/// The lines of a text index stored in a checkpoint (the data order, plugin names and keys).
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::map<std::string, std::string> parse_order(const std::string& text) {
  std::map<std::string, std::string> out;
  for (const std::string& line : lines_of(text)) {
    const auto tab = line.find('\t');
    if (tab != std::string::npos) out[line.substr(0, tab)] = line.substr(tab + 1);
  }
  return out;
}

std::string index_of(torch::serialize::InputArchive& ar, const std::string& key) {
  c10::IValue v;
  TRAINER_CHECK(ar.try_read(key, v) && v.isString(), "no index '", key, "'");
  return v.toStringRef();
}

PluginState::Value value_of(const c10::IValue& v, const std::string& key) {
  if (v.isInt()) return v.toInt();
  if (v.isDouble()) return v.toDouble();
  if (v.isBool()) return v.toBool();
  if (v.isString()) return v.toStringRef();
  if (v.isTensor()) return v.toTensor();
  throw Error(fmt::format("value of '{}' has an unsupported type {}", key, v.tagKind()));
}

}  // namespace

namespace detail {

std::string data_order_text(const DataOrder& order) {
  std::string out;
  for (const auto& [key, value] : order) out += key + "\t" + value + "\n";
  return out;
}

/// Plugin states as archive "plugin_state": an index of plugin names ("__plugins__"), one
/// sub-archive per plugin ("p0", "p1", ...) holding an index of its keys ("__keys__") and one
/// value per key ("v0", "v1", ...). Indices, not the names, are the archive's keys: a
/// plugin's keys are free text.
void write_plugin_states(torch::serialize::OutputArchive& ar, const std::map<std::string, PluginState>& states) {
  if (states.empty()) return;
  torch::serialize::OutputArchive all;
  std::string names;
  std::size_t i = 0;
  for (const auto& [name, state] : states) {
    torch::serialize::OutputArchive one;
    std::string keys;
    std::size_t j = 0;
    for (const auto& [key, value] : state.values()) {
      c10::IValue v = std::visit([](const auto& x) { return c10::IValue(x); }, value);
      one.write("v" + std::to_string(j++), v);
      keys += key + "\n";
    }
    one.write("__keys__", c10::IValue(keys));
    all.write("p" + std::to_string(i++), one);
    names += name + "\n";
  }
  all.write("__plugins__", c10::IValue(names));
  ar.write("plugin_state", all);
}

/// What write_plugin_states wrote (nothing in a checkpoint without plugin state).
std::map<std::string, PluginState> read_plugin_states(torch::serialize::InputArchive& ar) {
  std::map<std::string, PluginState> out;
  torch::serialize::InputArchive all;
  if (!ar.try_read("plugin_state", all)) return out;
  const auto names = lines_of(index_of(all, "__plugins__"));
  for (std::size_t i = 0; i < names.size(); ++i) {
    torch::serialize::InputArchive one;
    TRAINER_CHECK(all.try_read("p" + std::to_string(i), one), "no state for plugin '", names[i], "'");
    const auto keys = lines_of(index_of(one, "__keys__"));
    PluginState& state = out[names[i]];
    for (std::size_t j = 0; j < keys.size(); ++j) {
      c10::IValue v;
      TRAINER_CHECK(one.try_read("v" + std::to_string(j), v), "plugin '", names[i], "': no value for '", keys[j], "'");
      state.set(keys[j], value_of(v, keys[j]));
    }
  }
  return out;
}

}  // namespace detail

DataOrder data_order_of(const Config& cfg, std::int64_t train_samples, const at::Tensor& lengths) {
  DataOrder order;
  for (const char* key : {"run.seed", "training.shuffle", "training.drop_last", "dataset.name", "dataset.limit"}) {
    if (cfg.has(key)) order.emplace_back(key, config_value_to_toml(cfg.value(key)));
  }
  // Length groups are counted in batches, so the batch size orders the samples too. Recorded
  // only when on, so that checkpoints written before the key existed resume as before.
  if (cfg.has("training.group_by_length") && cfg.get<bool>("training.group_by_length")) {
    order.emplace_back("training.group_by_length", "true");
    if (cfg.has("training.batch_size")) {
      order.emplace_back("training.batch_size", config_value_to_toml(cfg.value("training.batch_size")));
    }
    if (lengths.defined()) {  // other lengths (another max_length, tokenizer or file) group otherwise
      const at::Tensor l = lengths.to(at::kLong).contiguous();
      const std::int64_t* p = l.data_ptr<std::int64_t>();
      std::uint64_t hash = 14695981039346656037ULL;  // FNV-1a over the lengths' bytes
      std::int64_t sum = 0;
      for (std::int64_t i = 0; i < l.numel(); ++i) {
        sum += p[i];
        for (int b = 0; b < 8; ++b) {
          hash = (hash ^ ((static_cast<std::uint64_t>(p[i]) >> (8 * b)) & 0xffU)) * 1099511628211ULL;
        }
      }
      order.emplace_back("training sample lengths", fmt::format("{} tokens, FNV-1a {:016x}", sum, hash));
    }
  }
  order.emplace_back("training samples", std::to_string(train_samples));
  return order;
}

void Checkpointer::check_data_order(const std::string& saved, const std::string& file) const {
  const auto then = parse_order(saved);
  std::map<std::string, std::string> now(order_.begin(), order_.end());
  auto value = [](const std::map<std::string, std::string>& m, const std::string& key) {
    const auto it = m.find(key);
    return it == m.end() ? std::string("(not set)") : it->second;
  };
  const bool shuffled = value(then, "training.shuffle") == "true" && value(now, "training.shuffle") == "true";
  std::vector<std::string> changed;
  for (const auto& [key, v] : now) {
    if (key == "run.seed" && !shuffled) continue;  // the seed orders the data only when it is shuffled
    if (value(then, key) != v) changed.push_back(fmt::format("{} = {} there, {} now", key, value(then, key), v));
  }
  for (const auto& [key, v] : then) {
    if (!now.count(key)) changed.push_back(fmt::format("{} = {} there, (not set) now", key, v));
  }
  TRAINER_CHECK_T(UsageError, changed.empty(), "cannot resume from ", file,
                  ": the order of the training samples would change: ", fmt::to_string(fmt::join(changed, "; ")),
                  ". Resume with the values it was written with (the config.toml of its run holds them), "
                  "or start a new run");
}

}  // namespace trainer
