#include "dist/group_store.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "dist/store_server.h"
#include "dist/store_wire.h"
#include "trainer/durable_file.h"

namespace trainer {

using store_wire::Clock;
using store_wire::FrameReader;
using store_wire::FrameWriter;
using store_wire::Op;
using store_wire::Status;
using store_wire::WireError;

namespace {

/// A connected socket to one of `host`'s addresses, or -1 with `why` said.
int connect_once(const std::string& host, int port, Clock::time_point deadline, std::string& why) {
  for (const auto& a : store_wire::resolve(host, port)) {
    // Closed however this ends (wait_ready throws on a poll error), unless handed over.
    FileDescriptor fd(::socket(a.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (fd.get() < 0) {
      why = std::strerror(errno);
      continue;
    }
    const socklen_t len = a.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    int err = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a), len) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      err = ETIMEDOUT;
      if (store_wire::wait_ready(fd.get(), true, deadline)) {
        socklen_t size = sizeof err;
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &size);
      }
    }
    if (err == 0) {
      store_wire::tune_socket(fd.get());
      return fd.release();
    }
    why = fmt::format("{}: {}", store_wire::to_string(a), std::strerror(err));
  }
  return -1;
}

}  // namespace

GroupStore::GroupStore(std::string host, int port, std::string group, std::chrono::milliseconds timeout)
    : StoreWithClone(timeout), host_(std::move(host)), group_(std::move(group)), port_(port) {
  const auto deadline = Clock::now() + timeout;
  std::string why = "nothing tried";
  try {
    // Rank 0 may not listen yet: try again until the timeout.
    while ((fd_ = connect_once(host_, port_, deadline, why)) < 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } catch (const WireError& e) {
    throw std::runtime_error(e.what());  // the host does not resolve: no use trying again
  }
  if (fd_ < 0) {
    throw std::runtime_error(
        fmt::format("nothing answered at {} within {:g} s ({})", where(), timeout.count() / 1000.0, why));
  }
  call(FrameWriter().u8(static_cast<std::uint8_t>(Op::hello)).str(store_wire::kMagic).str(group_).frame(), timeout);
}

GroupStore::~GroupStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::string GroupStore::where() const {
  return host_.find(':') != std::string::npos ? fmt::format("[{}]:{}", host_, port_)
                                              : fmt::format("{}:{}", host_, port_);
}

std::optional<std::vector<std::uint8_t>> GroupStore::call(const std::vector<std::uint8_t>& frame,
                                                          std::chrono::milliseconds answer_within) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) throw std::runtime_error(broken_);
  std::optional<Clock::time_point> deadline;
  // However long the timeout, the clock must not overflow (2^40 ms: 34 years).
  if (answer_within.count() > 0)
    deadline = Clock::now() + std::min(answer_within, std::chrono::milliseconds(1LL << 40));
  std::string why;
  try {
    store_wire::send_frame(fd_, frame, deadline);
    auto body = store_wire::read_frame(fd_, deadline, StoreServer::kRest);
    if (!body) throw WireError("it closed the connection");
    FrameReader in(*body);
    const auto status = static_cast<Status>(in.u8());
    if (status == Status::ok) return std::vector<std::uint8_t>(body->begin() + 1, body->end());
    if (status == Status::timeout) return std::nullopt;
    why = status == Status::error ? in.str() : fmt::format("an answer of unknown status {}", static_cast<int>(status));
  } catch (const WireError& e) {
    why = e.what();
  }
  // The answer may still come later and would be read as the next one's: the connection ends.
  ::close(fd_);
  fd_ = -1;
  broken_ = fmt::format("the group's store at {}: {}", where(), why);
  throw std::runtime_error(broken_);
}

std::vector<std::uint8_t> GroupStore::answer(const std::vector<std::uint8_t>& frame) {
  auto body = call(frame, timeout_);
  if (!body)
    throw std::runtime_error(fmt::format("the group's store at {}: a timeout answered a request without one", where()));
  return std::move(*body);
}

void GroupStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  answer(FrameWriter().u8(static_cast<std::uint8_t>(Op::set)).str(key).bytes(value).frame());
}

std::vector<uint8_t> GroupStore::get(const std::string& key) {
  const auto answer = call(FrameWriter().u8(static_cast<std::uint8_t>(Op::get)).str(key).i64(timeout_.count()).frame(),
                           timeout_.count() > 0 ? timeout_ + StoreServer::kRest : timeout_);
  if (!answer) {
    throw std::runtime_error(fmt::format("the group's store at {}: key '{}' did not come within {:g} s", where(), key,
                                         timeout_.count() / 1000.0));
  }
  std::vector<std::uint8_t> body = *answer;
  FrameReader in(body);
  auto value = in.bytes();
  in.end();
  return value;
}

int64_t GroupStore::add(const std::string& key, int64_t value) {
  const auto body = answer(FrameWriter().u8(static_cast<std::uint8_t>(Op::add)).str(key).i64(value).frame());
  FrameReader in(body);
  const std::int64_t count = in.i64();
  in.end();
  return count;
}

bool GroupStore::deleteKey(const std::string& key) {
  const auto body = answer(FrameWriter().u8(static_cast<std::uint8_t>(Op::remove)).str(key).frame());
  FrameReader in(body);
  return in.u8() != 0;
}

bool GroupStore::check(const std::vector<std::string>& keys) {
  const auto body = answer(FrameWriter().u8(static_cast<std::uint8_t>(Op::check)).strings(keys).frame());
  FrameReader in(body);
  return in.u8() != 0;
}

int64_t GroupStore::getNumKeys() {
  const auto body = answer(FrameWriter().u8(static_cast<std::uint8_t>(Op::count)).frame());
  FrameReader in(body);
  return in.i64();
}

void GroupStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void GroupStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  const auto answer =
      call(FrameWriter().u8(static_cast<std::uint8_t>(Op::wait)).strings(keys).i64(timeout.count()).frame(),
           timeout.count() > 0 ? timeout + StoreServer::kRest : timeout);
  if (!answer) {
    throw std::runtime_error(fmt::format("the group's store at {}: waiting for {} timed out after {:g} s", where(),
                                         keys.size() == 1 ? "key '" + keys.front() + "'" : "keys",
                                         timeout.count() / 1000.0));
  }
}

c10::intrusive_ptr<c10d::Store> GroupStore::clone_store() {
  return c10::make_intrusive<GroupStore>(host_, port_, group_, timeout_);
}

}  // namespace trainer
