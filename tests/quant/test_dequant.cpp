// dequantize_rows against the per-element reference (quant_reference.h) on random data, for every
// canonical format and the layout details that are easy to get wrong.
#include <doctest/doctest.h>

#include <cmath>

#include "quant/dequant.h"
#include "quant/formats.h"
#include "quant_reference.h"

using namespace spark;
using namespace spark::test;

namespace {

std::vector<float> dequant_all(const QWeight & w, int64_t tile) {
    std::vector<float> out(size_t(w.n * w.k));
    for (int64_t r = 0; r < w.n; r += tile) dequantize_rows(w, r, std::min(tile, w.n - r), out.data() + r * w.k);
    return out;
}

// Bit-exact agreement with the reference, for whole-matrix and odd-sized tiles.
void check_against_reference(const QWeight & w) {
    const std::vector<float> ref = ref_dequant_all(w);
    for (int64_t tile : {w.n, int64_t(1), int64_t(7), int64_t(16)}) {
        CAPTURE(tile);
        const std::vector<float> got = dequant_all(w, tile);
        int64_t                  wrong = 0;
        for (size_t i = 0; i < ref.size(); ++i)
            if (!same_bits(got[i], ref[i])) ++wrong;
        CHECK(wrong == 0);
    }
    // A tile starting mid-matrix writes only its own rows.
    if (w.n >= 8) {
        std::vector<float> part(size_t(5 * w.k) + 1, -123.0f);
        dequantize_rows(w, 3, 5, part.data());
        int64_t wrong = 0;
        for (int64_t i = 0; i < 5 * w.k; ++i)
            if (!same_bits(part[size_t(i)], ref[size_t(3 * w.k + i)])) ++wrong;
        CHECK(wrong == 0);
        CHECK(part.back() == -123.0f);
    }
}

uint8_t random_e4m3_scale(Rng & rng) {  // any non-NaN, non-negative E4M3 code
    return uint8_t(rng.uniform_int(0, 0x7E));
}

struct Int4Buffers {
    std::vector<uint32_t> words, zeros;
    std::vector<uint16_t> scales;
    std::vector<int32_t>  g_idx;
};

// Random INT4 weight in canonical layout: q uniform in [0, 15], scales random finite values of the
// scale type (sign included), zeros random in [0, 15] when asymmetric.
QWeight random_int4(Int4Buffers & b, Rng & rng, int64_t n, int64_t k, int32_t group_size, bool asym,
                    ScaleType st, int32_t zero_offset = 0) {
    const int64_t n_groups = (k + group_size - 1) / group_size;
    b.words.resize(size_t(k / 8 * n));
    for (auto & w : b.words) w = rng.bits();
    b.scales.resize(size_t(n_groups * n));
    for (auto & s : b.scales) {
        const float v = rng.uniform(-0.05f, 0.05f);
        s             = st == ScaleType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
    }
    if (asym) {
        b.zeros.resize(size_t(n_groups * (n / 8)));
        for (auto & z : b.zeros) z = rng.bits();
    }
    QWeight w;
    w.format      = WeightFormat::INT4;
    w.n           = n;
    w.k           = k;
    w.data        = b.words.data();
    w.scales      = b.scales.data();
    w.zeros       = asym ? b.zeros.data() : nullptr;
    w.group_size  = group_size;
    w.n_groups    = int32_t(n_groups);
    w.zero_offset = zero_offset;
    w.scale_type  = st;
    return w;
}

}  // namespace

TEST_CASE("dequantize_rows NVFP4 matches the reference") {
    Rng                  rng(1);
    const int64_t        n = 48, k = 96;
    std::vector<uint8_t> codes(size_t(n * k / 2)), scales(size_t(n * k / 16));
    for (auto & c : codes) c = uint8_t(rng.bits());  // every nibble value, both signs
    for (auto & s : scales) s = random_e4m3_scale(rng);
    QWeight w;
    w.format       = WeightFormat::NVFP4;
    w.n            = n;
    w.k            = k;
    w.data         = codes.data();
    w.scales       = scales.data();
    w.global_scale = 3.7e-4f;
    check_against_reference(w);
}

