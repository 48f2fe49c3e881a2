// The hand-written LibTorch loop a C++ user would write instead of trainer: the default
// recipe's job (recipes/fashion_mnist.toml) with nothing but LibTorch and zlib. Same model
// (conv32-conv64 with BatchNorm, fc128, dropout 0.25), same data and normalisation, same
// seed, data order, AdamW settings, LR warm-up + cosine, batch sizes, evaluation and
// checkpoint every epoch; with --precision bf16, bf16 autocast around each forward and loss
// (as trainer's mixed_precision plugin). --device cuda:N trains there: the model on the GPU,
// each batch gathered on the host and copied over (as trainer's loader does). bench/peer/peer_bench.py runs it beside
// trainer and the Python loop. The one trainer header it includes is the LibTorch 1.13 / 2.x autocast shim.
//
// Prints one JSON object per line on stdout:
//   {"event":"eval","epoch":E,"step":S,"accuracy":A,"loss":L,"time":UNIX_SECONDS}
//   {"event":"end","train_samples":N,"train_seconds":T,"samples_per_s":R}
// train_seconds is the training phases only (epoch order, steps; no evaluation, no checkpoint),
// as trainer's train/samples_per_s; an eval record's time is taken when the evaluation ends,
// before the checkpoint, as trainer stamps eval/accuracy.
#include <torch/torch.h>
#include <zlib.h>

#include "util/torch_compat.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

/// Debian's Fashion-MNIST, under $TRAINER_DATASETS_DIR in place of /usr/share/datasets when that
/// is set (as trainer looks for it).
std::string default_root() {
  const char* moved = std::getenv("TRAINER_DATASETS_DIR");
  return std::string(moved != nullptr && *moved != '\0' ? moved : "/usr/share/datasets") + "/fashion-mnist";
}

struct Options {
  std::string root = default_root();
  std::string out_dir = "peer_cpp_run";
  std::string precision = "fp32";
  std::string device = "cpu";
  std::int64_t epochs = 4, batch_size = 128, eval_batch_size = 1000, warmup = 100, seed = 42;
  std::int64_t limit = 0, eval_limit = 0, threads = 0, log_every = 100;
  double lr = 1e-3, weight_decay = 0.01;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "peer_loop: " << why
            << "\nusage: peer_loop [--root DIR] [--out-dir DIR] [--epochs N] [--batch-size N] [--eval-batch-size N]"
               " [--lr X] [--weight-decay X] [--warmup N] [--seed N] [--limit N] [--eval-limit N] [--threads N]"
               " [--log-every N] [--precision fp32|bf16] [--device cpu|cuda:N]\n";
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage("missing value after " + a);
    const std::string v = argv[++i];
    // Whole-string numbers only ("4x" is refused).
    auto integer = [&] {
      std::size_t used = 0;
      const long long n = std::stoll(v, &used);
      if (used != v.size()) throw std::invalid_argument(v);
      return static_cast<std::int64_t>(n);
    };
    auto real = [&] {
      std::size_t used = 0;
      const double d = std::stod(v, &used);
      if (used != v.size()) throw std::invalid_argument(v);
      return d;
    };
    try {
      if (a == "--root")
        o.root = v;
      else if (a == "--out-dir")
        o.out_dir = v;
      else if (a == "--precision")
        o.precision = v;
      else if (a == "--device")
        o.device = v;
      else if (a == "--epochs")
        o.epochs = integer();
      else if (a == "--batch-size")
        o.batch_size = integer();
      else if (a == "--eval-batch-size")
        o.eval_batch_size = integer();
      else if (a == "--warmup")
        o.warmup = integer();
      else if (a == "--seed")
        o.seed = integer();
      else if (a == "--limit")
        o.limit = integer();
      else if (a == "--eval-limit")
        o.eval_limit = integer();
      else if (a == "--threads")
        o.threads = integer();
      else if (a == "--log-every")
        o.log_every = integer();
      else if (a == "--lr")
        o.lr = real();
      else if (a == "--weight-decay")
        o.weight_decay = real();
      else
        usage("unknown option " + a);
    } catch (const std::logic_error&) {
      usage("not a number: " + a + " " + v);
    }
  }
  if (o.epochs < 1 || o.batch_size < 1 || o.eval_batch_size < 1 || o.log_every < 1 || o.warmup < 0 || o.limit < 0 ||
      o.eval_limit < 0)
    usage("--epochs, --log-every and the batch sizes must be >= 1, --warmup and the limits >= 0");
  if (o.precision != "fp32" && o.precision != "bf16") usage("--precision must be fp32 or bf16, not " + o.precision);
  return o;
}

