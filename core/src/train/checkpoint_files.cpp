#include "train/checkpoint_files.h"

#include <fmt/format.h>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "model/zip_archive.h"
#include "trainer/error.h"
#include "trainer/run_records.h"
#include "util/durable_file.h"

namespace fs = std::filesystem;

namespace trainer {

namespace {

/// The digest beside a checkpoint; nullopt when it cannot be read or is not one. Its first 128
/// bytes at most: the file may come from someone else.
std::optional<CheckpointDigest> read_digest(const std::string& sum_file) {
  std::ifstream in(sum_file, std::ios::binary);
  if (!in) return std::nullopt;
  char text[128];
  in.read(text, sizeof text);
  return decode_digest(std::string_view(text, std::size_t(in.gcount())));
}

/// The step of `step_<N>.pt`, or -1 for other names.
std::int64_t step_of(const std::string& name) {
  if (name.size() > 24) return -1;  // step_ + at most 16 digits + .pt: sscanf stays in range
  long long step = -1;
  int used = 0;
  if (std::sscanf(name.c_str(), "step_%lld.pt%n", &step, &used) != 1) return -1;
  return static_cast<std::size_t>(used) == name.size() ? step : -1;
}

}  // namespace

std::string checkpoint_name(std::int64_t global_step) {
  char name[64];
  std::snprintf(name, sizeof name, "step_%08lld.pt", static_cast<long long>(global_step));
  return name;
}

void write_checkpoint_file(const std::string& file, const std::function<void(const std::string& tmp)>& save) {
  const std::string tmp = file + ".tmp";
  detail::FileDigest digest;
  try {
    save(tmp);
    digest = detail::digest_of(tmp);
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
  // A digest never sits beside a file it does not describe: an older one of this name goes
  // first, the new one comes once the file is in place. After a crash in between, the file
  // has no digest and is judged by loading it.
  std::error_code ec;
  fs::remove(file + ".sum", ec);
  detail::publish(tmp, file);  // removes tmp when it fails
  detail::write_atomic(file + ".sum", encode_digest(digest));
}

void point_latest(const std::string& dir, const std::string& name) {
  detail::write_atomic((fs::path(dir) / "latest").string(), name + "\n");
}

void remove_checkpoint(const std::string& file) {
  std::error_code ec;
  fs::remove(file, ec);
  fs::remove(file + ".sum", ec);
}

std::optional<std::string> checkpoint_problem(const std::string& file) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return std::string("the file does not exist");
  const auto size = fs::file_size(file, ec);
  if (ec || size == 0) return std::string("the file is empty");
  if (!fs::exists(file + ".sum")) return detail::archive_problem(file);
  const auto expected = read_digest(file + ".sum");
  if (!expected) return "its digest " + file + ".sum cannot be read";
  const detail::FileDigest actual = detail::digest_of(file);
  if (actual.size != expected->size) {
    return fmt::format("it has {} bytes, its digest says {} (truncated?)", actual.size, expected->size);
  }
  if (actual.crc32 != expected->crc32) return std::string("its CRC-32 differs from its digest (damaged)");
  // A digest beside it says the file arrived whole, not who wrote it: a run directory may come
  // from someone else.
  return detail::archive_problem(file);
}

ResumeCandidates resume_candidates(const std::string& path, const std::string& setting) {
  ResumeCandidates out;
  const fs::path p(path);
  std::error_code ec;
  if (!fs::is_directory(p, ec)) {
    TRAINER_CHECK_T(UsageError, fs::exists(p, ec), setting, ": checkpoint ", path, " not found");
    out.files.push_back(path);
    out.explicit_file = true;
    return out;
  }
  const fs::path dir = fs::is_directory(p / "checkpoints") ? p / "checkpoints" : p;
  std::ifstream in(dir / "latest");
  std::string latest;
  if (in && std::getline(in, latest) && !latest.empty()) {
    // `latest` names a file beside it, as the checkpointer writes it: a run directory from
    // elsewhere must not send the resume (and the MLflow run it continues) to another directory.
    TRAINER_CHECK_T(UsageError, step_of(latest) >= 0, setting, " ", path, ": ", (dir / "latest").string(), " names '",
                    latest, "', not a step_<N>.pt file beside it; resume from a checkpoint file instead");
    out.files.push_back((dir / latest).string());
  }
  std::vector<std::pair<std::int64_t, std::string>> steps;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (step_of(name) >= 0 && name != latest) steps.emplace_back(step_of(name), e.path().string());
  }
  std::sort(steps.rbegin(), steps.rend());
  for (const auto& s : steps) out.files.push_back(s.second);
  TRAINER_CHECK_T(UsageError, !out.files.empty(), setting, " ", path, ": no checkpoints/latest and no step_<N>.pt in ",
                  dir.string());
  return out;
}

}  // namespace trainer
