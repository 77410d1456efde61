// The small ops of the CUDA backend (src/backends/cuda/elementwise/) against the CPU backend, at the
// shapes the models use: 1 / 7 / 512 rows (decode, speculative verify, prefill), row widths 64 / 128
// (per-head q/k norms, head_dim), 2048 / 4096 (hidden sizes), 151936 (Qwen3 vocabulary), strided
// views (q/k/v slices of fused projections, column slices), partial RoPE (64 of 256 dims).
//
// Tolerances (normalized mean squared error against the CPU, see op_harness.h), with the reason:
//   0      copies (CONT, CONCAT, GET_ROWS), ADD, MUL, SCALE: one IEEE operation per element on both
//          sides, so the bits are identical;
//   1e-12  everything else that is float32 arithmetic on both sides: expf (SWIGLU, MUL_SIGMOID,
//          softmax), sinf/cosf (RoPE, same inv_freq bits, <= 2 ulp apart), reduction order and the
//          CPU's double sum of squares (norms), possible FMA contraction on a -march=native CPU
//          build (MOE_COMBINE). A one-ulp relative error everywhere is nmse ~1e-14; any indexing,
//          broadcast or stride mistake is nmse >= 1e-3.
// Integer outputs (ARGMAX, the expert ids of MOE_ROUTE) are I32 tensors, which the harness compares
// exactly (converted to float, every id below 2^24 is exact); ties are built on purpose (a row
// concatenated with itself) so that "first index" / "lower expert id" is checked, not assumed.
// Cases that need known inputs (NaN, ties in RoPE-free ops) inject exact float bits through an I32
// input viewed as F32.
// The fused launchers (op_add_rms_norm, op_rms_norm_rope) are also called directly on hand-made
// device tensors and compared with the CPU backend's unfused ops, including the memory layouts the
// planner may produce (output in place over the input, output overlapping the input with a shift).
#include "op_harness.h"

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/thread_pool.h"
#include "backends/cuda/fusion.h"
#include "backends/cuda/ops.h"
#include "graph/graph.h"

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace test;
using spark::Graph;
using spark::Op;
using spark::RouterScore;

namespace {

constexpr double kExact = 0.0;     // bit-identical (see the header comment)
constexpr double kF32   = 1e-12;   // float32 on both sides, ulp-level differences

const int64_t kRows[]   = {1, 7, 512};
const int64_t kWidths[] = {64, 128, 2048, 4096};

std::string shape_name(const char * op, int64_t n, int64_t rows) {
    return std::string(op) + " [" + std::to_string(n) + ", " + std::to_string(rows) + "]";
}

// A view of `t` retyped as F32 (the same 4-byte cells), for injecting exact float bit patterns.
Tensor * as_f32(Graph & g, Tensor * t) {
    Tensor * v = g.view(t, {t->ne[0], t->ne[1]}, {4, t->nb[1]}, 0);
    v->type    = DType::F32;
    return v;
}

int32_t bits(float f) {
    int32_t i;
    std::memcpy(&i, &f, 4);
    return i;
}

std::vector<int32_t> random_ids(size_t n, int32_t hi, uint32_t seed) {
    std::mt19937                           rng(seed);
    std::uniform_int_distribution<int32_t> d(0, hi - 1);
    std::vector<int32_t>                   v(n);
    for (auto & x : v) x = d(rng);
    return v;
}

}  // namespace

TEST_CASE("cuda elementwise: CONT of strided views") {
    // kExact: a byte copy.
    OpHarness h(11);
    for (int64_t rows : kRows) {
        // Column slice of a wider matrix (the second half of each row): aligned float4 path.
        h.check(shape_name("cont col-slice", 64, rows), kExact, [&](OpBuilder & b) {
            Tensor * x = b.input({128, rows});
            return b.graph().cont(b.graph().view(x, {64, rows}, {4, x->nb[1]}, 64 * 4));
        });
        // Misaligned start (one float in): byte-exact scalar path.
        h.check(shape_name("cont misaligned", 2047, rows), kExact, [&](OpBuilder & b) {
            Tensor * x = b.input({2048, rows});
            return b.graph().cont(b.graph().view(x, {2047, rows}, {4, x->nb[1]}, 4));
        });
        // [hd, nh, T] -> [hd, T, nh] (dims 1 and 2 swapped): rows enumerated over dims 1..3.
        h.check(shape_name("cont permuted 128x8", 128, rows), kExact, [&](OpBuilder & b) {
            Tensor * x = b.input({128, 8, rows});
            return b.graph().cont(b.graph().view(x, {128, rows, 8}, {4, x->nb[2], x->nb[1]}, 0));
        });
    }
    // 4-D with a gap between dims 2 and 3.
    h.check("cont 4-D strided", kExact, [&](OpBuilder & b) {
        Tensor * x = b.input({64, 3, 5, 4});
        return b.graph().cont(b.graph().view(x, {32, 3, 2, 4}, {4, x->nb[1], x->nb[2], x->nb[3]}, 16 * 4));
    });
}

TEST_CASE("cuda elementwise: CONCAT") {
    // kExact: a byte copy.
    OpHarness h(12);
    for (int64_t rows : kRows) {
        h.check(shape_name("concat 128+64+2048", 2240, rows), kExact, [&](OpBuilder & b) {
            Tensor * a = b.input({128, rows});
            Tensor * c = b.input({64, rows});
            Tensor * d = b.input({2048, rows});
            return b.graph().concat(a, c, d);
        });
        // Two sources, one a strided column view with an odd width: 4-byte path.
        h.check(shape_name("concat view 63+4096", 4159, rows), kExact, [&](OpBuilder & b) {
            Tensor * a = b.input({64, rows});
            Tensor * c = b.input({4096, rows});
            return b.graph().concat(b.graph().view(a, {63, rows}, {4, a->nb[1]}, 4), c);
        });
    }
}

