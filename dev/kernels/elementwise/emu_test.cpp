// Runs the small-op CUDA kernels (src/backends/cuda/elementwise/*_kernels.cuh), unchanged, on the CPU
// warp emulator (dev/emu) against references that follow the CPU backend (src/backends/cpu/
// ops_elementwise.cpp, ops_moe.cpp). No GPU needed; checks indexing, predication, the register
// layouts, warp/block reductions, the route's sort and redux rounds, argmax tie and NaN rules, and
// (with random warp orders) missing barriers. The argmax cluster kernel (sm_90 thread block
// clusters) is not modelled; tests/cuda/test_elementwise.cpp covers it on a GPU. Every launch runs
// under the programmatic dependent launch model (dev/emu/backends/cuda/common/pdl.cuh:
// inputs poisoned until the grid's first wait, every thread must wait, some thread must trigger;
// "FAIL pdl" lines), whose own self-test is here too ("pdl").
//
// Part of the CPU test suite (ctest: emu-elementwise, all cases). Build and run by hand (from the
// repository root; about a minute with the sanitizers, seconds without):
//   g++ -std=c++20 -O2 -g -ffp-contract=off -fsanitize=address,undefined -Idev/emu \
//       -Isrc -Iinclude dev/kernels/elementwise/emu_test.cpp -o /tmp/ew_emu_test && /tmp/ew_emu_test [pdl|norm|sum_sqr|rope|moe|argmax]
#include "backends/cuda/elementwise/argmax_kernels.cuh"
#include "backends/cuda/elementwise/moe_kernels.cuh"
#include "backends/cuda/elementwise/norm_kernels.cuh"
#include "backends/cuda/elementwise/rope_kernels.cuh"
#include "backends/cuda/common/pdl.cuh"  // the PDL model (dev/emu)

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace spark::cuda::ew;
using spark::cuda::RopeFreqs;
namespace pdl = spark::cuda::pdl;
using PdlGuard = pdl::model::Guard;

namespace {

std::mt19937 rng(4321);
float        randn() {
    static std::normal_distribution<float> nd(0.0f, 1.0f);
    return nd(rng);
}

int failures = 0, checks = 0;

void expect(bool ok, const std::string & what) {
    ++checks;
    if (!ok) {
        ++failures;
        std::printf("FAIL %s\n", what.c_str());
    }
}

double nmse(const float * got, const float * ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
        den += double(ref[i]) * ref[i];
    }
    return den > 0 ? num / den : num;
}

// The kernel the last run_* helper launched (for the PDL checks' messages).
std::string last_kernel;
std::string targs(std::initializer_list<int> v) {
    std::string s = "<";
    for (int x : v) s += (s.size() > 1 ? "," : "") + std::to_string(x);
    return s + ">";
}

// Contiguous [n, rows] rows with a row stride of `stride` floats.
Rows rows_at(float * p, int64_t stride) {
    Rows r;
    r.data = reinterpret_cast<char *>(p);
    r.nb3  = stride * 4;
    return r;
}

// ---------------------------------------------------------------- norms

template <int G, int NIT, bool ADD, bool GATE> void run_reg(const NormArgs & a) {
    const unsigned blocks = unsigned(G == 32 ? (a.nrows + 3) / 4 : a.nrows);
    last_kernel           = "norm_reg_kernel" + targs({G, NIT, ADD, GATE});
    emu::launch(dim3(blocks), dim3(G == 32 ? 128 : G), [&] { norm_reg_kernel<G, NIT, ADD, GATE>(a); }, uint64_t(a.n));
}
template <int G, int V, bool ADD, bool GATE> void run_stream(const NormArgs & a) {
    const unsigned blocks = unsigned(G == 32 ? (a.nrows + 3) / 4 : a.nrows);
    last_kernel           = "norm_stream_kernel" + targs({G, V, ADD, GATE});
    emu::launch(dim3(blocks), dim3(G == 32 ? 128 : G), [&] { norm_stream_kernel<G, V, ADD, GATE>(a); }, uint64_t(a.n));
}
// The selection of norm.cu's launch_norm.
template <bool ADD, bool GATE = false> void run_norm(const NormArgs & a, bool vec) {
    const int64_t n = a.n;
    if (vec) {
        if (n <= 128) return run_reg<32, 1, ADD, GATE>(a);
        if (n <= 256) return run_reg<32, 2, ADD, GATE>(a);
        if (n <= 512) return run_reg<32, 4, ADD, GATE>(a);
        if (n <= 1024) return run_reg<32, 8, ADD, GATE>(a);
        if (n <= 2048) return run_reg<256, 2, ADD, GATE>(a);
        if (n <= 4096) return run_reg<256, 4, ADD, GATE>(a);
        if (n <= 8192) return run_reg<256, 8, ADD, GATE>(a);
        if (n <= 16384) return run_reg<512, 8, ADD, GATE>(a);
        return run_stream<1024, 4, ADD, GATE>(a);
    }
    if (n <= 1024) return run_stream<32, 1, ADD, GATE>(a);
    if (n <= 8192) return run_stream<256, 1, ADD, GATE>(a);
    return run_stream<1024, 1, ADD, GATE>(a);
}

