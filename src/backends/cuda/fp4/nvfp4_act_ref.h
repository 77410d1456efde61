// NVFP4 quantization of activations (the W4A4 path's "A" operand): the definition, bit for bit.
//
// Header-only and SPARK_HD: the same functions are the CPU reference (tests) and the software
// device path (src/backends/cuda/fp4/w4a4.cu on GPUs without the FP4 convert); the hardware path
// (sm_120a / sm_121a) shares everything here except the final f32 -> E2M1 rounding, which it does
// with `cvt.rn.satfinite.e2m1x2.f32` and which f32_to_e2m1 (src/quant/formats.h) matches.
//
// For each row and each block of 16 consecutive elements x[0..15], with global scale g (a
// multiplier, like ModelOpt's `input_scale`: x ~ e2m1(code) * e4m3(scale) * g):
//   amax    = max |x[i]| over the block, NaN ignored (0 for a block of zeros / NaNs)
//   scale   = f32_to_e4m3(amax / (6.0f * g))        RNE, satfinite: >= 448 (and inf) -> 448
//   divisor = e4m3_to_f32(scale) * g                  one float multiply
//   code[i] = f32_to_e2m1(x[i] / divisor)             IEEE division, then RNE + satfinite
//             (ties 0.25, 1.25, 2.5, 5 down; 0.75, 1.75, 3.5 up; |v| > 5 -> 6; the sign bit is
//             kept, so -0.0 gives code 8; NaN gives +6, code 7)
//   except when divisor == 0 (the scale rounded to 0 because amax / (6 g) <= 2^-10, or g == 0):
//             every code of the block is 0. Such a block dequantizes to zeros whatever its codes
//             are; fixing them to +0 keeps the two device paths identical without depending on how
//             the encoders treat 0 / 0.
// Packing: codes [rows][k/2], element 2i in the low nibble of byte i (the NVFP4 checkpoint layout,
// also the mma.sync kind::mxf4nvf4 operand layout: 8 codes per 32-bit register, element j in bits
// [4j, 4j + 4)); scales E4M3 [rows][k/16], one byte per block in K order.
#pragma once

#include "quant/formats.h"
#include "quant/hd.h"

#include <cstdint>

namespace spark::cuda::fp4 {

inline constexpr int kNvfp4Block = 16;

// Largest |x| of a block; NaN never compares greater, so it is ignored.
SPARK_HD float nvfp4_act_amax(const float * x) {
    float amax = 0.0f;
    for (int i = 0; i < kNvfp4Block; ++i) {
        const float a = f32_from_bits(f32_bits(x[i]) & 0x7FFFFFFFu);
        if (a > amax) amax = a;
    }
    return amax;
}

SPARK_HD uint8_t nvfp4_act_scale_code(float amax, float global_scale) { return f32_to_e4m3(amax / (kE2M1Max * global_scale)); }

SPARK_HD float nvfp4_act_divisor(uint8_t scale_code, float global_scale) { return e4m3_to_f32(scale_code) * global_scale; }

// The value whose E2M1 rounding is the element's code.
SPARK_HD float nvfp4_act_scaled(float x, float divisor) { return divisor != 0.0f ? x / divisor : 0.0f; }

// One block: 16 inputs -> 8 packed code bytes (returned as two little-endian words) and the scale,
// with the software encoder.
SPARK_HD uint8_t nvfp4_act_quantize_block(const float * x, float global_scale, uint32_t & lo, uint32_t & hi) {
    const uint8_t scale   = nvfp4_act_scale_code(nvfp4_act_amax(x), global_scale);
    const float   divisor = nvfp4_act_divisor(scale, global_scale);
    uint32_t      word[2] = {0u, 0u};
    for (int i = 0; i < kNvfp4Block / 2; ++i) {
        const uint8_t byte = f32x2_to_e2m1x2(nvfp4_act_scaled(x[2 * i], divisor), nvfp4_act_scaled(x[2 * i + 1], divisor));
        word[i / 4] |= uint32_t(byte) << (8 * (i % 4));
    }
    lo = word[0];
    hi = word[1];
    return scale;
}

// The whole activation matrix on the host: x [rows][k] with rows `row_stride` floats apart
// (k % 16 == 0). This is what quantize_activations_nvfp4 (w4a4.h) computes on the device.
inline void quantize_activations_nvfp4_ref(const float * x, int64_t rows, int64_t k, int64_t row_stride, float global_scale,
                                           uint8_t * codes, uint8_t * scales) {
    const int64_t blocks = k / kNvfp4Block;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < blocks; ++b) {
            uint32_t lo = 0, hi = 0;
            scales[r * blocks + b] = nvfp4_act_quantize_block(x + r * row_stride + b * kNvfp4Block, global_scale, lo, hi);
            uint8_t * c            = codes + r * (k / 2) + b * (kNvfp4Block / 2);
            for (int i = 0; i < 4; ++i) {
                c[i]     = uint8_t(lo >> (8 * i));
                c[4 + i] = uint8_t(hi >> (8 * i));
            }
        }
}

}  // namespace spark::cuda::fp4
