// Runs the sm_120a W4A4 NVFP4 kernels (src/backends/cuda/fp4/quantize_nvfp4_kernels.cuh, the
// activation quantizer in its hardware-convert pass, and gemm_w4a4_kernels.cuh, the GEMM on the
// block-scaled FP4 mma.sync), unchanged, on the CPU warp emulator (dev/emu), against CPU references,
// BIT FOR BIT. No GPU needed (none of the sm_120 family was available to the project: this is the
// only place these kernel bodies have run; docs/SM120.md).
//
// The lab is compiled with SPARK_EMU_CUDA_ARCH=1200: dev/emu/backends/cuda/common/arch.h then gives
// the kernels the SPARK_ARCH_* values of an sm_120a device pass (SPARK_ARCH_FP4_MMA_SYNC = 1), and
// the emulator's shadow of ptx_sm120.cuh (beside it) implements the two instructions:
// `cvt.rn.satfinite.e2m1x2.f32` and `mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.
// scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3` (that header says what is from the PTX ISA, what from
// CUTLASS's SM120 traits, and what is assumed: the selector reading, and the accumulation).
//
// Sections (a name filter as the first argument picks cases by substring):
//   ptx    the real src/backends/cuda/common/ptx_sm120.cuh still has the asm the shadow models
//          (operand order of the cvt pairs, the mma operand list); the shadow's cvt against
//          quant/formats.h's f32_to_e2m1 (every tie +-1 ulp, grid points, 2^20 spread f32 patterns,
//          specials) and its packing; the shadow's mma against a reference that places the
//          operands with CUTLASS's layouts, evaluated as CuTe layout functions from their
//          shape : stride (an independent derivation of the same fragment formulas): random tiles,
//          lanes the selectors do not read holding other values, and hand-written accumulator
//          cases that pin the rounding model (ties of C + sum broken by bits below the double sum).
//   quant  the quantizer kernel (both the float4 and the scalar variant, the launcher's grid and a
//          short one for the grid-stride loop) against fp4/nvfp4_act_ref.h byte for byte: rows
//          1..128, k with and without K tails (16, 48, 80, 576, 2048, 4096, ...), row strides k,
//          k + 4, k + 3, an x offset of one float, three global scales, and blocks of every E2M1 tie,
//          saturation, zeros, -0, NaN, inf, subnormals and scale underflow.
//   gemm   the GEMM kernel in the launcher's configuration for the token count (<= 8: 16x8 per
//          warp; more: 32x32 per warp) and forced into the other one: token counts 1..8 and 9..128
//          (partial token tiles), model projection shapes of Qwen3-30B-A3B, Qwen3-Next-80B-A3B and
//          Qwen3-8B (full K; full N at one token, N cut to a few hundred rows, still partial tiles,
//          at larger counts), K tails (K = 64, 192, 576, 704: one step, odd step counts for the
//          2-way unrolled loop), N tails (8, 17, 40, 72, 1000), weight codes of every value and
//          scales over the whole UE4M3 range (zero and subnormal included); activations from the
//          emulated quantizer (the real pipeline) or random codes. The output rows are padded
//          (y_stride = N + 3) and the padding must keep its sentinel bits; every element is
//          compared bit for bit with the reference: per 64-K step the exact sum of the products,
//          added to the f32 accumulator with one round-to-nearest-even (the emulator's model,
//          written again here independently: round-to-odd in double, then to f32), steps in
//          ascending K, then times alpha = a_global * w_global in f32. Also printed: the worst
//          nmse against a plain double sum (any hardware adder must stay near it: ~1e-14 here).
// Every launch runs under the programmatic dependent launch model (dev/emu/backends/cuda/common/
// pdl.cuh): the quantizer's x and the GEMM's activation codes and scales are poisoned until the
// grid's first pdl::wait(), every thread must wait, some thread must trigger ("FAIL pdl" lines).
// Buffers are exactly sized (the address sanitizer sees any read past them).
//
// Part of the CPU test suite (ctest: emu-w4a4, label emu). Build and run by hand (from the
// repository root):
//   g++ -std=c++20 -O2 -g -fsanitize=address,undefined -DSPARK_EMU_CUDA_ARCH=1200 -Idev/emu -Isrc \
//       -Iinclude dev/kernels/fp4/emu_w4a4.cpp -o /tmp/emu_w4a4 && /tmp/emu_w4a4 [filter [seed]]
#include "backends/cuda/common/arch.h"
#include "backends/cuda/common/pdl.cuh"  // the PDL model (dev/emu)
#include "backends/cuda/fp4/gemm_w4a4_kernels.cuh"
#include "backends/cuda/fp4/nvfp4_act_ref.h"
#include "backends/cuda/fp4/quantize_nvfp4_kernels.cuh"
#include "quant/formats.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#if !SPARK_ARCH_FP4_MMA_SYNC
#error "emu_w4a4.cpp emulates an sm_120a pass: compile with -DSPARK_EMU_CUDA_ARCH=1200 (dev/emu/backends/cuda/common/arch.h)"
#endif

#ifndef SPARK_EMU_SOURCE_DIR
#define SPARK_EMU_SOURCE_DIR "."  // the repository root (CMake passes it; by hand: run from the root)
#endif

using namespace spark;
using namespace spark::cuda;
using PdlGuard = pdl::model::Guard;

