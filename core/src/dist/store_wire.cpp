#include "dist/store_wire.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace trainer::store_wire {

FrameWriter& FrameWriter::u8(std::uint8_t v) {
  body_.push_back(v);
  return *this;
}

FrameWriter& FrameWriter::i64(std::int64_t v) {
  const auto u = static_cast<std::uint64_t>(v);
  for (int i = 0; i < 8; ++i) body_.push_back(static_cast<std::uint8_t>(u >> (8 * i)));
  return *this;
}

namespace {

void put_u32(std::vector<std::uint8_t>& out, std::size_t n) {
  if (n > kMaxFrame) throw WireError(fmt::format("{} bytes are over the store's limit of {} MiB", n, kMaxFrame >> 20));
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(n >> (8 * i)));
}

std::uint32_t get_u32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

}  // namespace

FrameWriter& FrameWriter::str(const std::string& s) {
  put_u32(body_, s.size());
  body_.insert(body_.end(), s.begin(), s.end());
  return *this;
}

FrameWriter& FrameWriter::bytes(const std::vector<std::uint8_t>& b) {
  put_u32(body_, b.size());
  body_.insert(body_.end(), b.begin(), b.end());
  return *this;
}

FrameWriter& FrameWriter::strings(const std::vector<std::string>& keys) {
  put_u32(body_, keys.size());
  for (const auto& k : keys) str(k);
  return *this;
}

std::vector<std::uint8_t> FrameWriter::frame() const {
  std::vector<std::uint8_t> out;
  out.reserve(body_.size() + 4);
  put_u32(out, body_.size());
  out.insert(out.end(), body_.begin(), body_.end());
  return out;
}

std::uint8_t FrameReader::u8() {
  if (at_ + 1 > body_.size()) throw WireError("a frame ends inside a field");
  return body_[at_++];
}

std::int64_t FrameReader::i64() {
  if (at_ + 8 > body_.size()) throw WireError("a frame ends inside a field");
  std::uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u |= static_cast<std::uint64_t>(body_[at_ + i]) << (8 * i);
  at_ += 8;
  return static_cast<std::int64_t>(u);
}

std::uint32_t FrameReader::length() {
  if (at_ + 4 > body_.size()) throw WireError("a frame ends inside a field");
  const std::uint32_t n = get_u32(body_.data() + at_);
  at_ += 4;
  if (n > body_.size() - at_) throw WireError(fmt::format("a field of {} bytes goes past its frame's end", n));
  return n;
}

std::string FrameReader::str() {
  const std::uint32_t n = length();
  std::string s(reinterpret_cast<const char*>(body_.data() + at_), n);
  at_ += n;
  return s;
}

std::vector<std::uint8_t> FrameReader::bytes() {
  const std::uint32_t n = length();
  std::vector<std::uint8_t> b(body_.begin() + static_cast<std::ptrdiff_t>(at_),
                              body_.begin() + static_cast<std::ptrdiff_t>(at_ + n));
  at_ += n;
  return b;
}

std::vector<std::string> FrameReader::strings() {
  if (at_ + 4 > body_.size()) throw WireError("a frame ends inside a field");
  const std::uint32_t n = get_u32(body_.data() + at_);
  at_ += 4;
  // Each string takes at least its 4-byte length: a count the frame cannot hold is refused
  // before anything is reserved for it.
  if (n > (body_.size() - at_) / 4) throw WireError(fmt::format("a list of {} strings goes past its frame's end", n));
  std::vector<std::string> out;
  out.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) out.push_back(str());
  return out;
}

void FrameReader::end() const {
  if (at_ != body_.size())
    throw WireError(fmt::format("{} bytes left over after a frame's fields", body_.size() - at_));
}

