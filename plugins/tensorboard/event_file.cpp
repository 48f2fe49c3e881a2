#include "event_file.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "trainer/error.h"

namespace trainer::tensorboard {

namespace {

const std::array<std::uint32_t, 256>& crc_table() {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // the reflected Castagnoli polynomial
      t[i] = c;
    }
    return t;
  }();
  return table;
}

void put_le(char* out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

std::atomic<int> g_files{0};

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t n) {
  const auto& t = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::uint32_t masked_crc32c(const void* data, std::size_t n) {
  const std::uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventFile::EventFile(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TRAINER_CHECK(!ec, "tensorboard: cannot create ", dir, ": ", ec.message());
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  // A new file every time ("x": never one that exists; "e": close-on-exec, so that a process
  // the run starts does not hold it), named as TensorFlow names its own.
  for (int attempt = 0; attempt < 100 && !file_; ++attempt) {
    path_ = dir + "/events.out.tfevents." + std::to_string(seconds) + "." + host + "." + std::to_string(::getpid()) +
            "." + fmt::format("{:06d}", g_files++);  // padded: TensorBoard reads the files in name order
    file_ = std::fopen(path_.c_str(), "wbxe");
    if (!file_ && errno != EEXIST) break;
  }
  TRAINER_CHECK(file_, "tensorboard: cannot create ", path_, ": ", std::strerror(errno));
}

EventFile::~EventFile() {
  if (file_) std::fclose(file_);
}

bool EventFile::write_record(const std::string& data) {
  // length (8 bytes, little-endian), its masked CRC, the data, its masked CRC.
  char header[12];
  put_le(header, data.size(), 8);
  put_le(header + 8, masked_crc32c(header, 8), 4);
  char footer[4];
  put_le(footer, masked_crc32c(data.data(), data.size()), 4);
  return std::fwrite(header, 1, sizeof header, file_) == sizeof header &&
         std::fwrite(data.data(), 1, data.size(), file_) == data.size() &&
         std::fwrite(footer, 1, sizeof footer, file_) == sizeof footer;
}

bool EventFile::flush() { return std::fflush(file_) == 0; }

}  // namespace trainer::tensorboard
