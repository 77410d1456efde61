// The PTX of spark's baseline GPU generation, sm_80 (Ampere; every target spark builds for has it,
// common/arch.h kCcMin): small typed wrappers, each defined once and named after the instruction it
// emits, for every kernel family (attention, matmul, ...). No kernel writes inline PTX of its own;
// later generations add their instructions in ptx_sm90.cuh and ptx_sm120.cuh.
//
// A device pass for an older target (never built by spark's CMake) traps in the wrappers instead of
// computing garbage (SPARK_PTX_SM80); there is no fallback path.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with g = lane / 4, c = lane % 4:
//   A 16x16 (row-major): a0 = A[g][2c..2c+1], a1 = A[g+8][2c..], a2 = A[g][2c+8..], a3 = A[g+8][2c+8..]
//   B 16x8  (k x n):     b0 = B[2c..2c+1][g], b1 = B[2c+8..2c+9][g]
//   C 16x8  (f32):       c0,c1 = C[g][2c..2c+1], c2,c3 = C[g+8][2c..2c+1]
// ldmatrix: lanes 8i..8i+7 give the 8 row addresses of matrix i; register i receives matrix i with
// lane holding row g, elements 2c, 2c+1 (.trans: elements [2c][g], [2c+1][g] of the stored matrix).
//
// The CPU warp emulator (dev/emu) shadows this header with dev/emu/backends/cuda/common/ptx_sm80.cuh
// (the same names, on its fibers), so kernels it runs use only these wrappers, the helpers of
// math.cuh, threadIdx/blockIdx/blockDim/gridDim, __syncthreads, __shfl_xor_sync, __threadfence,
// atomicAdd and plain arithmetic (with <cmath>'s functions).
#pragma once

#include "backends/cuda/common/arch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

// The kernel's dynamic shared memory as an array `name` of `type`, 16-byte aligned (the emulator maps
// it onto its per-block buffer).
#define SPARK_DYNAMIC_SMEM(type, name) extern __shared__ __align__(16) type name[]

// The instruction of a wrapper, in device passes that have it (sm_80+); a trap in the others. The
// host pass parses the bodies but never runs them.
#if SPARK_ARCH_AMPERE_PLUS
#define SPARK_PTX_SM80(...) __VA_ARGS__
#else
#define SPARK_PTX_SM80(...) __trap()
#endif

namespace spark::cuda::ptx {

// ---- shared-memory address for ldmatrix / cp.async
__device__ __forceinline__ uint32_t smem_addr(const void * p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- bf16 bits (round to nearest even, as torch and the CPU backend's converters)
__device__ __forceinline__ uint16_t bf16_bits(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
__device__ __forceinline__ float bf16_float(uint16_t b) { return __bfloat162float(__ushort_as_bfloat16(b)); }
__device__ __forceinline__ float bf16_round(float x) { return bf16_float(bf16_bits(x)); }
// Two floats -> bf16x2, lo in the low 16 bits (the element with the smaller index); one
// cvt.rn.bf16x2.f32.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

// ---- f16 bits (IEEE binary16, round to nearest even as cvt.rn.f16.f32 and the CPU's f32_to_f16 of
// quant/formats.h: subnormals kept, |x| >= 65520 -> inf; callers that must not overflow saturate or
// scale first)
__device__ __forceinline__ uint16_t f16_bits(float x) { return __half_as_ushort(__float2half_rn(x)); }
__device__ __forceinline__ float    f16_float(uint16_t b) { return __half2float(__ushort_as_half(b)); }
__device__ __forceinline__ float    f16_round(float x) { return f16_float(f16_bits(x)); }
// Two floats -> f16x2, lo in the low 16 bits (the element with the smaller index); one
// cvt.rn.f16x2.f32.
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}
// The same, saturating: a finite or infinite value beyond +-65504 becomes +-65504, NaN stays NaN
// (cvt.rn.satfinite.f16x2.f32, one F2FP).
__device__ __forceinline__ uint32_t pack_f16x2_satfinite(float lo, float hi) {
    uint32_t r = 0;
    SPARK_PTX_SM80(asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)));
    return r;
}
// f16x2 -> two floats (exact).
__device__ __forceinline__ float2 unpack_f16x2(uint32_t h) {
    __half2 v;
    *reinterpret_cast<uint32_t *>(&v) = h;
    return __half22float2(v);
}

// ---- f16x2 arithmetic on raw register bits (round to nearest even; f16 subnormals are kept)

// sub.rn.f16x2 d, a, b
__device__ __forceinline__ uint32_t hsub2_bits(uint32_t a, uint32_t b) {
    uint32_t d = 0;
    SPARK_PTX_SM80(asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)));
    return d;
}
// fma.rn.f16x2 d, a, b, c  (a * b + c, one rounding)
__device__ __forceinline__ uint32_t hfma2_bits(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d = 0;
    SPARK_PTX_SM80(asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)));
    return d;
}
// mul.rn.f16x2 d, a, b
__device__ __forceinline__ uint32_t hmul2_bits(uint32_t a, uint32_t b) {
    uint32_t d = 0;
    SPARK_PTX_SM80(asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)));
    return d;
}

// ---- bit logic: one LOP3 where the compiler would otherwise split a mask and an OR of two
// immediates into two instructions

