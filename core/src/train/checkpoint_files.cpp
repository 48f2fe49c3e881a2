#include "train/checkpoint_files.h"

#include <fmt/format.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
  std::error_code ec;
  if (!fs::is_regular_file(sum_file, ec)) return std::nullopt;  // not a FIFO that blocks the read
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

void write_checkpoint_file(const std::string& file, const std::function<void(std::ostream& out)>& save) {
  // The temporary is created new (never a file or link found at its name: a run directory may
  // come from someone else); its digest is counted as it is written, not read back by name.
  const auto [tmp, digest] = detail::write_temporary_digested(file, save);
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

void point_best(const std::string& dir, const std::string& name) {
  detail::write_atomic((fs::path(dir) / "best").string(), name + "\n");
}

void write_score(const std::string& file, const std::string& monitor, double score) {
  detail::write_atomic(file + ".score", fmt::format("{} {:.17g}\n", monitor, score));
}

std::optional<double> read_score(const std::string& file, const std::string& monitor) {
  std::error_code ec;
  if (!fs::is_regular_file(file + ".score", ec)) return std::nullopt;  // not a FIFO that blocks the read
  std::ifstream in(file + ".score", std::ios::binary);
  if (!in) return std::nullopt;
  char text[512];
  in.read(text, sizeof text);
  const std::string line(text, std::size_t(in.gcount()));
  const auto space = line.rfind(' ');
  if (space == std::string::npos || line.compare(0, space, monitor) != 0 || space != monitor.size()) {
    return std::nullopt;
  }
  const std::string number = line.substr(space + 1);
  char* end = nullptr;
  const double v = std::strtod(number.c_str(), &end);
  if (end == number.c_str() || (*end != '\n' && *end != '\0') || !std::isfinite(v)) return std::nullopt;
  return v;
}

void remove_checkpoint(const std::string& file) {
  std::error_code ec;
  fs::remove(file, ec);
  fs::remove(file + ".sum", ec);
  fs::remove(file + ".score", ec);
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

namespace {

/// The `step_<N>.pt` files of `dir`, by step.
std::vector<std::pair<std::int64_t, fs::path>> step_files(const fs::path& dir) {
  std::vector<std::pair<std::int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::int64_t step = step_of(e.path().filename().string());
    if (step >= 0 && e.is_regular_file(ec)) out.emplace_back(step, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

bool holds_checkpoints(const std::string& run_dir) {
  const fs::path dir = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  return fs::exists(dir / "latest", ec) || !step_files(dir).empty();
}

std::vector<std::string> adopt_checkpoints(const std::string& dir, const std::string& file, std::string& moved) {
  moved.clear();
  const std::string name = fs::path(file).filename().string();
  const std::int64_t step = step_of(name);
  std::error_code ec;
  if (step < 0 || !fs::equivalent(fs::path(file).parent_path(), dir, ec)) return {};
  std::vector<std::string> kept, later;
  for (const auto& [s, path] : step_files(dir)) (s > step ? later : kept).push_back(path.string());
  point_latest(dir, name);  // first: `latest` never names a file already moved
  if (!later.empty()) {
    const std::string base = (fs::path(dir) / ("superseded_after_step_" + std::to_string(step))).string();
    std::string to = base;
    // A name nothing is at (not even a link): the folder is made here, this run's own.
    for (int k = 2; fs::exists(fs::symlink_status(to, ec)); ++k) to = base + "-" + std::to_string(k);
    make_run_subdir(to);
    for (const auto& f : later) {
      const fs::path target = fs::path(to) / fs::path(f).filename();
      fs::rename(f, target, ec);
      TRAINER_CHECK(!ec, "cannot move ", f, " to ", to, ": ", ec.message());
      for (const char* side : {".sum", ".score"}) {
        if (!fs::exists(f + side, ec)) continue;
        fs::rename(f + side, target.string() + side, ec);
        TRAINER_CHECK(!ec, "cannot move ", f, side, " to ", to, ": ", ec.message());
      }
      moved += (moved.empty() ? "" : ", ") + fs::path(f).filename().string();
    }
    moved += " to " + to;
  }
  return kept;
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
  std::string latest;  // its first line; a checkpoint name is short (and a FIFO is not read)
  if (fs::is_regular_file(dir / "latest", ec)) {
    std::ifstream in(dir / "latest", std::ios::binary);
    char text[64];
    in.read(text, sizeof text);
    latest.assign(text, std::size_t(in.gcount()));
    latest = latest.substr(0, latest.find('\n'));
  }
  if (!latest.empty()) {
    // `latest` names a file beside it, as the checkpointer writes it: a run directory from
    // elsewhere must not send the resume (and the MLflow run it continues) to another directory.
    TRAINER_CHECK_T(UsageError, step_of(latest) >= 0, setting, " ", path, ": ", (dir / "latest").string(), " names '",
                    latest, "', not a step_<N>.pt file beside it; resume from a checkpoint file instead");
    out.files.push_back((dir / latest).string());
  }
  const auto steps = step_files(dir);
  for (auto s = steps.rbegin(); s != steps.rend(); ++s) {
    if (s->second.filename() != latest) out.files.push_back(s->second.string());
  }
  TRAINER_CHECK_T(UsageError, !out.files.empty(), setting, " ", path, ": no checkpoints/latest and no step_<N>.pt in ",
                  dir.string());
  return out;
}

}  // namespace trainer
