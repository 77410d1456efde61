// Bit-level tests of src/quant/formats.h against the format definitions (quant_reference.h).
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>

#include "quant/formats.h"
#include "quant_reference.h"

using namespace spark;
using namespace spark::test;

namespace {

// Visits a deterministic spread of f32 bit patterns: every `stride`-th pattern of the whole space
// (both signs, subnormals, inf, NaN) plus every pattern of the band [lo, hi] of magnitudes.
template <typename F> void for_f32_sample(uint32_t stride, float lo, float hi, F && f) {
    for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += stride) f(float_of(uint32_t(u)));
    for (uint32_t u = bits_of(lo); u <= bits_of(hi); u += 13) {
        f(float_of(u));
        f(-float_of(u));
    }
}

float up(float x) { return std::nextafter(x, INFINITY); }
float down(float x) { return std::nextafter(x, -INFINITY); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// E2M1

TEST_CASE("E2M1 decode: all 16 codes") {
    const float expected[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};  // formats.md §2.1
    for (uint8_t c = 0; c < 16; ++c) {
        CAPTURE(int(c));
        const float v = e2m1_to_f32(c);
        CHECK(v == (c & 8 ? -expected[c & 7] : expected[c & 7]));
        CHECK(double(v) == ref_e2m1(c));
        CHECK(std::signbit(v) == bool(c & 8));  // code 8 is -0.0
    }
}

TEST_CASE("E2M1 encode: every tie rounds to the even code, neighbours to the nearer value") {
    struct Tie {
        float   at;
        uint8_t below, above, tie;  // code just below, just above, at the tie
    };
    // Round to nearest even on the magnitude: ties 0.25, 1.25, 2.5, 5.0 go down, 0.75, 1.75, 3.5 up.
    const Tie ties[] = {
        {0.25f, 0, 1, 0}, {0.75f, 1, 2, 2}, {1.25f, 2, 3, 2}, {1.75f, 3, 4, 4},
        {2.5f, 4, 5, 4},  {3.5f, 5, 6, 6},  {5.0f, 6, 7, 6},
    };
    for (const Tie & t : ties) {
        CAPTURE(t.at);
        CHECK(f32_to_e2m1(t.at) == t.tie);
        CHECK(f32_to_e2m1(down(t.at)) == t.below);
        CHECK(f32_to_e2m1(up(t.at)) == t.above);
        CHECK(f32_to_e2m1(-t.at) == (t.tie | 8));
        CHECK(f32_to_e2m1(-down(t.at)) == (t.below | 8));
        CHECK(f32_to_e2m1(-up(t.at)) == (t.above | 8));
        CHECK(ref_encode_e2m1(t.at) == t.tie);  // the reference agrees with the table
    }
}

TEST_CASE("E2M1 encode: saturation, signed zero, NaN") {
    CHECK(f32_to_e2m1(6.0f) == 7);
    CHECK(f32_to_e2m1(6.5f) == 7);
    CHECK(f32_to_e2m1(1e30f) == 7);
    CHECK(f32_to_e2m1(FLT_MAX) == 7);
    CHECK(f32_to_e2m1(INFINITY) == 7);
    CHECK(f32_to_e2m1(-INFINITY) == 15);
    CHECK(f32_to_e2m1(-7.0f) == 15);
    CHECK(f32_to_e2m1(0.0f) == 0);
    CHECK(f32_to_e2m1(-0.0f) == 8);                  // sign from the sign bit
    CHECK(f32_to_e2m1(-1e-30f) == 8);                // underflow keeps the sign
    CHECK(f32_to_e2m1(float_of(0x80000001u)) == 8);  // negative subnormal
    CHECK(f32_to_e2m1(float_of(0x00000001u)) == 0);
    // NaN: E2M1 has none; satfinite gives +MAX_NORM whatever the NaN's sign (cuda_fp4.hpp).
    CHECK(f32_to_e2m1(float_of(0x7FC00000u)) == 7);
    CHECK(f32_to_e2m1(float_of(0xFFC00000u)) == 7);
    CHECK(f32_to_e2m1(float_of(0x7F800001u)) == 7);  // signaling
    CHECK(f32_to_e2m1(float_of(0xFFFFFFFFu)) == 7);
}

TEST_CASE("E2M1 encode matches nearest-even over a spread of f32 inputs") {
    int64_t checked = 0, wrong = 0;
    for_f32_sample(4099, 0.125f, 8.0f, [&](float x) {
        if (std::isnan(x)) return;
        ++checked;
        if (f32_to_e2m1(x) != ref_encode_e2m1(x)) ++wrong;
    });
    CHECK(checked > 1000000);
    CHECK(wrong == 0);
}

TEST_CASE("E2M1 round trip and packing (element 2i in the low nibble)") {
    for (uint8_t c = 0; c < 16; ++c) CHECK(f32_to_e2m1(e2m1_to_f32(c)) == c);
    CHECK(pack_e2m1x2(0x1, 0x2) == 0x21);
    CHECK(pack_e2m1x2(0xF, 0x0) == 0x0F);
    CHECK(f32x2_to_e2m1x2(0.5f, -6.0f) == 0xF1);  // even 0.5 -> low nibble 1, odd -6 -> high F
    CHECK(f32x2_to_e2m1x2(-6.0f, 0.5f) == 0x1F);
}

// ---------------------------------------------------------------------------------------------
// E4M3

TEST_CASE("E4M3 decode: all 256 codes") {
    for (int c = 0; c < 256; ++c) {
        CAPTURE(c);
        const float  v   = e4m3_to_f32(uint8_t(c));
        const double ref = ref_e4m3(uint32_t(c));
        if (std::isnan(ref)) {
            CHECK(std::isnan(v));
        } else {
            CHECK(double(v) == ref);
            CHECK(std::signbit(v) == bool(c & 0x80));
        }
    }
    CHECK(e4m3_to_f32(0x01) == std::ldexp(1.0f, -9));  // smallest subnormal
    CHECK(e4m3_to_f32(0x07) == 7.0f * std::ldexp(1.0f, -9));
    CHECK(e4m3_to_f32(0x08) == std::ldexp(1.0f, -6));  // smallest normal
    CHECK(e4m3_to_f32(0x7E) == 448.0f);
    CHECK(e4m3_to_f32(0xFE) == -448.0f);
    CHECK(e4m3_to_f32(0x38) == 1.0f);
    CHECK(same_bits(e4m3_to_f32(0x80), -0.0f));
    CHECK(std::isnan(e4m3_to_f32(0x7F)));
    CHECK(std::isnan(e4m3_to_f32(0xFF)));
}

TEST_CASE("E4M3 encode: round trip of every finite code") {
    for (int c = 0; c < 256; ++c) {
        if ((c & 0x7F) == 0x7F) continue;
        CAPTURE(c);
        CHECK(f32_to_e4m3(e4m3_to_f32(uint8_t(c))) == c);
    }
}

TEST_CASE("E4M3 encode: midpoints round to the even code, neighbours to the nearer value") {
    for (int c = 0; c < 0x7E; ++c) {
        const float lo = float(ref_e4m3(uint32_t(c))), hi = float(ref_e4m3(uint32_t(c + 1)));
        const float mid = (lo + hi) / 2;  // at most 5 significant bits: exact
        CAPTURE(c);
        CHECK(double(mid) == (ref_e4m3(uint32_t(c)) + ref_e4m3(uint32_t(c + 1))) / 2);
        CHECK(f32_to_e4m3(mid) == (c % 2 == 0 ? c : c + 1));
        CHECK(f32_to_e4m3(down(mid)) == c);
        CHECK(f32_to_e4m3(up(mid)) == c + 1);
        CHECK(f32_to_e4m3(-mid) == ((c % 2 == 0 ? c : c + 1) | 0x80));
    }
    // The first midpoint, 2^-10, is a tie between 0 and 2^-9: down to 0.
    CHECK(f32_to_e4m3(std::ldexp(1.0f, -10)) == 0x00);
    CHECK(f32_to_e4m3(up(std::ldexp(1.0f, -10))) == 0x01);
}

TEST_CASE("E4M3 encode: saturation, signed zero, NaN") {
    CHECK(f32_to_e4m3(448.0f) == 0x7E);
    CHECK(f32_to_e4m3(up(448.0f)) == 0x7E);
    CHECK(f32_to_e4m3(464.0f) == 0x7E);  // would be the midpoint towards 480 (a NaN code)
    CHECK(f32_to_e4m3(465.0f) == 0x7E);
    CHECK(f32_to_e4m3(1e6f) == 0x7E);
    CHECK(f32_to_e4m3(FLT_MAX) == 0x7E);
    CHECK(f32_to_e4m3(INFINITY) == 0x7E);
    CHECK(f32_to_e4m3(-INFINITY) == 0xFE);
    CHECK(f32_to_e4m3(-1000.0f) == 0xFE);
    CHECK(f32_to_e4m3(0.0f) == 0x00);
    CHECK(f32_to_e4m3(-0.0f) == 0x80);
    CHECK(f32_to_e4m3(-1e-30f) == 0x80);
    CHECK(f32_to_e4m3(float_of(0x7FC00000u)) == 0x7F);  // NaN -> canonical 0x7F, either sign
    CHECK(f32_to_e4m3(float_of(0xFFC00000u)) == 0x7F);
    CHECK(f32_to_e4m3(float_of(0x7F800001u)) == 0x7F);
}

TEST_CASE("E4M3 encode matches nearest-even with saturation over a spread of f32 inputs") {
    int64_t checked = 0, wrong = 0;
    for_f32_sample(4099, std::ldexp(1.0f, -11), 480.0f, [&](float x) {
        if (std::isnan(x)) return;
        ++checked;
        if (f32_to_e4m3(x) != ref_encode_e4m3(x)) ++wrong;
    });
    CHECK(checked > 1000000);
    CHECK(wrong == 0);
}

// ---------------------------------------------------------------------------------------------
// E5M2, UE8M0

TEST_CASE("E5M2 decode: all 256 codes") {
    for (int c = 0; c < 256; ++c) {
        CAPTURE(c);
        const float  v   = e5m2_to_f32(uint8_t(c));
        const double ref = ref_e5m2(uint32_t(c));
        if (std::isnan(ref))
            CHECK(std::isnan(v));
        else
            CHECK(double(v) == ref);
    }
    CHECK(e5m2_to_f32(0x01) == std::ldexp(1.0f, -16));
    CHECK(e5m2_to_f32(0x7B) == 57344.0f);
    CHECK(e5m2_to_f32(0x7C) == INFINITY);
}

TEST_CASE("UE8M0 decode") {
    CHECK(ue8m0_to_f32(127) == 1.0f);
    CHECK(ue8m0_to_f32(128) == 2.0f);
    CHECK(ue8m0_to_f32(0) == std::ldexp(1.0f, -127));
    CHECK(ue8m0_to_f32(254) == std::ldexp(1.0f, 127));
    CHECK(std::isnan(ue8m0_to_f32(255)));
}

// ---------------------------------------------------------------------------------------------
// BF16

namespace {
// Nearest bf16 by comparing the two bf16 neighbours of x in double; ties to the even code;
// overflow past the last finite bf16 by half an ulp or more becomes inf (IEEE RNE).
uint16_t ref_f32_to_bf16(float x) {
    const uint32_t u  = bits_of(x);
    const uint32_t lo = u & 0xFFFF0000u, hi = lo + 0x10000u;
    const double   dx = std::fabs(double(x));
    const double   dl = dx - std::fabs(double(float_of(lo)));
    // hi may be the inf pattern: treat it as the value 2^128 for the comparison (IEEE overflow rule).
    const double vhi = ((hi & 0x7FFFFFFFu) == 0x7F800000u) ? std::ldexp(1.0, 128) : std::fabs(double(float_of(hi)));
    const double dh  = vhi - dx;
    if (dl < dh) return uint16_t(lo >> 16);
    if (dh < dl) return uint16_t(hi >> 16);
    return uint16_t(((lo >> 16) & 1u) ? hi >> 16 : lo >> 16);
}
}  // namespace

TEST_CASE("BF16 <-> F32") {
    CHECK(bf16_to_f32(0x3F80) == 1.0f);
    CHECK(bf16_to_f32(0xC000) == -2.0f);
    CHECK(bf16_to_f32(0x0001) == std::ldexp(1.0f, -133));  // subnormal
    CHECK(bf16_to_f32(0x7F80) == INFINITY);
    CHECK(std::isnan(bf16_to_f32(0x7FC0)));
    // RNE ties: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> 1 (even); 1 + 3*2^-8 -> 1 + 2^-6.
    CHECK(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);
    CHECK(f32_to_bf16(up(1.0f + std::ldexp(1.0f, -8))) == 0x3F81);
    CHECK(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);
    // Ties among subnormals: half of 0x0001, and between 0x0001 and 0x0002.
    CHECK(f32_to_bf16(float_of(0x00008000u)) == 0x0000);
    CHECK(f32_to_bf16(float_of(0x00008001u)) == 0x0001);
    CHECK(f32_to_bf16(float_of(0x00018000u)) == 0x0002);
    CHECK(f32_to_bf16(float_of(0x80018000u)) == 0x8002);
    // Overflow: the last finite bf16 is 0x7F7F; its upper midpoint rounds (to even) to inf.
    CHECK(f32_to_bf16(float_of(0x7F7F7FFFu)) == 0x7F7F);
    CHECK(f32_to_bf16(float_of(0x7F7F8000u)) == 0x7F80);
    CHECK(f32_to_bf16(FLT_MAX) == 0x7F80);
    CHECK(f32_to_bf16(-INFINITY) == 0xFF80);
    CHECK(f32_to_bf16(-0.0f) == 0x8000);
    // NaN stays NaN, made quiet, sign kept (a payload only in the low 16 bits must not become inf).
    for (uint32_t nan : {0x7F800001u, 0x7FC00000u, 0xFF800001u, 0x7FFFFFFFu}) {
        const uint16_t h = f32_to_bf16(float_of(nan));
        CAPTURE(nan);
        CHECK((h & 0x7F80) == 0x7F80);
        CHECK((h & 0x0040) != 0);
        CHECK((h >> 15) == (nan >> 31));
    }
    // Every non-NaN bf16 round-trips.
    for (uint32_t h = 0; h < 0x10000; ++h) {
        if ((h & 0x7FFF) > 0x7F80) continue;
        if (f32_to_bf16(bf16_to_f32(uint16_t(h))) != h) FAIL_CHECK("round trip " << h);
    }
    int64_t wrong = 0;
    for_f32_sample(4099, 0.5f, 4.0f, [&](float x) {
        if (!std::isnan(x) && f32_to_bf16(x) != ref_f32_to_bf16(x)) ++wrong;
    });
    CHECK(wrong == 0);
}

// ---------------------------------------------------------------------------------------------
// F16

namespace {
// Nearest finite f16 (ties to even), or inf from 65520 (= 65504 + half an ulp) on.
uint16_t ref_f32_to_f16(float x) {
    static const std::vector<double> v = f16_finite_magnitudes();
    const double                     a = std::fabs(double(x));
    const uint16_t                   s = std::signbit(x) ? 0x8000 : 0;
    if (a >= 65520.0) return s | 0x7C00;
    return uint16_t(s | nearest_code(a, v));
}
}  // namespace

TEST_CASE("F16 decode: all 65536 codes") {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float  v   = f16_to_f32(uint16_t(h));
        const double ref = ref_f16(h);
        if (std::isnan(ref) ? !std::isnan(v) : (double(v) != ref || std::signbit(v) != bool(h & 0x8000)))
            FAIL_CHECK("f16 code " << h);
    }
    CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));
    CHECK(f16_to_f32(0x03FF) == 1023 * std::ldexp(1.0f, -24));
    CHECK(f16_to_f32(0x0400) == std::ldexp(1.0f, -14));
    CHECK(f16_to_f32(0x7BFF) == 65504.0f);
    CHECK(f16_to_f32(0xFC00) == -INFINITY);
}

