// Layout conversions into the canonical INT4 layout. Each test builds a known logical matrix, packs
// it the way the producer documents (formula in the comment), repacks, and compares logical values
// and dequantized weights.
#include <doctest/doctest.h>

#include "quant/dequant.h"
#include "quant/formats.h"
#include "quant/repack.h"
#include "quant_reference.h"

using namespace spark;
using namespace spark::test;

namespace {

// Logical q[k][n] of a canonical qweight [K/8][N]: nibble (k % 8) of word [k / 8][n].
uint32_t canonical_q(const std::vector<int32_t> & qweight, int64_t n_cols, int64_t k, int64_t n) {
    return int4_get(uint32_t(qweight[size_t((k / 8) * n_cols + n)]), int(k % 8));
}
// Logical zero of column n in group g of canonical qzeros [G][N/8].
uint32_t canonical_zero(const std::vector<int32_t> & qzeros, int64_t n_cols, int64_t g, int64_t n) {
    return int4_get(uint32_t(qzeros[size_t(g * (n_cols / 8) + n / 8)]), int(n % 8));
}

}  // namespace

TEST_CASE("AWQ -> canonical: interleaved nibbles along N become GPTQ words along K") {
    Rng           rng(11);
    const int64_t k = 64, n = 48, group = 32, groups = k / group;
    // Logical matrices: q[k][n] (AWQ orientation is [K][N]), zeros[g][n], scales[g][n].
    std::vector<uint8_t> q(size_t(k * n)), z(size_t(groups * n));
    for (auto & v : q) v = uint8_t(rng.uniform_int(0, 15));
    for (auto & v : z) v = uint8_t(rng.uniform_int(0, 15));
    std::vector<uint16_t> scales(size_t(groups * n));
    for (auto & s : scales) s = f32_to_f16(rng.uniform(0.001f, 0.02f));

    // AutoAWQ awq/modules/linear/gemm.py `from_linear`, order_map = [0, 2, 4, 6, 1, 3, 5, 7]:
    //   qweight[:, col] |= intweight[:, col * 8 + order_map[i]] << (i * 4)   (same for qzeros)
    const int order_map[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    std::vector<int32_t> awq_qweight(size_t(k * n / 8), 0), awq_qzeros(size_t(groups * n / 8), 0);
    for (int64_t r = 0; r < k; ++r)
        for (int64_t col = 0; col < n / 8; ++col) {
            uint32_t word = 0;
            for (int i = 0; i < 8; ++i) word |= uint32_t(q[size_t(r * n + col * 8 + order_map[i])]) << (i * 4);
            awq_qweight[size_t(r * (n / 8) + col)] = int32_t(word);
        }
    for (int64_t g = 0; g < groups; ++g)
        for (int64_t col = 0; col < n / 8; ++col) {
            uint32_t word = 0;
            for (int i = 0; i < 8; ++i) word |= uint32_t(z[size_t(g * n + col * 8 + order_map[i])]) << (i * 4);
            awq_qzeros[size_t(g * (n / 8) + col)] = int32_t(word);
        }

    std::vector<int32_t> qweight(size_t(k / 8 * n)), qzeros(size_t(groups * n / 8));
    awq_qweight_to_gptq(awq_qweight.data(), k, n, qweight.data());
    awq_qzeros_to_gptq(awq_qzeros.data(), groups, n, qzeros.data());

    int64_t wrong = 0;
    for (int64_t kk = 0; kk < k; ++kk)
        for (int64_t nn = 0; nn < n; ++nn)
            if (canonical_q(qweight, n, kk, nn) != q[size_t(kk * n + nn)]) ++wrong;
    for (int64_t g = 0; g < groups; ++g)
        for (int64_t nn = 0; nn < n; ++nn)
            if (canonical_zero(qzeros, n, g, nn) != z[size_t(g * n + nn)]) ++wrong;
    CHECK(wrong == 0);

    // Dequantized: (q - z) * s (AutoAWQ packing_utils.py `dequantize_gemm`), zero_offset 0.
    QWeight w;
    w.format     = WeightFormat::INT4;
    w.n          = n;
    w.k          = k;
    w.data       = qweight.data();
    w.scales     = scales.data();
    w.zeros      = qzeros.data();
    w.group_size = int32_t(group);
    w.n_groups   = int32_t(groups);
    std::vector<float> out(size_t(n * k));
    dequantize_rows(w, 0, n, out.data());
    for (int64_t nn = 0; nn < n; ++nn)
        for (int64_t kk = 0; kk < k; ++kk) {
            const int64_t g   = kk / group;
            const float   ref = float(int(q[size_t(kk * n + nn)]) - int(z[size_t(g * n + nn)])) *
                              f16_to_f32(scales[size_t(g * n + nn)]);
            if (!same_bits(out[size_t(nn * k + kk)], ref)) ++wrong;
        }
    CHECK(wrong == 0);
}

TEST_CASE("AWQ slot tables are inverse permutations") {
    for (int j = 0; j < 8; ++j) {
        CHECK(kAwqOrder[kAwqSlotOfColumn[j]] == j);
        CHECK(kAwqSlotOfColumn[kAwqOrder[j]] == j);
    }
}

TEST_CASE("compressed-tensors pack-quantized -> canonical, symmetric and asymmetric") {
    Rng           rng(12);
    const int64_t n = 40, k = 96, group = 32, groups = k / group;
    // Signed values as compressed-tensors quantizes them: q in [-8, 7], zero points in [-8, 7].
    std::vector<int8_t> q(size_t(n * k)), zp(size_t(n * groups));
    for (auto & v : q) v = int8_t(rng.uniform_int(-8, 7));
    for (auto & v : zp) v = int8_t(rng.uniform_int(-8, 7));
    std::vector<uint16_t> scale_ng(size_t(n * groups));  // weight_scale [N][G], bf16
    for (auto & s : scale_ng) s = f32_to_bf16(rng.uniform(0.001f, 0.02f));

    // pack_quantized.py `pack_to_int32`: value + 8 as unsigned; packed_dim=1 (weights, along K):
    //   packed[:, c] |= value[:, 8c + i] << 4i;  packed_dim=0 (zero points, along N):
    //   packed[r, :] |= value[8r + i, :] << 4i.
    std::vector<int32_t> packed(size_t(n * (k / 8)), 0), zp_packed(size_t((n / 8) * groups), 0);
    for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < k / 8; ++c) {
            uint32_t word = 0;
            for (int i = 0; i < 8; ++i) word |= uint32_t(q[size_t(r * k + 8 * c + i)] + 8) << (4 * i);
            packed[size_t(r * (k / 8) + c)] = int32_t(word);
        }
    for (int64_t r = 0; r < n / 8; ++r)
        for (int64_t g = 0; g < groups; ++g) {
            uint32_t word = 0;
            for (int i = 0; i < 8; ++i) word |= uint32_t(zp[size_t((8 * r + i) * groups + g)] + 8) << (4 * i);
            zp_packed[size_t(r * groups + g)] = int32_t(word);
        }

    std::vector<int32_t>  qweight(size_t(k / 8 * n)), qzeros(size_t(groups * n / 8));
    std::vector<uint16_t> scales(size_t(groups * n));
    ct_weight_packed_to_gptq(packed.data(), n, k, qweight.data());
    ct_zero_point_to_gptq(zp_packed.data(), n, groups, qzeros.data());
    transpose_u16(scale_ng.data(), n, groups, scales.data());

    QWeight w;
    w.format     = WeightFormat::INT4;
    w.n          = n;
    w.k          = k;
    w.data       = qweight.data();
    w.scales     = scales.data();
    w.group_size = int32_t(group);
    w.n_groups   = int32_t(groups);
    w.scale_type = ScaleType::BF16;

    for (bool asym : {false, true}) {
        CAPTURE(asym);
        w.zeros = asym ? qzeros.data() : nullptr;
        std::vector<float> out(size_t(n * k));
        dequantize_rows(w, 0, n, out.data());
        // lifecycle/forward.py `_dequantize`: (x_q - zero_point) * scale on the signed values.
        int64_t wrong = 0;
        for (int64_t nn = 0; nn < n; ++nn)
            for (int64_t kk = 0; kk < k; ++kk) {
                const int64_t g   = kk / group;
                const int     z   = asym ? zp[size_t(nn * groups + g)] : 0;
                const float   ref = float(q[size_t(nn * k + kk)] - z) * bf16_to_f32(scale_ng[size_t(nn * groups + g)]);
                if (!same_bits(out[size_t(nn * k + kk)], ref)) ++wrong;
            }
        CHECK(wrong == 0);
    }
}

TEST_CASE("transpose_u16 and nibble pack/unpack") {
    const uint16_t src[6] = {1, 2, 3, 4, 5, 6};  // [2][3]
    uint16_t       dst[6];
    transpose_u16(src, 2, 3, dst);
    const uint16_t expected[6] = {1, 4, 2, 5, 3, 6};
    for (int i = 0; i < 6; ++i) CHECK(dst[i] == expected[i]);

    std::vector<uint8_t> values(19);
    for (size_t i = 0; i < values.size(); ++i) values[i] = uint8_t((i * 7 + 3) % 16);
    std::vector<int32_t> words(3);
    pack_nibbles(values.data(), int64_t(values.size()), words.data());
    CHECK(uint32_t(words[0]) == (3u | 10u << 4 | 1u << 8 | 8u << 12 | 15u << 16 | 6u << 20 | 13u << 24 | 4u << 28));
    std::vector<uint8_t> back(24);
    unpack_nibbles(words.data(), 3, back.data());
    for (size_t i = 0; i < values.size(); ++i) CHECK(back[i] == values[i]);
    for (size_t i = values.size(); i < back.size(); ++i) CHECK(back[i] == 0);  // zero padding
}
