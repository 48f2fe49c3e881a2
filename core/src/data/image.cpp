// JPEG (TurboJPEG) and PNG (libpng's simplified API) decoding, and the ImageNet transforms.
#include "trainer/image.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <utility>

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

/// Bilinear resize of float [C, H, W] to [C, h, w], antialiased (torchvision's resize with
/// antialias=True, which takes the antialiasing kernel whether it shrinks or enlarges).
at::Tensor resize(const at::Tensor& x, std::int64_t h, std::int64_t w) {
  if (x.size(1) == h && x.size(2) == w) return x;
  return at::_upsample_bilinear2d_aa(x.unsqueeze(0), {h, w}, /*align_corners=*/false).squeeze(0);
}

/// torchvision's _blend: ratio * a + (1 - ratio) * b, clamped to [0, 1].
at::Tensor blend(const at::Tensor& a, const at::Tensor& b, double ratio) {
  return (a * ratio + b * (1.0 - ratio)).clamp(0, 1);
}

/// torchvision's rgb_to_grayscale: [1, H, W].
at::Tensor grayscale(const at::Tensor& x) { return (x[0] * 0.2989 + x[1] * 0.587 + x[2] * 0.114).unsqueeze(0); }

/// Python's round(): halves to even (the current rounding mode, to nearest by default).
std::int64_t round_even(double v) { return static_cast<std::int64_t>(std::nearbyint(v)); }

