// libFuzzer target for trainer's reader of torch.save files, through load_weights (what
// model.weights runs on files downloaded from the internet): the zip archive, the pickle in it,
// the tensors it declares and the state_dict's fit to a small model. Out come the weights, or a
// UsageError saying what is wrong with the file: the expected outcomes. Anything else (a
// crash, a hang, a sanitizer finding, a leak, more than -rss_limit_mb of memory, any other
// exception) is a finding.
//
// An input is the file's bytes; the seeds (tests/fuzz/corpus_torch_save) are real files that
// Python's torch.save wrote, a checkpoint and a LoRA adapter file trainer wrote, and a
// TorchScript archive whose __setstate__ would create a file under torch::jit::load
// (tests/fuzz/torch_save_corpus.py). A zip holding constants.pkl is a TorchScript archive, which
// load_weights reads as a trainer checkpoint with trainer's reader of those (never
// torch::jit::load). Before the file is written, the CRC-32 of each stored entry is set to that
// of the bytes it points at, so that mutations of a record reach the pickle and tensor code
// rather than stopping at the CRC check.
#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "trainer/error.h"
#include "trainer/model.h"

namespace {

/// What the seeds' state_dicts hold, roughly (Linear(3, 2) and BatchNorm1d(2) in a
/// Sequential), so that some mutated files fit and load.
class SmallModel : public trainer::Model {
 public:
  SmallModel() {
    register_module("0", torch::nn::Linear(3, 2));
    register_module("1", torch::nn::BatchNorm1d(2));
  }
  at::Tensor forward(const at::Tensor& x) override { return x; }
};

std::uint64_t le(const std::uint8_t* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::uint64_t(p[i]) << (8 * i);
  return v;
}
void put32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

/// Sets the CRC-32 of every stored entry (central directory and local header) to that of its
/// bytes, as far as the structure can be followed; leaves the rest as it is.
void fix_crcs(std::vector<std::uint8_t>& b) {
  const std::size_t n = b.size();
  if (n < 22) return;
  std::size_t end = n - 22 + 1;
  while (end-- > 0 && le(&b[end], 4) != 0x06054b50) {
    if (n - end > 22 + 0xFFFF) return;
  }
  if (end >= n) return;
  std::size_t at = le(&b[end + 16], 4);
  for (std::uint64_t i = 0, count = le(&b[end + 10], 2); i < count; ++i) {
    if (at + 46 > n || le(&b[at], 4) != 0x02014b50) return;
    const std::uint64_t method = le(&b[at + 10], 2), packed = le(&b[at + 20], 4), local = le(&b[at + 42], 4);
    const std::size_t next = at + 46 + le(&b[at + 28], 2) + le(&b[at + 30], 2) + le(&b[at + 32], 2);
    if (method == 0 && local + 30 <= n && le(&b[local], 4) == 0x04034b50) {
      const std::uint64_t data = local + 30 + le(&b[local + 26], 2) + le(&b[local + 28], 2);
      if (data <= n && packed <= n - data) {
        const auto crc = static_cast<std::uint32_t>(crc32(0, b.data() + data, static_cast<uInt>(packed)));
        put32(&b[at + 16], crc);
        put32(&b[local + 14], crc);
      }
    }
    at = next;
  }
}

/// This process's input file, created once by mkostemps (mode 0600, under a name nobody can
/// guess and plant a link at beforehand) in $TMPDIR or /tmp, rewritten through its descriptor
/// for each input, and removed when the process exits.
class InputFile {
 public:
  InputFile() {
    const char* dir = std::getenv("TMPDIR");
    std::string name = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp");
    name += "/trainer-torch-save-fuzz-XXXXXX.pt";
    fd_ = ::mkostemps(name.data(), 3, O_CLOEXEC);  // 3: the suffix ".pt"
    if (fd_ < 0) {
      std::perror(("torch_save_fuzz: cannot create " + name).c_str());
      std::abort();
    }
    path_ = name;
  }
  ~InputFile() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& path() const { return path_; }

  /// Replaces the file's contents with `bytes`; false when that fails.
  bool write(const std::vector<std::uint8_t>& bytes) {
    if (::ftruncate(fd_, 0) != 0) return false;
    for (std::size_t at = 0; at < bytes.size();) {
      const ssize_t n = ::pwrite(fd_, bytes.data() + at, bytes.size() - at, static_cast<off_t>(at));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      at += static_cast<std::size_t>(n);
    }
    return true;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // model.weights names a file; the reader reads records where the zip directory points.
  static InputFile file;
  std::vector<std::uint8_t> bytes(data, data + size);
  fix_crcs(bytes);
  if (!file.write(bytes)) return 0;
  static SmallModel model;
  try {
    trainer::load_weights(model, file.path());
  } catch (const trainer::UsageError&) {
    // A file refused, saying why: the expected outcome.
  }
  return 0;
}