TEST_CASE("cuda elementwise: GET_ROWS") {
    // kExact: F16/BF16 -> F32 widening is exact, F32 rows are copied.
    OpHarness h(13);
    const int64_t n_vocab = 1000;
    for (int64_t rows : kRows) {
        const auto ids = random_ids(size_t(rows), int32_t(n_vocab), uint32_t(rows));
        for (WeightFormat f : {WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16}) {
            const std::string name = std::string("get_rows ") + spark::weight_format_name(f) + " K=2048 ids=" + std::to_string(rows);
            h.check(name, kExact, [&](OpBuilder & b) {
                WeightSpec spec;
                spec.format            = f;
                const QWeight & w      = b.weight(n_vocab, 2048, spec);
                Tensor *        id_t   = b.input_i32({rows}, ids);
                return b.graph().get_rows(w, id_t);
            });
        }
        h.check(shape_name("get_rows F32 tensor", 64, rows), kExact, [&](OpBuilder & b) {
            Tensor * src  = b.input({64, 100});
            Tensor * id_t = b.input_i32({rows}, random_ids(size_t(rows), 100, 7));
            return b.graph().get_rows(src, id_t);
        });
        // Rows of a column-sliced tensor: misaligned scalar path.
        h.check(shape_name("get_rows strided tensor", 63, rows), kExact, [&](OpBuilder & b) {
            Tensor * src  = b.input({64, 100});
            Tensor * id_t = b.input_i32({rows}, random_ids(size_t(rows), 100, 9));
            return b.graph().get_rows(b.graph().view(src, {63, 100}, {4, src->nb[1]}, 4), id_t);
        });
    }
}

TEST_CASE("cuda elementwise: GET_ROWS with an out-of-range id writes zeros") {
    // The CPU backend refuses such ids (SPARK_ERR_INVALID_TOKEN), so this runs on the GPU only:
    // the documented contract is a zero row, never a read outside the table.
    const int64_t n = 50, k = 128;
    auto out = run_cuda_only([&](OpBuilder & b) {
        WeightSpec spec;
        spec.format       = WeightFormat::BF16;
        const QWeight & w = b.weight(n, k, spec);
        return b.graph().get_rows(w, b.input_i32({4}, {-1, 3, int32_t(n), 1 << 30}));
    });
    REQUIRE(out.size() == size_t(4 * k));
    double row1 = 0.0;
    for (int64_t i = 0; i < k; ++i) {
        CHECK(out[size_t(i)] == 0.0f);
        CHECK(out[size_t(2 * k + i)] == 0.0f);
        CHECK(out[size_t(3 * k + i)] == 0.0f);
        row1 += std::fabs(out[size_t(k + i)]);
    }
    CHECK(row1 > 0.0);  // the valid id did gather its row
}

TEST_CASE("cuda elementwise: ADD / MUL / SWIGLU / MUL_SIGMOID / SCALE") {
    // ADD, MUL, SCALE kExact (one IEEE op per element); SWIGLU, MUL_SIGMOID kF32 (expf ulps).
    OpHarness h(14);
    for (int64_t rows : kRows)
        for (int64_t n : kWidths) {
            h.check(shape_name("add", n, rows), kExact, [&](OpBuilder & b) { return b.graph().add(b.input({n, rows}), b.input({n, rows})); });
            h.check(shape_name("add row-broadcast", n, rows), kExact,
                    [&](OpBuilder & b) { return b.graph().add(b.input({n, rows}), b.param({n})); });
            h.check(shape_name("mul row-broadcast", n, rows), kExact,
                    [&](OpBuilder & b) { return b.graph().mul(b.input({n, rows}), b.param({n})); });
            h.check(shape_name("mul", n, rows), kExact, [&](OpBuilder & b) { return b.graph().mul(b.input({n, rows}), b.input({n, rows})); });
            h.check(shape_name("swiglu", n, rows), kF32, [&](OpBuilder & b) {
                return b.graph().swiglu(b.input({n, rows}, 4.0f), b.input({n, rows}));
            });
            h.check(shape_name("mul_sigmoid", n, rows), kF32, [&](OpBuilder & b) {
                return b.graph().mul_sigmoid(b.input({n, rows}), b.input({n, rows}, 4.0f));
            });
            h.check(shape_name("mul_sigmoid per-row gate", n, rows), kF32, [&](OpBuilder & b) {
                return b.graph().mul_sigmoid(b.input({n, rows}), b.input({1, rows}, 4.0f));
            });
            h.check(shape_name("scale", n, rows), kExact, [&](OpBuilder & b) { return b.graph().scale(b.input({n, rows}), 0.0883883f); });
        }
    // Strided operands: gate and up as the two halves of one fused [2n, rows] projection; a
    // misaligned view takes the scalar path.
    for (int64_t rows : kRows) {
        h.check(shape_name("swiglu halves of gate_up", 768, rows), kF32, [&](OpBuilder & b) {
            Tensor * gu = b.input({1536, rows}, 3.0f);
            Graph &  g  = b.graph();
            return g.swiglu(g.view(gu, {768, rows}, {4, gu->nb[1]}, 0), g.view(gu, {768, rows}, {4, gu->nb[1]}, 768 * 4));
        });
        h.check(shape_name("add misaligned views", 127, rows), kExact, [&](OpBuilder & b) {
            Tensor * x = b.input({128, rows});
            Tensor * y = b.input({130, rows});
            Graph &  g = b.graph();
            return g.add(g.view(x, {127, rows}, {4, x->nb[1]}, 4), g.view(y, {127, rows}, {4, y->nb[1]}, 12));
        });
        // Gated attention output: [hd, nh, T] times a sigmoid gate of one value per head.
        h.check(shape_name("mul_sigmoid 3-D per-head gate", 256, rows), kF32, [&](OpBuilder & b) {
            return b.graph().mul_sigmoid(b.input({256, 16, rows}), b.input({1, 16, rows}, 3.0f));
        });
    }
}

