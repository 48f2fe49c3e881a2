#include "sweep.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "estimate.h"
#include "mlflow_client.h"
#include "sampler.h"
#include "trainer/config_spec.h"
#include "trainer/core_settings.h"
#include "trainer/error.h"
#include "trainer/interrupt.h"
#include "trainer/memory.h"
#include "trainer/plugin.h"
#include "trainer/recipe.h"

namespace trainer::tune {
namespace fs = std::filesystem;
using json = nlohmann::json;

void SweepSettings::declare(SettingsSchema<SweepSettings>& s) {
  s.add(&SweepSettings::n_trials, "n_trials", "Trials to run (skipped ones count); 0 = the grid's size, or 20").min(0);
  s.add(&SweepSettings::sampler, "sampler", "How points are picked").choices({"tpe", "random", "grid"});
  s.add(&SweepSettings::seed, "seed", "Seed of the sampler; default run.seed").min(0);
  s.add(&SweepSettings::objective, "objective", "The metric a trial is judged by: its last logged value");
  s.add(&SweepSettings::direction, "direction", "Whether a larger objective is better")
      .choices({"maximize", "minimize"});
  s.add(&SweepSettings::budget_epochs, "budget_epochs", "training.epochs of every trial; 0 = the recipe's").min(0);
  s.add(&SweepSettings::budget_steps, "budget_steps", "training.max_steps of every trial; 0 = no cap").min(0);
  s.add(&SweepSettings::pruner, "pruner", "Stops trials whose intermediate objective is poor")
      .choices({"median", "successive_halving", "none"});
  s.add(&SweepSettings::pruner_warmup, "pruner_warmup", "median: reports a trial makes before it can be pruned").min(1);
  s.add(&SweepSettings::pruner_min_trials, "pruner_min_trials",
        "median: completed trials with a report at that point before any is pruned")
      .min(1);
  s.add(&SweepSettings::reduction_factor, "reduction_factor",
        "successive_halving: 1 in this many trials goes on at each rung")
      .min(2);
  s.add(&SweepSettings::min_resource, "min_resource", "successive_halving: reports at the first rung").min(1);
  s.add(&SweepSettings::tpe_startup, "tpe_startup", "tpe: random trials before the model is used").min(1);
  s.add(&SweepSettings::parallel, "parallel",
        "Trials running at once, as processes (with device_select's leases, one per GPU)")
      .min(1);
  s.add(&SweepSettings::estimate, "estimate", "Predict each trial's memory and skip those that cannot fit");
  s.add(&SweepSettings::margin, "margin", "Fraction of the limit kept free by the prediction").min(0).max(1, false);
  s.add(&SweepSettings::dir, "dir", "Study directory; empty = <run.dir>/<run.name>-sweep");
}

std::int64_t StudyResult::count(const std::string& state) const {
  return std::count_if(trials.begin(), trials.end(), [&](const TrialRecord& t) { return t.state == state; });
}

std::int64_t StudyResult::out_of_memory() const {
  return std::count_if(trials.begin(), trials.end(), [](const TrialRecord& t) { return t.out_of_memory; });
}

std::pair<SweepSettings, SearchSpace> load_sweep(const std::string& recipe, const std::vector<std::string>& overrides) {
  const LoadedRecipe loaded = load_recipe(recipe, overrides);
  TRAINER_CHECK_T(UsageError, loaded.config.is_table("sweep"), recipe,
                  ": no [sweep] section; trainer sweep needs one (docs/sweeps.md)");
  Config c = loaded.config.clone();
  for (const auto& k : c.keys()) {
    if (k != "sweep") c.erase(k);
  }
  auto problems = validate_config(c, {SectionSpec{"sweep", SweepSettings::keys(), "The study"}}, {"sweep.space"});
  SweepSettings s;
  std::optional<SearchSpace> space;
  try {
    space = SearchSpace::from_config(c.sub("sweep.space"), "sweep.space");
  } catch (const ConfigError& e) {
    problems.insert(problems.end(), e.problems().begin(), e.problems().end());
  }
  if (!problems.empty()) throw ConfigError(problems);
  s = SweepSettings::from(c.sub("sweep"));
  if (s.sampler == "grid") {
    TRAINER_CHECK_T(UsageError, space->grid_size() > 0, c.origin("sweep.sampler"),
                    ": sweep.sampler = \"grid\" needs every parameter to be a choice or an int range");
  }
  if (s.n_trials == 0) s.n_trials = s.sampler == "grid" ? space->grid_size() : 20;
  return {s, *space};
}

namespace {

constexpr std::int64_t kMiB = 1024 * 1024;

std::string trial_name(std::int64_t n) {
  std::ostringstream s;
  s << "trial-" << std::setw(4) << std::setfill('0') << n;
  return s.str();
}

/// Appends one JSON line and makes it durable: a study killed at any moment keeps every
/// line it wrote whole (a line cut short by the kill is skipped when read).
class Journal {
 public:
  explicit Journal(std::string path) : path_(std::move(path)) {}
  void append(const json& record) const {
    const std::string line = record.dump() + "\n";
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    TRAINER_CHECK(fd >= 0, "cannot open the study journal ", path_);
    const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) && ::fsync(fd) == 0;
    ::close(fd);
    TRAINER_CHECK(ok, "cannot write the study journal ", path_);
  }
  std::vector<json> read() const {
    std::vector<json> out;
    std::ifstream in(path_);
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      try {
        out.push_back(json::parse(line));
      } catch (const json::exception&) {
        // A line cut short by a kill: it and whatever it began are not recorded.
      }
    }
    return out;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

json params_json(const Assignment& a) {
  json p = json::object(), x = json::object();
  for (const auto& [k, v] : a.values) p[k] = v;
  for (const auto& [k, v] : a.internal) x[k] = v;
  return json{{"params", p}, {"internal", x}};
}

Assignment params_from(const json& j, const SearchSpace& space) {
  Assignment a;
  for (const auto& prm : space.params()) {
    if (!j["params"].contains(prm.key)) continue;
    a.values.emplace_back(prm.key, j["params"][prm.key].get<std::string>());
    a.internal[prm.key] = j["internal"][prm.key].get<double>();
  }
  return a;
}

/// Starts `args` with stdout and stderr to `log`; the child gets SIGTERM when this process
/// dies (a killed study leaves no trial running on its own).
pid_t spawn(const std::vector<std::string>& args, const std::string& out, const std::string& err) {
  const pid_t pid = ::fork();
  TRAINER_CHECK(pid >= 0, "fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    // Its own process group: Ctrl-C in the terminal reaches the study, which forwards one
    // SIGINT (a trainer takes a second one as "kill now").
    ::setpgid(0, 0);
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = err == out ? o : ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o >= 0) ::dup2(o, 1);
    if (e >= 0) ::dup2(e, 2);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string last_lines(const std::string& path, std::size_t n) {
  std::vector<std::string> lines;
  std::istringstream in(read_text(path));
  for (std::string l; std::getline(in, l);) {
    if (!l.empty()) lines.push_back(l);
  }
  std::string out;
  for (std::size_t i = lines.size() > n ? lines.size() - n : 0; i < lines.size(); ++i)
    out += (out.empty() ? "" : " | ") + lines[i];
  return out;
}

/// What the trial's own run directory says about an out-of-memory failure.
std::map<std::string, std::string> oom_details(const std::string& run_dir, const std::string& message) {
  std::map<std::string, std::string> d;
  std::smatch m;
  if (std::regex_search(message, m, std::regex("out of memory in ([a-z_]+) on"))) d["phase"] = m[1];
  if (std::regex_search(message, m, std::regex("with micro-batches ([0-9 >-]+)"))) {
    std::string list = m[1];
    const auto last = list.find_last_of("0123456789");
    const auto first = list.find_last_not_of("0123456789", last);
    d["micro_batch_size"] = list.substr(first == std::string::npos ? 0 : first + 1,
                                        last - (first == std::string::npos ? 0 : first + 1) + 1);
  }
  try {
    const Config c = Config::parse_file(run_dir + "/config.toml");
    if (c.has("model.name")) d["model"] = c.get<std::string>("model.name");
    if (c.has("dataset.name")) d["dataset"] = c.get<std::string>("dataset.name");
    const auto t = TrainingSettings::from(c.sub("training"));
    d["batch_size"] = std::to_string(t.batch_size);  // the effective batch: samples per optimizer step
    if (!d.count("micro_batch_size")) d["micro_batch_size"] = std::to_string(t.micro_batch());
    for (const char* k : {"dataset.image_size", "dataset.resize", "dataset.crop_size", "model.image_size",
                          "model.seq_len", "model.sequence_length"}) {
      if (c.has(k) && !c.is_table(k)) d[k] = config_value_to_toml(c.value(k));
    }
  } catch (const std::exception&) {
    // The run may have died before writing config.toml; the message is all there is.
  }
  return d;
}

struct Running {
  TrialRecord rec;
  pid_t pid = -1;
  std::chrono::steady_clock::time_point start;
  std::streamoff metrics_offset = 0;
  std::string prune_reason;   ///< set when the pruner stopped it
  std::size_t pruned_at = 0;  ///< the report it was pruned at
};

/// The study's state and the steps of a trial's life.
class Study {
 public:
  Study(const SweepRequest& req, SweepSettings s, SearchSpace space, std::ostream& progress)
      : req_(req),
        s_(std::move(s)),
        space_(std::move(space)),
        progress_(progress),
        journal_(req.study_dir + "/study.jsonl") {}

  StudyResult run() {
    fs::create_directories(req_.study_dir + "/trials");
    resume();
    start_mlflow();
    sampler_ = s_.sampler == "tpe" ? tpe_sampler(TpeSettings{s_.tpe_startup}) : make_sampler(s_.sampler);
    std::vector<std::int64_t> todo;  // trials begun before a crash, then new ones
    for (const auto& [n, t] : trials_) {
      if (t.state == "RUNNING") todo.push_back(n);
    }
    std::int64_t next = trials_.empty() ? 0 : trials_.rbegin()->first + 1;
    while (!interrupt_requested()) {
      while (static_cast<std::int64_t>(running_.size()) < s_.parallel && !interrupt_requested()) {
        std::int64_t n;
        if (!todo.empty()) {
          n = todo.front();
          todo.erase(todo.begin());
        } else if (next < s_.n_trials) {
          n = next++;
          trials_[n] = TrialRecord{};
          trials_[n].number = n;
          trials_[n].state = "RUNNING";
          trials_[n].params = propose(n);
          json rec{{"event", "trial"}, {"number", n}};
          rec.update(params_json(trials_[n].params));
          journal_.append(rec);
        } else {
          break;
        }
        begin(trials_[n]);
      }
      if (running_.empty()) break;
      poll();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    if (interrupt_requested()) {
      // Ctrl-C: the trials got it too (same process group) or get it now; they stop at a safe
      // point. Nothing is recorded for them: a resumed study runs them again.
      for (auto& r : running_) ::kill(r.pid, SIGINT);
      for (auto& r : running_) wait_exit(r.pid);
      running_.clear();
    }
    StudyResult out;
    out.study_dir = req_.study_dir;
    out.interrupted = interrupt_requested();
    for (auto& [n, t] : trials_) out.trials.push_back(t);
    for (std::size_t i = 0; i < out.trials.size(); ++i) {
      const auto& t = out.trials[i];
      if (t.state != "COMPLETE" || !t.value) continue;
      if (!out.best || better(*t.value, *out.trials[*out.best].value)) out.best = static_cast<std::int64_t>(i);
    }
    write_csv(out);
    finish_mlflow(out);
    out.mlflow_run_id = mlflow_run_;
    return out;
  }

 private:
  bool better(double a, double b) const { return s_.direction == "maximize" ? a > b : a < b; }
  double loss_of(double v) const { return s_.direction == "maximize" ? -v : v; }

  /// The finished trials as the sampler sees them: skipped and out-of-memory trials as the
  /// worst, so that it learns to avoid what does not fit.
  std::vector<Observation> history() const {
    std::vector<Observation> h;
    for (const auto& [n, t] : trials_) {
      if (t.state == "COMPLETE" && t.value) {
        h.push_back({t.params.internal, loss_of(*t.value)});
      } else if (t.state == "SKIPPED" || (t.state == "PRUNED" && t.out_of_memory)) {
        h.push_back({t.params.internal, 1e300});
      } else if (t.state == "PRUNED" && !t.intermediate.empty()) {
        h.push_back({t.params.internal, loss_of(t.intermediate.back())});
      }
    }
    return h;
  }

  Assignment propose(std::int64_t n) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed_) * 1000003ULL + static_cast<std::uint64_t>(n));
    return sampler_->sample(space_, n, history(), rng);
  }

