#include "study_journal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <thread>

#include "journal_io.h"
#include "trainer/durable_file.h"
#include "trainer/error.h"
#include "trainer/interrupt.h"
#include "trainer/json.h"
#include "trainer/secrets.h"
#include "trial_process.h"

namespace trainer::tune {

using json = nlohmann::json;

void StudyJournal::append(const json& record) {
  if (!tail_checked_) {
    // The JSON-lines journal of the MLflow client has the same problem and the same repair.
    mlflow::detail::drop_incomplete_tail(path_);
    tail_checked_ = true;
  }
  const std::string line = record.dump() + "\n";
  FileDescriptor fd = open_for_append(path_);  // never through a link planted at its name
  const bool ok =
      ::write(fd.get(), line.data(), line.size()) == static_cast<ssize_t>(line.size()) && ::fsync(fd.get()) == 0;
  const int err = errno;
  fd.reset();
  if (!ok) {
    tail_checked_ = false;  // a part of the line may be there: cut before the next one
    TRAINER_CHECK(false, "cannot write the study journal ", path_, ": ", std::strerror(err));
  }
}

std::vector<JournalLine> StudyJournal::read() const {
  std::vector<JournalLine> out;
  std::int64_t number = 0;
  // A last line without its newline (cut short) is not read: the next append drops it.
  mlflow::detail::for_each_record(path_, 0, [&](const std::string& line, std::int64_t) {
    ++number;
    if (line.empty()) return true;
    JournalLine l;
    l.line = number;
    // nlohmann::json prints and compares values recursively: a record nested a few hundred
    // thousand levels deep would overflow the stack where a message shows it.
    if (const std::int64_t depth = json_nesting(line); depth > kMaxRecordNesting) {
      l.parse_error = "arrays and objects nested " + std::to_string(depth) + " levels deep, more than the " +
                      std::to_string(kMaxRecordNesting) + " a record may";
      out.push_back(std::move(l));
      return true;
    }
    try {
      l.record = json::parse(line);
    } catch (const json::exception& e) {
      l.parse_error = e.what();
    }
    out.push_back(std::move(l));
    return true;
  });
  return out;
}

namespace {

json params_json(const Assignment& a) {
  json p = json::object(), x = json::object();
  for (const auto& [k, v] : a.values) p[k] = v;
  for (const auto& [k, v] : a.internal) x[k] = v;
  return json{{"params", p}, {"internal", x}};
}

}  // namespace

json space_record(const SearchSpace& space) {
  static const char* kinds[] = {"choice", "int", "uniform", "log_uniform"};
  const auto range = [](const ParamRange& r) {
    return json{{"values", r.values}, {"low", r.low}, {"high", r.high}, {"step", r.step}};
  };
  json out = json::array();
  for (const auto& p : space.params()) {
    json cases = json::object();
    for (const auto& [c, r] : p.cases) cases[c] = range(r);
    out.push_back({{"key", p.key},
                   {"type", kinds[static_cast<int>(p.kind)]},
                   {"range", range(p.range)},
                   {"condition_on", p.condition_on},
                   {"cases", cases}});
  }
  return out;
}

json trial_record(const TrialRecord& t) {
  json rec{{"event", "trial"}, {"number", t.number}};
  rec.update(params_json(t.params));
  return rec;
}

json report_record(std::int64_t number, double value) {
  return json{{"event", "report"}, {"number", number}, {"value", value}};
}

json end_record(const TrialRecord& t) {
  json oom = json::object();
  for (const auto& [k, v] : t.oom) oom[k] = v;
  return json{{"event", "end"},
              {"number", t.number},
              {"state", trial_state_name(t.state)},
              {"reason", t.reason},
              {"seconds", t.seconds},
              {"out_of_memory", t.out_of_memory},
              {"oom", oom},
              {"predicted_peak", t.predicted_peak},
              {"run_dir", t.run_dir},
              {"value", t.value ? json(*t.value) : json(nullptr)},
              {"value_not_finite", t.diverged}};
}

json mlflow_record(const StudyRun& run) {
  return json{{"event", "mlflow"}, {"run_id", run.id}, {"tracking_uri", without_userinfo(run.tracking_uri)}};
}

std::string config_hash(const std::string& toml_text) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a, 64 bits
  for (const unsigned char c : toml_text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return std::string("fnv1a64:") + buf;
}

StudyLock::StudyLock(const std::string& study_dir, std::ostream& progress) {
  const std::string path = study_dir + "/study.lock";
  // NOTE: no O_CLOEXEC: the trials inherit the descriptor, so the lock lasts as long as the
  // last of them. A study resumed after its process was killed waits for its old trials
  // instead of starting them again beside themselves.
  fd_ = open_for_update(path);  // never through a link planted at its name
  ::fcntl(fd_.get(), F_SETFD, 0);
  bool said = false;
  while (::flock(fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    TRAINER_CHECK(errno == EWOULDBLOCK || errno == EINTR, "cannot lock ", path, ": ", std::strerror(errno));
    const std::string text = read_text(path);
    const pid_t owner = static_cast<pid_t>(std::atol(text.c_str()));
    TRAINER_CHECK_T(UsageError, !process_running(owner, "sweep"), study_dir,
                    " is in use by another trainer sweep (pid ", owner, "): one study process per directory");
    if (!said) {
      progress << "waiting for the trials of the study process that died (pid " << owner << ") to stop\n";
      said = true;
    }
    if (interrupt_requested()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  held_ = true;
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_.get(), 0) != 0 ||
      ::pwrite(fd_.get(), pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    progress << "cannot write the study's pid to " << path << "\n";
  }
}

}  // namespace trainer::tune
