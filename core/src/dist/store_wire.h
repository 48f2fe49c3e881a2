#pragma once
// Private: the wire of the group's store (store_server.h hosts it, group_store.h talks to it):
// frames, their fields, and the socket calls both ends make, each bounded in size and time.
//
// A frame is a 4-byte little-endian length, then that many bytes: a request's op (or a reply's
// status) and its fields. A string field is a 4-byte length and its bytes, an integer 8 bytes
// little-endian. Nothing is allocated for a frame before its length is checked against
// kMaxFrame, and then only as its bytes arrive.
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer::store_wire {

/// The largest frame either end accepts (a key and its value with their lengths). The group
/// stores run directories, generator states and Gloo's addresses, a few KiB each.
constexpr std::uint32_t kMaxFrame = 64u << 20;

/// What the first frame of a connection says, after the op: who speaks.
constexpr const char* kMagic = "trainer-store 1";

enum class Op : std::uint8_t {
  hello = 1,  ///< magic, group: the first frame of every connection
  set,        ///< key, value
  get,        ///< key, timeout (ms, 0 = none): the value once the key exists
  add,        ///< key, delta: the new count
  check,      ///< keys: whether all exist
  wait,       ///< keys, timeout (ms, 0 = none)
  remove,     ///< key: whether it existed
  count,      ///< the number of keys
};

enum class Status : std::uint8_t {
  ok = 0,
  timeout = 1,  ///< the keys did not come within the request's timeout
  error = 2,    ///< a message follows; the server closes the connection after it
};

/// A frame that breaks the rules (too long, cut short, a field past its end), or a peer that
/// did not send one in time: the connection cannot go on.
class WireError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Builds one frame.
class FrameWriter {
 public:
  FrameWriter& u8(std::uint8_t v);
  FrameWriter& i64(std::int64_t v);
  FrameWriter& str(const std::string& s);
  FrameWriter& bytes(const std::vector<std::uint8_t>& b);
  FrameWriter& strings(const std::vector<std::string>& keys);
  /// The frame with its length in front. Throws WireError when it is over kMaxFrame.
  std::vector<std::uint8_t> frame() const;

 private:
  std::vector<std::uint8_t> body_;
};

/// Reads the fields of one frame's body, in order. Each read past the end throws WireError.
class FrameReader {
 public:
  explicit FrameReader(const std::vector<std::uint8_t>& body) : body_(body) {}
  std::uint8_t u8();
  std::int64_t i64();
  std::string str();
  std::vector<std::uint8_t> bytes();
  std::vector<std::string> strings();
  /// Throws WireError when bytes are left over.
  void end() const;

 private:
  std::uint32_t length();
  const std::vector<std::uint8_t>& body_;
  std::size_t at_ = 0;
};

using Clock = std::chrono::steady_clock;

/// Waits until `fd` can be read (or written, `out`) or `deadline` passes: false then. A
/// deadline of nullopt waits for ever.
bool wait_ready(int fd, bool out, std::optional<Clock::time_point> deadline);

/// Sends all of `frame` by `deadline` (MSG_NOSIGNAL: a closed peer is an error, not SIGPIPE).
/// Throws WireError.
void send_frame(int fd, const std::vector<std::uint8_t>& frame, std::optional<Clock::time_point> deadline);

/// The body of the next frame: its first byte by `first` (nullopt: however long the peer
/// stays quiet), the rest within `rest` of it. nullopt when the peer closed the connection
/// between frames. Throws WireError for a frame over `limit` bytes (before reading it: the
/// message calls it `what`), one cut short, or one that does not come in time.
std::optional<std::vector<std::uint8_t>> read_frame(int fd, std::optional<Clock::time_point> first,
                                                    std::chrono::milliseconds rest, std::uint32_t limit = kMaxFrame,
                                                    const char* what = "a frame");

/// The addresses `host` resolves to, with `port` (TCP, IPv4 or IPv6). Throws WireError naming
/// the host.
std::vector<sockaddr_storage> resolve(const std::string& host, int port);

/// Whether `a` is a loopback address (127.0.0.0/8, ::1, ::ffff:127.x.y.z).
bool is_loopback(const sockaddr_storage& a);

/// `a` as text ("127.0.0.1:29500", "[::1]:29500").
std::string to_string(const sockaddr_storage& a);

/// Sets TCP_NODELAY (each request is one small frame that waits for its answer) and
/// close-on-exec on a connected socket.
void tune_socket(int fd);

}  // namespace trainer::store_wire
