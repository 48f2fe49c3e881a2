// The file-store backend: MLflow's FileStore layout (mlflow/store/tracking/file_store.py).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <vector>

#include "backends.h"
#include "trainer/durable_file.h"
#include "trainer/error.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace trainer::mlflow {

namespace {

std::string yaml_quote(const std::string& s) {
  // A line break or other control character would end a single-quoted scalar's line and
  // start a key of its own: such a text is written double-quoted, with JSON's escapes (which
  // YAML's double-quoted scalars share).
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      return json(s).dump(-1, ' ', true, json::error_handler_t::replace);
  }
  std::string out = "'";
  for (char c : s) out += (c == '\'') ? std::string("''") : std::string(1, c);
  return out + "'";
}

/// The scalar of `key:` in a flat YAML file written by MLflow (PyYAML) or by us.
std::string yaml_scalar(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::string v = line.substr(key.size() + 1);
    while (!v.empty() && v.front() == ' ') v.erase(0, 1);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\r')) v.pop_back();
    if (v.size() >= 2 && v.front() == '\'' && v.back() == '\'') {
      std::string out;
      for (std::size_t i = 1; i + 1 < v.size(); ++i) {
        out += v[i];
        if (v[i] == '\'' && i + 2 < v.size() && v[i + 1] == '\'') ++i;
      }
      return out;
    }
    if (v.size() >= 2 && v.front() == '"' && v.back() == '"') {
      const json j = json::parse(v, nullptr, false);
      return j.is_string() ? j.get<std::string>() : v.substr(1, v.size() - 2);
    }
    return v == "null" ? std::string() : v;
  }
  return {};
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const char* kStatuses[] = {"", "RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED"};

int status_number(const std::string& s) {
  for (int i = 1; i <= 5; ++i) {
    if (s == kStatuses[i]) return i;
  }
  throw RejectedError("unknown run status '" + s + "'");
}

std::string random_hex(std::size_t n) {
  static std::mutex mu;
  static std::mt19937_64 gen{std::random_device{}() ^ static_cast<std::uint64_t>(now_ms())};
  std::lock_guard<std::mutex> lock(mu);
  std::string s;
  const char* digits = "0123456789abcdef";
  for (std::size_t i = 0; i < n; ++i) s += digits[gen() % 16];
  return s;
}

std::string format_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

/// MLflow's file store (mlflow/store/tracking/file_store.py), as MLflow 2.x and 3.x read it:
/// <root>/<experiment id>/meta.yaml, <root>/<experiment id>/<run id>/{meta.yaml, metrics/,
/// params/, tags/, artifacts/}; a metric file holds lines "<timestamp ms> <value> <step>".
class FileBackend final : public Backend {
 public:
  FileBackend(std::string uri, fs::path root) : uri_(std::move(uri)), root_(fs::absolute(root).lexically_normal()) {}
  ~FileBackend() override { close_files(); }

  std::string uri() const override { return uri_; }

  std::string experiment_id(const std::string& name) override {
    ensure_root();
    for (const auto& entry : fs::directory_iterator(root_)) {
      const fs::path meta = entry.path() / "meta.yaml";
      if (!entry.is_directory() || !fs::exists(meta)) continue;
      const std::string text = read_text(meta);
      if (yaml_scalar(text, "name") != name) continue;
      if (yaml_scalar(text, "lifecycle_stage") != "active") {
        throw RejectedError("MLflow experiment '" + name + "' is deleted in " + root_.string());
      }
      return yaml_scalar(text, "experiment_id");
    }
    std::string id;
    do {
      id = std::to_string(std::stoull(random_hex(15), nullptr, 16));
    } while (fs::exists(root_ / id));
    write_experiment(id, name);
    return id;
  }

