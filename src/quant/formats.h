// Low-precision number formats, bit-exact, shared by host and device code (header-only, SPARK_HD).
//
// Every encoder rounds to nearest, ties to even, on the exact input value (no double rounding), and
// matches the PTX conversion named next to it bit for bit; the decoders are exact. Sources:
//   E2M1 / E4M3 tables and semantics: docs/FORMATS.md §1 (OCP MX / OFP8 specs,
//   NVIDIA/TensorRT-Model-Optimizer:modelopt/torch/quantization/qtensor/nvfp4_tensor.py);
//   saturation and NaN rules: PTX ISA `cvt` (.satfinite) and the CUDA 13 toolkit's own emulation of
//   those instructions (cuda_fp4.hpp `__nv_cvt_double_to_fp4`, cuda_fp8.hpp `__nv_cvt_float_to_fp8`).
//
// Checked once for all 2^32 f32 inputs (tests/quant pins the cases that matter): this header compiled
// for an H100 against the hardware `cvt.rn.satfinite.e4m3x2.f32` (NaN included) and
// `cvt.rn.bf16.f32` / `cvt.rn.f16.f32` (non-NaN inputs; NaN policy below differs on purpose), with and
// without --use_fast_math; f32_to_e2m1 against the toolkit's emulation of
// `cvt.rn.satfinite.e2m1x2.f32` on host and device (the instruction itself needs sm_100a / sm_120a);
// the decoders against `cvt.rn.f16x2.e4m3x2` / `.e5m2x2` and the toolkit's f16 / bf16 / e2m1 decoders.
//
// Only integer and float arithmetic is used (no <cmath>, no std::), and no f32 subnormal is ever
// produced or consumed by arithmetic on the paths that matter, so device code built with
// flush-to-zero gets the same answers.
#pragma once

#include <cstdint>

#include "quant/hd.h"

namespace spark {

// ---------------------------------------------------------------------------------------------
// Bit casts (memcpy on the host, intrinsics on the device).

SPARK_HD uint32_t f32_bits(float x) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    uint32_t u;
    __builtin_memcpy(&u, &x, sizeof u);
    return u;
#endif
}

SPARK_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float x;
    __builtin_memcpy(&x, &u, sizeof x);
    return x;
#endif
}

// ---------------------------------------------------------------------------------------------
// FP4 E2M1 (NVFP4 / MXFP4 element): s ee m, bias 1, no inf/NaN.
//   code 0..7 -> 0, 0.5, 1, 1.5, 2, 3, 4, 6;  code 8..15 -> the same, negative (8 = -0.0).

inline constexpr float kE2M1Max = 6.0f;

// Twice the magnitude of codes 0..7 (0,1,2,3,4,6,8,12), one nibble each: a table that lives in a
// register on the device instead of in local memory.
inline constexpr uint32_t kE2M1TwiceMagnitude = 0xC8643210u;

SPARK_HD float e2m1_to_f32(uint8_t code) {
    const float magnitude = float((kE2M1TwiceMagnitude >> (4u * (code & 7u))) & 0xFu) * 0.5f;
    return f32_from_bits(f32_bits(magnitude) | (uint32_t(code & 8u) << 28));
}

// f32 -> E2M1 code, bit-exact with `cvt.rn.satfinite.e2m1x2.f32` (one lane):
//   round to nearest even on |x|: ties 0.25, 1.25, 2.5, 5.0 go down and 0.75, 1.75, 3.5 go up
//   (to the code with an even mantissa); |x| > 5 saturates to 6 (inf too);
//   the sign is the sign bit, so -0.0 and tiny negatives give code 8 (-0);
//   NaN (either sign) gives +6 (code 7): E2M1 has no NaN, and satfinite maps NaN to the positive
//   maximum (CUDA 13 cuda_fp4.hpp `__nv_cvt_double_to_fp4`: "NaN converts to positive FP4_MAXNORM").
// Each comparison against a rounding threshold adds one to the code; the thresholds are compared as
// bit patterns of |x| (monotonic for non-negative floats), the tie-goes-up ones with >=.
SPARK_HD uint8_t f32_to_e2m1(float x) {
    const uint32_t bits = f32_bits(x);
    const uint32_t a = bits & 0x7FFFFFFFu;
    const uint32_t magnitude = uint32_t(a > 0x3E800000u)     // 0.25 (tie -> 0)
                               + uint32_t(a >= 0x3F400000u)  // 0.75 (tie -> 1.0)
                               + uint32_t(a > 0x3FA00000u)   // 1.25 (tie -> 1.0)
                               + uint32_t(a >= 0x3FE00000u)  // 1.75 (tie -> 2.0)
                               + uint32_t(a > 0x40200000u)   // 2.5  (tie -> 2.0)
                               + uint32_t(a >= 0x40600000u)  // 3.5  (tie -> 4.0)
                               + uint32_t(a > 0x40A00000u);  // 5.0  (tie -> 4.0)
    const bool     is_nan = a > 0x7F800000u;                 // NaN: magnitude is already 7
    const uint32_t sign   = is_nan ? 0u : (bits >> 28) & 8u;
    return uint8_t(magnitude | sign);
}

