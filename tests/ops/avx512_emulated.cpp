// The AVX-512 tiers' sources compiled against the intrinsic emulation (avx512_emulation.h) with the
// AVX2 tier's flags: their shared 256-bit bodies run natively, their 16-wide policy code and the
// VNNI dot emulated. The tables are tested as the tiers "avx512_emulated" and
// "avx512_vnni_emulated" wherever the AVX2 tier runs. One translation unit per tier (the VNNI
// switch is a macro read by the shared headers): this one is the plain AVX-512 tier.
#include <immintrin.h>

#include "avx512_emulation.h"

#define kAvx512Kernels kAvx512EmulatedKernels
#include "ops/avx512/kernels_avx512.cpp"  // NOLINT(bugprone-suspicious-include)
