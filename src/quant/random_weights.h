// Random weights of a plausible magnitude for benchmarks (synthetic models of real shapes), defined
// per logical element (n, k) by a counter-based hash, so the CPU (canonical layout) and the GPU
// (device layout) build exactly the same weight without any host-device transfer.
#pragma once

#include "quant/formats.h"
#include "quant/hd.h"

#include <cstdint>

namespace spark::random_weights {

SPARK_HD uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// 32 random bits for element `index` of buffer `stream` of the weight with `seed`.
SPARK_HD uint32_t bits(uint64_t seed, uint32_t stream, uint64_t index) {
    return uint32_t(mix64(seed * 0x100000001B3ull ^ (uint64_t(stream) << 56) ^ index) >> 16);
}

// Uniform in [-1, 1).
SPARK_HD float uniform(uint64_t seed, uint32_t stream, uint64_t index) {
    return float(bits(seed, stream, index) >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

// Dense: uniform with standard deviation `scale` (uniform(-a, a) has sd a / sqrt(3)).
SPARK_HD float dense(uint64_t seed, int64_t n, int64_t k, int64_t K, float scale) {
    return uniform(seed, 0, uint64_t(n) * uint64_t(K) + uint64_t(k)) * scale * 1.7320508f;
}

// NVFP4: uniform E2M1 codes (mean square 11.5 for magnitudes {0,.5,1,1.5,2,3,4,6}), block scales
// E4M3 in [1, 2) (codes 0x38..0x3F), global scale chosen so the values have sd ~ scale.
SPARK_HD uint8_t nvfp4_code(uint64_t seed, int64_t n, int64_t k, int64_t K) {
    return uint8_t(bits(seed, 1, uint64_t(n) * uint64_t(K) + uint64_t(k)) & 0xF);
}
SPARK_HD uint8_t nvfp4_block_scale(uint64_t seed, int64_t n, int64_t b, int64_t n_blocks) {
    return uint8_t(0x38 + (bits(seed, 2, uint64_t(n) * uint64_t(n_blocks) + uint64_t(b)) & 0x7));
}
SPARK_HD float nvfp4_global_scale(float scale) { return scale / (3.39f * 1.45f); }

// INT4: uniform codes, symmetric (implicit zero 8, sd of q - 8 is ~4.6), f16 scales around scale/4.6.
SPARK_HD uint32_t int4_code(uint64_t seed, int64_t n, int64_t k, int64_t K) {
    return bits(seed, 3, uint64_t(n) * uint64_t(K) + uint64_t(k)) & 0xF;
}
SPARK_HD uint16_t int4_scale_f16(uint64_t seed, int64_t n, int64_t g, int64_t n_groups, float scale) {
    const float u = 0.75f + 0.5f * (uniform(seed, 4, uint64_t(n) * uint64_t(n_groups) + uint64_t(g)) * 0.5f + 0.5f);
    return f32_to_f16(scale / 4.6f * u);
}

// FP8: uniform E4M3 codes except NaN (0x7F, 0xFF); f32 block scales around scale/100 (uniform codes
// have a huge spread; this keeps the bulk of values at a plausible size).
SPARK_HD uint8_t fp8_code(uint64_t seed, int64_t n, int64_t k, int64_t K) {
    uint8_t c = uint8_t(bits(seed, 5, uint64_t(n) * uint64_t(K) + uint64_t(k)) & 0xFF);
    return (c & 0x7F) == 0x7F ? uint8_t(c ^ 1) : c;
}
SPARK_HD float fp8_block_scale(uint64_t seed, int64_t bn, int64_t bk, int64_t n_bk, float scale) {
    return scale / 100.0f * (0.75f + 0.25f * uniform(seed, 6, uint64_t(bn) * uint64_t(n_bk) + uint64_t(bk)));
}

}  // namespace spark::random_weights
