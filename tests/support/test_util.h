#pragma once
// Shared helpers for the trainer tests: a temp dir per test, file I/O, JSONL field access.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "trainer/trainer.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace trainer::testing {

/// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "test";
    for (auto& c : name) {
      if (c == '/') c = '_';
    }
    path_ = std::filesystem::temp_directory_path() / ("trainer_test_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& rel) const { return (path_ / rel).string(); }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, const std::string& text);

/// A small run that takes a fraction of a second: an MLP on 64 synthetic 8x8 samples, two
/// epochs of two SGD steps, evaluation and a checkpoint per epoch. Tests change it with
/// overrides.
constexpr const char* kSmallRun = R"(
[run]
name = "t"
seed = 7
[model]
name = "mlp"
hidden = [32]
[dataset]
name = "synthetic"
size = 64
eval_size = 32
shape = [1, 8, 8]
[training]
epochs = 2
batch_size = 32
log_every = 1
[optim]
name = "sgd"
lr = 0.1
[metrics]
console = false
)";

/// The override that fixes a run's intra-op threads at one, for runs a test compares bit for bit
/// or to float32 rounding: the default, runtime.num_threads = 0, takes the cores other work
/// leaves free when a run starts and at each epoch, so under `ctest -j` two runs may get other
/// counts, and a reduction split over another number of threads sums in another order.
inline constexpr const char* kOneThread = "runtime.num_threads=1";

/// Seeds LibTorch and gives each test its own temp dir.
class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override { torch::manual_seed(0); }

  /// For a test that compares its runs bit for bit or to float32 rounding: each run of
  /// options_for() (and fit()) from here on gets kOneThread before the test's overrides.
  void fix_threads() { fixed_threads_ = true; }

  /// Writes `recipe` to <tmp>/recipe.toml, resolves it with `overrides` (plugins searched in
  /// the test plugin directory first) and returns the options of a run in <tmp>/<name>, with
  /// the in-process plugins `extra` after the recipe's.
  TrainerOptions options_for(const std::string& recipe, const std::vector<std::string>& overrides,
                             const std::string& name, const std::vector<std::shared_ptr<Plugin>>& extra = {}) {
    write_file(tmp_ / "recipe.toml", recipe);
    std::vector<std::string> all;
    if (fixed_threads_) all.push_back(kOneThread);
    all.insert(all.end(), overrides.begin(), overrides.end());
    PreparedRun p = prepare_run(tmp_ / "recipe.toml", all, {TRAINER_TEST_PLUGIN_DIR});
    TrainerOptions o;
    o.config = p.config;
    o.plugins = p.plugins;
    o.plugins.insert(o.plugins.end(), extra.begin(), extra.end());
    o.run_dir = tmp_ / name;
    o.log_level = "error";
    return o;
  }

  /// The run of options_for(), fitted, or as the command line reports a recipe refused when it
  /// is read (a ConfigError): exit code 2 with the message. `model`, when given, gets the model
  /// after the run (null for a refused recipe).
  RunResult fit(const std::string& recipe, const std::vector<std::string>& overrides, const std::string& name,
                const std::vector<std::shared_ptr<Plugin>>& extra = {}, std::shared_ptr<Model>* model = nullptr) {
    TrainerOptions o;
    try {
      o = options_for(recipe, overrides, name, extra);
    } catch (const ConfigError& e) {
      RunResult refused;
      refused.exit_code = kExitUsage;
      refused.message = e.what();
      return refused;
    }
    Trainer t(std::move(o));
    RunResult r = t.fit();
    if (model) *model = t.model();
    return r;
  }

  TempDir tmp_;

 private:
  bool fixed_threads_ = false;
};

inline void write_file(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The non-empty lines of a string.
inline std::vector<std::string> read_lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

/// The non-empty lines of a file.
inline std::vector<std::string> read_lines(const std::string& path) { return read_lines_of(read_file(path)); }

/// The string value of "key":"value" in a flat JSON object line.
inline std::string json_str(const std::string& line, const std::string& key) {
  const std::regex re("\"" + key + "\":\"([^\"]*)\"");
  std::smatch m;
  return std::regex_search(line, m, re) ? m[1].str() : std::string();
}

/// The numeric value of "key":number in a flat JSON object line.
inline std::optional<double> json_num(const std::string& line, const std::string& key) {
  const std::regex re("\"" + key + "\":(-?[0-9.eE+-]+)");
  std::smatch m;
  if (!std::regex_search(line, m, re)) return std::nullopt;
  return std::stod(m[1].str());
}

/// Events recorded by the recording plugin, in order.
inline std::vector<std::string> recorded_events(const std::string& events_file) {
  std::vector<std::string> out;
  for (const auto& l : read_lines(events_file)) out.push_back(json_str(l, "event"));
  return out;
}

/// metrics.jsonl values of `name`, keyed by step.
/// The largest absolute difference between corresponding tensors of `a` and `b` (parameters,
/// gradients); a size mismatch or an undefined tensor is a test failure.
inline double max_abs_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!a[i].defined() || !b[i].defined()) {
      ADD_FAILURE() << "tensor " << i << " is undefined";
      continue;
    }
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  }
  return worst;
}

inline std::map<long, double> metric_by_step(const std::string& metrics_file, const std::string& name) {
  std::map<long, double> out;
  for (const auto& l : read_lines(metrics_file)) {
    if (json_str(l, "name") == name) out[static_cast<long>(*json_num(l, "step"))] = *json_num(l, "value");
  }
  return out;
}

/// A child process running `command` through /bin/sh (which execs it: the pid is the
/// command's). The test is its parent, so it can signal it and must reap it (wait()).
class Child {
 public:
  explicit Child(const std::string& command) {
    const std::string line = "exec " + command;
    const char* argv[] = {"/bin/sh", "-c", line.c_str(), nullptr};
    if (::posix_spawn(&pid_, "/bin/sh", nullptr, nullptr, const_cast<char* const*>(argv), environ) != 0) pid_ = -1;
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  /// A child still running when the test ends is killed and reaped.
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      wait();
    }
  }
  pid_t pid() const { return pid_; }
  bool started() const { return pid_ > 0; }
  /// The caller reaped the child itself (waitpid).
  void forget() { reaped_ = true; }
  /// Sends `sig`; false when it could not be sent.
  bool signal(int sig) const { return pid_ > 0 && ::kill(pid_, sig) == 0; }
  /// Waits for the child to end and reaps it: its wait status.
  int wait() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    return status;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

/// What a command printed (stdout and stderr together) and how it ended.
struct CommandOutput {
  int code = -1;  ///< exit code, or 128 + signal
  std::string text;
};

/// Runs `command` through the shell, stderr with stdout.
inline CommandOutput run_command(const std::string& command) {
  CommandOutput out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.text.append(buf, n);
  const int status = pclose(p);
  out.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return out;
}

/// Polls `path` until it contains `text`: true once it does, false after `limit` (a bound
/// so that a broken run fails the test instead of hanging it, not a timing assumption).
inline bool wait_for_text(const std::string& path, const std::string& text,
                          std::chrono::seconds limit = std::chrono::seconds(300)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (read_file(path).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace trainer::testing
