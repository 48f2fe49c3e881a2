#include <ATen/ATen.h>
#include <fmt/format.h>
#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <vector>

#include "data/array_datasets.h"
#include "data/image_datasets.h"
#include "data/text_dataset.h"
#include "trainer/data.h"
#include "trainer/error.h"
#include "trainer/settings.h"

namespace fs = std::filesystem;

namespace trainer {

at::Tensor read_idx_file(const std::string& path) {
  // gzopen reads plain files as well, so .gz and decompressed IDX files both work.
  gzFile f = gzopen(path.c_str(), "rb");
  TRAINER_CHECK_T(UsageError, f != nullptr, "cannot open ", path);
  auto read_exact = [&](void* buf, std::size_t n) {
    std::size_t done = 0;
    while (done < n) {
      const int got =
          gzread(f, static_cast<char*>(buf) + done, static_cast<unsigned>(std::min<std::size_t>(n - done, 1u << 30)));
      if (got <= 0) return false;
      done += static_cast<std::size_t>(got);
    }
    return true;
  };
  unsigned char magic[4];
  if (!read_exact(magic, 4) || magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 || magic[3] < 1 || magic[3] > 4) {
    gzclose(f);
    throw UsageError(fmt::format("{}: not an unsigned-byte IDX file (bad magic number)", path));
  }
  std::vector<std::int64_t> dims(magic[3]);
  std::int64_t total = 1;
  for (auto& d : dims) {
    unsigned char b[4];
    if (!read_exact(b, 4)) {
      gzclose(f);
      throw UsageError(fmt::format("{}: truncated IDX header", path));
    }
    d = (std::int64_t(b[0]) << 24) | (std::int64_t(b[1]) << 16) | (std::int64_t(b[2]) << 8) | std::int64_t(b[3]);
    // At most 2^40 bytes in all (each size is below 2^32): the product cannot overflow.
    if (d > 0 && total > (std::int64_t{1} << 40) / d) {
      gzclose(f);
      throw UsageError(fmt::format("{}: an IDX header whose sizes make more than 2^40 bytes", path));
    }
    total *= d;
  }
  // The header's sizes are the file's word: what it claims must fit in what the file can hold,
  // so that memory is bounded by the file's size. Uncompressed, that is the file less its
  // header; gzip'd, deflate gives at most 1032 bytes per byte of the file.
  std::error_code ec;
  const auto file_bytes = static_cast<std::int64_t>(fs::file_size(path, ec));
  const std::int64_t header = 4 + 4 * static_cast<std::int64_t>(dims.size());
  const std::int64_t most = ec ? 0 : gzdirect(f) ? file_bytes - header : 1032 * file_bytes;
  if (total > most) {
    gzclose(f);
    throw UsageError(fmt::format("{}: its IDX header says {} bytes of data; the file can hold at most {}", path, total,
                                 std::max<std::int64_t>(most, 0)));
  }
  at::Tensor t = at::empty(dims, at::kByte);
  const bool ok = read_exact(t.data_ptr<std::uint8_t>(), static_cast<std::size_t>(total));
  gzclose(f);
  TRAINER_CHECK_T(UsageError, ok, path, ": truncated IDX data (its header says ", total, " bytes)");
  return t;
}

namespace {

/// Fashion-MNIST (or MNIST) in IDX files: 28x28 grey images, 10 classes.
class IdxImageDataset final : public Dataset {
 public:
  IdxImageDataset(at::Tensor images, at::Tensor labels, double mean, double std, std::int64_t classes)
      : images_(images.unsqueeze(1).contiguous()),
        labels_(labels.to(at::kLong)),
        mean_(mean),
        std_(std),
        classes_(classes) {
    TRAINER_CHECK(images_.size(0) == labels_.size(0), "image and label counts differ: ", images_.size(0), " vs ",
                  labels_.size(0));
  }
  std::int64_t size() const override { return labels_.size(0); }
  Batch get(const at::Tensor& idx) const override {
    at::Tensor x = images_.index_select(0, idx).to(at::kFloat).div_(255.0).sub_(mean_).div_(std_);
    return {x, labels_.index_select(0, idx)};
  }
  DataSpec spec() const override { return {{1, images_.size(2), images_.size(3)}, classes_}; }

