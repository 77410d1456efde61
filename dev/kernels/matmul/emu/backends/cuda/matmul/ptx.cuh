// Emulator stand-in for src/backends/cuda/matmul/ptx.cuh (found first on the include path of the
// emulator build, dev/kernels/matmul/emu_gemv.cpp): the wrappers the GEMV uses, on plain memory.
#pragma once

#include "../../../emu_matmul.h"
#include "backends/cuda/arch.h"

#include <algorithm>
#include <cmath>

#define SPARK_GEMV_DYNAMIC_SMEM(type, name) type * name = reinterpret_cast<type *>(::emu::dyn_smem())

namespace spark::cuda::mm {

__device__ __forceinline__ uint64_t l2_evict_first_policy() { return 0; }

// 16 bytes of weights: must be 16-byte aligned (the real ld.global.v4 faults otherwise).
__device__ __forceinline__ uint4 ld_stream_v4(const void * ptr, uint64_t) {
    if ((reinterpret_cast<uintptr_t>(ptr) & 15u) != 0) emu::die("unaligned 16-byte weight load");
    uint4 v;
    std::memcpy(&v, ptr, 16);
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + std::exp(-g)); }

// ---- f16x2 on raw bits: per half in double, rounded to f16 through f32 (exact for the exact
// operations the MMA GEMV performs: integer differences, products of <= 11-bit values by powers of
// two or by <= 4-bit values; an inexact result would round twice).
inline float    f16_lo(uint32_t v) { return spark::f16_to_f32(uint16_t(v & 0xFFFFu)); }
inline float    f16_hi(uint32_t v) { return spark::f16_to_f32(uint16_t(v >> 16)); }
inline uint32_t f16_pack(double lo, double hi) { return uint32_t(spark::f32_to_f16(float(lo))) | (uint32_t(spark::f32_to_f16(float(hi))) << 16); }
inline uint32_t hsub2_bits(uint32_t a, uint32_t b) { return f16_pack(double(f16_lo(a)) - f16_lo(b), double(f16_hi(a)) - f16_hi(b)); }
inline uint32_t hmul2_bits(uint32_t a, uint32_t b) { return f16_pack(double(f16_lo(a)) * f16_lo(b), double(f16_hi(a)) * f16_hi(b)); }
inline uint32_t hfma2_bits(uint32_t a, uint32_t b, uint32_t c) {
    return f16_pack(double(f16_lo(a)) * f16_lo(b) + f16_lo(c), double(f16_hi(a)) * f16_hi(b) + f16_hi(c));
}
inline uint32_t pack_f16x2(float lo, float hi) { return uint32_t(spark::f32_to_f16(lo)) | (uint32_t(spark::f32_to_f16(hi)) << 16); }
inline float2   unpack_f16x2(uint32_t h) { return {f16_lo(h), f16_hi(h)}; }

// ---- mma.sync m16n8k16 f16 x f16 -> f32 (fragments as ptx.cuh). The products are exact; their sum
// with the accumulator follows a pessimistic model of the tensor core's adder (mma_truncate, default
// on): every term is truncated towards zero to a multiple of 2^(e_max - 23) (e_max: the exponent of
// the largest term; the hardware keeps at least as many bits), summed exactly, and the sum truncated
// to f32. Off: summed in double, rounded once.
inline bool & mma_truncate() {
    static bool on = true;
    return on;
}
inline float mma_sum(const double (&t)[17]) {
    double emax_v = 0.0;
    bool   finite = true;
    for (double v : t) {
        if (!std::isfinite(v)) finite = false;
        emax_v = std::max(emax_v, std::fabs(v));
    }
    double s = 0.0;
    if (!finite || !mma_truncate() || emax_v == 0.0) {
        for (double v : t) s += v;
        return float(s);
    }
    const double q = std::ldexp(1.0, std::ilogb(emax_v) - 23);
    for (double v : t) s += std::trunc(v / q) * q;  // integers below 2^25 x 17: exact
    float f = float(s);
    if (std::fabs(double(f)) > std::fabs(s)) f = std::nextafter(f, 0.0f);
    return f;
}
inline void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    emu::Warp & w = emu::warp();
    const int   l = emu::lane();
    for (int i = 0; i < 4; ++i) w.u[l][i] = a[i];
    w.u[l][4] = b0;
    w.u[l][5] = b1;
    emu::warp_sync();
    auto half_of = [](uint32_t reg, int h) { return double(h ? f16_hi(reg) : f16_lo(reg)); };
    // A[row][k]: lane (row % 8) * 4 + (k % 8) / 2, register row / 8 + 2 (k / 8); B[k][n]: lane n * 4 + (k % 8) / 2, register 4 + k / 8.
    auto A = [&](int row, int k) { return half_of(w.u[(row % 8) * 4 + (k % 8) / 2][row / 8 + 2 * (k / 8)], k % 2); };
    auto B = [&](int k, int n) { return half_of(w.u[n * 4 + (k % 8) / 2][4 + k / 8], k % 2); };
    const int g = l >> 2, c = l & 3;
    float     res[4];
    for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e >> 1), col = 2 * c + (e & 1);
        double    t[17];
        for (int k = 0; k < 16; ++k) t[k] = A(row, k) * B(k, col);
        t[16]  = d[e];
        res[e] = mma_sum(t);
    }
    emu::warp_sync();
    for (int e = 0; e < 4; ++e) d[e] = res[e];
}

}  // namespace spark::cuda::mm
