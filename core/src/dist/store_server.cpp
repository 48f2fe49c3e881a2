#include "dist/store_server.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <vector>

#include "dist/store_wire.h"

namespace trainer {

using store_wire::Clock;
using store_wire::FrameReader;
using store_wire::FrameWriter;
using store_wire::Op;
using store_wire::Status;
using store_wire::WireError;

struct StoreServer::State : std::enable_shared_from_this<State> {
  std::string group;
  std::vector<int> listen_fds;  ///< one for each address listened on
  int wake_fd = -1;             ///< an eventfd: the accept loop ends when it is written to

  std::mutex mu;
  std::condition_variable changed;  ///< a key came or went, or the server stops
  std::map<std::string, std::vector<std::uint8_t>> data;
  std::size_t stored = 0;     ///< bytes of keys and values in `data`
  std::set<int> open;         ///< connections being served (those closed for good included)
  std::deque<int> ungreeted;  ///< of `open`, those that have not greeted yet, oldest first
  std::set<int> greeted;      ///< of `open`, those that greeted with the group's id
  std::size_t serving = 0;    ///< their threads still running
  std::condition_variable done;
  bool stopping = false;

  void accept_loop();
  void admit(int listen_fd);
  void serve(int fd);
  bool greet(int fd);
  std::vector<std::uint8_t> answer(FrameReader& in, int fd);
  void put(const std::string& key, std::vector<std::uint8_t> value);
  std::int64_t add(const std::string& key, std::int64_t delta);
  bool wait_for(const std::vector<std::string>& keys, std::int64_t timeout_ms, int fd,
                std::unique_lock<std::mutex>& lock);
};

namespace {

/// Whether the peer of `fd` hung up (a client that gave up a wait).
bool peer_gone(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

/// Tells the peer why its connection ends, as far as it still listens. What it sent and was
/// not read is drained for a moment first: closing a socket with unread input resets the
/// connection, and the peer would lose the answer.
void say_why(int fd, const std::string& why) {
  try {
    const auto frame = FrameWriter().u8(static_cast<std::uint8_t>(Status::error)).str(why).frame();
    store_wire::send_frame(fd, frame, Clock::now() + std::chrono::seconds(1));
    ::shutdown(fd, SHUT_WR);
    const auto deadline = Clock::now() + std::chrono::seconds(1);
    char sink[4096];
    for (std::size_t drained = 0; drained < (1u << 20) && store_wire::wait_ready(fd, false, deadline);) {
      const ssize_t n = ::recv(fd, sink, sizeof sink, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) break;
      drained += static_cast<std::size_t>(std::max<ssize_t>(n, 0));
    }
  } catch (const std::exception&) {
  }
}

std::vector<std::uint8_t> ok() { return FrameWriter().u8(static_cast<std::uint8_t>(Status::ok)).frame(); }

/// Whether `a` and `b` are the same address and port.
bool same_address(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto &x = reinterpret_cast<const sockaddr_in&>(a), &y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto &x = reinterpret_cast<const sockaddr_in6&>(a), &y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port && x.sin6_scope_id == y.sin6_scope_id &&
           std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0;
  }
  return std::memcmp(&a, &b, sizeof a) == 0;
}

struct Listening {
  std::vector<int> fds;
  std::string address;  ///< the addresses listened on, as text
};

/// A listening socket on each of listen_addresses(`found`). An address this host does not have
/// (a name that resolves to ::1 too, on a host without IPv6) is left out; any other failure, the
/// port taken on one of the addresses above all, ends it: a rank that tries that address first
/// would reach whatever listens there. Throws std::runtime_error naming `what` and the addresses.
Listening listen_on_each(const std::vector<sockaddr_storage>& found, const std::string& what) {
  Listening out;
  std::string failed, absent;
  for (const auto& a : StoreServer::listen_addresses(found)) {
    // Non-blocking: a connection reset between the accept loop's poll and its accept4 makes
    // accept4 fail instead of waiting for the next one.
    const int fd = ::socket(a.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int err = fd < 0 ? errno : 0;
    if (fd >= 0) {
      const int one = 1;
      // A port left in TIME_WAIT by an ended run is free to take again.
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (a.ss_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
      const socklen_t len = a.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
      if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), len) == 0 && ::listen(fd, 128) == 0) {
        out.fds.push_back(fd);
        out.address += (out.address.empty() ? "" : ", ") + store_wire::to_string(a);
        continue;
      }
      err = errno;
      ::close(fd);
    }
    const bool not_here = err == EADDRNOTAVAIL || err == EAFNOSUPPORT;
    std::string& said = not_here ? absent : failed;
    said += fmt::format("{}{}: {}", said.empty() ? "" : "; ", store_wire::to_string(a), std::strerror(err));
  }
  if (failed.empty() && !out.fds.empty()) return out;
  for (const int fd : out.fds) ::close(fd);
  throw std::runtime_error(
      fmt::format("cannot listen on {} ({}{}{})", what, failed, failed.empty() || absent.empty() ? "" : "; ", absent));
}

std::string joined(const std::vector<sockaddr_storage>& addresses) {
  std::string out;
  for (const auto& a : addresses) out += (out.empty() ? "" : ", ") + store_wire::to_string(a);
  return out;
}

}  // namespace

