// Emulator stand-in for src/backends/cuda/common/ptx_sm80.cuh (found first on the include path of
// every kernel lab: -Idev/emu comes before -Isrc): the same wrappers, with the same names and
// fragment layouts, on the fiber runtime (emu_runtime.h). Warp-level instructions (ldmatrix, mma)
// meet their warp at a collective; shared-memory addresses are checked (inside the block's dynamic
// shared memory, 16-byte aligned) and so are the alignments of 16-byte global accesses.
#pragma once

#include "backends/cuda/common/arch.h"
#include "emu_runtime.h"  // dev/emu
#include "quant/formats.h"  // the bit-exact converters: cvt.rn.{f16,bf16}.f32 and the decoders

#include <cuda_bf16.h>  // (dev/emu's stand-ins: the types __nv_bfloat16, __half)
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#define SPARK_DYNAMIC_SMEM(type, name) type * name = reinterpret_cast<type *>(::emu::dyn_smem())

namespace emu {

// How the emulated mma.sync adds its 16 exact products and the accumulator (the tensor core's adder
// is not specified bit for bit):
//   Truncating (default)  a pessimistic model of it: every term is truncated towards zero to a
//                         multiple of 2^(e_max - 23) (e_max: the exponent of the largest term; the
//                         hardware keeps at least as many bits), summed exactly, and the sum truncated
//                         to f32. The decode GEMV lab (its accumulator chains are kept short for this).
//   Exact                 summed in double, rounded once to f32. The attention lab (its tolerances
//                         were set on it; emu_gemv's "exact-mma" option).
enum class MmaSum { Truncating, Exact };
inline MmaSum & mma_sum() {
    static MmaSum m = MmaSum::Truncating;
    return m;
}

}  // namespace emu