TEST_CASE("dequantize_rows NVFP4 nibble order: element 2i is the low nibble") {
    std::vector<uint8_t> codes(8, 0), scales(1, 0x38);  // block scale 1.0
    codes[0] = 0x21;                                     // element 0 = code 1 (0.5), element 1 = code 2 (1.0)
    codes[7] = 0xF9;                                     // element 14 = code 9 (-0.5), element 15 = code F (-6)
    QWeight w;
    w.format       = WeightFormat::NVFP4;
    w.n            = 1;
    w.k            = 16;
    w.data         = codes.data();
    w.scales       = scales.data();
    w.global_scale = 2.0f;
    float out[16];
    dequantize_rows(w, 0, 1, out);
    CHECK(out[0] == 1.0f);
    CHECK(out[1] == 2.0f);
    CHECK(out[14] == -1.0f);
    CHECK(out[15] == -12.0f);
    CHECK(out[2] == 0.0f);
}

TEST_CASE("NVFP4 global scale: ModelOpt multiplier and compressed-tensors divisor") {
    // ModelOpt: W = e2m1 * f32(s) * weight_scale_2. compressed-tensors: W = e2m1 * (f32(s) /
    // weight_global_scale) (lifecycle/forward.py `_dequantize`). The canonical multiplier is
    // 1 / weight_global_scale (vLLM compressed_tensors_w4a4_nvfp4.py). Exact when the divisor is a
    // power of two, otherwise within the rounding of the reciprocal (at most 1 ulp of each factor).
    Rng                  rng(2);
    std::vector<uint8_t> codes(16), scales(2);
    for (auto & c : codes) c = uint8_t(rng.bits());
    for (int trial = 0; trial < 2000; ++trial) {
        scales[0]           = random_e4m3_scale(rng);
        scales[1]           = random_e4m3_scale(rng);
        const bool  pow2    = trial % 4 == 0;
        const float divisor = pow2 ? std::ldexp(1.0f, rng.uniform_int(-10, 20))
                                   : 2688.0f / rng.uniform(1e-3f, 10.0f);  // 448 * 6 / amax
        QWeight w;
        w.format       = WeightFormat::NVFP4;
        w.n            = 1;
        w.k            = 32;
        w.data         = codes.data();
        w.scales       = scales.data();
        w.global_scale = 1.0f / divisor;
        float out[32];
        dequantize_rows(w, 0, 1, out);
        for (int k = 0; k < 32; ++k) {
            const uint8_t code = (k % 2 == 0) ? (codes[size_t(k / 2)] & 0xF) : (codes[size_t(k / 2)] >> 4);
            const float   ct   = float(ref_e2m1(code)) * (float(ref_e4m3(scales[size_t(k / 16)])) / divisor);
            if (pow2) {
                CHECK(same_bits(out[k], ct));
            } else {
                CHECK(std::fabs(out[k] - ct) <= std::fabs(ct) * 3 * std::ldexp(1.0f, -24));
            }
        }
    }
}

TEST_CASE("dequantize_rows INT4 matches the reference for every group layout") {
    Rng rng(3);
    for (bool asym : {false, true})
        for (ScaleType st : {ScaleType::F16, ScaleType::BF16})
            for (int32_t gs : {32, 64, 128, 256 /* = K: per-channel */, 12 /* not a multiple of 8 */}) {
                CAPTURE(asym);
                CAPTURE(int(st));
                CAPTURE(gs);
                Int4Buffers b;
                const QWeight w = random_int4(b, rng, 40, 256, gs, asym, st);
                check_against_reference(w);
            }
}

TEST_CASE("INT4 with K not a multiple of the group size: the last group is short") {
    Rng         rng(4);
    Int4Buffers b;
    const QWeight w = random_int4(b, rng, 16, 200, 64, true, ScaleType::F16);  // groups of 64,64,64,8
    CHECK(w.n_groups == 4);
    check_against_reference(w);
}