std::vector<sockaddr_storage> StoreServer::listen_addresses(const std::vector<sockaddr_storage>& found) {
  std::vector<sockaddr_storage> out;
  for (const auto& a : found) {
    // getaddrinfo gives an address once for each line of /etc/hosts that names it: a second
    // socket on the same address and port would not bind.
    const bool seen =
        std::any_of(out.begin(), out.end(), [&](const sockaddr_storage& b) { return same_address(a, b); });
    if (!seen) out.push_back(a);
  }
  return out;
}

StoreServer::StoreServer(const std::string& host, int port, std::string group) : state_(std::make_shared<State>()) {
  start(store_wire::resolve(host, port), std::move(group), host);
}

StoreServer::StoreServer(const std::vector<sockaddr_storage>& addresses, std::string group)
    : state_(std::make_shared<State>()) {
  start(addresses, std::move(group), joined(addresses));
}

void StoreServer::start(const std::vector<sockaddr_storage>& addresses, std::string group, const std::string& what) {
  state_->group = std::move(group);
  Listening listening = listen_on_each(addresses, what);
  state_->listen_fds = std::move(listening.fds);
  address_ = std::move(listening.address);
  state_->wake_fd = ::eventfd(0, EFD_CLOEXEC);
  if (state_->wake_fd < 0) {
    const int err = errno;
    for (const int fd : state_->listen_fds) ::close(fd);
    throw std::runtime_error(fmt::format("cannot listen on {} (eventfd: {})", what, std::strerror(err)));
  }
  accept_ = std::thread([s = state_] { s->accept_loop(); });
}

StoreServer::~StoreServer() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stopping = true;
    for (int fd : state_->open) ::shutdown(fd, SHUT_RDWR);
  }
  state_->changed.notify_all();
  const std::uint64_t one = 1;
  while (::write(state_->wake_fd, &one, sizeof one) < 0 && errno == EINTR) {
  }
  accept_.join();
  for (const int fd : state_->listen_fds) ::close(fd);
  ::close(state_->wake_fd);
  // The connections' threads end once they see their sockets shut; each holds the state, so
  // one that is slow to go does not keep this process from ending.
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->done.wait_for(lock, std::chrono::seconds(2), [&] { return state_->serving == 0; });
}

void StoreServer::State::accept_loop() {
  std::vector<pollfd> polled;
  for (const int fd : listen_fds) polled.push_back({fd, POLLIN, 0});
  polled.push_back({wake_fd, POLLIN, 0});
  for (;;) {
    const int r = ::poll(polled.data(), polled.size(), -1);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping) return;
    }
    if (r < 0) {
      if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    for (std::size_t i = 0; i < listen_fds.size(); ++i) {
      if (polled[i].revents != 0) admit(listen_fds[i]);
    }
  }
}

