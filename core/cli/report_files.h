#pragma once
// Reading a run directory's files within limits (private to `trainer report`): the run
// directory is untrusted input, so no file is read past its limit, no line is held past its
// limit, and nothing that is not a regular file is opened.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <istream>
#include <string>
#include <vector>

namespace trainer::report {

inline constexpr std::size_t kChunkBytes = 64 << 10;

/// "1024 MiB", "256 KiB", "1.5 MiB", "12 bytes".
std::string size_text(std::uintmax_t bytes);

/// Lines of a stream, `budget` bytes of it at most, each held to `max_line` bytes: a longer line is
/// returned cut (the rest is read and dropped), so that neither a huge file nor a file without a
/// newline takes more memory than `max_line` and a chunk.
class LineReader {
 public:
  LineReader(std::istream& in, std::size_t budget, std::size_t max_line)
      : in_(in), budget_(budget), max_line_(max_line), buf_(kChunkBytes) {}

  /// The next line, without its '\n'; false at the end of the stream or of the budget.
  bool next(std::string& line) {
    line.clear();
    too_long_ = complete_ = false;
    bool any = false;
    while (true) {
      if (pos_ == end_ && !fill()) return any;
      any = true;
      const char* begin = buf_.data() + pos_;
      const void* nl = std::memchr(begin, '\n', end_ - pos_);
      const std::size_t n = nl ? std::size_t(static_cast<const char*>(nl) - begin) : end_ - pos_;
      const std::size_t room = max_line_ - line.size();
      line.append(begin, std::min(n, room));
      too_long_ = too_long_ || n > room;
      pos_ += n;
      if (nl) {
        ++pos_;
        complete_ = true;
        return true;
      }
    }
  }
  bool too_long() const { return too_long_; }   ///< the last line was longer than max_line (it was cut)
  bool complete() const { return complete_; }   ///< the last line ended with '\n'
  bool budget_spent() const { return spent_; }  ///< reading stopped at the budget with more in the stream
  bool bad() const { return in_.bad(); }

 private:
  bool fill() {
    pos_ = end_ = 0;
    if (budget_ == 0) {
      spent_ = in_.peek() != std::char_traits<char>::eof();
      return false;
    }
    in_.read(buf_.data(), std::streamsize(std::min(budget_, buf_.size())));
    end_ = std::size_t(in_.gcount());
    budget_ -= end_;
    return end_ > 0;
  }

  std::istream& in_;
  std::size_t budget_, max_line_;
  std::vector<char> buf_;
  std::size_t pos_ = 0, end_ = 0;
  bool too_long_ = false, complete_ = false, spent_ = false;
};

/// Whether `path` is a regular file that may be opened; when it exists and is not one (or cannot be
/// looked at), `why` says so. A FIFO would block the open and a device such as /dev/zero never ends.
bool regular_file(const std::filesystem::path& path, std::string& why, std::uintmax_t& size);

/// Reads at most `max_bytes` of a regular file; false when it cannot be opened (errno says why).
bool read_start(const std::filesystem::path& path, std::string& out, std::size_t max_bytes);

}  // namespace trainer::report
