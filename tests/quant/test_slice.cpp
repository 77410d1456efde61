// Weight slices for tensor parallelism (quant/slice.h): every format's rows and columns, cut where
// its layout allows, dequantize to exactly the corresponding part of the whole weight (compared
// as bits: the random bytes include NaN codes and scales, which must survive as they were); cuts
// the layout cannot make are refused with the reason.
#include "common/error.h"
#include "quant/dequant.h"
#include "quant/slice.h"

#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace spark;

namespace {

struct Made {
    QWeight                              w;
    std::vector<std::vector<uint8_t>>    bytes;
};

std::mt19937_64 rng(1234);

const void * random_bytes(Made & m, size_t n) {
    m.bytes.emplace_back(n);
    for (uint8_t & b : m.bytes.back()) b = uint8_t(rng());
    return m.bytes.back().data();
}

// Random bytes in the canonical layout of `f` (every code and scale value, NaN included, is a
// valid input to the dequantizer).
Made make(WeightFormat f, int64_t n, int64_t k, int gs = 0, bool zeros = false, bool g_idx = false, int bn = 0, int bk = 0) {
    Made m;
    QWeight & w = m.w;
    w.format = f, w.n = n, w.k = k;
    switch (f) {
        case WeightFormat::F32: w.data = random_bytes(m, size_t(n * k * 4)); break;
        case WeightFormat::F16:
        case WeightFormat::BF16: w.data = random_bytes(m, size_t(n * k * 2)); break;
        case WeightFormat::NVFP4:
            w.data         = random_bytes(m, size_t(n * k / 2));
            w.scales       = random_bytes(m, size_t(n * k / 16));
            w.global_scale = 0.37f;
            break;
        case WeightFormat::INT4: {
            w.group_size  = gs;
            w.n_groups    = int32_t((k + gs - 1) / gs);
            w.zero_offset = zeros ? 1 : 0;
            w.data        = random_bytes(m, size_t(k / 8 * n * 4));
            // f16 scales without NaN / inf: their products with every code stay comparable
            m.bytes.emplace_back(size_t(w.n_groups * n * 2));
            auto * sc = reinterpret_cast<uint16_t *>(m.bytes.back().data());
            for (int64_t i = 0; i < w.n_groups * n; ++i) sc[i] = uint16_t(0x2000 + rng() % 0x3000);
            w.scales = sc;
            if (zeros) w.zeros = random_bytes(m, size_t(w.n_groups * (n / 8) * 4));
            if (g_idx) {
                m.bytes.emplace_back(size_t(k * 4));
                auto * gi = reinterpret_cast<int32_t *>(m.bytes.back().data());
                for (int64_t c = 0; c < k; ++c) gi[c] = int32_t(rng() % uint64_t(w.n_groups));
                w.g_idx = gi;
            }
            break;
        }
        case WeightFormat::FP8: {
            w.block_n = bn, w.block_k = bk;
            w.data    = random_bytes(m, size_t(n * k));
            m.bytes.emplace_back(size_t(((n + bn - 1) / bn) * ((k + bk - 1) / bk) * 4));
            auto * sc = reinterpret_cast<float *>(m.bytes.back().data());
            for (size_t i = 0; i < m.bytes.back().size() / 4; ++i) sc[i] = 0.001f * float(1 + rng() % 1000);
            w.scales = sc;
            break;
        }
    }
    return m;
}

std::vector<float> dequant(const QWeight & w) {
    std::vector<float> out(size_t(w.n * w.k));
    dequantize_rows(w, 0, w.n, out.data());
    return out;
}

// The slice's dequantized values are the whole weight's in rows [n0, n1) x columns [k0, k1).
bool same_part(const QWeight & whole, const QWeight & part, int64_t n0, int64_t k0) {
    const std::vector<float> a = dequant(whole), b = dequant(part);
    for (int64_t r = 0; r < part.n; ++r)
        if (std::memcmp(&a[size_t((n0 + r) * whole.k + k0)], &b[size_t(r * part.k)], size_t(part.k) * 4) != 0) return false;
    return true;
}

}  // namespace