TEST_CASE("INT4 GPTQ v1 zero offset (+1) and v2 give the same weights") {
    // v1 / auto_round:auto_gptq store z - 1 and decode unpack(qzeros) + 1; v2 stores z
    // (formats.md §4.2-4.3). Same logical zeros, two encodings, identical output.
    Rng         rng(5);
    Int4Buffers v2;
    QWeight     w2 = random_int4(v2, rng, 32, 128, 32, true, ScaleType::F16);
    for (auto & z : v2.zeros) {  // logical zeros in [1, 15] so that z - 1 fits a nibble
        uint32_t word = 0;
        for (int j = 0; j < 8; ++j) word = int4_set(word, j, uint32_t(rng.uniform_int(1, 15)));
        z = word;
    }
    Int4Buffers v1 = v2;
    for (auto & z : v1.zeros) {
        uint32_t word = 0;
        for (int j = 0; j < 8; ++j) word = int4_set(word, j, int4_get(z, j) - 1);
        z = word;
    }
    QWeight w1     = w2;
    w1.data        = v1.words.data();
    w1.scales      = v1.scales.data();
    w1.zeros       = v1.zeros.data();
    w1.zero_offset = 1;
    std::vector<float> a(size_t(32 * 128)), c(a.size());
    dequantize_rows(w2, 0, 32, a.data());
    dequantize_rows(w1, 0, 32, c.data());
    CHECK(a == c);
    check_against_reference(w1);

    // Without the offset the v1 weights are off by exactly one scale step.
    QWeight w1_no_offset     = w1;
    w1_no_offset.zero_offset = 0;
    std::vector<float> d(a.size());
    dequantize_rows(w1_no_offset, 0, 32, d.data());
    for (int64_t n = 0; n < 32; ++n) {
        const float s = f16_to_f32(v2.scales[size_t(n)]);
        CHECK(d[size_t(n * 128)] - a[size_t(n * 128)] == doctest::Approx(s).epsilon(1e-3));
    }
}

TEST_CASE("INT4 symmetric: no zeros means zero 8, same as stored 8 (v2) or 7 + 1 (v1)") {
    Rng         rng(6);
    Int4Buffers b;
    QWeight     sym = random_int4(b, rng, 16, 64, 32, false, ScaleType::F16);
    std::vector<uint32_t> z8(size_t(2 * 16 / 8), 0x88888888u), z7(z8.size(), 0x77777777u);
    QWeight v2 = sym, v1 = sym;
    v2.zeros       = z8.data();
    v1.zeros       = z7.data();
    v1.zero_offset = 1;
    std::vector<float> a(size_t(16 * 64)), c(a.size()), d(a.size());
    dequantize_rows(sym, 0, 16, a.data());
    dequantize_rows(v2, 0, 16, c.data());
    dequantize_rows(v1, 0, 16, d.data());
    CHECK(a == c);
    CHECK(a == d);
    // zero_offset does not apply to the implicit zero.
    QWeight sym_offset     = sym;
    sym_offset.zero_offset = 1;
    dequantize_rows(sym_offset, 0, 16, d.data());
    CHECK(a == d);
}

TEST_CASE("INT4 act-order: g_idx picks each input channel's group") {
    Rng           rng(7);
    const int64_t n = 24, k = 128;
    Int4Buffers   b;
    QWeight       w = random_int4(b, rng, n, k, 32, true, ScaleType::BF16);
    // desc_act: groups follow a permutation of K, so g_idx is not k / group_size.
    std::vector<int32_t> perm(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i) perm[size_t(i)] = int32_t(i);
    std::shuffle(perm.begin(), perm.end(), rng.gen);
    b.g_idx.resize(size_t(k));
    for (int64_t i = 0; i < k; ++i) b.g_idx[size_t(perm[size_t(i)])] = int32_t(i / 32);
    w.g_idx = b.g_idx.data();
    check_against_reference(w);

    // The map matters: ignoring g_idx gives different weights.
    QWeight plain = w;
    plain.g_idx   = nullptr;
    std::vector<float> with(size_t(n * k)), without(with.size());
    dequantize_rows(w, 0, n, with.data());
    dequantize_rows(plain, 0, n, without.data());
    CHECK(with != without);

    // A trivial g_idx (k / group_size) equals no g_idx.
    for (int64_t i = 0; i < k; ++i) b.g_idx[size_t(i)] = int32_t(i / 32);
    dequantize_rows(w, 0, n, with.data());
    CHECK(with == without);
}