void check_float_image(const at::Tensor& x, const char* what) {
  TRAINER_CHECK(x.dim() == 3 && x.size(0) == 3 && x.is_floating_point(), what,
                ": expected a float [3, H, W] image, got ", x.sizes(), " ", x.scalar_type());
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

ImageDraw draw_image_transform(std::int64_t height, std::int64_t width, const ImageTransform& t, std::mt19937_64& rng) {
  TRAINER_CHECK(height > 0 && width > 0, "draw_image_transform: an image of ", height, "x", width);
  check_image_transform(t, "draw_image_transform");
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const auto uniform = [&](double lo, double hi) { return lo + (hi - lo) * unit(rng); };
  ImageDraw d;
  // RandomResizedCrop.get_params.
  const double area = static_cast<double>(height * width);
  const double log_lo = std::log(t.ratio[0]), log_hi = std::log(t.ratio[1]);
  bool found = false;
  for (int attempt = 0; attempt < 10 && !found; ++attempt) {
    const double target = area * uniform(t.scale[0], t.scale[1]);
    const double aspect = std::exp(uniform(log_lo, log_hi));
    const std::int64_t w = round_even(std::sqrt(target * aspect)), h = round_even(std::sqrt(target / aspect));
    if (w > 0 && h > 0 && w <= width && h <= height) {
      d.top = static_cast<std::int64_t>(unit(rng) * static_cast<double>(height - h + 1));
      d.left = static_cast<std::int64_t>(unit(rng) * static_cast<double>(width - w + 1));
      d.height = h;
      d.width = w;
      found = true;
    }
  }
  if (!found) {  // the centre crop of the image's aspect clamped to `ratio`
    const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
    d.width = width;
    d.height = height;
    if (in_ratio < t.ratio[0]) {
      d.height = std::clamp<std::int64_t>(round_even(static_cast<double>(width) / t.ratio[0]), 1, height);
    } else if (in_ratio > t.ratio[1]) {
      d.width = std::clamp<std::int64_t>(round_even(static_cast<double>(height) * t.ratio[1]), 1, width);
    }
    d.top = (height - d.height) / 2;
    d.left = (width - d.width) / 2;
  }
  // RandomHorizontalFlip, drawn only when it can go either way (hflip 0 or 1 draws nothing).
  d.flip = t.hflip >= 1 || (t.hflip > 0 && unit(rng) < t.hflip);
  // ColorJitter.get_params: a random order of the four, then each factor that is on.
  if (t.brightness > 0 || t.contrast > 0 || t.saturation > 0 || t.hue > 0) {
    for (int i = 3; i > 0; --i) {
      const auto j = static_cast<int>(unit(rng) * (i + 1));
      std::swap(d.order[static_cast<std::size_t>(i)], d.order[static_cast<std::size_t>(std::min(j, i))]);
    }
    if (t.brightness > 0) d.brightness = uniform(std::max(0.0, 1 - t.brightness), 1 + t.brightness);
    if (t.contrast > 0) d.contrast = uniform(std::max(0.0, 1 - t.contrast), 1 + t.contrast);
    if (t.saturation > 0) d.saturation = uniform(std::max(0.0, 1 - t.saturation), 1 + t.saturation);
    if (t.hue > 0) d.hue = uniform(-t.hue, t.hue);
  }
  return d;
}

at::Tensor resized_crop(const at::Tensor& image, std::int64_t top, std::int64_t left, std::int64_t height,
                        std::int64_t width, std::int64_t out_height, std::int64_t out_width) {
  check_float_image(image, "resized_crop");
  TRAINER_CHECK(top >= 0 && left >= 0 && height > 0 && width > 0 && top + height <= image.size(1) &&
                    left + width <= image.size(2),
                "resized_crop: the crop (top ", top, ", left ", left, ", ", height, "x", width, ") is not inside ",
                image.sizes());
  return resize(image.narrow(1, top, height).narrow(2, left, width), out_height, out_width);
}

at::Tensor adjust_brightness(const at::Tensor& image, double factor) {
  check_float_image(image, "adjust_brightness");
  TRAINER_CHECK(factor >= 0, "adjust_brightness: factor ", factor, " is negative");
  return blend(image, at::zeros_like(image), factor);
}

at::Tensor adjust_contrast(const at::Tensor& image, double factor) {
  check_float_image(image, "adjust_contrast");
  TRAINER_CHECK(factor >= 0, "adjust_contrast: factor ", factor, " is negative");
  return blend(image, grayscale(image).mean({-3, -2, -1}, /*keepdim=*/true), factor);
}

at::Tensor adjust_saturation(const at::Tensor& image, double factor) {
  check_float_image(image, "adjust_saturation");
  TRAINER_CHECK(factor >= 0, "adjust_saturation: factor ", factor, " is negative");
  return blend(image, grayscale(image), factor);
}

at::Tensor adjust_hue(const at::Tensor& image, double shift) {
  check_float_image(image, "adjust_hue");
  TRAINER_CHECK(shift >= -0.5 && shift <= 0.5, "adjust_hue: shift ", shift, " is not in [-0.5, 0.5]");
  // torchvision's _rgb2hsv (after Pillow's), its formulas in its order.
  const at::Tensor r = image[0], g = image[1], b = image[2];
  const at::Tensor maxc = std::get<0>(image.max(0)), minc = std::get<0>(image.min(0));
  const at::Tensor eqc = maxc == minc;
  const at::Tensor cr = maxc - minc;
  const at::Tensor ones = at::ones_like(maxc);
  const at::Tensor s = cr / at::where(eqc, ones, maxc);
  const at::Tensor divisor = at::where(eqc, ones, cr);
  const at::Tensor rc = (maxc - r) / divisor, gc = (maxc - g) / divisor, bc = (maxc - b) / divisor;
  const at::Tensor hr = (maxc == r) * (bc - gc);
  const at::Tensor hg = ((maxc == g) & (maxc != r)) * (2.0 + rc - bc);
  const at::Tensor hb = ((maxc != g) & (maxc != r)) * (4.0 + gc - rc);
  at::Tensor h = at::fmod((hr + hg + hb) / 6.0 + 1.0, 1.0);
  h = at::remainder(h + shift, 1.0);
  const at::Tensor& v = maxc;
  // _hsv2rgb: the sector i of the hue picks each channel among v, p, q, t.
  const at::Tensor i_float = at::floor(h * 6.0);
  const at::Tensor f = h * 6.0 - i_float;
  const at::Tensor i = at::remainder(i_float.to(at::kInt), 6);
  const at::Tensor p = (v * (1.0 - s)).clamp(0.0, 1.0);
  const at::Tensor q = (v * (1.0 - s * f)).clamp(0.0, 1.0);
  const at::Tensor t = (v * (1.0 - s * (1.0 - f))).clamp(0.0, 1.0);
  const auto pick = [&i](std::array<at::Tensor, 6> by_sector) {
    at::Tensor out = by_sector[5];
    for (int k = 4; k >= 0; --k) out = at::where(i == k, by_sector[static_cast<std::size_t>(k)], out);
    return out;
  };
  return at::stack({pick({v, q, p, p, t, v}), pick({t, v, v, q, p, p}), pick({p, p, t, v, v, q})});
}

at::Tensor apply_image_draw(const at::Tensor& image, const ImageTransform& t, const ImageDraw& d) {
  check_image_transform(t, "apply_image_draw");
  at::Tensor out = resized_crop(image, d.top, d.left, d.height, d.width, t.size, t.size);
  if (d.flip) out = out.flip({2});
  for (const int fn : d.order) {
    if (fn == 0 && t.brightness > 0) out = adjust_brightness(out, d.brightness);
    if (fn == 1 && t.contrast > 0) out = adjust_contrast(out, d.contrast);
    if (fn == 2 && t.saturation > 0) out = adjust_saturation(out, d.saturation);
    if (fn == 3 && t.hue > 0) out = adjust_hue(out, d.hue);
  }
  return out;
}

void check_image_transform(const ImageTransform& t, const std::string& where) {
  const auto fail = [&](const std::string& key, const std::string& why) {
    throw UsageError(where + "." + key + ": " + why);
  };
  const auto range = [](const std::vector<double>& v) {
    std::string s = "[";
    for (std::size_t k = 0; k < v.size(); ++k) s += (k ? ", " : "") + fmt::format("{}", v[k]);
    return s + "]";
  };
  if (t.scale.size() != 2) fail("scale", "needs 2 values [min, max], got " + range(t.scale));
  if (!(t.scale[0] > 0 && t.scale[0] <= t.scale[1] && t.scale[1] <= 1)) {
    fail("scale", "needs 0 < min <= max <= 1 (area fractions of the image), got " + range(t.scale));
  }
  if (t.ratio.size() != 2) fail("ratio", "needs 2 values [min, max], got " + range(t.ratio));
  if (!(t.ratio[0] > 0 && t.ratio[0] <= t.ratio[1])) {
    fail("ratio", "needs 0 < min <= max (aspect ratios, width / height), got " + range(t.ratio));
  }
  if (!(t.hflip >= 0 && t.hflip <= 1)) fail("hflip", "is a probability in [0, 1], got " + fmt::format("{}", t.hflip));
  for (const auto& [key, v] : {std::pair<const char*, double>{"brightness", t.brightness},
                               {"contrast", t.contrast},
                               {"saturation", t.saturation}}) {
    if (!(v >= 0))
      fail(key, "needs >= 0 (the factor is drawn from [max(0, 1 - x), 1 + x]), got " + fmt::format("{}", v));
  }
  if (!(t.hue >= 0 && t.hue <= 0.5)) {
    fail("hue", "needs 0 <= hue <= 0.5 (the shift is drawn from [-hue, hue] turns), got " + fmt::format("{}", t.hue));
  }
  if (t.mean.size() != 3) fail("mean", "needs 3 values (R, G, B), got " + range(t.mean));
  if (t.std.size() != 3) fail("std", "needs 3 values (R, G, B), got " + range(t.std));
  for (const double v : t.std) {
    if (!(v > 0)) fail("std", "needs values > 0, got " + range(t.std));
  }
}

at::Tensor transform_image(const at::Tensor& image, const ImageTransform& t, std::mt19937_64* rng) {
  TRAINER_CHECK(image.dim() == 3 && image.size(0) == 3 && image.scalar_type() == at::kByte,
                "transform_image: expected uint8 [3, H, W], got ", image.sizes());
  check_image_transform(t, "transform_image");
  const std::int64_t H = image.size(1), W = image.size(2);
  const at::Tensor x = image.to(at::kFloat).div_(255.0);
  at::Tensor out;
  if (rng == nullptr) {
    // Resize: the shorter side to `resize` (at least `size`: torchvision would pad the crop with
    // zeros instead), the other by the same factor, truncated as torchvision does
    // (int(short * long / short_before)); then the centre size x size.
    const std::int64_t side = std::max(t.size, t.resize);
    const std::int64_t h = H <= W ? side : side * H / W, w = H <= W ? side * W / H : side;
    const at::Tensor r = resize(x, h, w);
    // CenterCrop: torchvision rounds the offsets (int(round((h - size) / 2.0))).
    out = r.narrow(1, round_even((h - t.size) / 2.0), t.size).narrow(2, round_even((w - t.size) / 2.0), t.size);
  } else {
    out = apply_image_draw(x, t, draw_image_transform(H, W, t, *rng));
  }
  const at::Tensor mean = at::tensor(std::vector<float>(t.mean.begin(), t.mean.end())).view({3, 1, 1});
  const at::Tensor std = at::tensor(std::vector<float>(t.std.begin(), t.std.end())).view({3, 1, 1});
  return ((out - mean) / std).contiguous();
}

}  // namespace trainer