TEST_CASE("cuda elementwise: RMS_NORM / L2_NORM") {
    // kF32: float32 tree sum of squares on the GPU vs the CPU's double sum (relative ~1e-7).
    OpHarness h(15);
    for (int64_t rows : kRows)
        for (int64_t n : {int64_t(64), int64_t(128), int64_t(1000), int64_t(2048), int64_t(4096), int64_t(6000), int64_t(10240),
                          int64_t(20000)}) {
            h.check(shape_name("rms_norm w", n, rows), kF32,
                    [&](OpBuilder & b) { return b.graph().rms_norm(b.input({n, rows}, 3.0f), b.param({n}, 0.1f, 1.0f), 1e-6f); });
            h.check(shape_name("rms_norm zero-centred", n, rows), kF32, [&](OpBuilder & b) {
                return b.graph().rms_norm(b.input({n, rows}), b.param({n}, 0.1f), 1e-6f, /*zero_centered=*/true);
            });
            h.check(shape_name("rms_norm no weight", n, rows), kF32,
                    [&](OpBuilder & b) { return b.graph().rms_norm(b.input({n, rows}, 0.01f), nullptr, 1e-6f); });
            h.check(shape_name("l2_norm", n, rows), kF32, [&](OpBuilder & b) { return b.graph().l2_norm(b.input({n, rows}), 1e-6f); });
        }
    for (int64_t rows : kRows) {
        // q/k norm on the per-head rows of a strided view (q of a fused [hd * (nh + 2 nkv), T]).
        h.check(shape_name("rms_norm q heads of qkv", 128, rows), kF32, [&](OpBuilder & b) {
            Tensor * qkv = b.input({128 * (16 + 2 * 4), rows});
            Graph &  g   = b.graph();
            Tensor * q   = g.view(qkv, {128, 16, rows}, {4, 128 * 4, qkv->nb[1]}, 0);
            return g.rms_norm(q, b.param({128}, 0.1f, 1.0f), 1e-6f);
        });
        // Qwen3-Next's gated norm: value-head rows of the delta rule's output gated by silu(z), z a
        // [dv, r, n_k_heads, T] view of the in_proj_qkvz output (key heads of [q | k | v | z]); the
        // gate's expf is the SWIGLU kernel's, so kF32 holds as for the plain norm.
        h.check(shape_name("rms_norm_gated z of qkvz", 128, rows), kF32, [&](OpBuilder & b) {
            Graph &       g     = b.graph();
            const int64_t dk = 128, dv = 128, r = 2, nk = 4, group = 2 * dk + 2 * r * dv;
            Tensor *      qkvz  = b.input({group * nk, rows});
            Tensor *      z     = g.view(qkvz, {dv, r, nk, rows}, {4, size_t(dv) * 4, size_t(group) * 4, qkvz->nb[1]},
                                         size_t(2 * dk + r * dv) * 4);
            return g.rms_norm_gated(b.input({dv, r * nk, rows}, 2.0f), b.param({dv}, 0.1f, 1.0f), z, 1e-6f);
        });
        h.check(shape_name("rms_norm_gated misaligned", 127, rows), kF32, [&](OpBuilder & b) {
            Tensor * gate = b.input({128, 4, rows});
            return b.graph().rms_norm_gated(b.input({127, 4, rows}), b.param({127}, 0.1f, 1.0f),
                                            b.graph().view(gate, {127, 4, rows}, {4, gate->nb[1], gate->nb[2]}, 4), 1e-6f);
        });
        // Misaligned rows: scalar path (and an l2 norm of Qwen3-Next's key heads).
        h.check(shape_name("l2_norm misaligned", 127, rows), kF32, [&](OpBuilder & b) {
            Tensor * x = b.input({128, 4, rows});
            return b.graph().l2_norm(b.graph().view(x, {127, 4, rows}, {4, x->nb[1], x->nb[2]}, 4), 1e-6f);
        });
    }
}

TEST_CASE("cuda elementwise: ROPE (full and partial)") {
    // kF32: identical inv_freq and angle bits; CUDA sincosf vs glibc sinf/cosf differ by <= 2 ulp.
    OpHarness h(16);
    h.set_replay_check(true);  // the frequency table travels as a kernel parameter in the graph
    for (int64_t rows : kRows) {
        std::vector<int32_t> pos(static_cast<size_t>(rows));
        for (int64_t i = 0; i < rows; ++i) pos[size_t(i)] = int32_t(rows == 1 ? 31999 : i * 61 % 40000);
        // Qwen3: head_dim 128 fully rotated, theta 1e6.
        h.check(shape_name("rope n_rot=128 [128, 32]", 128, rows), kF32, [&](OpBuilder & b) {
            return b.graph().rope(b.input({128, 32, rows}), b.input_i32({rows}, pos), 128, 1e6f);
        });
        // Qwen3-Next: head_dim 256, partial rotary 0.25 (64 dims), theta 1e7; the rest is copied.
        h.check(shape_name("rope n_rot=64 of 256 [256, 16]", 256, rows), kF32, [&](OpBuilder & b) {
            return b.graph().rope(b.input({256, 16, rows}), b.input_i32({rows}, pos), 64, 1e7f);
        });
        // k heads as a strided view of a fused qkv projection.
        h.check(shape_name("rope k heads of qkv", 128, rows), kF32, [&](OpBuilder & b) {
            Tensor * qkv = b.input({128 * (32 + 2 * 4), rows});
            Graph &  g   = b.graph();
            Tensor * k   = g.view(qkv, {128, 4, rows}, {4, 128 * 4, qkv->nb[1]}, 128 * 32 * 4);
            return g.rope(k, b.input_i32({rows}, pos), 128, 1e6f);
        });
    }
}