namespace spark::cuda::ptx {

// ---- bf16 / f16 bits: the CPU backend's converters (RNE, f16 subnormals kept, |x| >= 65520 -> inf;
// checked bit for bit against the hardware's cvt.rn, see quant/formats.h)
inline uint16_t bf16_bits(float x) { return spark::f32_to_bf16(x); }
inline float    bf16_float(uint16_t b) { return spark::bf16_to_f32(b); }
inline float    bf16_round(float x) { return bf16_float(bf16_bits(x)); }
inline uint32_t pack_bf16x2(float lo, float hi) { return uint32_t(bf16_bits(lo)) | (uint32_t(bf16_bits(hi)) << 16); }

inline uint16_t f16_bits(float x) { return spark::f32_to_f16(x); }
inline float    f16_float(uint16_t b) { return spark::f16_to_f32(b); }
inline float    f16_round(float x) { return f16_float(f16_bits(x)); }
inline uint32_t pack_f16x2(float lo, float hi) { return uint32_t(f16_bits(lo)) | (uint32_t(f16_bits(hi)) << 16); }
inline uint32_t pack_f16x2_satfinite(float lo, float hi) {
    auto sat = [](float x) { return std::isnan(x) ? x : std::clamp(x, -65504.0f, 65504.0f); };
    return pack_f16x2(sat(lo), sat(hi));
}
inline float  f16_lo(uint32_t v) { return f16_float(uint16_t(v & 0xFFFFu)); }
inline float  f16_hi(uint32_t v) { return f16_float(uint16_t(v >> 16)); }
inline float2 unpack_f16x2(uint32_t h) { return {f16_lo(h), f16_hi(h)}; }

// ---- f16x2 on raw bits: per half in double, rounded to f16 through f32 (exact for the exact
// operations the MMA GEMV performs: integer differences, products of <= 11-bit values by powers of
// two or by <= 4-bit values; an inexact result would round twice).
inline uint32_t f16x2_of(double lo, double hi) { return pack_f16x2(float(lo), float(hi)); }
inline uint32_t hsub2_bits(uint32_t a, uint32_t b) { return f16x2_of(double(f16_lo(a)) - f16_lo(b), double(f16_hi(a)) - f16_hi(b)); }
inline uint32_t hmul2_bits(uint32_t a, uint32_t b) { return f16x2_of(double(f16_lo(a)) * f16_lo(b), double(f16_hi(a)) * f16_hi(b)); }
inline uint32_t hfma2_bits(uint32_t a, uint32_t b, uint32_t c) {
    return f16x2_of(double(f16_lo(a)) * f16_lo(b) + f16_lo(c), double(f16_hi(a)) * f16_hi(b) + f16_hi(c));
}

// ---- bit logic (lop3)
template <uint32_t kMask> inline uint32_t and_or(uint32_t a, uint32_t b) { return (a & kMask) | b; }
template <uint32_t kMask> inline uint32_t and_or_not(uint32_t a, uint32_t b) { return (a & kMask) | (b & ~kMask); }

// ---- global loads and stores (16-byte accesses must be 16-byte aligned: the hardware faults)
inline void check_align16(const void * p, const char * what) {
    if ((reinterpret_cast<uintptr_t>(p) & 15u) != 0) emu::die(what);
}
inline uint64_t l2_evict_first_policy() { return 0; }
inline void     prefetch_l2(const void *) {}  // (a hint: nothing to model)
inline uint4    ld_stream_v4(const void * ptr, uint64_t) {
    check_align16(ptr, "unaligned 16-byte streaming load");
    uint4 v;
    std::memcpy(&v, ptr, 16);
    return v;
}
inline uint4 ld_nc_v4(const void * ptr) {
    check_align16(ptr, "unaligned 16-byte read-only load");
    uint4 v;
    std::memcpy(&v, ptr, 16);
    return v;
}
inline float ld_cg_f32(const float * p) { return *p; }
inline void  ld_cg_f32x4(const float * p, float (&v)[4]) {
    check_align16(p, "ld_cg_f32x4: unaligned");
    for (int i = 0; i < 4; ++i) v[i] = p[i];
}
// Logged (emu::S().global_stores): the attention decode tests check that every cache row of a step
// is stored exactly once.
inline void st_global_16(void * dst, const uint32_t (&w)[4]) {
    check_align16(dst, "st_global_16: unaligned");
    std::memcpy(dst, w, 16);
    emu::S().global_stores.push_back(dst);
}

// ---- cp.async: the copies of a thread land either at issue or only at the cp.async.wait_group
// that retires their group (emu::S().lazy_copies, random per launch)
inline void cp_async_16(void * dst, const void * src, bool pred) {
    emu::check_smem(dst, "cp.async destination outside shared memory");
    if (pred) check_align16(src, "cp.async source not 16-byte aligned");
    emu::Sched &    s = emu::S();
    const emu::Copy c{dst, src, pred};
    if (!s.lazy_copies) emu::apply(c);
    else s.fibers[size_t(s.cur)].open_group.push_back(c);
}
inline void cp_async_commit() {
    emu::Fiber & f = emu::S().fibers[size_t(emu::S().cur)];
    f.groups.push_back(std::move(f.open_group));
    f.open_group.clear();
}
template <int N> inline void cp_async_wait() {
    emu::Fiber & f = emu::S().fibers[size_t(emu::S().cur)];
    while (f.groups.size() > size_t(N)) {
        for (const emu::Copy & c : f.groups.front()) emu::apply(c);
        f.groups.erase(f.groups.begin());
    }
}

// ---- ldmatrix: matrix i comes from the row addresses of lanes 8i .. 8i+7
inline uint16_t elem(const void * row, int i) { return static_cast<const uint16_t *>(row)[i]; }
inline void     ldmatrix(uint32_t * r, int n_mat, bool trans, const void * row_addr) {
    emu::Warp & w = emu::warp();
    const int   l = emu::lane();
    w.addr[l]     = row_addr;
    emu::warp_sync();
    const int g = l >> 2, c = l & 3;
    for (int i = 0; i < n_mat; ++i) {
        for (int k = 0; k < 8; ++k) emu::check_smem(w.addr[8 * i + k], "ldmatrix row address outside shared memory");
        if (!trans) {
            const void * row = w.addr[8 * i + g];
            r[i]             = uint32_t(elem(row, 2 * c)) | (uint32_t(elem(row, 2 * c + 1)) << 16);
        } else {
            r[i] = uint32_t(elem(w.addr[8 * i + 2 * c], g)) | (uint32_t(elem(w.addr[8 * i + 2 * c + 1], g)) << 16);
        }
    }
    emu::warp_sync();
}
inline void ldmatrix_x2(uint32_t (&r)[2], const void * p) { ldmatrix(r, 2, false, p); }
inline void ldmatrix_x4(uint32_t (&r)[4], const void * p) { ldmatrix(r, 4, false, p); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void * p) { ldmatrix(r, 4, true, p); }

// ---- mma.sync m16n8k16, 16-bit inputs In (__half or __nv_bfloat16), f32 accumulators: the 16
// products are exact (in double; subnormal f16 inputs included, as on the tensor cores), their sum
// with the accumulator follows emu::mma_sum().
inline float mma_add(const double (&t)[17]) {
    double emax_v = 0.0;
    bool   finite = true;
    for (double v : t) {
        if (!std::isfinite(v)) finite = false;
        emax_v = std::max(emax_v, std::fabs(v));
    }
    double s = 0.0;
    if (!finite || emu::mma_sum() == emu::MmaSum::Exact || emax_v == 0.0) {
        for (double v : t) s += v;
        return float(s);
    }
    const double q = std::ldexp(1.0, std::ilogb(emax_v) - 23);
    for (double v : t) s += std::trunc(v / q) * q;  // integers below 2^25 x 17: exact
    float f = float(s);
    if (std::fabs(double(f)) > std::fabs(s)) f = std::nextafter(f, 0.0f);
    return f;
}
template <class In> inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    static_assert(std::is_same_v<In, __half> || std::is_same_v<In, __nv_bfloat16>, "f16 or bf16 inputs");
    emu::Warp & w = emu::warp();
    const int   l = emu::lane();
    for (int i = 0; i < 4; ++i) w.u[l][i] = a[i];
    w.u[l][4] = b0;
    w.u[l][5] = b1;
    emu::warp_sync();
    auto half_of = [](uint32_t reg, int h) {
        const uint16_t bits = uint16_t(h ? reg >> 16 : reg & 0xFFFFu);
        return double(std::is_same_v<In, __half> ? f16_float(bits) : bf16_float(bits));
    };
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
        res[e] = mma_add(t);
    }
    emu::warp_sync();
    for (int e = 0; e < 4; ++e) d[e] = res[e];
}

}  // namespace spark::cuda::ptx
