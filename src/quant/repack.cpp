#include "quant/repack.h"

#include <algorithm>

#include "quant/formats.h"

namespace spark {
namespace {

// dst[c][r] = src[r][c], in square tiles so both sides stay in cache.
template <typename T> void transpose(const T * src, int64_t rows, int64_t cols, T * dst) {
    constexpr int64_t tile = 32;
    for (int64_t r0 = 0; r0 < rows; r0 += tile)
        for (int64_t c0 = 0; c0 < cols; c0 += tile) {
            const int64_t r1 = std::min(rows, r0 + tile), c1 = std::min(cols, c0 + tile);
            for (int64_t r = r0; r < r1; ++r)
                for (int64_t c = c0; c < c1; ++c) dst[c * rows + r] = src[r * cols + c];
        }
}

uint32_t awq_word_to_sequential(uint32_t awq_word) {
    uint32_t out = 0;
    for (int j = 0; j < 8; ++j) out = int4_set(out, j, int4_get(awq_word, kAwqSlotOfColumn[j]));
    return out;
}

}  // namespace

void awq_qweight_to_gptq(const int32_t * awq_qweight, int64_t k, int64_t n, int32_t * qweight) {
    const int64_t words_per_row = n / 8;
    for (int64_t r = 0; r < k / 8; ++r) {
        for (int64_t c = 0; c < words_per_row; ++c) {
            // The 8 AWQ words of rows k = 8r .. 8r+7, column word c, made sequential along N.
            uint32_t seq[8];
            for (int i = 0; i < 8; ++i)
                seq[i] = awq_word_to_sequential(uint32_t(awq_qweight[(8 * r + i) * words_per_row + c]));
            // Canonical word [r][8c + j] collects nibble j of each, element i (k = 8r + i) at bits 4i.
            for (int j = 0; j < 8; ++j) {
                uint32_t word = 0;
                for (int i = 0; i < 8; ++i) word = int4_set(word, i, int4_get(seq[i], j));
                qweight[r * n + 8 * c + j] = int32_t(word);
            }
        }
    }
}

void awq_qzeros_to_gptq(const int32_t * awq_qzeros, int64_t n_groups, int64_t n, int32_t * qzeros) {
    const int64_t count = n_groups * (n / 8);
    for (int64_t i = 0; i < count; ++i)
        qzeros[i] = int32_t(awq_word_to_sequential(uint32_t(awq_qzeros[i])));
}

// Both layouts put element k = 8r + j of a row at bits 4j of word r: the words are the same and only
// their order changes ([n][k/8] -> [k/8][n]).
void ct_weight_packed_to_gptq(const int32_t * weight_packed, int64_t n, int64_t k, int32_t * qweight) {
    transpose(weight_packed, n, k / 8, qweight);
}

// Word [c][g] nibble j (row n = 8c + j) -> word [g][c] nibble j: again a transpose of words.
void ct_zero_point_to_gptq(const int32_t * zero_point_packed, int64_t n, int64_t n_groups,
                           int32_t * qzeros) {
    transpose(zero_point_packed, n / 8, n_groups, qzeros);
}

void transpose_u16(const uint16_t * src, int64_t rows, int64_t cols, uint16_t * dst) {
    transpose(src, rows, cols, dst);
}

void unpack_nibbles(const int32_t * words, int64_t n_words, uint8_t * out) {
    for (int64_t w = 0; w < n_words; ++w)
        for (int j = 0; j < 8; ++j) out[8 * w + j] = uint8_t(int4_get(uint32_t(words[w]), j));
}

void pack_nibbles(const uint8_t * values, int64_t count, int32_t * words) {
    for (int64_t w = 0; w * 8 < count; ++w) {
        uint32_t word = 0;
        for (int j = 0; j < 8 && w * 8 + j < count; ++j) word = int4_set(word, j, values[w * 8 + j]);
        words[w] = int32_t(word);
    }
}

}  // namespace spark
