#include "train/run_dir.h"

#include <filesystem>

#include "trainer/error.h"
#include "trainer/metrics.h"
#include "trainer/trainer.h"
#include "util/local_time.h"

namespace fs = std::filesystem;

namespace trainer {

std::string run_dir_of_resume(const std::string& resume) {
  if (resume.empty()) return {};
  fs::path p = fs::path(resume).lexically_normal();
  if (p.has_filename() == false) p = p.parent_path();  // `run/` names `run`
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    // A run directory has its checkpoints/; a folder of checkpoints from elsewhere is none.
    if (fs::is_directory(p / "checkpoints", ec)) return p.string();
    if (p.filename() != "checkpoints") return {};
    p = p.parent_path();
    return p.empty() ? std::string(".") : p.string();
  }
  const fs::path dir = p.parent_path();
  if (dir.filename() != "checkpoints") return {};
  const fs::path run = dir.parent_path();
  return run.empty() ? std::string(".") : run.string();
}

std::string RunDir::path_for(const RunSettings& run, const std::string& explicit_dir, bool claim) {
  if (!explicit_dir.empty()) {
    std::string p = explicit_dir;
    while (p.size() > 1 && p.back() == '/') p.pop_back();  // `out/` names `out`: no `out//checkpoints`
    return p;
  }
  const fs::path base = fs::path(run.dir) / (run.name + "-" + detail::local_time("%Y%m%d-%H%M%S"));
  std::error_code ec;
  if (claim) {
    fs::create_directories(run.dir, ec);
    TRAINER_CHECK_T(UsageError, !ec, "cannot create run.dir ", run.dir, ": ", ec.message());
  }
  fs::path p = base;
  // Claimed by creating it: of two runs that pick the same name in the same second, the second
  // gets the next name (create_directory says whether it made the directory).
  for (int i = 1; claim ? !fs::create_directory(p, ec) : fs::exists(p, ec); ++i) {
    TRAINER_CHECK_T(UsageError, !ec, "cannot create run directory ", p.string(), ": ", ec.message());
    p = base.string() + "-" + std::to_string(i);
  }
  TRAINER_CHECK_T(UsageError, !ec, "cannot create run directory ", p.string(), ": ", ec.message());
  return p.string();
}

RunDir::RunDir(std::string path) : path_(std::move(path)) {
  std::error_code ec;
  fs::create_directories(path_, ec);
  TRAINER_CHECK_T(UsageError, !ec, "cannot create run directory ", path_, ": ", ec.message());
  // The folders the core writes in must be its own: a link planted there (a run directory from
  // elsewhere, or one another user can write in) would take checkpoints or snapshots outside.
  make_run_subdir(checkpoints());
  const std::string memory = path_ + "/memory";
  if (fs::exists(fs::symlink_status(memory, ec))) make_run_subdir(memory);
}

bool RunDir::remove_if_only_core_files() const {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path_, ec)) {
    const std::string name = e.path().filename().string();
    if (name == "trainer.log" || name == "config.toml" || name == "status.json") continue;
    if (name == "metrics.jsonl" && e.is_regular_file(ec) && fs::file_size(e.path(), ec) == 0 && !ec) continue;
    if (name == "checkpoints" && e.is_directory(ec) && fs::is_empty(e.path(), ec) && !ec) continue;
    return false;
  }
  if (ec) return false;
  fs::remove_all(path_, ec);
  return !ec;
}

std::string RunDir::write_status(RunStatusRecord s) const {
  try {
    s.time = wall_time_s();
    const std::string text = encode_status(s);
    write_atomic(path_ + "/status.json", text);
    return {};
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace trainer