TEST_CASE("cuda elementwise: per-head RMS_NORM then ROPE through the graph") {
    // kF32 (the norm's sum of squares order, sincosf ulps). The backend may run the pair as the
    // fused op_rms_norm_rope; either way the result is the CPU's RMS_NORM followed by ROPE.
    OpHarness h(22);
    h.set_replay_check(true);
    for (int64_t rows : kRows) {
        std::vector<int32_t> pos(static_cast<size_t>(rows));
        for (int64_t i = 0; i < rows; ++i) pos[size_t(i)] = int32_t(rows == 1 ? 31999 : i * 61 % 40000);
        h.check(shape_name("q_norm -> rope [128, 32]", 128, rows), kF32, [&](OpBuilder & b) {
            Graph &  g = b.graph();
            Tensor * q = g.rms_norm(b.input({128, 32, rows}, 2.0f), b.param({128}, 0.1f, 1.0f), 1e-6f);
            return g.rope(q, b.input_i32({rows}, pos), 128, 1e6f);
        });
        h.check(shape_name("zero-centred k_norm -> partial rope [256, 2]", 256, rows), kF32, [&](OpBuilder & b) {
            Graph &  g = b.graph();
            Tensor * k = g.rms_norm(b.input({256, 2, rows}), b.param({256}, 0.1f), 1e-6f, /*zero_centered=*/true);
            return g.rope(k, b.input_i32({rows}, pos), 64, 1e7f);
        });
    }
}

TEST_CASE("cuda elementwise: RMS_NORM of whole rows then ROPE of their heads through the graph (MiniMax-M2 q / k)") {
    // kF32 (the sum of squares' order, sincosf ulps). The backend runs each pair, and the q and k
    // pairs together, as op_whole_norm_rope_pair (one launch: the fusion pass's case below); either
    // way the result is the CPU's RMS_NORM followed by ROPE.
    OpHarness h(23);
    h.set_replay_check(true);
    for (int64_t rows : kRows) {
        std::vector<int32_t> pos(static_cast<size_t>(rows));
        for (int64_t i = 0; i < rows; ++i) pos[size_t(i)] = int32_t(rows == 1 ? 31999 : i * 61 % 40000);
        h.check_multi(shape_name("q_norm [6144] -> rope [128, 48]; k_norm [1024] -> rope [128, 8]", 6144, rows), kF32, [&](OpBuilder & b) {
            Graph &  g  = b.graph();
            Tensor * p  = b.input_i32({rows}, pos);
            Tensor * q  = g.rms_norm(b.input({6144, rows}, 2.0f), b.param({6144}, 0.1f, 1.0f), 1e-6f);
            Tensor * rq = g.rope(g.reshape(q, {128, 48, rows}), p, 64, 5e6f);
            Tensor * k  = g.rms_norm(b.input({1024, rows}, 2.0f), b.param({1024}, 0.1f, 1.0f), 1e-6f);
            Tensor * rk = g.rope(g.reshape(k, {128, 8, rows}), p, 64, 5e6f);
            return std::vector<Tensor *>{rq, rk};
        });
        h.check(shape_name("zero-centred norm [2048] -> full rope [64, 32]", 2048, rows), kF32, [&](OpBuilder & b) {
            Graph &  g = b.graph();
            Tensor * x = g.rms_norm(b.input({2048, rows}), b.param({2048}, 0.1f), 1e-6f, /*zero_centered=*/true);
            return g.rope(g.reshape(x, {64, 32, rows}), b.input_i32({rows}, pos), 64, 1e4f);
        });
        h.check(shape_name("unweighted norm [1280] -> partial rope [128, 10]", 1280, rows), kF32, [&](OpBuilder & b) {
            Graph &  g = b.graph();
            Tensor * x = g.rms_norm(b.input({1280, rows}, 3.0f), nullptr, 1e-6f);
            return g.rope(g.reshape(x, {128, 10, rows}), b.input_i32({rows}, pos), 32, 1e4f);
        });
    }
}

TEST_CASE("cuda elementwise: the fusion pass launches a whole-row norm with the RoPE of its heads") {
    // (Host code: the launches the dispatch would make.) The q and k pairs of a MiniMax-M2 layer as
    // graph_builders.cpp orders them: one launch; a norm with a second reader, two launches.
    using Kind = spark::cuda::FusedLaunch::Kind;
    const int64_t T = 2;
    Graph         g;
    Tensor *      pos = g.input(DType::I32, {T}, "pos");
    Tensor *      q   = g.input(DType::F32, {512, T}, "q");
    Tensor *      k   = g.input(DType::F32, {128, T}, "k");
    Tensor *      rq  = g.rope(g.reshape(g.rms_norm(q, nullptr, 1e-6f), {128, 4, T}), pos, 64, 1e6f);
    Tensor *      rk  = g.rope(g.reshape(g.rms_norm(k, nullptr, 1e-6f), {128, 1, T}), pos, 64, 1e6f);
    Tensor *      n2  = g.rms_norm(q, nullptr, 1e-6f);
    Tensor *      r2  = g.rope(g.reshape(n2, {128, 4, T}), pos, 64, 1e6f);
    for (Tensor * t : {rq, rk, r2, n2}) g.mark_output(t);
    spark::cuda::OpContext  ctx;
    spark::cuda::FusionPass pass(g, ctx);
    std::vector<std::string> got;
    for (spark::cuda::FusedLaunch l; pass.next(l);) {
        CHECK((l.kind != Kind::WholeNormRope || (l.count == 4 && l.nodes[1] == rq && l.nodes[3] == rk)));
        got.push_back(l.kind == Kind::Node ? spark::op_name(l.nodes[0]->op) : l.label ? l.label : "?");
    }
    const std::vector<std::string> want = {"RMS_NORM+ROPE (rows) x2", "RMS_NORM", "ROPE"};
    CHECK(got == want);
}

