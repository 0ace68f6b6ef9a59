// Exact dtype conversions (see dtypes.h for the formats and rounding rules).
#include "core/dtypes.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/check.h"

namespace dsv41 {
namespace {

struct DTypeInfo {
  DType type;
  std::string_view name;
  std::size_t size;
};

constexpr std::array<DTypeInfo, 16> kDTypes = {{
    {DType::kBool, "BOOL", 1},
    {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},
    {DType::kF8_E4M3, "F8_E4M3", 1},
    {DType::kF8_E5M2, "F8_E5M2", 1},
    {DType::kF8_E8M0, "F8_E8M0", 1},
    {DType::kI16, "I16", 2},
    {DType::kU16, "U16", 2},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kI32, "I32", 4},
    {DType::kU32, "U32", 4},
    {DType::kF32, "F32", 4},
    {DType::kI64, "I64", 8},
    {DType::kU64, "U64", 8},
    {DType::kF64, "F64", 8},
}};

std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> t{};
  for (int b = 0; b < 256; ++b) {
    const int sign = b >> 7, exp = (b >> 3) & 0xF, man = b & 7;
    float v;
    if ((b & 0x7F) == 0x7F) {
      v = std::nanf("");
    } else if (exp == 0) {
      v = std::ldexp(float(man), -9);  // subnormal: man * 2^-6 * 2^-3
    } else {
      v = std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
    }
    t[b] = sign ? -v : v;
  }
  return t;
}

const std::array<float, 256> kE4M3Table = make_e4m3_table();

std::array<double, 256> make_e8m0_table() {
  std::array<double, 256> t{};
  for (int e = 0; e < 255; ++e) t[std::size_t(e)] = std::ldexp(1.0, e - 127);
  t[255] = std::nan("");
  return t;
}

const std::array<double, 256> kE8M0Table = make_e8m0_table();

}  // namespace

std::size_t dtype_size(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.size;
  DSV41_CHECK_MSG(false, "unknown DType");
}

std::string_view dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d.name;
  DSV41_CHECK_MSG(false, "unknown DType");
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& d : kDTypes)
    if (d.name == name) return d.type;
  return std::nullopt;
}

uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((bits >> 16) | 0x0040u);  // quiet NaN
  const uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7FFFu + lsb;
  return uint16_t(bits >> 16);
}

float e4m3_to_float(uint8_t b) {
  return kE4M3Table[b];
}

uint8_t e4m3_from_double(double x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  double a = std::fabs(x);
  if (a >= 448.0) return sign | 0x7E;
  // Quantum of the binade holding a: 2^(E-3) for normals (E >= -6), 2^-9 for subnormals.
  int e2;
  std::frexp(a, &e2);  // a = f * 2^e2, f in [0.5, 1)  =>  a in [2^(e2-1), 2^e2)
  const int binade = (a == 0.0) ? -6 : std::max(e2 - 1, -6);
  const double quantum = std::ldexp(1.0, binade - 3);
  // a / quantum is exact (power-of-two scaling); nearbyint rounds half to even in the default mode.
  const double q = std::nearbyint(a / quantum);
  const double r = q * quantum;  // exact; may have moved up one binade, or up to 448
  if (r == 0.0) return sign;
  if (r < std::ldexp(1.0, -6)) return sign | uint8_t(r / std::ldexp(1.0, -9));  // subnormal code
  int re2;
  const double f = std::frexp(r, &re2);  // r = f * 2^re2
  const int exp_field = (re2 - 1) + 7;
  const int man = int((f * 2.0 - 1.0) * 8.0);
  return sign | uint8_t(exp_field << 3) | uint8_t(man);
}

float e8m0_to_float(uint8_t e) {
  if (e == 255) return std::nanf("");
  return std::ldexp(1.0f, int(e) - 127);
}

double e8m0_to_double(uint8_t e) {
  return kE8M0Table[e];
}

uint8_t e8m0_from_exponent(int exp2) {
  DSV41_CHECK(exp2 >= -127 && exp2 <= 127);
  return uint8_t(exp2 + 127);
}

uint8_t e2m1_from_double(double x) {
  const uint8_t sign = std::signbit(x) ? 8 : 0;
  if (std::isnan(x)) return 7;
  const double a = std::fabs(x);
  uint8_t code;
  if (a <= 0.25)
    code = 0;  // tie 0.25 -> 0 (even)
  else if (a < 0.75)
    code = 1;
  else if (a <= 1.25)
    code = 2;  // ties 0.75 and 1.25 -> 1.0 (code 2, even)
  else if (a < 1.75)
    code = 3;
  else if (a <= 2.5)
    code = 4;  // ties 1.75 and 2.5 -> 2.0 (code 4)
  else if (a < 3.5)
    code = 5;
  else if (a <= 5.0)
    code = 6;  // ties 3.5 and 5.0 -> 4.0 (code 6)
  else
    code = 7;
  return sign | code;
}

}  // namespace dsv41