/// An IDX file, <stem>.gz or plain <stem> (gzopen reads both), big-endian header: magic,
/// dims, then uint8 data.
torch::Tensor read_idx(const std::string& stem) {
  const std::string path = std::filesystem::exists(stem + ".gz") ? stem + ".gz" : stem;
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) {
    throw std::runtime_error("no " + stem + ".gz (or " + stem +
                             "): install Debian's dataset-fashion-mnist package (scripts/install-deps.sh does) "
                             "or pass --root DIR");
  }
  auto be32 = [&] {
    unsigned char b[4];
    if (gzread(f, b, 4) != 4) throw std::runtime_error("truncated header in " + path);
    return std::int64_t(b[0]) << 24 | std::int64_t(b[1]) << 16 | std::int64_t(b[2]) << 8 | std::int64_t(b[3]);
  };
  const std::int64_t magic = be32();
  if ((magic >> 8) != 0x08) throw std::runtime_error(path + " is not a uint8 IDX file");  // 00 00 08 ndim
  std::vector<std::int64_t> dims(magic & 0xff);
  for (auto& d : dims) d = be32();
  torch::Tensor t = torch::empty(dims, torch::kUInt8);
  const auto bytes = static_cast<unsigned>(t.numel());
  if (gzread(f, t.data_ptr(), bytes) != static_cast<int>(bytes)) throw std::runtime_error("truncated data in " + path);
  gzclose(f);
  return t;
}

/// Images as normalised float [N, 1, 28, 28] (the dataset's mean and std), labels as int64.
std::pair<torch::Tensor, torch::Tensor> load(const Options& o, const std::string& stem, std::int64_t limit) {
  torch::Tensor x = read_idx(o.root + "/" + stem + "-images-idx3-ubyte");
  torch::Tensor y = read_idx(o.root + "/" + stem + "-labels-idx1-ubyte").to(torch::kLong);
  if (limit > 0 && limit < x.size(0)) {
    x = x.narrow(0, 0, limit);
    y = y.narrow(0, 0, limit);
  }
  x = x.unsqueeze(1).to(torch::kFloat).div_(255.0).sub_(0.2860).div_(0.3530);
  return {x.contiguous(), y.contiguous()};
}

struct NetImpl : torch::nn::Module {
  // One push_back at a time: the layers draw their initial weights from the seeded generator
  // in construction order (arguments of one call are constructed in an unspecified order).
  NetImpl() {
    features->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).padding(1).bias(false)));
    features->push_back(torch::nn::BatchNorm2d(32));
    features->push_back(torch::nn::ReLU());
    features->push_back(torch::nn::MaxPool2d(2));
    features->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1).bias(false)));
    features->push_back(torch::nn::BatchNorm2d(64));
    features->push_back(torch::nn::ReLU());
    features->push_back(torch::nn::MaxPool2d(2));
    head->push_back(torch::nn::Linear(64 * 7 * 7, 128));
    head->push_back(torch::nn::ReLU());
    head->push_back(torch::nn::Dropout(0.25));
    head->push_back(torch::nn::Linear(128, 10));
    register_module("features", features);
    register_module("head", head);
  }
  torch::Tensor forward(const torch::Tensor& x) { return head->forward(features->forward(x).flatten(1)); }
  torch::nn::Sequential features, head;
};
TORCH_MODULE(Net);

/// Linear warm-up, then cosine to 0 at the last step (the same floating-point operations as
/// trainer's schedule, so the learning rates are equal to the last bit).
double lr_at(const Options& o, std::int64_t step, std::int64_t total) {
  if (step < o.warmup) return o.lr * (double(step + 1) / double(o.warmup));
  const double span = double(std::max<std::int64_t>(1, total - 1 - o.warmup));
  const double progress = std::min(1.0, double(step - o.warmup) / span);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return o.lr * cosine;
}

