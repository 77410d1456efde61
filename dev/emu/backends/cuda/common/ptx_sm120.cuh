// Emulator stand-in for src/backends/cuda/common/ptx_sm120.cuh (found first on the include path of
// every kernel lab: -Idev/emu comes before -Isrc): the same two wrappers, with the same names and
// the same guard (they exist only where common/arch.h's SPARK_ARCH_FP4_MMA_SYNC is 1, i.e. in a lab
// that emulates an sm_120a pass with SPARK_EMU_CUDA_ARCH, see arch.h beside this file), with the
// semantics the PTX ISA gives the instructions, on the fiber runtime (emu_runtime.h). The mma is a
// warp collective: every lane contributes its A / B / scale registers, every lane receives its D
// fragment.
//
// What is from the PTX ISA, what from CUTLASS, what is assumed:
//   cvt.rn.satfinite.e2m1x2.f32 d, a, b   (PTX ISA 8.7+ `cvt`): a and b rounded to nearest, ties to
//       even, onto the E2M1 grid {0, 0.5, 1, 1.5, 2, 3, 4, 6} with saturation to +-6 (inf too), the
//       sign kept (-0.0 and tiny negatives give -0, code 8); a in the upper nibble of d, b in the
//       lower. NaN gives +6 (code 7): the CUDA 13 toolkit's emulation of the instruction
//       (cuda_fp4.hpp) says so; the PTX ISA only says the result saturates, and no silicon was
//       asked. Written here from that definition (grid midpoints), not with quant/formats.h's
//       f32_to_e2m1, so the lab's comparison of the two is a check of both.
//   mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3
//       D = (A * SFA) (B * SFB) + C (PTX ISA "Block Scaling for mma.sync"): A 16x64 and B 64x8 E2M1,
//       one UE4M3 scale per row of A (SFA, 16x4) and per column of B (SFB, 4x8) for each 16 K.
//       Fragment layouts (lane l, g = l / 4, t = l % 4), as CUTLASS's SM120_16x8x64_TN_VS traits
//       (cute/atom/mma_traits_sm120.hpp) give them:
//         ALayout  ((4,8),(8,2,2)) : ((128,1),(16,8,512)) over (M16,K64) column-major:
//                  register r, nibble j of lane l holds A[g + 8 (r % 2)][8t + 32 (r / 2) + j]
//         BLayout  ((4,8),(8,2)) : ((64,1),(8,256)) over (N8,K64):
//                  register r, nibble j holds B[8t + 32 r + j][g]
//         CLayout  SM80_16x8_Row: d[i] = D[g + 8 (i / 2)][2t + i % 2]
//         SFALayout ((2,2,8),64) : ((8,0,1),16): lane l holds row g + 8 (l % 2)'s scales, the same
//                  for lanes 4g, 4g+2 and 4g+1, 4g+3 (the "2:0 mode"); byte j = K block j
//         SFBLayout ((4,8),64) : ((0,1),8): lane l holds column g's scales (all four lanes of the
//                  quad the same); byte j = K block j
//       Which lanes the hardware actually reads is the PTX selector's business: with {byte-id,
//       thread-id} = {0, 0} (what spark and CUTLASS pass) the A scales come from lanes 4g (row g)
//       and 4g + 1 (row g + 8) and the B scales from lane 4g; the emulator reads only those, so a
//       kernel whose other lanes hold different values is not caught (spark's lanes all hold the
//       right values). ASSUMPTION: that reading of the selector; K block j = byte j of the
//       register; nibble j = bits [4j, 4j + 4) (CUTLASS packs sub-byte values from the low bits).
//       Scale bytes with bit 7 set (not a UE4M3 value) or 0x7F (NaN) are not modelled: the
//       emulator dies.
//       Accumulation: the products are exact (E2M1 x E2M1 x E4M3 x E4M3 has at most 12 significant
//       bits, between 2^-20 and 6*6*448*448 < 2^23), so is their sum in double (multiples of
//       2^-20 below 64 * 2^23: 49 bits, any order). ASSUMPTION (the tensor core's adder is not
//       documented bit for bit): D = C + that exact sum, rounded ONCE to f32, to nearest even
//       (emu::nvf4_add below). Real hardware may add in another order, align to the largest term
//       and truncate (as Hopper's f16 MMA does: emu::mma_sum in ptx_sm80.cuh), or round per
//       16-K block; each of those differs from this model by a few f32 ulps of the largest term
//       per MMA. dev/kernels/fp4/emu_w4a4.cpp's CPU reference adds in the same model (independently
//       written), so its comparisons are bit for bit; tests/cuda/test_fp4.cpp on real hardware
//       compares with a tolerance for this reason.
#pragma once

