// Image decoding and the image datasets on tiny trees written here in each published layout
// with the libraries users' files come from: JPEG with libjpeg-turbo (TurboJPEG), PNG with
// libpng, Flowers102's .mat files with matio. Labels and splits, the transforms, corrupt
// files under both policies, errors for a wrong layout, and the loader giving the same batches
// with 1 and 2 workers.
#include <gtest/gtest.h>
#include <matio.h>
#include <png.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "support/bounded_child.h"
#include "support/test_util.h"
#include "trainer/data.h"
#include "trainer/error.h"
#include "trainer/image.h"
#include "trainer/loader.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::write_file;

/// An RGB test picture [H, W, 3]: a gradient with a colour of its own (`tint`).
std::vector<unsigned char> picture(int w, int h, int tint) {
  std::vector<unsigned char> px(static_cast<std::size_t>(w * h * 3));
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      unsigned char* p = &px[static_cast<std::size_t>((y * w + x) * 3)];
      p[0] = static_cast<unsigned char>((x * 255) / std::max(1, w - 1));
      p[1] = static_cast<unsigned char>((y * 255) / std::max(1, h - 1));
      p[2] = static_cast<unsigned char>(tint);
    }
  }
  return px;
}

void write_jpeg(const std::string& path, int w, int h, int tint, bool cmyk = false) {
  auto px = picture(w, h, tint);
  if (cmyk) {  // 4 bytes a pixel: the RGB values and a K of 0
    std::vector<unsigned char> four;
    for (std::size_t i = 0; i < px.size(); i += 3) four.insert(four.end(), {px[i], px[i + 1], px[i + 2], 0});
    px = four;
  }
  tjhandle tj = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  ASSERT_EQ(tjCompress2(tj, px.data(), w, 0, h, cmyk ? TJPF_CMYK : TJPF_RGB, &out, &size, TJSAMP_444, 95, 0), 0)
      << tjGetErrorStr2(tj);
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(out), static_cast<std::streamsize>(size));
  tjFree(out);
  tjDestroy(tj);
}

void write_png(const std::string& path, int w, int h, int tint, bool gray = false) {
  auto px = picture(w, h, tint);
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(w);
  image.height = static_cast<png_uint_32>(h);
  image.format = gray ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  if (gray) {
    for (int i = 0; i < w * h; ++i) px[static_cast<std::size_t>(i)] = px[static_cast<std::size_t>(i * 3)];
  }
  fs::create_directories(fs::path(path).parent_path());
  ASSERT_TRUE(png_image_write_to_file(&image, path.c_str(), 0, px.data(), 0, nullptr)) << image.message;
}

void write_mat(const std::string& path, const std::map<std::string, std::vector<double>>& vars) {
  mat_t* mat = Mat_CreateVer(path.c_str(), nullptr, MAT_FT_MAT5);
  ASSERT_NE(mat, nullptr);
  for (const auto& [name, values] : vars) {
    size_t dims[2] = {1, values.size()};
    matvar_t* v =
        Mat_VarCreate(name.c_str(), MAT_C_DOUBLE, MAT_T_DOUBLE, 2, dims, const_cast<double*>(values.data()), 0);
    ASSERT_NE(v, nullptr);
    ASSERT_EQ(Mat_VarWrite(mat, v, MAT_COMPRESSION_NONE), 0);
    Mat_VarFree(v);
  }
  Mat_Close(mat);
}

