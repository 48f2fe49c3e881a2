#include "train/run_dir.h"

#include <filesystem>

#include "trainer/error.h"
#include "trainer/metrics.h"
#include "util/local_time.h"

namespace fs = std::filesystem;

namespace trainer {

std::string RunDir::path_for(const RunSettings& run, const std::string& explicit_dir) {
  if (!explicit_dir.empty()) {
    std::string p = explicit_dir;
    while (p.size() > 1 && p.back() == '/') p.pop_back();  // `out/` names `out`: no `out//checkpoints`
    return p;
  }
  const fs::path base = fs::path(run.dir) / (run.name + "-" + detail::local_time("%Y%m%d-%H%M%S"));
  fs::path p = base;
  for (int i = 1; fs::exists(p); ++i) p = base.string() + "-" + std::to_string(i);
  return p.string();
}

RunDir::RunDir(std::string path) : path_(std::move(path)) {
  std::error_code ec;
  fs::create_directories(fs::path(path_) / "checkpoints", ec);
  TRAINER_CHECK_T(UsageError, !ec, "cannot create run directory ", path_, ": ", ec.message());
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
