// Emulator stand-in for src/backends/cuda/attention/ptx.cuh (found first on the include path of
// the emulator build): the same wrappers, implemented on the fiber runtime.
#pragma once

#include "emu_runtime.h"  // dev/emu
#include "quant/formats.h"  // f32_to_f16 / f16_to_f32: bit-exact cvt.rn.f16.f32 and the f16 decoder

#define SPARK_DYNAMIC_SMEM(name) unsigned char * name = ::emu::dyn_smem()

namespace spark::cuda::ptx {

inline uint16_t bf16_bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                           // round to nearest even
    return uint16_t(u >> 16);
}
inline float bf16_float(uint16_t b) {
    const uint32_t u = uint32_t(b) << 16;
    float          f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float    bf16_round(float x) { return bf16_float(bf16_bits(x)); }
inline uint32_t pack_bf16x2(float lo, float hi) { return uint32_t(bf16_bits(lo)) | (uint32_t(bf16_bits(hi)) << 16); }

// f16: the CPU backend's converters (RNE, subnormals, |x| >= 65520 -> inf; checked bit for bit
// against the hardware's cvt.rn.f16.f32, see quant/formats.h).
inline uint16_t f16_bits(float x) { return spark::f32_to_f16(x); }
inline float    f16_float(uint16_t b) { return spark::f16_to_f32(b); }
inline float    f16_round(float x) { return f16_float(f16_bits(x)); }
inline uint32_t pack_f16x2(float lo, float hi) { return uint32_t(f16_bits(lo)) | (uint32_t(f16_bits(hi)) << 16); }

inline uint16_t elem(const void * row, int i) { return static_cast<const uint16_t *>(row)[i]; }

// Matrix i of an ldmatrix comes from the row addresses of lanes 8i .. 8i+7.
inline void ldsm(uint32_t * r, int n_mat, bool trans, const void * row_addr) {
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
inline void ldsm_x2(uint32_t (&r)[2], const void * p) { ldsm(r, 2, false, p); }
inline void ldsm_x4(uint32_t (&r)[4], const void * p) { ldsm(r, 4, false, p); }
inline void ldsm_x4_trans(uint32_t (&r)[4], const void * p) { ldsm(r, 4, true, p); }

// m16n8k16 with 16-bit inputs decoded by `dec` (bf16 or f16; subnormal f16 inputs are exact, as on
// the tensor cores), products summed in double, f32 accumulators.
template <float (*dec)(uint16_t)>
inline void mma_16bit(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    emu::Warp & w = emu::warp();
    const int   l = emu::lane();
    for (int i = 0; i < 4; ++i) w.u[l][i] = a[i];
    w.u[l][4] = b0;
    w.u[l][5] = b1;
    emu::warp_sync();
    auto half_of = [](uint32_t reg, int h) { return dec(uint16_t(h ? reg >> 16 : reg & 0xffffu)); };
    auto A = [&](int row, int k) { return half_of(w.u[(row % 8) * 4 + (k % 8) / 2][row / 8 + 2 * (k / 8)], k % 2); };
    auto B = [&](int k, int n) { return half_of(w.u[n * 4 + (k % 8) / 2][4 + k / 8], k % 2); };
    const int g = l >> 2, c = l & 3;
    float     res[4];
    for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e >> 1), col = 2 * c + (e & 1);
        double    acc = 0.0;
        for (int k = 0; k < 16; ++k) acc += double(A(row, k)) * double(B(k, col));
        res[e] = float(double(d[e]) + acc);
    }
    emu::warp_sync();
    for (int e = 0; e < 4; ++e) d[e] = res[e];
}
inline void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { mma_16bit<bf16_float>(d, a, b0, b1); }
inline void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { mma_16bit<f16_float>(d, a, b0, b1); }

inline void cp_async_16(void * dst, const void * src, bool pred) {
    emu::check_smem(dst, "cp.async destination outside shared memory");
    if (pred && (reinterpret_cast<uintptr_t>(src) & 15u) != 0) emu::die("cp.async source not 16-byte aligned");
    emu::Sched & s = emu::S();
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

inline float ld_cg_f32(const float * p) { return *p; }
inline void  ld_cg_f32x4(const float * p, float (&v)[4]) {
    if ((reinterpret_cast<uintptr_t>(p) & 15u) != 0) emu::die("ld_cg_f32x4: unaligned");
    for (int i = 0; i < 4; ++i) v[i] = p[i];
}

// Logged (emu::S().global_stores): the decode tests check that every cache row of this step is
// stored exactly once.
inline void st_global_16(void * dst, const uint32_t (&w)[4]) {
    if ((reinterpret_cast<uintptr_t>(dst) & 15u) != 0) emu::die("st_global_16: unaligned");
    std::memcpy(dst, w, 16);
    emu::S().global_stores.push_back(dst);
}

}  // namespace spark::cuda::ptx