void StoreServer::State::admit(int listen_fd) {
  const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    // Out of descriptors (the next one may do), or a connection reset before it was taken.
    if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return;
  }
  std::unique_lock<std::mutex> lock(mu);
  if (stopping) {
    ::close(fd);
    return;
  }
  if (ungreeted.size() >= kMaxUngreeted) {
    // The oldest connection that has not greeted makes room: its thread sees its input end and
    // tells it why (greet).
    const int oldest = ungreeted.front();
    ungreeted.pop_front();
    ::shutdown(oldest, SHUT_RD);
  }
  if (greeted.size() + ungreeted.size() >= kMaxConnections) {
    ::close(fd);
    return;
  }
  store_wire::tune_socket(fd);
  open.insert(fd);
  ungreeted.push_back(fd);
  ++serving;
  lock.unlock();
  // Each thread holds the state: it may outlive the StoreServer by a moment.
  std::thread([s = shared_from_this(), fd] { s->serve(fd); }).detach();
}

void StoreServer::State::serve(int fd) {
  try {
    if (greet(fd)) {
      while (auto body = store_wire::read_frame(fd, std::nullopt, kRest)) {
        FrameReader in(*body);
        store_wire::send_frame(fd, answer(in, fd), Clock::now() + kRest);
      }
    }
  } catch (const std::exception& e) {
    say_why(fd, e.what());
  }
  std::lock_guard<std::mutex> lock(mu);
  open.erase(fd);
  greeted.erase(fd);
  if (const auto it = std::find(ungreeted.begin(), ungreeted.end(), fd); it != ungreeted.end()) ungreeted.erase(it);
  ::close(fd);
  if (--serving == 0) done.notify_all();
}

bool StoreServer::State::greet(int fd) {
  // Made room for a newer connection (admit): no longer among those waiting for a greeting.
  const auto passed_over = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return !stopping && std::find(ungreeted.begin(), ungreeted.end(), fd) == ungreeted.end();
  };
  const std::string why_passed_over = fmt::format(
      "closed before its greeting: more than {} connections to the store had not greeted, and this was "
      "the oldest",
      kMaxUngreeted);
  const auto body = store_wire::read_frame(fd, Clock::now() + kGreeting, kGreeting, kMaxGreeting, "a greeting");
  if (!body) {
    if (passed_over()) throw WireError(why_passed_over);
    return false;
  }
  FrameReader in(*body);
  if (in.u8() != static_cast<std::uint8_t>(Op::hello)) throw WireError("a connection must greet first");
  const std::string magic = in.str(), theirs = in.str();
  in.end();
  if (magic != store_wire::kMagic) throw WireError("not a trainer store client");
  if (theirs != group) {
    throw WireError(
        "this store serves another group: the rank's group (TRAINER_GROUP_ID, TORCHELASTIC_RESTART_COUNT) differs "
        "from rank 0's");
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = std::find(ungreeted.begin(), ungreeted.end(), fd);
    if (it == ungreeted.end()) throw WireError(why_passed_over);  // its input is shut: it cannot go on
    ungreeted.erase(it);
    greeted.insert(fd);
  }
  store_wire::send_frame(fd, ok(), Clock::now() + kRest);
  return true;
}

void StoreServer::State::put(const std::string& key, std::vector<std::uint8_t> value) {
  const auto it = data.find(key);
  const std::size_t before = it == data.end() ? 0 : key.size() + it->second.size();
  const std::size_t after = stored - before + key.size() + value.size();
  if (after > kMaxStoredBytes) {
    throw WireError(fmt::format("the store is full: {} bytes of keys and values would be over its limit of {} MiB",
                                after, kMaxStoredBytes >> 20));
  }
  data[key] = std::move(value);
  stored = after;
  changed.notify_all();
}