/// bf16 autocast on `type` (kCPU or kCUDA) for one forward (and loss) when `on`; off again,
/// cast cache cleared, at exit.
struct Autocast {
  Autocast(bool on, c10::DeviceType type) : on(on), type(type) {
    if (!on) return;
    trainer::compat::set_autocast_dtype(type, c10::kBFloat16);
    trainer::compat::set_autocast_enabled(type, true);
  }
  ~Autocast() {
    if (!on) return;
    trainer::compat::set_autocast_enabled(type, false);
    at::autocast::clear_cache();
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;
  bool on;
  c10::DeviceType type;
};

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const bool bf16 = o.precision == "bf16";
  try {
    if (o.threads > 0) torch::set_num_threads(static_cast<int>(o.threads));
    torch::manual_seed(static_cast<std::uint64_t>(o.seed));
    const torch::Device device(o.device);
    auto [train_x, train_y] = load(o, "train", o.limit);
    auto [test_x, test_y] = load(o, "t10k", o.eval_limit);
    Net model;
    model->to(device);
    torch::optim::AdamW opt(
        model->parameters(),
        torch::optim::AdamWOptions(o.lr).betas({0.9, 0.999}).eps(1e-8).weight_decay(o.weight_decay));
    std::filesystem::create_directories(o.out_dir);

    const std::int64_t n = train_x.size(0);
    const std::int64_t steps_per_epoch = (n + o.batch_size - 1) / o.batch_size;
    const std::int64_t total = steps_per_epoch * o.epochs;
    std::int64_t step = 0, samples = 0;
    double train_seconds = 0;
    std::vector<std::string> kept;
    for (std::int64_t epoch = 0; epoch < o.epochs; ++epoch) {
      model->train();
      const auto t0 = std::chrono::steady_clock::now();
      auto gen = at::detail::createCPUGenerator(std::uint64_t(o.seed) * 1000003ULL + std::uint64_t(epoch));
      const torch::Tensor order = torch::randperm(n, gen, torch::TensorOptions(torch::kLong));
      double window_loss = 0;
      for (std::int64_t b = 0; b < steps_per_epoch; ++b, ++step) {
        const torch::Tensor idx = order.narrow(0, b * o.batch_size, std::min(o.batch_size, n - b * o.batch_size));
        const torch::Tensor x = train_x.index_select(0, idx).to(device), y = train_y.index_select(0, idx).to(device);
        for (auto& g : opt.param_groups()) g.options().set_lr(lr_at(o, step, total));
        // Gradients dropped, not zeroed (as trainer and zero_grad(set_to_none=True) in Python):
        // LibTorch 1.13's Optimizer::zero_grad() fills them with zeros.
        for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
        torch::Tensor loss;
        {
          Autocast autocast(bf16, device.type());
          loss = torch::nn::functional::cross_entropy(model->forward(x), y);
        }
        loss.backward();
        opt.step();
        window_loss += loss.item<double>();
        samples += idx.size(0);
        if ((step + 1) % o.log_every == 0) {
          std::cerr << "step " << step + 1 << " loss " << window_loss / double(o.log_every) << "\n";
          window_loss = 0;
        }
      }
      if (device.is_cuda()) torch::cuda::synchronize();  // the last step's kernels, inside the epoch's time
      train_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

      model->eval();
      double loss_sum = 0;
      std::int64_t correct = 0;
      {
        torch::NoGradGuard no_grad;
        for (std::int64_t i = 0; i < test_x.size(0); i += o.eval_batch_size) {
          const std::int64_t len = std::min(o.eval_batch_size, test_x.size(0) - i);
          const torch::Tensor y = test_y.narrow(0, i, len).to(device);
          torch::Tensor out, loss;
          {
            Autocast autocast(bf16, device.type());
            out = model->forward(test_x.narrow(0, i, len).to(device));
            loss = torch::nn::functional::cross_entropy(
                out, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
          }
          loss_sum += loss.item<double>();
          correct += out.argmax(1).eq(y).sum().item<std::int64_t>();
        }
      }
      const double m = double(test_x.size(0)), eval_end = unix_now();
      // Checkpoint: model + optimizer, written to a temporary file and renamed; the last two kept.
      const std::string path = o.out_dir + "/epoch_" + std::to_string(epoch + 1) + ".pt";
      torch::serialize::OutputArchive archive;
      model->save(archive);
      opt.save(archive);
      archive.save_to(path + ".tmp");
      std::filesystem::rename(path + ".tmp", path);
      kept.push_back(path);
      if (kept.size() > 2) {
        std::filesystem::remove(kept.front());
        kept.erase(kept.begin());
      }
      std::printf("{\"event\":\"eval\",\"epoch\":%lld,\"step\":%lld,\"accuracy\":%.6f,\"loss\":%.6f,\"time\":%.6f}\n",
                  static_cast<long long>(epoch + 1), static_cast<long long>(step), double(correct) / m, loss_sum / m,
                  eval_end);
      std::fflush(stdout);
    }
    std::printf("{\"event\":\"end\",\"train_samples\":%lld,\"train_seconds\":%.6f,\"samples_per_s\":%.3f}\n",
                static_cast<long long>(samples), train_seconds, double(samples) / train_seconds);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "peer_loop: " << e.what() << "\n";
    return 1;
  }
}
