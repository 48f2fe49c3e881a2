// Did-you-mean hints for config errors: the closest of a few words, and the key a recipe or
// override most likely meant (trainer/config_spec.h).
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <vector>

#include "trainer/config_spec.h"

namespace trainer {

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  // Edits between a and b (Damerau's optimal string alignment: an insertion, a deletion, a
  // change or two neighbours swapped count one each).
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
    for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
      for (std::size_t j = 1; j <= b.size(); ++j) {
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
      }
    }
    return d[a.size()][b.size()];
  };
  // At most one edit in four letters (one for words of up to 7): a guess past that names keys
  // that have nothing to do with the word ("zzz" is not "npz").
  std::string best;
  std::size_t best_d = std::max<std::size_t>(1, word.size() / 4) + 1;
  for (const auto& c : candidates) {
    const std::size_t d = distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

namespace {

/// A key of the tools users come from (Lightning, Hugging Face's Trainer, torchtune, timm,
/// Composer), as the last part of a dotted key, and trainer's key of that meaning (suggested
/// only where the recipe's schema has it), with what differs when something does.
struct KeyAlias {
  const char* theirs;
  const char* ours;
  const char* note;
};

constexpr KeyAlias kKeyAliases[] = {
    {"learning_rate", "optim.lr", ""},
    {"lr", "optim.lr", ""},
    {"weight_decay", "optim.weight_decay", ""},
    {"optimizer", "optim.name", ""},
    {"warmup", "sched.warmup_steps", ""},
    {"warmup_steps", "sched.warmup_steps", ""},
    {"num_warmup_steps", "sched.warmup_steps", ""},
    {"warmup_iters", "sched.warmup_steps", ""},
    {"lr_scheduler", "sched.name", ""},
    {"lr_scheduler_type", "sched.name", ""},
    {"scheduler", "sched.name", ""},
    {"max_epochs", "training.epochs", ""},
    {"num_epochs", "training.epochs", ""},
    {"num_train_epochs", "training.epochs", ""},
    {"epochs", "training.epochs", ""},
    {"batch_size", "training.batch_size", ""},
    {"train_batch_size", "training.batch_size", ""},
    {"per_device_train_batch_size", "training.batch_size", ""},
    {"max_steps", "training.max_steps", ""},
    {"max_grad_norm", "training.grad_clip_norm", ""},
    {"gradient_clip_val", "training.grad_clip_norm", ""},
    {"clip_grad_norm", "training.grad_clip_norm", ""},
    {"accumulate_grad_batches", "training.micro_batch_size",
     " (trainer takes the samples per forward: batch_size / accumulation steps)"},
    {"gradient_accumulation_steps", "training.micro_batch_size",
     " (trainer takes the samples per forward: batch_size / accumulation steps)"},
    {"log_every_n_steps", "training.log_every", ""},
    {"logging_steps", "training.log_every", ""},
    {"eval_batch_size", "eval.batch_size", ""},
    {"per_device_eval_batch_size", "eval.batch_size", ""},
    {"save_total_limit", "checkpoint.keep_last", ""},
    {"save_steps", "checkpoint.every_steps", ""},
    {"seed", "run.seed", ""},
    {"max_seq_len", "dataset.max_length", ""},
    {"max_seq_length", "dataset.max_length", ""},
    {"num_workers", "loader.workers", ""},
    {"dataloader_num_workers", "loader.workers", ""},
    {"accelerator", "runtime.device", ""},
    {"min_scale", "dataset.scale", " (torchvision's RandomResizedCrop scale: [min, max])"},
    {"hflip_prob", "dataset.hflip", ""},
    {"horizontal_flip", "dataset.hflip", " (the probability)"},
    {"color_jitter", "dataset.brightness", " (and dataset.contrast, dataset.saturation: ColorJitter's own keys)"},
};

std::string parent_of(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? std::string() : key.substr(0, dot);
}

std::string leaf_of(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

}  // namespace

// "; did you mean 'optim.lr'?": in this order, for a near-miss of the whole key when its section
// is not one (`traning.epochs`); for `known`'s key of that meaning where `key` is another tool's
// name for it (`optim.learning_rate`, `optim.warmup`: Lightning's, Hugging Face's, torchtune's;
// not in a plugin's section); for a near-miss or the one longer form in its own section
// (`training.epoch`, `training.grad_clip`); for the key of that name in another section
// (`eval.shuffle`). Else "; did you mean section [training]?" when only the first component is
// near a section; else "".
std::string did_you_mean(const std::string& key, const std::vector<std::string>& known) {
  const auto mean = [](const std::string& k) { return "; did you mean '" + k + "'?"; };
  const std::string parent = parent_of(key), leaf = leaf_of(key);
  std::vector<std::string> siblings;
  bool parent_known = parent.empty();
  for (const auto& k : known) {
    if (parent_of(k) != parent) continue;
    parent_known = true;
    siblings.push_back(leaf_of(k));
  }
  // A misspelt section: `traning.epochs`, `evl.batch_size`.
  if (!parent_known) {
    if (const std::string full = closest_match(key, known); !full.empty()) return mean(full);
  }
  // Another tool's name for one of trainer's keys: `optim.learning_rate`, `optim.warmup`. (Not in
  // a plugin's section: its keys are its own.)
  if (parent.rfind("plugins.", 0) != 0) {
    for (const KeyAlias& a : kKeyAliases) {
      if (leaf == a.theirs && std::find(known.begin(), known.end(), a.ours) != known.end()) {
        return mean(a.ours) + a.note;
      }
    }
  }
  // A misspelt or shortened key of its own section: `training.epoch`, `training.grad_clip`.
  const std::string prefix = parent.empty() ? std::string() : parent + ".";
  if (const std::string near = closest_match(leaf, siblings); !near.empty()) return mean(prefix + near);
  std::vector<std::string> longer;
  for (const auto& s : siblings) {
    if (leaf.size() >= 3 && s.size() > leaf.size() && s.compare(0, leaf.size(), leaf) == 0) longer.push_back(s);
  }
  if (longer.size() == 1) return mean(prefix + longer.front());
  // The key of that name in another section: `eval.shuffle`.
  std::vector<std::string> elsewhere;
  for (const auto& k : known) {
    if (leaf_of(k) == leaf) elsewhere.push_back(k);
  }
  if (elsewhere.size() == 1) return mean(elsewhere.front());
  if (elsewhere.size() > 1) return "; did you mean one of '" + fmt::format("{}", fmt::join(elsewhere, "', '")) + "'?";
  if (parent_known) return {};
  // Only the section is near one: `trainig.clip`.
  const auto dot = key.find('.');
  if (dot == std::string::npos) return {};
  std::vector<std::string> sections;
  for (const auto& k : known) {
    const auto d = k.find('.');
    if (d != std::string::npos) sections.push_back(k.substr(0, d));
  }
  const std::string head = key.substr(0, dot);
  if (std::find(sections.begin(), sections.end(), head) != sections.end()) return {};
  const std::string sec = closest_match(head, sections);
  return sec.empty() ? std::string() : "; did you mean section [" + sec + "]?";
}

}  // namespace trainer
