// Device-side decoding of every weight format in its device layout (device_weight.h), shared by the
// GEMV, the GEMM tile loaders and the generic fallback kernel.
//
// The fast kernels read weights in 16-byte chunks ("chunk" c of row n = bytes [16c, 16c + 16) of the
// row; E elements). A chunk is decoded in sub-chunks of SUB elements; every SPS sub-chunks share one
// scale factor (SPS = 0: unscaled format). Decoded values are exact:
//   F32 / F16 / BF16  the value
//   INT4              q - zero, exactly, by the 2^23 magic number: the nibble is moved (byte_perm) into
//                     the low mantissa byte of 2^23, then (2^23 + zero) is subtracted; factor = scale
//   NVFP4             e2m1 * 2^-14: the 3 magnitude bits go into the f16 exponent/mantissa (bits
//                     9..11) and the sign into bit 15, so E2M1's subnormal 0.5 becomes the f16
//                     subnormal 2^-15; factor = f32(e4m3 scale) * global * 2^14
//   FP8 (E4M3)        e4m3 * 2^-8: the byte shifted into an f16 (exponent bias 15 vs 7, subnormals
//                     map to f16 subnormals); factor = block scale * 2^8
// so value * factor reproduces the reference weight of src/quant/dequant.cpp (INT4: scale * (q - z)
// is exact in f32; NVFP4: f32(e4m3) * global is rounded once, as the reference does, and the powers
// of two are exact). E4M3 NaN codes (0x7F/0xFF, which no quantizer emits) decode as 480 instead of NaN.
#pragma once

#include "backends/cuda/device_weight.h"
#include "quant/formats.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace spark::cuda::mm {

__device__ __forceinline__ uint32_t word_of(const uint4 & v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ float2 half2_bits_to_float2(uint32_t bits) {
    __half2 h;
    *reinterpret_cast<uint32_t *>(&h) = bits;
    return __half22float2(h);
}

// f16 / bf16 scale bits -> f32.
__device__ __forceinline__ float scale16_to_f32(uint16_t h, ScaleType t) {
    return t == ScaleType::BF16 ? __uint_as_float(uint32_t(h) << 16) : __half2float(__ushort_as_half(h));
}

// Two E4M3 codes (byte 0 and byte 1 of `two`) -> f32, exact (NaN aside): through an f16 holding
// e4m3 * 2^-8.
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t two) {
    const uint32_t t = __byte_perm(two, 0u, 0x1404u);  // bytes [0, c0, 0, c1]: each code in the high byte of a half
    const uint32_t h = ((t >> 1) & 0x3F803F80u) | (t & 0x80008000u);
    const float2   f = half2_bits_to_float2(h);
    return make_float2(f.x * 256.0f, f.y * 256.0f);
}

// ---------------------------------------------------------------------------------------------

struct FmtF32 {
    static constexpr WeightFormat kFormat = WeightFormat::F32;
    static constexpr int E = 4, SUB = 4, NSUB = 1, SPS = 0;
    struct Sc {};
    __device__ static Sc load_scale(const DeviceWeight &, int64_t, int64_t, float) { return {}; }
    __device__ static float factor(const Sc &, int) { return 1.0f; }
    __device__ static void sub(const uint4 & raw, int, const Sc &, float (&v)[SUB]) {
        v[0] = __uint_as_float(raw.x);
        v[1] = __uint_as_float(raw.y);
        v[2] = __uint_as_float(raw.z);
        v[3] = __uint_as_float(raw.w);
    }
};

struct FmtBF16 {
    static constexpr WeightFormat kFormat = WeightFormat::BF16;
    static constexpr int E = 8, SUB = 8, NSUB = 1, SPS = 0;
    struct Sc {};
    __device__ static Sc load_scale(const DeviceWeight &, int64_t, int64_t, float) { return {}; }
    __device__ static float factor(const Sc &, int) { return 1.0f; }
    __device__ static void sub(const uint4 & raw, int, const Sc &, float (&v)[SUB]) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t w = word_of(raw, i);
            v[2 * i]         = __uint_as_float(w << 16);
            v[2 * i + 1]     = __uint_as_float(w & 0xFFFF0000u);
        }
    }
};