TEST_CASE("cuda elementwise: ARGMAX") {
    // kExact: the output is I32, compared exactly by the harness.
    OpHarness h(17);
    h.set_replay_check(true);  // two kernels and workspace partials inside a captured graph
    for (int64_t rows : {int64_t(1), int64_t(7)}) {
        h.check(shape_name("argmax vocab", 151936, rows), kExact, [&](OpBuilder & b) { return b.graph().argmax(b.input({151936, rows})); });
        // Every row holds its maximum twice (the row concatenated with itself): the first index wins.
        h.check(shape_name("argmax ties", 151936, rows), kExact, [&](OpBuilder & b) {
            Tensor * a = b.input({75968, rows});
            return b.graph().argmax(b.graph().concat(a, a));
        });
        // Logits of the last token of a prefill: a strided view, misaligned on purpose.
        h.check(shape_name("argmax strided misaligned", 151935, rows), kExact, [&](OpBuilder & b) {
            Tensor * x = b.input({151936, rows});
            return b.graph().argmax(b.graph().view(x, {151935, rows}, {4, x->nb[1]}, 4));
        });
    }
    // Around the one-block / cluster boundary (32768), several load batches per thread.
    for (int64_t n : {int64_t(20000), int64_t(32768), int64_t(32772), int64_t(40000)}) {
        h.check(shape_name("argmax", n, 3), kExact, [&](OpBuilder & b) { return b.graph().argmax(b.input({n, 3})); });
        h.check(shape_name("argmax ties", 2 * n, 3), kExact, [&](OpBuilder & b) {
            Tensor * a = b.input({n, 3});
            return b.graph().argmax(b.graph().concat(a, a));
        });
    }
    for (int64_t n : {int64_t(64), int64_t(2048), int64_t(4096)}) {
        h.check(shape_name("argmax", n, 512), kExact, [&](OpBuilder & b) { return b.graph().argmax(b.input({n, 512})); });
        h.check(shape_name("argmax ties", 2 * n, 512), kExact, [&](OpBuilder & b) {
            Tensor * a = b.input({n, 512});
            return b.graph().argmax(b.graph().concat(a, a));
        });
    }
    // NaN / inf policy (the CPU loop's answer): rows of 4 values injected as exact bits.
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const std::vector<float> rows_f = {
        nan,  1.0f, 2.0f, 0.5f,   // NaN at index 0: nothing compares greater -> 0
        1.0f, nan,  3.0f, 3.0f,   // NaN skipped, tie -> 2
        -inf, -inf, -inf, -inf,   // all equal -> 0
        -inf, nan,  -5.0f, nan,   // -> 2
        nan,  nan,  nan,  nan,    // -> 0
        0.0f, -0.0f, -1.0f, inf,  // -> 3
    };
    const std::vector<float> expect = {0, 2, 0, 2, 0, 3};
    std::vector<int32_t>     raw;
    for (float f : rows_f) raw.push_back(bits(f));
    h.check("argmax NaN/inf policy", kExact, [&](OpBuilder & b) { return b.graph().argmax(as_f32(b.graph(), b.input_i32({4, 6}, raw))); });
    const auto got = run_cuda_only([&](OpBuilder & b) { return b.graph().argmax(as_f32(b.graph(), b.input_i32({4, 6}, raw))); });
    CHECK(got == expect);
}

TEST_CASE("cuda elementwise: MOE_ROUTE (softmax or sigmoid scores + top-k + renormalisation, one kernel)") {
    // Weights kF32 (expf ulps, float vs double softmax sum); ids are I32, compared exactly.
    OpHarness h(18);
    h.set_replay_check(true);
    struct Cfg {
        int64_t e;
        int     k;
    };
    for (Cfg c : {Cfg{8, 2}, Cfg{128, 8}, Cfg{512, 10}, Cfg{60, 4}, Cfg{512, 16}, Cfg{256, 8}, Cfg{64, 32}, Cfg{33, 1}})
        for (bool normalize : {false, true})
            for (int64_t rows : kRows) {
                const std::string name = "moe_route E=" + std::to_string(c.e) + " k=" + std::to_string(c.k) +
                                         (normalize ? " norm" : "") + " T=" + std::to_string(rows);
                // weights by nmse, ids exactly (I32)
                h.check_multi(name, kF32, [&](OpBuilder & b) {
                    Graph &  g = b.graph();
                    Tensor * r = g.moe_route(b.input({c.e, rows}, 2.0f), c.k, normalize);
                    return std::vector<Tensor *>{g.moe_weights(r), g.moe_ids(r)};
                });
            }
    // Sigmoid scores chosen with a bias (MiniMax-M2: 256 experts, top-8), with and without the bias.
    for (Cfg c : {Cfg{256, 8}, Cfg{8, 2}, Cfg{512, 10}})
        for (bool with_bias : {false, true})
            for (int64_t rows : kRows)
                h.check_multi("moe_route sigmoid" + std::string(with_bias ? "+bias" : "") + " E=" + std::to_string(c.e) + " k=" +
                                  std::to_string(c.k) + " T=" + std::to_string(rows),
                              kF32, [&](OpBuilder & b) {
                                  Graph &  g    = b.graph();
                                  Tensor * bias = with_bias ? b.param({c.e}, 0.1f) : nullptr;
                                  Tensor * r    = g.moe_route(b.input({c.e, rows}, 2.0f), c.k, true, RouterScore::Sigmoid, bias);
                                  return std::vector<Tensor *>{g.moe_weights(r), g.moe_ids(r)};
                              });
    // The shared expert's slot (Qwen3-Next: 512 experts, top-10): the ids end with E.
    for (Cfg c : {Cfg{512, 10}, Cfg{8, 2}})
        for (int64_t rows : kRows)
            h.check_multi("moe_route shared slot E=" + std::to_string(c.e) + " k=" + std::to_string(c.k) + " T=" + std::to_string(rows), kF32,
                          [&](OpBuilder & b) {
                              Graph &  g = b.graph();
                              Tensor * r = g.moe_route(b.input({c.e, rows}, 2.0f), c.k, true, RouterScore::Softmax, nullptr, true);
                              return std::vector<Tensor *>{g.moe_weights(r), g.moe_ids(r)};
                          });
    for (int64_t rows : kRows) {
        // Every probability appears twice (experts e and e + 64): ties go to the lower id.
        h.check_multi("moe_route ties E=128 k=8 T=" + std::to_string(rows), kF32, [&](OpBuilder & b) {
            Graph &  g = b.graph();
            Tensor * a = b.input({64, rows}, 2.0f);
            Tensor * r = g.moe_route(g.concat(a, a), 8, true);
            return std::vector<Tensor *>{g.moe_weights(r), g.moe_ids(r)};
        });
        // Router logits as a strided view (misaligned scalar loads).
        h.check_multi("moe_route strided E=127 k=8 T=" + std::to_string(rows), kF32, [&](OpBuilder & b) {
            Graph &  g = b.graph();
            Tensor * x = b.input({128, rows}, 2.0f);
            Tensor * r = g.moe_route(g.view(x, {127, rows}, {4, x->nb[1]}, 4), 8, false);
            return std::vector<Tensor *>{g.moe_weights(r), g.moe_ids(r)};
        });
    }
    // Exact ties with known answers: logits [3, 1, 3, 3, 0, 1, 1, 1], k = 4 -> ids 0, 2, 3, 1.
    std::vector<int32_t> raw;
    for (float f : {3.0f, 1.0f, 3.0f, 3.0f, 0.0f, 1.0f, 1.0f, 1.0f}) raw.push_back(bits(f));
    const auto got = run_cuda_only([&](OpBuilder & b) {
        Graph & g = b.graph();
        return g.cont(g.moe_ids(g.moe_route(as_f32(g, b.input_i32({8, 1}, raw)), 4, true)));
    });
    CHECK(got == std::vector<float>{0, 2, 3, 1});
}

