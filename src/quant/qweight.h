// A Linear weight in one of spark's canonical layouts, as the kernels see it.
//
// Checkpoints arrive in many spellings (ModelOpt / compressed-tensors NVFP4, GPTQ v1/v2, AWQ,
// AutoRound, block / channel / tensor FP8). The loader (src/runtime/weight_resolver.cpp) maps each
// of them, losslessly, onto the few layouts below; nothing is re-quantized. Logical shape is always
// the PyTorch one: N = out_features (rows), K = in_features (reduction), y = x * W^T.
//
// The struct holds raw pointers into the canonical layout's buffers; the owner of the memory is the
// model. The CPU backend's kernels read them. The CUDA backend keeps the QWeight as it was given
// (its pointers: the host buffers it was uploaded from, nothing reads them afterwards and they may
// be gone; null for a random weight) and sets device_layout to its device copy in the kernels'
// layout (src/backends/cuda/device_weight.h); nothing of that layout is copied back into it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace spark {

enum class WeightFormat : uint8_t {
    F32,    // data: float [N][K]
    F16,    // data: half  [N][K]
    BF16,   // data: bf16  [N][K]
    NVFP4,  // data: u8 [N][K/2], element 2i in the LOW nibble of byte i (E2M1 codes);
            // scales: E4M3 [N][K/16]; global_scale: f32 multiplier (ModelOpt weight_scale_2;
            // = 1 / compressed-tensors weight_global_scale).  W = e2m1 * f32(scale) * global_scale
    INT4,   // GPTQ orientation. data: i32 [K/8][N], nibble j of word [r][n] = q[k = 8r + j][n];
            // scales: f16 or bf16 [G][N] (scale_type); zeros: i32 [G][N/8], nibble j of word
            // [g][c] = stored zero of column 8c + j, or nullptr for symmetric (implicit zero 8);
            // effective zero = stored + zero_offset (1 for GPTQ v1 / auto_round:auto_gptq).
            // g_idx: i32 [K] group of each input channel, nullptr when g_idx[k] == k / group_size.
            // W[n][k] = scale[g][n] * (q[k][n] - zero[g][n]),  g = g_idx ? g_idx[k] : k / group_size
    FP8,    // data: E4M3 [N][K]; scales: f32 [ceil(N/block_n)][ceil(K/block_k)].
            // Per-tensor: block = (N, K); per-channel: block = (1, K); block FP8: e.g. (128, 128).
            // W[n][k] = f32(e4m3) * scale[n / block_n][k / block_k]
};

enum class ScaleType : uint8_t { F16, BF16 };

struct QWeight {
    WeightFormat format = WeightFormat::F32;
    int64_t      n = 0;  // out_features
    int64_t      k = 0;  // in_features

    const void *    data   = nullptr;
    const void *    scales = nullptr;
    const void *    zeros  = nullptr;
    const int32_t * g_idx  = nullptr;

    float     global_scale = 1.0f;  // NVFP4
    // NVFP4: the activations' global scale a W4A4 checkpoint calibrated (multiplier: x ~ e2m1 *
    // e4m3(block scale) * act_scale; ModelOpt input_scale, 1 / compressed-tensors
    // input_global_scale); 0 when the checkpoint has none (W4A16 only). Only the W4A4 path of
    // Blackwell GeForce / DGX Spark reads it (docs/SM120.md).
    float     act_scale    = 0.0f;
    int32_t   group_size   = 0;     // INT4 (K when per-channel)
    int32_t   n_groups     = 0;     // INT4: rows of scales/zeros
    int32_t   zero_offset  = 0;     // INT4
    ScaleType scale_type   = ScaleType::F16;  // INT4
    int32_t   block_n      = 0;     // FP8
    int32_t   block_k      = 0;     // FP8

    // Backend-private: the CUDA backend points this at its DeviceWeight (the repacked device layout).
    const void * device_layout = nullptr;
};

// Bytes of each buffer of a weight in canonical layout (for accounting and uploads).
struct QWeightBytes {
    size_t data = 0, scales = 0, zeros = 0, g_idx = 0;
    size_t total() const { return data + scales + zeros + g_idx; }
};

// Inline: header-only users of the backend interface (the kernel emulators) need it too.
inline QWeightBytes qweight_bytes(const QWeight & w) {
    const auto ceil_div = [](int64_t a, int64_t b) { return size_t((a + b - 1) / b); };
    QWeightBytes b;
    const size_t n = size_t(w.n), k = size_t(w.k);
    switch (w.format) {
        case WeightFormat::F32:  b.data = n * k * 4; break;
        case WeightFormat::F16:
        case WeightFormat::BF16: b.data = n * k * 2; break;
        case WeightFormat::NVFP4:
            b.data   = n * (k / 2);
            b.scales = n * (k / 16);
            break;
        case WeightFormat::INT4:
            b.data   = (k / 8) * n * 4;
            b.scales = size_t(w.n_groups) * n * 2;
            b.zeros  = w.zeros ? size_t(w.n_groups) * (n / 8) * 4 : 0;
            b.g_idx  = w.g_idx ? k * 4 : 0;
            break;
        case WeightFormat::FP8:
            b.data   = n * k;
            b.scales = (w.block_n > 0 && w.block_k > 0)
                           ? ceil_div(w.n, w.block_n) * ceil_div(w.k, w.block_k) * 4
                           : 0;
            break;
    }
    return b;
}

const char * weight_format_name(WeightFormat f);

}  // namespace spark