void test_norms() {
    const float eps = 1e-6f;
    for (int64_t n : {64, 127, 128, 200, 1000, 1024, 2048, 4096, 6000, 10240, 20000})
        for (int64_t rows : {1, 3, 6})
            for (int variant = 0; variant < 9; ++variant) {
                // 0 rms w, 1 rms zc, 2 rms no w, 3 l2, 4 add+rms w, 5 add (b broadcast) + rms zc,
                // 6 rms w gated by silu(b) (rms_norm_gated), 7 rms w of a row split over ranks (the
                // sums of squares given: rms_norm_split), 8 rms zc gated, split
                if (n >= 10240 && rows > 1) continue;
                const bool add = variant == 4 || variant == 5, l2 = variant == 3, zc = variant == 1 || variant == 5 || variant == 8,
                           has_w = variant != 2 && !l2;
                const bool bcast = variant == 5, gate = variant == 6 || variant == 8, split = variant == 7 || variant == 8;
                const int64_t st  = n + (n % 4 ? 1 : 4);  // row stride (floats): a gap after every row
                std::vector<float> x(static_cast<size_t>(st * rows)), b(static_cast<size_t>(st * rows)), w(static_cast<size_t>(n)), out(static_cast<size_t>(st * rows), NAN),
                    sum(static_cast<size_t>(st * rows), NAN);
                for (auto & v : x) v = randn() * 2.0f;
                for (auto & v : b) v = randn();
                for (auto & v : w) v = zc ? 0.1f * randn() : 1.0f + 0.1f * randn();
                NormArgs a;
                a.x = rows_at(x.data(), st), a.out = rows_at(out.data(), st), a.b = rows_at(b.data(), bcast ? 0 : st),
                a.sum = rows_at(sum.data(), st);
                a.w = has_w ? w.data() : nullptr, a.n = n, a.nrows = rows, a.eps = eps, a.zero_centered = zc, a.l2 = l2,
                a.b_one_row = bcast;
                if (gate) a.gate = rows_at(b.data(), st);
                // Split: the whole row is 3n wide (this rank's part and two others'): its sums of
                // squares, one per row at a stride of 2 floats (a strided view), are not x's own.
                const float        width = float(3 * n);
                std::vector<float> sums(static_cast<size_t>(2 * rows), NAN);
                for (int64_t r = 0; r < rows; ++r) sums[size_t(2 * r)] = float(n) * (4.0f + 3.0f * float(r)) + 0.25f * randn();
                if (split) a.sums = rows_at(sums.data(), 2), a.sums_n = width;
                const bool vec = n % 4 == 0;
                {
                    // x, b and the sums come from earlier kernels; out and sum must not be written before the wait.
                    PdlGuard g({pdl::model::in(x.data(), x.size() * 4), pdl::model::in(add || gate ? b.data() : nullptr, b.size() * 4),
                                pdl::model::in(split ? sums.data() : nullptr, sums.size() * 4),
                                pdl::model::out(out.data(), out.size() * 4), pdl::model::out(add ? sum.data() : nullptr, sum.size() * 4)});
                    if (add) run_norm<true>(a, vec);
                    else if (gate) run_norm<false, true>(a, vec);
                    else run_norm<false>(a, vec);
                    g.check(last_kernel + " n=" + std::to_string(n) + " rows=" + std::to_string(rows) + " variant " + std::to_string(variant));
                }
                // reference (CPU backend: ADD, then RMS_NORM / L2_NORM with a double sum of squares;
                // split: the given sum over `width` elements)
                std::vector<float> ref(static_cast<size_t>(n)), refsum(static_cast<size_t>(n));
                double             worst = 0;
                bool               sum_ok = true;
                for (int64_t r = 0; r < rows; ++r) {
                    const float * xr = x.data() + r * st;
                    for (int64_t i = 0; i < n; ++i) refsum[size_t(i)] = add ? xr[i] + b[size_t((bcast ? 0 : r) * st + i)] : xr[i];
                    double ss = 0;
                    for (int64_t i = 0; i < n; ++i) ss += double(refsum[size_t(i)]) * refsum[size_t(i)];
                    if (split) ss = double(sums[size_t(2 * r)]);
                    const float inv = l2 ? 1.0f / std::sqrt(float(ss) + eps)
                                         : 1.0f / std::sqrt(float(ss / double(split ? width : float(n))) + eps);
                    for (int64_t i = 0; i < n; ++i) {
                        float v = refsum[size_t(i)] * inv;
                        if (has_w) v *= zc ? (1.0f + w[size_t(i)]) : w[size_t(i)];
                        if (gate) {  // SWIGLU's expression: silu(g) * v
                            const float gi = b[size_t(r * st + i)];
                            v              = gi / (1.0f + std::exp(-gi)) * v;
                        }
                        ref[size_t(i)] = v;
                    }
                    worst = std::max(worst, nmse(out.data() + r * st, ref.data(), size_t(n)));
                    if (add) sum_ok = sum_ok && std::memcmp(sum.data() + r * st, refsum.data(), size_t(n) * 4) == 0;
                    if (std::isfinite(out[size_t(r * st + n)])) worst = INFINITY;  // wrote past the row
                }
                expect(worst <= 1e-12 && sum_ok, "norm n=" + std::to_string(n) + " rows=" + std::to_string(rows) + " variant " +
                                                     std::to_string(variant) + " nmse " + std::to_string(worst));
            }
}

// SUM_SQR (sum_sqr_kernel, as norm.cu's op_sum_sqr selects it): per row scale * sum of squares into a
// [1, rows] output, against the CPU backend's double sum.
template <int G, int V> void run_sum_sqr(const NormArgs & a) {
    const unsigned blocks = unsigned(G == 32 ? (a.nrows + 3) / 4 : a.nrows);
    last_kernel           = "sum_sqr_kernel" + targs({G, V});
    emu::launch(dim3(blocks), dim3(G == 32 ? 128 : G), [&] { sum_sqr_kernel<G, V>(a); }, uint64_t(a.n) + 11);
}

void test_sum_sqr() {
    for (int64_t n : {0, 64, 127, 128, 1000, 1024, 2048, 4096, 6000, 10240, 20000})
        for (int64_t rows : {1, 3, 6})
            for (const float scale : {1.0f, 0.0f, 0.5f}) {
                if (n >= 10240 && rows > 1) continue;
                const int64_t      st = n + (n % 4 ? 1 : 4);  // a gap after every row
                std::vector<float> x(static_cast<size_t>(st * rows) + 1), out(static_cast<size_t>(rows + 1), NAN);
                for (auto & v : x) v = randn() * 2.0f;
                NormArgs a;
                a.x = rows_at(x.data(), st), a.out = rows_at(out.data(), 1), a.n = n, a.nrows = rows, a.scale = scale;
                const bool vec = n % 4 == 0;
                {
                    PdlGuard g({pdl::model::in(x.data(), x.size() * 4), pdl::model::out(out.data(), out.size() * 4)});
                    if (vec) {
                        if (n <= 1024) run_sum_sqr<32, 4>(a);
                        else if (n <= 8192) run_sum_sqr<256, 4>(a);
                        else run_sum_sqr<1024, 4>(a);
                    } else {
                        if (n <= 1024) run_sum_sqr<32, 1>(a);
                        else if (n <= 8192) run_sum_sqr<256, 1>(a);
                        else run_sum_sqr<1024, 1>(a);
                    }
                    g.check(last_kernel + " n=" + std::to_string(n) + " rows=" + std::to_string(rows));
                }
                // reference: the CPU backend's op_sum_sqr (a double sum, rounded, times the scale);
                // f32 sums of n squares: relative error below n * 2^-24
                double worst = 0;
                for (int64_t r = 0; r < rows; ++r) {
                    double ss = 0;
                    for (int64_t i = 0; i < n; ++i) ss += double(x[size_t(r * st + i)]) * x[size_t(r * st + i)];
                    const float ref = float(ss) * scale, got = out[size_t(r)];
                    const double e  = !std::isfinite(got) ? INFINITY : ref == 0.0f ? std::fabs(got) : std::fabs(double(got) - ref) / ref;
                    worst           = std::max(worst, e);
                }
                if (!std::isnan(out[size_t(rows)])) worst = INFINITY;  // wrote past the last row
                expect(worst <= 1e-5, "sum_sqr n=" + std::to_string(n) + " rows=" + std::to_string(rows) + " scale " +
                                          std::to_string(scale) + " rel err " + std::to_string(worst));
            }
}

// ---------------------------------------------------------------- rope (+ fused norm)

