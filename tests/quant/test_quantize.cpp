// Quantizers: each step against the producer's recipe (recomputed here with the reference encoders),
// per-element error bounds derived from the grids, and exact round trips of values on the grid.
#include <doctest/doctest.h>

#include <cmath>

#include "quant/dequant.h"
#include "quant/formats.h"
#include "quant/quantize.h"
#include "quant_reference.h"

using namespace spark;
using namespace spark::test;

namespace {

std::vector<float> gaussian(Rng & rng, int64_t count, float sigma) {
    std::vector<float> w(static_cast<size_t>(count));
    for (auto & x : w) x = rng.normal(sigma);
    return w;
}

std::vector<float> dequant(const QWeight & q) {
    std::vector<float> out(size_t(q.n * q.k));
    dequantize_rows(q, 0, q.n, out.data());
    return out;
}

float amax_of(const float * x, int64_t count) {
    float m = 0;
    for (int64_t i = 0; i < count; ++i) m = std::max(m, std::fabs(x[i]));
    return m;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// NVFP4

TEST_CASE("quantize_nvfp4 follows the ModelOpt recipe step by step") {
    Rng           rng(21);
    const int64_t n = 32, k = 128;
    std::vector<float> w = gaussian(rng, n * k, 0.02f);
    for (int i = 0; i < 16; ++i) w[size_t(16 + i)] = 0.0f;                  // an all-zero block: scale 1.0
    for (int i = 0; i < 16; ++i) w[size_t(32 + i)] = 1e-9f * float(i - 8);  // tiny block: scale clamps at 2^-9
    w[2] = -0.0f;
    w[3] = -0.0f;
    const QuantizedWeight q = quantize_nvfp4(w.data(), n, k);
    REQUIRE(q.weight.format == WeightFormat::NVFP4);

    // nvfp4_tensor.py: wsf2 = amax / (6 * 448); per_block = amax_blk / (6 * wsf2), 0 -> 1,
    // clamp(min=2^-9), cast to e4m3; q = cast_fp4(x / (f32(scale) * wsf2)), sign from x < 0.
    const float global = amax_of(w.data(), n * k) / (6.0f * 448.0f);
    CHECK(same_bits(q.weight.global_scale, global));
    const uint8_t * scales = static_cast<const uint8_t *>(q.weight.scales);
    const uint8_t * codes  = static_cast<const uint8_t *>(q.weight.data);
    int64_t         wrong_scales = 0, wrong_codes = 0, out_of_bound = 0;
    const std::vector<float> deq = dequant(q.weight);
    for (int64_t r = 0; r < n; ++r)
        for (int64_t b = 0; b < k / 16; ++b) {
            const float * x  = w.data() + r * k + b * 16;
            float         bs = amax_of(x, 16) / (6.0f * global);
            if (bs == 0.0f) bs = 1.0f;
            bs                    = std::max(bs, std::ldexp(1.0f, -9));
            const uint32_t sc     = ref_encode_e4m3(bs);
            const uint8_t  got_sc = scales[r * (k / 16) + b];
            if (got_sc != sc) ++wrong_scales;
            const float denom = float(ref_e4m3(got_sc)) * global;
            for (int j = 0; j < 16; ++j) {
                const float    y    = x[j] / denom;
                const uint32_t code = ref_encode_e2m1(std::fabs(y)) | (y < 0 ? 8u : 0u);
                const int64_t  kk   = b * 16 + j;
                const uint8_t  byte = codes[r * (k / 2) + kk / 2];
                if (((kk % 2 == 0) ? (byte & 0xF) : (byte >> 4)) != code) ++wrong_codes;
                // |w - deq| <= denom: the widest E2M1 half-gap is 1 (between 4 and 6), and a block
                // scale rounded down by at most 2^-4 lets |y| exceed 6 by at most 0.375.
                if (std::fabs(x[j] - deq[size_t(r * k + kk)]) > denom) ++out_of_bound;
            }
        }
    CHECK(wrong_scales == 0);
    CHECK(wrong_codes == 0);
    CHECK(out_of_bound == 0);
    CHECK(scales[1] == 0x38);  // the zero block got scale 1.0
    CHECK(scales[2] == 0x01);  // the tiny block's scale clamped to 2^-9
    CHECK(codes[1] == 0x00);  // elements 2, 3 = -0.0 encode as +0 like ModelOpt (x < 0 is false)
}

TEST_CASE("quantize_nvfp4 round-trips values on its grid exactly") {
    // global 2^-10 and one block scale of 448 make amax = 6 * 448 * 2^-10, so the recipe recovers
    // global = 2^-10 exactly; every block holds a +-6 so its scale is recovered exactly too.
    Rng           rng(22);
    const int64_t n = 8, k = 64;
    const float   global = std::ldexp(1.0f, -10);
    std::vector<float> w(size_t(n * k));
    for (int64_t r = 0; r < n; ++r)
        for (int64_t b = 0; b < k / 16; ++b) {
            const uint8_t sc = (r == 0 && b == 0) ? 0x7E : uint8_t(rng.uniform_int(0x08, 0x7E));
            for (int j = 0; j < 16; ++j) {
                const uint8_t code = j == 5 ? uint8_t(7 | (rng.bits() & 8)) : uint8_t(rng.bits() & 0xF);
                w[size_t(r * k + b * 16 + j)] = e2m1_to_f32(code) * (e4m3_to_f32(sc) * global);
            }
        }
    const QuantizedWeight q = quantize_nvfp4(w.data(), n, k);
    CHECK(q.weight.global_scale == global);
    const std::vector<float> deq = dequant(q.weight);
    for (size_t i = 0; i < w.size(); ++i)
        if (deq[i] != w[i]) FAIL_CHECK("element " << i);
    CHECK(relative_error(w.data(), q.weight) == 0.0);
}

TEST_CASE("quantize_nvfp4 of an all-zero tensor") {
    std::vector<float>    w(64, 0.0f);
    const QuantizedWeight q = quantize_nvfp4(w.data(), 2, 32);
    CHECK(q.weight.global_scale == 1.0f);
    CHECK(dequant(q.weight) == w);
}

// ---------------------------------------------------------------------------------------------
// INT4

namespace {

struct GroupParams {
    float scale, zero;  // as stored (scale rounded to f16)
};

// The recipes, recomputed from the cited sources (see quantize.h / quantize.cpp).
GroupParams ref_int4_params(const float * x, int64_t count, Int4Scheme scheme, ScaleType st) {
    float lo = 0, hi = 0;
    for (int64_t i = 0; i < count; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
    auto round_to_type = [st](float v) {
        return st == ScaleType::BF16 ? float_of(uint32_t(f32_to_bf16(v)) << 16) : float(ref_f16(f32_to_f16(v)));
    };
    auto f16 = [&](float v) {  // rounded to the scale type; an underflow to 0 becomes the smallest positive
        const float r = round_to_type(v);
        return r != 0.0f || v <= 0.0f ? r : (st == ScaleType::BF16 ? float_of(1u << 16) : float(ref_f16(1)));
    };
    switch (scheme) {
        case Int4Scheme::SymmetricGptq: {  // GPTQ find_params, sym
            hi = std::max(std::fabs(lo), hi);
            if (lo < 0) lo = -hi;
            if (lo == 0 && hi == 0) lo = -1, hi = 1;
            return {f16((hi - lo) / 15), 8};
        }
        case Int4Scheme::SymmetricFullRange: {  // auto-round int.py quant_tensor_sym
            const float m = std::max(-lo, hi);
            float       s = f16(((hi < -lo) ? m : -m) / 8);
            s             = s < 0 ? std::min(s, -1e-5f) : std::max(s, 1e-5f);
            return {f16(s), 8};
        }
        case Int4Scheme::Asymmetric: {  // GPTQ find_params / auto-round quant_tensor_asym
            if (lo == 0 && hi == 0) lo = -1, hi = 1;
            const float s = f16((hi - lo) / 15);
            return {s, std::clamp(std::nearbyint(-lo / s), 0.0f, 15.0f)};
        }
    }
    return {0, 0};
}

float group_min(const std::vector<float> & w, int64_t begin, int64_t count) {
    float m = INFINITY;
    for (int64_t i = 0; i < count; ++i) m = std::min(m, w[size_t(begin + i)]);
    return m;
}

void check_int4_recipe(const std::vector<float> & w, int64_t n, int64_t k, const Int4QuantizeOptions & opt) {
    const QuantizedWeight q  = quantize_int4(w.data(), n, k, opt);
    const QWeight &       qw = q.weight;
    const int64_t         gs = opt.group_size > 0 ? opt.group_size : k;
    REQUIRE(qw.group_size == gs);
    REQUIRE(qw.n_groups == (k + gs - 1) / gs);
    CHECK(qw.zero_offset == 0);
    CHECK((qw.zeros != nullptr) == (opt.scheme == Int4Scheme::Asymmetric));
    const std::vector<float> deq = dequant(qw);
    int64_t wrong_params = 0, wrong_q = 0, out_of_bound = 0;
    for (int64_t nn = 0; nn < n; ++nn)
        for (int64_t g = 0; g < qw.n_groups; ++g) {
            const int64_t     begin = g * gs, end = std::min(k, begin + gs);
            const GroupParams p     = ref_int4_params(w.data() + nn * k + begin, end - begin, opt.scheme, opt.scale_type);
            const float       s     = ref_scale16(static_cast<const uint16_t *>(qw.scales)[g * n + nn], qw.scale_type);
            float             z     = 8;
            if (qw.zeros) z = float(int4_get(static_cast<const uint32_t *>(qw.zeros)[g * (n / 8) + nn / 8], int(nn % 8)));
            if (s != p.scale || z != p.zero) ++wrong_params;
            for (int64_t kk = begin; kk < end; ++kk) {
                const float x    = w[size_t(nn * k + kk)];
                const float want = std::clamp(std::nearbyint(x / s + z), 0.0f, 15.0f);  // round(W / s + z)
                const uint32_t got = int4_get(static_cast<const uint32_t *>(qw.data)[(kk / 8) * n + nn], int(kk % 8));
                if (float(got) != want) ++wrong_q;
                // Rounding costs at most half a step. At the range ends the grid may be short by the
                // rounding of the stored scale (relative 2^-11 for f16) over at most 16 steps, and
                // the full-range grid clamps the opposite end (+8 steps -> 7): one step. GPTQ's
                // symmetric grid is not bounded on a group with no negative value (scale = max / 15
                // but only 7 positive steps), so such groups are skipped.
                const float steps = (opt.scheme == Int4Scheme::SymmetricFullRange ? 1.0f : 0.5f) +
                                    16 * std::ldexp(1.0f, opt.scale_type == ScaleType::BF16 ? -8 : -11);
                if (!(opt.scheme == Int4Scheme::SymmetricGptq && group_min(w, nn * k + begin, end - begin) >= 0) &&
                    std::fabs(x - deq[size_t(nn * k + kk)]) > steps * std::fabs(s))
                    ++out_of_bound;
            }
        }
    CHECK(wrong_params == 0);
    CHECK(wrong_q == 0);
    CHECK(out_of_bound == 0);
}

}  // namespace

TEST_CASE("quantize_int4 follows the GPTQ / AutoRound recipes, every group size and scheme") {
    Rng           rng(23);
    const int64_t n = 24, k = 256;
    std::vector<float> w = gaussian(rng, n * k, 0.02f);
    for (int64_t i = 0; i < 32; ++i) w[size_t(k + i)] = std::fabs(w[size_t(k + i)]);  // a group with no negatives
    for (int64_t i = 0; i < 32; ++i) w[size_t(2 * k + i)] = 0.0f;                    // an all-zero group
    for (Int4Scheme scheme : {Int4Scheme::SymmetricGptq, Int4Scheme::SymmetricFullRange, Int4Scheme::Asymmetric})
        for (int32_t gs : {32, 64, 128, -1}) {
            CAPTURE(int(scheme));
            CAPTURE(gs);
            check_int4_recipe(w, n, k, {gs, scheme, ScaleType::F16});
        }
    // K not a multiple of the group size.
    std::vector<float> w2 = gaussian(rng, 16 * 200, 1.0f);
    check_int4_recipe(w2, 16, 200, {64, Int4Scheme::Asymmetric, ScaleType::F16});
}

TEST_CASE("quantize_int4 GPTQ symmetric: scale is max|w| / 7.5, zero 8") {
    std::vector<float> w(8 * 32, 0.0f);
    w[0] = -1.5f;  // column 0: amax 1.5 on the negative side
    w[1] = 0.75f;
    const QuantizedWeight q = quantize_int4(w.data(), 8, 32, {32, Int4Scheme::SymmetricGptq, ScaleType::F16});
    CHECK(f16_to_f32(static_cast<const uint16_t *>(q.weight.scales)[0]) == f16_to_f32(f32_to_f16(1.5f / 7.5f)));
    // s = f16(0.2) = 0.19995...: -1.5 / s + 8 = 0.498 -> q 0 (-8 steps); 0.75 / s + 8 = 11.75 -> 12.
    const float              s   = f16_to_f32(f32_to_f16(0.2f));
    const std::vector<float> deq = dequant(q.weight);
    CHECK(deq[0] == -8 * s);
    CHECK(deq[1] == 4 * s);
}

TEST_CASE("quantize_int4 full range: the largest magnitude maps to -8 with a signed scale") {
    std::vector<float> w(8 * 32, 0.0f);
    w[0] = 1.0f;  // column 0: positive side dominates -> negative scale
    w[1] = -0.5f;
    w[32] = -2.0f;  // column 1: negative side dominates -> positive scale
    const QuantizedWeight q = quantize_int4(w.data(), 8, 32, {32, Int4Scheme::SymmetricFullRange, ScaleType::F16});
    const uint16_t *      s = static_cast<const uint16_t *>(q.weight.scales);
    CHECK(f16_to_f32(s[0]) == -0.125f);
    CHECK(f16_to_f32(s[1]) == 0.25f);
    const std::vector<float> deq = dequant(q.weight);
    CHECK(deq[0] == 1.0f);
    CHECK(deq[1] == -0.5f);
    CHECK(deq[32] == -2.0f);
}

// GPTQ's symmetric grid is not a fixed point of its own recipe (scale amax / 7.5, but the grid's
// negative end is 8 steps), so only the other two schemes round-trip.
TEST_CASE("quantize_int4 round-trips values on its grid exactly (asymmetric, full range)") {
    Rng           rng(24);
    const int64_t n = 16, k = 64, gs = 32;
    for (Int4Scheme scheme : {Int4Scheme::Asymmetric, Int4Scheme::SymmetricFullRange}) {
        CAPTURE(int(scheme));
        std::vector<float> w(size_t(n * k));
        for (int64_t r = 0; r < n; ++r)
            for (int64_t g = 0; g < k / gs; ++g) {
                const float s = f16_to_f32(f32_to_f16(rng.uniform(0.001f, 0.05f)));
                const int   z = scheme == Int4Scheme::Asymmetric ? rng.uniform_int(0, 15) : 8;
                for (int64_t i = 0; i < gs; ++i) {
                    // both ends of the range present: q = 0 and q = 15 (asym), q = 0 (-8 steps, full range)
                    int qv = rng.uniform_int(0, 15);
                    if (i == 0) qv = 0;
                    if (i == 1 && scheme == Int4Scheme::Asymmetric) qv = 15;
                    w[size_t(r * k + g * gs + i)] = s * float(qv - z);
                }
            }
        const QuantizedWeight q = quantize_int4(w.data(), n, k, {int32_t(gs), scheme, ScaleType::F16});
        CHECK(dequant(q.weight) == w);
        CHECK(relative_error(w.data(), q.weight) == 0.0);
    }
}

TEST_CASE("quantize_int4 of groups too small for the scale type") {
    // (max - min) / 15 below half the smallest f16 subnormal (2^-25) rounds to 0 in f16: GPTQ would
    // divide by zero. The scale becomes 2^-24 and every value stays finite.
    std::vector<float> w(8 * 32);
    for (size_t i = 0; i < w.size(); ++i) w[i] = 1e-9f * float(int(i % 7) - 3);
    for (Int4Scheme scheme : {Int4Scheme::SymmetricGptq, Int4Scheme::Asymmetric}) {
        CAPTURE(int(scheme));
        const QuantizedWeight q = quantize_int4(w.data(), 8, 32, {32, scheme, ScaleType::F16});
        CHECK(static_cast<const uint16_t *>(q.weight.scales)[0] == 0x0001);
        for (float x : dequant(q.weight)) CHECK(std::fabs(x) <= std::ldexp(1.0f, -24) * 8);
        check_int4_recipe(w, 8, 32, {32, scheme, ScaleType::F16});
    }
}

TEST_CASE("quantize_int4 with bf16 scales") {
    Rng                   rng(25);
    std::vector<float>    w = gaussian(rng, 8 * 64, 0.02f);
    const QuantizedWeight q = quantize_int4(w.data(), 8, 64, {32, Int4Scheme::Asymmetric, ScaleType::BF16});
    CHECK(q.weight.scale_type == ScaleType::BF16);
    for (Int4Scheme scheme : {Int4Scheme::SymmetricGptq, Int4Scheme::SymmetricFullRange, Int4Scheme::Asymmetric})
        check_int4_recipe(w, 8, 64, {32, scheme, ScaleType::BF16});
    // bf16 scales: the stored scale is bf16((max' - min') / 15).
    float lo = 0, hi = 0;
    for (int i = 0; i < 32; ++i) lo = std::min(lo, w[size_t(i)]), hi = std::max(hi, w[size_t(i)]);
    CHECK(static_cast<const uint16_t *>(q.weight.scales)[0] == f32_to_bf16((hi - lo) / 15));
    CHECK(relative_error(w.data(), q.weight) < 0.2);
}

// ---------------------------------------------------------------------------------------------
// FP8

TEST_CASE("quantize_fp8: scale amax / 448 per block, codes e4m3(w / scale), partial edge blocks") {
    Rng                      rng(26);
    const int64_t            n = 200, k = 300;
    const std::vector<float> w = gaussian(rng, n * k, 0.02f);
    struct Block {
        int32_t bn, bk;
    };
    for (Block b : {Block{128, 128}, Block{1, int32_t(k)}, Block{int32_t(n), int32_t(k)}}) {
        CAPTURE(b.bn);
        CAPTURE(b.bk);
        const QuantizedWeight q  = quantize_fp8(w.data(), n, k, b.bn, b.bk);
        const int64_t         kb = (k + b.bk - 1) / b.bk, nb = (n + b.bn - 1) / b.bn;
        REQUIRE(q.scales.size() == size_t(nb * kb * 4));
        const float *            scales = static_cast<const float *>(q.weight.scales);
        const uint8_t *          codes  = static_cast<const uint8_t *>(q.weight.data);
        const std::vector<float> deq    = dequant(q.weight);
        int64_t                  wrong_scale = 0, wrong_code = 0, out_of_bound = 0;
        for (int64_t i = 0; i < nb; ++i)
            for (int64_t j = 0; j < kb; ++j) {
                float amax = 0;
                for (int64_t r = i * b.bn; r < std::min(n, (i + 1) * b.bn); ++r)
                    amax = std::max(amax, amax_of(w.data() + r * k + j * b.bk, std::min(k, (j + 1) * b.bk) - j * b.bk));
                if (scales[i * kb + j] != amax / 448.0f) ++wrong_scale;
            }
        for (int64_t r = 0; r < n; ++r)
            for (int64_t c = 0; c < k; ++c) {
                const float s = scales[(r / b.bn) * kb + c / b.bk];
                const float x = w[size_t(r * k + c)];
                if (codes[r * k + c] != ref_encode_e4m3(x / s)) ++wrong_code;
                // Half an E4M3 step: 2^-4 relative for normals, 2^-10 * s in the subnormal range.
                // (with a little room for the rounding of x / s and of the product).
                if (std::fabs(x - deq[size_t(r * k + c)]) > std::max(std::fabs(x) * 0.0626f, std::ldexp(s, -10) * 1.001f))
                    ++out_of_bound;
            }
        CHECK(wrong_scale == 0);
        CHECK(wrong_code == 0);
        CHECK(out_of_bound == 0);
    }
}

TEST_CASE("quantize_fp8 round-trips values on its grid exactly") {
    Rng           rng(27);
    const int64_t n = 130, k = 140;  // 2 x 2 blocks of 128, partial edges
    std::vector<float> w(size_t(n * k));
    const float        block_scale[4] = {0.5f, 3e-3f, 1.0f / 3, 1e-6f};
    for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < k; ++c) {
            uint8_t code = uint8_t(rng.bits());
            if ((code & 0x7F) == 0x7F) code = 0x7E;
            w[size_t(r * k + c)] = e4m3_to_f32(code) * block_scale[(r / 128) * 2 + c / 128];
        }
    for (int i = 0; i < 4; ++i) w[size_t((i / 2) * 128 * k + (i % 2) * 128)] = 448.0f * block_scale[i];  // amax = 448 s
    const QuantizedWeight q = quantize_fp8(w.data(), n, k, 128, 128);
    for (int i = 0; i < 4; ++i) CHECK(static_cast<const float *>(q.weight.scales)[i] == block_scale[i]);
    CHECK(dequant(q.weight) == w);
}

TEST_CASE("relative_error is ||W - deq|| / ||W||") {
    Rng                      rng(28);
    const std::vector<float> w = gaussian(rng, 72 * 64, 1.0f);  // 72 rows: more than one 64-row tile
    const QuantizedWeight    q = quantize_int4(w.data(), 72, 64, {32, Int4Scheme::Asymmetric, ScaleType::F16});
    const std::vector<float> d = dequant(q.weight);
    double                   num = 0, den = 0;
    for (size_t i = 0; i < w.size(); ++i) num += (double(w[i]) - d[i]) * (double(w[i]) - d[i]), den += double(w[i]) * w[i];
    CHECK(relative_error(w.data(), q.weight) == doctest::Approx(std::sqrt(num / den)).epsilon(1e-12));
    CHECK(relative_error(w.data(), q.weight) > 0.0);
}
