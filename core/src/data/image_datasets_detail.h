#pragma once
// Private: what the image datasets' readers (image_datasets.cpp) share with the dataset they make
// (image_datasets_samples.cpp): the [dataset] keys they have in common, a sample, and make().
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainer/data.h"
#include "trainer/settings.h"

namespace trainer::detail {

/// The [dataset] keys of the image datasets (each declares the ones it reads).
struct ImageFields {
  std::string root;
  std::int64_t image_size = 224;
  std::int64_t resize = 256;
  bool augment = true;
  std::vector<double> scale{0.08, 1.0};
  std::vector<double> ratio{3.0 / 4.0, 4.0 / 3.0};
  double hflip = 0.5;
  double brightness = 0, contrast = 0, saturation = 0, hue = 0;
  std::vector<double> mean{0.485, 0.456, 0.406};
  std::vector<double> std{0.229, 0.224, 0.225};
  std::string on_corrupt = "fail";
  std::int64_t seed = 0;
  std::int64_t limit = 0;
  std::int64_t eval_limit = 0;
  std::string train_dir = "train", test_dir = "val";  // image_folder
  std::string test_split = "test";                    // flowers102
  bool train_with_val = false;                        // flowers102
  bool crop_to_box = false;                           // cub200
};

/// &ImageFields::x as a member pointer of the settings struct S deriving from it.
template <class S, class M>
M S::*field(M ImageFields::*m) {
  return m;
}

template <class S>
void declare_common(SettingsSchema<S>& s) {
  s.add(field<S>(&ImageFields::root), "root", "Directory of the dataset in its published layout");
  s.add(field<S>(&ImageFields::image_size), "image_size", "Side of the square images the model gets").min(1);
  s.add(field<S>(&ImageFields::resize), "resize",
        "Evaluation: the shorter side is resized to this, then the centre image_size crop is taken")
      .min(1);
  s.add(field<S>(&ImageFields::augment), "augment",
        "Training: torchvision's RandomResizedCrop(image_size, scale, ratio), RandomHorizontalFlip(hflip) and "
        "ColorJitter(brightness, contrast, saturation, hue); false = the evaluation transform");
  s.add(field<S>(&ImageFields::scale), "scale",
        "Training: RandomResizedCrop's range of the crop's area, fractions of the image [min, max]")
      .min(0, false)
      .max(1);
  s.add(field<S>(&ImageFields::ratio), "ratio",
        "Training: RandomResizedCrop's range of the crop's aspect ratio (width / height) [min, max], drawn "
        "log-uniformly")
      .min(0, false);
  s.add(field<S>(&ImageFields::hflip), "hflip", "Training: probability of a horizontal flip").min(0).max(1);
  s.add(field<S>(&ImageFields::brightness), "brightness",
        "Training: ColorJitter's brightness: a factor drawn from [max(0, 1 - x), 1 + x]; 0 = off")
      .min(0);
  s.add(field<S>(&ImageFields::contrast), "contrast",
        "Training: ColorJitter's contrast: a factor drawn from [max(0, 1 - x), 1 + x]; 0 = off")
      .min(0);
  s.add(field<S>(&ImageFields::saturation), "saturation",
        "Training: ColorJitter's saturation: a factor drawn from [max(0, 1 - x), 1 + x]; 0 = off")
      .min(0);
  s.add(field<S>(&ImageFields::hue), "hue",
        "Training: ColorJitter's hue: a shift drawn from [-x, x] turns of the colour wheel; 0 = off")
      .min(0)
      .max(0.5);
  s.add(field<S>(&ImageFields::mean), "mean", "Per-channel mean subtracted (the backbone's: ImageNet's by default)");
  s.add(field<S>(&ImageFields::std), "std", "Per-channel standard deviation divided by").min(0, false);
  s.add(field<S>(&ImageFields::on_corrupt), "on_corrupt",
        "An image that cannot be read or decoded: fail = stop the run (exit code 2) naming it; skip = train "
        "without it (its place in the batch goes to the next readable sample), counted and logged")
      .choices({"fail", "skip"});
  s.add(field<S>(&ImageFields::seed), "seed", "Seed of the augmentations (with the epoch and the sample's index)")
      .min(0);
  s.add(field<S>(&ImageFields::limit), "limit", "Train on the first N samples; 0 = all").min(0);
  s.add(field<S>(&ImageFields::eval_limit), "eval_limit", "Evaluate on the first N test samples; 0 = all").min(0);
}

struct Sample {
  std::string path;
  std::int64_t label = 0;
  std::array<double, 4> box{0, 0, 0, 0};  ///< x, y, width, height; width 0 = the whole image
};

/// `limit` samples spread evenly over the list sorted by class (stable: in their order within
/// a class), so that every class keeps its share: samples floor(i * n / limit), i < limit.
std::shared_ptr<Dataset> make(std::string name, std::vector<Sample> samples, std::int64_t classes, const ImageFields& s,
                              Split split);

}  // namespace trainer::detail