#include "backends/cuda/common/arch.h"
#include "emu_runtime.h"  // dev/emu

#include <cmath>
#include <cstdint>

namespace emu {

// ---- cvt.rn.satfinite.e2m1x2.f32, one element: the E2M1 code of x.
inline uint8_t cvt_rn_satfinite_e2m1(float x) {
    if (std::isnan(x)) return 7;  // +6 (see above)
    const uint8_t sign = std::signbit(x) ? 8 : 0;
    const double  a    = std::fabs(double(x));
    static const double grid[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    if (a >= 6.0) return uint8_t(sign | 7);  // satfinite (inf included)
    uint8_t c = 0;
    while (a >= grid[c + 1]) ++c;  // grid[c] <= a < grid[c + 1]
    const double below = a - grid[c], above = grid[c + 1] - a;  // exact (double has room for both)
    // Nearest; a tie goes to the even code (an even mantissa bit: the code's lowest bit).
    const uint8_t code = below < above ? c : above < below ? uint8_t(c + 1) : (c % 2 == 0 ? c : uint8_t(c + 1));
    return uint8_t(sign | code);
}
// d = cvt.rn.satfinite.e2m1x2.f32(a, b): a in the upper nibble, b in the lower.
inline uint8_t cvt_rn_satfinite_e2m1x2_f32(float a, float b) {
    return uint8_t((cvt_rn_satfinite_e2m1(a) << 4) | cvt_rn_satfinite_e2m1(b));
}

// ---- the MMA's operand decoders (exact; from the format definitions, as tables)
struct Nvf4Tables {
    double e2m1[16];    // E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (code 8 is -0)
    double ue4m3[128];  // UE4M3: eeee mmm, bias 7, subnormals m 2^-9, max 448 (0x7E); 0x7F NaN
    Nvf4Tables() {
        const double mag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
        for (int c = 0; c < 16; ++c) e2m1[c] = c & 8 ? -mag[c & 7] : mag[c & 7];
        for (int c = 0; c < 128; ++c) {
            const int e = c >> 3, m = c & 7;
            ue4m3[c] = e == 0 ? std::ldexp(double(m), -9) : std::ldexp(1.0 + m / 8.0, e - 7);
        }
    }
};
inline const Nvf4Tables & nvf4_tables() {
    static const Nvf4Tables t;
    return t;
}
inline double ue4m3_value(uint32_t code) {
    if ((code & 0x80u) != 0) emu::die("mma kind::mxf4nvf4: UE4M3 scale byte with bit 7 set (not modelled)");
    if (code == 0x7Fu) emu::die("mma kind::mxf4nvf4: UE4M3 scale is NaN (0x7F, not modelled)");
    return nvf4_tables().ue4m3[code];
}

// ---- The accumulate model: round_to_nearest_even_f32(c + s), c an f32 accumulator, s the exact
// sum of an MMA's products (a double), with ONE rounding. c + s in double can be inexact (c's
// exponent is anything), so the error of the double sum is kept (two-sum) and decides the ties
// that the double sum alone could land on exactly.
inline float nvf4_add(float c, double s) {
    const double a = c, hi = a + s;
    const double bb = hi - a, lo = (a - (hi - bb)) + (s - bb);  // hi + lo == a + s exactly
    const float  f  = float(hi);                                 // RNE
    if (lo == 0.0 || !std::isfinite(f)) return f;
    const double fd = f;
    if (fd == hi) return f;  // hi is an f32: a + s is within 2^-29 f32 ulps of it
    const float  other = std::nextafter(f, hi > fd ? INFINITY : -INFINITY);  // the f32 on hi's other side
    const double mid   = (fd + double(other)) * 0.5;                           // exact
    if (hi != mid) return f;  // not on a midpoint: a + s rounds like hi (no f32 midpoint between them)
    return (lo > 0.0) == (double(other) > fd) ? other : f;  // the exact value lies on lo's side of the tie
}

}  // namespace emu

namespace spark::cuda::ptx {

#if SPARK_ARCH_FP4_MMA_SYNC

// The wrapper's asm, instruction by instruction: cvt ... q0, %2, %1 (v1 upper, v0 lower nibble) ...
// mov.b32 %0, {q0, q1, q2, q3} (q0 the lowest byte). dev/kernels/fp4/emu_w4a4.cpp checks that the
// real header still says exactly that.
inline uint32_t cvt_e2m1x8(float v0, float v1, float v2, float v3, float v4, float v5, float v6, float v7) {
    const uint32_t q0 = emu::cvt_rn_satfinite_e2m1x2_f32(v1, v0);
    const uint32_t q1 = emu::cvt_rn_satfinite_e2m1x2_f32(v3, v2);
    const uint32_t q2 = emu::cvt_rn_satfinite_e2m1x2_f32(v5, v4);
    const uint32_t q3 = emu::cvt_rn_satfinite_e2m1x2_f32(v7, v6);
    return q0 | (q1 << 8) | (q2 << 16) | (q3 << 24);
}

// D = C + (A * SFA)(B * SFB) for the warp's 16x8 tile; d is C on entry and D on return.
inline void mma_m16n8k64_nvf4(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], uint32_t sfa, uint32_t sfb) {
    emu::Warp & w = emu::warp();
    const int   l = emu::lane();
    for (int i = 0; i < 4; ++i) w.u[l][i] = a[i];
    w.u[l][4] = b[0];
    w.u[l][5] = b[1];
    w.u[l][6] = sfa;
    w.u[l][7] = sfb;
    emu::warp_sync();
    const double * e2m1 = emu::nvf4_tables().e2m1;
    auto nib = [](uint32_t reg, int j) { return (reg >> (4 * j)) & 0xFu; };
    auto byte = [](uint32_t reg, int j) { return (reg >> (8 * j)) & 0xFFu; };
    // A[row][k] * SFA[row][k / 16] and B[k][col] * SFB[k / 16][col], from the lanes that hold them.
    auto a_row = [&](int row, double (&v)[64]) {
        const uint32_t sf = w.u[(row % 8) * 4 + row / 8][6];  // thread-id-a = 0: lanes 4g (row g), 4g + 1 (row g + 8)
        for (int k = 0; k < 64; k += 8) {
            const uint32_t reg = w.u[(row % 8) * 4 + (k % 32) / 8][row / 8 + 2 * (k / 32)];
            const double   s   = emu::ue4m3_value(byte(sf, k / 16));
            for (int j = 0; j < 8; ++j) v[k + j] = e2m1[nib(reg, j)] * s;
        }
    };
    auto b_col = [&](int col, double (&v)[64]) {
        const uint32_t sf = w.u[col * 4][7];  // thread-id-b = 0: lane 4g (column g)
        for (int k = 0; k < 64; k += 8) {
            const uint32_t reg = w.u[col * 4 + (k % 32) / 8][4 + k / 32];
            const double   s   = emu::ue4m3_value(byte(sf, k / 16));
            for (int j = 0; j < 8; ++j) v[k + j] = e2m1[nib(reg, j)] * s;
        }
    };
    const int g = l >> 2, t = l & 3;
    double    av[2][64], bv[2][64];
    a_row(g, av[0]);
    a_row(g + 8, av[1]);
    b_col(2 * t, bv[0]);
    b_col(2 * t + 1, bv[1]);
    float res[4];
    for (int e = 0; e < 4; ++e) {
        const double * x = av[e >> 1];
        const double * y = bv[e & 1];
        double         p[4] = {0.0, 0.0, 0.0, 0.0};  // exact in any order (see above): four chains for speed
        for (int k = 0; k < 64; k += 4)
            for (int q = 0; q < 4; ++q) p[q] += x[k + q] * y[k + q];
        const double s = (p[0] + p[1]) + (p[2] + p[3]);
        res[e] = emu::nvf4_add(d[e], s);
    }
    emu::warp_sync();
    for (int e = 0; e < 4; ++e) d[e] = res[e];
}

#endif  // SPARK_ARCH_FP4_MMA_SYNC

}  // namespace spark::cuda::ptx