TEST_CASE("F16 encode: RNE, subnormals, overflow, NaN") {
    CHECK(f32_to_f16(1.0f) == 0x3C00);
    CHECK(f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);  // tie -> even
    CHECK(f32_to_f16(up(1.0f + std::ldexp(1.0f, -11))) == 0x3C01);
    CHECK(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02);  // tie -> even (up)
    CHECK(f32_to_f16(std::ldexp(1.0f, -24)) == 0x0001);
    CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000);  // tie between 0 and 2^-24
    CHECK(f32_to_f16(up(std::ldexp(1.0f, -25))) == 0x0001);
    CHECK(f32_to_f16(3 * std::ldexp(1.0f, -25)) == 0x0002);  // tie between 1 and 2 ulps -> 2
    CHECK(f32_to_f16(-3 * std::ldexp(1.0f, -25)) == 0x8002);
    CHECK(f32_to_f16(down(std::ldexp(1.0f, -14))) == 0x0400);  // rounds up into the normals
    CHECK(f32_to_f16(float_of(1)) == 0x0000);                 // f32 subnormal
    CHECK(f32_to_f16(65504.0f) == 0x7BFF);
    CHECK(f32_to_f16(down(65520.0f)) == 0x7BFF);
    CHECK(f32_to_f16(65520.0f) == 0x7C00);
    CHECK(f32_to_f16(1e10f) == 0x7C00);
    CHECK(f32_to_f16(-INFINITY) == 0xFC00);
    CHECK(f32_to_f16(-0.0f) == 0x8000);
    for (uint32_t nan : {0x7F800001u, 0x7FC00000u, 0xFF800001u}) {
        const uint16_t h = f32_to_f16(float_of(nan));
        CAPTURE(nan);
        CHECK((h & 0x7C00) == 0x7C00);
        CHECK((h & 0x0200) != 0);  // quiet
        CHECK((h >> 15) == (nan >> 31));
    }
    for (uint32_t h = 0; h < 0x10000; ++h) {
        if ((h & 0x7FFF) > 0x7C00) continue;
        if (f32_to_f16(f16_to_f32(uint16_t(h))) != h) FAIL_CHECK("round trip " << h);
    }
}

TEST_CASE("F16 encode matches nearest-even over a spread of f32 inputs") {
    int64_t checked = 0, wrong = 0;
    for_f32_sample(4099, std::ldexp(1.0f, -26), std::ldexp(1.0f, -13), [&](float x) {
        if (std::isnan(x)) return;
        ++checked;
        if (f32_to_f16(x) != ref_f32_to_f16(x)) ++wrong;
    });
    CHECK(checked > 1000000);
    CHECK(wrong == 0);
}

// ---------------------------------------------------------------------------------------------
// Nibbles

TEST_CASE("int4_get / int4_set: element j in bits [4j, 4j+4)") {
    const uint32_t word = 0x76543210u;
    for (int j = 0; j < 8; ++j) CHECK(int4_get(word, j) == uint32_t(j));
    uint32_t w = 0;
    for (int j = 0; j < 8; ++j) w = int4_set(w, j, uint32_t(15 - j));
    CHECK(w == 0x89ABCDEFu);
    CHECK(int4_set(0xFFFFFFFFu, 3, 0) == 0xFFFF0FFFu);
    CHECK(int4_set(0, 0, 0x1F) == 0xFu);  // only the low 4 bits of the value are stored
}