// (a & kMask) | b, b in a register: lop3.b32 d, a, kMask, b, 0xEA  (0xEA: (a & b) | c)
template <uint32_t kMask> __device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b) {
    uint32_t d = 0;
    SPARK_PTX_SM80(asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "n"(kMask), "r"(b)));
    return d;
}
// (a & kMask) | (b & ~kMask): lop3.b32 d, a, kMask, b, 0xE2  (0xE2: (a & b) | (c & ~b))
template <uint32_t kMask> __device__ __forceinline__ uint32_t and_or_not(uint32_t a, uint32_t b) {
    uint32_t d = 0;
    SPARK_PTX_SM80(asm("lop3.b32 %0, %1, %2, %3, 0xE2;" : "=r"(d) : "r"(a), "n"(kMask), "r"(b)));
    return d;
}

// ---- global loads and stores

// An L2 evict_first policy for loads of data read exactly once (a weight stream: the lm_head, a
// layer's experts), so it does not push activations and KV out of L2:
//   createpolicy.fractional.L2::evict_first.b64 policy, 1.0;
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
    uint64_t policy = 0;
    SPARK_PTX_SM80(asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy)));
    return policy;
}

// Asks L2 for the line holding ptr (no register, no wait): data a kernel reads after its PDL wait
// but may request before it (a norm's weight):
//   prefetch.global.L2 [ptr]
__device__ __forceinline__ void prefetch_l2(const void * ptr) { SPARK_PTX_SM80(asm volatile("prefetch.global.L2 [%0];" ::"l"(ptr))); }

// 16 bytes read exactly once, under `policy`, with no L1 allocation; ptr 16-byte aligned:
//   ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32
__device__ __forceinline__ uint4 ld_stream_v4(const void * ptr, uint64_t policy) {
    uint4 v = make_uint4(0, 0, 0, 0);
    SPARK_PTX_SM80(asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                                : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                                : "l"(ptr), "l"(policy)));
    return v;
}

// 16 bytes through the read-only path (ld.global.nc.v4.u32), cached normally: data several thread
// blocks read (the GEMM's weight tiles).
__device__ __forceinline__ uint4 ld_nc_v4(const void * ptr) {
    return __ldg(static_cast<const uint4 *>(ptr));
}

// Global memory written by other blocks of the same grid (the attention decode's split partials):
// ld.global.cg (L2, never a stale L1 line).
__device__ __forceinline__ float ld_cg_f32(const float * p) { return __ldcg(p); }
__device__ __forceinline__ void  ld_cg_f32x4(const float * p, float (&v)[4]) {  // p 16-byte aligned
    const float4 x = __ldcg(reinterpret_cast<const float4 *>(p));
    v[0]           = x.x;
    v[1]           = x.y;
    v[2]           = x.z;
    v[3]           = x.w;
}

// 16 bytes (four 32-bit words, w[0] at the lowest address) to global memory; dst 16-byte aligned.
// (A wrapper so that the emulator can log who stores what.)
__device__ __forceinline__ void st_global_16(void * dst, const uint32_t (&w)[4]) {
    *reinterpret_cast<uint4 *>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
}

// ---- cp.async: 16 bytes global -> shared, bypassing L1 (cp.async.cg.shared.global [dst], [src],
// 16, src_bytes). When !pred, src_bytes = 0: the 16 bytes are zero-filled and nothing is read (src
// must still be a valid address expression).
__device__ __forceinline__ void cp_async_16(void * smem_dst, const void * gmem_src, bool pred) {
    SPARK_PTX_SM80(asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem_dst)),
                                "l"(gmem_src), "r"(pred ? 16 : 0)
                                : "memory"));
}
// cp.async.commit_group: the copies issued since the last commit form one group.
__device__ __forceinline__ void cp_async_commit() {
    SPARK_PTX_SM80(asm volatile("cp.async.commit_group;\n" ::: "memory"));
}
// cp.async.wait_group N: waits until at most N of this thread's committed groups are still in
// flight (N = 0: all have landed).
template <int N> __device__ __forceinline__ void cp_async_wait() {
    SPARK_PTX_SM80(asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"));
}

// ---- ldmatrix.sync.aligned.m8n8.{x2,x4}[.trans].shared.b16: 8x8 matrices of 16-bit elements
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void * smem_row) {
    SPARK_PTX_SM80(asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                                : "=r"(r[0]), "=r"(r[1])
                                : "r"(smem_addr(smem_row))));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void * smem_row) {
    SPARK_PTX_SM80(asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                                : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                                : "r"(smem_addr(smem_row))));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void * smem_row) {
    SPARK_PTX_SM80(asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                                : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                                : "r"(smem_addr(smem_row))));
}

// ---- d += a * b, mma.sync.aligned.m16n8k16.row.col.f32.<In>.<In>.f32: A 16x16 (row), B 16x8 (col),
// 16-bit inputs In (__half: f16, __nv_bfloat16: bf16; the fragment layouts above) packed two per
// register, f32 accumulators: mma_m16n8k16<__half>(d, a, b0, b1).
// The products of two f16 (or bf16) are exact in f32; the tensor core adds the 16 products and the
// accumulator with (at least) f32 precision, truncating (the MMA decode GEMV keeps its accumulator
// chains short for that reason, matmul/gemv_mma_kernels.cuh).
template <class In>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    static_assert(std::is_same_v<In, __half> || std::is_same_v<In, __nv_bfloat16>, "f16 or bf16 inputs");
#define SPARK_MMA_M16N8K16(in)                                                                                     \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." in "." in ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "   \
                 "{%8, %9}, {%0, %1, %2, %3};\n"                                                                   \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
    if constexpr (std::is_same_v<In, __half>) SPARK_PTX_SM80(SPARK_MMA_M16N8K16("f16"));
    else SPARK_PTX_SM80(SPARK_MMA_M16N8K16("bf16"));
#undef SPARK_MMA_M16N8K16
}

}  // namespace spark::cuda::ptx
