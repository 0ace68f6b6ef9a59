// Selection and small-matrix kernels of the attention/mHC paths, scalar references (ops/ref):
//   topk_threshold: the k largest of n scores without sorting (radix select on the float bits, then
//   one
//     pass collecting every index above the threshold and the lowest-index ties at it) — the same
//     index set as a full sort with ties broken by lower index, in ascending index order;
//   hc_sinkhorn: the mHC coefficient epilogue (sigmoids, row softmax, 20-step Sinkhorn) from the
//   mix
//     vector, bit-identical to the reference loop (model/reference/ref_ops.h hc_mixes).
#pragma once

#include <cstdint>

namespace dsv41::ops {

// Writes min(k, n) indices to out (ascending); returns how many. +0 and -0 are equal scores; scores
// must not be NaN.
int64_t topk_threshold(const float* v, int64_t n, int64_t k, int64_t* out);

// m: the (2 + hc) * hc mix values already multiplied by the stream's rms factor; base likewise;
// scale[3]. Outputs pre[hc], post[hc], comb[hc * hc] (comb[j * hc + k]). iters >= 1 as in the
// model (one column step, then iters - 1 row+column steps); iters <= 0 stops after the row softmax.
void hc_sinkhorn_ref(const float* m, const float* base, const float* scale, int64_t hc, float eps,
                     int64_t iters, float* pre, float* post, float* comb);

}  // namespace dsv41::ops