  RunInfo create_run(const std::string& experiment_id, const std::string& run_name, const std::string& user,
                     std::int64_t start_ms, const std::vector<KeyValue>& tags) override {
    check_id(experiment_id, "experiment");
    for (const auto& t : tags) check_key(t.key, "tag");
    const fs::path exp = root_ / experiment_id;
    if (!fs::exists(exp / "meta.yaml")) {
      throw RejectedError("no MLflow experiment " + experiment_id + " in " + root_.string());
    }
    RunInfo r;
    r.run_id = random_hex(32);
    r.experiment_id = experiment_id;
    r.artifact_uri = file_uri(exp / r.run_id / "artifacts");
    r.status = "RUNNING";
    const fs::path dir = inside(exp / r.run_id);
    for (const char* sub : {"metrics", "params", "tags", "artifacts"}) fs::create_directories(dir / sub);
    std::vector<KeyValue> all = tags;
    bool has_name = false;
    for (const auto& t : tags) has_name |= t.key == "mlflow.runName";
    if (!has_name && !run_name.empty()) all.push_back({"mlflow.runName", run_name});
    for (const auto& t : all) write_atomically(dir / "tags" / t.key, t.value);
    Meta m{r, run_name, user, start_ms, 0};
    write_run_meta(dir, m);
    return r;
  }

  RunInfo get_run(const std::string& run_id) override { return read_run_meta(run_dir(run_id)).info; }

  RunInfo find_run_by_tag(const std::string& experiment_id, const std::string& key, const std::string& value) override {
    check_id(experiment_id, "experiment");
    check_key(key, "tag");
    const fs::path exp = root_ / experiment_id;
    if (!fs::exists(exp)) return {};
    for (const auto& entry : fs::directory_iterator(exp)) {
      const fs::path tag = entry.path() / "tags" / key;
      if (entry.is_directory() && fs::exists(tag) && read_text(tag) == value) {
        return read_run_meta(entry.path()).info;
      }
    }
    return {};
  }

  void log_batch(const std::string& run_id, const std::vector<Metric>& metrics, const std::vector<KeyValue>& params,
                 const std::vector<KeyValue>& tags) override {
    for (const auto& m : metrics) check_key(m.key, "metric");
    for (const auto& p : params) check_key(p.key, "param");
    for (const auto& t : tags) check_key(t.key, "tag");
    const fs::path dir = run_dir(run_id);
    for (const auto& p : params) {
      const fs::path f = inside(dir / "params" / p.key);
      if (fs::exists(f)) {
        const std::string old = read_text(f);
        if (old != p.value) {
          throw RejectedError("param '" + p.key + "' was already logged with value '" + old + "'; MLflow refuses '" +
                              p.value + "'");
        }
        continue;
      }
      write_atomically(f, p.value);
    }
    for (const auto& t : tags) write_atomically(dir / "tags" / t.key, t.value);
    // One append per key: each line whole, in the order logged.
    std::vector<std::pair<std::string, std::string>> lines;
    for (const auto& m : metrics) {
      const std::string line =
          std::to_string(m.timestamp_ms) + " " + format_number(m.value) + " " + std::to_string(m.step) + "\n";
      auto it = std::find_if(lines.begin(), lines.end(), [&](const auto& l) { return l.first == m.key; });
      if (it == lines.end()) {
        lines.emplace_back(m.key, line);
      } else {
        it->second += line;
      }
    }
    for (const auto& [key, text] : lines) {
      const fs::path f = dir / "metrics" / key;
      std::FILE* out = metric_file(f);
      const bool ok = std::fwrite(text.data(), 1, text.size(), out) == text.size();
      if (std::fflush(out) != 0 || !ok) throw RejectedError("cannot append to " + f.string());
    }
  }

  void update_run(const std::string& run_id, const std::string& status, std::int64_t end_ms) override {
    const fs::path dir = run_dir(run_id);
    Meta m = read_run_meta(dir);
    m.info.status = status;
    m.end_ms = status == "RUNNING" ? 0 : end_ms;
    write_run_meta(dir, m);
  }

