#pragma once
// Private to the MLflow client: the backends open_backend() makes, and what they share.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "mlflow_client.h"

namespace trainer::mlflow::detail {

/// MLflow's REST API at `uri` (http:// or https://).
std::unique_ptr<Backend> make_rest_backend(const std::string& uri, const Credentials& credentials, HttpOptions http);
/// MLflow's file store rooted at `root` (relative to the working directory, or absolute).
std::unique_ptr<Backend> make_file_backend(const std::string& uri, const std::string& root);
/// Whether `path` is `base` or lies under it, comparing whole components (both already
/// canonical: symlinks resolved, no `.` or `..`).
bool is_within(const std::filesystem::path& path, const std::filesystem::path& base);
/// `s` cut at each `sep` (empty parts kept).
std::vector<std::string> split(const std::string& s, char sep);

}  // namespace trainer::mlflow::detail