void test_rope() {
    struct Cfg {
        int   hd, nh, n_rot;
        float theta;
        bool  zc, has_w;
    };
    const Cfg cfgs[] = {
        {128, 32, 128, 1e6f, false, true}, {128, 8, 128, 1e6f, false, true}, {256, 16, 64, 1e7f, true, true},
        {64, 4, 64, 1e4f, false, false},   {256, 4, 256, 1e6f, false, true}, {128, 4, 32, 1e4f, true, true},
        {96, 3, 80, 1e4f, false, true},    {512, 2, 512, 1e6f, false, true}, {600, 2, 64, 1e4f, false, true},
    };
    // One set of heads: strided input, contiguous output, its own norm weight.
    struct Heads {
        int                nh = 0;
        int64_t            s1 = 0, s2 = 0;
        std::vector<float> x, w, o;
    };
    auto make_heads = [](const Cfg & c, int nh, int T) {
        Heads h;
        h.nh = nh, h.s1 = c.hd + 4, h.s2 = h.s1 * (nh + 1);
        h.x.resize(static_cast<size_t>(h.s2 * T)), h.w.resize(static_cast<size_t>(c.hd));
        h.o.assign(static_cast<size_t>(c.hd * nh * T + 1), NAN);
        for (auto & v : h.x) v = randn() * 2.0f;
        for (auto & v : h.w) v = c.zc ? 0.1f * randn() : 1.0f + 0.1f * randn();
        return h;
    };
    // mode 0: ROPE, 1: RMS_NORM + ROPE, 2: the fused pair (q heads, then a second set of k heads in
    // the same launch: RopeArgs::second, op_rms_norm_rope_pair).
    for (const Cfg & c : cfgs)
        for (int T : {1, 5})
            for (int mode = 0; mode < 3; ++mode) {
                const bool fused = mode >= 1, pair = mode == 2;
                if (fused && c.hd - c.n_rot > kMaxCopyReg) continue;  // the launcher falls back to two ops
                Heads q = make_heads(c, c.nh, T), k = make_heads(c, pair ? std::max(1, c.nh / 4) : 0, T);
                std::vector<int32_t> pos(static_cast<size_t>(T));
                for (int t = 0; t < T; ++t) pos[size_t(t)] = T == 1 ? 31999 : t * 7919 % 40000;
                RopeArgs  a;
                RopeFreqs f{};
                const int half = c.n_rot / 2;
                for (int i = 0; i < half; ++i) f.inv_freq[i] = 1.0f / std::pow(c.theta, float(2 * i) / float(c.n_rot));
                a.x = reinterpret_cast<const char *>(q.x.data()), a.o = reinterpret_cast<char *>(q.o.data()), a.pos = pos.data();
                a.x_nb1 = q.s1 * 4, a.x_nb2 = q.s2 * 4, a.o_nb1 = c.hd * 4, a.o_nb2 = int64_t(c.hd) * q.nh * 4;
                a.hd = c.hd, a.nh = q.nh, a.n_rot = c.n_rot, a.items = q.nh * T;
                a.w = c.has_w ? q.w.data() : nullptr, a.eps = 1e-6f, a.zc = c.zc;
                if (pair)
                    a.second = RopeHeads{reinterpret_cast<const char *>(k.x.data()), reinterpret_cast<char *>(k.o.data()),
                                         c.has_w ? k.w.data() : nullptr, k.s1 * 4, k.s2 * 4, c.hd * 4, int64_t(c.hd) * k.nh * 4,
                                         k.nh, k.nh * T};
                const unsigned blocks = unsigned((a.items + a.second.items + kRopeWarps - 1) / kRopeWarps);
                auto go = [&](auto np_tag, auto nc_tag) {
                    constexpr int NP = decltype(np_tag)::value, NC = decltype(nc_tag)::value;
                    last_kernel      = "rope_kernel" + targs({NP, NC, fused}) + (pair ? " (q/k pair)" : "");
                    if (fused) emu::launch(dim3(blocks), dim3(32 * kRopeWarps), [&] { rope_kernel<NP, NC, true>(a, f); });
                    else emu::launch(dim3(blocks), dim3(32 * kRopeWarps), [&] { rope_kernel<NP, NC, false>(a, f); });
                };
                auto go_np = [&](auto np_tag) {  // rope.cu's launch_np
                    const int copy = c.hd - c.n_rot;
                    if (copy == 0) go(np_tag, std::integral_constant<int, 0>{});
                    else if (copy <= 64) go(np_tag, std::integral_constant<int, 2>{});
                    else go(np_tag, std::integral_constant<int, 8>{});
                };
                {
                    // x comes from an earlier kernel (pos is uploaded by the host before the step).
                    PdlGuard g({pdl::model::in(q.x.data(), q.x.size() * 4), pdl::model::out(q.o.data(), q.o.size() * 4),
                                pdl::model::in(pair ? k.x.data() : nullptr, k.x.size() * 4),
                                pdl::model::out(pair ? k.o.data() : nullptr, k.o.size() * 4)});
                    if (half <= 32) go_np(std::integral_constant<int, 1>{});
                    else if (half <= 64) go_np(std::integral_constant<int, 2>{});
                    else if (half <= 128) go_np(std::integral_constant<int, 4>{});
                    else go_np(std::integral_constant<int, 8>{});
                    g.check(last_kernel + " hd=" + std::to_string(c.hd) + " n_rot=" + std::to_string(c.n_rot) + " T=" + std::to_string(T));
                }
                // reference: (RMS_NORM then) ROPE, the CPU backend's expressions, per set of heads
                auto check_heads = [&](const Heads & hs, const char * which) {
                    std::vector<float> ref(static_cast<size_t>(c.hd * hs.nh * T)), y(static_cast<size_t>(c.hd));
                    for (int t = 0; t < T; ++t)
                        for (int h = 0; h < hs.nh; ++h) {
                            const float * xr = hs.x.data() + t * hs.s2 + h * hs.s1;
                            for (int i = 0; i < c.hd; ++i) y[size_t(i)] = xr[i];
                            if (fused) {
                                double ss = 0;
                                for (int i = 0; i < c.hd; ++i) ss += double(y[size_t(i)]) * y[size_t(i)];
                                const float inv = 1.0f / std::sqrt(float(ss / double(c.hd)) + 1e-6f);
                                for (int i = 0; i < c.hd; ++i) {
                                    float v = y[size_t(i)] * inv;
                                    if (c.has_w) v *= c.zc ? (1.0f + hs.w[size_t(i)]) : hs.w[size_t(i)];
                                    y[size_t(i)] = v;
                                }
                            }
                            float *     rr = ref.data() + (size_t(t) * hs.nh + h) * c.hd;
                            const float p  = float(pos[size_t(t)]);
                            for (int i = 0; i < half; ++i) {
                                const float ang = p * f.inv_freq[i];
                                const float cs = std::cos(ang), sn = std::sin(ang);
                                rr[i]        = y[size_t(i)] * cs - y[size_t(i + half)] * sn;
                                rr[i + half] = y[size_t(i + half)] * cs + y[size_t(i)] * sn;
                            }
                            for (int i = c.n_rot; i < c.hd; ++i) rr[i] = y[size_t(i)];
                        }
                    const double e = nmse(hs.o.data(), ref.data(), ref.size());
                    expect(e <= 1e-12 && !std::isfinite(hs.o.back()),
                           std::string("rope ") + which + " hd=" + std::to_string(c.hd) + " n_rot=" + std::to_string(c.n_rot) +
                               " T=" + std::to_string(T) + (fused ? " fused" : "") + (pair ? " pair" : "") + " nmse " + std::to_string(e));
                };
                check_heads(q, "q");
                if (pair) check_heads(k, "k");
            }

    // The RMS_NORM of whole rows (the mean over every head of a token) + RoPE of the heads, q rows and
    // optionally k rows in one launch (rope_row_norm_kernel, op_whole_norm_rope_pair): MiniMax-M2's
    // 48 + 8 heads of 128 with 64 rotated dims, and the other register layouts the launcher takes.
    struct RowCfg {
        int  hd, nq, nk, n_rot;
        bool zc, has_w;
    };
    const RowCfg row_cfgs[] = {{128, 48, 8, 64, false, true}, {128, 64, 0, 128, true, true}, {64, 3, 1, 64, false, false},
                               {256, 16, 4, 256, false, true}, {96, 5, 2, 32, true, true}, {128, 1, 1, 64, false, true}};
    for (const RowCfg & c : row_cfgs)
        for (int T : {1, 3}) {
            struct Rows {
                int                nh = 0;
                int64_t            st = 0;  // row stride (floats)
                std::vector<float> x, w, o;
            };
            auto make_rows = [&](int nh) {
                Rows r;
                r.nh = nh, r.st = int64_t(c.hd) * nh + 8;
                r.x.resize(static_cast<size_t>(r.st * T)), r.w.resize(static_cast<size_t>(c.hd * nh));
                r.o.assign(static_cast<size_t>(c.hd * nh * T + 1), NAN);
                for (auto & v : r.x) v = randn() * 2.0f;
                for (auto & v : r.w) v = c.zc ? 0.1f * randn() : 1.0f + 0.1f * randn();
                return r;
            };
            Rows                 q = make_rows(c.nq), k = make_rows(c.nk);
            std::vector<int32_t> pos(static_cast<size_t>(T));
            for (int t = 0; t < T; ++t) pos[size_t(t)] = T == 1 ? 31999 : t * 7919 % 40000;
            RopeArgs  a;
            RopeFreqs f{};
            const int half = c.n_rot / 2;
            for (int i = 0; i < half; ++i) f.inv_freq[i] = 1.0f / std::pow(5e6f, float(2 * i) / float(c.n_rot));
            a.x = reinterpret_cast<const char *>(q.x.data()), a.o = reinterpret_cast<char *>(q.o.data()), a.pos = pos.data();
            a.x_nb1 = c.hd * 4, a.x_nb2 = q.st * 4, a.o_nb1 = c.hd * 4, a.o_nb2 = int64_t(c.hd) * q.nh * 4;
            a.hd = c.hd, a.nh = q.nh, a.n_rot = c.n_rot, a.items = T;
            a.w = c.has_w ? q.w.data() : nullptr, a.eps = 1e-6f, a.zc = c.zc;
            if (c.nk)
                a.second = RopeHeads{reinterpret_cast<const char *>(k.x.data()), reinterpret_cast<char *>(k.o.data()),
                                     c.has_w ? k.w.data() : nullptr, c.hd * 4, k.st * 4, c.hd * 4, int64_t(c.hd) * k.nh * 4, k.nh, T};
            const int copy = c.hd - c.n_rot;
            auto      go   = [&](auto np_tag, auto nc_tag) {
                constexpr int NP = decltype(np_tag)::value, NC = decltype(nc_tag)::value;
                last_kernel      = "rope_row_norm_kernel" + targs({NP, NC});
                emu::launch(dim3(unsigned(T + (c.nk ? T : 0))), dim3(32 * kRowWarps), [&] { rope_row_norm_kernel<NP, NC>(a, f); });
            };
            {
                // x comes from an earlier kernel; the norm weights are read before the wait.
                PdlGuard g({pdl::model::in(q.x.data(), q.x.size() * 4), pdl::model::out(q.o.data(), q.o.size() * 4),
                            pdl::model::in(c.nk ? k.x.data() : nullptr, k.x.size() * 4),
                            pdl::model::out(c.nk ? k.o.data() : nullptr, k.o.size() * 4)});
                using I0 = std::integral_constant<int, 0>;
                using I2 = std::integral_constant<int, 2>;
                if (half <= 32) copy == 0 ? go(std::integral_constant<int, 1>{}, I0{}) : go(std::integral_constant<int, 1>{}, I2{});
                else if (half <= 64) copy == 0 ? go(std::integral_constant<int, 2>{}, I0{}) : go(std::integral_constant<int, 2>{}, I2{});
                else copy == 0 ? go(std::integral_constant<int, 4>{}, I0{}) : go(std::integral_constant<int, 4>{}, I2{});
                g.check(last_kernel + " hd=" + std::to_string(c.hd) + " heads " + std::to_string(c.nq) + "+" + std::to_string(c.nk));
            }
            // reference: the CPU backend's RMS_NORM of the whole row (a double sum of squares), then
            // ROPE of each head; nmse 1e-12 (the kernel's float sum in another order: ~1e-14)
            auto check_rows = [&](const Rows & rs, const char * which) {
                const int          L = c.hd * rs.nh;
                std::vector<float> ref(static_cast<size_t>(L * T)), y(static_cast<size_t>(L));
                for (int t = 0; t < T; ++t) {
                    const float * xr = rs.x.data() + t * rs.st;
                    double        ss = 0;
                    for (int i = 0; i < L; ++i) ss += double(xr[i]) * xr[i];
                    const float inv = 1.0f / std::sqrt(float(ss / double(L)) + 1e-6f);
                    for (int i = 0; i < L; ++i) {
                        float v = xr[i] * inv;
                        if (c.has_w) v *= c.zc ? (1.0f + rs.w[size_t(i)]) : rs.w[size_t(i)];
                        y[size_t(i)] = v;
                    }
                    const float p = float(pos[size_t(t)]);
                    for (int h = 0; h < rs.nh; ++h) {
                        const float * yh = y.data() + h * c.hd;
                        float *       rr = ref.data() + (size_t(t) * rs.nh + h) * c.hd;
                        for (int i = 0; i < half; ++i) {
                            const float ang = p * f.inv_freq[i];
                            const float cs = std::cos(ang), sn = std::sin(ang);
                            rr[i]        = yh[i] * cs - yh[i + half] * sn;
                            rr[i + half] = yh[i + half] * cs + yh[i] * sn;
                        }
                        for (int i = c.n_rot; i < c.hd; ++i) rr[i] = yh[i];
                    }
                }
                const double e = nmse(rs.o.data(), ref.data(), ref.size());
                expect(e <= 1e-12 && !std::isfinite(rs.o.back()), std::string("rope row norm ") + which + " hd=" + std::to_string(c.hd) +
                                                                      " heads=" + std::to_string(rs.nh) + " T=" + std::to_string(T) +
                                                                      " nmse " + std::to_string(e));
            };
            check_rows(q, "q");
            if (c.nk) check_rows(k, "k");
        }
}

