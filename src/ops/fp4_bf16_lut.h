// The E2M1 -> bf16 tables of the MXFP4 decoders that fold the block scale in with one saturating
// 16-bit subtract (ops/avx512/avx512_bf16_gemm.h's act-quant decoder, ops/avx2/avx2_f32_gemm.h):
// for each 4-bit code (bit 3 the sign) the high and low byte of the bf16 word of its value with
// the exponent raised by kAq4Bias, both zeros the word 0. Subtracting (kAq4Bias + 127 - s) << 7
// with saturation then gives the word of the value times 2^(s - 127) and leaves a zero word zero;
// s in [33, 252] (mxfp4_aq_scales_ok) keeps the subtrahend non-negative and every result normal.
// ISA-free data.
#pragma once

#include <cstdint>

namespace dsv41::ops {
namespace {

constexpr int kAq4Bias = 125;

struct Aq4Lut {
  alignas(16) uint8_t hi[16], lo[16];
};

constexpr Aq4Lut make_aq4_lut() {
  Aq4Lut t{};
  // E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6: bf16 exponent fields and mantissa bits.
  constexpr int kExp[8] = {0, 126, 127, 127, 128, 128, 129, 129};
  constexpr int kMant[8] = {0, 0, 0, 0x40, 0, 0x40, 0, 0x40};
  for (int n = 0; n < 16; ++n) {
    const int m = n & 7;
    const int word = m == 0 ? 0 : ((n >> 3) << 15) | ((kExp[m] + kAq4Bias) << 7) | kMant[m];
    t.hi[n] = static_cast<uint8_t>(word >> 8);
    t.lo[n] = static_cast<uint8_t>(word & 0xFF);
  }
  return t;
}

alignas(64) constexpr Aq4Lut kAq4Lut = make_aq4_lut();

}  // namespace
}  // namespace dsv41::ops
