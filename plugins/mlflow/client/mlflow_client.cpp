#include "mlflow_client.h"

#include <curl/curl.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

namespace fs = std::filesystem;
using nlohmann::json;

namespace trainer::mlflow {

std::int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

std::string current_user() {
  if (const char* u = std::getenv("USER"); u && *u) return u;
  if (const passwd* pw = getpwuid(getuid()); pw && pw->pw_name) return pw->pw_name;
  return "unknown";
}

Credentials Credentials::from_env() {
  Credentials c;
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
  };
  c.token = env("MLFLOW_TRACKING_TOKEN");
  c.username = env("MLFLOW_TRACKING_USERNAME");
  c.password = env("MLFLOW_TRACKING_PASSWORD");
  return c;
}

// ---- keys and values ---------------------------------------------------------------------

namespace {

bool key_char_ok(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
         c == '.' || c == ' ' || c == ':' || c == '/';
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

std::string hex8(std::uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

std::uint32_t fnv1a(const std::string& s) {
  std::uint32_t h = 2166136261u;
  for (unsigned char c : s) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

}  // namespace

bool valid_key(const std::string& key) {
  if (key.empty() || key.size() > kMaxKeyLength) return false;
  for (char c : key) {
    if (!key_char_ok(c)) return false;
  }
  // posixpath.normpath(key) == key: no empty, "." or ".." parts, no leading or trailing "/".
  for (const auto& part : split(key, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

std::string sanitize_key(const std::string& key) {
  if (valid_key(key)) return key;
  std::string chars = key;
  for (auto& c : chars) {
    if (!key_char_ok(c)) c = '_';
  }
  std::string out;
  for (auto part : split(chars, '/')) {
    if (part.empty()) continue;
    if (part == ".") part = "_";
    if (part == "..") part = "__";
    out += (out.empty() ? "" : "/") + part;
  }
  if (out.empty()) out = "_";
  if (out.size() > kMaxKeyLength) {
    out = out.substr(0, kMaxKeyLength - 9);
    while (!out.empty() && out.back() == '/') out.pop_back();
    out += "-" + hex8(fnv1a(key));
  }
  return out;
}

std::string metric_value_json(double v) {
  if (std::isnan(v)) return "\"NaN\"";
  if (std::isinf(v)) return v > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

namespace {

json metric_json(const Metric& m) {
  json j;
  j["key"] = m.key;
  if (std::isnan(m.value)) {
    j["value"] = "NaN";
  } else if (std::isinf(m.value)) {
    j["value"] = m.value > 0 ? "Infinity" : "-Infinity";
  } else {
    j["value"] = m.value;
  }
  j["timestamp"] = m.timestamp_ms;
  j["step"] = m.step;
  return j;
}

json key_values_json(const std::vector<KeyValue>& kvs) {
  json a = json::array();
  for (const auto& kv : kvs) a.push_back({{"key", kv.key}, {"value", kv.value}});
  return a;
}

RunInfo run_info_from_json(const json& info) {
  RunInfo r;
  r.run_id = info.value("run_id", info.value("run_uuid", std::string()));
  r.experiment_id = info.value("experiment_id", std::string());
  r.artifact_uri = info.value("artifact_uri", std::string());
  r.status = info.value("status", std::string());
  if (info.contains("end_time")) {
    const auto& e = info["end_time"];
    r.end_time = e.is_string() ? std::stoll(e.get<std::string>()) : e.is_number() ? e.get<std::int64_t>() : 0;
  }
  return r;
}

// ---- REST ------------------------------------------------------------------------------

void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::size_t append_body(char* data, std::size_t size, std::size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

struct Response {
  long code = 0;
  std::string body;
  std::string retry_after;
};

std::size_t read_header(char* data, std::size_t size, std::size_t n, void* out) {
  std::string line(data, size * n);
  const std::string name = "retry-after:";
  if (line.size() > name.size()) {
    std::string lower = line.substr(0, name.size());
    for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower == name) {
      std::string v = line.substr(name.size());
      while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.pop_back();
      while (!v.empty() && v.front() == ' ') v.erase(0, 1);
      static_cast<Response*>(out)->retry_after = v;
    }
  }
  return size * n;
}

int progress_abort(void* p, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto* abort = static_cast<const std::function<bool()>*>(p);
  return (*abort && (*abort)()) ? 1 : 0;
}

std::string url_encode(CURL* curl, const std::string& s) {
  char* e = curl_easy_escape(curl, s.c_str(), static_cast<int>(s.size()));
  std::string out = e ? e : "";
  curl_free(e);
  return out;
}

class RestBackend final : public Backend {
 public:
  RestBackend(std::string uri, Credentials cred, HttpOptions http)
      : uri_(std::move(uri)), cred_(std::move(cred)), http_(std::move(http)) {
    curl_init_once();
    curl_ = curl_easy_init();
    if (!curl_) throw std::runtime_error("libcurl: curl_easy_init failed");
    base_ = uri_;
    while (!base_.empty() && base_.back() == '/') base_.pop_back();
  }
  ~RestBackend() override {
    if (curl_) curl_easy_cleanup(curl_);
  }

  std::string uri() const override { return uri_; }

  std::string experiment_id(const std::string& name) override {
    for (int attempt = 0; attempt < 2; ++attempt) {
      const Response r = get("/api/2.0/mlflow/experiments/get-by-name?experiment_name=" + url_encode(curl_, name));
      if (r.code == 200) {
        const json j = parse(r, "experiments/get-by-name");
        const auto& e = j.at("experiment");
        if (e.value("lifecycle_stage", "active") != "active") {
          throw RejectedError("MLflow experiment '" + name + "' is deleted on " + uri_ +
                              "; restore it (`mlflow experiments restore`) or choose another name");
        }
        return e.at("experiment_id").get<std::string>();
      }
      if (r.code != 404) check(r, "experiments/get-by-name");
      const Response c = post("/api/2.0/mlflow/experiments/create", json{{"name", name}});
      if (c.code == 200) return parse(c, "experiments/create").at("experiment_id").get<std::string>();
      // Created meanwhile by another run: look it up again.
      if (c.code == 400 && error_code(c) == "RESOURCE_ALREADY_EXISTS") continue;
      check(c, "experiments/create");
    }
    throw TransientError("MLflow experiment '" + name + "' could neither be found nor created on " + uri_);
  }

  RunInfo create_run(const std::string& experiment_id, const std::string& run_name, const std::string& user,
                     std::int64_t start_ms, const std::vector<KeyValue>& tags) override {
    json body{{"experiment_id", experiment_id}, {"start_time", start_ms}, {"tags", key_values_json(tags)}};
    if (!run_name.empty()) body["run_name"] = run_name;
    if (!user.empty()) body["user_id"] = user;
    const Response r = post("/api/2.0/mlflow/runs/create", body);
    check(r, "runs/create");
    return run_info_from_json(parse(r, "runs/create").at("run").at("info"));
  }

  RunInfo get_run(const std::string& run_id) override {
    const Response r = get("/api/2.0/mlflow/runs/get?run_id=" + url_encode(curl_, run_id));
    check(r, "runs/get");
    return run_info_from_json(parse(r, "runs/get").at("run").at("info"));
  }

  RunInfo find_run_by_tag(const std::string& experiment_id, const std::string& key, const std::string& value) override {
    std::string quoted;
    for (char c : value) quoted += (c == '\'') ? std::string("\\'") : std::string(1, c);
    const json body{{"experiment_ids", json::array({experiment_id})},
                    {"filter", "tags.`" + key + "` = '" + quoted + "'"},
                    {"run_view_type", "ALL"},
                    {"max_results", 1}};
    const Response r = post("/api/2.0/mlflow/runs/search", body);
    check(r, "runs/search");
    const json j = parse(r, "runs/search");
    if (!j.contains("runs") || j["runs"].empty()) return {};
    return run_info_from_json(j["runs"][0].at("info"));
  }

  void log_batch(const std::string& run_id, const std::vector<Metric>& metrics, const std::vector<KeyValue>& params,
                 const std::vector<KeyValue>& tags) override {
    json body{{"run_id", run_id}};
    json ms = json::array();
    for (const auto& m : metrics) ms.push_back(metric_json(m));
    body["metrics"] = std::move(ms);
    body["params"] = key_values_json(params);
    body["tags"] = key_values_json(tags);
    check(post("/api/2.0/mlflow/runs/log-batch", body), "runs/log-batch");
  }

  void update_run(const std::string& run_id, const std::string& status, std::int64_t end_ms) override {
    json body{{"run_id", run_id}, {"status", status}};
    if (end_ms > 0) body["end_time"] = end_ms;
    check(post("/api/2.0/mlflow/runs/update", body), "runs/update");
  }

  void log_artifact(const RunInfo& run, const std::string& local_path, const std::string& artifact_path) override {
    // Served artifacts: mlflow-artifacts:/<experiment>/<run>/artifacts (or mlflow-artifacts://host/...).
    const std::string scheme = "mlflow-artifacts:";
    if (run.artifact_uri.rfind(scheme, 0) != 0) {
      throw RejectedError("the run's artifact location " + run.artifact_uri +
                          " is not served by the tracking server (start it with artifact serving, the default, "
                          "e.g. --artifacts-destination); " + local_path + " stays in the run directory");
    }
    std::string path = run.artifact_uri.substr(scheme.size());
    if (path.rfind("//", 0) == 0) {
      const auto slash = path.find('/', 2);
      path = slash == std::string::npos ? std::string() : path.substr(slash);
    }
    while (!path.empty() && path.front() == '/') path.erase(0, 1);
    std::string encoded;
    for (const auto& part : split(path + "/" + artifact_path, '/')) {
      if (!part.empty()) encoded += "/" + url_encode(curl_, part);
    }
    std::FILE* f = std::fopen(local_path.c_str(), "rb");
    if (!f) throw RejectedError("cannot read artifact " + local_path);
    std::error_code ec;
    const auto size = fs::file_size(local_path, ec);
    Response r;
    try {
      r = perform("PUT", "/api/2.0/mlflow-artifacts/artifacts" + encoded, nullptr, f, ec ? 0 : size);
    } catch (...) {
      std::fclose(f);
      throw;
    }
    std::fclose(f);
    check(r, "mlflow-artifacts upload of " + artifact_path);
  }

 private:
  std::string uri_, base_;
  Credentials cred_;
  HttpOptions http_;
  CURL* curl_ = nullptr;

  Response get(const std::string& path) { return perform("GET", path, nullptr, nullptr, 0); }
  Response post(const std::string& path, const json& body) {
    const std::string text = body.dump(-1, ' ', false, json::error_handler_t::replace);
    return perform("POST", path, &text, nullptr, 0);
  }

  Response perform(const std::string& method, const std::string& path, const std::string* body, std::FILE* upload,
                   std::uint64_t upload_size) {
    CURL* c = curl_;
    curl_easy_reset(c);
    Response r;
    const std::string url = base_ + path;
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(http_.connect_timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, append_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r.body);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, read_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, progress_abort);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &http_.abort);
    curl_slist* headers = nullptr;
    headers = curl_slist_append(headers, "Accept: application/json");
    if (!cred_.token.empty()) {
      headers = curl_slist_append(headers, ("Authorization: Bearer " + cred_.token).c_str());
    } else if (!cred_.username.empty()) {
      curl_easy_setopt(c, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
      curl_easy_setopt(c, CURLOPT_USERNAME, cred_.username.c_str());
      curl_easy_setopt(c, CURLOPT_PASSWORD, cred_.password.c_str());
    }
    if (upload) {
      // Large checkpoints: no overall timeout, but a stalled transfer (under 1 byte/s for the
      // request timeout) is abandoned.
      curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(c, CURLOPT_READDATA, upload);
      curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(upload_size));
      curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
      curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, static_cast<long>(http_.request_timeout_s));
      headers = curl_slist_append(headers, "Content-Type: application/octet-stream");
    } else {
      curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(http_.request_timeout_s * 1000));
      if (body) {
        headers = curl_slist_append(headers, "Content-Type: application/json");
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body->c_str());
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body->size()));
      }
      if (method == "GET") curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    const CURLcode rc = curl_easy_perform(c);
    curl_slist_free_all(headers);
    if (rc != CURLE_OK) {
      throw TransientError(method + " " + url + ": " + curl_easy_strerror(rc));
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.code);
    return r;
  }

  static std::string error_code(const Response& r) {
    const json j = json::parse(r.body, nullptr, false);
    return j.is_object() ? j.value("error_code", std::string()) : std::string();
  }

  void check(const Response& r, const std::string& what) const {
    if (r.code >= 200 && r.code < 300) return;
    const json j = json::parse(r.body, nullptr, false);
    std::string message = j.is_object() ? j.value("message", std::string()) : std::string();
    if (message.empty()) message = r.body.substr(0, 300);
    const std::string text = what + " on " + uri_ + ": HTTP " + std::to_string(r.code) +
                             (message.empty() ? "" : ": " + message) +
                             (r.retry_after.empty() ? "" : " (Retry-After " + r.retry_after + ")");
    if (r.code == 401 || r.code == 403) {
      throw TransientError(text + " (check MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD)");
    }
    if (r.code == 408 || r.code == 429 || r.code >= 500 || r.code < 200) throw TransientError(text);
    throw RejectedError(text);
  }

  json parse(const Response& r, const std::string& what) const {
    json j = json::parse(r.body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      throw TransientError(what + " on " + uri_ + ": the answer is not JSON: " + r.body.substr(0, 200));
    }
    return j;
  }
};

// ---- file store ------------------------------------------------------------------------

std::string yaml_quote(const std::string& s) {
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

/// Writes `text` to `p` through a temporary file and a rename: readers see the old or the new
/// file, never half of one.
void write_atomically(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw RejectedError("cannot write " + tmp.string());
  }
  fs::rename(tmp, p);
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
    const fs::path exp = root_ / experiment_id;
    if (!fs::exists(exp / "meta.yaml")) {
      throw RejectedError("no MLflow experiment " + experiment_id + " in " + root_.string());
    }
    RunInfo r;
    r.run_id = random_hex(32);
    r.experiment_id = experiment_id;
    r.artifact_uri = file_uri(exp / r.run_id / "artifacts");
    r.status = "RUNNING";
    const fs::path dir = exp / r.run_id;
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
    const fs::path dir = run_dir(run_id);
    for (const auto& p : params) {
      const fs::path f = dir / "params" / p.key;
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
    const fs::path dest = run_dir(run.run_id) / "artifacts" / artifact_path;
    fs::create_directories(dest.parent_path());
    const fs::path tmp = dest.string() + ".tmp";
    std::error_code ec;
    fs::copy_file(local_path, tmp, fs::copy_options::overwrite_existing, ec);
    if (ec) throw RejectedError("cannot copy artifact " + local_path + " to " + dest.string() + ": " + ec.message());
    fs::rename(tmp, dest);
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
    fs::create_directories(f.parent_path());
    std::FILE* out = std::fopen(f.c_str(), "ab");
    if (!out) throw RejectedError("cannot append to " + f.string());
    files_[f.string()] = out;
    return out;
  }
  void close_files() {
    for (auto& [path, f] : files_) std::fclose(f);
    files_.clear();
  }

  static std::string file_uri(const fs::path& p) { return "file://" + p.string(); }

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
    if (auto it = run_dirs_.find(run_id); it != run_dirs_.end() && fs::exists(it->second)) return it->second;
    if (fs::exists(root_)) {
      for (const auto& entry : fs::directory_iterator(root_)) {
        const fs::path d = entry.path() / run_id;
        if (entry.is_directory() && fs::exists(d / "meta.yaml")) return run_dirs_[run_id] = d;
      }
    }
    throw RejectedError("no MLflow run " + run_id + " in " + root_.string());
  }

  static void write_run_meta(const fs::path& dir, const Meta& m) {
    // run_uuid beside run_id: MLflow 2.x requires it, 3.x ignores it.
    std::string y = "artifact_uri: " + m.info.artifact_uri + "\n";
    y += "end_time: " + (m.end_ms > 0 ? std::to_string(m.end_ms) : std::string("null")) + "\n";
    y += "entry_point_name: ''\nexperiment_id: '" + m.info.experiment_id + "'\nlifecycle_stage: active\n";
    y += "run_id: " + m.info.run_id + "\nrun_name: " + yaml_quote(m.run_name) + "\nrun_uuid: " + m.info.run_id + "\n";
    y += "source_name: ''\nsource_type: 4\nsource_version: ''\nstart_time: " + std::to_string(m.start_ms) + "\n";
    y += "status: " + std::to_string(status_number(m.info.status)) + "\ntags: []\nuser_id: " + yaml_quote(m.user) +
         "\n";
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

std::unique_ptr<Backend> open_backend(const std::string& tracking_uri, const Credentials& credentials,
                                      HttpOptions http) {
  if (tracking_uri.rfind("http://", 0) == 0 || tracking_uri.rfind("https://", 0) == 0) {
    return std::make_unique<RestBackend>(tracking_uri, credentials, std::move(http));
  }
  if (tracking_uri.rfind("file:", 0) == 0) {
    std::string path = tracking_uri.substr(5);
    if (path.rfind("//", 0) == 0) {
      path = path.substr(2);
      if (!path.empty() && path.front() != '/') {
        throw std::invalid_argument("tracking URI '" + tracking_uri +
                                    "': a file URI with a host is not supported; use file:./mlruns or "
                                    "file:///absolute/path");
      }
    }
    if (path.empty()) throw std::invalid_argument("tracking URI '" + tracking_uri + "' names no directory");
    return std::make_unique<FileBackend>(tracking_uri, fs::path(path));
  }
  throw std::invalid_argument("tracking URI '" + tracking_uri +
                              "' is not supported: use http://host:port or https://... (an MLflow tracking "
                              "server) or file:./mlruns (MLflow's file store)");
}

RunInfo start_run(Backend& backend, const std::string& experiment, const std::string& run_name,
                  const std::string& parent_run_id, std::vector<KeyValue> tags) {
  const std::string exp = backend.experiment_id(experiment);
  tags.push_back({"mlflow.runName", run_name});
  tags.push_back({"mlflow.user", current_user()});
  tags.push_back({"mlflow.source.type", "LOCAL"});
  if (!parent_run_id.empty()) tags.push_back({"mlflow.parentRunId", parent_run_id});
  return backend.create_run(exp, run_name, current_user(), now_ms(), tags);
}

void end_run(Backend& backend, const std::string& run_id, const std::string& status) {
  backend.update_run(run_id, status, now_ms());
}

}  // namespace trainer::mlflow