// ---------------------------------------------------------------- moe route / combine

// The kernel's arithmetic (float softmax sum: per lane in slot order, then the xor butterfly) and the
// CPU backend's selection rule; with this reference the weights must be bit-identical.
// Sigmoid scoring (MiniMax-M2): p = 1 / (1 + exp(-x)), chosen by p + bias, weighted by p.
void route_ref(const float * x, int E, int k, bool normalize, std::vector<float> & w, std::vector<int32_t> & ids, bool sigmoid = false,
               const float * bias = nullptr) {
    std::vector<float> p(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
    if (sigmoid) {
        for (int e = 0; e < E; ++e) {
            p[size_t(e)]      = 1.0f / (1.0f + std::exp(-x[e]));
            choice[size_t(e)] = p[size_t(e)] + (bias ? bias[e] : 0.0f);
        }
    } else {
        float m = -INFINITY;
        for (int e = 0; e < E; ++e)
            if (x[e] > m) m = x[e];
        bool any_nan = false;
        for (int e = 0; e < E; ++e) any_nan = any_nan || x[e] != x[e];
        if (any_nan) m = NAN;
        std::vector<float> ex(static_cast<size_t>(E));
        float              lane_s[32] = {};
        for (int e = 0; e < E; ++e) {
            ex[size_t(e)] = std::exp(x[e] - m);
            lane_s[e % 32] += ex[size_t(e)];
        }
        for (int o = 16; o > 0; o >>= 1) {
            float nxt[32];
            for (int l = 0; l < 32; ++l) nxt[l] = lane_s[l] + lane_s[l ^ o];
            std::memcpy(lane_s, nxt, sizeof nxt);
        }
        const float s = lane_s[0];
        for (int e = 0; e < E; ++e) choice[size_t(e)] = p[size_t(e)] = ex[size_t(e)] / s;
    }
    std::vector<int> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    auto key = [&](int a) { return choice[size_t(a)] == choice[size_t(a)] ? choice[size_t(a)] : -INFINITY; };
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int c) { return key(a) > key(c) || (key(a) == key(c) && a < c); });
    float wsum = 0.0f;
    for (int j = 0; j < k; ++j) wsum += p[size_t(order[size_t(j)])];
    w.resize(size_t(k));
    ids.resize(size_t(k));
    for (int j = 0; j < k; ++j) {
        w[size_t(j)]   = normalize ? p[size_t(order[size_t(j)])] / wsum : p[size_t(order[size_t(j)])];
        ids[size_t(j)] = order[size_t(j)];
    }
}

