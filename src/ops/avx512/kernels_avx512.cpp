// AVX-512 tier (built with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c): the policy
// struct of avx512_tier.h works on 16-wide vectors (fp32 dots, tiles, RoPE, reductions) and the
// FP8 decode GEMVs (one token with long rows, several tokens: avx512_fp8_batch.h); the other decode
// GEMVs, GEMMs, attention, packers and mHC kernels are the shared 256-bit bodies (ops/simd_*.h),
// compiled here with this tier's flags (the MXFP4 tiles in this tier's shape). No static
// initialisers (see kernels_avx2.cpp): the table is constinit.
#include "ops/avx512/avx512_tier.h"

namespace dsv41::ops {

extern constinit const Kernels kAvx512Kernels = simd_table<Avx512>(Isa::kAvx512);

}  // namespace dsv41::ops
