// The steps of a trial's life in a study (study.h): its overrides, its memory estimate and
// launch, its reports read as it runs (the pruner, divergence), and how it ended.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>

#include "admission.h"
#include "pruner.h"
#include "study.h"
#include "trainer/config_spec.h"
#include "trainer/core_settings.h"
#include "trainer/error.h"
#include "trainer/interrupt.h"
#include "trainer/json.h"
#include "trainer/plugin.h"
#include "trainer/recipe.h"
#include "trainer/run_records.h"
#include "trial_outcome.h"
#include "trial_process.h"

namespace trainer::tune {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::string Study::lengths_to_probe(const SearchSpace& space) {
  std::set<std::int64_t> values;
  for (const auto& p : space.params()) {
    if (p.key != "dataset.max_length") continue;
    std::vector<const ParamRange*> ranges{&p.range};
    for (const auto& [_, r] : p.cases) ranges.push_back(&r);
    for (const ParamRange* r : ranges) {
      if (p.kind == SearchParam::Kind::Choice) {
        for (const auto& v : r->values) {
          try {
            values.insert(std::stoll(v));
          } catch (const std::exception&) {
            return "";  // not a length: the trial's own config says so when it runs
          }
        }
      } else {
        const auto low = static_cast<std::int64_t>(std::ceil(r->low));
        const auto high = static_cast<std::int64_t>(std::floor(r->high));
        const std::int64_t step = p.kind == SearchParam::Kind::Int ? std::max<std::int64_t>(1, r->step) : 1;
        if (high < low) continue;
        values.insert(low);
        values.insert(low + (high - low) / step * step);
        values.insert(low + (high - low) / step / 2 * step);
      }
    }
  }
  if (values.size() < 3 || *values.begin() < 1) return "";
  const std::vector<std::int64_t> v(values.begin(), values.end());
  return std::to_string(v.front()) + "," + std::to_string(v[v.size() / 2]) + "," + std::to_string(v.back());
}

std::vector<std::string> Study::trial_overrides(const TrialRecord& t) const {
  std::vector<std::string> o = req_.overrides;
  for (const auto& x : t.params.overrides()) o.push_back(x);
  if (s_.budget_epochs > 0) o.push_back("training.epochs=" + std::to_string(s_.budget_epochs));
  if (s_.budget_steps > 0) o.push_back("training.max_steps=" + std::to_string(s_.budget_steps));
  // A trial stopped by its step budget in the middle of an epoch is evaluated all the same:
  // the objective is the model it ends with.
  o.push_back("eval.at_end=true");
  if (!mlflow_.id.empty()) {
    // Quoted: a run id of hex digits could read as a TOML number.
    o.push_back("plugins.mlflow.parent_run_id=\"" + mlflow_.id + "\"");
    o.push_back("plugins.mlflow.run_name=\"" + study_name_ + "-" + trial_name(t.number) + "\"");
  }
  return o;
}

void Study::begin(TrialRecord& t) {
  t.run_dir = req_.study_dir + "/trials/" + trial_name(t.number);
  std::error_code ec;
  fs::remove_all(t.run_dir, ec);  // a trial begun before a crash starts over
  const auto overrides = trial_overrides(t);
  TrialShape shape;
  std::string memory;       // what the trial's memory estimate depends on
  std::int64_t length = 0;  // the trial's dataset.max_length, with a length axis
  try {
    const PreparedRun p = prepare_run(req_.recipe, overrides, req_.plugin_dirs);
    std::vector<std::string> keyed = overrides;
    if (!probe_lengths_.empty()) {
      // One estimate over the lengths: the trial's own is where it is predicted.
      length = p.config.get<std::int64_t>("dataset.max_length");
      keyed.erase(std::remove_if(keyed.begin(), keyed.end(),
                                 [](const std::string& o) { return o.rfind("dataset.max_length=", 0) == 0; }),
                  keyed.end());
    }
    memory = memory_key(keyed, p);
    const auto ts = TrainingSettings::from(p.config.sub("training"));
    shape.batch = ts.batch_size;
    shape.micro = ts.micro_batch();
    const auto es = EvalSettings::from(p.config.sub("eval"));
    shape.eval_batch = es.evaluates() ? es.batch_size : 0;
    shape.eval_limit_batches = es.limit_batches;
    // With oom_backoff the recipe lets the micro-batch change (gradient accumulation keeps
    // the effective batch): down to its min_micro_batch (the resolved config has its default).
    if (std::any_of(p.plugins.begin(), p.plugins.end(), [](const auto& x) { return x->name() == "oom_backoff"; })) {
      shape.backoff_floor = p.config.get<std::int64_t>("plugins.oom_backoff.min_micro_batch");
    }
  } catch (const Error& e) {
    return end(t, TrialState::Failed, std::string("config: ") + e.what());
  }
  Admission admit;
  if (s_.estimate) {
    if (const MemoryEstimate* e = estimate_for(t, overrides, memory, shape.micro, length)) {
      if (length > 0 && e->length > 0) {
        MemoryEstimate at = *e;
        at.length = length;
        admit = admit_trial(at, shape);
      } else {
        admit = admit_trial(*e, shape);
      }
    }
  }
  if (interrupt_requested()) return;  // stays RUNNING: a resumed study begins it again
  t.predicted_peak = admit.predicted_peak;
  if (!admit.run) return end(t, TrialState::Skipped, admit.reason);
  t.reason = admit.reason;
  Running r;
  r.rec = t;
  r.start = std::chrono::steady_clock::now();
  std::vector<std::string> args{req_.trainer_exe, "--recipe", req_.recipe};
  args.insert(args.end(), overrides.begin(), overrides.end());
  args.insert(args.end(), admit.overrides.begin(), admit.overrides.end());
  for (const auto& d : req_.plugin_dirs) args.insert(args.end(), {"--plugin-dir", d});
  args.insert(args.end(), {"--run-dir", t.run_dir, "--log-level", "warn"});
  fs::create_directories(t.run_dir);
  r.pid = spawn(args, t.run_dir + ".out", t.run_dir + ".out");
  progress_ << trial_name(t.number) << ": running";
  for (const auto& [k, v] : t.params.values) progress_ << " " << k << "=" << v;
  if (!t.reason.empty()) progress_ << " (" << t.reason << ")";
  progress_ << "\n";
  running_.push_back(std::move(r));
}

const MemoryEstimate* Study::estimate_for(const TrialRecord& t, const std::vector<std::string>& overrides,
                                          const std::string& key, std::int64_t micro, std::int64_t length) {
  if (failed_estimates_.count(key)) return nullptr;
  auto it = estimates_.find(key);
  if (it != estimates_.end()) {
    // Over lengths, in tokens: the probes at the shorter lengths have larger micro-batches.
    const auto tokens = [](std::int64_t m, std::int64_t len) { return m * std::max<std::int64_t>(1, len); };
    std::int64_t probed = 0;
    for (const auto& p : it->second.probes) probed = std::max(probed, tokens(p.micro_batch, p.length));
    if (tokens(micro, it->second.length > 0 ? length : 0) <= 4 * probed) return &it->second;
  }
  std::vector<std::string> args{req_.trainer_exe, "estimate", "--json", "--recipe", req_.recipe};
  args.insert(args.end(), overrides.begin(), overrides.end());
  for (const auto& d : req_.plugin_dirs) args.insert(args.end(), {"--plugin-dir", d});
  args.push_back("--margin=" + std::to_string(s_.margin));
  if (!probe_lengths_.empty()) args.push_back("--lengths=" + probe_lengths_);
  const std::string base = req_.study_dir + "/trials/" + trial_name(t.number) + ".estimate";
  // The running trials' reports are read meanwhile: pruning and divergence do not wait.
  const int rc = wait_forwarding_interrupt(spawn(args, base + ".json", base + ".err"), [this] {
    for (auto& r : running_) read_reports(r);
  });
  if (interrupt_requested()) return nullptr;
  std::string why;
  if (rc != 0) {
    why = "estimate failed (exit " + std::to_string(rc) + "): " + last_lines(base + ".err", 2);
  } else {
    try {
      MemoryEstimate e = estimate_from_json(read_text(base + ".json"));
      if (it != estimates_.end()) {
        it->second = std::move(e);
      } else {
        it = estimates_.emplace(key, std::move(e)).first;
      }
      return &it->second;
    } catch (const Error& e) {
      why = e.what();
    }
  }
  // Not knowing is not a reason to skip: the trial runs and shows what happens.
  progress_ << trial_name(t.number) << ": " << why << "; trials of this config run unestimated\n";
  failed_estimates_.insert(key);
  return nullptr;
}

void Study::stop_running() {
  std::vector<bool> stopped_here;
  for (auto& r : running_) {
    if (const auto rc = poll_exit(r.pid)) {
      r.exit_code = rc;
    } else if (r.prune_reason.empty() && r.diverged.empty()) {
      ::kill(r.pid, SIGINT);
      stopped_here.push_back(true);
      continue;
    }
    stopped_here.push_back(false);
  }
  for (std::size_t i = 0; i < running_.size(); ++i) {
    Running& r = running_[i];
    if (!r.exit_code) r.exit_code = wait_exit(r.pid);
    // 0: it finished before the SIGINT reached it (an interrupted trainer exits 130).
    if (stopped_here[i] && *r.exit_code != 0) continue;
    read_reports(r);
    r.rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count();
    classify(r, *r.exit_code);
  }
  running_.clear();
}

void Study::poll() {
  for (auto it = running_.begin(); it != running_.end();) {
    Running& r = *it;
    read_reports(r);
    r.exit_code = poll_exit(r.pid);
    if (!r.exit_code) {
      ++it;
      continue;
    }
    read_reports(r);
    r.rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count();
    classify(r, *r.exit_code);
    it = running_.erase(it);
  }
}

void Study::read_reports(Running& r) {
  std::ifstream in(r.rec.run_dir + "/metrics.jsonl");
  if (!in) return;
  in.seekg(r.metrics_offset);
  std::string line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // a line still being written
    r.metrics_offset = in.tellg();
    const auto m = decode_metric(line);
    if (!m || m->name != s_.objective || !r.diverged.empty()) continue;
    const double v = m->value;
    if (!std::isfinite(v)) {
      // Diverged: no later report can mean anything. The trial stops, as Optuna fails a
      // trial whose objective is not a number.
      r.diverged = s_.objective + " is " + json_nonfinite_name(v) + " at report " +
                   std::to_string(r.rec.intermediate.size() + 1) + " (diverged)";
      if (!r.exit_code) ::kill(r.pid, SIGINT);
      progress_ << trial_name(r.rec.number) << ": stopping (" << r.diverged << ")\n";
      continue;
    }
    r.rec.intermediate.push_back(v);
    trials_[r.rec.number].intermediate = r.rec.intermediate;
    journal_.append(report_record(r.rec.number, v));
    if (r.prune_reason.empty()) {
      const std::string why = prune_reason(s_, r.rec, trials_);
      if (!why.empty()) {
        r.prune_reason = why;
        r.pruned_at = r.rec.intermediate.size() - 1;
        if (!r.exit_code) ::kill(r.pid, SIGINT);  // it stops at its next safe point
        progress_ << trial_name(r.rec.number) << ": pruning (" << why << ")\n";
      }
    }
  }
}

