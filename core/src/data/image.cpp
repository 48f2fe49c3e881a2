// JPEG (TurboJPEG) and PNG (libpng's simplified API) decoding, and the ImageNet transforms.
#include "trainer/image.h"

#include <ATen/ATen.h>
#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>

namespace trainer {

namespace {

at::Tensor decode_jpeg(const std::vector<unsigned char>& bytes, const std::string& what, std::int64_t min_side) {
  std::unique_ptr<void, int (*)(tjhandle)> tj(tjInitDecompress(), tjDestroy);
  if (!tj) throw ImageError(what + ": cannot start the JPEG decoder (TurboJPEG)");
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(tj.get(), bytes.data(), static_cast<unsigned long>(bytes.size()), &width, &height,
                          &subsampling, &colorspace) != 0) {
    throw ImageError(what + ": not a readable JPEG (" + tjGetErrorStr2(tj.get()) + ")");
  }
  if (width <= 0 || height <= 0 || static_cast<std::int64_t>(width) * height > (std::int64_t{1} << 28)) {
    throw ImageError(what + ": a JPEG of " + std::to_string(width) + "x" + std::to_string(height) +
                     " pixels (more than 2^28 is refused)");
  }
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
    throw ImageError(what +
                     ": a CMYK JPEG (print colours); trainer reads RGB and grayscale JPEGs: convert it to RGB "
                     "(e.g. convert IN -colorspace sRGB OUT, or PIL's Image.open(IN).convert(\"RGB\").save(OUT))");
  }
  // The smallest scale that keeps both sides >= min_side (the factors come largest first).
  int w = width, h = height;
  if (min_side > 0) {
    int n = 0;
    const tjscalingfactor* f = tjGetScalingFactors(&n);
    for (int i = 0; i < n; ++i) {
      if (f[i].num > f[i].denom) continue;
      const int sw = TJSCALED(width, f[i]), sh = TJSCALED(height, f[i]);
      if (sw >= min_side && sh >= min_side && sw * sh < w * h) {
        w = sw;
        h = sh;
      }
    }
  }
  at::Tensor out = at::empty({h, w, 3}, at::kByte);
  if (tjDecompress2(tj.get(), bytes.data(), static_cast<unsigned long>(bytes.size()), out.data_ptr<std::uint8_t>(), w,
                    0, h, TJPF_RGB, TJFLAG_ACCURATEDCT) != 0) {  // the integer DCT that libjpeg (PIL) uses by default
    // A warning (e.g. a few bytes missing at the end) still yields the image; an error does not.
    if (tjGetErrorCode(tj.get()) == TJERR_FATAL) {
      throw ImageError(what + ": a damaged JPEG (" + tjGetErrorStr2(tj.get()) + ")");
    }
  }
  return out.permute({2, 0, 1}).contiguous();
}

at::Tensor decode_png(const std::vector<unsigned char>& bytes, const std::string& what) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) {
    throw ImageError(what + ": not a readable PNG (" + image.message + ")");
  }
  if (static_cast<std::int64_t>(image.width) * image.height > (std::int64_t{1} << 28)) {
    png_image_free(&image);
    throw ImageError(what + ": a PNG of " + std::to_string(image.width) + "x" + std::to_string(image.height) +
                     " pixels (more than 2^28 is refused)");
  }
  image.format = PNG_FORMAT_RGB;  // gray, palette and alpha converted (alpha composited on black)
  at::Tensor out =
      at::empty({static_cast<std::int64_t>(image.height), static_cast<std::int64_t>(image.width), 3}, at::kByte);
  if (!png_image_finish_read(&image, nullptr, out.data_ptr<std::uint8_t>(), 0, nullptr)) {
    const std::string message = image.message;
    png_image_free(&image);
    throw ImageError(what + ": a damaged PNG (" + message + ")");
  }
  return out.permute({2, 0, 1}).contiguous();
}

/// Bilinear resize of float [C, H, W] to [C, h, w], antialiased when shrinking.
at::Tensor resize(const at::Tensor& x, std::int64_t h, std::int64_t w) {
  if (x.size(1) == h && x.size(2) == w) return x;
  const at::Tensor in = x.unsqueeze(0);
  const bool shrink = h < x.size(1) || w < x.size(2);
  at::Tensor out = shrink ? at::_upsample_bilinear2d_aa(in, {h, w}, /*align_corners=*/false)
                          : at::upsample_bilinear2d(in, {h, w}, /*align_corners=*/false);
  return out.squeeze(0);
}

}  // namespace