  std::vector<std::string> trial_overrides(const TrialRecord& t) const {
    std::vector<std::string> o = req_.overrides;
    for (const auto& x : t.params.overrides()) o.push_back(x);
    if (s_.budget_epochs > 0) o.push_back("training.epochs=" + std::to_string(s_.budget_epochs));
    if (s_.budget_steps > 0) o.push_back("training.max_steps=" + std::to_string(s_.budget_steps));
    if (!mlflow_run_.empty()) {
      // Quoted: a run id of hex digits could read as a TOML number.
      o.push_back("plugins.mlflow.parent_run_id=\"" + mlflow_run_ + "\"");
      o.push_back("plugins.mlflow.run_name=\"" + study_name_ + "-" + trial_name(t.number) + "\"");
    }
    return o;
  }

  /// Checks the trial's config, predicts its memory; launches it unless that says no.
  void begin(TrialRecord& t) {
    t.run_dir = req_.study_dir + "/trials/" + trial_name(t.number);
    std::error_code ec;
    fs::remove_all(t.run_dir, ec);  // a trial begun before a crash starts over
    const auto overrides = trial_overrides(t);
    std::int64_t batch = 0, micro = 0, backoff_floor = 0;
    try {
      const PreparedRun p = prepare_run(req_.recipe, overrides, req_.plugin_dirs);
      const auto ts = TrainingSettings::from(p.config.sub("training"));
      batch = ts.batch_size;
      micro = ts.micro_batch();
      // With oom_backoff the recipe lets the micro-batch change (gradient accumulation keeps
      // the effective batch): down to its min_micro_batch.
      if (std::any_of(p.plugins.begin(), p.plugins.end(), [](const auto& x) { return x->name() == "oom_backoff"; })) {
        backoff_floor = p.config.get_or<std::int64_t>("plugins.oom_backoff.min_micro_batch", 1);
      }
    } catch (const Error& e) {
      return end(t, "FAILED", std::string("config: ") + e.what());
    }
    std::vector<std::string> extra;
    if (s_.estimate) {
      std::string why;
      if (!fits(t, overrides, batch, micro, &why)) {
        // The largest micro-batch predicted to fit at this batch, if oom_backoff could reach it:
        // start there instead of failing into it.
        const MemoryEstimate* e = estimate_for(overrides);
        std::int64_t m = 0;
        if (e && e->peak > 0 && backoff_floor > 0) {
          for (std::int64_t k = micro - 1; k >= backoff_floor && m == 0; --k) {
            if (e->fits_at(batch, k)) m = k;
          }
        }
        if (m == 0 || m < backoff_floor) return end(t, "SKIPPED", why);
        extra.push_back("training.micro_batch_size=" + std::to_string(m));
        t.predicted_peak = e->predict(batch, m);
        t.reason = "micro-batch " + std::to_string(micro) + " -> " + std::to_string(m) + " (" +
                   why.substr(why.find(':') + 2) + ")";
      }
    }
    Running r;
    r.rec = t;
    r.start = std::chrono::steady_clock::now();
    std::vector<std::string> args{req_.trainer_exe, "--recipe", req_.recipe};
    args.insert(args.end(), overrides.begin(), overrides.end());
    args.insert(args.end(), extra.begin(), extra.end());
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

  /// `trainer estimate --json` in its own process (probe steps leave nothing in this one);
  /// trials that differ only in their batch sizes share its fit.
  static std::string estimate_key(const std::vector<std::string>& overrides) { return memory_key(overrides); }

  const MemoryEstimate* estimate_for(const std::vector<std::string>& overrides) const {
    const auto it = estimates_.find(estimate_key(overrides));
    return it == estimates_.end() ? nullptr : &it->second;
  }

  bool fits(TrialRecord& t, const std::vector<std::string>& overrides, std::int64_t batch, std::int64_t micro,
            std::string* why) {
    const std::string key = estimate_key(overrides);
    auto it = estimates_.find(key);
    if (it == estimates_.end()) {
      std::vector<std::string> args{req_.trainer_exe, "estimate", "--json", "--recipe", req_.recipe};
      args.insert(args.end(), overrides.begin(), overrides.end());
      for (const auto& d : req_.plugin_dirs) args.insert(args.end(), {"--plugin-dir", d});
      args.push_back("--margin=" + std::to_string(s_.margin));
      const std::string base = req_.study_dir + "/trials/" + trial_name(t.number) + ".estimate";
      const int rc = wait_exit(spawn(args, base + ".json", base + ".err"));
      if (rc != 0) {
        *why = "estimate failed (exit " + std::to_string(rc) + "): " + last_lines(base + ".err", 2);
        // Not knowing is not a reason to skip: the trial runs and shows what happens.
        progress_ << trial_name(t.number) << ": " << *why << "\n";
        return true;
      }
      json j;
      try {
        j = json::parse(read_text(base + ".json"));
      } catch (const json::exception& e) {
        progress_ << trial_name(t.number) << ": unreadable estimate: " << e.what() << "\n";
        return true;
      }
      MemoryEstimate e;
      e.device = j.value("device", "");
      e.a = j["fit"]["a"], e.b = j["fit"]["b"], e.c = j["fit"]["c"], e.a2 = j["fit"]["a2"], e.c2 = j["fit"]["c2"];
      e.slack0 = j["fit"]["slack0"], e.slack1 = j["fit"]["slack1"];
      e.peak = j["peak_bytes"];
      e.limit = j["limit_bytes"];
      e.limit_source = j["limit_source"];
      e.limit_on_reserved = j["limit_on_reserved"];
      e.margin = j["margin"];
      it = estimates_.emplace(key, e).first;
    }
    const MemoryEstimate& e = it->second;
    if (e.peak == 0) {
      *why = "predicted out of memory: the probes ran out of memory at small micro-batches";
      return false;
    }
    t.predicted_peak = e.predict(batch, micro);
    if (e.fits_at(batch, micro)) return true;
    std::ostringstream s;
    s << "predicted out of memory: "
      << format_bytes(e.limit_on_reserved ? e.predict_reserved(batch, micro) : t.predicted_peak) << " at batch "
      << batch << ", micro-batch " << micro << " > "
      << format_bytes(static_cast<std::int64_t>(double(e.limit) * (1.0 - e.margin))) << " usable (" << e.limit_source
      << ")";
    *why = s.str();
    return false;
  }

  /// New objective values of the running trials, the pruner, and the trials that ended.
  void poll() {
    for (auto it = running_.begin(); it != running_.end();) {
      Running& r = *it;
      read_reports(r);
      int status = 0;
      const pid_t w = ::waitpid(r.pid, &status, WNOHANG);
      if (w != r.pid) {
        ++it;
        continue;
      }
      read_reports(r);
      const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      r.rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count();
      classify(r, rc);
      it = running_.erase(it);
    }
  }

  void read_reports(Running& r) {
    std::ifstream in(r.rec.run_dir + "/metrics.jsonl");
    if (!in) return;
    in.seekg(r.metrics_offset);
    std::string line;
    while (std::getline(in, line)) {
      if (in.eof()) break;  // a line still being written
      r.metrics_offset = in.tellg();
      json j;
      try {
        j = json::parse(line);
      } catch (const json::exception&) {
        continue;
      }
      if (j.value("name", "") != s_.objective || !j["value"].is_number()) continue;
      const double v = j["value"];
      r.rec.intermediate.push_back(v);
      trials_[r.rec.number].intermediate = r.rec.intermediate;
      journal_.append(json{{"event", "report"}, {"number", r.rec.number}, {"value", v}});
      if (r.prune_reason.empty()) {
        const std::string why = prune_reason(r.rec);
        if (!why.empty()) {
          r.prune_reason = why;
          r.pruned_at = r.rec.intermediate.size() - 1;
          ::kill(r.pid, SIGINT);  // it stops at its next safe point
          progress_ << trial_name(r.rec.number) << ": pruning (" << why << ")\n";
        }
      }
    }
  }

  /// Why the pruner stops trial `t` after its latest report ("" = it goes on).
  std::string prune_reason(const TrialRecord& t) const {
    const std::size_t k = t.intermediate.size() - 1;
    const double mine = loss_of(t.intermediate[k]);
    std::vector<double> others;
    if (s_.pruner == "median") {
      if (static_cast<std::int64_t>(k + 1) < s_.pruner_warmup) return {};
      for (const auto& [n, o] : trials_) {
        if (n != t.number && o.state == "COMPLETE" && o.intermediate.size() > k)
          others.push_back(loss_of(o.intermediate[k]));
      }
      if (static_cast<std::int64_t>(others.size()) < s_.pruner_min_trials) return {};
      std::sort(others.begin(), others.end());
      const std::size_t m = others.size();
      const double median = m % 2 ? others[m / 2] : 0.5 * (others[m / 2 - 1] + others[m / 2]);
      if (mine <= median) return {};
      std::ostringstream s;
      s << "median: " << s_.objective << " " << t.intermediate[k] << " at report " << (k + 1)
        << " is worse than the median " << (s_.direction == "maximize" ? -median : median) << " of " << m
        << " completed trials";
      return s.str();
    }
    if (s_.pruner == "successive_halving") {
      // Rungs at min_resource * eta^i reports; at a rung, a trial goes on only within the best
      // 1/eta of every trial that reached it.
      std::int64_t rung_reports = s_.min_resource;
      while (rung_reports < static_cast<std::int64_t>(k + 1)) rung_reports *= s_.reduction_factor;
      if (rung_reports != static_cast<std::int64_t>(k + 1)) return {};
      others.push_back(mine);
      for (const auto& [n, o] : trials_) {
        if (n != t.number && o.intermediate.size() > k) others.push_back(loss_of(o.intermediate[k]));
      }
      std::sort(others.begin(), others.end());
      const auto keep = std::max<std::size_t>(1, others.size() / static_cast<std::size_t>(s_.reduction_factor));
      if (mine <= others[keep - 1]) return {};
      std::ostringstream s;
      s << "successive halving: " << s_.objective << " " << t.intermediate[k] << " at report " << (k + 1)
        << " is not in the best " << keep << " of " << others.size() << " trials at that rung";
      return s.str();
    }
    return {};
  }

  void classify(Running& r, int rc) {
    TrialRecord& t = r.rec;
    json status;
    try {
      status = json::parse(read_text(t.run_dir + "/status.json"));
    } catch (const json::exception&) {
    }
    const std::string message = status.is_object() ? status.value("message", "") : "";
    if (!t.intermediate.empty()) t.value = t.intermediate.back();
    if (!r.prune_reason.empty() && (rc == 130 || rc == 0)) {
      // Its value is the one it was judged by (it may log more before it stops).
      t.value = t.intermediate[r.pruned_at];
      return end(t, "PRUNED", r.prune_reason);
    }
    if (rc == 0) {
      if (!t.value) {
        return end(t, "FAILED",
                   "the objective metric '" + s_.objective + "' was never logged (see " + t.run_dir +
                       "/metrics.jsonl for the names)");
      }
      return end(t, "COMPLETE", "");
    }
    if (message.find("out of memory") != std::string::npos) {
      t.out_of_memory = true;
      t.oom = oom_details(t.run_dir, message);
      return end(t, "PRUNED", message);
    }
    end(t, "FAILED",
        "exit " + std::to_string(rc) + ": " + (message.empty() ? last_lines(t.run_dir + ".out", 3) : message));
  }

  void end(TrialRecord& t, const std::string& state, const std::string& reason) {
    t.state = state;
    t.reason = t.reason.empty() || reason.empty() ? t.reason + reason : t.reason + "; " + reason;
    json oom = json::object();
    for (const auto& [k, v] : t.oom) oom[k] = v;
    json rec{{"event", "end"},       {"number", t.number},
             {"state", state},       {"reason", reason},
             {"seconds", t.seconds}, {"out_of_memory", t.out_of_memory},
             {"oom", oom},           {"predicted_peak", t.predicted_peak},
             {"run_dir", t.run_dir}};
    rec["value"] = t.value ? json(*t.value) : json(nullptr);
    journal_.append(rec);
    trials_[t.number] = t;
    progress_ << trial_name(t.number) << ": " << state;
    if (t.value) progress_ << ", " << s_.objective << " " << *t.value;
    if (!reason.empty()) progress_ << " (" << reason << ")";
    progress_ << "\n";
  }

  /// Reads the journal of an earlier run of this study: what ended stays as it ended.
  void resume() {
    seed_ = s_.seed
                ? *s_.seed
                : RunSettings::from(prepare_run(req_.recipe, req_.overrides, req_.plugin_dirs).config.sub("run")).seed;
    study_name_ = fs::path(req_.study_dir).filename().string();
    const auto records = journal_.read();
    if (records.empty()) {
      journal_.append(json{{"event", "study"},
                           {"recipe", req_.recipe},
                           {"overrides", req_.overrides},
                           {"objective", s_.objective},
                           {"direction", s_.direction},
                           {"sampler", s_.sampler},
                           {"seed", seed_},
                           {"n_trials", s_.n_trials}});
      return;
    }
    std::int64_t resumed = 0;
    for (const auto& j : records) {
      const std::string ev = j.value("event", "");
      if (ev == "study") {
        TRAINER_CHECK_T(UsageError,
                        j.value("objective", "") == s_.objective && j.value("direction", "") == s_.direction,
                        req_.study_dir, " holds a study of ", j.value("direction", ""), " ", j.value("objective", ""),
                        "; this recipe asks for ", s_.direction, " ", s_.objective,
                        ": give another --study-dir, or the same [sweep] settings");
      } else if (ev == "mlflow") {
        mlflow_run_ = j.value("run_id", "");
      } else if (ev == "trial") {
        TrialRecord t;
        t.number = j["number"];
        t.state = "RUNNING";
        t.params = params_from(j, space_);
        trials_[t.number] = t;
      } else if (ev == "report" && trials_.count(j["number"])) {
        trials_[j["number"]].intermediate.push_back(j["value"]);
      } else if (ev == "end" && trials_.count(j["number"])) {
        TrialRecord& t = trials_[j["number"]];
        t.state = j["state"];
        t.reason = j.value("reason", "");
        t.seconds = j.value("seconds", 0.0);
        t.out_of_memory = j.value("out_of_memory", false);
        t.predicted_peak = j.value("predicted_peak", std::int64_t{-1});
        t.run_dir = j.value("run_dir", "");
        if (j.contains("value") && j["value"].is_number()) t.value = j["value"].get<double>();
        for (const auto& [k, v] : j["oom"].items()) t.oom[k] = v.get<std::string>();
        ++resumed;
      }
    }
    for (auto& [n, t] : trials_) {
      if (t.state == "RUNNING") t.intermediate.clear();  // it starts over
    }
    progress_ << "resuming " << journal_.path() << ": " << resumed << " trials ended, "
              << (trials_.size() - static_cast<std::size_t>(resumed)) << " to run again\n";
  }

  void write_csv(const StudyResult& r) const {
    std::ofstream out(req_.study_dir + "/results.csv");
    const auto field = [](const std::string& s) {
      if (s.find_first_of(",\"\n") == std::string::npos) return s;
      std::string q = "\"";
      for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
      return q + "\"";
    };
    out << "number,state," << field(s_.objective);
    for (const auto& p : space_.params()) out << "," << field(p.key);
    out << ",out_of_memory,oom_phase,predicted_peak_mib,seconds,reason\n";
    for (const auto& t : r.trials) {
      out << t.number << "," << t.state << "," << (t.value ? json(*t.value).dump() : "");
      for (const auto& p : space_.params()) out << "," << field(t.params.get(p.key));
      out << "," << (t.out_of_memory ? "true" : "false") << "," << (t.oom.count("phase") ? t.oom.at("phase") : "")
          << "," << (t.predicted_peak >= 0 ? std::to_string(t.predicted_peak / kMiB) : "") << ","
          << json(t.seconds).dump() << "," << field(t.reason) << "\n";
    }
  }

  /// With the mlflow plugin in the recipe, the study is a parent run its trials nest under.
  void start_mlflow() {
    if (!mlflow_run_.empty()) return;  // resumed
    const PreparedRun p = prepare_run(req_.recipe, req_.overrides, req_.plugin_dirs);
    const bool used =
        std::any_of(p.plugins.begin(), p.plugins.end(), [](const auto& x) { return x->name() == "mlflow"; });
    if (!used) return;
    const char* env_uri = std::getenv("MLFLOW_TRACKING_URI");
    const char* env_exp = std::getenv("MLFLOW_EXPERIMENT_NAME");
    const std::string uri = p.config.get_or<std::string>("plugins.mlflow.tracking_uri", "").empty()
                                ? (env_uri ? env_uri : "")
                                : p.config.get<std::string>("plugins.mlflow.tracking_uri");
    const std::string exp = p.config.get_or<std::string>("plugins.mlflow.experiment", "").empty()
                                ? (env_exp ? env_exp : "Default")
                                : p.config.get<std::string>("plugins.mlflow.experiment");
    mlflow_uri_ = uri;
    try {
      auto backend = mlflow::open_backend(uri, mlflow::Credentials::from_env());
      mlflow_run_ = mlflow::start_run(*backend, exp, study_name_, "",
                                      {{"trainer.study_dir", fs::absolute(req_.study_dir).string()},
                                       {"trainer.sweep.objective", s_.objective},
                                       {"trainer.sweep.sampler", s_.sampler}})
                        .run_id;
      journal_.append(json{{"event", "mlflow"}, {"run_id", mlflow_run_}, {"tracking_uri", uri}});
      progress_ << "MLflow: parent run " << mlflow_run_ << " (" << uri << ", experiment " << exp << ")\n";
    } catch (const std::exception& e) {
      // The trials still log their own runs; only the nesting is lost.
      progress_ << "MLflow: cannot create the study's parent run (" << e.what() << "); trials log as top-level runs\n";
      mlflow_run_.clear();
    }
  }

  void finish_mlflow(const StudyResult& r) {
    if (mlflow_run_.empty() || mlflow_uri_.empty()) return;
    try {
      auto backend = mlflow::open_backend(mlflow_uri_, mlflow::Credentials::from_env());
      const std::int64_t now = mlflow::now_ms();
      std::vector<mlflow::Metric> metrics{{"study/complete", double(r.count("COMPLETE")), now, 0},
                                          {"study/pruned", double(r.count("PRUNED")), now, 0},
                                          {"study/failed", double(r.count("FAILED")), now, 0},
                                          {"study/skipped", double(r.count("SKIPPED")), now, 0},
                                          {"study/out_of_memory", double(r.out_of_memory()), now, 0}};
      std::vector<mlflow::KeyValue> tags;
      if (r.best) {
        const auto& b = r.trials[static_cast<std::size_t>(*r.best)];
        metrics.push_back({mlflow::sanitize_key("best/" + s_.objective), *b.value, now, 0});
        tags.push_back({"trainer.sweep.best_trial", trial_name(b.number)});
        for (const auto& [k, v] : b.params.values) tags.push_back({mlflow::sanitize_key("best." + k), v});
      }
      backend->log_batch(mlflow_run_, metrics, {}, tags);
      if (!r.interrupted) mlflow::end_run(*backend, mlflow_run_, "FINISHED");
    } catch (const std::exception& e) {
      progress_ << "MLflow: cannot update the study's parent run: " << e.what() << "\n";
    }
  }

  const SweepRequest& req_;
  SweepSettings s_;
  SearchSpace space_;
  std::ostream& progress_;
  Journal journal_;
  std::unique_ptr<Sampler> sampler_;
  std::int64_t seed_ = 0;
  std::string study_name_;
  std::map<std::int64_t, TrialRecord> trials_;
  std::vector<Running> running_;
  std::map<std::string, MemoryEstimate> estimates_;
  std::string mlflow_run_, mlflow_uri_;
};

}  // namespace

StudyResult run_sweep(const SweepRequest& request, std::ostream& progress) {
  auto [settings, space] = load_sweep(request.recipe, request.overrides);
  SweepRequest req = request;
  if (req.study_dir.empty()) req.study_dir = settings.dir;
  if (req.study_dir.empty()) {
    const auto run =
        RunSettings::from(prepare_run(request.recipe, request.overrides, request.plugin_dirs).config.sub("run"));
    req.study_dir = run.dir + "/" + run.name + "-sweep";
  }
  TRAINER_CHECK_T(UsageError, !req.trainer_exe.empty() && ::access(req.trainer_exe.c_str(), X_OK) == 0,
                  "cannot run the trainer executable '", req.trainer_exe, "'");
  Study study(req, settings, space, progress);
  return study.run();
}

void print_study(const StudyResult& r, const std::string& objective, std::ostream& out) {
  out << "study " << r.study_dir << ": " << r.trials.size() << " trials: " << r.count("COMPLETE") << " complete, "
      << r.count("PRUNED") << " pruned (" << r.out_of_memory() << " out of memory), " << r.count("FAILED")
      << " failed, " << r.count("SKIPPED") << " skipped (predicted out of memory)";
  if (r.interrupted) out << "; interrupted: run the same command again to resume";
  out << "\n";
  if (r.best) {
    const auto& b = r.trials[static_cast<std::size_t>(*r.best)];
    out << "best: " << trial_name(b.number) << ", " << objective << " " << *b.value << ":";
    for (const auto& [k, v] : b.params.values) out << " " << k << "=" << v;
    out << "\n";
  }
  out << "results: " << r.study_dir << "/results.csv\n";
  if (!r.mlflow_run_id.empty()) out << "MLflow parent run: " << r.mlflow_run_id << "\n";
}

}  // namespace trainer::tune
