#include "quant/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/dequant.h"
#include "quant/formats.h"

namespace spark {
namespace {

float max_abs(const float * x, int64_t count) {
    float m = 0.0f;
    for (int64_t i = 0; i < count; ++i) m = std::max(m, std::fabs(x[i]));
    return m;
}

// Round half to even (torch.round), in the default floating-point environment.
float round_even(float x) { return std::nearbyint(x); }

uint16_t to_scale_type(float x, ScaleType t) { return t == ScaleType::BF16 ? f32_to_bf16(x) : f32_to_f16(x); }
float    from_scale_type(uint16_t h, ScaleType t) { return t == ScaleType::BF16 ? bf16_to_f32(h) : f16_to_f32(h); }

// A positive scale rounded to its storage type. A group so small that its scale underflows to zero
// (GPTQ would then divide by zero) gets the smallest positive value of the type instead.
float stored_positive_scale(float x, ScaleType t) {
    const float s = from_scale_type(to_scale_type(x, t), t);
    return s > 0.0f ? s : from_scale_type(1, t);
}

}  // namespace

// NVIDIA/Model-Optimizer:modelopt/torch/quantization/qtensor/nvfp4_tensor.py, dynamic path:
// `get_weights_scaling_factor_2` (amax / (6.0 * 448.0)), `get_weights_scaling_factor`
// (per_block_amax / (6.0 * wsf2), zeros -> 1.0, clamp(min=2**-9), .to(float8_e4m3fn)), `quantize`
// (input / (f32(scale) * wsf2), `_cast_fp4`, packed = (q[1::2] << 4) | q[0::2]). All float32.
// `_cast_fp4` takes the sign from `x < 0`, so -0.0 encodes as +0 (code 0); the hardware encoder gives
// code 8 there. Both decode to zero; this follows ModelOpt bit for bit.
QuantizedWeight quantize_nvfp4(const float * w, int64_t n, int64_t k) {
    QuantizedWeight q;
    const int64_t   n_blocks = k / 16;
    q.data.resize(size_t(n * k / 2));
    q.scales.resize(size_t(n * n_blocks));

    const float amax    = max_abs(w, n * k);
    const float global  = amax > 0.0f ? amax / (6.0f * 448.0f) : 1.0f;
    const float global6 = 6.0f * global;

    for (int64_t r = 0; r < n; ++r) {
        for (int64_t b = 0; b < n_blocks; ++b) {
            const float * x           = w + r * k + b * 16;
            float         block_scale = max_abs(x, 16) / global6;
            if (block_scale == 0.0f) block_scale = 1.0f;
            block_scale                        = std::max(block_scale, 0x1p-9f);
            const uint8_t code                 = f32_to_e4m3(block_scale);
            const float   denom                = e4m3_to_f32(code) * global;
            q.scales[size_t(r * n_blocks + b)] = code;
            uint8_t * out                      = q.data.data() + r * (k / 2) + b * 8;
            for (int j = 0; j < 8; ++j) {
                const float   even = x[2 * j] / denom, odd = x[2 * j + 1] / denom;
                const uint8_t ce   = even == 0.0f ? 0 : f32_to_e2m1(even);
                const uint8_t co   = odd == 0.0f ? 0 : f32_to_e2m1(odd);
                out[j]             = pack_e2m1x2(ce, co);
            }
        }
    }

    QWeight & v    = q.weight;
    v.format       = WeightFormat::NVFP4;
    v.n            = n;
    v.k            = k;
    v.data         = q.data.data();
    v.scales       = q.scales.data();
    v.global_scale = global;
    return q;
}

// Scale and zero: IST-DASLab/gptq:quant.py and AutoGPTQ auto_gptq/quantization/quantizer.py
// `Quantizer.find_params` (range widened to include 0; sym: xmin = -max(|xmin|, xmax) where xmin < 0;
// an all-zero group gets (-1, +1); scale = (xmax - xmin) / 15; zero = 8 or round(-xmin / scale));
// intel/auto-round:auto_round/data_type/int.py `quant_tensor_sym` (full range: scale = max_v / 8,
// max_v = +-max(|wmin|, wmax), clamped away from zero by q_scale_thresh = 1e-5, q in [-8, 7]).
// As in AutoRound, the scale is rounded to its storage type first and the zero and q are computed
// from the stored value, so dequantization reproduces exactly what was optimized for.
// q = clamp(round(w / scale + zero), 0, 15) in float32: the GPTQ packer's `round(W / s + z)`
// (formats.md §4.3); it reproduces the AutoRound fixtures under ../shared/fixtures bit for bit.
QuantizedWeight quantize_int4(const float * w, int64_t n, int64_t k, const Int4QuantizeOptions & options) {
    QuantizedWeight q;
    const int64_t   group_size = options.group_size > 0 ? options.group_size : k;
    const int64_t   n_groups   = (k + group_size - 1) / group_size;
    const bool      asym       = options.scheme == Int4Scheme::Asymmetric;
    q.data.assign(size_t((k / 8) * n * 4), 0);
    q.scales.resize(size_t(n_groups * n * 2));
    if (asym) q.zeros.assign(size_t(n_groups * (n / 8) * 4), 0);

    uint32_t * words  = reinterpret_cast<uint32_t *>(q.data.data());
    uint16_t * scales = reinterpret_cast<uint16_t *>(q.scales.data());
    uint32_t * zeros  = reinterpret_cast<uint32_t *>(q.zeros.data());

    for (int64_t col = 0; col < n; ++col) {
        const float * row = w + col * k;
        for (int64_t g = 0; g < n_groups; ++g) {
            const int64_t begin = g * group_size, end = std::min(k, begin + group_size);
            float         lo = 0.0f, hi = 0.0f;  // range widened to include 0
            for (int64_t i = begin; i < end; ++i) {
                lo = std::min(lo, row[i]);
                hi = std::max(hi, row[i]);
            }
            float scale = 1.0f, zero = 8.0f;
            switch (options.scheme) {
                case Int4Scheme::SymmetricGptq: {
                    hi = std::max(-lo, hi);
                    if (lo < 0.0f) lo = -hi;
                    if (lo == 0.0f && hi == 0.0f) lo = -1.0f, hi = 1.0f;
                    scale = stored_positive_scale((hi - lo) / 15.0f, options.scale_type);
                    break;
                }
                case Int4Scheme::SymmetricFullRange: {
                    const float magnitude = std::max(-lo, hi);
                    const float max_v     = (hi < -lo) ? magnitude : -magnitude;
                    scale = from_scale_type(to_scale_type(max_v / 8.0f, options.scale_type), options.scale_type);
                    scale = scale < 0.0f ? std::min(scale, -1e-5f) : std::max(scale, 1e-5f);
                    scale = from_scale_type(to_scale_type(scale, options.scale_type), options.scale_type);
                    break;
                }
                case Int4Scheme::Asymmetric: {
                    if (lo == 0.0f && hi == 0.0f) lo = -1.0f, hi = 1.0f;
                    scale = stored_positive_scale((hi - lo) / 15.0f, options.scale_type);
                    zero  = std::clamp(round_even(-lo / scale), 0.0f, 15.0f);
                    break;
                }
            }
            scales[g * n + col] = to_scale_type(scale, options.scale_type);
            if (asym) {
                uint32_t & word = zeros[g * (n / 8) + col / 8];
                word            = int4_set(word, int(col % 8), uint32_t(zero));
            }
            for (int64_t i = begin; i < end; ++i) {
                const float q    = std::clamp(round_even(row[i] / scale + zero), 0.0f, 15.0f);
                uint32_t &  word = words[(i / 8) * n + col];
                word             = int4_set(word, int(i % 8), uint32_t(q));
            }
        }
    }

    QWeight & v   = q.weight;
    v.format      = WeightFormat::INT4;
    v.n           = n;
    v.k           = k;
    v.data        = q.data.data();
    v.scales      = q.scales.data();
    v.zeros       = asym ? q.zeros.data() : nullptr;
    v.group_size  = int32_t(group_size);
    v.n_groups    = int32_t(n_groups);
    v.zero_offset = 0;
    v.scale_type  = options.scale_type;
    return q;
}

// scale = amax / 448, w / scale cast with saturation: neuralmagic/compressed-tensors
// quantization/utils/helpers.py `calculate_qparams` (FP8: max_abs / 448) and lifecycle/forward.py
// `_quantize` (x / scale, clamp to +-448, cast); deepseek-ai/DeepSeek-V3 inference/kernel.py
// (block quant: s = amax / 448, y = x / s).
QuantizedWeight quantize_fp8(const float * w, int64_t n, int64_t k, int32_t block_n, int32_t block_k) {
    QuantizedWeight q;
    const int64_t   n_blocks = (n + block_n - 1) / block_n, k_blocks = (k + block_k - 1) / block_k;
    q.data.resize(size_t(n * k));
    q.scales.resize(size_t(n_blocks * k_blocks) * sizeof(float));
    float * scales = reinterpret_cast<float *>(q.scales.data());

    for (int64_t bn = 0; bn < n_blocks; ++bn) {
        const int64_t r0 = bn * block_n, r1 = std::min(n, r0 + block_n);
        for (int64_t bk = 0; bk < k_blocks; ++bk) {
            const int64_t c0 = bk * block_k, c1 = std::min(k, c0 + block_k);
            float         amax = 0.0f;
            for (int64_t r = r0; r < r1; ++r) amax = std::max(amax, max_abs(w + r * k + c0, c1 - c0));
            const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
            scales[bn * k_blocks + bk] = scale;
            for (int64_t r = r0; r < r1; ++r)
                for (int64_t c = c0; c < c1; ++c) q.data[size_t(r * k + c)] = f32_to_e4m3(w[r * k + c] / scale);
        }
    }

    QWeight & v = q.weight;
    v.format    = WeightFormat::FP8;
    v.n         = n;
    v.k         = k;
    v.data      = q.data.data();
    v.scales    = q.scales.data();
    v.block_n   = block_n;
    v.block_k   = block_k;
    return q;
}

double relative_error(const float * w, const QWeight & q) {
    constexpr int64_t  tile = 64;
    std::vector<float> buf(static_cast<size_t>(tile * q.k));
    double             err = 0.0, ref = 0.0;
    for (int64_t r0 = 0; r0 < q.n; r0 += tile) {
        const int64_t rows = std::min(tile, q.n - r0);
        dequantize_rows(q, r0, rows, buf.data());
        for (int64_t i = 0; i < rows * q.k; ++i) {
            const double x = w[r0 * q.k + i], d = x - double(buf[size_t(i)]);
            err += d * d;
            ref += x * x;
        }
    }
    if (ref == 0.0) return err == 0.0 ? 0.0 : INFINITY;
    return std::sqrt(err / ref);
}

}  // namespace spark
