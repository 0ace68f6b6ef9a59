// Scalar cache-row packers (see ops/cache_pack.h). Every step mirrors the reference fake
// quantization's float arithmetic (amax, the scale formula, x / s, the clamp), so the stored codes
// and scales reproduce its values bit for bit; only the final E2M1 rounding is done by midpoint
// comparison.
#include <algorithm>
#include <cmath>

#include "core/dtypes.h"
#include "ops/cache_pack.h"

namespace dsv41::ops {
namespace {

// 2^ceil(log2 x) for x > 0, decided from the binary exponent (as the reference's pow2_ceil).
float pow2_ceil(float x) {
  int e;
  const float m = std::frexp(x, &e);
  return m == 0.5f ? std::ldexp(1.0f, e - 1) : std::ldexp(1.0f, e);
}

uint8_t e8m0_of_pow2(float s) {
  int e;
  std::frexp(s, &e);  // s = 0.5 * 2^e
  return static_cast<uint8_t>(e - 1 + 127);
}

float amax_of(const float* x, int64_t n) {
  float a = 0;
  for (int64_t i = 0; i < n; ++i) a = std::max(a, std::fabs(x[i]));
  return a;
}

void put_nibble(uint8_t* out, int64_t i, uint8_t code) {
  uint8_t& b = out[i / 2];
  b = (i % 2) ? static_cast<uint8_t>((b & 0x0F) | (code << 4))
              : static_cast<uint8_t>((b & 0xF0) | code);
}

}  // namespace

uint8_t e2m1_code_by_midpoints(float v) {
  // Magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 (codes 0..7); midpoints between neighbours. At a midpoint
  // the even code (ties to even) wins: codes 0, 2, 4, 6 are even.
  static const float kMid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const float a = std::fabs(v);
  uint8_t code = 0;
  while (code < 7 && (a > kMid[code] || (a == kMid[code] && (code % 2) == 1))) ++code;
  return static_cast<uint8_t>(code |
                              (std::signbit(v) ? 8 : 0));  // -0 kept, as the reference encoder does
}

void pack_window_row(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n; b += 32) {
    const float s = pow2_ceil(std::max(amax_of(x + b, 32), 1e-4f) * (1.0f / 448.0f));
    for (int64_t i = b; i < b + 32; ++i)
      out[i] = e4m3_from_double(double(std::clamp(x[i] / s, -448.0f, 448.0f)));
    out[n + b / 32] = e8m0_of_pow2(s);
  }
}

void unpack_window_row(const uint8_t* in, int64_t n, float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] = e4m3_to_float(in[i]) * e8m0_to_float(in[n + i / 32]);
}

void pack_compressed_row(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n; b += 16) {
    const uint8_t sc =
        e4m3_from_double(double(std::max(amax_of(x + b, 16), 6.0f * std::ldexp(1.0f, -9)) / 6.0f));
    const float s = e4m3_to_float(sc);
    for (int64_t i = b; i < b + 16; ++i)
      put_nibble(out, i, e2m1_code_by_midpoints(std::clamp(x[i] / s, -6.0f, 6.0f)));
    out[n / 2 + b / 16] = sc;
  }
}

void unpack_compressed_row(const uint8_t* in, int64_t n, float* x) {
  for (int64_t i = 0; i < n; ++i)
    x[i] = e2m1_to_float(e2m1_nibble(in, std::size_t(i))) * e4m3_to_float(in[n / 2 + i / 16]);
}

void pack_index_key(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n; b += 32) {
    const float s =
        pow2_ceil(std::max(amax_of(x + b, 32), 6.0f * std::ldexp(1.0f, -126)) * (1.0f / 6.0f));
    for (int64_t i = b; i < b + 32; ++i)
      put_nibble(out, i, e2m1_code_by_midpoints(std::clamp(x[i] / s, -6.0f, 6.0f)));
    out[n / 2 + b / 32] = e8m0_of_pow2(s);
  }
}

void unpack_index_key(const uint8_t* in, int64_t n, float* x) {
  for (int64_t i = 0; i < n; ++i)
    x[i] = e2m1_to_float(e2m1_nibble(in, std::size_t(i))) * e8m0_to_float(in[n / 2 + i / 32]);
}

// The reference's fake_fp8_pow2 in float (model/reference/ref_ops.h; ops cannot include it), step
// for step: the scale from the float product max(amax, 1e-4) * (1 / 448) rounded up to a power of
// two, the E4M3 code of the clamped quotient, its value times the scale.
void fake_fp8_pow2_row(const float* x, int64_t n, float* y) {
  for (int64_t b = 0; b < n; b += 32) {
    const int64_t e = std::min(n, b + 32);
    float amax = 0;
    for (int64_t i = b; i < e; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float t = std::max(amax, 1e-4f) * (1.0f / 448.0f);
    int ex;
    const float m = std::frexp(t, &ex);
    const float s = m == 0.5f ? std::ldexp(1.0f, ex - 1) : std::ldexp(1.0f, ex);
    for (int64_t i = b; i < e; ++i) {
      const float v = std::min(std::max(x[i] / s, -448.0f), 448.0f);
      y[i] = e4m3_to_float(e4m3_from_double(double(v))) * s;
    }
  }
}

}  // namespace dsv41::ops