// Two E2M1 codes in one byte, element 2i (even) in the LOW nibble (ModelOpt / compressed-tensors
// NVFP4 packing).
SPARK_HD uint8_t pack_e2m1x2(uint8_t even_code, uint8_t odd_code) {
    return uint8_t((even_code & 0xFu) | ((odd_code & 0xFu) << 4));
}

// Same byte as `cvt.rn.satfinite.e2m1x2.f32 d, odd, even` (PTX puts operand a in the upper nibble).
SPARK_HD uint8_t f32x2_to_e2m1x2(float even, float odd) {
    return pack_e2m1x2(f32_to_e2m1(even), f32_to_e2m1(odd));
}

// ---------------------------------------------------------------------------------------------
// FP8 E4M3 ("e4m3fn"): s eeee mmm, bias 7, no inf, 0x7F / 0xFF NaN, max 448 (0x7E),
// subnormals m * 2^-9 (0x01 = 2^-9, 0x07 = 7 * 2^-9), 0x08 = 2^-6.

inline constexpr float kE4M3Max = 448.0f;

SPARK_HD float e4m3_to_f32(uint8_t code) {
    const uint32_t sign     = uint32_t(code & 0x80u) << 24;
    const uint32_t exponent = (code >> 3) & 0xFu;
    const uint32_t mantissa = code & 7u;
    uint32_t magnitude;
    if ((code & 0x7Fu) == 0x7Fu)
        magnitude = 0x7FC00000u;  // NaN
    else if (exponent == 0)
        magnitude = f32_bits(float(mantissa) * 0x1p-9f);  // exact, result is a normal f32
    else
        magnitude = ((exponent + (127u - 7u)) << 23) | (mantissa << 20);
    return f32_from_bits(sign | magnitude);
}

// f32 -> E4M3, bit-exact with `cvt.rn.satfinite.e4m3x2.f32` (one lane): RNE; |x| >= 448 (inf too)
// saturates to +-448; NaN of either sign -> 0x7F (the canonical NaN: CUDA 13 cuda_fp8.hpp
// `__nv_cvt_float_to_fp8` canonicalizes NaN before converting); the sign bit is kept for zero and
// underflow (-0.0 -> 0x80).
SPARK_HD uint8_t f32_to_e4m3(float x) {
    const uint32_t bits = f32_bits(x);
    const uint32_t a    = bits & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0x7Fu;
    const uint32_t sign = (bits >> 24) & 0x80u;
    uint32_t       magnitude;
    if (a >= 0x43E00000u) {
        magnitude = 0x7Eu;  // >= 448: satfinite
    } else if (a >= 0x3C800000u) {
        // Normal (>= 2^-6): round the f32 mantissa to 3 bits at bit 20; a carry moves into the
        // exponent, which is what rounding up to the next binade means. Then rebias 127 -> 7.
        const uint32_t rounded = a + 0x7FFFFu + ((a >> 20) & 1u);
        magnitude              = (rounded >> 20) - ((127u - 7u) << 3);
    } else {
        // Subnormal: q = rne(|x| * 2^9) in 0..8 (8 is 2^-6, the smallest normal code, 0x08).
        // With the implicit bit, |x| * 2^9 = M * 2^-(141 - e).
        const uint32_t e     = a >> 23;
        const uint32_t shift = 141u - e;  // >= 21 here
        if (shift >= 25u) {
            magnitude = 0;  // |x| < 2^-10: below half the smallest subnormal
        } else {
            const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
            magnitude        = (m + (1u << (shift - 1u)) - 1u + ((m >> shift) & 1u)) >> shift;
        }
    }
    return uint8_t(sign | magnitude);
}

