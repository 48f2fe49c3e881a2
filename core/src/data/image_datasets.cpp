// Image datasets in their published layouts: ImageFolder (one sub-folder per class),
// Flowers102 (jpg/, imagelabels.mat, setid.mat, read with matio) and CUB-200-2011 (images.txt,
// image_class_labels.txt, train_test_split.txt, images/, bounding_boxes.txt). Samples are
// decoded when read (trainer/image.h), normally by the loader's workers.
#include "data/image_datasets.h"

#include <fmt/format.h>
#include <matio.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "data/image_datasets_detail.h"
#include "trainer/error.h"
#include "trainer/interrupt.h"
#include "trainer/settings.h"

namespace trainer {

namespace fs = std::filesystem;

namespace {

using detail::declare_common;
using detail::field;
using detail::ImageFields;
using detail::make;
using detail::Sample;

struct ImageFolderSettings : ImageFields, Settings<ImageFolderSettings> {
  static void declare(SettingsSchema<ImageFolderSettings>& s) {
    declare_common(s);
    s.add(field<ImageFolderSettings>(&ImageFields::train_dir), "train_dir",
          "Sub-directory of root with the training split's class folders");
    s.add(field<ImageFolderSettings>(&ImageFields::test_dir), "test_dir",
          "Sub-directory of root with the test split's class folders");
  }
};

struct FlowersSettings : ImageFields, Settings<FlowersSettings> {
  static void declare(SettingsSchema<FlowersSettings>& s) {
    declare_common(s);
    s.add(field<FlowersSettings>(&ImageFields::test_split), "test_split",
          "The official split evaluated on: test (6149 images) or val (1020)")
        .choices({"test", "val"});
    s.add(field<FlowersSettings>(&ImageFields::train_with_val), "train_with_val",
          "Train on the official train and val splits (2040 images) instead of train alone (1020)");
  }
};

struct CubSettings : ImageFields, Settings<CubSettings> {
  static void declare(SettingsSchema<CubSettings>& s) {
    declare_common(s);
    s.add(field<CubSettings>(&ImageFields::crop_to_box), "crop_to_box",
          "Crop each image to its bounding box (bounding_boxes.txt) first");
  }
};

bool is_image_file(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

/// What `dir` holds, for error messages: its first few entries, or that it does not exist.
std::string found_in(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return dir.string() + " does not exist";
  if (!fs::is_directory(dir, ec)) return dir.string() + " is not a directory";
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  if (names.empty()) return dir.string() + " is empty";
  std::ostringstream os;
  os << dir.string() << " holds ";
  for (std::size_t i = 0; i < std::min<std::size_t>(names.size(), 6); ++i) os << (i ? ", " : "") << names[i];
  if (names.size() > 6) os << ", ... (" << names.size() << " entries)";
  return os.str();
}

std::shared_ptr<Dataset> image_folder(const Config& c, Split split) {
  const ImageFolderSettings s = ImageFolderSettings::from(c);
  const fs::path dir = fs::path(s.root) / (split == Split::Train ? s.train_dir : s.test_dir);
  const auto layout = [&](const std::string& what) {
    return UsageError(fmt::format(
        "dataset.root = \"{}\": {}; an ImageFolder is <root>/{}/<class>/<image> and <root>/{}/<class>/<image> (JPEG or "
        "PNG; the class folders, sorted by name, are the labels; dataset.train_dir and dataset.test_dir name the two)",
        s.root, what, s.train_dir, s.test_dir));
  };
  // The labels are the training folder's classes, sorted by name, for both splits: a test
  // split that lacks a class keeps the others' labels, and one with a class training has not
  // seen is refused.
  const auto class_folders = [&](const fs::path& d) {
    std::error_code ec;
    if (!fs::is_directory(d, ec)) throw layout(found_in(d.parent_path()) + ", no " + d.filename().string() + "/");
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(d, ec)) {
      if (e.is_directory()) out.push_back(e.path().filename().string());
    }
    std::sort(out.begin(), out.end());
    if (out.empty()) throw layout(found_in(d) + ": no class folders");
    return out;
  };
  const std::vector<std::string> classes = class_folders(fs::path(s.root) / s.train_dir);
  const std::vector<std::string> here = split == Split::Train ? classes : class_folders(dir);
  std::vector<Sample> samples;
  std::error_code ec;
  for (const auto& name : here) {
    const auto it = std::lower_bound(classes.begin(), classes.end(), name);
    if (it == classes.end() || *it != name) {
      throw layout(fmt::format("{} is a class the training folder {} does not have", (dir / name).string(),
                               (fs::path(s.root) / s.train_dir).string()));
    }
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(dir / name, ec)) {
      // A folder of a million images on a slow disk takes a while: Ctrl-C is answered here.
      if (files.size() % 1024 == 0) throw_if_interrupted("listing the image folders");
      if (e.is_regular_file() && is_image_file(e.path())) files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
    for (auto& f : files) samples.push_back({std::move(f), static_cast<std::int64_t>(it - classes.begin()), {}});
  }
  if (samples.empty()) throw layout(found_in(dir / here.front()) + ": no .jpg, .jpeg or .png in the class folders");
  return make("image_folder " + dir.string(), std::move(samples), static_cast<std::int64_t>(classes.size()), s, split);
}

/// Elements one variable of a Flowers102 .mat file may declare. The files are untrusted and
/// matio allocates a variable's data from its declared dimensions before reading it (a
/// compressed variable of a billion zeros fits in a 1 MB file). Flowers102 has 8189 images;
/// ten million is over a thousand times that, and bounds what a read allocates to 160 MB
/// (matio's doubles, then the int64 copy).
constexpr std::uint64_t kMaxMatElements = 10'000'000;

/// A numeric variable of a .mat file as int64 values (any numeric class), row-major flattening
/// of a vector. Its shape, class and size are checked (Mat_VarReadInfo) before its data is read.
std::vector<std::int64_t> mat_vector(const fs::path& file, const char* var) {
  mat_t* mat = Mat_Open(file.string().c_str(), MAT_ACC_RDONLY);
  TRAINER_CHECK_T(UsageError, mat != nullptr, file.string(), ": not a readable .mat file (matio)");
  std::unique_ptr<mat_t, int (*)(mat_t*)> closer(mat, Mat_Close);
  matvar_t* v = Mat_VarReadInfo(mat, var);
  TRAINER_CHECK_T(UsageError, v != nullptr, file.string(), ": no variable '", var, "'");
  std::unique_ptr<matvar_t, void (*)(matvar_t*)> freer(v, Mat_VarFree);
  TRAINER_CHECK_T(UsageError, v->rank == 2 && (v->dims[0] == 1 || v->dims[1] == 1) && !v->isComplex, file.string(),
                  ": '", var, "' is not a real vector");
  const std::set<matio_classes> numeric = {MAT_C_DOUBLE, MAT_C_SINGLE, MAT_C_UINT8,  MAT_C_INT16,
                                           MAT_C_UINT16, MAT_C_INT32,  MAT_C_UINT32, MAT_C_INT64};
  TRAINER_CHECK_T(UsageError, numeric.count(v->class_type) > 0, file.string(), ": '", var, "' is not numeric");
  const std::uint64_t n = static_cast<std::uint64_t>(v->dims[0]) * v->dims[1];  // one of them is 1
  const std::string declared = fmt::format("'{}' declares {} x {} elements", var, v->dims[0], v->dims[1]);
  TRAINER_CHECK_T(UsageError, n <= kMaxMatElements, file.string(), ": ", declared, ", past the ", kMaxMatElements,
                  " a Flowers102 .mat variable may hold (the data set has 8189 images)");
  // Stored uncompressed, each element takes at least a byte of the file (a .mat file may store
  // a double array's elements as uint8, never in less).
  std::error_code ec;
  const std::uint64_t file_bytes = fs::file_size(file, ec);
  TRAINER_CHECK_T(UsageError, v->compression != MAT_COMPRESSION_NONE || ec || n <= file_bytes, file.string(), ": ",
                  declared, ", stored uncompressed in a file of ", file_bytes, " bytes (at least one byte each)");
  TRAINER_CHECK_T(UsageError, Mat_VarReadDataAll(mat, v) == 0 && v->data != nullptr, file.string(), ": '", var,
                  "' is damaged (matio could not read its data)");
  std::vector<std::int64_t> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    double x = 0;
    switch (v->class_type) {
      case MAT_C_DOUBLE:
        x = static_cast<const double*>(v->data)[i];
        break;
      case MAT_C_SINGLE:
        x = static_cast<const float*>(v->data)[i];
        break;
      case MAT_C_UINT8:
        x = static_cast<const std::uint8_t*>(v->data)[i];
        break;
      case MAT_C_INT16:
        x = static_cast<const std::int16_t*>(v->data)[i];
        break;
      case MAT_C_UINT16:
        x = static_cast<const std::uint16_t*>(v->data)[i];
        break;
      case MAT_C_INT32:
        x = static_cast<const std::int32_t*>(v->data)[i];
        break;
      case MAT_C_UINT32:
        x = static_cast<const std::uint32_t*>(v->data)[i];
        break;
      case MAT_C_INT64:
        x = static_cast<double>(static_cast<const std::int64_t*>(v->data)[i]);
        break;
      default:
        throw UsageError(fmt::format("{}: '{}' is not numeric", file.string(), var));
    }
    out[i] = static_cast<std::int64_t>(x);
  }
  return out;
}

std::shared_ptr<Dataset> flowers102(const Config& c, Split split) {
  const FlowersSettings s = FlowersSettings::from(c);
  const fs::path root(s.root);
  const fs::path labels_file = root / "imagelabels.mat", setid_file = root / "setid.mat", jpg = root / "jpg";
  std::error_code ec;
  if (!fs::is_regular_file(labels_file, ec) || !fs::is_regular_file(setid_file, ec) || !fs::is_directory(jpg, ec)) {
    throw UsageError(fmt::format(
        "dataset.root = \"{}\": not Flowers102's layout ({}); expected jpg/image_00001.jpg ... jpg/image_08189.jpg, "
        "imagelabels.mat and setid.mat, as published at https://www.robots.ox.ac.uk/~vgg/data/flowers/102/ "
        "(102flowers.tgz unpacked there, and the two .mat files)",
        s.root, found_in(root)));
  }
  TRAINER_CHECK_T(UsageError, !(s.train_with_val && s.test_split == "val"),
                  "dataset.train_with_val = true with dataset.test_split = \"val\" would evaluate on images it trained "
                  "on; evaluate on \"test\", or train without val");
  const std::vector<std::int64_t> labels = mat_vector(labels_file, "labels");
  std::vector<std::int64_t> ids;
  if (split == Split::Train) {
    ids = mat_vector(setid_file, "trnid");
    if (s.train_with_val) {
      const auto val = mat_vector(setid_file, "valid");
      ids.insert(ids.end(), val.begin(), val.end());
    }
  } else {
    ids = mat_vector(setid_file, s.test_split == "val" ? "valid" : "tstid");
  }
  std::sort(ids.begin(), ids.end());
  std::vector<Sample> samples;
  for (const std::int64_t id : ids) {
    TRAINER_CHECK_T(UsageError, id >= 1 && id <= static_cast<std::int64_t>(labels.size()), setid_file.string(),
                    ": image id ", id, " outside imagelabels.mat's 1..", labels.size());
    const std::int64_t label = labels[static_cast<std::size_t>(id - 1)];
    TRAINER_CHECK_T(UsageError, label >= 1 && label <= 102, labels_file.string(), ": label ", label, " of image ", id,
                    " outside 1..102");
    char name[32];
    std::snprintf(name, sizeof name, "image_%05lld.jpg", static_cast<long long>(id));
    samples.push_back({(jpg / name).string(), label - 1, {}});
  }
  TRAINER_CHECK_T(UsageError, !samples.empty(), setid_file.string(), ": the split is empty");
  return make("flowers102", std::move(samples), 102, s, split);
}

/// "<id> <rest>" lines of a CUB-200 index file, by id.
std::map<std::int64_t, std::string> cub_lines(const fs::path& file) {
  std::ifstream in(file);
  TRAINER_CHECK_T(UsageError, in.good(), file.string(), ": cannot be read");
  std::map<std::int64_t, std::string> out;
  std::string line;
  for (std::int64_t n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line == "\r") continue;
    std::istringstream ls(line);
    std::int64_t id = 0;
    std::string rest;
    ls >> id;
    std::getline(ls >> std::ws, rest);
    if (!rest.empty() && rest.back() == '\r') rest.pop_back();
    TRAINER_CHECK_T(UsageError, !ls.fail() && id > 0 && !rest.empty(), file.string(), ":", n,
                    ": expected \"<image id> <value>\", got \"", line, "\"");
    out[id] = rest;
  }
  return out;
}