struct FmtF16 {
    static constexpr WeightFormat kFormat = WeightFormat::F16;
    static constexpr int E = 8, SUB = 8, NSUB = 1, SPS = 0;
    struct Sc {};
    __device__ static Sc load_scale(const DeviceWeight &, int64_t, int64_t, float) { return {}; }
    __device__ static float factor(const Sc &, int) { return 1.0f; }
    __device__ static void sub(const uint4 & raw, int, const Sc &, float (&v)[SUB]) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 f = half2_bits_to_float2(word_of(raw, i));
            v[2 * i]       = f.x;
            v[2 * i + 1]   = f.y;
        }
    }
};

// INT4: chunk = 32 consecutive K (4 words), inside one group (group_size % 32 == 0).
struct FmtInt4 {
    static constexpr WeightFormat kFormat = WeightFormat::INT4;
    static constexpr int E = 32, SUB = 8, NSUB = 4, SPS = 4;
    struct Sc {
        float scale;
        float magic_zero;  // 2^23 + zero
    };
    __device__ static Sc load_scale(const DeviceWeight & w, int64_t n, int64_t c, float) {
        const uint32_t g   = uint32_t(c * 32) / uint32_t(w.group_size);  // 32-bit: K < 2^31
        const int64_t  idx = n * w.n_groups + g;
        const uint16_t h   = __ldg(static_cast<const uint16_t *>(w.scales) + idx);
        const uint32_t z   = w.zeros ? uint32_t(__ldg(w.zeros + idx)) : 8u;
        return {scale16_to_f32(h, w.scale_type), 8388608.0f + float(z)};
    }
    __device__ static float factor(const Sc & sc, int) { return sc.scale; }
    // Word s holds elements 8s .. 8s + 7, element j in nibble j.
    __device__ static void sub(const uint4 & raw, int s, const Sc & sc, float (&v)[SUB]) {
        const uint32_t w  = word_of(raw, s);
        const uint32_t lo = w & 0x0F0F0F0Fu;         // elements 0, 2, 4, 6 (one per byte)
        const uint32_t hi = (w >> 4) & 0x0F0F0F0Fu;  // elements 1, 3, 5, 7
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            // byte i of lo/hi under 0x4B0000xx: the f32 2^23 + q.
            v[2 * i]     = __uint_as_float(__byte_perm(lo, 0x4B000000u, 0x7650u | uint32_t(i))) - sc.magic_zero;
            v[2 * i + 1] = __uint_as_float(__byte_perm(hi, 0x4B000000u, 0x7650u | uint32_t(i))) - sc.magic_zero;
        }
    }
};

// NVFP4: chunk = 32 consecutive K = two scale blocks of 16 (sub-chunks 0-1 and 2-3).
struct FmtNvfp4 {
    static constexpr WeightFormat kFormat = WeightFormat::NVFP4;
    static constexpr int E = 32, SUB = 8, NSUB = 4, SPS = 2;
    struct Sc {
        float s[2];
    };
    // `global` is the per-tensor multiplier folded into the factor (the GEMM passes 1 and applies
    // the global scale in its epilogue).
    __device__ static Sc load_scale(const DeviceWeight & w, int64_t n, int64_t c, float global) {
        const uint8_t * scales = static_cast<const uint8_t *>(w.scales) + n * (w.k / 16) + 2 * c;
        const uint32_t  two    = __ldg(reinterpret_cast<const uint16_t *>(scales));
        const float2    f      = e4m3x2_to_float2(two);
        return {{(f.x * global) * 16384.0f, (f.y * global) * 16384.0f}};
    }
    __device__ static float factor(const Sc & sc, int g) { return sc.s[g]; }
    // Word s holds elements 8s .. 8s + 7, element j in nibble j; pair (j, j + 4) shares one f16x2.
    __device__ static void sub(const uint4 & raw, int s, const Sc &, float (&v)[SUB]) {
        const uint32_t w = word_of(raw, s);
        uint32_t       h[4];
        h[0] = ((w << 9) & 0x0E000E00u) | ((w << 12) & 0x80008000u);
        h[1] = ((w << 5) & 0x0E000E00u) | ((w << 8) & 0x80008000u);
        h[2] = ((w << 1) & 0x0E000E00u) | ((w << 4) & 0x80008000u);
        h[3] = ((w >> 3) & 0x0E000E00u) | (w & 0x80008000u);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float2 f = half2_bits_to_float2(h[j]);
            v[j]           = f.x;
            v[j + 4]       = f.y;
        }
    }
};