bool wait_ready(int fd, bool out, std::optional<Clock::time_point> deadline) {
  for (;;) {
    int ms = -1;
    if (deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      ms = static_cast<int>(std::clamp<std::int64_t>(left, 0, 60'000));
    }
    pollfd p{fd, static_cast<short>(out ? POLLOUT : POLLIN), 0};
    const int r = ::poll(&p, 1, ms);
    if (r > 0) return true;  // ready, or an error or hang-up the next call reports
    if (r < 0 && errno != EINTR) throw WireError(fmt::format("poll: {}", std::strerror(errno)));
    if (r == 0 && deadline && Clock::now() >= *deadline) return false;
  }
}

void send_frame(int fd, const std::vector<std::uint8_t>& frame, std::optional<Clock::time_point> deadline) {
  std::size_t sent = 0;
  while (sent < frame.size()) {
    if (!wait_ready(fd, true, deadline)) throw WireError("the peer did not take the request in time");
    const ssize_t n = ::send(fd, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) throw WireError(fmt::format("send: {}", n < 0 ? std::strerror(errno) : "connection closed"));
    sent += static_cast<std::size_t>(n);
  }
}

namespace {

/// Reads `n` bytes into `out` (appended as they arrive) by `deadline`. False when the peer
/// closed the connection before the first of them and `clean_close` allows that.
bool read_exact(int fd, std::size_t n, std::vector<std::uint8_t>& out, std::optional<Clock::time_point> deadline,
                bool clean_close) {
  constexpr std::size_t kChunk = 64 << 10;
  std::size_t got = 0;
  while (got < n) {
    if (!wait_ready(fd, false, deadline)) throw WireError("a frame did not come in time");
    const std::size_t want = std::min(kChunk, n - got);
    const std::size_t at = out.size();
    out.resize(at + want);
    const ssize_t r = ::recv(fd, out.data() + at, want, MSG_DONTWAIT);
    out.resize(at + static_cast<std::size_t>(std::max<ssize_t>(r, 0)));
    if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (r < 0) throw WireError(fmt::format("recv: {}", std::strerror(errno)));
    if (r == 0) {
      if (clean_close && got == 0) return false;
      throw WireError("the connection closed inside a frame");
    }
    got += static_cast<std::size_t>(r);
  }
  return true;
}

}  // namespace

std::optional<std::vector<std::uint8_t>> read_frame(int fd, std::optional<Clock::time_point> first,
                                                    std::chrono::milliseconds rest, std::uint32_t limit,
                                                    const char* what) {
  std::vector<std::uint8_t> head;
  if (!wait_ready(fd, false, first)) throw WireError("no frame came in time");
  const auto deadline = Clock::now() + rest;
  if (!read_exact(fd, 4, head, deadline, true)) return std::nullopt;
  const std::uint32_t n = get_u32(head.data());
  if (n > limit) {
    const std::string most = limit % (1u << 20) == 0 ? fmt::format("{} MiB", limit >> 20)
                             : limit % 1024 == 0     ? fmt::format("{} KiB", limit >> 10)
                                                     : fmt::format("{} bytes", limit);
    throw WireError(fmt::format("{} of {} bytes is over the store's limit of {}", what, n, most));
  }
  std::vector<std::uint8_t> body;
  read_exact(fd, n, body, deadline, false);
  return body;
}

std::vector<sockaddr_storage> resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) throw WireError(fmt::format("cannot resolve '{}': {}", host, ::gai_strerror(rc)));
  std::vector<sockaddr_storage> out;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    sockaddr_storage s{};
    std::memcpy(&s, a->ai_addr, std::min<std::size_t>(a->ai_addrlen, sizeof s));
    out.push_back(s);
  }
  ::freeaddrinfo(found);
  if (out.empty()) throw WireError(fmt::format("'{}' resolves to no address", host));
  return out;
}

bool is_loopback(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr) >> 24) == 127;
  }
  if (a.ss_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6&>(a).sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

std::string to_string(const sockaddr_storage& a) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    ::inet_ntop(AF_INET, &v4.sin_addr, text, sizeof text);
    return fmt::format("{}:{}", text, ntohs(v4.sin_port));
  }
  const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
  ::inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof text);
  return fmt::format("[{}]:{}", text, ntohs(v6.sin6_port));
}

void tune_socket(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
}

}  // namespace trainer::store_wire
