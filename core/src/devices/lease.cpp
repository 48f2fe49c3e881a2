#include "trainer/lease.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "trainer/error.h"
#include "util/local_time.h"

namespace fs = std::filesystem;

namespace trainer {

namespace {

std::string sanitize(const std::string& key) {
  std::string s = key;
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.' && c != '_') c = '_';
  }
  TRAINER_CHECK(!s.empty(), "empty device lease key");
  return s;
}

bool alive(std::int64_t pid) {
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

LeaseHolder read_holder(const fs::path& file) {
  LeaseHolder h;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    if (k == "pid")
      h.pid = std::atoll(v.c_str());
    else if (k == "host")
      h.host = v;
    else if (k == "shared")
      h.shared = v == "1";
    else if (k == "since")
      h.since = v;
    else if (k == "note")
      h.note = v;
  }
  return h;
}

/// Holder files of `key` in `dir`, with their parsed content.
std::vector<std::pair<fs::path, LeaseHolder>> holder_files(const std::string& dir, const std::string& key) {
  std::vector<std::pair<fs::path, LeaseHolder>> out;
  std::error_code ec;
  const std::string prefix = key + ".";
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || e.path().extension() != ".holder") continue;
    out.emplace_back(e.path(), read_holder(e.path()));
  }
  return out;
}

void ensure_dir(const std::string& dir) {
  std::error_code ec;
  if (fs::is_directory(dir, ec)) return;
  fs::create_directories(dir, ec);
  TRAINER_CHECK(!ec || fs::is_directory(dir), "cannot create the device lease directory ", dir, ": ", ec.message());
  // Host-wide: every user's jobs take leases here (sticky, like /tmp).
  ::chmod(dir.c_str(), 01777);
}

}  // namespace

std::string LeaseHolder::describe() const {
  std::ostringstream os;
  os << "pid " << pid << " (" << (shared ? "shared" : "exclusive");
  if (!since.empty()) os << ", since " << since;
  if (!note.empty()) os << ", " << note;
  os << ")";
  return os.str();
}

std::string DeviceLease::default_dir() {
  const char* v = std::getenv("TRAINER_LEASE_DIR");
  return v && *v ? v : "/tmp/trainer-leases";
}

std::vector<LeaseHolder> DeviceLease::holders(const std::string& dir, const std::string& key) {
  std::vector<LeaseHolder> out;
  for (auto& [path, h] : holder_files(dir, sanitize(key))) {
    if (alive(h.pid)) out.push_back(h);
  }
  return out;
}

std::unique_ptr<DeviceLease> DeviceLease::try_acquire(const std::string& dir, const std::string& key, bool shared,
                                                      const std::string& note, std::vector<LeaseHolder>* holders,
                                                      std::vector<LeaseHolder>* reclaimed) {
  ensure_dir(dir);
  const std::string k = sanitize(key);
  const std::string lock_path = (fs::path(dir) / (k + ".lock")).string();
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  TRAINER_CHECK(fd >= 0, "cannot open the device lease ", lock_path, ": ", std::strerror(errno));
  ::fchmod(fd, 0666);  // other users' jobs lock it too (ignored when not ours)
  if (::flock(fd, (shared ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    TRAINER_CHECK(err == EWOULDBLOCK, "cannot lock the device lease ", lock_path, ": ", std::strerror(err));
    if (holders) *holders = DeviceLease::holders(dir, k);
    return nullptr;
  }
  // Holder files of processes that no longer hold the lock are stale. Holding it
  // exclusively proves every other holder file stale (even if its pid was reused).
  const auto self = static_cast<std::int64_t>(::getpid());
  for (auto& [path, h] : holder_files(dir, k)) {
    if (h.pid == self) continue;
    if (!shared || !alive(h.pid)) {
      std::error_code ec;
      fs::remove(path, ec);
      if (!ec && reclaimed) reclaimed->push_back(h);
    }
  }
  std::unique_ptr<DeviceLease> lease(new DeviceLease());
  lease->fd_ = fd;
  lease->shared_ = shared;
  lease->key_ = k;
  lease->lock_path_ = lock_path;
  lease->holder_path_ = (fs::path(dir) / (k + "." + std::to_string(self) + ".holder")).string();
  {
    const std::string tmp = lease->holder_path_ + ".tmp";
    std::ofstream out(tmp, std::ios::trunc);
    out << "pid=" << self << "\nhost=" << hostname() << "\nshared=" << (shared ? 1 : 0)
        << "\nsince=" << detail::local_time("%Y-%m-%d %H:%M:%S") << "\nnote=" << note << "\n";
    out.close();
    // Best effort: the flock is the lease; the holder file only describes it to others.
    std::error_code ec;
    fs::rename(tmp, lease->holder_path_, ec);
    ::chmod(lease->holder_path_.c_str(), 0644);
  }
  return lease;
}

void DeviceLease::release() {
  if (fd_ < 0) return;
  std::error_code ec;
  fs::remove(holder_path_, ec);
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
  fd_ = -1;
}

DeviceLease::~DeviceLease() { release(); }

}  // namespace trainer
