// The PTX of the Blackwell-GeForce generation (sm_120a, sm_121a): typed wrappers of the hardware
// f32 -> E2M1 convert and the block-scaled FP4 tensor-core MMA (the sm_80 baseline is
// ptx_sm80.cuh). They exist only in device passes where common/arch.h's SPARK_ARCH_FP4_MMA_SYNC is 1
// (the arch-specific `a` targets of the 12.x family); elsewhere the header declares nothing, so a
// stray use fails to compile instead of running a software imitation (and the CPU warp emulator
// has no shadow of it).
//
// Sources: PTX ISA 8.7+ `cvt` (.e2m1x2) and `mma` (block scaling, kind::mxf4nvf4), summarised in
// docs/FORMATS.md §1.1 and §5; operand layouts cross-checked against CUTLASS's SM120_16x8x64_TN_VS
// traits (cute/atom/mma_traits_sm120.hpp).
#pragma once

#include "backends/cuda/common/arch.h"

#include <cstdint>

namespace spark::cuda::ptx {

#if SPARK_ARCH_FP4_MMA_SYNC

// Eight floats -> eight E2M1 codes, v[j] in bits [4j, 4j + 4) (even element in the low nibble of
// each byte, the NVFP4 packing), each rounded to nearest even with saturation to +-6
// (cvt.rn.satfinite.e2m1x2.f32 d, a, b puts a in the upper nibble and b in the lower one).
__device__ __forceinline__ uint32_t cvt_e2m1x8(float v0, float v1, float v2, float v3, float v4, float v5, float v6, float v7) {
    uint32_t out;
    asm("{\n\t"
        ".reg .b8 q0, q1, q2, q3;\n\t"
        "cvt.rn.satfinite.e2m1x2.f32 q0, %2, %1;\n\t"
        "cvt.rn.satfinite.e2m1x2.f32 q1, %4, %3;\n\t"
        "cvt.rn.satfinite.e2m1x2.f32 q2, %6, %5;\n\t"
        "cvt.rn.satfinite.e2m1x2.f32 q3, %8, %7;\n\t"
        "mov.b32 %0, {q0, q1, q2, q3};\n\t"
        "}"
        : "=r"(out)
        : "f"(v0), "f"(v1), "f"(v2), "f"(v3), "f"(v4), "f"(v5), "f"(v6), "f"(v7));
    return out;
}

// D[16x8] += (A * SFA)[16x64] (B * SFB)[64x8], E2M1 operands, one UE4M3 scale per 16 K-elements,
// float32 accumulation:
//   mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3
// Lane l, g = l / 4, t = l % 4 (the m16n8k64 4-bit layout, 8 codes per register, K ascending from
// the low nibble):
//   a[0] = A[g    ][8t .. 8t+7]     a[1] = A[g + 8][8t .. 8t+7]
//   a[2] = A[g    ][32+8t .. +7]    a[3] = A[g + 8][32+8t .. +7]
//   b[0] = B[8t .. 8t+7][g]         b[1] = B[32+8t .. +7][g]          (B stored as [n][k])
//   d[0] = D[g][2t]  d[1] = D[g][2t+1]  d[2] = D[g+8][2t]  d[3] = D[g+8][2t+1]
//   sfa  = the 4 scales (byte j: K block j) of A row g + 8 * (l % 2)   (lanes with l % 4 < 2 are read)
//   sfb  = the 4 scales of B column g                                   (lanes with l % 4 == 0 are read)
// with the selectors {byte-id, thread-id} = {0, 0}: with scale_vec::4X a whole 32-bit register is
// one row's four scales.
__device__ __forceinline__ void mma_m16n8k64_nvf4(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], uint32_t sfa,
                                                  uint32_t sfb) {
    asm volatile(
        "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}, %10, {0, 0}, %11, {0, 0};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(sfa), "r"(sfb));
}

#endif  // SPARK_ARCH_FP4_MMA_SYNC

}  // namespace spark::cuda::ptx
