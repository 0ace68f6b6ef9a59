// The CPU kernel layer's interface: one table of kernel entry points per ISA tier, filled once at
// start-up from the CPU's features (or forced lower with DSV41_ISA=scalar|avx2|avx512|avx512_vnni
// for tests and A/B benchmarks). Each tier lives in its own translation units built with its own -m
// flags, so no instruction of a higher tier can run on a CPU without it. The scalar tier is the
// reference (ops/ref) every SIMD tier is tested against.
//
// Layouts (design.md §5, docs/convert.md): FP8 weights E4M3 [out, in] row-major with E8M0 scales
// per 32x32 block [ceil(out/32), ceil(in/32)]; MXFP4 weights packed two per byte (element 2j in the
// low nibble) [out, in/2] with E8M0 scales per row per 32 inputs [out, in/32]; the routed experts'
// gate and up rows interleaved (row 2j = gate row j, row 2j+1 = up row j). Activations fp32,
// accumulation fp32 (the reference tier accumulates in double).
#pragma once

#include <cstdint>

namespace dsv41::ops {

// Ordered: a higher tier needs every feature of the lower ones.
enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Vnni = 3, kAvx512Bf16 = 4 };
inline constexpr int kIsaCount = 5;
const char* isa_name(Isa isa);

inline constexpr int kMaxDecodeTokens = 16;

// The weight format a packed act-quant activation row is laid out for (Kernels::aq_pack_act).
enum class AqFormat : int { kFp8 = 0, kMxfp4 = 1 };