at::Tensor decode_image(const std::vector<unsigned char>& bytes, const std::string& what, std::int64_t min_side) {
  static const unsigned char kJpeg[] = {0xFF, 0xD8, 0xFF};
  static const unsigned char kPng[] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  if (bytes.size() >= sizeof kJpeg && std::equal(kJpeg, kJpeg + sizeof kJpeg, bytes.begin())) {
    return decode_jpeg(bytes, what, min_side);
  }
  if (bytes.size() >= sizeof kPng && std::equal(kPng, kPng + sizeof kPng, bytes.begin())) {
    return decode_png(bytes, what);
  }
  throw ImageError(what + ": neither a JPEG nor a PNG (" + std::to_string(bytes.size()) + " bytes)");
}

at::Tensor decode_image_file(const std::string& path, std::int64_t min_side) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ImageError(path + ": cannot be opened");
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw ImageError(path + ": read error");
  return decode_image(bytes, path, min_side);
}

at::Tensor transform_image(const at::Tensor& image, const ImageTransform& t, std::mt19937_64* rng) {
  TRAINER_CHECK(image.dim() == 3 && image.size(0) == 3 && image.scalar_type() == at::kByte,
                "transform_image: expected uint8 [3, H, W], got ", image.sizes());
  const std::int64_t H = image.size(1), W = image.size(2);
  const at::Tensor x = image.to(at::kFloat).div_(255.0);
  at::Tensor out;
  if (rng == nullptr) {
    // Resize the shorter side to `resize` (keeping the aspect), then the centre size x size.
    const double s = static_cast<double>(t.resize) / static_cast<double>(std::min(H, W));
    const std::int64_t h = std::max<std::int64_t>(t.size, std::llround(H * s));
    const std::int64_t w = std::max<std::int64_t>(t.size, std::llround(W * s));
    const at::Tensor r = resize(x, h, w);
    out = r.narrow(1, (h - t.size) / 2, t.size).narrow(2, (w - t.size) / 2, t.size);
  } else {
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    const double area = static_cast<double>(H * W);
    const double log_lo = std::log(3.0 / 4.0), log_hi = std::log(4.0 / 3.0);
    std::int64_t top = 0, left = 0, h = H, w = W;
    bool found = false;
    for (int attempt = 0; attempt < 10 && !found; ++attempt) {
      const double target = area * (t.min_scale + (t.max_scale - t.min_scale) * unit(*rng));
      const double ratio = std::exp(log_lo + (log_hi - log_lo) * unit(*rng));
      const auto cw = static_cast<std::int64_t>(std::llround(std::sqrt(target * ratio)));
      const auto ch = static_cast<std::int64_t>(std::llround(std::sqrt(target / ratio)));
      if (cw > 0 && ch > 0 && cw <= W && ch <= H) {
        top = static_cast<std::int64_t>(unit(*rng) * static_cast<double>(H - ch + 1));
        left = static_cast<std::int64_t>(unit(*rng) * static_cast<double>(W - cw + 1));
        h = ch;
        w = cw;
        found = true;
      }
    }
    if (!found) {  // torchvision's fallback: the centre crop of the ratio clamped to [3/4, 4/3]
      const double r = static_cast<double>(W) / static_cast<double>(H);
      if (r < 3.0 / 4.0) {
        w = W;
        h = std::llround(W / (3.0 / 4.0));
      } else if (r > 4.0 / 3.0) {
        h = H;
        w = std::llround(H * (4.0 / 3.0));
      }
      h = std::min(h, H);
      w = std::min(w, W);
      top = (H - h) / 2;
      left = (W - w) / 2;
    }
    out = resize(x.narrow(1, top, h).narrow(2, left, w), t.size, t.size);
    if (t.flip && unit(*rng) < 0.5) out = out.flip({2});
  }
  TRAINER_CHECK(t.mean.size() == 3 && t.std.size() == 3, "transform_image: mean and std need 3 values each");
  const at::Tensor mean = at::tensor(std::vector<float>(t.mean.begin(), t.mean.end())).view({3, 1, 1});
  const at::Tensor std = at::tensor(std::vector<float>(t.std.begin(), t.std.end())).view({3, 1, 1});
  return ((out - mean) / std).contiguous();
}

}  // namespace trainer