 private:
  at::Tensor images_, labels_;
  double mean_, std_;
  std::int64_t classes_;
};

/// Where Debian's dataset packages install their files.
constexpr const char* kDebianDatasets = "/usr/share/datasets";

/// `root`, or where it is on this machine: a root under /usr/share/datasets is looked up under
/// $TRAINER_DATASETS_DIR when that is set (a machine with Debian's dataset files elsewhere, as
/// the GPU bundle of scripts/gpu-bundle.sh unpacks them).
std::string dataset_root(const std::string& root) {
  const char* moved = std::getenv("TRAINER_DATASETS_DIR");
  const fs::path p = fs::path(root).lexically_normal();
  if (moved == nullptr || *moved == '\0') return root;
  const fs::path rel = p.lexically_relative(kDebianDatasets);
  if (rel.empty() || *rel.begin() == "..") return root;
  return (fs::path(moved) / rel).string();
}

std::string find_idx(const std::string& configured_root, const std::string& stem) {
  const std::string root = dataset_root(configured_root);
  for (const char* ext : {".gz", ""}) {
    const fs::path p = fs::path(root) / (stem + ext);
    if (fs::is_regular_file(p)) return p.string();
  }
  const std::string moved = root == configured_root ? "" : " ($TRAINER_DATASETS_DIR in place of /usr/share/datasets)";
  throw UsageError(
      fmt::format("Fashion-MNIST not found: no {}.gz (or {}) in {}{}. Install Debian's dataset-fashion-mnist package "
                  "(scripts/install-deps.sh does) or point dataset.root at a directory holding the IDX files.",
                  stem, stem, root, moved));
}

/// Random inputs and targets from a seed, for benchmarks and tests: random class indices
/// ("classes"), or targets a model can learn from the inputs, through a random projection `w`
/// of the flattened inputs: 0/1 labels, 1 where the projection is
/// positive ("labels", [N, classes]), or the projection itself ("values", [N] or [N, outputs]).
class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(std::int64_t n, std::vector<std::int64_t> shape, std::int64_t classes, std::uint64_t seed,
                   const std::string& kind = "classes", std::int64_t outputs = 1)
      : shape_(std::move(shape)), classes_(kind == "classes" ? classes : 0) {
    auto gen = at::detail::createCPUGenerator(seed);
    std::vector<std::int64_t> full{n};
    full.insert(full.end(), shape_.begin(), shape_.end());
    inputs_ = at::randn(full, gen, at::TensorOptions(at::kFloat));
    targets_ = at::randint(classes, {n}, gen, at::TensorOptions(at::kLong));
    if (kind == "classes") return;
    const std::int64_t features = inputs_[0].numel();
    const std::int64_t width = kind == "labels" ? classes : outputs;
    // The projection is the same for every seed: the train and test splits, whose seeds differ,
    // must share it, so it comes from a generator of its own with a constant seed.
    auto wgen = at::detail::createCPUGenerator(0x5eedu);
    const at::Tensor w =
        at::randn({features, width}, wgen, at::TensorOptions(at::kFloat)) / std::sqrt(static_cast<double>(features));
    const at::Tensor projection = at::mm(inputs_.reshape({n, features}), w);
    if (kind == "labels") {
      targets_ = projection.gt(0).to(at::kFloat);
    } else {
      targets_ = outputs == 1 ? projection.reshape({n}) : projection;
    }
  }
  std::int64_t size() const override { return targets_.size(0); }
  Batch get(const at::Tensor& idx) const override {
    return {inputs_.index_select(0, idx), targets_.index_select(0, idx)};
  }
  DataSpec spec() const override { return {shape_, classes_}; }

 private:
  std::vector<std::int64_t> shape_;
  std::int64_t classes_;
  at::Tensor inputs_, targets_;
};

class LimitedDataset final : public Dataset {
 public:
  LimitedDataset(std::shared_ptr<Dataset> base, std::int64_t n) : base_(std::move(base)), n_(n) {}
  std::int64_t size() const override { return n_; }
  Batch get(const at::Tensor& idx) const override { return base_->get(idx); }
  Batch get_in_epoch(const at::Tensor& idx, std::int64_t epoch) const override {
    return base_->get_in_epoch(idx, epoch);
  }
  DataSpec spec() const override { return base_->spec(); }
  at::Tensor lengths() const override {
    const at::Tensor l = base_->lengths();
    return l.defined() ? l.narrow(0, 0, n_) : l;
  }

 private:
  std::shared_ptr<Dataset> base_;
  std::int64_t n_;
};

}  // namespace

std::shared_ptr<Dataset> limit_dataset(std::shared_ptr<Dataset> ds, std::int64_t limit) {
  if (limit <= 0 || limit >= ds->size()) return ds;
  return std::make_shared<LimitedDataset>(std::move(ds), limit);
}

namespace {

/// [dataset] of "fashion_mnist".
struct FashionMnistSettings : Settings<FashionMnistSettings> {
  std::string root = "/usr/share/datasets/fashion-mnist";
  std::int64_t limit = 0;
  std::int64_t eval_limit = 0;
  std::vector<std::int64_t> classes;

  static void declare(SettingsSchema<FashionMnistSettings>& s) {
    s.add(&FashionMnistSettings::root, "root", "Directory with the IDX files (.gz or plain)");
    s.add(&FashionMnistSettings::classes, "classes",
          "Keep only these classes (0-9), relabelled 0, 1, ... in the order given; empty = all 10")
        .min(0)
        .max(9);
    s.add(&FashionMnistSettings::limit, "limit", "Train on the first N samples; 0 = all").min(0);
    s.add(&FashionMnistSettings::eval_limit, "eval_limit", "Evaluate on the first N test samples; 0 = all").min(0);
  }
};

/// [dataset] of "synthetic".
struct SyntheticSettings : Settings<SyntheticSettings> {
  std::int64_t size = 1024;
  std::int64_t eval_size = 256;
  std::vector<std::int64_t> shape{1, 28, 28};
  std::int64_t num_classes = 10;
  std::int64_t seed = 0;
  std::string targets = "classes";
  std::int64_t num_targets = 1;