TEST_CASE("cuda elementwise: MOE_COMBINE") {
    // kF32: the GPU uses the CPU's operation order without FMA (bit-identical to a non-native CPU
    // build); a -march=native CPU build may contract to FMA, an ulp-level difference.
    OpHarness h(19);
    for (int64_t rows : kRows)
        for (int64_t hdim : {int64_t(2048), int64_t(4096), int64_t(130)}) {
            // The weights are the strided view of a real route (as in the MoE block).
            h.check(shape_name("moe_combine k=8", hdim, rows), kF32, [&](OpBuilder & b) {
                Graph &  g = b.graph();
                Tensor * r = g.moe_route(b.input({128, rows}), 8, true);
                return g.moe_combine(b.input({hdim, 8, rows}), g.moe_weights(r));
            });
            // 10 slots (Qwen3-Next: one batch of 16), 20 slots (two batches), 3 slots.
            for (int k : {10, 20, 3})
                h.check(shape_name(("moe_combine k=" + std::to_string(k)).c_str(), hdim, rows), kF32, [&](OpBuilder & b) {
                    Graph &  g = b.graph();
                    Tensor * r = g.moe_route(b.input({64, rows}), k, true);
                    return g.moe_combine(b.input({hdim, k, rows}), g.moe_weights(r));
                });
            // Qwen3-Next: + the shared expert gated by sigmoid of its gate logit (a column of a wider
            // matmul output, as when the router's and the gate's matmuls run as one launch).
            h.check(shape_name("moe_combine k=10 + shared", hdim, rows), kF32, [&](OpBuilder & b) {
                Graph &  g      = b.graph();
                Tensor * r      = g.moe_route(b.input({64, rows}), 10, true);
                Tensor * logits = b.input({2, rows}, 3.0f);
                Tensor * gate   = g.view(logits, {1, rows}, {4, logits->nb[1]}, 4);
                return g.moe_combine(b.input({hdim, 10, rows}), g.moe_weights(r), b.input({hdim, rows}), gate);
            });
        }
}

TEST_CASE("cuda elementwise: RMS_NORM of an ADD through the graph") {
    // kF32 (worst of the exact sum and the norm).
    OpHarness h(20);
    for (int64_t rows : kRows)
        for (int64_t n : {int64_t(2048), int64_t(4096)})
            h.check_multi(shape_name("add -> rms_norm", n, rows), kF32, [&](OpBuilder & b) {
                Graph &  g   = b.graph();
                Tensor * sum = g.add(b.input({n, rows}), b.input({n, rows}));
                return std::vector<Tensor *>{sum, g.rms_norm(sum, b.param({n}, 0.1f, 1.0f), 1e-6f)};
            });
}

// ---- the fused ADD + RMS_NORM launcher, called directly (the backend's dispatcher decides when to
// fuse; here both outputs are checked against the CPU backend's two ops).

