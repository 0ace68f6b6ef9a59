// AVX-512 + VNNI tier (the AVX-512 flags plus -mavx512vnni): the AVX-512 tier with the MXFP4
// integer dots (the one-token int16 dot, and the two-term dots of one and several tokens) on
// vpdpwssd (multiply pairs of int16 and add to int32 in one instruction where AVX2 needs vpmaddwd
// and vpaddd) and the indexer's eight-key dots on vpdpbusd (vpmaddubsw and
// vpmaddwd before). Integer sums are exact and cannot overflow there
// (ops/simd_common.h), so its results are bit-identical to the other SIMD tiers'. bf16 (vdpbf16ps)
// is not used: it would round activations to 8 significant bits, a numerics change no test or
// measurement has backed yet.
#define DSV41_VNNI 1
#include "ops/avx512/avx512_tier.h"

namespace dsv41::ops {

extern constinit const Kernels kAvx512VnniKernels = simd_table<Avx512>(Isa::kAvx512Vnni);

}  // namespace dsv41::ops
