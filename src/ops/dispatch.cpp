// Tier detection (cpuid via the compiler's builtins) and the once-resolved kernel table.
#include <cstdlib>
#include <cstring>

#include "core/log.h"
#include "ops/kernels.h"

namespace dsv41::ops {

// Defined in the per-tier translation units.
extern const Kernels kScalarKernels;
extern const Kernels kAvx2Kernels;
extern const Kernels kAvx512Kernels;
extern const Kernels kAvx512VnniKernels;
extern const Kernels kAvx512Bf16Kernels;

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx512Vnni:
      return "avx512_vnni";
    case Isa::kAvx512Bf16:
      return "avx512_bf16";
  }
  return "?";
}

bool isa_supported(Isa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("fma");
    case Isa::kAvx512Vnni:
      return isa_supported(Isa::kAvx512) && __builtin_cpu_supports("avx512vnni");
    case Isa::kAvx512Bf16:  // vdpbf16ps, and vpermi2b for the FP8 -> bf16 decode
      return isa_supported(Isa::kAvx512Vnni) && __builtin_cpu_supports("avx512bf16") &&
             __builtin_cpu_supports("avx512vbmi");
  }
  return false;
}

const Kernels& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx2:
      return kAvx2Kernels;
    case Isa::kAvx512:
      return kAvx512Kernels;
    case Isa::kAvx512Vnni:
      return kAvx512VnniKernels;
    case Isa::kAvx512Bf16:
      return kAvx512Bf16Kernels;
    default:
      return kScalarKernels;
  }
}

namespace {

Isa resolve() {
  Isa best = Isa::kScalar;
  for (Isa i : {Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Vnni, Isa::kAvx512Bf16})
    if (isa_supported(i)) best = i;
  if (const char* env = std::getenv("DSV41_ISA"); env && *env) {
    for (int k = 0; k < kIsaCount; ++k) {
      const Isa want = static_cast<Isa>(k);
      if (std::strcmp(env, isa_name(want)) != 0) continue;
      if (static_cast<int>(want) > static_cast<int>(best)) {
        log::warn("DSV41_ISA={}: not supported by this CPU; using {}", env, isa_name(best));
        return best;
      }
      return want;
    }
    log::warn(
        "DSV41_ISA={}: unknown tier (scalar, avx2, avx512, avx512_vnni, avx512_bf16); using {}",
        env, isa_name(best));
  }
  return best;
}

}  // namespace

Isa active_isa() {
  static const Isa isa = resolve();
  return isa;
}

bool fp8_aq_scales_ok(const uint8_t* scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (scale[i] < 41 || scale[i] > 246) return false;
  return true;
}

bool mxfp4_aq_scales_ok(const uint8_t* scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (scale[i] < 33 || scale[i] > 252) return false;
  return true;
}

const Kernels& kernels() {
  return kernels_for(active_isa());
}

}  // namespace dsv41::ops
