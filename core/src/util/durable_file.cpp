#include "util/durable_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "trainer/error.h"

namespace fs = std::filesystem;

namespace trainer::detail {

namespace {

void sync_path(const std::string& path, int flags, const char* what) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  TRAINER_CHECK(fd >= 0, "cannot open ", what, " ", path, " to flush it to disk: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  TRAINER_CHECK(rc == 0, "cannot flush ", what, " ", path, " to disk (fsync): ", std::strerror(err));
}

}  // namespace

void sync_file(const std::string& path) { sync_path(path, O_RDONLY, "file"); }

void sync_dir(const std::string& dir) { sync_path(dir.empty() ? "." : dir, O_RDONLY | O_DIRECTORY, "directory"); }

void publish(const std::string& tmp, const std::string& path) {
  try {
    sync_file(tmp);
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

void write_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  // The temporary is this process's own file: whatever sits at its name (a crashed write's
  // leftover, or a link planted to make the write land elsewhere) goes first, and the open
  // neither follows a link nor takes a file that appeared in between.
  if (::unlink(tmp.c_str()) != 0) {
    TRAINER_CHECK(errno == ENOENT, "cannot remove the stale ", tmp, ": ", std::strerror(errno));
  }
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  TRAINER_CHECK(fd >= 0, "cannot write ", tmp, ": ", std::strerror(errno));
  std::size_t done = 0;
  int err = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    TRAINER_CHECK(false, "short write to ", tmp, ": ", std::strerror(err));
  }
  publish(tmp, path);
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

}  // namespace trainer::detail
