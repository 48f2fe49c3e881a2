// The training and evaluation image transforms against torchvision's: each case of
// tests/data/image_transforms.py (Debian's python3-torchvision, fixed parameters, float images)
// computed again with trainer's functions; the random draws (torchvision's get_params) by
// their ranges; the dataset keys reaching the transform; bad values refused by name.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "support/test_util.h"
#include "trainer/data.h"
#include "trainer/error.h"
#include "trainer/image.h"
#include "trainer/recipe.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::write_file;

const fs::path kFixtures = TRAINER_IMAGE_TRANSFORM_FIXTURES;

/// A raw file of `count` values of T.
template <class T>
at::Tensor read_raw(const fs::path& path, std::vector<std::int64_t> shape, at::ScalarType type) {
  std::int64_t count = 1;
  for (const auto d : shape) count *= d;
  at::Tensor out = torch::empty(shape, type);
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path << " (fixture.image_transform_files writes it)";
  in.read(reinterpret_cast<char*>(out.data_ptr<T>()), static_cast<std::streamsize>(count * sizeof(T)));
  EXPECT_EQ(in.gcount(), static_cast<std::streamsize>(count * sizeof(T))) << path;
  return out;
}

at::Tensor normalized(const at::Tensor& x) {
  return (x - torch::tensor({0.485f, 0.456f, 0.406f}).view({3, 1, 1})) /
         torch::tensor({0.229f, 0.224f, 0.225f}).view({3, 1, 1});
}

/// One line of cases.txt computed with trainer's functions: a crop with its flip and jitter
/// through apply_image_draw (the jitters in the line's order), evaluation through transform_image.
at::Tensor run_case(at::Tensor image, std::istringstream& steps) {
  at::Tensor x = image.to(torch::kFloat).div_(255.0);
  ImageTransform t;
  ImageDraw d;
  std::vector<int> order;
  bool crop = false, normalize = false;
  std::string op;
  while (steps >> op) {
    if (op == "crop") {
      steps >> d.top >> d.left >> d.height >> d.width >> t.size;
      crop = true;
    } else if (op == "flip") {
      d.flip = true;
    } else if (op == "brightness" || op == "contrast" || op == "saturation" || op == "hue") {
      const int fn = op == "brightness" ? 0 : op == "contrast" ? 1 : op == "saturation" ? 2 : 3;
      double factor = 0;
      steps >> factor;
      (fn == 0 ? d.brightness : fn == 1 ? d.contrast : fn == 2 ? d.saturation : d.hue) = factor;
      (fn == 0 ? t.brightness : fn == 1 ? t.contrast : fn == 2 ? t.saturation : t.hue) = 0.5;  // on
      order.push_back(fn);
    } else if (op == "portrait") {
      image = image.transpose(1, 2).contiguous();
      x = x.transpose(1, 2).contiguous();
    } else if (op == "resize") {
      steps >> t.resize;
    } else if (op == "centercrop") {
      steps >> t.size;
    } else if (op == "normalize") {
      normalize = true;
    } else {
      ADD_FAILURE() << "unknown step " << op;
    }
  }
  if (!crop) {  // evaluation: the uint8 image again, through transform_image
    EXPECT_TRUE(normalize);
    return transform_image(image, t, nullptr);
  }
  for (int fn = 0; fn < 4; ++fn) {  // the functions that are off, after those that are on
    if (std::find(order.begin(), order.end(), fn) == order.end()) order.push_back(fn);
  }
  std::copy(order.begin(), order.end(), d.order.begin());
  const at::Tensor out = apply_image_draw(x, t, d);
  return normalize ? normalized(out) : out;
}

