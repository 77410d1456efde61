// Spec-level references for test-quant, written from the format definitions
// (docs/FORMATS.md §1-4) independently of src/quant: decoders by the textbook formula
// in double, encoders as "nearest representable value, ties to the even code" by search over the
// value list, and per-element dequantization straight from the QWeight field comments.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "quant/qweight.h"

namespace spark::test {

inline uint32_t bits_of(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}
inline float float_of(uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}
inline bool same_bits(float a, float b) { return bits_of(a) == bits_of(b); }

// Decoders: (-1)^s * 2^(e - bias) * (1 + m / 2^M), subnormal (-1)^s * 2^(1 - bias) * (m / 2^M).
inline double decode_minifloat(uint32_t code, int exp_bits, int man_bits, int bias) {
    const uint32_t sign = code >> (exp_bits + man_bits) & 1u;
    const uint32_t e    = code >> man_bits & ((1u << exp_bits) - 1u);
    const uint32_t m    = code & ((1u << man_bits) - 1u);
    const double   frac = double(m) / double(1u << man_bits);
    const double   mag  = e == 0 ? std::ldexp(frac, 1 - bias) : std::ldexp(1.0 + frac, int(e) - bias);
    return sign ? -mag : mag;
}
// E2M1: bias 1, no inf/NaN.
inline double ref_e2m1(uint32_t code) { return decode_minifloat(code & 0xF, 2, 1, 1); }
// E4M3 (e4m3fn): bias 7, 0x7F / 0xFF NaN, no inf.
inline double ref_e4m3(uint32_t code) {
    if ((code & 0x7F) == 0x7F) return std::numeric_limits<double>::quiet_NaN();
    return decode_minifloat(code & 0xFF, 4, 3, 7);
}
// E5M2 and F16: IEEE-like, the all-ones exponent is inf (m == 0) or NaN.
inline double ref_ieee(uint32_t code, int exp_bits, int man_bits, int bias) {
    const uint32_t e = code >> man_bits & ((1u << exp_bits) - 1u);
    const uint32_t m = code & ((1u << man_bits) - 1u);
    if (e == (1u << exp_bits) - 1u) {
        if (m) return std::numeric_limits<double>::quiet_NaN();
        return (code >> (exp_bits + man_bits) & 1u) ? -INFINITY : INFINITY;
    }
    return decode_minifloat(code, exp_bits, man_bits, bias);
}
inline double ref_e5m2(uint32_t code) { return ref_ieee(code & 0xFF, 5, 2, 15); }
inline double ref_f16(uint32_t code) { return ref_ieee(code & 0xFFFF, 5, 10, 15); }

// Non-negative values of codes 0..count-1 of a format (increasing with the code).
inline std::vector<double> magnitudes(double (*decode)(uint32_t), uint32_t count) {
    std::vector<double> v(count);
    for (uint32_t c = 0; c < count; ++c) v[c] = decode(c);
    return v;
}

// Code of the value nearest to a >= 0 among `values` (sorted), ties to the even code; a beyond the
// last value gives the last code (saturation).
inline uint32_t nearest_code(double a, const std::vector<double> & values) {
    const auto     it = std::lower_bound(values.begin(), values.end(), a);
    if (it == values.end()) return uint32_t(values.size() - 1);
    const uint32_t hi = uint32_t(it - values.begin());
    if (*it == a || hi == 0) return hi;
    const uint32_t lo = hi - 1;
    const double   dl = a - values[lo], dh = values[hi] - a;
    if (dl < dh) return lo;
    if (dh < dl) return hi;
    return (lo % 2 == 0) ? lo : hi;
}

// Reference encoders built on nearest_code, sign from the sign bit.
inline uint32_t ref_encode_e2m1(float x) {
    static const std::vector<double> v = magnitudes(ref_e2m1, 8);
    return nearest_code(std::fabs(double(x)), v) | (std::signbit(x) ? 8u : 0u);
}
inline uint32_t ref_encode_e4m3(float x) {  // satfinite: nearest finite, so >= 448 -> 448
    static const std::vector<double> v = magnitudes(ref_e4m3, 0x7F);
    return nearest_code(std::fabs(double(x)), v) | (std::signbit(x) ? 0x80u : 0u);
}

inline std::vector<double> f16_finite_magnitudes() { return magnitudes(ref_f16, 0x7C00); }

// ---------------------------------------------------------------------------------------------
// Per-element dequantization of a canonical QWeight, straight from the qweight.h comments, with
// float32 arithmetic in the reference order.

inline float ref_scale16(uint16_t h, ScaleType t) {
    return t == ScaleType::BF16 ? float_of(uint32_t(h) << 16) : float(ref_f16(h));
}

inline float ref_dequant(const QWeight & w, int64_t n, int64_t k) {
    switch (w.format) {
        case WeightFormat::F32: return static_cast<const float *>(w.data)[n * w.k + k];
        case WeightFormat::F16: return float(ref_f16(static_cast<const uint16_t *>(w.data)[n * w.k + k]));
        case WeightFormat::BF16:
            return float_of(uint32_t(static_cast<const uint16_t *>(w.data)[n * w.k + k]) << 16);
        case WeightFormat::NVFP4: {
            const uint8_t byte = static_cast<const uint8_t *>(w.data)[n * (w.k / 2) + k / 2];
            const uint8_t code = (k % 2 == 0) ? (byte & 0xF) : (byte >> 4);
            const uint8_t sc   = static_cast<const uint8_t *>(w.scales)[n * (w.k / 16) + k / 16];
            return float(ref_e2m1(code)) * (float(ref_e4m3(sc)) * w.global_scale);
        }
        case WeightFormat::INT4: {
            const uint32_t word = static_cast<const uint32_t *>(w.data)[(k / 8) * w.n + n];
            const int32_t  q    = int32_t(word >> (4 * (k % 8)) & 0xF);
            const int64_t  g    = w.g_idx ? w.g_idx[k] : k / w.group_size;
            const float    s = ref_scale16(static_cast<const uint16_t *>(w.scales)[g * w.n + n], w.scale_type);
            int32_t        z = 8;
            if (w.zeros) {
                const uint32_t zw = static_cast<const uint32_t *>(w.zeros)[g * (w.n / 8) + n / 8];
                z                 = int32_t(zw >> (4 * (n % 8)) & 0xF) + w.zero_offset;
            }
            return s * float(q - z);
        }
        case WeightFormat::FP8: {
            const uint8_t code     = static_cast<const uint8_t *>(w.data)[n * w.k + k];
            const int64_t k_blocks = (w.k + w.block_k - 1) / w.block_k;
            const float   s        = static_cast<const float *>(w.scales)[(n / w.block_n) * k_blocks + k / w.block_k];
            return float(ref_e4m3(code)) * s;
        }
    }
    return NAN;
}

inline std::vector<float> ref_dequant_all(const QWeight & w) {
    std::vector<float> out(size_t(w.n * w.k));
    for (int64_t n = 0; n < w.n; ++n)
        for (int64_t k = 0; k < w.k; ++k) out[size_t(n * w.k + k)] = ref_dequant(w, n, k);
    return out;
}

// Deterministic test data.
struct Rng {
    std::mt19937 gen;
    explicit Rng(uint32_t seed) : gen(seed) {}
    uint32_t bits() { return gen(); }
    int      uniform_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); }
    float    uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen); }
    float    normal(float sigma) { return std::normal_distribution<float>(0.0f, sigma)(gen); }
};

template <typename T> std::vector<uint8_t> as_bytes(const std::vector<T> & v) {
    std::vector<uint8_t> b(v.size() * sizeof(T));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

}  // namespace spark::test
