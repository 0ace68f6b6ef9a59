// Pillow-exact BICUBIC resizing (resample.h). The arithmetic follows the library's published
// algorithm step by step (filter a = -0.5, support 2 scaled by the reduction factor, bounds by
// int(center -/+ support + 0.5), weights normalised in double, then int(w * 2^22 +/- 0.5)), because
// a different rounding anywhere changes pixels and so the patch tensor the ViT sees.
#include "vision/resample.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace dsv41 {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

double bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

struct Coeffs {
  int ksize = 0;
  std::vector<int> bounds;  // per output: first input index, count
  std::vector<int32_t> k;   // per output: ksize fixed-point weights
};

// One axis: in_size inputs (the box [0, in_size)) to out_size outputs.
Coeffs precompute(int64_t in_size, int64_t out_size) {
  Coeffs c;
  const float in0 = 0.f, in1 = float(in_size);
  double scale = double(in1 - in0) / double(out_size), filterscale = scale;
  if (filterscale < 1.0) filterscale = 1.0;
  const double support = 2.0 * filterscale;
  c.ksize = int(std::ceil(support)) * 2 + 1;
  c.bounds.resize(std::size_t(out_size) * 2);
  c.k.assign(std::size_t(out_size) * std::size_t(c.ksize), 0);
  std::vector<double> w(std::size_t(c.ksize));
  for (int64_t xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (double(xx) + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = int(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = int(center + support + 0.5);
    if (xmax > in_size) xmax = int(in_size);
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      w[std::size_t(x)] = bicubic((x + xmin - center + 0.5) * ss);
      ww += w[std::size_t(x)];
    }
    for (int x = 0; x < xmax; ++x) {
      double v = ww != 0.0 ? w[std::size_t(x)] / ww : w[std::size_t(x)];
      c.k[std::size_t(xx * c.ksize + x)] = v < 0 ? int32_t(-0.5 + v * (1 << kPrecisionBits))
                                                 : int32_t(0.5 + v * (1 << kPrecisionBits));
    }
    c.bounds[std::size_t(xx * 2)] = xmin;
    c.bounds[std::size_t(xx * 2 + 1)] = xmax;
  }
  return c;
}

uint8_t clip8(int32_t v) {
  const int32_t s = v >> kPrecisionBits;  // (arithmetic: floor for negative sums)
  return uint8_t(s < 0 ? 0 : s > 255 ? 255 : s);
}

RgbImage horizontal(const RgbImage& in, int64_t out_w, const Coeffs& c) {
  RgbImage out;
  out.width = out_w;
  out.height = in.height;
  out.rgb.resize(std::size_t(out_w * in.height * 3));
  for (int64_t y = 0; y < in.height; ++y) {
    const uint8_t* src = in.row(y);
    uint8_t* dst = out.row(y);
    for (int64_t xx = 0; xx < out_w; ++xx) {
      const int xmin = c.bounds[std::size_t(xx * 2)], n = c.bounds[std::size_t(xx * 2 + 1)];
      const int32_t* k = &c.k[std::size_t(xx * c.ksize)];
      int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
      for (int x = 0; x < n; ++x) {
        const uint8_t* p = src + (x + xmin) * 3;
        s0 += int32_t(p[0]) * k[x];
        s1 += int32_t(p[1]) * k[x];
        s2 += int32_t(p[2]) * k[x];
      }
      dst[xx * 3 + 0] = clip8(s0);
      dst[xx * 3 + 1] = clip8(s1);
      dst[xx * 3 + 2] = clip8(s2);
    }
  }
  return out;
}

RgbImage vertical(const RgbImage& in, int64_t out_h, const Coeffs& c) {
  RgbImage out;
  out.width = in.width;
  out.height = out_h;
  out.rgb.resize(std::size_t(in.width * out_h * 3));
  for (int64_t yy = 0; yy < out_h; ++yy) {
    const int ymin = c.bounds[std::size_t(yy * 2)], n = c.bounds[std::size_t(yy * 2 + 1)];
    const int32_t* k = &c.k[std::size_t(yy * c.ksize)];
    uint8_t* dst = out.row(yy);
    for (int64_t xx = 0; xx < in.width * 3; ++xx) {
      int32_t s = 1 << (kPrecisionBits - 1);
      for (int y = 0; y < n; ++y) s += int32_t(in.row(y + ymin)[xx]) * k[y];
      dst[xx] = clip8(s);
    }
  }
  return out;
}

// Python's round() of a non-negative double: half to even.
int64_t round_half_even(double v) {
  return int64_t(std::nearbyint(v));  // (the default rounding mode is to nearest, ties to even)
}

}  // namespace

RgbImage resize_bicubic(const RgbImage& in, int64_t width, int64_t height) {
  DSV41_CHECK(width >= 1 && height >= 1 && in.width >= 1 && in.height >= 1);
  if (width == in.width && height == in.height) return in;
  // Pillow skips a pass whose axis keeps its size (the other pass alone gives the same pixels).
  RgbImage cur = in;
  if (width != in.width) cur = horizontal(cur, width, precompute(in.width, width));
  if (height != in.height) cur = vertical(cur, height, precompute(in.height, height));
  return cur;
}

RgbImage letterbox_bicubic(const RgbImage& in, int64_t width, int64_t height, uint8_t grey) {
  const double im_ratio = double(in.width) / double(in.height);
  const double dest_ratio = double(width) / double(height);
  int64_t w = width, h = height;  // ImageOps.contain's size
  if (im_ratio != dest_ratio) {
    if (im_ratio > dest_ratio)
      h = round_half_even(double(in.height) / double(in.width) * double(width));
    else
      w = round_half_even(double(in.width) / double(in.height) * double(height));
  }
  w = std::max<int64_t>(w, 1);
  h = std::max<int64_t>(h, 1);
  RgbImage fit = resize_bicubic(in, w, h);
  if (w == width && h == height) return fit;
  RgbImage out;
  out.width = width;
  out.height = height;
  out.rgb.assign(std::size_t(width * height * 3), grey);
  const int64_t x0 = w != width ? round_half_even(double(width - w) * 0.5) : 0;
  const int64_t y0 = w != width ? 0 : round_half_even(double(height - h) * 0.5);
  for (int64_t y = 0; y < h; ++y)
    std::copy(fit.row(y), fit.row(y) + w * 3, out.row(y + y0) + x0 * 3);
  return out;
}

}  // namespace dsv41