void test_moe() {
    struct Cfg {
        int E, k;
    };
    // score 0: softmax; 1: sigmoid; 2: sigmoid chosen with a bias (MiniMax-M2's 256 experts, top-8)
    for (int score = 0; score < 3; ++score)
    for (Cfg c : {Cfg{8, 2}, Cfg{128, 8}, Cfg{512, 10}, Cfg{60, 4}, Cfg{512, 16}, Cfg{256, 8}, Cfg{64, 32}, Cfg{33, 1}, Cfg{20, 20},
                  Cfg{129, 8}, Cfg{200, 32}, Cfg{300, 10}, Cfg{257, 8}, Cfg{512, 32}})  // (past 256: the block-per-token kernel, partial warps)
        for (int kind = 0; kind < 4; ++kind)  // 0 random, 1 ties (pairs of equal logits), 2 quantised (many ties), 3 a NaN
            for (bool normalize : {false, true})
            for (bool shared : {false, true}) {  // the shared expert's id E after the k chosen (Qwen3-Next)
                if (score > 0 && !normalize) continue;  // sigmoid routers renormalise
                if (shared && (c.k == kMaxTopK || kind == 1 || kind == 2)) continue;
                const int width = 2 * c.k + (shared ? 1 : 0);
                std::vector<float> bias(static_cast<size_t>(c.E));
                for (auto & v : bias) v = randn() * 0.05f;  // of the order of the scores' spread

                const int rows = 6, st = c.E + 3;
                std::vector<float> x(static_cast<size_t>(st * rows));
                for (auto & v : x) v = randn() * 2.0f;
                for (int r = 0; r < rows; ++r) {
                    float * xr = x.data() + r * st;
                    if (kind == 1)
                        for (int e = 0; e + 1 < c.E; e += 2) xr[e + 1] = xr[e];
                    if (kind == 2)
                        for (int e = 0; e < c.E; ++e) xr[e] = std::round(xr[e]);
                    if (kind == 3 && r == 2) xr[c.E / 2] = NAN;
                }
                std::vector<float> out(static_cast<size_t>(width * rows), NAN);
                RouteArgs          a;
                a.logits = rows_at(x.data(), st), a.out = rows_at(out.data(), width), a.n_expert = c.E, a.nrows = rows,
                a.k = c.k, a.normalize = normalize, a.shared = shared;
                a.sigmoid = score > 0;
                a.bias    = score == 2 ? bias.data() : nullptr;
                const RouteLaunch rl     = route_launch_for(c.E);
                const unsigned    blocks = unsigned((rows + rl.rows_per_block - 1) / rl.rows_per_block);
                {
                    // The bias is a weight (not armed: the kernel reads it before its wait).
                    PdlGuard g({pdl::model::in(x.data(), x.size() * 4),
                                pdl::model::out(out.data(), out.size() * 4)});
                    last_kernel = c.E <= 256 ? "moe_route_kernel" + targs({c.E <= 32 ? 1 : c.E <= 64 ? 2 : c.E <= 128 ? 4 : 8})
                                             : "moe_route_wide_kernel" + targs({4});
                    emu::launch(dim3(blocks), dim3(unsigned(rl.threads)), [&] { rl.kernel(a); }, uint64_t(c.E * 31 + kind));
                    g.check(last_kernel + " E=" + std::to_string(c.E) + " k=" + std::to_string(c.k) + " kind " + std::to_string(kind));
                }
                bool ok = true;
                for (int r = 0; r < rows; ++r) {
                    std::vector<float>   w;
                    std::vector<int32_t> ids;
                    route_ref(x.data() + r * st, c.E, c.k, normalize, w, ids, score > 0, score == 2 ? bias.data() : nullptr);
                    const float *   gw   = out.data() + r * width;
                    const int32_t * gids = reinterpret_cast<const int32_t *>(gw + c.k);
                    for (int j = 0; j < c.k; ++j) {
                        ok = ok && gids[j] == ids[size_t(j)];
                        ok = ok && (std::memcmp(&gw[j], &w[size_t(j)], 4) == 0 || (gw[j] != gw[j] && w[size_t(j)] != w[size_t(j)]));
                    }
                    if (shared) ok = ok && gids[c.k] == c.E;
                }
                expect(ok, "moe_route E=" + std::to_string(c.E) + " k=" + std::to_string(c.k) + " kind " + std::to_string(kind) +
                               (normalize ? " norm" : "") + (score == 1 ? " sigmoid" : score == 2 ? " sigmoid+bias" : "") +
                               (shared ? " shared slot" : ""));
            }
    // Exact ties with known answers: logits [3, 1, 3, 3, 0, 1, 1, 1], k = 4 -> ids 0, 2, 3, 1.
    {
        std::vector<float> x = {3, 1, 3, 3, 0, 1, 1, 1}, out(8);
        RouteArgs          a;
        a.logits = rows_at(x.data(), 8), a.out = rows_at(out.data(), 8), a.n_expert = 8, a.nrows = 1, a.k = 4, a.normalize = true;
        PdlGuard g({pdl::model::in(x.data(), x.size() * 4), pdl::model::out(out.data(), out.size() * 4)});
        emu::launch(dim3(1), dim3(128), [&] { moe_route_kernel<1>(a); });
        g.check("moe_route_kernel<1> known ties");
        const int32_t * ids = reinterpret_cast<const int32_t *>(out.data() + 4);
        expect(ids[0] == 0 && ids[1] == 2 && ids[2] == 3 && ids[3] == 1, "moe_route known ties");
    }

    // shared: Qwen3-Next's shared expert added as s * sigmoid(g) in the same kernel.
    for (bool shared : {false, true})
    for (int k : {1, 3, 8, 10, 16, 20})
        for (int64_t H : {2048, 130, 64})
            for (int T : {1, 3}) {
                if (shared && k != 10 && k != 3) continue;
                std::vector<float> y(static_cast<size_t>(H * k * T)), w(static_cast<size_t>(2 * k * T)), o(static_cast<size_t>(H * T));
                std::vector<float> sx(static_cast<size_t>(H * T)), sg(static_cast<size_t>(2 * T));
                for (auto & v : y) v = randn();
                for (auto & v : w) v = randn();
                for (auto & v : sx) v = randn();
                for (auto & v : sg) v = randn() * 3.0f;
                CombineArgs a;
                a.y = reinterpret_cast<const char *>(y.data()), a.w = reinterpret_cast<const char *>(w.data());
                a.out = rows_at(o.data(), H), a.y_nb1 = H * 4, a.y_nb2 = H * k * 4, a.w_nb1 = 2 * k * 4, a.h = H, a.k = k, a.n_tok = T;
                if (shared) a.s = reinterpret_cast<const char *>(sx.data()), a.g = reinterpret_cast<const char *>(sg.data()), a.s_nb1 = H * 4, a.g_nb1 = 8;
                const bool vec = H % 4 == 0;
                a.chunks       = (H + kCombineThreads * (vec ? 4 : 1) - 1) / (kCombineThreads * (vec ? 4 : 1));
                const unsigned grid = unsigned(std::min<int64_t>(a.n_tok * a.chunks, 5));  // grid-stride too
                {
                    // The experts' outputs and the router's weights come from earlier kernels.
                    PdlGuard g({pdl::model::in(y.data(), y.size() * 4), pdl::model::in(w.data(), w.size() * 4),
                                pdl::model::in(shared ? sx.data() : nullptr, sx.size() * 4),
                                pdl::model::in(shared ? sg.data() : nullptr, sg.size() * 4), pdl::model::out(o.data(), o.size() * 4)});
                    if (vec) {
                        if (k > 8) emu::launch(dim3(grid), dim3(kCombineThreads), [&] { moe_combine_kernel<4, 16>(a); });
                        else emu::launch(dim3(grid), dim3(kCombineThreads), [&] { moe_combine_kernel<4, 8>(a); });
                    } else {
                        if (k > 8) emu::launch(dim3(grid), dim3(kCombineThreads), [&] { moe_combine_kernel<1, 16>(a); });
                        else emu::launch(dim3(grid), dim3(kCombineThreads), [&] { moe_combine_kernel<1, 8>(a); });
                    }
                    g.check(std::string("moe_combine_kernel") + targs({vec ? 4 : 1, k > 8 ? 16 : 8}) + " k=" + std::to_string(k) +
                            " H=" + std::to_string(H) + " T=" + std::to_string(T) + (shared ? " shared" : ""));
                }
                // The CPU backend's order (and MUL_SIGMOID's then ADD's for the shared expert): bitwise.
                bool ok = true;
                for (int t = 0; t < T; ++t)
                    for (int64_t i = 0; i < H; ++i) {
                        float acc = 0.0f;
                        for (int j = 0; j < k; ++j) acc += w[size_t(t * 2 * k + j)] * y[size_t((t * k + j) * H + i)];
                        if (shared) acc = acc + sx[size_t(t * H + i)] * (1.0f / (1.0f + std::exp(-sg[size_t(2 * t)])));
                        ok = ok && std::memcmp(&acc, &o[size_t(t * H + i)], 4) == 0;
                    }
                expect(ok, "moe_combine k=" + std::to_string(k) + " H=" + std::to_string(H) + " T=" + std::to_string(T) +
                               (shared ? " shared" : ""));
            }

    // The producer of op_combine_norm_matmul: + the residual (the ADD's sum), that sum times the
    // norm's weight (zero-centred or not, or none), and each block item's sum of squares.
    for (bool shared : {false, true})
    for (int k : {8, 10})
        for (int64_t H : {3072, 2048, 64})
            for (int T : {1, 2})
                for (int wkind = 0; wkind < 3; ++wkind) {  // 0 no weight, 1 plain, 2 zero-centred
                    if (shared && k == 8) continue;
                    std::vector<float> y(static_cast<size_t>(H * k * T)), w(static_cast<size_t>(2 * k * T)), o(static_cast<size_t>(H * T), NAN);
                    std::vector<float> sx(static_cast<size_t>(H * T)), sg(static_cast<size_t>(2 * T)), r(static_cast<size_t>(H * T)),
                        nw(static_cast<size_t>(H)), nx(static_cast<size_t>(H * T), NAN);
                    for (auto * v : {&y, &w, &sx, &r, &nw})
                        for (auto & e : *v) e = randn();
                    for (auto & v : sg) v = randn() * 3.0f;
                    const int64_t      chunks = (H + kCombineThreads * 4 - 1) / (kCombineThreads * 4);
                    std::vector<float> parts(static_cast<size_t>(chunks * T * kCombineWarps), NAN);
                    CombineArgs        a;
                    a.y = reinterpret_cast<const char *>(y.data()), a.w = reinterpret_cast<const char *>(w.data());
                    a.out = rows_at(o.data(), H), a.y_nb1 = H * 4, a.y_nb2 = H * k * 4, a.w_nb1 = 2 * k * 4, a.h = H, a.k = k, a.n_tok = T;
                    if (shared) a.s = reinterpret_cast<const char *>(sx.data()), a.g = reinterpret_cast<const char *>(sg.data()), a.s_nb1 = H * 4, a.g_nb1 = 8;
                    a.chunks        = chunks;
                    a.resid         = reinterpret_cast<const char *>(r.data()), a.resid_nb1 = H * 4;
                    a.norm_x        = rows_at(nx.data(), H);
                    a.norm_w        = wkind ? nw.data() : nullptr;
                    a.zero_centered = wkind == 2;
                    a.parts         = parts.data();
                    const unsigned grid = unsigned(std::min<int64_t>(T * chunks, 5));
                    {
                        // The residual and the experts' outputs come from earlier kernels, the norm's weight is a weight.
                        PdlGuard g({pdl::model::in(y.data(), y.size() * 4), pdl::model::in(w.data(), w.size() * 4),
                                    pdl::model::in(r.data(), r.size() * 4), pdl::model::in(shared ? sx.data() : nullptr, sx.size() * 4),
                                    pdl::model::in(shared ? sg.data() : nullptr, sg.size() * 4), pdl::model::out(o.data(), o.size() * 4),
                                    pdl::model::out(nx.data(), nx.size() * 4), pdl::model::out(parts.data(), parts.size() * 4)});
                        if (k > 8) emu::launch(dim3(grid), dim3(kCombineThreads), [&] { moe_combine_kernel<4, 16, true>(a); });
                        else emu::launch(dim3(grid), dim3(kCombineThreads), [&] { moe_combine_kernel<4, 8, true>(a); });
                        g.check(std::string("moe_combine_kernel") + targs({4, k > 8 ? 16 : 8}) + " + norm producer k=" + std::to_string(k) +
                                " H=" + std::to_string(H));
                    }
                    // The sum bitwise as the combine then the ADD; the weighted row bitwise; each
                    // warp's squares in another order than the reference's: relative 1e-5 (float
                    // sums of 128 positive terms, each rounding 2^-24).
                    bool ok = true;
                    for (int t = 0; t < T; ++t) {
                        for (int64_t c = 0; c < chunks; ++c) {
                            double ss[kCombineWarps] = {};  // (warp w: the item's 128 columns from 128 w on)
                            for (int64_t i = c * kCombineThreads * 4; i < std::min<int64_t>(H, (c + 1) * kCombineThreads * 4); ++i) {
                                float acc = 0.0f;
                                for (int j = 0; j < k; ++j) acc += w[size_t(t * 2 * k + j)] * y[size_t((t * k + j) * H + i)];
                                if (shared) acc = acc + sx[size_t(t * H + i)] * (1.0f / (1.0f + std::exp(-sg[size_t(2 * t)])));
                                const float sum = r[size_t(t * H + i)] + acc;
                                const float wv  = wkind == 0 ? 1.0f : wkind == 1 ? nw[size_t(i)] : 1.0f + nw[size_t(i)];
                                const float z   = sum * wv;
                                ok = ok && std::memcmp(&sum, &o[size_t(t * H + i)], 4) == 0 && std::memcmp(&z, &nx[size_t(t * H + i)], 4) == 0;
                                ss[(i - c * kCombineThreads * 4) / 128] += double(sum) * sum;
                            }
                            for (int wp = 0; wp < kCombineWarps; ++wp) {
                                const float got = parts[size_t((t * chunks + c) * kCombineWarps + wp)];
                                ok = ok && std::fabs(got - ss[wp]) <= 1e-5 * ss[wp];  // (ss 0: past H, written 0)
                            }
                        }
                    }
                    expect(ok, "moe_combine + norm producer k=" + std::to_string(k) + " H=" + std::to_string(H) + " T=" + std::to_string(T) +
                                   " weight " + std::to_string(wkind) + (shared ? " shared" : ""));
                }
}

