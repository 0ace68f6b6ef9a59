// The AVX-512 + VNNI tier's source over the intrinsic emulation (see avx512_emulated.cpp).
#include <immintrin.h>

#include "avx512_emulation.h"

#define kAvx512VnniKernels kAvx512VnniEmulatedKernels
#include "ops/avx512/kernels_avx512_vnni.cpp"  // NOLINT(bugprone-suspicious-include)
