#include "util/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <streambuf>
#include <vector>

#include "trainer/error.h"

namespace fs = std::filesystem;

namespace trainer {

namespace {

/// What sits at `path` when it is not what trainer writes to: "a symbolic link", "a FIFO", ...
std::string kind_at(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return "not a regular file";
  if (S_ISLNK(st.st_mode)) return "a symbolic link";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "a device";
  if (S_ISREG(st.st_mode)) return "a regular file";
  return "not a regular file";
}

[[noreturn]] void refuse(const std::string& path, const std::string& kind) {
  throw UsageError(path + " is " + kind +
                   "; trainer writes files in a run directory only as regular files of its own, never through a "
                   "link (remove it, or use another run directory)");
}

/// Opens an existing or new file in place (`flags`: O_APPEND or O_RDWR), never through a link
/// and never blocking on a FIFO (O_NONBLOCK until the fstat says it is a regular file).
FileDescriptor open_in_place(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    // ELOOP: a link (O_NOFOLLOW); ENXIO: a FIFO nobody reads; EISDIR: a directory.
    if (err == ELOOP || err == ENXIO || err == EISDIR) refuse(path, kind_at(path));
    TRAINER_CHECK(false, "cannot open ", path, ": ", std::strerror(err));
  }
  FileDescriptor out(fd);
  struct stat st {};
  TRAINER_CHECK(::fstat(fd, &st) == 0, "cannot stat ", path, ": ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) refuse(path, kind_at(path));
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return out;
}

/// Writes all `n` bytes (retrying short writes and EINTR): 0, or the errno of the failure.
int write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? errno : EIO;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return 0;
}

/// A std::ostream's buffer over a file descriptor: what LibTorch's writers take. A failed write
/// makes the stream bad; `error()` keeps its errno. The size and CRC-32 of what it wrote are
/// counted as the bytes go out, so the file need not be read back by name.
class FdStreamBuf final : public std::streambuf {
 public:
  explicit FdStreamBuf(int fd) : fd_(fd), buf_(1 << 16) { setp(buf_.data(), buf_.data() + buf_.size()); }
  int error() const { return error_; }
  detail::FileDigest digest() const { return {written_, static_cast<std::uint32_t>(crc_)}; }

