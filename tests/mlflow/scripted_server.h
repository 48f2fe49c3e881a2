#pragma once
// A scripted HTTP server on 127.0.0.1 for the MLflow client's tests: it answers each request with
// the next (status, body) of a list, or with what a function says for the request, and keeps the
// requests it got.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace trainer::testing {

class ScriptedServer {
 public:
  using Answer = std::pair<int, std::string>;
  /// Answers the requests in turn with `answers`, then no more; `location`: the Location header
  /// of each 3xx answer.
  explicit ScriptedServer(std::vector<Answer> answers, std::string location = "")
      : answers_(std::move(answers)), location_(std::move(location)) {
    start();
  }
  /// Answers every request, until destroyed, with answer(request).
  explicit ScriptedServer(std::function<Answer(const std::string& request)> answer) : answer_(std::move(answer)) {
    start();
  }
  ~ScriptedServer() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  int port() const { return port_; }
  std::string uri() const { return "http://127.0.0.1:" + std::to_string(port_); }
  /// The requests so far, each whole (request line, headers, body).
  std::vector<std::string> requests;

 private:
  int fd_ = -1, port_ = 0;
  std::vector<Answer> answers_;
  std::function<Answer(const std::string&)> answer_;
  std::string location_;
  std::thread thread_;

  void start() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(fd_, 8), 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }

  static std::string read_request(int c) {
    std::string req;
    char buf[4096];
    std::size_t need = std::string::npos;
    while (true) {
      const ssize_t n = ::read(c, buf, sizeof buf);
      if (n <= 0) break;
      req.append(buf, static_cast<std::size_t>(n));
      const auto end = req.find("\r\n\r\n");
      if (end != std::string::npos && need == std::string::npos) {
        std::size_t length = 0;
        const auto cl = req.find("Content-Length: ");
        if (cl != std::string::npos && cl < end) length = std::stoul(req.substr(cl + 16));
        need = end + 4 + length;
        // An upload asks first (curl waits a second for the answer, then sends anyway).
        if (req.find("Expect: 100-continue") < end) {
          const std::string go = "HTTP/1.1 100 Continue\r\n\r\n";
          [[maybe_unused]] const ssize_t w = ::write(c, go.data(), go.size());
        }
      }
      if (need != std::string::npos && req.size() >= need) break;
    }
    return req;
  }

  void serve() {
    for (std::size_t served = 0; answer_ || served < answers_.size(); ++served) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      const std::string req = read_request(c);
      requests.push_back(req);
      const auto [status, body] = answer_ ? answer_(req) : answers_[served];
      const std::string reply = "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: application/json\r\n" +
                                (status == 429 ? "Retry-After: 7\r\n" : "") +
                                (status >= 300 && status < 400 ? "Location: " + location_ + "\r\n" : "") +
                                "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
                                body;
      [[maybe_unused]] const ssize_t w = ::write(c, reply.data(), reply.size());
      ::close(c);
    }
  }
};

}  // namespace trainer::testing