/// A MAT 5 file of one uint8 row vector `name` of `count` ones (and ones padding it to 8 bytes),
/// written byte by byte so that a huge one streams through zlib instead of being held in memory.
/// `compressed`: the variable in a miCOMPRESSED element, as MATLAB and scipy write it. `stored`
/// (uncompressed only): how many bytes of its data are written, for a file that holds less
/// than its variable declares.
void write_uint8_mat(const std::string& path, const std::string& name, std::uint64_t count, bool compressed,
                     std::uint64_t stored = std::numeric_limits<std::uint64_t>::max()) {
  auto le32 = [](std::uint64_t v) {
    std::string b(4, '\0');
    for (int i = 0; i < 4; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    return b;
  };
  auto pad8 = [](std::string b) { return b + std::string((8 - b.size() % 8) % 8, '\0'); };
  const std::uint64_t padded = (count + 7) / 8 * 8;
  const std::string head = le32(14) + le32(16 + 16 + 8 + pad8(name).size() + 8 + padded) +  // miMATRIX
                           le32(6) + le32(8) + le32(9) + le32(0) +                          // flags: mxUINT8_CLASS
                           le32(5) + le32(8) + le32(1) + le32(count) +                      // dims: 1 x count
                           le32(1) + le32(name.size()) + pad8(name) +                       // name
                           le32(2) + le32(count);                                           // miUINT8 data
  std::string header = "MATLAB 5.0 MAT-file, written by trainer's tests";
  header.resize(116, ' ');
  header += std::string(8, '\0') + std::string("\x00\x01IM", 4);
  std::ofstream out(path, std::ios::binary);
  out << header;
  if (!compressed) {
    out << head << std::string(std::min(stored, padded), '\1');
    return;
  }
  z_stream z{};
  ASSERT_EQ(deflateInit(&z, Z_BEST_SPEED), Z_OK);
  std::string packed, chunk(1 << 20, '\1'), buf(1 << 16, '\0');
  auto feed = [&](const char* p, std::size_t n, int flush) {
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(p));
    z.avail_in = static_cast<uInt>(n);
    do {
      z.next_out = reinterpret_cast<Bytef*>(buf.data());
      z.avail_out = static_cast<uInt>(buf.size());
      deflate(&z, flush);
      packed.append(buf.data(), buf.size() - z.avail_out);
    } while (z.avail_out == 0);
  };
  feed(head.data(), head.size(), Z_NO_FLUSH);
  for (std::uint64_t left = padded; left > 0;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left, chunk.size()));
    left -= n;
    feed(chunk.data(), n, left == 0 ? Z_FINISH : Z_NO_FLUSH);
  }
  deflateEnd(&z);
  out << le32(15) << le32(packed.size()) << packed;  // miCOMPRESSED
}

/// What `load` throws as a UsageError, run in a child process whose address space may grow by
/// 1 GiB at most: a reader that allocates what a file declares runs out of memory there (or is
/// stopped after a minute) instead of taking the machine's. "loaded" when it throws nothing.
std::string usage_error_within_1gib(const std::function<void()>& load) {
  return testing::run_bounded([&] {
           try {
             load();
           } catch (const UsageError& e) {
             return std::string(e.what());
           }
           return std::string("loaded");
         })
      .text;
}

std::vector<std::int64_t> labels(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous();
  return std::vector<std::int64_t>(c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel());
}

std::shared_ptr<Dataset> dataset(const std::string& toml, Split split) {
  const Config c = Config::parse(toml);
  return dataset_registry().get(c.get<std::string>("name")).factory(c, split);
}

std::string expect_usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError";
  return {};
}

TEST(Images, DecodeJpegAndPngWithTheirLibraries) {
  TempDir tmp;
  write_png(tmp / "a.png", 40, 30, 77);
  const at::Tensor png = decode_image_file(tmp / "a.png");
  ASSERT_EQ(png.sizes().vec(), (std::vector<std::int64_t>{3, 30, 40}));
  const auto px = picture(40, 30, 77);
  const at::Tensor expected =
      torch::from_blob(const_cast<unsigned char*>(px.data()), {30, 40, 3}, torch::kByte).permute({2, 0, 1});
  EXPECT_TRUE(torch::equal(png, expected));  // lossless

  write_jpeg(tmp / "a.jpg", 40, 30, 77);
  const at::Tensor jpg = decode_image_file(tmp / "a.jpg");
  ASSERT_EQ(jpg.sizes().vec(), (std::vector<std::int64_t>{3, 30, 40}));
  EXPECT_LT((jpg.to(torch::kFloat) - expected.to(torch::kFloat)).abs().mean().item<double>(), 3.0);  // quality 95

  write_png(tmp / "gray.png", 8, 6, 0, /*gray=*/true);
  const at::Tensor gray = decode_image_file(tmp / "gray.png");
  EXPECT_TRUE(torch::equal(gray[0], gray[1]));
  EXPECT_TRUE(torch::equal(gray[0], gray[2]));

  // A large JPEG decoded at the smallest libjpeg-turbo scale that keeps both sides >= 64: 1/4.
  write_jpeg(tmp / "big.jpg", 400, 300, 10);
  EXPECT_EQ(decode_image_file(tmp / "big.jpg", 64).sizes().vec(), (std::vector<std::int64_t>{3, 75, 100}));
}