struct Kernels {
  Isa isa;
  // y[t * out + o] = sum_i W[o, i] x[t * in + i] for t < ntok (1..kMaxDecodeTokens), W FP8
  // block-scaled.
  void (*fp8_gemv)(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in, const float* x,
                   int64_t ntok, float* y);
  // y[t * out + o] = sum_i W[o, i] x[t * in + i], W MXFP4 (row-scaled per 32 inputs). With one
  // token the SIMD tiers round each 32-block of x to int16 (step max|x_block| / 32767) and dot in
  // integers (ops/simd_common.h); the rounding is the only difference from an fp32 dot product.
  void (*mxfp4_gemv)(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                     const float* x, int64_t ntok, float* y);
  // Fused gate/up over the interleaved w13 [2 * inter, dim] with the SwiGLU clamp epilogue (any
  // ntok: above kMaxDecodeTokens the SIMD tiers run it as a GEMM, the grouped prefill variant):
  // h[t * inter + j] = silu(min(g, limit)) * clamp(u, -limit, limit) * route[t],
  // g = w13 row 2j . x_t, u = w13 row 2j+1 . x_t.
  void (*mxfp4_gate_up)(const uint8_t* w13, const uint8_t* scale13, int64_t inter, int64_t dim,
                        const float* x, const float* route, int64_t ntok, float limit, float* h);
  // y = w * x / sqrt(mean(x^2) + eps); y may alias x.
  void (*rmsnorm)(const float* x, const float* w, int64_t n, float eps, float* y);
  // Sum of x[0..n): a pure streaming read, the bandwidth probe of `dsv41 bench kernels`.
  float (*read_sum)(const float* x, int64_t n);
  // RoPE on interleaved pairs of the last `dim` values of v[0..n): (a, b) -> (a c - b s, a s + b c)
  // with c = cos[i], s = sin[i] for pair i (inverse: s -> -s). Bit-identical to the reference's
  // rotation given the same cos/sin (separate multiplies and adds, no fused multiply-add).
  void (*rope)(float* v, int64_t n, int64_t dim, const float* cos, const float* sin, bool inverse);
  // Indexer scores over packed FP4 keys (ops/cache_pack.h index-key rows, di values each):
  // score[j] = sum_h max(q_h . k_j, 0) * w[h], q given as nh packed index-key rows too (the queries
  // are fake-quantized the same way). Every product of two E2M1 x 2^k values is exact, so the SIMD
  // tiers compute each 32-block's dot in integers (E2M1 x 2 is an integer in [-12, 12]).
  void (*indexer_scores)(const uint8_t* q, const float* w, int64_t nh, int64_t di,
                         const uint8_t* keys, int64_t nkeys, float* scores);
  // Sparse attention of one query position, all heads (MQA: the rows are keys and values at once):
  // rows[r] is a packed cache row of `dim` values, a window row (FP8, kind 0) or a compressed row
  // (FP4, kind 1) (ops/cache_pack.h). Per head h: softmax over r of (q_h . row_r) * scale with
  // exp(sink[h] - max) added to the denominator only; out[h * dim ..] = sum_r p_r row_r. No rows:
  // 0.
  void (*sparse_attention)(const float* q, int64_t heads, int64_t dim, const uint8_t* const* rows,
                           const uint8_t* kinds, int64_t nrows, float scale, const float* sink,
                           float* out);
  // mHC coefficient epilogue + Sinkhorn (ops/select.h hc_sinkhorn_ref), bit-identical to it.
  void (*hc_sinkhorn)(const float* m, const float* base, const float* scale, int64_t hc, float eps,
                      int64_t iters, float* pre, float* post, float* comb);
  // Prefill GEMMs, any ntok: y[t * ldy + o] = sum_i W[o, i] x[t * in + i] (fp32 accumulation).
  // Callers that split the rows of an FP8 matrix split at multiples of 32 (its scale blocks).
  void (*fp8_gemm)(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in, const float* x,
                   int64_t ntok, float* y, int64_t ldy);
  void (*bf16_gemm)(const uint16_t* w, int64_t out, int64_t in, const float* x, int64_t ntok,
                    float* y, int64_t ldy);
  // MXFP4 (one expert's tokens, gathered: the grouped prefill variant runs it per expert).
  void (*mxfp4_gemm)(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                     const float* x, int64_t ntok, float* y, int64_t ldy);
  // mHC coefficients of one token from its stream h [hc * d] (copy-major): m = (fn . h) / rms(h)
  // with fn F32 [(2 + hc) * hc, hc * d] and norm_eps inside the rms, then hc_sinkhorn on m (the
  // epilogue is bit-identical to the reference given m; m is an fp32 dot product in the tier's
  // order).
  void (*hc_mix)(const float* h, int64_t hc, int64_t d, const float* fn, const float* base,
                 const float* scale, float norm_eps, float hc_eps, int64_t iters, float* pre,
                 float* post, float* comb);
  // The collapse fused with the RMSNorm that follows it: x = sum_j w[j] h[j] over the hc streams
  // of d values (in j order, bit-identical to the reference's collapse), then
  // x = norm_w * (x / rms(x)) (the rms sum in the tier's order).
  void (*hc_collapse_rmsnorm)(const float* h, const float* w, int64_t hc, int64_t d,
                              const float* norm_w, float eps, float* x);
  // out[k * d + i] = post[k] y[i] + sum_j comb[j * hc + k] res[j * d + i] in j order
  // (bit-identical to the reference's expand); out may not alias res.
  void (*hc_expand)(const float* y, const float* res, const float* post, const float* comb,
                    int64_t hc, int64_t d, float* out);
  // Prefill attention, the banded window and the compressed rows under one softmax per query and
  // head: query i < nq (q + i * heads * dim) sits at position p0 + i and attends to the window rows
  // of positions max(0, p0 + i - window + 1) .. p0 + i, which `win` holds packed and contiguous
  // (FP8 window rows of positions wpos0 .. wpos0 + nwin - 1; they must cover every query's band),
  // then to its own compressed rows comp[cofs[i] .. cofs[i + 1]) (FP4). out + i * heads * dim.
  // Equal to sparse_attention per query on that row list; the SIMD tiers unpack each window row
  // once for all the queries whose band holds it.
  void (*prefill_attention)(const float* q, int64_t nq, int64_t heads, int64_t dim,
                            const uint8_t* win, int64_t wpos0, int64_t nwin, int64_t p0,
                            int64_t window, const uint8_t* const* comp, const int64_t* cofs,
                            float scale, const float* sink, float* out);
  // Cache rows (ops/cache_pack.h layouts): the tier's packers and unpackers, bit-exact with the
  // scalar ones (the scalar tier's entries) on every input.
  void (*pack_window_row)(const float* x, int64_t n, uint8_t* out);
  void (*unpack_window_row)(const uint8_t* in, int64_t n, float* x);
  void (*pack_compressed_row)(const float* x, int64_t n, uint8_t* out);
  void (*unpack_compressed_row)(const uint8_t* in, int64_t n, float* x);
  void (*pack_index_key)(const float* x, int64_t n, uint8_t* out);
  void (*unpack_index_key)(const uint8_t* in, int64_t n, float* x);
  // mxfp4_gemv / mxfp4_gate_up without the one-token int16 rounding of the activations (it fails
  // the fast path's short-prefix gate on random weights, docs/decisions.md): one token splits each
  // activation into two int16 terms (error below 2^-30 of its block's largest value; exact integer
  // dots), several tokens use fp32 products; a token's result does not depend on the other
  // tokens' values.
  void (*mxfp4_gemv_f32)(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                         const float* x, int64_t ntok, float* y);
  void (*mxfp4_gate_up_f32)(const uint8_t* w13, const uint8_t* scale13, int64_t inter, int64_t dim,
                            const float* x, const float* route, int64_t ntok, float limit,
                            float* h);
  // One token of a BF16 linear: y[o] = W[o, :] . x (fp32 accumulation); a row's result does not
  // depend on how the caller splits the rows.
  void (*bf16_gemv)(const uint16_t* w, int64_t out, int64_t in, const float* x, float* y);
  // Batch-invariant several-token GEMVs: token t's outputs (y[t * ldy + o], h[t * ldh + j]) are bit
  // for bit those of the one-token entry for x_t alone (fp8_gemv with ntok 1, bf16_gemv,
  // mxfp4_gemv_f32 / mxfp4_gate_up_f32 with ntok 1); only the reading of the weights is shared.
  void (*fp8_gemv_batch)(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                         const float* x, int64_t ntok, float* y, int64_t ldy);
  void (*bf16_gemv_batch)(const uint16_t* w, int64_t out, int64_t in, const float* x, int64_t ntok,
                          float* y, int64_t ldy);
  void (*mxfp4_gemv_batch)(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                           const float* x, int64_t ntok, float* y, int64_t ldy);
  void (*mxfp4_gate_up_batch)(const uint8_t* w13, const uint8_t* scale13, int64_t inter,
                              int64_t dim, const float* x, const float* route, int64_t ntok,
                              float limit, float* h, int64_t ldh);
  // Act-quant rounding of one activation row (n values, 32-value blocks from its start; y may
  // alias x): DeepSeek's act_quant with a power-of-two scale, the window rows' FP8 rule:
  // s = pow2_ceil(max(amax, 1e-4) * (1 / 448)) in float, y = e4m3(clamp(x / s, +-448)) * s (E4M3
  // rounding to nearest even, subnormals included). Every tier bit-identical to the scalar one,
  // which is the reference's fake_fp8_pow2 in float.
  void (*act_quant_fp8)(const float* x, int64_t n, float* y);
  // The act-quant GEMM family (null in tiers without a bf16 dot product; avx512_bf16 has it):
  // activations that act-quant mode has rounded to E4M3 with a power-of-two scale per 32, so each
  // product with an FP8 or MXFP4 weight is exact and only the fp32 sums round, in one fixed order
  // per output element whatever ntok is: every token gets the same bits at ntok = 1 and ntok = 500,
  // and the weights are decoded once per block of tokens of at most 2 MB of activations (about 200
  // tokens at 5,120 values; ops/avx512/avx512_bf16_gemm.h aq_token_block). aq_pack_act lays x
  // [ntok, in] out as the tier's packed rows for one weight format (aq_act_stride(in, fmt) 16-bit
  // words each); the GEMMs take them: y[t * ldy + o] = W[o, :] . x_t; aq_mxfp4_gate_up is
  // mxfp4_gate_up_batch's fused gate/up with its clamp/SwiGLU/route epilogue. Only for weights
  // whose scales pass fp8_aq_scales_ok / mxfp4_aq_scales_ok (callers check once per matrix: FP8
  // linears at load, experts on first use).
  int64_t (*aq_act_stride)(int64_t in, AqFormat fmt);
  void (*aq_pack_act)(const float* x, int64_t ntok, int64_t in, AqFormat fmt, uint16_t* xp);
  // Any fp32 activations (the engine: act-quant off) as three bf16 terms whose sum is x
  // exactly (hi = bf16(x), mid = bf16(x - hi), lo = x - hi - mid; only terms below 2^-126, which
  // vdpbf16ps flushes, are lost): packed rows 3t, 3t + 1, 3t + 2 hold token t's terms, so a GEMM
  // over 3 * ntok packed rows gives each term's exact-product dot, and y_t = (hi + mid) + lo of
  // them, in that order, has the same bits at every ntok.
  void (*aq_pack_act_split3)(const float* x, int64_t ntok, int64_t in, AqFormat fmt, uint16_t* xp);
  void (*aq_fp8_gemm)(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                      const uint16_t* xp, int64_t ntok, float* y, int64_t ldy);
  void (*aq_mxfp4_gemm)(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                        const uint16_t* xp, int64_t ntok, float* y, int64_t ldy);
  void (*aq_mxfp4_gate_up)(const uint8_t* w13, const uint8_t* scale13, int64_t inter, int64_t dim,
                           const uint16_t* xp, const float* route, int64_t ntok, float limit,
                           float* h, int64_t ldh);
  // The fp32-activation GEMM family (null in tiers without it; avx512_bf16 has it:
  // ops/avx512/avx512_fp8_f32_gemm.h, avx512_mxfp4_f32_gemm.h; avx2 too: ops/avx2/avx2_f32_gemm.h):
  // FP8 or MXFP4 weights (the same scales conditions, fp8_aq_scales_ok / mxfp4_aq_scales_ok; MXFP4
  // rows of a multiple of 32 values) times any fp32 activations, each product exact (FMA), the
  // fp32 sums in one fixed order per output whatever ntok is (the act-quant GEMMs' batch
  // invariance): the engine's path for fp32 inputs (act-quant off, wo_a's input with act-quant on,
  // and every input on a tier without the act-quant GEMMs), one pass where aq_pack_act_split3
  // needs three.
  // f32_pack_act lays x [ntok, in] out as packed rows of f32_act_stride(in, fmt) floats for one
  // weight format; f32_mxfp4_gate_up is mxfp4_gate_up_batch's fused gate/up with its epilogue.
  int64_t (*f32_act_stride)(int64_t in, AqFormat fmt);
  void (*f32_pack_act)(const float* x, int64_t ntok, int64_t in, AqFormat fmt, float* xp);
  void (*f32_fp8_gemm)(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                       const float* xp, int64_t ntok, float* y, int64_t ldy);
  void (*f32_mxfp4_gemm)(const uint8_t* w, const uint8_t* scale, int64_t out, int64_t in,
                         const float* xp, int64_t ntok, float* y, int64_t ldy);
  void (*f32_mxfp4_gate_up)(const uint8_t* w13, const uint8_t* scale13, int64_t inter, int64_t dim,
                            const float* xp, const float* route, int64_t ntok, float limit,
                            float* h, int64_t ldh);
  // Full (non-causal) multi-head attention, the vision tower's (spec §9.1): nq queries over nk
  // keys, each row `heads` heads of `dim` values (head h at h * dim); query row i at q + i * ld,
  // key/value row j at k + j * ld / v + j * ld, output row i at out + i * ldo. Per head:
  // out_i = sum_j p_ij v_j, p_i = softmax_j(scale * q_i . k_j). No keys: 0. The scalar tier is
  // the plain two-pass softmax in double; the SIMD tiers run a blocked online softmax in fp32
  // (ops/simd_vision_attention.h), each query row's reduction in one fixed order: its bits do not
  // depend on nq, on the split of the rows over calls, or on the heads passed with it.
  void (*vision_attention)(const float* q, const float* k, const float* v, int64_t ld, int64_t nq,
                           int64_t nk, int64_t heads, int64_t dim, float scale, float* out,
                           int64_t ldo);
};

// Whether an FP8 matrix's E8M0 block scales (n bytes) suit the act-quant GEMMs, which fold the
// scale into the bf16 weight: every scaled E4M3 weight (2^-9 .. 448 times 2^(s-127)) a normal bf16
// below 2^128 (s <= 246), and its product with the least act-quant activation (2^-31: scale
// 2^-22 times the E4M3 step 2^-9) at least 2^-126, so vdpbf16ps flushes no product (s >= 41).
bool fp8_aq_scales_ok(const uint8_t* scale, int64_t n);
// The same for MXFP4 row scales, applied in fp32 to each 128-value chunk's dot: 2^(s-127) made by
// a shift (s >= 1, s = 255 is NaN), and the least non-zero chunk dot (0.5 x 2^-31) times it at
// least 2^-126 (s >= 33); s <= 252 as for FP8.
bool mxfp4_aq_scales_ok(const uint8_t* scale, int64_t n);

// The best tier this CPU supports, capped by DSV41_ISA when set (resolved once).
const Kernels& kernels();
Isa active_isa();
// The table of one tier; only call its kernels when isa_supported(isa).
const Kernels& kernels_for(Isa isa);
bool isa_supported(Isa isa);

}  // namespace dsv41::ops
