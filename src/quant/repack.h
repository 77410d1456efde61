// Lossless conversions of INT4 checkpoint layouts into spark's canonical INT4 layout (GPTQ
// orientation, src/quant/qweight.h): only bits move, no value is recomputed. Formats are described in
// docs/FORMATS.md §3 (sources cited there and below).
//
//   AWQ (AutoAWQ GEMM, auto_round:auto_awq)   qweight i32 [K][N/8], qzeros i32 [G][N/8], both packed
//                                             along N with the nibble interleave 0,2,4,6,1,3,5,7;
//                                             scales [G][N] (already canonical); zero_offset 0.
//   compressed-tensors pack-quantized         weight_packed i32 [N][ceil(K/8)] packed along K, values
//                                             stored +8 (signed q + 8); weight_zero_point (asym) i32
//                                             [ceil(N/8)][G] packed along N, also +8; weight_scale
//                                             [N][G] (transpose it); zero_offset 0.
//   GPTQ v1 / auto_round:auto_gptq            already canonical; qzeros hold z - 1, which stays a
//                                             zero_offset of 1 on the QWeight (nothing is rewritten).
//
// Preconditions (the loader validates): k % 8 == 0, n % 8 == 0 where zeros are packed along N;
// source and destination buffers do not overlap.
#pragma once

#include <cstdint>

namespace spark {

// Nibble slot i of an AWQ word holds column 8c + kAwqOrder[i]; column 8c + j sits in slot
// kAwqSlotOfColumn[j] (casper-hansen/AutoAWQ:awq/utils/packing_utils.py AWQ_ORDER /
// AWQ_REVERSE_ORDER; awq/modules/linear/gemm.py `from_linear`).
inline constexpr int kAwqOrder[8]        = {0, 2, 4, 6, 1, 3, 5, 7};
inline constexpr int kAwqSlotOfColumn[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// AWQ qweight [k][n/8] -> canonical qweight [k/8][n].
void awq_qweight_to_gptq(const int32_t * awq_qweight, int64_t k, int64_t n, int32_t * qweight);

// AWQ qzeros [n_groups][n/8] (interleaved) -> canonical qzeros [n_groups][n/8] (sequential).
void awq_qzeros_to_gptq(const int32_t * awq_qzeros, int64_t n_groups, int64_t n, int32_t * qzeros);

// compressed-tensors weight_packed [n][ceil(k/8)] -> canonical qweight [k/8][n]. The stored value
// q + 8 is already GPTQ's unsigned q; with no zero point the canonical zeros are nullptr (zero 8).
// (neuralmagic/compressed-tensors:src/compressed_tensors/compressors/quantized_compressors/
// pack_quantized.py `pack_to_int32`: offset 1 << (bits - 1), element i of a word at bits 4i.)
void ct_weight_packed_to_gptq(const int32_t * weight_packed, int64_t n, int64_t k, int32_t * qweight);

// compressed-tensors weight_zero_point [ceil(n/8)][n_groups] (packed along N, stored zp + 8)
// -> canonical qzeros [n_groups][n/8]. Dequant (q_s - zp_s) * s == (stored_q - stored_zp) * s, so the
// stored nibbles are the canonical zeros as they are.
void ct_zero_point_to_gptq(const int32_t * zero_point_packed, int64_t n, int64_t n_groups,
                           int32_t * qzeros);

// [rows][cols] -> [cols][rows] for 16-bit elements (compressed-tensors weight_scale [N][G] ->
// canonical scales [G][N]; f16 and bf16 move bit for bit).
void transpose_u16(const uint16_t * src, int64_t rows, int64_t cols, uint16_t * dst);

// Unpack 8 nibbles per word (element j of word w -> out[8w + j]) and the inverse. pack_nibbles
// takes count values (count need not be a multiple of 8: the last word is zero-padded, as
// compressed-tensors pads K).
void unpack_nibbles(const int32_t * words, int64_t n_words, uint8_t * out);
void pack_nibbles(const uint8_t * values, int64_t count, int32_t * words);

}  // namespace spark
