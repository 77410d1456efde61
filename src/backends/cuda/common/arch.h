// GPU generations as named capabilities, in ONE place, for device code (__CUDA_ARCH__) and host code
// (the runtime compute capability, major*100 + minor*10). Always ranges (>= a && < b), never
// equality: sm_121 (DGX Spark) must take the sm_120 paths (vLLM's "== 1200" FP8 bug on GB10).
#pragma once

namespace spark::cuda {

constexpr int kCcAmpere    = 800;   // sm_80/86: bf16 mma.sync, cp.async
constexpr int kCcAda       = 890;   // sm_89: + FP8 mma.sync
constexpr int kCcHopper    = 900;   // sm_90a: + wgmma, TMA
constexpr int kCcBlackwell = 1000;  // sm_100 datacenter (tcgen05; not a spark target)
constexpr int kCcBlackwellGeforce = 1200;  // sm_120a (RTX 50xx / PRO 6000), sm_121a (GB10): FP4 mma.sync + cvt
constexpr int kCcNext      = 1300;

constexpr int kCcMin = kCcAmpere;  // older GPUs are refused with a clear error

// Host side: capabilities of a device with compute capability `cc` (e.g. 900 for 9.0).
constexpr bool cc_supported(int cc) { return cc >= kCcMin; }
constexpr bool cc_has_fp8_mma(int cc) { return cc >= kCcAda; }
constexpr bool cc_is_hopper(int cc) { return cc >= kCcHopper && cc < kCcBlackwell; }
constexpr bool cc_has_fp4_mma_sync(int cc) { return cc >= kCcBlackwellGeforce && cc < kCcNext; }

}  // namespace spark::cuda

// Device side: what the current compilation pass may use. The arch-specific features also need the
// arch-specific target (sm_90a, sm_120a, sm_121a), which the build uses for exactly those files.
#if defined(__CUDA_ARCH__)
#define SPARK_ARCH_AMPERE_PLUS (__CUDA_ARCH__ >= 800)
#define SPARK_ARCH_FP8_MMA (__CUDA_ARCH__ >= 890)
#define SPARK_ARCH_HOPPER_PLUS (__CUDA_ARCH__ >= 900)  // thread block clusters, griddepcontrol (PDL)
#define SPARK_ARCH_HOPPER (__CUDA_ARCH__ >= 900 && __CUDA_ARCH__ < 1000)
#if (__CUDA_ARCH__ >= 1200 && __CUDA_ARCH__ < 1300) && (defined(__CUDA_ARCH_SPECIFIC__) || defined(__CUDA_ARCH_FAMILY_SPECIFIC__))
#define SPARK_ARCH_FP4_MMA_SYNC 1  // cvt.rn.satfinite.e2m1x2.f32, mma.sync ... kind::mxf4nvf4.block_scale
#else
#define SPARK_ARCH_FP4_MMA_SYNC 0
#endif
#else
#define SPARK_ARCH_AMPERE_PLUS 0
#define SPARK_ARCH_FP8_MMA 0
#define SPARK_ARCH_HOPPER_PLUS 0
#define SPARK_ARCH_HOPPER 0
#define SPARK_ARCH_FP4_MMA_SYNC 0
#endif