 protected:
  int_type overflow(int_type c) override {
    if (!drain()) return traits_type::eof();
    if (!traits_type::eq_int_type(c, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(c);
      pbump(1);
    }
    return traits_type::not_eof(c);
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    if (n >= static_cast<std::streamsize>(buf_.size())) {  // large blocks (tensor data) go straight through
      if (!drain() || !put(s, static_cast<std::size_t>(n))) return 0;
      return n;
    }
    return std::streambuf::xsputn(s, n);
  }
  int sync() override { return drain() ? 0 : -1; }

 private:
  bool drain() {
    const std::size_t n = static_cast<std::size_t>(pptr() - pbase());
    setp(buf_.data(), buf_.data() + buf_.size());
    return n == 0 || put(buf_.data(), n);
  }
  bool put(const char* s, std::size_t n) {
    if (error_ != 0) return false;
    error_ = write_all(fd_, s, n);
    if (error_ != 0) return false;
    for (std::size_t at = 0; at < n;) {  // zlib takes at most 4 GiB at once
      const auto part = static_cast<uInt>(std::min<std::size_t>(n - at, 1u << 30));
      crc_ = ::crc32(crc_, reinterpret_cast<const Bytef*>(s + at), part);
      at += part;
    }
    written_ += static_cast<std::int64_t>(n);
    return true;
  }

  int fd_;
  std::vector<char> buf_;
  int error_ = 0;
  uLong crc_ = ::crc32(0L, Z_NULL, 0);
  std::int64_t written_ = 0;
};

}  // namespace

void FileDescriptor::reset() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

FileDescriptor create_new_file(const std::string& path) {
  // The file is this process's own: whatever sits at its name (a crashed write's leftover, or a
  // link planted to make the write land elsewhere) goes first, and the open neither follows a
  // link nor takes a file that appeared in between.
  if (::unlink(path.c_str()) != 0) {
    const int err = errno;
    // EISDIR (Linux) or EPERM (POSIX): a directory, which unlink does not remove. EPERM also:
    // another user's file in a folder with the sticky bit.
    if (err == EISDIR || err == EPERM) {
      const std::string kind = kind_at(path);
      refuse(path, kind == "a regular file"
                       ? "a file this user may not remove (" + std::string(std::strerror(err)) + ")"
                       : kind);
    }
    TRAINER_CHECK(err == ENOENT, "cannot remove the stale ", path, ": ", std::strerror(err));
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    // Something was put at the name between the unlink and the open.
    if (err == EEXIST) refuse(path, kind_at(path));
    TRAINER_CHECK(false, "cannot write ", path, ": ", std::strerror(err));
  }
  return FileDescriptor(fd);
}

FileDescriptor open_for_append(const std::string& path) { return open_in_place(path, O_WRONLY | O_APPEND); }

FileDescriptor open_for_update(const std::string& path) { return open_in_place(path, O_RDWR); }

void write_fully(int fd, const void* data, std::size_t n, const std::string& path) {
  const int err = write_all(fd, static_cast<const char*>(data), n);
  TRAINER_CHECK(err == 0, "short write to ", path, ": ", std::strerror(err));
}

namespace {

/// Writes `<path>.tmp` (created new) with `fill`; with `durable`, flushes it to the disk through
/// the descriptor that wrote it, before closing it. Nothing opens the temporary again by name: a
/// FIFO or a link put at its name meanwhile neither blocks this nor is read. Returns the digest
/// of what was written. A failure removes the temporary and throws, naming `path`.
detail::FileDigest write_through_temporary(const std::string& path, const std::function<void(std::ostream&)>& fill,
                                           bool durable) {
  const std::string tmp = path + ".tmp";
  FileDescriptor fd = create_new_file(tmp);
  detail::FileDigest digest;
  try {
    FdStreamBuf buf(fd.get());
    std::ostream out(&buf);
    fill(out);
    out.flush();
    TRAINER_CHECK(out.good() && buf.error() == 0, "cannot write ", path, " (through ", tmp,
                  "): ", std::strerror(buf.error() != 0 ? buf.error() : EIO));
    if (durable) {
      TRAINER_CHECK(::fsync(fd.get()) == 0, "cannot flush ", tmp, " to disk (fsync): ", std::strerror(errno));
    }
    const int rc = ::close(fd.release());
    TRAINER_CHECK(rc == 0, "cannot write ", path, " (closing ", tmp, "): ", std::strerror(errno));
    digest = buf.digest();
  } catch (...) {
    fd.reset();
    ::unlink(tmp.c_str());
    throw;
  }
  return digest;
}

}  // namespace

std::string write_temporary(const std::string& path, const std::function<void(std::ostream&)>& fill) {
  write_through_temporary(path, fill, true);
  return path + ".tmp";
}

void write_atomic(const std::string& path, const std::function<void(std::ostream&)>& fill) {
  detail::publish(write_temporary(path, fill), path);
}

void write_atomic(const std::string& path, const std::string& text) {
  write_atomic(path, [&text](std::ostream& out) { out.write(text.data(), static_cast<std::streamsize>(text.size())); });
}

void write_replacing(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  write_through_temporary(
      path, [&text](std::ostream& out) { out.write(text.data(), static_cast<std::streamsize>(text.size())); }, false);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    TRAINER_CHECK(false, "cannot rename ", tmp, " to ", path, ": ", std::strerror(err));
  }
}

void make_run_subdir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) == 0) return;
  const int err = errno;
  struct stat st {};
  if (err == EEXIST && ::lstat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return;
    throw UsageError(dir + " is " + kind_at(dir) +
                     "; trainer keeps this folder of a run directory only as a directory of its own, never through "
                     "a link (remove it, or use another run directory)");
  }
  TRAINER_CHECK(false, "cannot create ", dir, ": ", std::strerror(err));
}

namespace detail {

void sync_dir(const std::string& dir) {
  const std::string path = dir.empty() ? "." : dir;
  // O_DIRECTORY: anything but a directory at the name (a FIFO) fails the open, never blocks it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TRAINER_CHECK(fd >= 0, "cannot open directory ", path, " to flush it to disk: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  TRAINER_CHECK(rc == 0, "cannot flush directory ", path, " to disk (fsync): ", std::strerror(err));
}

Temporary write_temporary_digested(const std::string& path, const std::function<void(std::ostream&)>& fill) {
  const FileDigest digest = write_through_temporary(path, fill, true);
  return {path + ".tmp", digest};
}

void publish(const std::string& tmp, const std::string& path) {
  try {
    std::error_code ec;
    fs::rename(tmp, path, ec);
    TRAINER_CHECK(!ec, "cannot rename ", tmp, " to ", path, ": ", ec.message());
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
  sync_dir(fs::path(path).parent_path().string());
}

FileDigest digest_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TRAINER_CHECK(in.good(), "cannot read ", path);
  FileDigest d;
  uLong crc = ::crc32(0L, Z_NULL, 0);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize got = in.gcount();
    if (got <= 0) break;
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(got));
    d.size += got;
  }
  TRAINER_CHECK(!in.bad(), "error reading ", path);
  d.crc32 = static_cast<std::uint32_t>(crc);
  return d;
}

}  // namespace detail

}  // namespace trainer
