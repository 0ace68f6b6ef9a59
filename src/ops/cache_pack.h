// Packed KV-cache rows (spec §3.4), bit-exact with the reference's fake quantizations in fp32:
//   window row      FP8 E4M3 + one E8M0 scale per 32 values   (512 dims -> 512 + 16 = 528 bytes)
//   compressed row  E2M1 (two per byte, element 2j low) + one E4M3 scale per 16 (512 -> 256 + 32 =
//   288) index key       E2M1 + one E8M0 scale per 32               (128 dims -> 64 + 4 = 68 bytes)
// Layout of a row: the element codes, then the scale bytes. Unpacking yields exactly the values the
// reference's fake_fp8_pow2 / fake_fp4_e4m3 / fake_fp4_pow2 (model/reference/ref_ops.h) leave in
// place for T = float. Scalar reference implementations (ops/ref); SIMD versions come with the
// engine.
#pragma once

#include <cstdint>

namespace dsv41::ops {

// Bytes of a packed row of n values (n a multiple of the block: 32, 16, 32).
inline constexpr int64_t window_row_bytes(int64_t n) {
  return n + n / 32;
}
inline constexpr int64_t compressed_row_bytes(int64_t n) {
  return n / 2 + n / 16;
}
inline constexpr int64_t index_key_bytes(int64_t n) {
  return n / 2 + n / 32;
}

void pack_window_row(const float* x, int64_t n, uint8_t* out);
void unpack_window_row(const uint8_t* in, int64_t n, float* x);
void pack_compressed_row(const float* x, int64_t n, uint8_t* out);
void unpack_compressed_row(const uint8_t* in, int64_t n, float* x);
void pack_index_key(const float* x, int64_t n, uint8_t* out);
void unpack_index_key(const uint8_t* in, int64_t n, float* x);

// The window rows' FP8 rule in place of the values (no packing): the activation rounding of
// act-quant mode (Kernels::act_quant_fp8; y may alias x, n any, blocks of 32 from x).
void fake_fp8_pow2_row(const float* x, int64_t n, float* y);

// The E2M1 code (sign in bit 3) of v, |v| <= 6, rounded to nearest with ties to even, decided by
// comparing |v| with the exact midpoints between representable magnitudes (no division).
uint8_t e2m1_code_by_midpoints(float v);

}  // namespace dsv41::ops