// ---------------------------------------------------------------- argmax

int32_t argmax_ref(const float * x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    return int32_t(best);
}

void test_argmax() {
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = INFINITY;
    // 8 values: threads 0 and 1 hold 4 each (the -0 / +0 and NaN rules within and across threads).
    std::vector<std::vector<float>> special = {
        {nan, 1, 2, 0.5f, 1, 1, 1, 1},     {1, nan, 3, 3, 3, nan, 3, 3},        {-inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf},
        {-inf, nan, -5, nan, nan, -5, -6, nan}, {nan, nan, nan, nan, nan, nan, nan, nan}, {0.0f, -0.0f, -1, inf, 1, 2, 3, inf},
        {-0.0f, 0.0f, -1, -2, -3, -4, -5, -6}, {-1, -1, -0.0f, -1, 0.0f, -1, -1, -1}, {-1, -1, 0.0f, -1, -0.0f, -1, -1, -1},
        {-2, -1, -3, -4, -0.0f, 0.0f, -1, -1}, {nan, nan, nan, nan, -inf, nan, -inf, nan},
    };
    for (const auto & row : special) {
        std::vector<float>   x = row;
        std::vector<int32_t> out(1, -1);
        ArgmaxArgs           a;
        a.x = rows_at(x.data(), 8), a.n = 8, a.nrows = 1, a.out = out.data();
        {
            PdlGuard g({pdl::model::in(x.data(), x.size() * 4), pdl::model::out(out.data(), out.size() * 4)});
            emu::launch(dim3(1), dim3(kArgmaxThreads), [&] { argmax_row_kernel<4>(a); });
            g.check("argmax_row_kernel<4> special row");
        }
        expect(out[0] == argmax_ref(x.data(), 8), "argmax special row");
        out[0] = -1;
        {
            PdlGuard g({pdl::model::in(x.data(), x.size() * 4), pdl::model::out(out.data(), out.size() * 4)});
            emu::launch(dim3(1), dim3(kArgmaxThreads), [&] { argmax_row_kernel<1>(a); });
            g.check("argmax_row_kernel<1> special row");
        }
        expect(out[0] == argmax_ref(x.data(), 8), "argmax special row (scalar)");
    }
    for (int64_t n : {5, 64, 2048, 4095, 4096, 20000, 32768, 151936})
        for (int kind = 0; kind < 3; ++kind) {  // 0 random, 1 the row twice (ties), 2 quantised (many ties)
            const int     rows = n > 40000 ? 2 : 3;
            const int64_t st   = n + 4;
            std::vector<float> x(static_cast<size_t>(st * rows));
            for (auto & v : x) v = randn();
            for (int r = 0; r < rows; ++r) {
                float * xr = x.data() + r * st;
                if (kind == 1)
                    for (int64_t i = 0; i < n / 2; ++i) xr[n / 2 + i] = xr[i];
                if (kind == 2)
                    for (int64_t i = 0; i < n; ++i) xr[i] = std::round(xr[i] * 0.5f);
            }
            const bool vec = n % 4 == 0;
            // one block per row
            if (n <= kRowMax) {
                std::vector<int32_t> out(static_cast<size_t>(rows), -1);
                ArgmaxArgs           a;
                a.x = rows_at(x.data(), st), a.n = n, a.nrows = rows, a.out = out.data();
                PdlGuard g({pdl::model::in(x.data(), x.size() * 4), pdl::model::out(out.data(), out.size() * 4)});
                if (vec) emu::launch(dim3(2), dim3(kArgmaxThreads), [&] { argmax_row_kernel<4>(a); });
                else emu::launch(dim3(2), dim3(kArgmaxThreads), [&] { argmax_row_kernel<1>(a); });
                g.check(std::string("argmax_row_kernel") + (vec ? "<4>" : "<1>") + " n=" + std::to_string(n) + " kind " + std::to_string(kind));
                bool ok = true;
                for (int r = 0; r < rows; ++r) ok = ok && out[size_t(r)] == argmax_ref(x.data() + r * st, n);
                expect(ok, "argmax row kernel n=" + std::to_string(n) + " kind " + std::to_string(kind));
            }
            // chunked two-kernel path
            {
                std::vector<int32_t> out(static_cast<size_t>(rows), -1);
                ArgmaxArgs           a;
                a.x = rows_at(x.data(), st), a.n = n, a.nrows = rows, a.out = out.data();
                a.chunks = (n + kChunk - 1) / kChunk;
                std::vector<Best> part(size_t(rows * a.chunks));
                a.partial = part.data();
                const dim3 g1(unsigned(a.chunks), 2);
                {
                    PdlGuard g({pdl::model::in(x.data(), x.size() * 4), pdl::model::out(part.data(), part.size() * sizeof(Best))});
                    if (vec) emu::launch(g1, dim3(kArgmaxThreads), [&] { argmax_chunks_kernel<4>(a); });
                    else emu::launch(g1, dim3(kArgmaxThreads), [&] { argmax_chunks_kernel<1>(a); });
                    g.check(std::string("argmax_chunks_kernel") + (vec ? "<4>" : "<1>") + " n=" + std::to_string(n) + " kind " +
                            std::to_string(kind));
                }
                {
                    // The partials come from the chunks kernel.
                    PdlGuard g({pdl::model::in(part.data(), part.size() * sizeof(Best)), pdl::model::out(out.data(), out.size() * 4)});
                    emu::launch(dim3(unsigned((rows + 3) / 4)), dim3(128), [&] { argmax_rows_kernel(a); });
                    g.check("argmax_rows_kernel n=" + std::to_string(n) + " kind " + std::to_string(kind));
                }
                bool ok = true;
                for (int r = 0; r < rows; ++r) ok = ok && out[size_t(r)] == argmax_ref(x.data() + r * st, n);
                expect(ok, "argmax chunked n=" + std::to_string(n) + " kind " + std::to_string(kind));
            }
        }
}

