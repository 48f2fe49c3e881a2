// Which checkpoints a run keeps: the newest checkpoint.keep_last, and with checkpoint.monitor
// the save_top_k best by the evaluation's metric (each scored in `<file>.score`), `best`
// naming the best of them.
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "train/checkpoint.h"
#include "train/checkpoint_files.h"
#include "train/evaluate.h"
#include "trainer/error.h"

namespace fs = std::filesystem;

namespace trainer {

void Checkpointer::check_monitor() const {
  const auto& last = evaluator_.last();
  if (settings_.monitor.empty() || last.step < 0 || last.metrics.count(settings_.monitor)) return;
  std::vector<std::string> names;
  for (const auto& kv : last.metrics) names.push_back(kv.first);
  throw UsageError(fmt::format("checkpoint.monitor = '{}' is not among the evaluation's metrics ({})",
                               settings_.monitor, fmt::join(names, ", ")));
}

std::optional<double> Checkpointer::score_now() const {
  if (settings_.monitor.empty()) return std::nullopt;
  const auto& last = evaluator_.last();
  if (last.step != state_.global_step) return std::nullopt;
  const auto it = last.metrics.find(settings_.monitor);
  // Not there (check_monitor() failed the run at the evaluation), or NaN/infinite: never the best.
  if (it == last.metrics.end() || !std::isfinite(it->second)) return std::nullopt;
  return it->second;
}

void Checkpointer::prune() {
  std::set<std::string> keep;
  const bool monitored = !settings_.monitor.empty();
  // The newest: keep_last of them (one at least, which `latest` names, for a resume).
  const std::int64_t newest = !monitored || settings_.save_last ? settings_.keep_last : 1;
  for (auto it = files_.rbegin(); it != files_.rend() && static_cast<std::int64_t>(keep.size()) < newest; ++it) {
    keep.insert(*it);
  }
  const std::vector<std::string> best = ranked();
  for (std::size_t i = 0; i < best.size() && static_cast<std::int64_t>(i) < settings_.save_top_k; ++i) {
    keep.insert(best[i]);
  }
  for (auto it = files_.begin(); it != files_.end();) {
    if (keep.count(*it)) {
      ++it;
      continue;
    }
    remove_checkpoint(*it);
    scores_.erase(*it);
    it = files_.erase(it);
  }
  point_at_best(best);
}

std::vector<std::string> Checkpointer::ranked() const {
  std::vector<std::pair<double, std::string>> scored;
  for (const auto& f : files_) {
    if (const auto it = scores_.find(f); it != scores_.end()) scored.emplace_back(it->second, f);
  }
  // Better first; of equal scores, the older (stable).
  const bool max = settings_.mode == "max";
  std::stable_sort(scored.begin(), scored.end(),
                   [max](const auto& a, const auto& b) { return max ? a.first > b.first : a.first < b.first; });
  std::vector<std::string> out;
  for (auto& [score, file] : scored) out.push_back(std::move(file));
  return out;
}

void Checkpointer::point_at_best(const std::vector<std::string>& ranked) {
  if (ranked.empty()) {
    // No scored checkpoint kept: no `best` left naming one that is gone (pruned or moved aside).
    std::error_code ec;
    fs::remove(fs::path(dir_) / "best", ec);
    best_.clear();
    return;
  }
  if (ranked.front() == best_) return;
  best_ = ranked.front();
  point_best(dir_, fs::path(best_).filename().string());
  log_.info("best checkpoint by {} ({}): {} ({:.6g})", settings_.monitor, settings_.mode, best_, scores_.at(best_));
}

}  // namespace trainer