  void log_artifact(const RunInfo& run, const std::string& local_path, const std::string& artifact_path) override {
    if (!valid_artifact_path(artifact_path)) {
      throw RejectedError("artifact path '" + artifact_path +
                          "' is not a relative path of parts other than empty, . and ..; refused by the MLflow file "
                          "store " +
                          root_.string());
    }
    const fs::path dest = inside(run_dir(run.run_id) / "artifacts" / artifact_path);
    fs::create_directories(dest.parent_path());
    inside(dest.string() + ".tmp");
    const FileDescriptor source = open_artifact(local_path);
    std::string tmp;
    try {
      // The temporary is created new (O_EXCL|O_NOFOLLOW): a stale one or a link at its name is
      // removed, and one planted again after that makes the open fail; nothing is written
      // through it.
      tmp = write_temporary(dest.string(), [&](std::ostream& out) { copy_out(source.get(), local_path, out); });
    } catch (const trainer::Error& e) {
      throw RejectedError("cannot copy artifact " + local_path + " to " + dest.string() + ": " + e.what());
    }
    if (::rename(tmp.c_str(), dest.c_str()) != 0) {  // a link at `dest` is replaced, not followed
      const int err = errno;
      ::unlink(tmp.c_str());
      throw RejectedError("cannot rename " + tmp + " to " + dest.string() + ": " + std::strerror(err));
    }
  }

 private:
  struct Meta {
    RunInfo info;
    std::string run_name, user;
    std::int64_t start_ms = 0, end_ms = 0;
  };

  std::string uri_;
  fs::path root_;
  /// Metric files stay open between steps (appended, flushed after each batch).
  std::map<std::string, std::FILE*> files_;
  std::map<std::string, fs::path> run_dirs_;

  std::FILE* metric_file(const fs::path& f) {
    auto it = files_.find(f.string());
    if (it != files_.end()) return it->second;
    if (files_.size() >= 256) close_files();
    inside(f);
    fs::create_directories(f.parent_path());
    // Never through a link (one put there after the check included), and never waiting on a
    // FIFO planted in a shared store: anything but a regular file is refused, naming it.
    FileDescriptor fd;
    try {
      fd = open_for_append(f.string());
    } catch (const trainer::Error& e) {
      throw RejectedError(e.what());
    }
    std::FILE* out = ::fdopen(fd.get(), "ab");
    if (!out) throw RejectedError("cannot append to " + f.string() + ": " + std::strerror(errno));
    fd.release();  // the FILE closes it now
    files_[f.string()] = out;
    return out;
  }

  /// `path` opened to read an artifact from: a regular file (a FIFO there is refused, not
  /// waited on).
  static FileDescriptor open_artifact(const std::string& path) {
    FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    if (fd.get() < 0) throw RejectedError("cannot read artifact " + path + ": " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
      throw RejectedError("artifact file " + path + " is not a regular file");
    }
    return fd;
  }

  /// Copies what `fd` (an artifact's file, `path`) holds to `out`.
  static void copy_out(int fd, const std::string& path, std::ostream& out) {
    std::vector<char> buf(1 << 16);
    for (;;) {
      const ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw RejectedError("cannot read artifact " + path + ": " + std::strerror(errno));
      if (n == 0) return;
      out.write(buf.data(), n);
    }
  }
  void close_files() {
    for (auto& [path, f] : files_) std::fclose(f);
    files_.clear();
  }

  static std::string file_uri(const fs::path& p) { return "file://" + p.string(); }

  static void check_id(const std::string& id, const char* what) {
    if (!valid_id(id)) {
      throw RejectedError(std::string("MLflow ") + what + " id '" + id +
                          "' cannot name a file-store directory (1-64 letters, digits, _ or -)");
    }
  }
  static void check_key(const std::string& key, const char* what) {
    if (!valid_key(key)) {
      throw RejectedError(std::string(what) + " key '" + key + "' is not valid in MLflow (1-" +
                          std::to_string(kMaxKeyLength) +
                          " characters of letters, digits, _ - . space : /, a path without empty, . or .. parts)");
    }
  }

