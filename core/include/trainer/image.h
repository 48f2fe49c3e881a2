#pragma once
// Image files into tensors: JPEG decoded with libjpeg-turbo (TurboJPEG), PNG with libpng, and
// the transforms of torchvision's ImageNet recipe (random-resized crop and flip for training,
// resize and centre crop for evaluation, normalisation).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "trainer/error.h"
#include "trainer/export.h"

namespace trainer {

/// An image file that cannot be read or decoded; what() names the file and why.
class TRAINER_API ImageError : public Error {
 public:
  using Error::Error;
};

/// Decodes the JPEG or PNG file `path` (told apart by content) into a uint8 tensor [3, H, W]
/// (RGB; grayscale and palette images are expanded, alpha dropped). With `min_side` > 0 a
/// JPEG is decoded at the smallest of libjpeg-turbo's scales (1/8 ... 1) that keeps both sides
/// at least `min_side`, which is several times faster for large photos. Throws ImageError.
TRAINER_API at::Tensor decode_image_file(const std::string& path, std::int64_t min_side = 0);

/// Decodes JPEG or PNG bytes (as decode_image_file; `what` names them in errors).
TRAINER_API at::Tensor decode_image(const std::vector<unsigned char>& bytes, const std::string& what,
                                    std::int64_t min_side = 0);

/// How images become model inputs.
struct ImageTransform {
  std::int64_t size = 224;    ///< side of the square output
  std::int64_t resize = 256;  ///< evaluation: shorter side resized to this, then the centre crop
  double min_scale = 0.08;    ///< training: random-resized crop area, fraction of the image
  double max_scale = 1.0;
  bool flip = true;  ///< training: horizontal flip with probability 1/2
  std::vector<double> mean{0.485, 0.456, 0.406};
  std::vector<double> std{0.229, 0.224, 0.225};
};

/// uint8 [3, H, W] -> float32 [3, size, size], normalised. `rng` null: evaluation (resize the
/// shorter side to `resize`, centre crop); else training (torchvision's RandomResizedCrop with
/// ratios 3/4 to 4/3 and up to 10 tries, then a flip), drawing only from `rng`. Resizing is
/// bilinear with antialiasing when shrinking.
TRAINER_API at::Tensor transform_image(const at::Tensor& image, const ImageTransform& t, std::mt19937_64* rng);

}  // namespace trainer
