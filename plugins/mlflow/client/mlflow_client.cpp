#include "mlflow_client.h"

#include "backends.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iterator>

#include "trainer/secrets.h"

namespace fs = std::filesystem;

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

}  // namespace

namespace detail {

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

bool is_within(const fs::path& path, const fs::path& base) {
  auto p = path.begin();
  for (auto b = base.begin(); b != base.end(); ++b, ++p) {
    if (b->empty() && std::next(b) == base.end()) break;  // a trailing "/" in base
    if (p == path.end() || *p != *b) return false;
  }
  return true;
}

}  // namespace detail

namespace {

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
  for (const auto& part : detail::split(key, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

bool valid_artifact_path(const std::string& path) {
  if (path.empty() || path.size() > kMaxArtifactPathLength || path.front() == '/') return false;
  for (char c : path) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '\\') return false;
  }
  for (const auto& part : detail::split(path, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

bool valid_id(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) {
      return false;
    }
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
  for (auto part : detail::split(chars, '/')) {
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

namespace {

/// `s` with its %XX escapes decoded (a URI's userinfo).
std::string percent_decoded(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) != 0 &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2])) != 0) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

/// The credentials for an http(s) `uri`: its userinfo ("user:password@"), when it has one, else
/// `given`.
Credentials credentials_for(const std::string& uri, const Credentials& given) {
  const std::size_t host = uri.find("://") + 3;
  const std::size_t end = uri.find_first_of("/?#", host);
  const std::string authority = uri.substr(host, end == std::string::npos ? std::string::npos : end - host);
  const std::size_t at = authority.rfind('@');
  if (at == std::string::npos) return given;
  const std::string userinfo = authority.substr(0, at);
  const std::size_t colon = userinfo.find(':');
  Credentials c;
  c.username = percent_decoded(userinfo.substr(0, colon));
  if (colon != std::string::npos) c.password = percent_decoded(userinfo.substr(colon + 1));
  return c;
}

}  // namespace

std::unique_ptr<Backend> open_backend(const std::string& tracking_uri, const Credentials& credentials,
                                      HttpOptions http) {
  if (tracking_uri.rfind("http://", 0) == 0 || tracking_uri.rfind("https://", 0) == 0) {
    // The backend knows the URI without its credentials (what it names in messages and records).
    return detail::make_rest_backend(trainer::without_userinfo(tracking_uri),
                                     credentials_for(tracking_uri, credentials), std::move(http));
  }
  if (tracking_uri.rfind("file:", 0) == 0) {
    std::string path = tracking_uri.substr(5);
    if (path.rfind("//", 0) == 0) {
      path = path.substr(2);
      if (!path.empty() && path.front() != '/') {
        throw std::invalid_argument("tracking URI '" + trainer::without_userinfo(tracking_uri) +
                                    "': a file URI with a host is not supported; use file:./mlruns or "
                                    "file:///absolute/path");
      }
    }
    if (path.empty()) throw std::invalid_argument("tracking URI '" + tracking_uri + "' names no directory");
    return detail::make_file_backend(tracking_uri, path);
  }
  throw std::invalid_argument("tracking URI '" + trainer::without_userinfo(tracking_uri) +
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
