// The REST backend: MLflow's tracking API under /api/2.0/mlflow and served artifacts under
// /api/2.0/mlflow-artifacts, with libcurl.
#include <curl/curl.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>

#include "backends.h"
#include "trainer/json.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace trainer::mlflow {

namespace {

using detail::split;

json metric_json(const Metric& m) {
  json j;
  j["key"] = m.key;
  if (const char* name = json_nonfinite_name(m.value)) {
    j["value"] = name;
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
  std::string url;  ///< what was asked
  std::string body;
  std::string retry_after;
  std::string location;  ///< a redirect's target
};

/// Whether `line` is the header `name` (lower case, with its colon); its value, trimmed, in `value`.
bool header_value(const std::string& line, const std::string& name, std::string& value) {
  if (line.size() <= name.size()) return false;
  std::string lower = line.substr(0, name.size());
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower != name) return false;
  std::string v = line.substr(name.size());
  while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.pop_back();
  while (!v.empty() && v.front() == ' ') v.erase(0, 1);
  value = v;
  return true;
}

std::size_t read_header(char* data, std::size_t size, std::size_t n, void* out) {
  const std::string line(data, size * n);
  auto* r = static_cast<Response*>(out);
  if (!header_value(line, "retry-after:", r->retry_after)) header_value(line, "location:", r->location);
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
    if (!valid_artifact_path(artifact_path)) {
      throw RejectedError("artifact path '" + artifact_path +
                          "' is not a relative path of parts other than empty, . and ..; not uploaded to " + uri_);
    }
    // Served artifacts: mlflow-artifacts:/<experiment>/<run>/artifacts (or mlflow-artifacts://host/...).
    const std::string scheme = "mlflow-artifacts:";
    if (run.artifact_uri.rfind(scheme, 0) != 0) {
      throw RejectedError("the run's artifact location " + run.artifact_uri +
                          " is not served by the tracking server (start it with artifact serving, the default, "
                          "e.g. --artifacts-destination); " +
                          local_path + " stays in the run directory");
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
    r.url = url;
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
      throw RefusedError(text + " (check MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD)");
    }
    if (r.code >= 300 && r.code < 400) {
      // Not followed: credentials would go along to wherever it points.
      std::string target = r.location;
      const auto api = target.find("/api/2.0/");
      if (api != std::string::npos) target = target.substr(0, api);
      throw RefusedError(what + " on " + uri_ + ": HTTP " + std::to_string(r.code) + " redirects " + r.url + " to " +
                         (r.location.empty() ? std::string("(no Location)") : r.location) +
                         "; redirects are not followed: use " +
                         (target.empty() ? std::string("the URI it points to") : target) +
                         " as the tracking URI (plugins.mlflow.tracking_uri, MLFLOW_TRACKING_URI or --tracking-uri)");
    }
    if (r.code == 404 && (!j.is_object() || !j.contains("error_code"))) {
      // MLflow's own 404 names an error_code (RESOURCE_DOES_NOT_EXIST); this came from elsewhere.
      throw RefusedError(text + "; that is not MLflow's answer: nothing serves MLflow's API at " + r.url +
                         ": is the tracking URI missing a path prefix (http://host/prefix)?");
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

}  // namespace

namespace detail {

std::unique_ptr<Backend> make_rest_backend(const std::string& uri, const Credentials& credentials, HttpOptions http) {
  return std::make_unique<RestBackend>(uri, credentials, std::move(http));
}

}  // namespace detail

}  // namespace trainer::mlflow
