// A weight as the CUDA kernels see it: device pointers in the device layout, produced at load time
// from a canonical QWeight (src/quant/qweight.h) by upload_weight() — the checkpoint file stays
// arch-neutral. Plain data: it is passed to kernels by value, and MoE expert tables are arrays of it
// in device memory (one launch reads every routed expert's pointers).
//
// Device layouts (row-major over the N output rows, K contiguous: one warp streams a row with
// 16-byte loads, and a GEMM tile of rows reads contiguous runs):
//   F32 / F16 / BF16  data [N][K]
//   NVFP4             data u8 [N][K/2] (element 2i in the low nibble), in the order of
//                     w4_chunk_index (below: the checkpoint's row-major bytes, or tile-major);
//                     scales E4M3 [N][K/16] as in the checkpoint, global_scale (multiplier).
//   INT4              data u32 [N][K/8]: nibble j of word w of row n is q[n][8w + j]
//                     (the GPTQ [K/8][N] words transposed by a device kernel), in the
//                     order of w4_word_index (below);
//                     scales f16|bf16 [N][G]; zeros u8 [N][G] = effective zero (offset applied),
//                     nullptr = symmetric (zero 8);
//                     act-order checkpoints: K is stored sorted by group and perm[k] is the input
//                     channel of stored column k (kernels read x[perm[k]]); nullptr otherwise.
//                     Group of stored column k: k / group_size.
//   FP8               data E4M3 [N][K], scales f32 [ceil(N/block_n)][ceil(K/block_k)]. As is.
#pragma once

#include "quant/hd.h"
#include "quant/qweight.h"

#include <cstdint>

namespace spark::cuda {

// The tile-major order of the 4-bit formats (INT4, NVFP4: `tiled`, chosen at upload where N % 16 == 0
// and K % 128 == 0, except NVFP4 weights read in place from the file, which keep the checkpoint's
// row-major order). A tile is 16 rows x 128 K (64 bytes of each row, 1 KB), stored as the
// 16 rows one after the other; a row tile's K tiles follow each other, then the next 16 rows. The
// decode GEMV's warp loads rows g and g + 8 (g < 8) of a 128-K block, 16 bytes a lane: in this order
// each of its load instructions reads 512 contiguous bytes instead of 8 runs of 64 bytes K / 2 bytes
// apart, which the memory system serves faster (docs/PERF.md, "The weights in 16 x 128 tiles").
// Every byte is where it was within its row's 64-byte block; only the blocks move. In both orders an
// index is the row's plus the column's, index(n, c) = index(n, 0) + index(0, c): kernels keep a row's
// first chunk (or byte) and add index(0, c) of the chunk they read.
SPARK_HD constexpr bool w4_format(WeightFormat f) { return f == WeightFormat::INT4 || f == WeightFormat::NVFP4; }
SPARK_HD bool           w4_tiled_layout(int64_t n, int64_t k) { return n % 16 == 0 && k % 128 == 0; }
// Index of 16-byte chunk c (K elements 32c .. 32c + 31) of row n, in chunks from `data`; kc = K / 32.
SPARK_HD int64_t w4_chunk_index(bool tiled, int64_t n, int64_t c, int64_t kc) {
    return tiled ? (n >> 4) * 16 * kc + (c >> 2) * 64 + (n & 15) * 4 + (c & 3) : n * kc + c;
}
// Index of byte b (K elements 2b, 2b + 1) of row n, in bytes from `data`; k2 = K / 2.
SPARK_HD int64_t w4_byte_index(bool tiled, int64_t n, int64_t b, int64_t k2) {
    return tiled ? w4_chunk_index(true, n, b >> 4, k2 >> 4) * 16 + (b & 15) : n * k2 + b;
}
// Index of 32-bit word w (K elements 8w .. 8w + 7) of row n, in words from `data`; k8 = K / 8.
SPARK_HD int64_t w4_word_index(bool tiled, int64_t n, int64_t w, int64_t k8) {
    return tiled ? (n >> 4) * 16 * k8 + (w >> 4) * 256 + (n & 15) * 16 + (w & 15) : n * k8 + w;
}

struct DeviceWeight {
    WeightFormat    format       = WeightFormat::BF16;
    ScaleType       scale_type   = ScaleType::F16;  // INT4
    bool            tiled        = false;           // INT4, NVFP4: data in the tile-major order (above)
    int32_t         group_size   = 0;               // INT4
    int32_t         n_groups     = 0;               // INT4
    int32_t         block_n      = 0;               // FP8
    int32_t         block_k      = 0;               // FP8
    int64_t         n            = 0;
    int64_t         k            = 0;
    float           global_scale = 1.0f;            // NVFP4
    float           act_scale    = 0.0f;            // NVFP4: QWeight::act_scale (0: W4A16 only)
    const void *    data         = nullptr;
    const void *    scales       = nullptr;
    const uint8_t * zeros        = nullptr;         // INT4
    const int32_t * perm         = nullptr;         // INT4 act-order
};

// A canonical weight's DeviceWeight before its buffers are placed: format, shape and quantization
// parameters, which mean the same in both layouts. (Only this direction: the QWeight stays the
// canonical description, nothing of the device layout is copied back into it.)
inline DeviceWeight device_weight_shape(const QWeight & w) {
    DeviceWeight d;
    d.format       = w.format;
    d.n            = w.n;
    d.k            = w.k;
    d.scale_type   = w.scale_type;
    d.group_size   = w.group_size;
    d.n_groups     = w.n_groups;
    d.block_n      = w.block_n;
    d.block_k      = w.block_k;
    d.global_scale = w.global_scale;
    d.act_scale    = w.act_scale;
    d.tiled        = w4_format(w.format) && w4_tiled_layout(w.n, w.k);
    return d;
}

// Expert parallelism (docs/DISTRIBUTED.md): a rank's MATMUL_ID experts that another rank holds are
// empty QWeights (n == 0, never prepared: no device layout); the slots routed to them output zeros.
// In a device expert table such an expert is absent_expert(): the first held expert's format and
// shape with null pointers, so that every per-weight constant a kernel derives stays defined; the
// kernels treat a null `data` as an invalid expert id (no weight read, output 0).
inline bool expert_held(const QWeight & w) { return w.n > 0; }
inline const QWeight * first_held_expert(const QWeight * experts, int32_t n) {
    for (int32_t e = 0; e < n; ++e)
        if (expert_held(experts[e])) return &experts[e];
    return nullptr;
}
inline DeviceWeight absent_expert(const DeviceWeight & held) {
    DeviceWeight d = held;
    d.data         = nullptr;
    d.scales       = nullptr;
    d.zeros        = nullptr;
    d.perm         = nullptr;
    return d;
}

}  // namespace spark::cuda
