// Element types of checkpoints and caches, and their exact conversions.
//
// Formats (spec §3.1): bf16; OCP F8_E4M3 "fn" (bias 7, max ±448, no inf, NaN = 0x7F/0xFF);
// F8_E8M0 scales (value 2^(e-127), 255 = NaN); E2M1 nibbles (sign bit 3, magnitudes
// {0,0.5,1,1.5,2,3,4,6}; in packed bytes the low nibble is the even element). Every decode is exact
// in float. Encoders round to nearest, ties to even, deciding by exact comparison (no division),
// and take double so fp32 and fp64 callers share one definition.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace dsv41 {

// The safetensors dtype names we understand. Sub-byte dtypes of newer safetensors are refused.
enum class DType : uint8_t {
  kBool,
  kU8,
  kI8,
  kF8_E4M3,
  kF8_E5M2,
  kF8_E8M0,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kI64,
  kU64,
  kF64,
};

std::size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
std::optional<DType> parse_dtype(std::string_view name);

// ---- bf16 ----
inline float bf16_to_float(uint16_t b) {
  uint32_t bits = uint32_t(b) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}
// Round-to-nearest-even; NaN stays a quiet NaN with its sign.
uint16_t float_to_bf16(float f);

// ---- F8_E4M3 (e4m3fn) ----
float e4m3_to_float(uint8_t b);
// RNE, saturating: |x| beyond 448 gives ±448 (the clamp every quantizer of spec §3.3/§3.4 applies
// first); NaN gives 0x7F. The sign of zero is kept.
uint8_t e4m3_from_double(double x);

// ---- F8_E8M0 ----
// 2^(e-127); e = 255 is NaN. e = 0 gives 2^-127 (a float subnormal, still exact).
float e8m0_to_float(uint8_t e);
double e8m0_to_double(uint8_t e);
// Byte for the power of two 2^exp2; exp2 must lie in [-127, 127].
uint8_t e8m0_from_exponent(int exp2);

// ---- E2M1 ----
inline constexpr float kE2M1Magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
inline float e2m1_to_float(uint8_t nibble) {
  float m = kE2M1Magnitudes[nibble & 7];
  return (nibble & 8) ? -m : m;
}
// RNE with the decision points 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 (ties to the even code);
// |x| >= 6 saturates to 6; NaN gives +6; the sign is kept (-0 allowed). Returns the nibble.
uint8_t e2m1_from_double(double x);
// Element i of a packed E2M1 row: byte i/2, low nibble for even i.
inline uint8_t e2m1_nibble(const uint8_t* packed, std::size_t i) {
  uint8_t b = packed[i >> 1];
  return (i & 1) ? uint8_t(b >> 4) : uint8_t(b & 0xF);
}

}  // namespace dsv41