// FP8 E4M3: chunk = 16 consecutive K inside one k-block (block_k % 16 == 0, or one k-block).
struct FmtFp8 {
    static constexpr WeightFormat kFormat = WeightFormat::FP8;
    static constexpr int E = 16, SUB = 8, NSUB = 2, SPS = 2;
    struct Sc {
        float s;
    };
    __device__ static Sc load_scale(const DeviceWeight & w, int64_t n, int64_t c, float) {
        const uint32_t k_blocks = (uint32_t(w.k) + uint32_t(w.block_k) - 1) / uint32_t(w.block_k);  // 32-bit: N, K < 2^31
        const int64_t  idx      = int64_t(uint32_t(n) / uint32_t(w.block_n)) * k_blocks + uint32_t(c * 16) / uint32_t(w.block_k);
        return {__ldg(static_cast<const float *>(w.scales) + idx) * 256.0f};
    }
    __device__ static float factor(const Sc & sc, int) { return sc.s; }
    // Sub-chunk s: bytes 8s .. 8s + 7 (words 2s, 2s + 1).
    __device__ static void sub(const uint4 & raw, int s, const Sc &, float (&v)[SUB]) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const uint32_t w = word_of(raw, 2 * s + i);
            const float2   a = half2_bits_to_float2(((__byte_perm(w, 0u, 0x1404u) >> 1) & 0x3F803F80u) |
                                                    (__byte_perm(w, 0u, 0x1404u) & 0x80008000u));
            const float2   b = half2_bits_to_float2(((__byte_perm(w, 0u, 0x3424u) >> 1) & 0x3F803F80u) |
                                                    (__byte_perm(w, 0u, 0x3424u) & 0x80008000u));
            v[4 * i]     = a.x;
            v[4 * i + 1] = a.y;
            v[4 * i + 2] = b.x;
            v[4 * i + 3] = b.y;
        }
    }
};

// ---------------------------------------------------------------------------------------------
// One weight element W[n][k] (k = stored column), straight from the definitions in qweight.h /
// device_weight.h with the bit-exact decoders of formats.h. For the generic fallback kernel.
__device__ __forceinline__ float weight_at(const DeviceWeight & w, int64_t n, int64_t k) {
    switch (w.format) {
        case WeightFormat::F32: return __ldg(static_cast<const float *>(w.data) + n * w.k + k);
        case WeightFormat::F16: return f16_to_f32(__ldg(static_cast<const uint16_t *>(w.data) + n * w.k + k));
        case WeightFormat::BF16: return bf16_to_f32(__ldg(static_cast<const uint16_t *>(w.data) + n * w.k + k));
        case WeightFormat::NVFP4: {
            const uint8_t byte  = __ldg(static_cast<const uint8_t *>(w.data) + w4_byte_index(w.tiled, n, k / 2, w.k / 2));
            const uint8_t code  = uint8_t((k & 1) ? byte >> 4 : byte & 0xF);
            const float   scale = e4m3_to_f32(__ldg(static_cast<const uint8_t *>(w.scales) + n * (w.k / 16) + k / 16)) * w.global_scale;
            return e2m1_to_f32(code) * scale;
        }
        case WeightFormat::INT4: {
            const uint32_t word = __ldg(static_cast<const uint32_t *>(w.data) + w4_word_index(w.tiled, n, k / 8, w.k / 8));
            const int64_t  idx  = n * w.n_groups + k / w.group_size;
            const float    s    = scale16_to_f32(__ldg(static_cast<const uint16_t *>(w.scales) + idx), w.scale_type);
            const float    z    = w.zeros ? float(__ldg(w.zeros + idx)) : 8.0f;
            return s * (float(int4_get(word, int(k % 8))) - z);
        }
        case WeightFormat::FP8: {
            const int64_t k_blocks = (w.k + w.block_k - 1) / w.block_k;
            const float   s        = __ldg(static_cast<const float *>(w.scales) + (n / w.block_n) * k_blocks + k / w.block_k);
            return e4m3_to_f32(__ldg(static_cast<const uint8_t *>(w.data) + n * w.k + k)) * s;
        }
    }
    return 0.0f;
}

}  // namespace spark::cuda::mm