namespace {

struct HostDev {
    std::vector<float> host;
    float *            dev = nullptr;
    explicit HostDev(size_t n) : host(n) { REQUIRE(cudaMalloc(&dev, std::max<size_t>(n, 1) * 4) == cudaSuccess); }
    ~HostDev() { cudaFree(dev); }
    void up() { REQUIRE(cudaMemcpy(dev, host.data(), host.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess); }
    std::vector<float> down(const float * p, size_t n) const {
        std::vector<float> v(n);
        REQUIRE(cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
        return v;
    }
};

Tensor matrix(int64_t n, int64_t rows, void * data) {
    Tensor t;
    t.type  = DType::F32;
    t.ne[0] = n;
    t.ne[1] = rows;
    t.nb[0] = 4;
    t.nb[1] = size_t(n) * 4;
    t.nb[2] = t.nb[3] = t.nb[1] * size_t(rows);
    t.data  = data;
    return t;
}

double nmse(const std::vector<float> & got, const std::vector<float> & ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
        den += double(ref[i]) * ref[i];
    }
    return den > 0 ? num / den : num;
}

}  // namespace

TEST_CASE("cuda elementwise: fused ADD + RMS_NORM (op_add_rms_norm)") {
    int count = 0;
    REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
    REQUIRE(count > 0);
    spark::cpu::ThreadPool pool(2);
    std::mt19937           rng(21);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t rows : kRows)
        for (int64_t n : {int64_t(128), int64_t(2048), int64_t(4096)})
            for (int variant = 0; variant < 5; ++variant) {
                // 0: plain weight; 1: zero-centred, b broadcast; 2: no weight; 3: the norm output
                // placed over `a` (what the planner may do: a is dead after the ADD), the fused
                // kernel in place; 4: the output over `a` shifted by one row (the two ops in turn).
                const bool b_bcast = variant == 1;
                const bool has_w   = variant != 2;
                const bool zc      = variant == 1;
                const bool alias   = variant >= 3;
                const bool shift   = variant == 4;
                if (shift && rows < 2) continue;
                const std::string name = shape_name("fused add+rms_norm", n, rows) + " variant " + std::to_string(variant);
                CAPTURE(name);
                const int64_t brows = b_bcast ? 1 : rows;
                HostDev a{size_t(n * (rows + 1))}, b{size_t(n * brows)}, w{size_t(n)}, sum{size_t(n * rows)}, out{size_t(n * rows)};
                for (auto & x : a.host) x = nd(rng) * 2.0f;
                for (auto & x : b.host) x = nd(rng);
                for (auto & x : w.host) x = 1.0f + 0.1f * nd(rng);
                a.up();
                b.up();
                w.up();

                // CPU reference: the CPU backend's ADD and RMS_NORM on host tensors.
                std::vector<float> sum_ref(static_cast<size_t>(n * rows)), out_ref(static_cast<size_t>(n * rows));
                Tensor ha = matrix(n, rows, a.host.data()), hb = matrix(n, brows, b.host.data());
                Tensor hw = matrix(n, 1, w.host.data()), hs = matrix(n, rows, sum_ref.data()), ho = matrix(n, rows, out_ref.data());
                hs.op = Op::ADD, hs.src[0] = &ha, hs.src[1] = &hb;
                ho.op = Op::RMS_NORM, ho.src[0] = &hs, ho.src[1] = has_w ? &hw : nullptr, ho.fp[0] = 1e-6f, ho.ip[0] = zc ? 1 : 0;
                spark::cpu::op_binary(hs, pool);
                spark::cpu::op_rms_norm(ho, pool);

                Tensor da = matrix(n, rows, a.dev), db = matrix(n, brows, b.dev), dw = matrix(n, 1, w.dev);
                float * const alias_at = a.dev + (shift ? n : 0);
                Tensor ds = matrix(n, rows, sum.dev), dout = matrix(n, rows, alias ? alias_at : out.dev);
                ds.op = Op::ADD, ds.src[0] = &da, ds.src[1] = &db;
                dout.op = Op::RMS_NORM, dout.src[0] = &ds, dout.src[1] = has_w ? &dw : nullptr, dout.fp[0] = 1e-6f,
                dout.ip[0] = zc ? 1 : 0;
                spark::cuda::OpContext ctx;  // default stream, no workspace needed
                spark::cuda::op_add_rms_norm(ds, dout, ctx);
                REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
                const auto got_sum = sum.down(sum.dev, sum_ref.size());
                const auto got_out = out.down(alias ? alias_at : out.dev, out_ref.size());
                CHECK(got_sum == sum_ref);                 // float add: bit-identical
                CHECK(nmse(got_out, out_ref) <= kF32);      // sum of squares order / double on the CPU
            }
}

// ---- the fused per-head RMS_NORM + ROPE launcher, called directly: rope's output against the CPU
// backend's RMS_NORM followed by ROPE.

namespace {

Tensor heads(int64_t hd, int64_t nh, int64_t T, void * data, size_t nb1, size_t nb2) {
    Tensor t;
    t.type  = DType::F32;
    t.ne[0] = hd;
    t.ne[1] = nh;
    t.ne[2] = T;
    t.nb[0] = 4;
    t.nb[1] = nb1;
    t.nb[2] = nb2;
    t.nb[3] = nb2 * size_t(T);
    t.data  = data;
    return t;
}

// Gathers a [hd, nh, T] tensor with strides (in floats) out of a flat buffer.
std::vector<float> gather(const std::vector<float> & buf, size_t off, int64_t hd, int64_t nh, int64_t T, size_t s1, size_t s2) {
    std::vector<float> v;
    v.reserve(size_t(hd * nh * T));
    for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < nh; ++h)
            for (int64_t i = 0; i < hd; ++i) v.push_back(buf[off + size_t(t) * s2 + size_t(h) * s1 + size_t(i)]);
    return v;
}

}  // namespace

