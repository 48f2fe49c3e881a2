#pragma once
// Image files into tensors: JPEG decoded with libjpeg-turbo (TurboJPEG), PNG with libpng, and
// the transforms of torchvision's ImageNet recipe (random-resized crop, flip and colour jitter for
// training, resize and centre crop for evaluation, normalisation).
#include <ATen/core/Tensor.h>

#include <array>
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

/// How images become model inputs: torchvision's transforms, with its parameter names and
/// semantics, applied to float images in [0, 1] as torchvision's tensor path does (no rounding
/// to uint8 between steps).
///   training:   RandomResizedCrop(size, scale, ratio) -> RandomHorizontalFlip(hflip)
///               -> ColorJitter(brightness, contrast, saturation, hue) -> Normalize(mean, std)
///   evaluation: Resize(resize) -> CenterCrop(size) -> Normalize(mean, std)
struct ImageTransform {
  std::int64_t size = 224;    ///< side of the square output
  std::int64_t resize = 256;  ///< evaluation: shorter side resized to this (at least `size`), then the centre crop
  std::vector<double> scale{0.08, 1.0};                 ///< training: crop area, fractions of the image's
  std::vector<double> ratio{3.0 / 4.0, 4.0 / 3.0};      ///< training: crop aspect (width / height) range
  double hflip = 0.5;                                   ///< training: probability of a horizontal flip
  double brightness = 0, contrast = 0, saturation = 0;  ///< factor drawn from [max(0, 1 - x), 1 + x]
  double hue = 0;                                       ///< shift drawn from [-hue, hue], hue <= 0.5
  std::vector<double> mean{0.485, 0.456, 0.406};
  std::vector<double> std{0.229, 0.224, 0.225};
};

/// The random draws of one training transform (torchvision's get_params).
struct ImageDraw {
  std::int64_t top = 0, left = 0, height = 0, width = 0;  ///< the crop
  bool flip = false;
  /// ColorJitter's functions in the order applied: 0 brightness, 1 contrast, 2 saturation,
  /// 3 hue (torchvision's fn_idx); a function whose key is 0 is skipped.
  std::array<int, 4> order{0, 1, 2, 3};
  double brightness = 1, contrast = 1, saturation = 1, hue = 0;
};

/// Draws a training transform for an image of `height` x `width` from `rng` alone:
/// RandomResizedCrop's crop (up to 10 tries of an area in `scale` and a log-uniform aspect in
/// `ratio`, else the centre crop of the aspect clamped to `ratio`), the flip, ColorJitter's
/// order and factors.
TRAINER_API ImageDraw draw_image_transform(std::int64_t height, std::int64_t width, const ImageTransform& t,
                                           std::mt19937_64& rng);

/// torchvision.transforms.functional on a float image [3, H, W] in [0, 1] (the same formulas,
/// so the same values up to float rounding):
/// resized_crop(antialias=True): the crop resized to height x width, bilinear, antialiased.
TRAINER_API at::Tensor resized_crop(const at::Tensor& image, std::int64_t top, std::int64_t left, std::int64_t height,
                                    std::int64_t width, std::int64_t out_height, std::int64_t out_width);
/// adjust_brightness: image * factor, clamped to [0, 1].
TRAINER_API at::Tensor adjust_brightness(const at::Tensor& image, double factor);
/// adjust_contrast: blended with the mean of its grayscale (0.2989 R + 0.587 G + 0.114 B).
TRAINER_API at::Tensor adjust_contrast(const at::Tensor& image, double factor);
/// adjust_saturation: blended with its grayscale.
TRAINER_API at::Tensor adjust_saturation(const at::Tensor& image, double factor);
/// adjust_hue: the hue shifted by `shift` turns (-0.5 ... 0.5) in HSV.
TRAINER_API at::Tensor adjust_hue(const at::Tensor& image, double shift);

/// Applies a drawn training transform to a float image [3, H, W] in [0, 1]: the crop resized
/// to t.size, the flip, ColorJitter in the drawn order (not normalised).
TRAINER_API at::Tensor apply_image_draw(const at::Tensor& image, const ImageTransform& t, const ImageDraw& d);

/// Checks `t`'s values against torchvision's rules (2 values in scale and ratio, each range
/// ordered, scale in (0, 1], ratio > 0, hflip in [0, 1], jitter >= 0, hue <= 0.5, 3 values in
/// mean and std, std > 0); throws UsageError naming `where`'s key and what is allowed.
TRAINER_API void check_image_transform(const ImageTransform& t, const std::string& where);

/// uint8 [3, H, W] -> float32 [3, size, size], normalised. `rng` null: evaluation (resize the
/// shorter side to `resize`, centre crop); else training (draw_image_transform, then
/// apply_image_draw), drawing only from `rng`. Resizing is bilinear with antialiasing.
TRAINER_API at::Tensor transform_image(const at::Tensor& image, const ImageTransform& t, std::mt19937_64* rng);

}  // namespace trainer
