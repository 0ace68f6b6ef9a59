// AVX-512 + VNNI + BF16 + VBMI tier (Zen 4, Sapphire Rapids): the avx512_vnni tier's table plus the
// act-quant GEMM family on vdpbf16ps (avx512_bf16_gemm.h), which the fast engine uses for the FP8
// linears and the experts when act-quant is on, and the GEMMs for fp32 activations on FMAs
// (avx512_fp8_f32_gemm.h, avx512_mxfp4_f32_gemm.h: act-quant off, and wo_a's input with
// act-quant on). Everything else is
// the avx512_vnni tier's code, compiled with these flags: the same bits.
#define DSV41_VNNI 1
#include "ops/avx512/avx512_bf16_gemm.h"
#include "ops/avx512/avx512_fp8_f32_gemm.h"
#include "ops/avx512/avx512_mxfp4_f32_gemm.h"
#include "ops/avx512/avx512_tier.h"

namespace dsv41::ops {
namespace {

constexpr Kernels bf16_table() {
  Kernels k = simd_table<Avx512>(Isa::kAvx512Bf16);
  k.aq_act_stride = &aq_act_stride_impl;
  k.aq_pack_act = &aq_pack_act_impl;
  k.aq_pack_act_split3 = &aq_pack_act_split3_impl;
  k.aq_fp8_gemm = &aq_fp8_gemm_impl;
  k.aq_mxfp4_gemm = &aq_mxfp4_gemm_impl;
  k.aq_mxfp4_gate_up = &aq_mxfp4_gate_up_impl;
  k.f32_act_stride = &f32_act_stride_impl;
  k.f32_pack_act = &f32_pack_act_impl;
  k.f32_fp8_gemm = &f32_fp8_gemm_impl;
  k.f32_mxfp4_gemm = &f32_mxfp4_gemm_impl;
  k.f32_mxfp4_gate_up = &f32_mxfp4_gate_up_impl;
  return k;
}

}  // namespace

extern constinit const Kernels kAvx512Bf16Kernels = bf16_table();

}  // namespace dsv41::ops
