// The dataset over a list of image files that every image dataset is: decoded and transformed
// when read, unreadable files skipped or refused (dataset.on_corrupt), cut down by make().
#include "data/image_datasets_detail.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <random>
#include <set>
#include <string>

#include "trainer/error.h"
#include "trainer/image.h"
#include "trainer/logging.h"

namespace trainer::detail {

namespace fs = std::filesystem;

namespace {

class ImageDataset final : public Dataset {
 public:
  ImageDataset(std::string name, std::vector<Sample> samples, std::int64_t classes, const ImageFields& s, bool train)
      : name_(std::move(name)),
        samples_(std::move(samples)),
        classes_(classes),
        train_(train && s.augment),
        skip_(s.on_corrupt == "skip"),
        seed_(static_cast<std::uint64_t>(s.seed)) {
    t_.size = s.image_size;
    t_.resize = s.resize;
    t_.scale = s.scale;
    t_.ratio = s.ratio;
    t_.hflip = s.hflip;
    t_.brightness = s.brightness;
    t_.contrast = s.contrast;
    t_.saturation = s.saturation;
    t_.hue = s.hue;
    t_.mean = s.mean;
    t_.std = s.std;
    check_image_transform(t_, "dataset");
  }

  std::int64_t size() const override { return static_cast<std::int64_t>(samples_.size()); }
  Batch get(const at::Tensor& indices) const override { return read(indices, -1); }
  Batch get_in_epoch(const at::Tensor& indices, std::int64_t epoch) const override {
    return read(indices, train_ ? epoch : -1);
  }
  DataSpec spec() const override { return {{3, t_.size, t_.size}, classes_}; }

 private:
  /// epoch < 0: the evaluation transform.
  Batch read(const at::Tensor& indices, std::int64_t epoch) const {
    const at::Tensor idx = indices.to(at::kLong).contiguous();
    const std::int64_t n = idx.size(0), count = size();
    at::Tensor inputs = at::empty({n, 3, t_.size, t_.size}, at::kFloat);
    at::Tensor targets = at::empty({n}, at::kLong);
    const auto* ids = idx.data_ptr<std::int64_t>();
    for (std::int64_t k = 0; k < n; ++k) {
      TRAINER_CHECK(ids[k] >= 0 && ids[k] < count, name_, ": sample index ", ids[k], " outside [0, ", count, ")");
      // An unreadable sample under `skip` gives its place to the next readable one.
      for (std::int64_t tries = 0, i = ids[k];; ++tries, i = (i + 1) % count) {
        TRAINER_CHECK_T(UsageError, tries < count, name_, ": no image of ", dataset_root(), " can be read");
        const Sample& s = samples_[static_cast<std::size_t>(i)];
        at::Tensor image;
        try {
          // Training crops come from the whole image, as torchvision's RandomResizedCrop takes
          // them: decoded at full size. Evaluation resizes the shorter side to `resize`: a JPEG
          // is decoded at the smallest DCT scale that keeps both sides at least that (and the
          // crop size). A box crops the full image first.
          image = decode_image_file(s.path, s.box[2] > 0 || epoch >= 0 ? 0 : std::max(t_.size, t_.resize));
        } catch (const ImageError& e) {
          if (!skip_) {
            throw UsageError(fmt::format("{} (dataset.on_corrupt = \"fail\"; \"skip\" trains without it)", e.what()));
          }
          report_skipped(s.path, e.what());
          continue;
        }
        if (s.box[2] > 0) image = crop(image, s.box);
        std::mt19937_64 rng(mix(seed_, static_cast<std::uint64_t>(epoch), static_cast<std::uint64_t>(i)));
        inputs[k].copy_(transform_image(image, t_, epoch >= 0 ? &rng : nullptr));
        targets[k] = s.label;
        break;
      }
    }
    return {inputs, targets};
  }

  static at::Tensor crop(const at::Tensor& image, const std::array<double, 4>& box) {
    const std::int64_t H = image.size(1), W = image.size(2);
    const std::int64_t x = std::clamp<std::int64_t>(static_cast<std::int64_t>(box[0]), 0, W - 1);
    const std::int64_t y = std::clamp<std::int64_t>(static_cast<std::int64_t>(box[1]), 0, H - 1);
    const std::int64_t w = std::clamp<std::int64_t>(static_cast<std::int64_t>(std::lround(box[2])), 1, W - x);
    const std::int64_t h = std::clamp<std::int64_t>(static_cast<std::int64_t>(std::lround(box[3])), 1, H - y);
    return image.narrow(1, y, h).narrow(2, x, w).contiguous();
  }

  static std::uint64_t mix(std::uint64_t seed, std::uint64_t epoch, std::uint64_t index) {
    // splitmix64 over the three, so neighbouring indices and epochs get unrelated streams.
    std::uint64_t z = seed * 0x9E3779B97F4A7C15ULL ^ (epoch + 0x632BE59BD9B4E019ULL) * 0xBF58476D1CE4E5B9ULL ^
                      (index + 1) * 0x94D049BB133111EBULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }

  std::string dataset_root() const {
    return samples_.empty() ? name_ : fs::path(samples_.front().path).parent_path().string();
  }

  void report_skipped(const std::string& path, const std::string& why) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!skipped_.insert(path).second) return;  // each file is reported once
    default_logger()->warn("{}: skipped (dataset.on_corrupt = \"skip\"; {} unreadable image{} so far): {}", name_,
                           skipped_.size(), skipped_.size() == 1 ? "" : "s", why);
  }

  std::string name_;
  std::vector<Sample> samples_;
  std::int64_t classes_;
  bool train_, skip_;
  std::uint64_t seed_;
  ImageTransform t_;
  mutable std::mutex mutex_;
  mutable std::set<std::string> skipped_;
};

}  // namespace

std::shared_ptr<Dataset> make(std::string name, std::vector<Sample> samples, std::int64_t classes, const ImageFields& s,
                              Split split) {
  const std::int64_t limit = split == Split::Train ? s.limit : s.eval_limit;
  const auto n = static_cast<std::int64_t>(samples.size());
  if (limit > 0 && limit < n) {
    std::stable_sort(samples.begin(), samples.end(),
                     [](const Sample& a, const Sample& b) { return a.label < b.label; });
    std::vector<Sample> kept;
    kept.reserve(static_cast<std::size_t>(limit));
    for (std::int64_t i = 0; i < limit; ++i)
      kept.push_back(std::move(samples[static_cast<std::size_t>(i * n / limit)]));
    samples = std::move(kept);
  }
  return std::make_shared<ImageDataset>(std::move(name), std::move(samples), classes, s, split == Split::Train);
}

}  // namespace trainer::detail
