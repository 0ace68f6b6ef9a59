// The fused gate/up epilogue of the GEMM families (ops/avx512/avx512_bf16_gemm.h,
// avx512_mxfp4_f32_gemm.h, ops/avx2/avx2_f32_gemm.h): a GEMM over the interleaved w13 (row 2j
// gate j, row 2j + 1 up j) kGemmGateUpPairs pairs at a time into a per-thread buffer, then
// h = silu(min(g, limit)) * clamp(u, -limit, limit) * route, element by element (the epilogue of
// fp4_gate_up_rows, ops/simd_common.h). ISA-free: each tier instantiates it with its own GEMM.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>

namespace dsv41::ops {
namespace {

constexpr int64_t kGemmGateUpPairs = 64;

// gemm(j0, jn, gu): pairs j0 .. j0 + jn - 1 of every token into gu (rows of 2 * jn values).
template <class Gemm>
inline void gate_up_by_pairs(int64_t inter, const float* route, int64_t ntok, float limit, float* h,
                             int64_t ldh, const Gemm& gemm) {
  static thread_local std::unique_ptr<float[]> buf;
  static thread_local std::size_t cap = 0;
  const std::size_t need = std::size_t(ntok * 2 * kGemmGateUpPairs);
  if (cap < need) buf.reset(new float[need]), cap = need;
  float* gu = buf.get();
  for (int64_t j0 = 0; j0 < inter; j0 += kGemmGateUpPairs) {
    const int64_t jn = std::min(kGemmGateUpPairs, inter - j0);
    gemm(j0, jn, gu);
    for (int64_t t = 0; t < ntok; ++t)
      for (int64_t j = 0; j < jn; ++j) {
        const float gc = std::min(gu[t * 2 * jn + 2 * j], limit);
        const float uc = std::clamp(gu[t * 2 * jn + 2 * j + 1], -limit, limit);
        h[t * ldh + j0 + j] = gc / (1.0f + std::exp(-gc)) * uc * route[t];
      }
  }
}

}  // namespace
}  // namespace dsv41::ops