TEST_CASE("weight slices: rows and columns of every format dequantize to that part of the whole, bit for bit") {
    struct Case {
        const char * name;
        Made         m;
        std::vector<std::pair<int64_t, int64_t>> rows, cols;
    };
    std::vector<Case> cases;
    cases.push_back({"f32", make(WeightFormat::F32, 24, 40), {{0, 12}, {12, 24}, {5, 6}}, {{0, 20}, {20, 40}, {3, 17}}});
    cases.push_back({"bf16", make(WeightFormat::BF16, 24, 40), {{0, 8}, {8, 24}}, {{0, 10}, {10, 40}}});
    cases.push_back({"f16", make(WeightFormat::F16, 16, 32), {{4, 12}}, {{16, 32}}});
    cases.push_back({"nvfp4", make(WeightFormat::NVFP4, 24, 256), {{0, 12}, {12, 24}, {3, 7}}, {{0, 128}, {128, 256}, {64, 192}, {16, 32}}});
    // INT4: g128 symmetric (the fixtures' K = 256 cut 4 ways falls inside groups), asymmetric with
    // zeros, act-order g_idx, per-channel, and g32 (cuts on and off the group boundaries).
    cases.push_back({"int4 g128 sym", make(WeightFormat::INT4, 32, 256, 128), {{0, 16}, {16, 32}, {3, 9}},
                     {{0, 64}, {64, 128}, {128, 192}, {192, 256}, {0, 128}, {56, 200}}});
    cases.push_back({"int4 g128 zeros", make(WeightFormat::INT4, 32, 256, 128, true), {{0, 16}, {8, 32}},
                     {{0, 64}, {64, 128}, {128, 256}, {8, 248}}});
    cases.push_back({"int4 g32 act-order", make(WeightFormat::INT4, 16, 128, 32, true, true), {{0, 8}, {8, 16}}, {{0, 64}, {64, 128}, {8, 40}}});
    cases.push_back({"int4 per-channel", make(WeightFormat::INT4, 16, 64, 64), {{0, 8}}, {{0, 32}, {32, 64}}});
    cases.push_back({"int4 g32", make(WeightFormat::INT4, 16, 128, 32), {{4, 12}}, {{0, 32}, {32, 96}, {40, 128}, {8, 24}}});
    // FP8: 128 x 128 blocks (cuts on block rows / columns, the last block of a cut may be partial;
    // cuts inside a block: smaller blocks with copied scales), per-channel (1 x K) and per-tensor (N x K).
    cases.push_back({"fp8 block", make(WeightFormat::FP8, 384, 320, 0, false, false, 128, 128),
                     {{0, 128}, {128, 384}, {256, 300}, {64, 192}, {64, 384}, {96, 100}},
                     {{0, 128}, {128, 256}, {256, 320}, {128, 200}, {64, 256}, {192, 320}, {32, 48}}});
    cases.push_back({"fp8 channel", make(WeightFormat::FP8, 24, 64, 0, false, false, 1, 64), {{0, 12}, {5, 13}}, {{0, 32}, {16, 48}}});
    cases.push_back({"fp8 tensor", make(WeightFormat::FP8, 24, 64, 0, false, false, 24, 64), {{0, 12}, {12, 24}}, {{0, 32}, {8, 40}}});
    for (Case & c : cases) {
        const std::string name = c.name;
        CAPTURE(name);
        for (const auto & [row0, row1] : c.rows) {
            const int64_t a = row0, b = row1;  // copies: CAPTURE makes a lambda, which clang does not let capture bindings
            CAPTURE(a);
            CAPTURE(b);
            SliceOwner    owner;
            const QWeight s = slice_rows(c.m.w, a, b, owner);
            CHECK(s.n == b - a);
            CHECK(s.k == c.m.w.k);
            CHECK(same_part(c.m.w, s, a, 0));
        }
        {  // several ranges at once: the first and last of the cases' cuts, concatenated
            const std::vector<RowRange> ranges = {c.rows.front(), c.rows.back(), c.rows.front()};
            SliceOwner                  owner;
            const QWeight               s  = slice_rows(c.m.w, ranges, owner);
            int64_t                     at = 0;
            for (const RowRange & r : ranges) {
                const int64_t a = r.first, b = r.second;
                CAPTURE(a);
                const QWeight part = slice_rows(s, at, at + b - a, owner);
                CHECK(same_part(c.m.w, part, a, 0));
                at += b - a;
            }
            CHECK(s.n == at);
        }
        for (const auto & [col0, col1] : c.cols) {
            const int64_t a = col0, b = col1;
            CAPTURE(a);
            CAPTURE(b);
            SliceOwner    owner;
            const QWeight s = slice_cols(c.m.w, a, b, owner);
            CHECK(s.n == c.m.w.n);
            CHECK(s.k == b - a);
            CHECK(same_part(c.m.w, s, 0, a));
        }
    }
}

TEST_CASE("weight slices: cuts a layout cannot make are refused with the reason") {
    auto refused = [](auto && cut, const char * why) {
        try {
            cut();
            FAIL("no error");
        } catch (const Error & e) {
            CHECK(e.status() == SPARK_ERR_UNSUPPORTED);
            CHECK(std::string(e.what()).find(why) != std::string::npos);
        }
    };
    SliceOwner o;
    Made       nv = make(WeightFormat::NVFP4, 16, 64);
    refused([&] { slice_cols(nv.w, 8, 64, o); }, "16 columns");
    Made q = make(WeightFormat::INT4, 16, 64, 32, true);
    refused([&] { slice_cols(q.w, 4, 64, o); }, "8 columns");
    refused([&] { slice_rows(q.w, 4, 16, o); }, "zero points");
    try {
        slice_rows(nv.w, 8, 8, o);
        FAIL("no error for an empty slice");
    } catch (const Error & e) {
        CHECK(e.status() == SPARK_ERR_INVALID_ARGUMENT);
    }
}
