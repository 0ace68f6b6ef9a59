// The resize plan, the planned pixels and the patch tensor (preprocess.h; spec §9.1). Where the
// spec leaves a step open (how the span is shrunk to max_image_tokens), docs/decisions.md says
// what is done here and why.
#include "vision/preprocess.h"

#include <cmath>
#include <cstring>

#include "core/check.h"
#include "vision/resample.h"

namespace dsv41 {
namespace {

int64_t round_up(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

// The grid of a w x h image already rounded to the patch.
ImagePlan grid(int64_t w, int64_t h, const ImagePlanOptions& o) {
  ImagePlan p;
  p.width = w;
  p.height = h;
  p.vit_w = w / o.patch;
  p.vit_h = h / o.patch;
  p.llm_w = (p.vit_w + o.downsample - 1) / o.downsample;
  p.llm_h = (p.vit_h + o.downsample - 1) / o.downsample;
  p.span = p.llm_h * (p.llm_w + 1) + 2;
  return p;
}

// A side scaled by f, then rounded up to the patch (one patch at least).
int64_t scaled_side(int64_t side, double f, int64_t patch) {
  return std::max<int64_t>(patch, round_up(std::max<int64_t>(1, int64_t(double(side) * f)), patch));
}

// bf16 of an fp32 value, rounding to nearest even (the values here are finite).
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

}  // namespace

ImagePlan plan_image_grid(int64_t w, int64_t h, const ImagePlanOptions& o) {
  DSV41_CHECK(w >= 1 && h >= 1 && o.patch >= 1 && o.downsample >= 1);
  const bool wide = o.max_wh_ratio > 0 && double(w) >= o.max_wh_ratio * double(h);
  if (o.max_wh_ratio > 0 && double(w) > double(h) * o.max_wh_ratio)
    w = std::max<int64_t>(1, int64_t(double(h) * o.max_wh_ratio));
  if (w * h < o.min_pixels) {
    const double s = std::sqrt(double(o.min_pixels) / double(w * h));
    w = int64_t(double(w) * s);
    h = int64_t(double(h) * s);
  }
  ImagePlan p = grid(round_up(std::max<int64_t>(w, 1), o.patch),
                     round_up(std::max<int64_t>(h, 1), o.patch), o);
  if (p.span > o.max_tokens) {
    // The largest factor f in (0, 1) whose plan fits: the span only grows with f, so bisect.
    double lo = 0, hi = 1;
    for (int it = 0; it < 64; ++it) {
      const double f = (lo + hi) / 2;
      const ImagePlan q = grid(scaled_side(w, f, o.patch), scaled_side(h, f, o.patch), o);
      (q.span <= o.max_tokens ? lo : hi) = f;
    }
    p = grid(scaled_side(w, lo, o.patch), scaled_side(h, lo, o.patch), o);
  }
  p.plain_resize = wide;
  return p;
}

RgbImage plan_pixels(const RgbImage& in, const ImagePlan& plan) {
  if (plan.plain_resize) return resize_bicubic(in, plan.width, plan.height);
  return letterbox_bicubic(in, plan.width, plan.height, 127);
}

std::vector<uint16_t> patch_tensor(const RgbImage& px, int64_t patch) {
  DSV41_CHECK(px.width % patch == 0 && px.height % patch == 0);
  uint16_t lut[256];
  for (int u = 0; u < 256; ++u) lut[u] = to_bf16((float(u) / 255.0f - 0.5f) / 0.5f);
  const int64_t pw = px.width / patch, ph = px.height / patch, row = 3 * patch * patch;
  std::vector<uint16_t> out(std::size_t(pw * ph * row));
  for (int64_t gy = 0; gy < ph; ++gy)
    for (int64_t gx = 0; gx < pw; ++gx) {
      uint16_t* dst = out.data() + (gy * pw + gx) * row;
      for (int c = 0; c < 3; ++c)
        for (int64_t y = 0; y < patch; ++y)
          for (int64_t x = 0; x < patch; ++x)
            *dst++ = lut[px.row(gy * patch + y)[(gx * patch + x) * 3 + c]];
    }
  return out;
}

}  // namespace dsv41