std::shared_ptr<Dataset> cub200(const Config& c, Split split) {
  const CubSettings s = CubSettings::from(c);
  const fs::path root(s.root);
  std::error_code ec;
  for (const char* f : {"images.txt", "image_class_labels.txt", "train_test_split.txt"}) {
    if (!fs::is_regular_file(root / f, ec) || !fs::is_directory(root / "images", ec)) {
      throw UsageError(fmt::format(
          "dataset.root = \"{}\": not CUB-200-2011's layout ({}); expected images.txt, image_class_labels.txt, "
          "train_test_split.txt, images/<class>/<image>.jpg (and bounding_boxes.txt for dataset.crop_to_box), as in "
          "CUB_200_2011.tgz from https://www.vision.caltech.edu/datasets/cub_200_2011/ unpacked (root is its "
          "CUB_200_2011 directory)",
          s.root, found_in(root)));
    }
  }
  const auto images = cub_lines(root / "images.txt");
  const auto labels = cub_lines(root / "image_class_labels.txt");
  const auto is_train = cub_lines(root / "train_test_split.txt");
  std::map<std::int64_t, std::string> boxes;
  if (s.crop_to_box) {
    TRAINER_CHECK_T(UsageError, fs::is_regular_file(root / "bounding_boxes.txt", ec),
                    "dataset.crop_to_box = true: ", (root / "bounding_boxes.txt").string(), " does not exist");
    boxes = cub_lines(root / "bounding_boxes.txt");
  }
  std::vector<Sample> samples;
  for (const auto& [id, path] : images) {
    const auto t = is_train.find(id);
    const auto l = labels.find(id);
    TRAINER_CHECK_T(UsageError, t != is_train.end() && l != labels.end(), root.string(), ": image ", id,
                    " of images.txt has no line in ",
                    t == is_train.end() ? "train_test_split.txt" : "image_class_labels.txt");
    if ((t->second == "1") != (split == Split::Train)) continue;
    std::int64_t label = 0;
    std::istringstream ls(l->second);
    if (!(ls >> label) || !(ls >> std::ws).eof()) label = 0;  // not a whole number: refused below
    TRAINER_CHECK_T(UsageError, label >= 1 && label <= 200, (root / "image_class_labels.txt").string(), ": label \"",
                    l->second, "\" of image ", id, " outside 1..200");
    Sample smp{(root / "images" / path).string(), label - 1, {}};
    if (s.crop_to_box) {
      const auto b = boxes.find(id);
      TRAINER_CHECK_T(UsageError, b != boxes.end(), (root / "bounding_boxes.txt").string(), ": no box for image ", id);
      std::istringstream bs(b->second);
      bs >> smp.box[0] >> smp.box[1] >> smp.box[2] >> smp.box[3];
      TRAINER_CHECK_T(UsageError, !bs.fail() && smp.box[2] > 0 && smp.box[3] > 0,
                      (root / "bounding_boxes.txt").string(), ": box \"", b->second, "\" of image ", id,
                      " is not x y width height");
    }
    samples.push_back(std::move(smp));
  }
  TRAINER_CHECK_T(UsageError, !samples.empty(), root.string(), ": no ", split == Split::Train ? "training" : "test",
                  " image in train_test_split.txt");
  return make("cub200", std::move(samples), 200, s, split);
}

}  // namespace

void add_image_datasets(Registry<DatasetFactory>& r) {
  r.add("image_folder", image_folder, ImageFolderSettings::keys(),
        "JPEG/PNG images in class folders: <root>/<train_dir>/<class>/*, <root>/<test_dir>/<class>/*");
  r.add("flowers102", flowers102, FlowersSettings::keys(),
        "Oxford Flowers102 (jpg/, imagelabels.mat, setid.mat): 102 classes, the official train/val/test split");
  r.add("cub200", cub200, CubSettings::keys(),
        "CUB-200-2011 (images.txt, image_class_labels.txt, train_test_split.txt, images/): 200 bird species");
}

}  // namespace trainer
