// Round-to-nearest quantizers of float32 [N][K] weights into spark's canonical layouts, for
// spark-convert (quantizing a bf16 checkpoint). Each reproduces one producer's recipe; the comments
// in quantize.cpp cite it. Dequantizing the result with dequantize_rows gives back exactly the values
// the producer's own dequantizer would.
#pragma once

#include <cstdint>
#include <vector>

#include "quant/qweight.h"

namespace spark {

// Owned buffers of a quantized weight plus the QWeight view of them. Move-only: the view points
// into the vectors, whose storage a move keeps.
struct QuantizedWeight {
    std::vector<uint8_t> data, scales, zeros;
    QWeight              weight;

    QuantizedWeight() = default;
    QuantizedWeight(const QuantizedWeight &)             = delete;
    QuantizedWeight & operator=(const QuantizedWeight &) = delete;
    QuantizedWeight(QuantizedWeight &&)                  = default;
    QuantizedWeight & operator=(QuantizedWeight &&)      = default;
};

// NVFP4 as NVIDIA ModelOpt quantizes weights: global_scale = amax / (6 * 448); per 16 elements
// block_scale = e4m3(amax_block / (6 * global_scale)) (0 -> 1.0, at least 2^-9);
// code = e2m1_rne(w / (f32(block_scale) * global_scale)). Requires k % 16 == 0.
// An all-zero tensor gets global_scale 1 (ModelOpt would divide by zero).
QuantizedWeight quantize_nvfp4(const float * w, int64_t n, int64_t k);

enum class Int4Scheme : uint8_t {
    // GPTQ's RTN grid (IST-DASLab/gptq, AutoGPTQ `Quantizer.find_params`; AutoRound "int_sym_gptq"):
    // scale = (max(|min|, max) - min') / 15 with min' = -max(|min|, max) when min < 0 (so usually
    // 2 * amax / 15 = amax / 7.5), implicit zero 8, q in [0, 15] (so -8..7 around the zero).
    SymmetricGptq,
    // AutoRound's default symmetric grid ("int_sym", "full range"): scale = +-amax / 8, its sign
    // chosen so the largest-magnitude element lands on -8; q - 8 in [-8, 7]. Scales can be negative.
    SymmetricFullRange,
    // GPTQ / AutoRound asymmetric ("int_asym"): scale = (max' - min') / 15 over the range widened to
    // include 0, zero = round(-min' / scale) clamped to [0, 15].
    Asymmetric,
};

struct Int4QuantizeOptions {
    int32_t    group_size = 128;  // 32, 64, 128, ...; -1 = one group over all of K (per-channel)
    Int4Scheme scheme     = Int4Scheme::SymmetricGptq;
    ScaleType  scale_type = ScaleType::F16;  // scales are rounded to this type before q is computed
};

// INT4 in the canonical GPTQ layout (qweight [K/8][N], scales [G][N], zeros [G][N/8] stored as z
// with zero_offset 0 for Asymmetric, nullptr for the symmetric schemes). Requires k % 8 == 0, and
// n % 8 == 0 for Asymmetric; K need not be a multiple of the group size (the last group is short).
// A group whose scale would underflow the scale type gets the type's smallest positive value.
QuantizedWeight quantize_int4(const float * w, int64_t n, int64_t k, const Int4QuantizeOptions & options);

// FP8 E4M3 with one f32 scale per (block_n x block_k) block, scale = amax_block / 448 (1 for an
// all-zero block), code = e4m3_satfinite(w / scale). Per-tensor: (n, k); per-channel: (1, k);
// DeepSeek-style block FP8: (128, 128); partial edge blocks are fine.
QuantizedWeight quantize_fp8(const float * w, int64_t n, int64_t k, int32_t block_n, int32_t block_k);

// ||W - dequant(Q)||_2 / ||W||_2 over the whole [N][K] tensor (0 when W is all zero and Q is exact).
double relative_error(const float * w, const QWeight & q);

}  // namespace spark