// ---------------------------------------------------------------- the PDL model's self-test

// Tiny kernels (y = 2 x over n elements, one per thread) that break one rule of pdl.cuh each; the
// model (dev/emu/backends/cuda/common/pdl.cuh) must catch every one.
enum class Pdl { good, read_early, write_early, no_wait, skip_wait, no_trigger };
void pdl_kernel(Pdl how, const float * x, float * y, int n) {
    const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
    if (how == Pdl::skip_wait && i >= n) return;  // the tail threads exit without waiting
    if (how != Pdl::no_trigger) pdl::launch_dependents();
    if (how == Pdl::write_early && i < n) y[i] = 0.0f;
    const float early = how == Pdl::read_early && i < n ? x[i] : 0.0f;
    if (how != Pdl::no_wait) pdl::wait();
    __syncthreads();
    if (i < n) y[i] = 2.0f * (how == Pdl::read_early ? early : x[i]);
}

void test_pdl_model() {
    const int n = 100;  // 2 blocks of 64 threads
    struct Case {
        Pdl         how;
        const char *name, *want;  // want: a substring of the model's report ("" none)
        bool        wrong_y;      // the output must show the poison
    };
    const Case cases[] = {
        {Pdl::good, "follows the rules", "", false},
        {Pdl::read_early, "reads its input before waiting", "", true},
        {Pdl::write_early, "writes before waiting", "written before the first pdl::wait()", false},
        {Pdl::no_wait, "never waits", "128 of 128 threads exited without pdl::wait()", true},
        {Pdl::skip_wait, "tail threads return without waiting", "28 of 128 threads exited without pdl::wait() (first: block 1,0,0 thread 36", false},
        {Pdl::no_trigger, "never triggers", "no thread called pdl::launch_dependents()", false},
    };
    for (const Case & c : cases) {
        std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n), NAN);
        for (auto & v : x) v = randn();
        std::string why;
        {
            PdlGuard g({pdl::model::in(x.data(), x.size() * 4), pdl::model::out(y.data(), y.size() * 4)});
            emu::launch(dim3(2), dim3(64), [&] { pdl_kernel(c.how, x.data(), y.data(), n); }, 7);
            why = g.problems();
        }
        bool y_ok = true;
        for (int i = 0; i < n; ++i) y_ok = y_ok && y[size_t(i)] == 2.0f * x[size_t(i)];
        const bool caught = std::string(c.want).empty() ? why.empty() : why.find(c.want) != std::string::npos;
        expect(caught && y_ok == !c.wrong_y, std::string("pdl model: a kernel that ") + c.name + ": model says \"" + why + "\", output " +
                                                 (y_ok ? "right" : "wrong"));
        // Not armed: wait() and launch_dependents() do nothing.
        std::fill(y.begin(), y.end(), NAN);
        emu::launch(dim3(2), dim3(64), [&] { pdl_kernel(c.how, x.data(), y.data(), n); }, 7);
        y_ok = true;
        for (int i = 0; i < n; ++i) y_ok = y_ok && y[size_t(i)] == 2.0f * x[size_t(i)];
        expect(y_ok || c.how == Pdl::write_early, std::string("pdl model unarmed: a kernel that ") + c.name);
    }
}

}  // namespace

int main(int argc, char ** argv) {
    const std::string only = argc > 1 ? argv[1] : "";
    if (only.empty() || only == "pdl") test_pdl_model();
    if (only.empty() || only == "norm") test_norms();
    if (only.empty() || only == "norm" || only == "sum_sqr") test_sum_sqr();
    if (only.empty() || only == "rope") test_rope();
    if (only.empty() || only == "moe") test_moe();
    if (only.empty() || only == "argmax") test_argmax();
    std::printf("%d checks, %d failures; %d PDL launch checks, %d failures\n", checks, failures, pdl::model::checks(),
                pdl::model::failures());
    return failures || pdl::model::failures() ? 1 : 0;
}
