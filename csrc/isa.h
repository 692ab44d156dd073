// The x86 instruction sets the kernels use, named in one place. A kernel picks its code in one of two ways:
//
// - at build time: setup.py compiles every source twice, for AVX2 (radixlm._C: -march=x86-64-v3) and for AVX-512
//   VNNI/BF16 (radixlm._C_avx512), and radixlm/model/ops.py loads the build the CPU runs; a kernel tests
//   RADIXLM_BUILD_AVX512 or RADIXLM_BUILD_AVX512_VNNI with `#if`, keeping a portable loop (vectorized for AVX2) for
//   the other case (the paged attention, the int8 linear, the int8 row maximum);
// - at run time: a kernel that must serve every x86 CPU from one build (the GGUF linear, whose paths the tests run
//   side by side) marks each function with RADIXLM_AVX2 or RADIXLM_AVX512 (VNNI included), so its file builds
//   whatever the -march, and calls it only when isa::cpu_has_avx2() or isa::cpu_has_avx512() says the CPU can.
//
// Including this header also brings the intrinsics (<immintrin.h>).
#pragma once

#include <immintrin.h>

#include <cstdlib>
#include <cstring>

#if defined(__AVX512F__)
#define RADIXLM_BUILD_AVX512 1
#else
#define RADIXLM_BUILD_AVX512 0
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define RADIXLM_BUILD_AVX512_VNNI 1
#else
#define RADIXLM_BUILD_AVX512_VNNI 0
#endif

#if RADIXLM_BUILD_AVX512 && defined(__AVX512BF16__)
#define RADIXLM_BUILD_AVX512_BF16 1
#else
#define RADIXLM_BUILD_AVX512_BF16 0
#endif

#define RADIXLM_AVX2 __attribute__((target("avx2,fma,f16c")))
#define RADIXLM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))
// RADIXLM_AVX512 and the bfloat16 dot product and conversions (Zen 4 and later, Xeons from Cooper Lake).
#define RADIXLM_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,f16c,fma")))
// RADIXLM_AVX512_BF16 and AMX's tiles with their bfloat16 product (Xeons from Sapphire Rapids; amx_tiles.h).
#define RADIXLM_AMX \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,f16c,fma")))

namespace radixlm::isa {

// What RADIXLM_AVX2 code needs: AVX2, FMA and F16C. libgcc's checks include the OS's support for the YMM
// state; the answer is computed once.
inline bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return has;
}

// RADIXLM_KERNEL_ISA=avx2 (radixlm/model/ops.py, which then loads the AVX2 build) makes this process run as on an
// AVX2-only CPU: the run-time choices below then see no AVX-512 either.
inline bool avx2_forced() {
  const char* value = std::getenv("RADIXLM_KERNEL_ISA");
  return value != nullptr && std::strcmp(value, "avx2") == 0;
}

// What RADIXLM_AVX512 code needs: AVX-512 F, BW, VL and VNNI, F16C and FMA (the ZMM state included); false when
// avx2_forced().
inline bool cpu_has_avx512() {
  static const bool has = !avx2_forced() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                          __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
  return has;
}

// What RADIXLM_AVX512_BF16 code needs: cpu_has_avx512() and AVX-512 DQ and BF16.
inline bool cpu_has_avx512_bf16() {
  static const bool has = cpu_has_avx512() && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512bf16");
  return has;
}

}  // namespace radixlm::isa
