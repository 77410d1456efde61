// The only place in the matmul kernels with inline PTX: small typed wrappers, each with the
// instruction it emits. All of them need sm_80 (spark's minimum, arch.h kCcMin); a pass compiled
// for an older target (never built by spark's CMake) traps instead of computing garbage.
#pragma once

#include "backends/cuda/arch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

// The kernel's dynamic shared memory as an array `name` of `type` (the emulator maps it onto its
// per-block buffer).
#define SPARK_GEMV_DYNAMIC_SMEM(type, name) extern __shared__ type name[]

namespace spark::cuda::mm {

// ---- global loads

// 16 bytes of weights that are read exactly once: no L1 allocation, and an L2 evict_first policy so a
// weight stream (the lm_head, a layer's experts) does not push activations and KV out of L2.
//   createpolicy.fractional.L2::evict_first.b64 / ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
    uint64_t policy = 0;
#if SPARK_ARCH_AMPERE_PLUS
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
    return policy;
}

__device__ __forceinline__ uint4 ld_stream_v4(const void * ptr, uint64_t policy) {
    uint4 v = make_uint4(0, 0, 0, 0);
#if SPARK_ARCH_AMPERE_PLUS
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(ptr), "l"(policy));
#else
    __trap();
#endif
    return v;
}

// 16 bytes through the read-only path (ld.global.nc.v4.u32), cached normally: weight tiles of the
// GEMM, which several thread blocks read.
__device__ __forceinline__ uint4 ld_nc_v4(const void * ptr) {
    return __ldg(static_cast<const uint4 *>(ptr));
}

// ---- cp.async (sm_80): 16 bytes global -> shared, zero-filled past src_bytes (0 or 16)

__device__ __forceinline__ uint32_t smem_addr(const void * p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// cp.async.cg.shared.global [dst], [src], 16, src_bytes;
__device__ __forceinline__ void cp_async_16(void * smem_dst, const void * gmem_src, uint32_t src_bytes) {
#if SPARK_ARCH_AMPERE_PLUS
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(smem_dst)), "l"(gmem_src), "r"(src_bytes)
                 : "memory");
#else
    __trap();
#endif
}

// cp.async.commit_group;
__device__ __forceinline__ void cp_async_commit() {
#if SPARK_ARCH_AMPERE_PLUS
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// cp.async.wait_group 0;  (all committed groups of this thread have landed)
__device__ __forceinline__ void cp_async_wait_all() {
#if SPARK_ARCH_AMPERE_PLUS
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}

// ---- tensor cores

// ldmatrix.sync.aligned.m8n8.x4.shared.b16: four 8x8 b16 matrices; lane l gives the address of row
// (l % 8) of matrix (l / 8) and receives in r[i] the pair (row l / 4, cols 2 (l % 4) + {0, 1}) of
// matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void * smem_row) {
#if SPARK_ARCH_AMPERE_PLUS
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(smem_row)));
#else
    __trap();
#endif
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: d += a (16x16, row) * b (16x8, col).
// Fragments (g = lane / 4, q = lane % 4):
//   a[0] = A[g][2q..], a[1] = A[g+8][2q..], a[2] = A[g][2q+8..], a[3] = A[g+8][2q+8..]
//   b[0] = B[2q..][g],  b[1] = B[2q+8..][g]
//   d[0..1] = D[g][2q, 2q+1], d[2..3] = D[g+8][2q, 2q+1]
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if SPARK_ARCH_AMPERE_PLUS
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32: d += a (16x16, row) * b (16x8, col), the
// fragments as mma_bf16_16816. The products of two f16 are exact in f32; the tensor core adds the 16
// products and the accumulator with (at least) f32 precision, truncating (the decode GEMV keeps its
// accumulator chains short for that reason, gemv_mma.cuh).
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if SPARK_ARCH_AMPERE_PLUS
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

// ---- f16x2 arithmetic on raw register bits (round to nearest even; f16 subnormals are kept)

// sub.rn.f16x2 d, a, b
__device__ __forceinline__ uint32_t hsub2_bits(uint32_t a, uint32_t b) {
    uint32_t d = 0;
#if SPARK_ARCH_AMPERE_PLUS
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
#else
    __trap();
#endif
    return d;
}
// fma.rn.f16x2 d, a, b, c  (a * b + c, one rounding)
__device__ __forceinline__ uint32_t hfma2_bits(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d = 0;
#if SPARK_ARCH_AMPERE_PLUS
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
#else
    __trap();
#endif
    return d;
}
// mul.rn.f16x2 d, a, b
__device__ __forceinline__ uint32_t hmul2_bits(uint32_t a, uint32_t b) {
    uint32_t d = 0;
#if SPARK_ARCH_AMPERE_PLUS
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
#else
    __trap();
#endif
    return d;
}
// Two floats -> f16x2 (cvt.rn.f16x2.f32: lo in the low half; |x| >= 65520 -> inf).
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
    uint32_t d = 0;
#if SPARK_ARCH_AMPERE_PLUS
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
#else
    __trap();
#endif
    return d;
}
// f16x2 -> two floats (exact).
__device__ __forceinline__ float2 unpack_f16x2(uint32_t h) {
    __half2 v;
    *reinterpret_cast<uint32_t *>(&v) = h;
    return __half22float2(v);
}

// ---- small helpers (no PTX, but shared by every kernel)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

// Two floats -> bf16x2 (round to nearest even), lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

}  // namespace spark::cuda::mm