// Each transform gives torchvision's values on the same float image, operation by operation in
// torchvision's order. Here Debian's python3-torch is the LibTorch trainer links, and the
// values agree to the bit; the GPU machine's Python has another build of torch, whose kernels
// (the contrast's mean, the antialiased resize) may sum in another order. The tolerance, 1e-5
// of values in [0, 1] (normalised: up to about 2.6), covers that rounding; a wrong formula, a
// crop off by a pixel or a missed step moves values by 1e-3 and more.
TEST(ImageTransforms, EachCaseGivesTorchvisionsValues) {
  const at::Tensor image = read_raw<std::uint8_t>(kFixtures / "image.bin", {3, 60, 80}, torch::kByte);
  std::ifstream cases(kFixtures / "cases.txt");
  ASSERT_TRUE(cases.good()) << kFixtures / "cases.txt";
  std::string line;
  int count = 0;
  while (std::getline(cases, line)) {
    std::istringstream in(line);
    std::string name;
    std::int64_t h = 0, w = 0;
    in >> name >> h >> w;
    SCOPED_TRACE(line);
    const at::Tensor want = read_raw<float>(kFixtures / (name + ".bin"), {3, h, w}, torch::kFloat);
    const at::Tensor got = run_case(image, in);
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-5);
    ++count;
  }
  EXPECT_EQ(count, 16);
}

// torchvision's get_params, by what each draw may be: the crop inside the image with an area
// in `scale` and an aspect in `ratio` (up to the rounding to whole pixels), the flip with
// probability `hflip`, ColorJitter's order a permutation (all 24 turn up) and its factors in
// their ranges. The draws come from the generator alone.
TEST(ImageTransforms, DrawsStayInTheirRanges) {
  ImageTransform t;
  t.scale = {0.25, 0.5};
  t.ratio = {0.5, 2.0};
  t.hflip = 0.3;
  t.brightness = 0.4;
  t.contrast = 1.5;  // the lower bound clamps to 0
  t.saturation = 0.2;
  t.hue = 0.1;
  std::mt19937_64 rng(3), again(3);
  std::set<std::array<int, 4>> orders;
  int flips = 0;
  const int n = 4000;
  for (int k = 0; k < n; ++k) {
    const ImageDraw d = draw_image_transform(300, 400, t, rng);
    ASSERT_TRUE(d.top >= 0 && d.left >= 0 && d.top + d.height <= 300 && d.left + d.width <= 400);
    const double area = static_cast<double>(d.height * d.width) / (300.0 * 400.0);
    EXPECT_GT(area, 0.25 * 0.98);
    EXPECT_LT(area, 0.5 * 1.02);
    const double aspect = static_cast<double>(d.width) / static_cast<double>(d.height);
    EXPECT_GT(aspect, 0.5 * 0.98);
    EXPECT_LT(aspect, 2.0 * 1.02);
    flips += d.flip;
    std::array<int, 4> sorted = d.order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, (std::array<int, 4>{0, 1, 2, 3}));
    orders.insert(d.order);
    EXPECT_TRUE(d.brightness >= 0.6 && d.brightness <= 1.4);
    EXPECT_TRUE(d.contrast >= 0 && d.contrast <= 2.5);
    EXPECT_TRUE(d.saturation >= 0.8 && d.saturation <= 1.2);
    EXPECT_TRUE(d.hue >= -0.1 && d.hue <= 0.1);
    const ImageDraw e = draw_image_transform(300, 400, t, again);
    EXPECT_TRUE(e.top == d.top && e.left == d.left && e.flip == d.flip && e.order == d.order && e.hue == d.hue);
  }
  EXPECT_EQ(orders.size(), 24u);
  // A binomial count: n * 0.3 = 1200 with a standard deviation of 29; 6 of them either side.
  EXPECT_NEAR(flips, 1200, 175);
  t.hflip = 0;
  EXPECT_FALSE(draw_image_transform(300, 400, t, rng).flip);
  t.hflip = 1;
  EXPECT_TRUE(draw_image_transform(300, 400, t, rng).flip);
  // No jitter: the order and factors stay neutral.
  ImageTransform plain;
  const ImageDraw d = draw_image_transform(300, 400, plain, rng);
  EXPECT_EQ(d.order, (std::array<int, 4>{0, 1, 2, 3}));
  EXPECT_TRUE(d.brightness == 1 && d.contrast == 1 && d.saturation == 1 && d.hue == 0);
}

