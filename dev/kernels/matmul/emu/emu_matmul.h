// CUDA built-ins and vector types the matmul kernels use, on top of the attention lab's fiber
// emulator (dev/kernels/attention/emu/emu_runtime.h: threads as fibers, warps meet at shuffles,
// blocks at __syncthreads, blocks run one after another). For dev/kernels/matmul/emu_gemv.cpp.
#pragma once

#include "../../attention/emu/emu_runtime.h"
#include "quant/formats.h"

#include <cmath>
#include <cstdint>
#include <cstring>

struct uint4 {
    uint32_t x, y, z, w;
};
struct float4 {
    float x, y, z, w;
};
struct float2 {
    float x, y;
};
inline uint4  make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }

inline int64_t  min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t  max(int64_t a, int64_t b) { return a > b ? a : b; }
inline uint32_t min(uint32_t a, uint32_t b) { return a < b ? a : b; }
inline uint32_t max(uint32_t a, uint32_t b) { return a > b ? a : b; }

inline float    __uint_as_float(uint32_t u) { return spark::f32_from_bits(u); }
inline float    __int_as_float(int u) { return spark::f32_from_bits(uint32_t(u)); }
inline uint32_t __float_as_uint(float f) { return spark::f32_bits(f); }
inline int      __ffs(int v) { return v == 0 ? 0 : __builtin_ctz(uint32_t(v)) + 1; }
inline int      __clz(int v) { return v == 0 ? 32 : __builtin_clz(uint32_t(v)); }
inline uint32_t __umulhi(uint32_t a, uint32_t b) { return uint32_t((uint64_t(a) * b) >> 32); }
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
    const uint64_t v = uint64_t(x) | (uint64_t(y) << 32);
    uint32_t       r = 0;
    for (int i = 0; i < 4; ++i) {
        const uint32_t sel = (s >> (4 * i)) & 7u;
        r |= uint32_t((v >> (8 * sel)) & 0xFFu) << (8 * i);
    }
    return r;
}

template <class T>
inline T __ldg(const T * p) {
    if ((reinterpret_cast<uintptr_t>(p) % alignof(T)) != 0) emu::die("misaligned __ldg");
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}
inline float4 __ldg(const float4 * p) {
    if ((reinterpret_cast<uintptr_t>(p) & 15u) != 0) emu::die("misaligned float4 load");
    float4 v;
    std::memcpy(&v, p, 16);
    return v;
}
template <class T>
inline T __ldcg(const T * p) {
    return *p;
}
// Templates, so that the non-template versions of newer emu_runtime.h (if present) take precedence
// instead of clashing.
template <int = 0>
inline void __threadfence() {}
template <class T>
inline T atomicAdd(T * p, T v) {
    const T old = *p;
    *p          = old + v;
    return old;
}