void Study::classify(Running& r, int rc) {
  TrialRecord& t = r.rec;
  // A trial that died before writing status.json (or wrote a damaged one) has no failure
  // kind: it is FAILED with the last lines of its output.
  std::optional<RunStatusRecord> status;
  try {
    status = decode_status(read_text(t.run_dir + "/status.json"));
  } catch (const std::exception&) {
  }
  const std::string message = status ? status->message : "";
  if (!t.intermediate.empty()) t.value = t.intermediate.back();
  if (!r.diverged.empty()) {
    t.diverged = true;
    t.value.reset();
    return end(t, TrialState::Failed, r.diverged);
  }
  if (!r.prune_reason.empty() && (rc == 130 || rc == 0)) {
    // Its value is the one it was judged by (it may log more before it stops).
    t.value = t.intermediate[r.pruned_at];
    return end(t, TrialState::Pruned, r.prune_reason);
  }
  if (rc == 0) {
    if (!t.value) {
      return end(t, TrialState::Failed,
                 "the objective metric '" + s_.objective + "' was never logged (see " + t.run_dir +
                     "/metrics.jsonl for the names)");
    }
    return end(t, TrialState::Complete, "");
  }
  if (status && status->failure == FailureKind::Diverged) {
    // Its loss or gradient went NaN before an objective could say so (training.on_nonfinite).
    t.diverged = true;
    t.value.reset();
    return end(t, TrialState::Failed, message + " (diverged)");
  }
  if (status && status->failure == FailureKind::OutOfMemory) {
    t.out_of_memory = true;
    t.oom = oom_details(t.run_dir, *status);
    return end(t, TrialState::Pruned, message);
  }
  end(t, TrialState::Failed,
      "exit " + std::to_string(rc) + ": " + (message.empty() ? last_lines(t.run_dir + ".out", 3) : message));
}

void Study::end(TrialRecord& t, TrialState state, const std::string& reason) {
  t.state = state;
  t.reason = t.reason.empty() || reason.empty() ? t.reason + reason : t.reason + "; " + reason;
  journal_.append(end_record(t));
  trials_[t.number] = t;
  progress_ << trial_name(t.number) << ": " << state;
  if (t.value) progress_ << ", " << s_.objective << " " << *t.value;
  if (!t.reason.empty()) progress_ << " (" << t.reason << ")";
  progress_ << "\n";
}

}  // namespace trainer::tune