namespace {

std::mt19937_64 rng(20260120);
uint32_t        bits32() { return uint32_t(rng()); }
float           randn() {
    static std::normal_distribution<float> nd(0.0f, 1.0f);
    return nd(rng);
}

int         g_fail = 0, g_cases = 0;
std::string g_filter;
bool        selected(const std::string & name) { return name.find(g_filter) != std::string::npos; }
void        report(bool ok, const std::string & name, const std::string & detail) {
    ++g_cases;
    if (!ok) ++g_fail;
    std::printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", name.c_str(), detail.empty() ? "" : "  ", detail.c_str());
    std::fflush(stdout);
}

// Exactly `bytes` long (the sanitizer sees reads past it), 16-byte aligned (new[]'s alignment here).
struct Buf {
    std::unique_ptr<uint8_t[]> p;
    size_t                     bytes = 0;
    explicit Buf(size_t b) : p(new uint8_t[std::max<size_t>(b, 1)]), bytes(b) {
        if (reinterpret_cast<uintptr_t>(p.get()) % 16 != 0) {
            std::fprintf(stderr, "Buf: new[] is not 16-byte aligned here\n");
            std::abort();
        }
    }
    uint8_t * data() { return p.get(); }
    float *   f32() { return reinterpret_cast<float *>(p.get()); }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

uint64_t bits64(double x) {
    uint64_t u;
    std::memcpy(&u, &x, 8);
    return u;
}

// round_to_nearest_even_f32(c + s) with one rounding: the reference's own way (the emulator's
// emu::nvf4_add fixes ties instead): the double sum rounded to odd (when c + s is not exact in
// double, the neighbour with an odd last bit), then rounded to f32, which is correct rounding
// because double carries more than two bits beyond f32's 24.
float ref_add(float c, double s) {
    const double a = c, hi = a + s, bb = hi - a, lo = (a - (hi - bb)) + (s - bb);
    double       odd = hi;
    if (lo != 0.0 && (bits64(hi) & 1u) == 0) odd = std::nextafter(hi, lo > 0.0 ? INFINITY : -INFINITY);
    return float(odd);
}

// =============================================================================================
// ptx: the shadow itself

// The real wrappers' asm must be what the shadow models, text for text.
void check_real_header() {
    const std::string name = "ptx real ptx_sm120.cuh asm matches the shadow";
    if (!selected(name)) return;
    const std::string path = std::string(SPARK_EMU_SOURCE_DIR) + "/src/backends/cuda/common/ptx_sm120.cuh";
    std::ifstream     f(path);
    if (!f) return report(false, name, "cannot read " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    const char *      needles[] = {
        "cvt.rn.satfinite.e2m1x2.f32 q0, %2, %1;",
        "cvt.rn.satfinite.e2m1x2.f32 q1, %4, %3;",
        "cvt.rn.satfinite.e2m1x2.f32 q2, %6, %5;",
        "cvt.rn.satfinite.e2m1x2.f32 q3, %8, %7;",
        "mov.b32 %0, {q0, q1, q2, q3};",
        ": \"f\"(v0), \"f\"(v1), \"f\"(v2), \"f\"(v3), \"f\"(v4), \"f\"(v5), \"f\"(v6), \"f\"(v7)",
        "\"mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3 \"",
        "\"{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}, %10, {0, 0}, %11, {0, 0};\\n\"",
        ": \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3])",
        ": \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]), \"r\"(sfa), \"r\"(sfb)",
    };
    std::string missing;
    for (const char * n : needles)
        if (text.find(n) == std::string::npos) missing += std::string(missing.empty() ? "" : " | ") + n;
    report(missing.empty(), name, missing.empty() ? "" : "changed (update dev/emu/backends/cuda/common/ptx_sm120.cuh): " + missing);
}

// The shadow's cvt against formats.h's f32_to_e2m1 (the software encoder, checked against the
// toolkit's emulation of the instruction), and the packing of cvt_e2m1x8.
void check_cvt() {
    const std::string name = "ptx cvt.rn.satfinite.e2m1x2.f32";
    if (!selected(name)) return;
    std::vector<float> xs;
    const float        grid[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float        ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    for (float v : grid) xs.push_back(v);
    for (float v : ties) {
        xs.push_back(v);
        xs.push_back(std::nextafter(v, 0.0f));
        xs.push_back(std::nextafter(v, 10.0f));
    }
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    for (float v : {inf, nan, 6.0f, std::nextafter(6.0f, 10.0f), 1e30f, 1e-45f, 1e-38f, std::numeric_limits<float>::max(),
                    std::numeric_limits<float>::denorm_min(), 0.1f, 5.5f, 5.999f})
        xs.push_back(v);
    for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4093) xs.push_back(f32_from_bits(uint32_t(u)));  // ~2^20 patterns, every exponent
    for (int i = 0; i < 200000; ++i) xs.push_back(std::ldexp(float(bits32() % 1000000) / 1e6f, int(bits32() % 8) - 4));
    int         bad = 0;
    std::string first;
    for (float v : xs)
        for (float x : {v, -v}) {
            const uint8_t got = emu::cvt_rn_satfinite_e2m1(x), want = f32_to_e2m1(x);
            if (got != want && bad++ == 0) {
                char b[160];
                std::snprintf(b, sizeof b, "x = %a (0x%08x): shadow code %u, f32_to_e2m1 %u", double(x), f32_bits(x), got, want);
                first = b;
            }
        }
    // Packing: v_j -> nibble j (the wrapper's q_i = cvt(v_{2i+1}, v_{2i}): the odd element upper).
    const uint32_t packed = ptx::cvt_e2m1x8(0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.5f);
    const uint32_t pair   = emu::cvt_rn_satfinite_e2m1x2_f32(-6.0f, 0.25f);  // a upper (-6: 0xF), b lower (0.25 -> 0)
    const bool     ok     = bad == 0 && packed == 0x97654321u && pair == 0xF0u;
    char           b[200];
    std::snprintf(b, sizeof b, "%zu inputs x 2 signs, %d differ%s%s; cvt_e2m1x8 packing 0x%08x (want 0x97654321), pair 0x%02x (want 0xf0)",
                  xs.size(), bad, bad ? ": first " : "", first.c_str(), packed, pair);
    report(ok, name, b);
}

// CuTe layouts, evaluated: modes (shape, stride) in colexicographic order, as CuTe flattens them.
struct Mode {
    int shape, stride;
};
int cute_eval(const std::vector<Mode> & modes, int coord) {
    int idx = 0;
    for (const Mode & m : modes) {
        idx += (coord % m.shape) * m.stride;
        coord /= m.shape;
    }
    return idx;
}
// CUTLASS's MMA_Traits<SM120_16x8x64_TN_VS<e2m1, e2m1, float, ue4m3, 16>> (cute/atom/
// mma_traits_sm120.hpp) and SM80_16x8_Row (mma_traits_sm80.hpp), thread and value modes:
//   ALayout   (T32,V32) -> (M16,K64)  ((4,8),(8,2,2)) : ((128,1),(16,8,512))
//   BLayout   (T32,V16) -> (N8,K64)   ((4,8),(8,2))   : ((64,1),(8,256))
//   SFALayout (T32,V64) -> (M16,K64)  ((2,2,8),64)    : ((8,0,1),16)
//   SFBLayout (T32,V64) -> (N8,K64)   ((4,8),64)      : ((0,1),8)
//   CLayout   (T32,V4)  -> (M16,N8)   ((4,8),(2,2))   : ((32,1),(16,8))
// All column-major over their (rows, K) / (M, N) domain: idx = row + rows * col.
const std::vector<Mode> kAThr = {{4, 128}, {8, 1}}, kAVal = {{8, 16}, {2, 8}, {2, 512}};
const std::vector<Mode> kBThr = {{4, 64}, {8, 1}}, kBVal = {{8, 8}, {2, 256}};
const std::vector<Mode> kSfaThr = {{2, 8}, {2, 0}, {8, 1}}, kSfaVal = {{64, 16}};
const std::vector<Mode> kSfbThr = {{4, 0}, {8, 1}}, kSfbVal = {{64, 8}};
const std::vector<Mode> kCThr = {{4, 32}, {8, 1}}, kCVal = {{2, 16}, {2, 8}};

// One 16x8x64 problem in logical form.
struct Tile {
    uint8_t a[16][64];   // E2M1 codes
    uint8_t b[8][64];    // E2M1 codes, B[k][n] stored [n][k]
    uint8_t sfa[16][4];  // UE4M3, per row and 16-K block
    uint8_t sfb[8][4];
    float   c[16][8];
};
struct Frag {
    uint32_t a[32][4], b[32][2], sfa[32], sfb[32];
    float    c[32][4];
};

// Registers from the logical tile by the CuTe layouts (a value v of A is nibble v % 8 of register
// v / 8; a scale register's byte j is K block j, whose 16 K values the layout must map to one row).
Frag place(const Tile & t, bool other_lanes_differ) {
    Frag f{};
    for (int l = 0; l < 32; ++l) {
        for (int v = 0; v < 32; ++v) {
            const int idx = cute_eval(kAThr, l) + cute_eval(kAVal, v);
            f.a[l][v / 8] |= uint32_t(t.a[idx % 16][idx / 16]) << (4 * (v % 8));
        }
        for (int v = 0; v < 16; ++v) {
            const int idx = cute_eval(kBThr, l) + cute_eval(kBVal, v);
            f.b[l][v / 8] |= uint32_t(t.b[idx % 8][idx / 8]) << (4 * (v % 8));
        }
        for (int v = 0; v < 64; ++v) {
            const int ia = cute_eval(kSfaThr, l) + cute_eval(kSfaVal, v), ib = cute_eval(kSfbThr, l) + cute_eval(kSfbVal, v);
            const uint32_t ja = uint32_t(ia / 16 / 16), jb = uint32_t(ib / 8 / 16);  // K block of the value
            f.sfa[l] = (f.sfa[l] & ~(0xFFu << (8 * ja))) | (uint32_t(t.sfa[ia % 16][ja]) << (8 * ja));
            f.sfb[l] = (f.sfb[l] & ~(0xFFu << (8 * jb))) | (uint32_t(t.sfb[ib % 8][jb]) << (8 * jb));
        }
        for (int v = 0; v < 4; ++v) {
            const int idx = cute_eval(kCThr, l) + cute_eval(kCVal, v);
            f.c[l][v]     = t.c[idx % 16][idx / 16];
        }
        // The selectors {0, 0} read A scales from lanes 4g, 4g + 1 and B scales from lane 4g: the
        // others get other (valid) values, which must not matter.
        if (other_lanes_differ) {
            if (l % 4 >= 2) f.sfa[l] = 0x01020304u + uint32_t(l);
            if (l % 4 != 0) f.sfb[l] = 0x05060708u + uint32_t(l);
        }
    }
    return f;
}

// D[row][col] of the logical tile: exact products, the model's one rounding (ref_add).
float tile_ref(const Tile & t, int row, int col) {
    double s = 0.0;
    for (int k = 0; k < 64; ++k)
        s += double(e2m1_to_f32(t.a[row][k])) * double(e4m3_to_f32(t.sfa[row][k / 16])) * double(e2m1_to_f32(t.b[col][k])) *
             double(e4m3_to_f32(t.sfb[col][k / 16]));
    return ref_add(t.c[row][col], s);
}

// Runs the shadow's mma for each tile (one warp per block) and returns D[tile][row][col].
std::vector<float> run_mma(const std::vector<Frag> & frags) {
    std::vector<float> d(frags.size() * 128, NAN);
    emu::LaunchOptions o;
    o.stack_bytes = 64 * 1024;
    emu::launch(dim3(unsigned(frags.size())), dim3(32), o,
                [&] {
                    const Frag & f = frags[blockIdx.x];
                    const int    l = int(threadIdx.x);
                    float        acc[4];
                    for (int v = 0; v < 4; ++v) acc[v] = f.c[l][v];
                    const uint32_t a[4] = {f.a[l][0], f.a[l][1], f.a[l][2], f.a[l][3]};
                    const uint32_t b[2] = {f.b[l][0], f.b[l][1]};
                    ptx::mma_m16n8k64_nvf4(acc, a, b, f.sfa[l], f.sfb[l]);
                    for (int v = 0; v < 4; ++v) {
                        const int idx = cute_eval(kCThr, l) + cute_eval(kCVal, v);
                        d[size_t(blockIdx.x) * 128 + size_t(idx % 16) * 8 + size_t(idx / 16)] = acc[v];
                    }
                },
                rng());
    return d;
}

void check_mma_random() {
    const std::string name = "ptx mma m16n8k64 nvf4: random tiles, CuTe-placed fragments";
    if (!selected(name)) return;
    std::vector<Tile> tiles(300);
    for (size_t i = 0; i < tiles.size(); ++i) {
        Tile & t = tiles[i];
        for (auto & r : t.a)
            for (auto & v : r) v = uint8_t(bits32() & 15u);
        for (auto & r : t.b)
            for (auto & v : r) v = uint8_t(bits32() & 15u);
        for (auto & r : t.sfa)
            for (auto & v : r) v = uint8_t(bits32() % 0x7Fu);  // 0 .. 0x7E: zero, subnormals, up to 448
        for (auto & r : t.sfb)
            for (auto & v : r) v = uint8_t(bits32() % 0x7Fu);
        for (auto & r : t.c)
            for (auto & v : r) v = i % 3 == 0 ? 0.0f : std::ldexp(randn(), int(bits32() % 60) - 20);
    }
    std::vector<Frag> frags;
    for (size_t i = 0; i < tiles.size(); ++i) frags.push_back(place(tiles[i], i % 2 == 1));
    const std::vector<float> d = run_mma(frags);
    int                      bad = 0;
    std::string              first;
    for (size_t i = 0; i < tiles.size(); ++i)
        for (int r = 0; r < 16; ++r)
            for (int c = 0; c < 8; ++c) {
                const float got = d[i * 128 + size_t(r) * 8 + size_t(c)], want = tile_ref(tiles[i], r, c);
                if (f32_bits(got) != f32_bits(want) && bad++ == 0) {
                    char b[160];
                    std::snprintf(b, sizeof b, "tile %zu D[%d][%d]: emulated %a, reference %a", i, r, c, double(got), double(want));
                    first = b;
                }
            }
    report(bad == 0, name, std::to_string(tiles.size()) + " tiles, " + std::to_string(bad) + " elements differ" + (bad ? ": first " + first : ""));
}

// The accumulate model, pinned by hand: D[0][0] for C + S with S built from exact products.
void check_mma_rounding() {
    const std::string name = "ptx mma m16n8k64 nvf4: accumulator rounding (one RNE of C + exact sum)";
    if (!selected(name)) return;
    struct Case {
        const char * what;
        float        c;
        int          n_big;     // products 4 * 4 * 256 * 256 = 2^20 (codes 6, scales 0x78) at k < 32
        bool         tiny;      // plus one product 0.5 * 0.5 * 2^-9 * 2^-9 = 2^-20 at k = 32
        int          n_one;     // products 1 * 1 * 1 * 1 at k = 48.. (scales 0x38)
        float        want;
    };
    const float p49 = std::ldexp(1.0f, 49), p24 = std::ldexp(1.0f, 24);
    const Case  cases[] = {
        {"2^24 + 1: tie, to even", p24, 0, false, 1, p24},
        {"2^24 + 3: tie, to even (up)", p24, 0, false, 3, p24 + 4.0f},
        {"2^49 + 2^25: tie, to even (down)", p49, 32, false, 0, p49},
        {"2^49 + 2^25 + 2^-20: above the tie only below double precision", p49, 32, true, 0, p49 + std::ldexp(1.0f, 26)},
        {"-(2^49 + 2^27) + 2^25 + 2^-20: below the tie only below double precision", -p49 - std::ldexp(1.0f, 27), 32, true, 0,
         -p49 - std::ldexp(1.0f, 26)},
        {"0 + 2^-20: exact", 0.0f, 0, true, 0, std::ldexp(1.0f, -20)},
        {"4 + 32 x 2^20: exact", 4.0f, 32, false, 0, std::ldexp(1.0f, 25) + 4.0f},
    };
    std::vector<Tile> tiles;
    for (const Case & cs : cases) {
        Tile t;
        std::memset(&t, 0, sizeof t);
        for (int r = 0; r < 16; ++r)
            for (int j = 0; j < 4; ++j) t.sfa[r][j] = 0x38;  // 1.0
        for (int n = 0; n < 8; ++n)
            for (int j = 0; j < 4; ++j) t.sfb[n][j] = 0x38;
        t.c[0][0] = cs.c;
        for (int k = 0; k < cs.n_big; ++k) t.a[0][k] = t.b[0][k] = 6;  // 4.0
        if (cs.n_big) t.sfa[0][0] = t.sfa[0][1] = t.sfb[0][0] = t.sfb[0][1] = 0x78;  // 256
        if (cs.tiny) {
            t.a[0][32] = t.b[0][32] = 1;    // 0.5
            t.sfa[0][2] = t.sfb[0][2] = 0x01;  // 2^-9
        }
        for (int k = 0; k < cs.n_one; ++k) t.a[0][48 + k] = t.b[0][48 + k] = 2;  // 1.0
        tiles.push_back(t);
    }
    std::vector<Frag> frags;
    for (const Tile & t : tiles) frags.push_back(place(t, true));
    const std::vector<float> d = run_mma(frags);
    for (size_t i = 0; i < tiles.size(); ++i) {
        const float got = d[i * 128], ref = tile_ref(tiles[i], 0, 0);
        char        b[200];
        std::snprintf(b, sizeof b, "emulated %a, reference %a, by hand %a", double(got), double(ref), double(cases[i].want));
        report(f32_bits(got) == f32_bits(cases[i].want) && f32_bits(ref) == f32_bits(cases[i].want), name + ": " + cases[i].what, b);
    }
}

// =============================================================================================
// quant: the activation quantizer (hardware-convert pass)

enum class Data { Random, Special };

// One row of special blocks: element 0 of a block sets its amax; ties of the E2M1 grid at a divisor
// the row's global scale makes exact; saturation, zeros, -0, NaN, inf, subnormals, underflow.
void special_row(float * x, int64_t k, float global) {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    const float scales[] = {1.0f, 1.5f, 0.375f, 0.0625f, 224.0f, 448.0f, 1.875f, 0.009765625f};
    const float ties[]   = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 0.5f, 1.5f, 3.0f, 6.0f, 0.0f};
    for (int64_t b = 0; b < k / 16; ++b) {
        float *     v    = x + 16 * b;
        const int   kind = int(bits32() % 10);
        const float d    = scales[bits32() % 8] * global;
        for (int i = 0; i < 16; ++i) v[i] = 0.0f;
        if (kind < 5) {  // ties at divisor d (element 0 = +-6 d makes the scale exactly d / global)
            v[0] = (bits32() & 1 ? -6.0f : 6.0f) * d;
            for (int i = 1; i < 16; ++i) v[i] = (bits32() & 1 ? -1.0f : 1.0f) * ties[bits32() % 12] * d;
        } else if (kind == 5) {
            for (int i = 0; i < 16; ++i) v[i] = (bits32() & 1) ? -0.0f : 0.0f;  // zeros: scale 0, codes 0
        } else if (kind == 6) {
            const float s[] = {1.0f, -0.0f, 0.0f, -1e-30f, 1e-30f, -0.1f, 0.1f, nan, -nan, 2.0f};
            for (int i = 0; i < 10; ++i) v[i] = s[i] * (i < 7 || i == 9 ? global * 4.0f : 1.0f);
        } else if (kind == 7) {
            const float s[] = {1e30f, -1e30f, 1.0f, -3e29f, inf, -inf, 6.375f, -6.375f, 5.9f, 448.0f * 6.0f};
            for (int i = 0; i < 10; ++i) v[i] = s[i];
        } else if (kind == 8) {
            const float s[] = {1e-40f, -1e-41f, 1e-45f, -1e-45f};  // f32 subnormals: the scale underflows
            for (int i = 0; i < 4; ++i) v[i] = s[i];
        } else {
            for (int i = 0; i < 16; ++i) v[i] = randn() * d;
        }
    }
}

// x [rows][stride] at `offset` floats into its buffer; codes / scales as the launcher's outputs.
struct QuantOut {
    std::vector<uint8_t> codes, scales;
};

// Runs the quantizer kernel (the variant and grid the launcher would pick, or a short grid).
QuantOut run_quant(const float * x, int64_t rows, int64_t k, int64_t stride, float global, bool short_grid, bool & pdl_ok,
                   const std::string & name, Buf & xbuf) {
    Buf           codes(size_t(rows * k / 2)), scales(size_t(rows * k / 16));
    const int64_t total  = rows * (k / fp4::kNvfp4Block);
    const int64_t blocks = short_grid ? std::min<int64_t>(2, fp4::quantize_nvfp4_blocks(total)) : fp4::quantize_nvfp4_blocks(total);
    std::memset(codes.data(), 0xA5, codes.bytes);
    std::memset(scales.data(), 0xA5, scales.bytes);
    emu::LaunchOptions o;
    o.stack_bytes = 64 * 1024;
    {
        PdlGuard g({pdl::model::in(xbuf.data(), xbuf.bytes), pdl::model::out(codes.data(), codes.bytes),
                    pdl::model::out(scales.data(), scales.bytes)});
        auto go = [&](auto kernel) {
            emu::launch(dim3(unsigned(blocks)), dim3(fp4::kQuantThreads), o,
                        [&] { kernel(x, rows, k, stride, global, codes.data(), scales.data()); }, rng());
        };
        if (fp4::quantize_nvfp4_vec(x, stride)) go(fp4::quantize_nvfp4_kernel<true>);
        else go(fp4::quantize_nvfp4_kernel<false>);
        pdl_ok = g.check("quantize_nvfp4_kernel " + name);
    }
    return {std::vector<uint8_t>(codes.data(), codes.data() + codes.bytes), std::vector<uint8_t>(scales.data(), scales.data() + scales.bytes)};
}

// Quantizer case; returns the emulated codes / scales (for the pipeline cases).
QuantOut check_quant(int64_t rows, int64_t k, int64_t pad, int64_t offset, Data data, int global_kind, bool short_grid,
                     const std::string & tag = "", bool force = false) {
    const int64_t stride = k + pad;
    std::string   name   = "quant " + tag + (tag.empty() ? "" : " ") + "rows=" + std::to_string(rows) + " k=" + std::to_string(k) +
                       " stride=" + std::to_string(stride) + (offset ? " offset=" + std::to_string(offset) : "") +
                       (data == Data::Special ? " special" : "") + " global=" + (global_kind == 0 ? "calibrated" : global_kind == 1 ? "1" : "tiny") +
                       (short_grid ? " short-grid" : "");
    if (!force && !selected(name)) return {};
    Buf     xbuf(size_t(offset + (rows - 1) * stride + k) * 4);
    float * x    = xbuf.f32() + offset;
    float   amax = 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
        const float mag = std::ldexp(1.0f, int(r % 41) - 20);  // 2^-20 .. 2^20 across rows
        for (int64_t i = 0; i < stride && r * stride + i < int64_t(xbuf.bytes / 4) - offset; ++i) {
            float v = randn() * mag;
            if (i % 97 == 5) v *= 30.0f;  // outliers
            x[r * stride + i] = v;
            if (i < k) amax = std::max(amax, std::fabs(v));
        }
    }
    const float global = global_kind == 0 ? amax / (6.0f * 448.0f) : global_kind == 1 ? 1.0f : 0.37f * amax / (6.0f * 448.0f) * 1e-3f;
    if (data == Data::Special)
        for (int64_t r = 0; r < rows; ++r) special_row(x + r * stride, k, global);
    for (int64_t i = 0; i < offset; ++i) xbuf.f32()[i] = NAN;
    const auto     t0 = std::chrono::steady_clock::now();
    bool           pdl_ok = true;
    const QuantOut got    = run_quant(x, rows, k, stride, global, short_grid, pdl_ok, name, xbuf);
    QuantOut       ref{std::vector<uint8_t>(size_t(rows * k / 2)), std::vector<uint8_t>(size_t(rows * k / 16))};
    fp4::quantize_activations_nvfp4_ref(x, rows, k, stride, global, ref.codes.data(), ref.scales.data());
    size_t      bad_c = 0, bad_s = 0;
    std::string first;
    for (size_t i = 0; i < ref.codes.size(); ++i)
        if (got.codes[i] != ref.codes[i] && bad_c++ == 0) {
            const int64_t r = int64_t(i) / (k / 2), c = int64_t(i) % (k / 2);
            char          b[200];
            std::snprintf(b, sizeof b, "; first code byte row %lld byte %lld: 0x%02x, reference 0x%02x (inputs %a, %a)", (long long) r,
                          (long long) c, got.codes[i], ref.codes[i], double(x[r * stride + 2 * c]), double(x[r * stride + 2 * c + 1]));
            first += b;
        }
    for (size_t i = 0; i < ref.scales.size(); ++i)
        if (got.scales[i] != ref.scales[i] && bad_s++ == 0) {
            char b[120];
            std::snprintf(b, sizeof b, "; first scale byte %zu: 0x%02x, reference 0x%02x", i, got.scales[i], ref.scales[i]);
            first += b;
        }
    char b[200];
    std::snprintf(b, sizeof b, "%s, %zu code / %zu scale bytes differ (%.2f s)", fp4::quantize_nvfp4_vec(x, stride) ? "float4" : "scalar", bad_c,
                  bad_s, seconds_since(t0));
    report(bad_c == 0 && bad_s == 0 && pdl_ok, name, b + first);
    return got;
}

// =============================================================================================
// gemm: the W4A4 GEMM

struct Operand {  // E2M1 codes [rows][k/2] (tiled: in the weights' tile-major order) and UE4M3 scales [rows][k/16], exactly sized
    std::unique_ptr<Buf> codes, scales;
    int64_t              rows = 0, k = 0;
    bool                 tiled = false;
};

Operand random_operand(int64_t rows, int64_t k) {
    Operand o;
    o.rows   = rows;
    o.k      = k;
    o.codes  = std::make_unique<Buf>(size_t(rows * k / 2));
    o.scales = std::make_unique<Buf>(size_t(rows * k / 16));
    for (size_t i = 0; i < o.codes->bytes; ++i) o.codes->data()[i] = uint8_t(bits32());  // every code, -0 included
    for (size_t i = 0; i < o.scales->bytes; ++i) {
        // The whole UE4M3 range now and then (0 and subnormals included), mostly within a few binades.
        const uint32_t r = bits32();
        o.scales->data()[i] = r % 8 == 0 ? uint8_t((r >> 8) % 0x7Fu) : uint8_t(0x28 + (r >> 8) % 0x20);
    }
    return o;
}

Operand operand_of(const QuantOut & q, int64_t rows, int64_t k) {
    Operand o;
    o.rows   = rows;
    o.k      = k;
    o.codes  = std::make_unique<Buf>(q.codes.size());
    o.scales = std::make_unique<Buf>(q.scales.size());
    std::memcpy(o.codes->data(), q.codes.data(), q.codes.size());
    std::memcpy(o.scales->data(), q.scales.data(), q.scales.size());
    return o;
}

// Dequantized (exact) values, [rows][k], in double.
std::vector<double> dequant(const Operand & o) {
    std::vector<double> v(size_t(o.rows * o.k));
    for (int64_t r = 0; r < o.rows; ++r)
        for (int64_t i = 0; i < o.k; ++i) {
            const uint8_t byte = o.codes->data()[w4_byte_index(o.tiled, r, i / 2, o.k / 2)];
            v[size_t(r * o.k + i)] = double(e2m1_to_f32(uint8_t(i % 2 ? byte >> 4 : byte & 15))) *
                                     double(e4m3_to_f32(o.scales->data()[r * (o.k / 16) + i / 16]));
        }
    return v;
}

template <class C> void launch_gemm(const fp4::W4A4Args & a) {
    const dim3         grid(unsigned((a.n + C::kFeatures - 1) / C::kFeatures), unsigned((a.rows + C::kTokens - 1) / C::kTokens));
    emu::LaunchOptions o;
    o.stack_bytes = 64 * 1024;
    emu::launch(grid, dim3(C::kThreads), o, [&] { fp4::gemm_w4a4_kernel<C::MT, C::NT, C::WARPS_M, C::WARPS_N>(a); }, rng());
}

double g_worst_nmse = 0.0;

// y = W A^T for weight W [n][k] and activations A [rows][k]; `force_other` runs the configuration
// the launcher would not pick for this token count.
void check_gemm(const Operand & w, float w_global, const Operand & act, float a_global, bool force_other, const std::string & name) {
    const int64_t n = w.rows, k = w.k, rows = act.rows;
    const bool    small = (rows <= fp4::kW4A4SmallRows) != force_other;
    const int64_t ys    = n + 3;
    Buf           yb(size_t(rows * ys) * 4);
    const uint32_t sentinel = 0x7FC0DEADu;
    for (int64_t i = 0; i < rows * ys; ++i) std::memcpy(yb.f32() + i, &sentinel, 4);
    fp4::W4A4Args a;
    a.w_codes  = w.codes->data();
    a.w_scales = w.scales->data();
    a.a_codes  = act.codes->data();
    a.a_scales = act.scales->data();
    a.y        = yb.f32();
    a.n        = n;
    a.k        = k;
    a.rows     = rows;
    a.y_stride = ys;
    a.alpha    = a_global * w_global;  // as the launcher computes it
    a.w_tiled  = w.tiled;
    const auto t0 = std::chrono::steady_clock::now();
    bool       pdl_ok;
    {
        PdlGuard g({pdl::model::in(act.codes->data(), act.codes->bytes), pdl::model::in(act.scales->data(), act.scales->bytes),
                    pdl::model::out(yb.data(), yb.bytes)});
        if (small) launch_gemm<fp4::W4A4Small>(a);
        else launch_gemm<fp4::W4A4Large>(a);
        pdl_ok = g.check("gemm_w4a4_kernel " + name);
    }
    const double t_emu = seconds_since(t0);
    // Reference: per 64-K step the exact sum, one rounding into the f32 accumulator, then alpha.
    const std::vector<double> wd = dequant(w), ad = dequant(act);
    size_t                    bad = 0, bad_pad = 0;
    std::string               first;
    double                    num = 0.0, den = 0.0;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < n; ++j) {
            const double * wr  = wd.data() + j * k;
            const double * ar  = ad.data() + r * k;
            float          acc = 0.0f;
            double         all = 0.0;
            for (int64_t s = 0; s < k; s += 64) {
                double p[4] = {0, 0, 0, 0};  // exact in any order (see the shadow): four chains for speed
                for (int64_t i = s; i < s + 64; i += 4)
                    for (int q = 0; q < 4; ++q) p[q] += wr[i + q] * ar[i + q];
                const double step = (p[0] + p[1]) + (p[2] + p[3]);
                acc               = ref_add(acc, step);
                all += step;
            }
            const float  want = acc * a.alpha;
            const float  got  = yb.f32()[r * ys + j];
            const double exact = all * double(a.alpha);
            num += (double(got) - exact) * (double(got) - exact);
            den += exact * exact;
            if (f32_bits(got) != f32_bits(want) && bad++ == 0) {
                char b[160];
                std::snprintf(b, sizeof b, "; first at token %lld feature %lld: %a, reference %a", (long long) r, (long long) j, double(got), double(want));
                first += b;
            }
        }
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = n; j < ys; ++j) bad_pad += f32_bits(yb.f32()[r * ys + j]) != sentinel;
    const double e = den > 0 ? num / den : num;
    g_worst_nmse   = std::max(g_worst_nmse, e);
    const dim3 grid(unsigned((n + (small ? fp4::W4A4Small::kFeatures : fp4::W4A4Large::kFeatures) - 1) /
                             (small ? fp4::W4A4Small::kFeatures : fp4::W4A4Large::kFeatures)),
                    unsigned((rows + (small ? fp4::W4A4Small::kTokens : fp4::W4A4Large::kTokens) - 1) /
                             (small ? fp4::W4A4Small::kTokens : fp4::W4A4Large::kTokens)));
    char b[240];
    std::snprintf(b, sizeof b, "%s grid=%ux%u: %zu differ, %zu padding writes, nmse vs double %.1e (%.2f s emulated, %.2f s total)",
                  small ? "16x8/warp" : "32x32/warp", grid.x, grid.y, bad, bad_pad, e, t_emu, seconds_since(t0));
    report(bad == 0 && bad_pad == 0 && pdl_ok, name, b + first);
}