TEST_CASE("dequantize_rows FP8 blocks: 128x128 with partial edge blocks, per-tensor, per-channel") {
    Rng                  rng(8);
    const int64_t        n = 200, k = 300;
    std::vector<uint8_t> codes(size_t(n * k));
    for (auto & c : codes) {
        c = uint8_t(rng.bits());
        if ((c & 0x7F) == 0x7F) c ^= 1;  // no NaN codes
    }
    struct Case {
        int32_t bn, bk;
    };
    for (Case c : {Case{128, 128}, Case{int32_t(n), int32_t(k)}, Case{1, int32_t(k)}, Case{64, 32}}) {
        CAPTURE(c.bn);
        CAPTURE(c.bk);
        const int64_t      nb = (n + c.bn - 1) / c.bn, kb = (k + c.bk - 1) / c.bk;
        std::vector<float> scales(size_t(nb * kb));
        for (auto & s : scales) s = rng.uniform(1e-4f, 1e-2f);
        QWeight w;
        w.format  = WeightFormat::FP8;
        w.n       = n;
        w.k       = k;
        w.data    = codes.data();
        w.scales  = scales.data();
        w.block_n = c.bn;
        w.block_k = c.bk;
        check_against_reference(w);
    }
    // The last element of a 200x300 matrix with 128x128 blocks uses scale [1][2] of [2][3].
    std::vector<float> scales = {1, 2, 3, 4, 5, 7};
    QWeight            w;
    w.format  = WeightFormat::FP8;
    w.n       = n;
    w.k       = k;
    w.data    = codes.data();
    w.scales  = scales.data();
    w.block_n = 128;
    w.block_k = 128;
    std::vector<float> row(static_cast<size_t>(k));
    dequantize_rows(w, n - 1, 1, row.data());
    CHECK(same_bits(row[size_t(k - 1)], e4m3_to_f32(codes[size_t(n * k - 1)]) * 7.0f));
    CHECK(same_bits(row[127], e4m3_to_f32(codes[size_t((n - 1) * k + 127)]) * 4.0f));
    CHECK(same_bits(row[128], e4m3_to_f32(codes[size_t((n - 1) * k + 128)]) * 5.0f));
}

TEST_CASE("dequantize_rows dense formats and dense_to_f32") {
    Rng                   rng(9);
    const int64_t         n = 9, k = 33;
    std::vector<float>    f32(size_t(n * k));
    std::vector<uint16_t> f16(f32.size()), bf16(f32.size());
    for (size_t i = 0; i < f32.size(); ++i) {
        f32[i]  = rng.normal(1.0f);
        f16[i]  = uint16_t(rng.bits());
        bf16[i] = uint16_t(rng.bits());
        if ((f16[i] & 0x7C00) == 0x7C00) f16[i] &= 0xBFFF;    // no inf/NaN
        if ((bf16[i] & 0x7F80) == 0x7F80) bf16[i] &= 0xBFFF;  // no inf/NaN
    }
    for (auto entry : {std::pair{WeightFormat::F32, (const void *) f32.data()},
                       std::pair{WeightFormat::F16, (const void *) f16.data()},
                       std::pair{WeightFormat::BF16, (const void *) bf16.data()}}) {
        const WeightFormat fmt  = entry.first;  // not a structured binding: CAPTURE is a lambda (clang 14)
        const void *       data = entry.second;
        CAPTURE(int(fmt));
        QWeight w;
        w.format = fmt;
        w.n      = n;
        w.k      = k;
        w.data   = data;
        check_against_reference(w);
        std::vector<float> vec(size_t(n * k));
        dense_to_f32(fmt, data, n * k, vec.data());
        CHECK(vec == ref_dequant_all(w));
    }
}