TEST_CASE("cuda elementwise: fused RMS_NORM + ROPE (op_rms_norm_rope)") {
    int count = 0;
    REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
    REQUIRE(count > 0);
    spark::cpu::ThreadPool          pool(2);
    std::mt19937                    rng(23);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    struct Cfg {
        int64_t hd, nh;
        int     n_rot;
        float   theta;
        bool    zc, has_w;
    };
    const Cfg cfgs[] = {
        {128, 32, 128, 1e6f, false, true},   // Qwen3 q
        {128, 8, 128, 1e6f, false, true},    // Qwen3 k
        {256, 16, 64, 1e7f, true, true},     // Qwen3-Next q: zero-centred, partial rotary 64 of 256
        {256, 2, 64, 1e7f, true, true},      // Qwen3-Next k
        {64, 4, 64, 1e4f, false, false},     // no weight, head_dim 64
        {256, 4, 256, 1e6f, false, true},    // 4 pairs per lane
        {128, 4, 32, 1e4f, true, true},      // 16 pairs, 96 copied dims
        {96, 3, 80, 1e4f, false, true},      // odd sizes: 40 pairs, 16 copied
        {512, 2, 128, 1e6f, false, true},    // 384 copied dims: fallback to the two ops
    };
    for (const Cfg & c : cfgs)
        for (int64_t T : kRows)
            for (int layout = 0; layout < 4; ++layout) {
                // 0: contiguous input, separate output; 1: input = the head slice of a fused qkv
                // row (strided), separate output; 2: output in place over the input; 3: output over
                // the input shifted by one head (must fall back to the two ops).
                const std::string name = "fused rms_norm+rope hd=" + std::to_string(c.hd) + " nh=" + std::to_string(c.nh) +
                                         " n_rot=" + std::to_string(c.n_rot) + " T=" + std::to_string(T) + " layout " +
                                         std::to_string(layout);
                CAPTURE(name);
                const int64_t hd = c.hd, nh = c.nh;
                const int64_t row_heads = layout == 1 ? nh + 6 : nh;  // qkv: q heads then 6 more
                const size_t  s1 = size_t(hd), s2 = size_t(hd * row_heads);
                const size_t  n_x = s2 * size_t(T) + (layout == 3 ? size_t(hd) : 0);
                HostDev       xbuf{n_x}, w{size_t(hd)}, nout{size_t(hd * nh * T)}, rout{size_t(hd * nh * T)};
                for (auto & v : xbuf.host) v = nd(rng) * 2.0f;
                for (auto & v : w.host) v = c.zc ? 0.1f * nd(rng) : 1.0f + 0.1f * nd(rng);
                xbuf.up();
                w.up();
                std::vector<int32_t> pos(static_cast<size_t>(T));
                for (int64_t i = 0; i < T; ++i) pos[size_t(i)] = int32_t(T == 1 ? 31999 : i * 61 % 40000);
                int32_t * dpos = nullptr;
                REQUIRE(cudaMalloc(&dpos, pos.size() * 4) == cudaSuccess);
                REQUIRE(cudaMemcpy(dpos, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);

                // CPU reference on a contiguous copy of the input.
                std::vector<float> x_host = gather(xbuf.host, 0, hd, nh, T, s1, s2);
                std::vector<float> norm_ref(x_host.size()), rope_ref(x_host.size());
                const size_t       cnb1 = size_t(hd) * 4, cnb2 = cnb1 * size_t(nh);
                Tensor hx = heads(hd, nh, T, x_host.data(), cnb1, cnb2), hw = matrix(hd, 1, w.host.data());
                Tensor hn = heads(hd, nh, T, norm_ref.data(), cnb1, cnb2), hr = heads(hd, nh, T, rope_ref.data(), cnb1, cnb2);
                Tensor hp = matrix(T, 1, pos.data());
                hp.type   = DType::I32;
                hn.op = Op::RMS_NORM, hn.src[0] = &hx, hn.src[1] = c.has_w ? &hw : nullptr, hn.fp[0] = 1e-6f, hn.ip[0] = c.zc ? 1 : 0;
                hr.op = Op::ROPE, hr.src[0] = &hn, hr.src[1] = &hp, hr.ip[0] = c.n_rot, hr.fp[0] = c.theta;
                spark::cpu::op_rms_norm(hn, pool);
                spark::cpu::op_rope(hr, pool);

                Tensor dx = heads(hd, nh, T, xbuf.dev, s1 * 4, s2 * 4), dw = matrix(hd, 1, w.dev);
                Tensor dp = matrix(T, 1, dpos);
                dp.type   = DType::I32;
                Tensor dn = heads(hd, nh, T, nout.dev, cnb1, cnb2);
                float * rdata = layout == 2 ? xbuf.dev : layout == 3 ? xbuf.dev + hd : rout.dev;
                Tensor  dr    = heads(hd, nh, T, rdata, cnb1, cnb2);
                dn.op = Op::RMS_NORM, dn.src[0] = &dx, dn.src[1] = c.has_w ? &dw : nullptr, dn.fp[0] = 1e-6f, dn.ip[0] = c.zc ? 1 : 0;
                dr.op = Op::ROPE, dr.src[0] = &dn, dr.src[1] = &dp, dr.ip[0] = c.n_rot, dr.fp[0] = c.theta;
                spark::cuda::OpContext ctx;  // default stream
                spark::cuda::op_rms_norm_rope(dn, dr, ctx);
                REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
                const auto got = rout.down(rdata, rope_ref.size());
                const double e = nmse(got, rope_ref);
                CAPTURE(e);
                CHECK(e <= kF32);
                cudaFree(dpos);
            }
}

TEST_CASE("cuda elementwise: ARGMAX chunked path (before sm_90)") {
    // The two-kernel path that devices without thread block clusters take for long rows, forced by
    // a device description of cc 8.0; kExact against the CPU loop.
    struct Ws final : spark::cuda::Workspace {
        void * p = nullptr;
        size_t n = 0;
        void * get(size_t bytes) override {
            if (bytes > n) {
                cudaFree(p);
                REQUIRE(cudaMalloc(&p, bytes) == cudaSuccess);
                n = bytes;
            }
            return p;
        }
        ~Ws() override { cudaFree(p); }
    } ws;
    spark::cuda::DeviceProps props;
    props.cc       = 800;
    props.sm_count = 108;
    spark::cpu::ThreadPool pool(2);
    std::mt19937           rng(24);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t rows : {int64_t(1), int64_t(3)}) {
        const int64_t n = 151936;
        HostDev       x{size_t(n * rows)};
        for (auto & v : x.host) v = nd(rng);
        // a tie across chunks in the last row: the first index must win
        x.host[size_t((rows - 1) * n + 5000)] = x.host[size_t((rows - 1) * n + 100000)] = 10.0f;
        x.up();
        std::vector<int32_t> ref(static_cast<size_t>(rows));
        Tensor               hx = matrix(n, rows, x.host.data()), ho = matrix(rows, 1, ref.data());
        ho.type = DType::I32, ho.op = Op::ARGMAX, ho.src[0] = &hx;
        spark::cpu::op_argmax(ho, pool);
        int32_t * dout = nullptr;
        REQUIRE(cudaMalloc(&dout, size_t(rows) * 4) == cudaSuccess);
        Tensor dx = matrix(n, rows, x.dev), dout_t = matrix(rows, 1, dout);
        dout_t.type = DType::I32, dout_t.op = Op::ARGMAX, dout_t.src[0] = &dx;
        spark::cuda::OpContext ctx;
        ctx.workspace = &ws;
        ctx.props     = &props;
        spark::cuda::op_argmax(dout_t, ctx);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        std::vector<int32_t> got(static_cast<size_t>(rows));
        REQUIRE(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
        CHECK(got == ref);
        CHECK(ref.back() == 5000);
        cudaFree(dout);
    }
}
