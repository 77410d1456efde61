// Small typed wrappers around the warp-level PTX the attention kernels use (sm_80+: f16 / bf16
// mma.sync, ldmatrix, cp.async) and the f16 / bf16 bit helpers. Nothing else in the attention / ssm
// kernels uses inline PTX. Every target spark builds for is >= sm_80 (arch.h), so there is no
// fallback path; a pass for an older architecture traps.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with g = lane / 4, c = lane % 4:
//   A 16x16 (row-major): a0 = A[g][2c..2c+1], a1 = A[g+8][2c..], a2 = A[g][2c+8..], a3 = A[g+8][2c+8..]
//   B 16x8  (k x n):     b0 = B[2c..2c+1][g], b1 = B[2c+8..2c+9][g]
//   C 16x8  (f32):       c0,c1 = C[g][2c..2c+1], c2,c3 = C[g+8][2c..2c+1]
// ldmatrix.x4: lanes 8i..8i+7 give the 8 row addresses of matrix i; register i receives matrix i with
// lane holding row g, elements 2c, 2c+1 (.trans: elements [2c][g], [2c+1][g] of the stored matrix).
//
// The kernels written on these wrappers are also run by the CPU warp emulator in
// dev/kernels/attention/emu (which shadows this header), so kernel bodies use only these wrappers,
// threadIdx/blockIdx/blockDim/gridDim, __syncthreads, __shfl_xor_sync, __threadfence, atomicAdd
// (unsigned) and plain arithmetic (with <cmath>'s fabsf, copysignf, exp2f, frexpf, ldexpf).
#pragma once

#include "backends/cuda/arch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

// Dynamic shared memory of a kernel, 16-byte aligned.
#define SPARK_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]

namespace spark::cuda::ptx {

// ---- bf16 bits (round to nearest even, as torch and the CPU backend's converters)
__device__ __forceinline__ uint16_t bf16_bits(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
__device__ __forceinline__ float bf16_float(uint16_t b) { return __bfloat162float(__ushort_as_bfloat16(b)); }
__device__ __forceinline__ float bf16_round(float x) { return bf16_float(bf16_bits(x)); }
// lo goes to the low 16 bits (the element with the smaller index).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    return uint32_t(bf16_bits(lo)) | (uint32_t(bf16_bits(hi)) << 16);
}

// ---- f16 bits (IEEE binary16, round to nearest even as cvt.rn.f16.f32 and the CPU's f32_to_f16 of
// quant/formats.h: subnormals kept, |x| >= 65520 -> inf; callers that must not overflow saturate or
// scale first)
__device__ __forceinline__ uint16_t f16_bits(float x) { return __half_as_ushort(__float2half_rn(x)); }
__device__ __forceinline__ float    f16_float(uint16_t b) { return __half2float(__ushort_as_half(b)); }
__device__ __forceinline__ float    f16_round(float x) { return f16_float(f16_bits(x)); }
// lo goes to the low 16 bits (the element with the smaller index); one cvt.rn.f16x2.f32.
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

// ---- shared-memory address for ldmatrix / cp.async
__device__ __forceinline__ uint32_t smem_addr(const void * p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- ldmatrix (16-bit elements, 8x8 matrices)
__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], const void * smem_row) {
#if SPARK_ARCH_AMPERE_PLUS
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(smem_row)));
#else
    __trap();
#endif
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void * smem_row) {
#if SPARK_ARCH_AMPERE_PLUS
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(smem_row)));
#else
    __trap();
#endif
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void * smem_row) {
#if SPARK_ARCH_AMPERE_PLUS
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(smem_row)));
#else
    __trap();
#endif
}

// ---- d += a * b, m16n8k16, bf16 inputs, f32 accumulators
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if SPARK_ARCH_AMPERE_PLUS
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

// ---- d += a * b, m16n8k16, f16 inputs, f32 accumulators (same fragment layouts as bf16)
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if SPARK_ARCH_AMPERE_PLUS
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

// ---- cp.async: 16 bytes global -> shared, bypassing L1; when !pred the 16 bytes are zero-filled
// and nothing is read (src must still be a valid address expression).
__device__ __forceinline__ void cp_async_16(void * smem_dst, const void * gmem_src, bool pred) {
#if SPARK_ARCH_AMPERE_PLUS
    const int src_bytes = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem_dst)), "l"(gmem_src),
                 "r"(src_bytes)
                 : "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if SPARK_ARCH_AMPERE_PLUS
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
#if SPARK_ARCH_AMPERE_PLUS
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// ---- global memory written by other blocks of the same grid (the decode kernel's split partials):
// ld.global.cg (L2, never a stale L1 line).
__device__ __forceinline__ float ld_cg_f32(const float * p) { return __ldcg(p); }
__device__ __forceinline__ void  ld_cg_f32x4(const float * p, float (&v)[4]) {  // p 16-byte aligned
    const float4 x = __ldcg(reinterpret_cast<const float4 *>(p));
    v[0]           = x.x;
    v[1]           = x.y;
    v[2]           = x.z;
    v[3]           = x.w;
}

// ---- 16 bytes (four 32-bit words, w[0] at the lowest address) to global memory; dst 16-byte aligned.
__device__ __forceinline__ void st_global_16(void * dst, const uint32_t (&w)[4]) {
    *reinterpret_cast<uint4 *>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
}

}  // namespace spark::cuda::ptx