// A GEMM case with random activation codes (or, `pipeline`, activations from the emulated quantizer).
void gemm_case(const std::string & tag, int64_t n, int64_t k, int64_t rows, bool pipeline = false, bool force_other = false) {
    const std::string name = "gemm " + tag + (tag.empty() ? "" : " ") + "N=" + std::to_string(n) + " K=" + std::to_string(k) +
                             " tokens=" + std::to_string(rows) + (pipeline ? " quantized-x" : "") + (force_other ? " other-config" : "");
    if (!selected(name)) return;
    Operand       w        = random_operand(n, k);
    w.tiled                = w4_tiled_layout(n, k);  // as the upload stores it (random codes: only the order matters)
    const float   w_global = 0.37f / 448.0f;
    if (!pipeline) return check_gemm(w, w_global, random_operand(rows, k), 1.5f / 448.0f, force_other, name);
    // The real pipeline: x quantized by the emulated quantizer kernel (itself checked bit for bit),
    // then the GEMM on its bytes (a_global only scales alpha: any positive value serves).
    const QuantOut q = check_quant(rows, k, 0, 0, Data::Random, 0, false, "(for " + name + ")", true);
    check_gemm(w, w_global, operand_of(q, rows, k), 0.0123f, force_other, name);
}

}  // namespace