// No crop of an area in [0.9, 1] has an aspect in [2, 3] on a 60 x 80 image: after 10 tries,
// torchvision's fallback, the centre crop of the aspect clamped to the range (80 / 2 = 40 high).
TEST(ImageTransforms, CropFallsBackToTheCentreOfTheClampedAspect) {
  ImageTransform t;
  t.scale = {0.9, 1.0};
  t.ratio = {2.0, 3.0};
  std::mt19937_64 rng(1);
  const ImageDraw d = draw_image_transform(60, 80, t, rng);
  EXPECT_EQ(std::vector<std::int64_t>({d.top, d.left, d.height, d.width}), std::vector<std::int64_t>({10, 0, 40, 80}));
  t.ratio = {0.2, 0.25};  // narrower than the image: its full height, 60 * 0.25 wide
  const ImageDraw n = draw_image_transform(60, 80, t, rng);
  EXPECT_EQ(std::vector<std::int64_t>({n.top, n.left, n.height, n.width}), std::vector<std::int64_t>({0, 32, 60, 15}));
}

// transform_image in training is the draw applied, then normalised: the same draws give the
// same sample, other draws another.
TEST(ImageTransforms, TrainingIsTheDrawApplied) {
  const at::Tensor image = read_raw<std::uint8_t>(kFixtures / "image.bin", {3, 60, 80}, torch::kByte);
  ImageTransform t;
  t.size = 32;
  t.brightness = t.contrast = t.saturation = 0.4;
  t.hue = 0.1;
  for (std::uint64_t seed = 0; seed < 5; ++seed) {
    std::mt19937_64 a(seed), b(seed);
    const at::Tensor got = transform_image(image, t, &a);
    const at::Tensor want =
        normalized(apply_image_draw(image.to(torch::kFloat).div_(255.0), t, draw_image_transform(60, 80, t, b)));
    EXPECT_TRUE(torch::equal(got, want)) << seed;
  }
  std::mt19937_64 a(1), c(2);
  EXPECT_FALSE(torch::equal(transform_image(image, t, &a), transform_image(image, t, &c)));
}

