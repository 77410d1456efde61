// CUDA built-ins and vector types the matmul kernels use beyond the emulator runtime's
// (dev/emu/emu_runtime.h). For dev/kernels/matmul/emu_gemv.cpp.
#pragma once

#include "emu_runtime.h"
#include "quant/formats.h"

#include <cmath>
#include <cstdint>
#include <cstring>

struct uint4 {
    uint32_t x, y, z, w;
};
struct float2 {
    float x, y;
};
inline uint4  make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }

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