TEST(Images, FilesThatAreNotImagesAreNamedInTheError) {
  TempDir tmp;
  write_file(tmp / "text.jpg", "not an image at all");
  write_file(tmp / "empty.png", "");
  write_jpeg(tmp / "ok.jpg", 16, 16, 0);
  std::string bytes = testing::read_file(tmp / "ok.jpg");
  write_file(tmp / "broken.jpg", bytes.substr(0, 3) + std::string(200, '\x11'));
  write_jpeg(tmp / "cmyk.jpg", 16, 16, 0, /*cmyk=*/true);
  for (const std::string f : {"text.jpg", "empty.png", "broken.jpg", "missing.jpg", "cmyk.jpg"}) {
    try {
      decode_image_file(tmp / f);
      ADD_FAILURE() << f << " decoded";
    } catch (const ImageError& e) {
      EXPECT_NE(std::string(e.what()).find(tmp / f), std::string::npos) << e.what();
      if (f == "cmyk.jpg") {
        EXPECT_NE(std::string(e.what()).find("a CMYK JPEG"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(ImageDatasets, EvaluationDecodesJpegsAtTheScaleItsResizeNeeds) {
  TempDir tmp;
  write_jpeg(tmp / "train/a/big.jpg", 400, 300, 10);
  write_jpeg(tmp / "val/a/big.jpg", 400, 300, 10);
  const auto test =
      dataset("name = \"image_folder\"\nroot = \"" + tmp.str() + "\"\nimage_size = 16\nresize = 80\n", Split::Test);
  ImageTransform t;
  t.size = 16;
  t.resize = 80;
  // Both sides >= 80: 3/8 (150x113), not 1/8 (50x38, enough for the 16-pixel crop alone).
  const at::Tensor scaled = decode_image_file(tmp / "val/a/big.jpg", 80);
  ASSERT_EQ(scaled.sizes().vec(), (std::vector<std::int64_t>{3, 113, 150}));
  const at::Tensor got = test->get(torch::tensor({0})).inputs[0];
  EXPECT_TRUE(torch::equal(got, transform_image(scaled, t, nullptr)));
  EXPECT_FALSE(torch::equal(got, transform_image(decode_image_file(tmp / "val/a/big.jpg", 16), t, nullptr)));
}

TEST(ImageDatasets, LimitsSpreadOverTheClasses) {
  TempDir tmp;
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 4; ++i)
      write_png(tmp / ("train/c" + std::to_string(c) + "/" + std::to_string(i) + ".png"), 8, 8, c);
    for (const char* f : {"/x.png", "/y.png"}) write_png(tmp / ("val/c" + std::to_string(c) + f), 8, 8, c);
  }
  const std::string toml = "name = \"image_folder\"\nroot = \"" + tmp.str() + "\"\nimage_size = 8\nresize = 8\n";
  const auto train = dataset(toml + "limit = 3\n", Split::Train);
  ASSERT_EQ(train->size(), 3);
  EXPECT_EQ(labels(train->get(torch::arange(3)).targets), (std::vector<std::int64_t>{0, 1, 2}));
  const auto six = dataset(toml + "limit = 6\n", Split::Train);
  EXPECT_EQ(labels(six->get(torch::arange(6)).targets), (std::vector<std::int64_t>{0, 0, 1, 1, 2, 2}));
  const auto test = dataset(toml + "eval_limit = 3\n", Split::Test);  // the first 3 would be {0, 0, 1}
  EXPECT_EQ(labels(test->get(torch::arange(3)).targets), (std::vector<std::int64_t>{0, 1, 2}));
}

TEST(Images, TransformsAreTorchvisionsImageNetRecipe) {
  const at::Tensor image = torch::randint(0, 256, {3, 60, 80}, torch::kByte);
  ImageTransform t;
  t.size = 32;
  t.resize = 36;
  const at::Tensor eval = transform_image(image, t, nullptr);
  EXPECT_EQ(eval.sizes().vec(), (std::vector<std::int64_t>{3, 32, 32}));
  EXPECT_TRUE(torch::equal(eval, transform_image(image, t, nullptr)));
  // Normalisation: a constant image of value v maps to (v/255 - mean) / std per channel.
  const at::Tensor flat = transform_image(torch::full({3, 40, 40}, 128, torch::kByte), t, nullptr);
  EXPECT_NEAR(flat[0][5][5].item<double>(), (128.0 / 255 - 0.485) / 0.229, 1e-5);
  EXPECT_NEAR(flat[2][5][5].item<double>(), (128.0 / 255 - 0.406) / 0.225, 1e-5);
  std::mt19937_64 a(1), b(1), c(2);
  const at::Tensor ta = transform_image(image, t, &a), tb = transform_image(image, t, &b),
                   tc = transform_image(image, t, &c);
  EXPECT_EQ(ta.sizes().vec(), (std::vector<std::int64_t>{3, 32, 32}));
  EXPECT_TRUE(torch::equal(ta, tb));  // the draws come from the generator alone
  EXPECT_FALSE(torch::equal(ta, tc));
}

TEST(ImageDatasets, ImageFolderLabelsAreTheSortedClassFolders) {
  TempDir tmp;
  write_jpeg(tmp / "train/tulip/1.jpg", 48, 40, 10);
  write_png(tmp / "train/tulip/2.png", 50, 36, 20);
  write_jpeg(tmp / "train/daisy/3.JPG", 40, 40, 30);
  write_file(tmp / "train/daisy/notes.txt", "ignored");
  write_png(tmp / "val/daisy/4.png", 44, 44, 40);
  write_jpeg(tmp / "val/tulip/5.jpeg", 52, 40, 50);
  const std::string toml = "name = \"image_folder\"\nroot = \"" + tmp.str() + "\"\nimage_size = 32\nresize = 36\n";
  const auto train = dataset(toml, Split::Train);
  const auto test = dataset(toml, Split::Test);
  EXPECT_EQ(train->size(), 3);
  EXPECT_EQ(test->size(), 2);
  EXPECT_EQ(train->spec().sample_shape, (std::vector<std::int64_t>{3, 32, 32}));
  EXPECT_EQ(train->spec().num_classes, 2);
  const Batch b = train->get(torch::arange(3));
  EXPECT_EQ(labels(b.targets), (std::vector<std::int64_t>{0, 1, 1}));  // daisy < tulip
  EXPECT_EQ(b.inputs.sizes().vec(), (std::vector<std::int64_t>{3, 3, 32, 32}));
  // Each sample's blue channel is its tint: sample 0 is 3.JPG (tint 30).
  EXPECT_NEAR(b.inputs[0][2].mean().item<double>(), (30.0 / 255 - 0.406) / 0.225, 0.05);
  EXPECT_EQ(labels(test->get(torch::arange(2)).targets), (std::vector<std::int64_t>{0, 1}));

  // Training draws depend on (seed, epoch, index) alone; get() is the evaluation transform.
  const at::Tensor idx = torch::tensor({2, 0}, torch::kLong);
  EXPECT_TRUE(torch::equal(train->get_in_epoch(idx, 4).inputs, train->get_in_epoch(idx, 4).inputs));
  EXPECT_FALSE(torch::equal(train->get_in_epoch(idx, 4).inputs, train->get_in_epoch(idx, 5).inputs));
  EXPECT_TRUE(
      torch::equal(train->get_in_epoch(idx, 4).inputs[1], train->get_in_epoch(torch::tensor({0}), 4).inputs[0]));
  EXPECT_TRUE(torch::equal(test->get_in_epoch(torch::arange(2), 7).inputs, test->get(torch::arange(2)).inputs));

  const std::string err = expect_usage_error(
      [&] { dataset("name = \"image_folder\"\nroot = \"" + (tmp / "nope") + "\"\n", Split::Train); });
  EXPECT_NE(err.find("does not exist"), std::string::npos) << err;
  EXPECT_NE(err.find("<root>/train/<class>/<image>"), std::string::npos) << err;

  // The labels are the training folder's: a test split without daisies keeps tulip = 1, and a
  // class training has not seen is refused, naming its folder.
  fs::remove_all(tmp / "val/daisy");
  EXPECT_EQ(labels(dataset(toml, Split::Test)->get(torch::arange(1)).targets), (std::vector<std::int64_t>{1}));
  write_png(tmp / "val/rose/6.png", 40, 40, 60);
  const std::string unseen = expect_usage_error([&] { dataset(toml, Split::Test); });
  EXPECT_NE(unseen.find(tmp / "val/rose"), std::string::npos) << unseen;
  EXPECT_NE(unseen.find("is a class the training folder"), std::string::npos) << unseen;
}

TEST(ImageDatasets, Flowers102ReadsTheOfficialSplitsFromTheMatFiles) {
  TempDir tmp;
  for (int id = 1; id <= 6; ++id) {
    char name[32];
    std::snprintf(name, sizeof name, "jpg/image_%05d.jpg", id);
    write_jpeg(tmp / name, 40 + id, 40, id * 30);
  }
  write_mat(tmp / "imagelabels.mat", {{"labels", {5, 1, 102, 5, 2, 1}}});
  write_mat(tmp / "setid.mat", {{"trnid", {4, 1}}, {"valid", {2}}, {"tstid", {6, 3, 5}}});
  const std::string toml = "name = \"flowers102\"\nroot = \"" + tmp.str() + "\"\nimage_size = 16\nresize = 20\n";
  const auto train = dataset(toml, Split::Train);
  ASSERT_EQ(train->size(), 2);
  EXPECT_EQ(train->spec().num_classes, 102);
  EXPECT_EQ(labels(train->get(torch::arange(2)).targets), (std::vector<std::int64_t>{4, 4}));  // ids 1, 4: labels 5, 5
  const auto test = dataset(toml, Split::Test);
  EXPECT_EQ(labels(test->get(torch::arange(3)).targets), (std::vector<std::int64_t>{101, 1, 0}));  // ids 3, 5, 6
  const auto val = dataset(toml + "test_split = \"val\"\n", Split::Test);
  EXPECT_EQ(labels(val->get(torch::arange(1)).targets), (std::vector<std::int64_t>{0}));
  EXPECT_EQ(dataset(toml + "train_with_val = true\n", Split::Train)->size(), 3);
  const std::string same =
      expect_usage_error([&] { dataset(toml + "train_with_val = true\ntest_split = \"val\"\n", Split::Test); });
  EXPECT_NE(same.find("would evaluate on images it trained on"), std::string::npos) << same;

  fs::remove(tmp / "setid.mat");
  const std::string err = expect_usage_error([&] { dataset(toml, Split::Train); });
  EXPECT_NE(err.find("not Flowers102's layout"), std::string::npos) << err;
  EXPECT_NE(err.find("imagelabels.mat, jpg"), std::string::npos) << err;  // what was found instead
  EXPECT_NE(err.find("robots.ox.ac.uk"), std::string::npos) << err;
}

TEST(ImageDatasets, AFlowers102MatVariableDeclaringMoreElementsThanAllowedIsRefusedBeforeItIsRead) {
  TempDir tmp;
  write_jpeg(tmp / "jpg/image_00001.jpg", 40, 40, 30);
  write_jpeg(tmp / "jpg/image_00002.jpg", 40, 40, 60);
  write_mat(tmp / "setid.mat", {{"trnid", {1, 2}}, {"valid", {1}}, {"tstid", {2}}});
  const std::string toml = "name = \"flowers102\"\nroot = \"" + tmp.str() + "\"\nimage_size = 16\nresize = 20\n";
  const std::string file = tmp / "imagelabels.mat";
  // The crafted files are ones matio reads: two labels of 1, compressed and not.
  for (const bool compressed : {true, false}) {
    write_uint8_mat(file, "labels", 2, compressed);
    EXPECT_EQ(labels(dataset(toml, Split::Train)->get(torch::arange(2)).targets), (std::vector<std::int64_t>{0, 0}));
  }

  // 200,000,000 labels in a file of about 200 KB: matio would allocate 200 MB for them, and the
  // reader 1.6 GB more for their int64 copy, before any check of the labels.
  write_uint8_mat(file, "labels", 200'000'000, true);
  EXPECT_LT(fs::file_size(file), 1u << 20);
  const std::string huge = usage_error_within_1gib([&] { dataset(toml, Split::Train); });
  EXPECT_NE(huge.find(file + ": 'labels' declares 1 x 200000000 elements, past the 10000000 a Flowers102 .mat "
                             "variable may hold"),
            std::string::npos)
      << huge;

  // Under the cap, but stored uncompressed in a file that cannot hold it.
  write_uint8_mat(file, "labels", 9'000'000, false, 16);
  const std::string past = usage_error_within_1gib([&] { dataset(toml, Split::Train); });
  EXPECT_NE(past.find(file + ": 'labels' declares 1 x 9000000 elements, stored uncompressed in a file of " +
                      std::to_string(fs::file_size(file)) + " bytes"),
            std::string::npos)
      << past;
}

TEST(ImageDatasets, Cub200ReadsItsIndexFilesAndCropsToTheBox) {
  TempDir tmp;
  write_jpeg(tmp / "images/001.Albatross/a.jpg", 60, 40, 10);
  write_jpeg(tmp / "images/001.Albatross/b.jpg", 60, 40, 20);
  write_png(tmp / "images/200.Wren/c.png", 60, 40, 30);
  write_file(tmp / "images.txt", "1 001.Albatross/a.jpg\n2 001.Albatross/b.jpg\n3 200.Wren/c.png\n");
  write_file(tmp / "image_class_labels.txt", "1 1\n2 1\n3 200\n");
  write_file(tmp / "train_test_split.txt", "1 1\n2 0\n3 1\n");
  write_file(tmp / "bounding_boxes.txt", "1 10.0 5.0 20.0 20.0\n2 0 0 60 40\n3 30.0 0.0 30.0 40.0\n");
  const std::string toml = "name = \"cub200\"\nroot = \"" + tmp.str() + "\"\nimage_size = 16\nresize = 16\n";
  const auto train = dataset(toml, Split::Train);
  ASSERT_EQ(train->size(), 2);
  EXPECT_EQ(train->spec().num_classes, 200);
  EXPECT_EQ(labels(train->get(torch::arange(2)).targets), (std::vector<std::int64_t>{0, 199}));
  EXPECT_EQ(dataset(toml, Split::Test)->size(), 1);
  // The box of image 3 is its right half, where the red gradient runs from 1/2 to 1.
  const auto boxed = dataset(toml + "crop_to_box = true\n", Split::Train);
  const double red_whole = train->get(torch::tensor({1})).inputs[0][0].mean().item<double>();
  const double red_box = boxed->get(torch::tensor({1})).inputs[0][0].mean().item<double>();
  EXPECT_GT(red_box, red_whole + 0.5);

  write_file(tmp / "image_class_labels.txt", "1 1\n2 1\n3 20O\n");
  const std::string err = expect_usage_error([&] { dataset(toml, Split::Train); });
  EXPECT_NE(err.find("label \"20O\" of image 3 outside 1..200"), std::string::npos) << err;
  const std::string layout =
      expect_usage_error([&] { dataset("name = \"cub200\"\nroot = \"" + (tmp / "images") + "\"\n", Split::Train); });
  EXPECT_NE(layout.find("not CUB-200-2011's layout"), std::string::npos) << layout;
}

TEST(ImageDatasets, ACorruptImageFailsNamingItOrIsSkippedAndCounted) {
  TempDir tmp;
  write_jpeg(tmp / "train/a/1.jpg", 32, 32, 10);
  write_file(tmp / "train/a/2.jpg", "truncated");
  write_png(tmp / "train/b/3.png", 32, 32, 30);
  write_png(tmp / "val/a/4.png", 32, 32, 30);
  const std::string toml = "name = \"image_folder\"\nroot = \"" + tmp.str() + "\"\nimage_size = 16\nresize = 16\n";
  const auto strict = dataset(toml, Split::Train);
  const std::string err = expect_usage_error([&] { strict->get(torch::arange(3)); });
  EXPECT_NE(err.find(tmp / "train/a/2.jpg"), std::string::npos) << err;
  EXPECT_NE(err.find("dataset.on_corrupt = \"fail\""), std::string::npos) << err;
  const auto lenient = dataset(toml + "on_corrupt = \"skip\"\n", Split::Train);
  const Batch b = lenient->get(torch::arange(3));
  ASSERT_EQ(b.size(), 3);  // the batch keeps its size: 2.jpg's place goes to 3.png
  EXPECT_EQ(labels(b.targets), (std::vector<std::int64_t>{0, 1, 1}));
  EXPECT_TRUE(torch::equal(b.inputs[1], b.inputs[2]));
}

TEST(FashionMnist, ClassesKeepsThoseSamplesRelabelledInTheOrderListed) {
  const auto all = dataset("name = \"fashion_mnist\"\n", Split::Test);
  const auto some = dataset("name = \"fashion_mnist\"\nclasses = [7, 2]\n", Split::Test);
  EXPECT_EQ(some->spec().num_classes, 2);
  EXPECT_EQ(some->size(), 2000);  // 1000 test images per class
  const Batch every = all->get(torch::arange(all->size()));
  const at::Tensor sevens = (every.targets == 7).nonzero().squeeze(1), twos = (every.targets == 2).nonzero().squeeze(1);
  const Batch b = some->get(torch::arange(some->size()));
  EXPECT_EQ((b.targets == 0).sum().item<std::int64_t>(), 1000);  // 7 -> 0
  // The first kept sample is the first 2 or 7 of the file, with its new label.
  const std::int64_t first = std::min(sevens[0].item<std::int64_t>(), twos[0].item<std::int64_t>());
  EXPECT_TRUE(torch::equal(b.inputs[0], every.inputs[first]));
  EXPECT_EQ(b.targets[0].item<std::int64_t>(), every.targets[first].item<std::int64_t>() == 7 ? 0 : 1);
  EXPECT_THROW(dataset("name = \"fashion_mnist\"\nclasses = [3, 3]\n", Split::Test), UsageError);
}

TEST(ImageDatasets, TheLoaderGivesTheSameBatchesWithOneAndTwoWorkers) {
  TempDir tmp;
  for (int i = 0; i < 24; ++i)
    write_jpeg(tmp / ("train/c" + std::to_string(i % 3) + "/" + std::to_string(i) + ".jpg"), 40 + i, 36, i * 10);
  const auto ds =
      dataset("name = \"image_folder\"\nroot = \"" + tmp.str() + "\"\nimage_size = 16\nresize = 18\n", Split::Train);
  auto gen = at::detail::createCPUGenerator(3);
  const at::Tensor order = at::randperm(24, gen, at::TensorOptions(at::kLong));
  std::vector<at::Tensor> batches;
  for (int b = 0; b < 24; b += 5) batches.push_back(order.slice(0, b, std::min(24, b + 5)));
  std::vector<std::vector<Batch>> got;
  for (int workers : {1, 2}) {
    BatchLoader loader(ds, workers, 3);
    got.emplace_back();
    for (std::int64_t epoch : {0, 1}) {
      loader.plan(epoch, batches);
      for (const auto& b : batches) got.back().push_back(loader.next(b));
    }
  }
  ASSERT_EQ(got[0].size(), got[1].size());
  for (std::size_t i = 0; i < got[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(got[0][i].inputs, got[1][i].inputs)) << i;
    EXPECT_TRUE(torch::equal(got[0][i].targets, got[1][i].targets)) << i;
  }
  EXPECT_FALSE(torch::equal(got[0][0].inputs, got[0][batches.size()].inputs));  // epochs draw differently
}

}  // namespace
}  // namespace trainer