TEST(ImageTransforms, BadValuesAreRefusedByName) {
  const auto refused = [](const std::function<void(ImageTransform&)>& change) {
    ImageTransform t;
    change(t);
    try {
      check_image_transform(t, "dataset");
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(refused([](ImageTransform&) {}), "accepted");
  EXPECT_EQ(refused([](ImageTransform& t) {
              t.scale = {0.5, 0.2};
            }),
            "dataset.scale: needs 0 < min <= max <= 1 (area fractions of the image), got [0.5, 0.2]");
  EXPECT_EQ(refused([](ImageTransform& t) { t.scale = {0.5}; }), "dataset.scale: needs 2 values [min, max], got [0.5]");
  EXPECT_EQ(refused([](ImageTransform& t) {
              t.ratio = {1, 2, 3};
            }),
            "dataset.ratio: needs 2 values [min, max], got [1, 2, 3]");
  EXPECT_EQ(refused([](ImageTransform& t) {
              t.ratio = {2, 1};
            }),
            "dataset.ratio: needs 0 < min <= max (aspect ratios, width / height), got [2, 1]");
  EXPECT_EQ(refused([](ImageTransform& t) { t.hue = 0.6; }),
            "dataset.hue: needs 0 <= hue <= 0.5 (the shift is drawn from [-hue, hue] turns), got 0.6");
  EXPECT_EQ(refused([](ImageTransform& t) { t.hflip = 1.5; }), "dataset.hflip: is a probability in [0, 1], got 1.5");
  EXPECT_EQ(refused([](ImageTransform& t) { t.contrast = -1; }),
            "dataset.contrast: needs >= 0 (the factor is drawn from [max(0, 1 - x), 1 + x]), got -1");
  EXPECT_EQ(refused([](ImageTransform& t) {
              t.std = {0.2, 0, 0.2};
            }),
            "dataset.std: needs values > 0, got [0.2, 0, 0.2]");
}

/// An image_folder tree of torchvision's square.png (32 x 32) in one class, both splits.
std::string square_tree(const TempDir& tmp) {
  for (const char* split : {"train", "val"}) {
    const fs::path dir = fs::path(tmp.str()) / split / "a";
    fs::create_directories(dir);
    fs::copy_file(kFixtures / "square.png", dir / "x.png");
  }
  return "name = \"image_folder\"\nroot = \"" + tmp.str() + "\"\nimage_size = 32\nresize = 32\n";
}

at::Tensor sample(const std::string& toml, Split split, std::int64_t epoch) {
  const Config c = Config::parse(toml);
  const auto d = dataset_registry().get("image_folder").factory(c, split);
  return d->get_in_epoch(torch::tensor({0}), epoch).inputs[0];
}

// The recipe's keys reach the transform: with the crop pinned to the whole square image
// (scale [1, 1], ratio [1, 1]), training is evaluation flipped with hflip = 1 and evaluation
// itself with hflip = 0; brightness scales each sample's unclamped pixels by one factor.
TEST(ImageTransforms, DatasetKeysReachTheTransform) {
  TempDir tmp;
  const std::string tree = square_tree(tmp);
  const std::string toml = tree + "scale = [1.0, 1.0]\nratio = [1.0, 1.0]\n";
  const at::Tensor eval = sample(toml, Split::Test, -1);
  EXPECT_TRUE(torch::equal(sample(toml + "hflip = 0.0\n", Split::Train, 0), eval));
  EXPECT_TRUE(torch::equal(sample(toml + "hflip = 1.0\n", Split::Train, 0), eval.flip({2})));
  const at::Tensor bright = sample(toml + "hflip = 0.0\nbrightness = 0.5\n", Split::Train, 0);
  EXPECT_TRUE(torch::equal(bright, sample(toml + "hflip = 0.0\nbrightness = 0.5\n", Split::Train, 0)));
  const auto pixels = [](const at::Tensor& x) {  // back to [0, 1]
    return x * torch::tensor({0.229f, 0.224f, 0.225f}).view({3, 1, 1}) +
           torch::tensor({0.485f, 0.456f, 0.406f}).view({3, 1, 1});
  };
  const at::Tensor before = pixels(eval), after = pixels(bright);
  const at::Tensor kept = (after < 0.999) & (before > 0.05);  // neither clamped nor dark
  ASSERT_GT(kept.sum().item<std::int64_t>(), 100);
  const at::Tensor factor = after.masked_select(kept) / before.masked_select(kept);
  EXPECT_GE(factor.min().item<double>(), 0.5 - 1e-4);
  EXPECT_LE(factor.max().item<double>(), 1.5 + 1e-4);
  EXPECT_LT((factor.max() - factor.min()).item<double>(), 1e-4);  // one factor, float rounding apart
  EXPECT_GT((factor.mean() - 1).abs().item<double>(), 1e-3);
  try {
    sample(tree + "scale = [0.5, 0.2]\n", Split::Train, 0);
    ADD_FAILURE() << "scale [0.5, 0.2] accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("dataset.scale: needs 0 < min <= max <= 1"), std::string::npos) << e.what();
  }
}

// A recipe's values are checked against each key's range when it is read, naming the key and
// where it was set; timm's and torchvision's other names for them get the key to write.
TEST(ImageTransforms, RecipeKeysAreCheckedAndOtherNamesSuggested) {
  TempDir tmp;
  const std::string toml = square_tree(tmp);
  write_file(tmp / "r.toml", "[model]\nname = \"mlp\"\n[dataset]\n" + toml);
  auto problems = [&](const std::vector<std::string>& overrides) {
    try {
      LoadedRecipe r = load_recipe(tmp / "r.toml", overrides);
      validate_recipe(r);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(problems({"dataset.hue=0.3", "dataset.brightness=0.4", "dataset.scale=[0.3, 1.0]"}), "accepted");
  const std::string msg =
      problems({"dataset.hue=0.7", "dataset.hflip=2", "dataset.min_scale=0.2", "dataset.color_jitter=0.4"});
  EXPECT_NE(msg.find("dataset.hue"), std::string::npos) << msg;
  EXPECT_NE(msg.find("override 'dataset.hue=0.7'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dataset.hflip"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'dataset.scale'? (torchvision's RandomResizedCrop scale: [min, max])"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("did you mean 'dataset.brightness'?"), std::string::npos) << msg;
}

}  // namespace
}  // namespace trainer