std::int64_t StoreServer::State::add(const std::string& key, std::int64_t delta) {
  std::int64_t count = 0;
  if (const auto it = data.find(key); it != data.end()) {
    const char* begin = reinterpret_cast<const char*>(it->second.data());
    const auto [end, ec] = std::from_chars(begin, begin + it->second.size(), count);
    if (ec != std::errc() || end != begin + it->second.size()) throw WireError("add: the key holds no count");
  }
  if (__builtin_add_overflow(count, delta, &count)) throw WireError("add: the count would overflow 64 bits");
  const std::string text = std::to_string(count);  // decimal text, as c10d's stores keep a count
  put(key, std::vector<std::uint8_t>(text.begin(), text.end()));
  return count;
}

bool StoreServer::State::wait_for(const std::vector<std::string>& keys, std::int64_t timeout_ms, int fd,
                                  std::unique_lock<std::mutex>& lock) {
  const auto all_there = [&] {
    for (const auto& k : keys) {
      if (data.count(k) == 0) return false;
    }
    return true;
  };
  // A peer's timeout, however long, must not overflow the clock (2^40 ms: 34 years).
  timeout_ms = std::clamp<std::int64_t>(timeout_ms, 0, std::int64_t{1} << 40);
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  // In slices, to notice a peer that gave up waiting (its thread is freed).
  while (!all_there()) {
    if (stopping) throw WireError("the store is closing");
    if (timeout_ms > 0 && Clock::now() >= deadline) return false;
    auto until = Clock::now() + std::chrono::seconds(1);
    if (timeout_ms > 0 && deadline < until) until = deadline;
    changed.wait_until(lock, until);
    if (!all_there() && peer_gone(fd)) throw WireError("the peer left");
  }
  return true;
}

std::vector<std::uint8_t> StoreServer::State::answer(FrameReader& in, int fd) {
  const auto op = static_cast<Op>(in.u8());
  FrameWriter out;
  out.u8(static_cast<std::uint8_t>(Status::ok));
  std::unique_lock<std::mutex> lock(mu);
  switch (op) {
    case Op::set: {
      const std::string key = in.str();
      auto value = in.bytes();
      in.end();
      put(key, std::move(value));
      break;
    }
    case Op::get: {
      const std::string key = in.str();
      const std::int64_t timeout_ms = in.i64();
      in.end();
      if (!wait_for({key}, timeout_ms, fd, lock))
        return FrameWriter().u8(static_cast<std::uint8_t>(Status::timeout)).frame();
      out.bytes(data.at(key));
      break;
    }
    case Op::add: {
      const std::string key = in.str();
      const std::int64_t delta = in.i64();
      in.end();
      out.i64(add(key, delta));
      break;
    }
    case Op::check: {
      const auto keys = in.strings();
      in.end();
      bool all = true;
      for (const auto& k : keys) all = all && data.count(k) != 0;
      out.u8(all ? 1 : 0);
      break;
    }
    case Op::wait: {
      const auto keys = in.strings();
      const std::int64_t timeout_ms = in.i64();
      in.end();
      if (!wait_for(keys, timeout_ms, fd, lock))
        return FrameWriter().u8(static_cast<std::uint8_t>(Status::timeout)).frame();
      break;
    }
    case Op::remove: {
      const std::string key = in.str();
      in.end();
      const auto it = data.find(key);
      out.u8(it != data.end() ? 1 : 0);
      if (it != data.end()) {
        stored -= key.size() + it->second.size();
        data.erase(it);
        changed.notify_all();
      }
      break;
    }
    case Op::count:
      in.end();
      out.i64(static_cast<std::int64_t>(data.size()));
      break;
    default:
      throw WireError(fmt::format("unknown request {}", static_cast<int>(op)));
  }
  return out.frame();
}

}  // namespace trainer
