#include "trainer/lease.h"

#include <fcntl.h>
#include <fmt/format.h>
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

/// Up to 4 KiB of `path`, not following a symbolic link ("" when it cannot be read).
std::string read_small_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return {};
  char buf[4096];
  const ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

LeaseHolder read_holder(const fs::path& file) {
  LeaseHolder h;
  std::istringstream in(read_small_file(file.string()));
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

/// Creates the lease directory (sticky and world-writable, like /tmp: every user's jobs take
/// leases there) or checks the one that exists.
void ensure_dir(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    TRAINER_CHECK(!ec || fs::is_directory(dir), "cannot create the device lease directory ", dir, ": ", ec.message());
    if (::lstat(dir.c_str(), &st) == 0 && st.st_uid == ::geteuid()) ::chmod(dir.c_str(), 01777);
    TRAINER_CHECK(::lstat(dir.c_str(), &st) == 0, "cannot read the device lease directory ", dir, ": ",
                  std::strerror(errno));
  }
  const std::string fix = " (set plugins.device_select.lease_dir or TRAINER_LEASE_DIR to a directory of your own)";
  TRAINER_CHECK(!S_ISLNK(st.st_mode), "the device lease directory ", dir,
                " is a symbolic link; refusing it, another user could point it anywhere", fix);
  TRAINER_CHECK(S_ISDIR(st.st_mode), "the device lease directory ", dir, " is not a directory", fix);
  TRAINER_CHECK(!(st.st_mode & (S_IWGRP | S_IWOTH)) || (st.st_mode & S_ISVTX) != 0, "the device lease directory ", dir,
                " is writable by others without the sticky bit (chmod +t it), so they could replace the lease files",
                fix);
}

/// Opens the lock file of a lease, never through a symbolic link.
int open_lock(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0 && errno == ELOOP) {
    throw Error(fmt::format("the device lease {} is a symbolic link; refusing it", path));
  }
  return fd;
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

LeaseState DeviceLease::probe(const std::string& dir, const std::string& key) {
  LeaseState st;
  ensure_dir(dir);
  const std::string k = sanitize(key);
  const std::string lock_path = (fs::path(dir) / (k + ".lock")).string();
  const int fd = open_lock(lock_path, O_RDONLY);
  if (fd < 0) return st;  // no lock file: nobody ever took this lease
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
    ::flock(fd, LOCK_UN);
  } else {
    st.held = true;
    st.exclusive = ::flock(fd, LOCK_SH | LOCK_NB) != 0;
    ::flock(fd, LOCK_UN);
    st.holders = holders(dir, k);
  }
  ::close(fd);
  return st;
}

std::unique_ptr<DeviceLease> DeviceLease::try_acquire(const std::string& dir, const std::string& key, bool shared,
                                                      const std::string& note, std::vector<LeaseHolder>* holders,
                                                      std::vector<LeaseHolder>* reclaimed) {
  ensure_dir(dir);
  const std::string k = sanitize(key);
  const std::string lock_path = (fs::path(dir) / (k + ".lock")).string();
  const int fd = open_lock(lock_path, O_RDWR | O_CREAT);
  TRAINER_CHECK(fd >= 0, "cannot open the device lease ", lock_path, ": ", std::strerror(errno));
  ::fchmod(fd, 0666);  // other users' jobs lock it too (ignored when not ours)
  // A few tries: another job's probe() holds a free lock for a moment.
  int locked = -1;
  for (int attempt = 0; attempt < 3 && locked != 0; ++attempt) {
    if (attempt > 0) ::usleep(5000);
    locked = ::flock(fd, (shared ? LOCK_SH : LOCK_EX) | LOCK_NB);
    if (locked != 0 && errno != EWOULDBLOCK) break;
  }
  if (locked != 0) {
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
    // Best effort: the flock is the lease; the holder file only describes it to others.
    const std::string tmp = lease->holder_path_ + ".tmp";
    std::error_code ec;
    fs::remove(tmp, ec);  // a leftover of an earlier process with our pid (a link is removed, not followed)
    const int out = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (out >= 0) {
      std::ostringstream text;
      text << "pid=" << self << "\nhost=" << hostname() << "\nshared=" << (shared ? 1 : 0)
           << "\nsince=" << detail::local_time("%Y-%m-%d %H:%M:%S") << "\nnote=" << note << "\n";
      const std::string t = text.str();
      const bool written = ::write(out, t.data(), t.size()) == static_cast<ssize_t>(t.size());
      ::close(out);
      if (written) fs::rename(tmp, lease->holder_path_, ec);
      if (!written || ec) fs::remove(tmp, ec);
    }
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