  static void declare(SettingsSchema<SyntheticSettings>& s) {
    s.add(&SyntheticSettings::size, "size", "Training samples").min(1);
    s.add(&SyntheticSettings::eval_size, "eval_size", "Test samples").min(1);
    s.add(&SyntheticSettings::shape, "shape", "Sample shape").min(1);
    s.add(&SyntheticSettings::num_classes, "num_classes", "Classes (targets = \"labels\": labels)").min(2);
    s.add(&SyntheticSettings::seed, "seed", "Generator seed").min(0);
    s.add(&SyntheticSettings::targets, "targets",
          "classes: random class indices [N]; labels: 0/1 labels [N, num_classes] and values: real values [N] or "
          "[N, num_targets], both a fixed random projection of the inputs (learnable)")
        .choices({"classes", "labels", "values"});
    s.add(&SyntheticSettings::num_targets, "num_targets", "Values per sample (targets = \"values\")").min(1);
  }
};

}  // namespace

Registry<DatasetFactory>& dataset_registry() {
  static Registry<DatasetFactory>* reg = [] {
    auto* r = new Registry<DatasetFactory>("dataset");
    r->add(
        "fashion_mnist",
        [](const Config& c, Split split) -> std::shared_ptr<Dataset> {
          const auto s = FashionMnistSettings::from(c);
          const std::string prefix = split == Split::Train ? "train" : "t10k";
          const std::string images_file = find_idx(s.root, prefix + "-images-idx3-ubyte");
          const std::string labels_file = find_idx(s.root, prefix + "-labels-idx1-ubyte");
          auto images = read_idx_file(images_file);
          auto labels = read_idx_file(labels_file);
          TRAINER_CHECK_T(UsageError, images.dim() == 3 && labels.dim() == 1, images_file, " and ", labels_file,
                          ": IDX files of images [N, rows, columns] and labels [N] expected, got ", images.sizes(),
                          " and ", labels.sizes());
          TRAINER_CHECK_T(UsageError, images.size(0) == labels.size(0), images_file, " holds ", images.size(0),
                          " images and ", labels_file, " ", labels.size(0), " labels");
          TRAINER_CHECK_T(UsageError, labels.numel() == 0 || labels.max().item<std::int64_t>() < 10, labels_file,
                          ": a label of ", labels.numel() == 0 ? 0 : labels.max().item<std::int64_t>(),
                          "; Fashion-MNIST's are 0 to 9");
          std::int64_t classes = 10;
          if (!s.classes.empty()) {
            // The samples of the chosen classes, in file order, relabelled by position in the list.
            const std::set<std::int64_t> unique(s.classes.begin(), s.classes.end());
            TRAINER_CHECK_T(UsageError, unique.size() == s.classes.size(), "dataset.classes lists a class twice");
            at::Tensor relabel = at::full({10}, -1, at::kLong);
            for (std::size_t i = 0; i < s.classes.size(); ++i) relabel[s.classes[i]] = static_cast<std::int64_t>(i);
            const at::Tensor mapped = relabel.index_select(0, labels.to(at::kLong));
            const at::Tensor keep = mapped.ge(0).nonzero().squeeze(1);
            images = images.index_select(0, keep);
            labels = mapped.index_select(0, keep);
            classes = static_cast<std::int64_t>(s.classes.size());
          }
          auto ds = std::make_shared<IdxImageDataset>(images, labels, 0.2860, 0.3530, classes);
          return limit_dataset(ds, split == Split::Train ? s.limit : s.eval_limit);
        },
        FashionMnistSettings::keys(),
        "Fashion-MNIST from Debian's dataset-fashion-mnist (60k train, 10k test, 28x28, 10 classes)");
    r->add(
        "synthetic",
        [](const Config& c, Split split) -> std::shared_ptr<Dataset> {
          const auto s = SyntheticSettings::from(c);
          const auto seed = static_cast<std::uint64_t>(s.seed) + (split == Split::Train ? 0 : 1);
          return std::make_shared<SyntheticDataset>(split == Split::Train ? s.size : s.eval_size, s.shape,
                                                    s.num_classes, seed, s.targets, s.num_targets);
        },
        SyntheticSettings::keys(),
        "Random Gaussian inputs with random class labels, or learnable 0/1 labels or values (benchmarks, tests)");
    add_image_datasets(*r);
    add_array_datasets(*r);
    detail::add_text_dataset(*r);
    return r;
  }();
  return *reg;
}

}  // namespace trainer
