// The AVX-512 tier's source compiled against the intrinsic emulation (avx512_emulation.h) with the
// AVX2 tier's flags: its shared 256-bit bodies run natively, its 16-wide policy code emulated. The
// table is tested as the tier "avx512_emulated" wherever the AVX2 tier runs.
#include <immintrin.h>

#include "avx512_emulation.h"

#define kAvx512Kernels kAvx512EmulatedKernels
#include "ops/avx512/kernels_avx512.cpp"  // NOLINT(bugprone-suspicious-include)
