// The kernel table of a SIMD tier: the shared bodies (ops/simd_*.h) instantiated with the tier's
// ISA policy struct S. Included by each tier's translation unit and evaluated at compile time, so
// the table is constant-initialised (no static initialiser runs before dispatch has checked the
// CPU); internal linkage, as everything the tiers compile with their own flags.
#pragma once

#include "ops/kernels.h"
#include "ops/simd_attention.h"
#include "ops/simd_common.h"
#include "ops/simd_gemm.h"
#include "ops/simd_pack.h"
#include "ops/simd_vision_attention.h"

namespace dsv41::ops {
namespace {

template <typename S>
constexpr Kernels simd_table(Isa isa) {
  return Kernels{isa, &fp8_gemv_impl<S>, &mxfp4_gemv_impl<S>, &mxfp4_gate_up_any<S>,
                 &rmsnorm_impl<S>, &read_sum_impl<S>, &rope_impl<S>, &indexer_scores_simd,
                 &sparse_attention_simd, &hc_sinkhorn_simd, &fp8_gemm_simd, &bf16_gemm_simd,
                 &mxfp4_gemm_simd, &hc_mix_impl<S>, &hc_collapse_rmsnorm_simd, &hc_expand_simd,
                 &prefill_attention_simd, &pack_window_row_simd, &unpack_window_row_simd,
                 &pack_compressed_row_simd, &unpack_compressed_row_simd, &pack_index_key_simd,
                 &unpack_index_key_simd, &mxfp4_gemv_impl<S, false>, &mxfp4_gate_up_any<S, false>,
                 &bf16_gemv_simd, &S::fp8_gemv_batch, &bf16_gemv_batch_simd,
                 &mxfp4_gemv_batch_impl<S>, &mxfp4_gate_up_batch_impl<S>, &act_quant_fp8_simd,
                 // the act-quant GEMMs: only tiers with a bf16 dot (kernels_avx512_bf16.cpp)
                 nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                 // the GEMMs for fp32 activations: the same tiers (avx512_*_f32_gemm.h)
                 nullptr, nullptr, nullptr, nullptr, nullptr,
                 // the vision tower's attention: the tier's vector width
                 &S::vision_attention};
}

}  // namespace
}  // namespace dsv41::ops