  /// `p`, when writing it stays inside the store: the directories on its way, symlinks
  /// followed, lie under the root, and so does where `p` leads when it is a symlink (a dangling
  /// one included: writing through it would create its target). Else a RejectedError.
  fs::path inside(const fs::path& p) const {
    const fs::path root = fs::weakly_canonical(root_);
    fs::path real = fs::weakly_canonical(p);
    std::error_code ec;
    for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(real, ec)); ++hops) {
      const fs::path target = fs::read_symlink(real, ec);
      if (ec) break;
      real = fs::weakly_canonical(target.is_absolute() ? target : real.parent_path() / target);
    }
    if (!detail::is_within(real, root)) {
      throw RejectedError("MLflow file store " + root.string() + ": " + p.string() + " leads to " + real.string() +
                          ", outside the store; not written");
    }
    return p;
  }

  /// Writes `text` to `p` through a temporary file and a rename: readers see the old or the
  /// new file, never half of one. Neither `p` nor the temporary file may lead out of the store.
  void write_atomically(const fs::path& p, const std::string& text) const {
    inside(p);
    fs::create_directories(p.parent_path());
    inside(p.string() + ".tmp");
    try {
      write_replacing(p.string(), text);  // the temporary created new: a link there is removed, not followed
    } catch (const trainer::Error& e) {
      throw RejectedError(e.what());
    }
  }

  void ensure_root() {
    if (fs::exists(root_ / "0" / "meta.yaml")) return;
    // As MLflow's FileStore does on a new root: the Default experiment 0 and the trash folder.
    fs::create_directories(root_ / ".trash");
    write_experiment("0", "Default");
  }

  void write_experiment(const std::string& id, const std::string& name) {
    const std::string t = std::to_string(now_ms());
    write_atomically(root_ / id / "meta.yaml", "artifact_location: " + file_uri(root_ / id) + "\ncreation_time: " + t +
                                                   "\nexperiment_id: '" + id + "'\nlast_update_time: " + t +
                                                   "\nlifecycle_stage: active\nname: " + yaml_quote(name) + "\n");
  }

  fs::path run_dir(const std::string& run_id) {
    check_id(run_id, "run");
    if (auto it = run_dirs_.find(run_id); it != run_dirs_.end() && fs::exists(it->second)) return it->second;
    if (fs::exists(root_)) {
      for (const auto& entry : fs::directory_iterator(root_)) {
        const fs::path d = entry.path() / run_id;
        if (entry.is_directory() && fs::exists(d / "meta.yaml")) return run_dirs_[run_id] = d;
      }
    }
    throw RejectedError("no MLflow run " + run_id + " in " + root_.string());
  }

  void write_run_meta(const fs::path& dir, const Meta& m) const {
    // run_uuid beside run_id: MLflow 2.x requires it, 3.x ignores it.
    std::string y = "artifact_uri: " + m.info.artifact_uri + "\n";
    y += "end_time: " + (m.end_ms > 0 ? std::to_string(m.end_ms) : std::string("null")) + "\n";
    y += "entry_point_name: ''\nexperiment_id: '" + m.info.experiment_id + "'\nlifecycle_stage: active\n";
    y += "run_id: " + m.info.run_id + "\nrun_name: " + yaml_quote(m.run_name) + "\nrun_uuid: " + m.info.run_id + "\n";
    y += "source_name: ''\nsource_type: 4\nsource_version: ''\nstart_time: " + std::to_string(m.start_ms) + "\n";
    y +=
        "status: " + std::to_string(status_number(m.info.status)) + "\ntags: []\nuser_id: " + yaml_quote(m.user) + "\n";
    write_atomically(dir / "meta.yaml", y);
  }

  static Meta read_run_meta(const fs::path& dir) {
    const std::string text = read_text(dir / "meta.yaml");
    Meta m;
    m.info.run_id = yaml_scalar(text, "run_id");
    m.info.experiment_id = yaml_scalar(text, "experiment_id");
    m.info.artifact_uri = yaml_scalar(text, "artifact_uri");
    const std::string st = yaml_scalar(text, "status");
    const int n = st.empty() ? 1 : std::atoi(st.c_str());
    m.info.status = (n >= 1 && n <= 5) ? kStatuses[n] : "RUNNING";
    m.run_name = yaml_scalar(text, "run_name");
    m.user = yaml_scalar(text, "user_id");
    const std::string start = yaml_scalar(text, "start_time"), end = yaml_scalar(text, "end_time");
    m.start_ms = start.empty() ? 0 : std::stoll(start);
    m.end_ms = end.empty() ? 0 : std::stoll(end);
    m.info.end_time = m.end_ms;
    return m;
  }
};

}  // namespace

namespace detail {

std::unique_ptr<Backend> make_file_backend(const std::string& uri, const std::string& root) {
  return std::make_unique<FileBackend>(uri, fs::path(root));
}

}  // namespace detail

}  // namespace trainer::mlflow