int main(int argc, char ** argv) {
    g_filter = argc > 1 ? argv[1] : "";
    if (argc > 2) rng.seed(std::stoull(argv[2]));
    const auto t0 = std::chrono::steady_clock::now();

    // ---- ptx: the shadow
    check_real_header();
    check_cvt();
    check_mma_random();
    check_mma_rounding();

    // ---- quant
    for (const int64_t k : {int64_t(16), int64_t(48), int64_t(80), int64_t(576), int64_t(2048)})
        for (const int64_t rows : {int64_t(1), int64_t(7), int64_t(33)})
            for (const int64_t pad : {int64_t(0), int64_t(4), int64_t(3)}) check_quant(rows, k, pad, 0, Data::Random, int((rows + pad + k / 16) % 3), false);
    for (const int64_t rows : {int64_t(1), int64_t(5), int64_t(64), int64_t(128)}) {
        check_quant(rows, 4096, 0, 0, Data::Special, 0, false);
        check_quant(rows, 4096, 0, 0, Data::Special, 1, false);
    }
    check_quant(3, 512, 0, 1, Data::Random, 0, false);  // x one float off alignment: the scalar variant
    check_quant(9, 2048, 4, 0, Data::Special, 2, true);  // a short grid: the grid-stride loop
    check_quant(128, 768, 0, 0, Data::Random, 0, true);
    check_quant(17, 12288, 3, 0, Data::Special, 0, false);

    // ---- gemm
    // Token counts 1..8 (16x8 per warp) and 9..128 (32x32 per warp), both configurations, partial
    // tiles in N (N = 72: one full and one partial 64-row block) and in tokens.
    for (int64_t rows = 1; rows <= 8; ++rows) gemm_case("tokens", 72, 576, rows);
    for (const int64_t rows : {int64_t(9), int64_t(15), int64_t(16), int64_t(17), int64_t(31), int64_t(33), int64_t(63), int64_t(64),
                               int64_t(65), int64_t(100), int64_t(127), int64_t(128)})
        gemm_case("tokens", 72, 576, rows);
    for (const int64_t rows : {int64_t(1), int64_t(5), int64_t(8), int64_t(9), int64_t(40)}) gemm_case("tokens", 72, 576, rows, false, true);
    // K tails (one step, odd step counts) and N tails.
    for (const int64_t k : {int64_t(64), int64_t(192), int64_t(704)})
        for (const int64_t rows : {int64_t(1), int64_t(3), int64_t(8), int64_t(13), int64_t(70)}) gemm_case("k-tail", 40, k, rows);
    for (const int64_t n : {int64_t(8), int64_t(17), int64_t(1000)})
        for (const int64_t rows : {int64_t(2), int64_t(29)}) gemm_case("n-tail", n, 256, rows);
    // Model projections (N x K), full size at one token; N cut (partial tiles kept) at more tokens.
    struct Shape {
        const char * model;
        int64_t      n, k;
    };
    const Shape shapes[] = {
        {"30B-A3B q", 4096, 2048},         {"30B-A3B k/v", 512, 2048},         {"30B-A3B o", 2048, 4096},
        {"30B-A3B expert gate/up", 768, 2048}, {"30B-A3B expert down", 2048, 768}, {"Next qkvz", 12288, 2048},
        {"Next ba", 64, 2048},              {"Next attn q+gate", 8192, 2048},    {"Next expert gate/up", 512, 2048},
        {"Next expert down", 2048, 512},    {"8B q/o", 4096, 4096},             {"8B k/v", 1024, 4096},
        {"8B gate/up", 12288, 4096},        {"8B down", 4096, 12288},
    };
    for (const Shape & s : shapes) gemm_case(s.model, s.n, s.k, 1);
    for (const Shape & s : shapes) gemm_case(s.model, std::min<int64_t>(s.n, 136), s.k, s.k >= 4096 ? 24 : 128);
    for (const Shape & s : {shapes[3], shapes[9]}) gemm_case(s.model, s.n, s.k, 8);
    // The pipeline: activations from the emulated quantizer.
    gemm_case("pipeline 30B-A3B expert down", 200, 768, 6, true);
    gemm_case("pipeline Next expert gate/up", 136, 2048, 77, true);

    std::printf("worst GEMM nmse against a double sum %.1e (accumulation modelled as one RNE of C + exact sum per MMA)\n", g_worst_nmse);
    std::printf("%d of %d cases failed; %d PDL launch checks, %d failed (%.1f s)\n", g_fail, g_cases, pdl::model::checks(),
                pdl::model::failures(), seconds_since(t0));
    return g_fail || pdl::model::failures() ? 1 : 0;
}