// UE8M0 (MX block scale): 2^(e - 127), 0xFF = NaN. Code 0 is 2^-127, an f32 subnormal.
SPARK_HD float ue8m0_to_f32(uint8_t code) {
    if (code == 0xFFu) return f32_from_bits(0x7FC00000u);
    if (code == 0) return f32_from_bits(0x00400000u);
    return f32_from_bits(uint32_t(code) << 23);
}

// ---------------------------------------------------------------------------------------------
// BF16

SPARK_HD float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

// RNE (matches `cvt.rn.bf16.f32` for every non-NaN input, overflow -> inf); NaN stays NaN with its
// sign and top payload bits and is made quiet (the hardware returns the canonical 0x7FFF instead).
SPARK_HD uint16_t f32_to_bf16(float x) {
    const uint32_t bits = f32_bits(x);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((bits >> 16) | 0x0040u);
    return uint16_t((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// ---------------------------------------------------------------------------------------------
// F16 (IEEE binary16), subnormals included.

SPARK_HD float f16_to_f32(uint16_t h) {
    // Masks rather than branches, so loops over it vectorize: normal numbers rebias the exponent
    // (15 -> 127), inf/NaN move the all-ones exponent to all ones (payload kept), zero and
    // subnormals are m * 2^-24 computed exactly (the result is a normal f32).
    const uint32_t shifted   = uint32_t(h & 0x7FFFu) << 13;
    const uint32_t exponent  = h & 0x7C00u;
    const uint32_t normal    = shifted + ((127u - 15u) << 23);
    const uint32_t inf_nan   = shifted + ((255u - 31u) << 23);
    const uint32_t subnormal = f32_bits(float(h & 0x3FFu) * 0x1p-24f);
    const uint32_t is_inf_nan = 0u - uint32_t(exponent == 0x7C00u);  // all ones or zero
    const uint32_t is_small   = 0u - uint32_t(exponent == 0);
    const uint32_t magnitude  = (inf_nan & is_inf_nan) | (subnormal & is_small) | (normal & ~(is_inf_nan | is_small));
    return f32_from_bits((uint32_t(h & 0x8000u) << 16) | magnitude);
}

// RNE (matches `cvt.rn.f16.f32` for every non-NaN input): |x| >= 65520 (the midpoint between 65504
// and 2^16) -> inf; subnormals rounded once from the exact value; NaN stays a quiet NaN with its
// sign and top payload bits (the hardware returns the canonical 0x7FFF instead).
SPARK_HD uint16_t f32_to_f16(float x) {
    const uint32_t bits = f32_bits(x);
    const uint32_t sign = (bits >> 16) & 0x8000u;
    const uint32_t a    = bits & 0x7FFFFFFFu;
    uint32_t       h;
    if (a > 0x7F800000u) {
        h = 0x7E00u | ((a >> 13) & 0x3FFu);
    } else if (a >= 0x477FF000u) {
        h = 0x7C00u;
    } else if (a >= 0x38800000u) {
        // Normal (>= 2^-14): round the mantissa to 10 bits at bit 13, rebias 127 -> 15.
        const uint32_t rounded = a + 0xFFFu + ((a >> 13) & 1u);
        h                      = (rounded >> 13) - ((127u - 15u) << 10);
    } else {
        // Subnormal: q = rne(|x| * 2^24) in 0..1024 (1024 is 2^-14, the smallest normal).
        const uint32_t e     = a >> 23;
        const uint32_t shift = 126u - e;  // >= 14 here
        if (shift >= 25u) {
            h = 0;
        } else {
            const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
            h                = (m + (1u << (shift - 1u)) - 1u + ((m >> shift) & 1u)) >> shift;
        }
    }
    return uint16_t(sign | h);
}

// FP8 E5M2: s eeeee mm, bias 15, IEEE-like (inf, NaN); it is the high byte of an F16.
SPARK_HD float e5m2_to_f32(uint8_t code) { return f16_to_f32(uint16_t(uint16_t(code) << 8)); }

// ---------------------------------------------------------------------------------------------
// 4-bit integers packed eight to a 32-bit word, element j in bits [4j, 4j+4) (GPTQ qweight along K,
// GPTQ qzeros along N, compressed-tensors pack-quantized along K).

SPARK_HD uint32_t int4_get(uint32_t word, int j) { return (word >> (4 * j)) & 0xFu; }

SPARK_HD uint32_t int4_set(uint32_t word, int j, uint32_t value) {
    const uint32_t mask = 0xFu << (4 * j);
    return (word & ~mask) | ((value & 0xFu) << (4 * j));
}

}  // namespace spark
