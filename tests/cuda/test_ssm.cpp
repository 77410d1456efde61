// The linear-attention ops on CUDA (src/backends/cuda/ssm/) against the CPU backend:
//   CONV1D_SSM: causal depthwise conv (kernel 4, also 2 and 3) + silu with the rolling per-slot
//               state, channels 256 .. 8192 (Qwen3-Next: 8192), one token per sequence (decode),
//               7 and 64 tokens, several sequences of different lengths in one step;
//   GATED_DELTA: the gated delta rule, dk = dv = 64 and 128, key heads 1..16, value heads 2..32
//               (Qwen3-Next: 16 / 32 at 128), T = 1, 7, 64, several sequences; v is a strided view
//               as in the model (a slice of the conv output); also as Qwen3-Next runs both: the
//               conv's q | k | v read in place from in_proj_qkvz, the delta rule l2-normalising q
//               and k itself and reading a, b in place from in_proj_ba.
// States are rings of R states per slot (graph.h: "Recurrent state with rollback"): R = 1 (no
// rollback), 3 and 5, with sequences of fewer tokens than R, exactly R and more, continuing at
// position 100 (from ring entry 99 mod R) or starting at position 0 (from zeros: the ring's random
// initial values must be ignored). The whole ring is compared, so entries a step must not write
// have to keep their initial values.
// Outputs and the updated states (harness states) are compared; the CUDA side is also captured
// into a CUDA graph and replayed (bit-identical results required).
//
// Tolerances (normalized mean squared error against the CPU, see op_harness.h), with the reason:
//   1e-10  conv: float32 on both sides; only the order of the K products (fma contraction) and
//          expf in silu differ, ulp-level (nmse ~1e-14). The state is copied inputs: exact, but it
//          shares the case's tolerance.
//   1e-9   delta rule: float32 on both sides with the same operation order per element except the
//          dk-long sums (kv = S^T k, o = S^T q: 4 interleaved partial sums + 2 shuffles on the GPU,
//          sequential on the CPU) and expf/log1pf in the gates; the recurrence is contractive
//          (unit-norm-scale k, beta < 1, decay < 1), so the rounding does not grow over 64 tokens.
//          The CPU warp emulator measures ~2e-14 against a double reference.
// Any indexing mistake (wrong head, column, slot or token) gives nmse >= 1e-2.
#include "op_harness.h"

#include "common/error.h"
#include "graph/graph.h"

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

using namespace test;

namespace {

constexpr double kConvTol  = 1e-10;
constexpr double kDeltaTol = 1e-9;

struct Range {
    int slot, n;
    int pos0 = 100;  // position of the first token (0: a new sequence)
};

// Step metadata for sequences `rs` (tokens grouped by sequence, as the runtime orders them).
spark::StepInputs step_inputs(OpBuilder & b, const std::vector<Range> & rs, int & n_tok) {
    std::vector<int32_t> pos, seq, ranges;
    n_tok = 0;
    for (const Range & r : rs) {
        ranges.insert(ranges.end(), {r.slot, n_tok, r.n});
        for (int i = 0; i < r.n; ++i) {
            pos.push_back(r.pos0 + i);
            seq.push_back(r.slot);
        }
        n_tok += r.n;
    }
    spark::StepInputs s;
    s.pos        = b.input_i32({n_tok}, pos);
    s.seq        = b.input_i32({n_tok}, seq);
    s.seq_ranges = b.input_i32({3, int64_t(rs.size())}, ranges);
    return s;
}

std::string ranges_name(const std::vector<Range> & rs) {
    std::string s;
    for (const Range & r : rs)
        s += " [slot " + std::to_string(r.slot) + " x" + std::to_string(r.n) + " @" + std::to_string(r.pos0) + "]";
    return s;
}

// R: states per slot (ring).
void conv_case(OpHarness & h, int C, int K, int R, const std::vector<Range> & rs, int n_slots) {
    h.set_replay_check(true);
    const std::string name =
        "conv1d_ssm C" + std::to_string(C) + " K" + std::to_string(K) + " R" + std::to_string(R) + ranges_name(rs);
    h.check(name, kConvTol, [&](OpBuilder & b) {
        int               T    = 0;
        spark::StepInputs step = step_inputs(b, rs, T);
        Tensor *          x    = b.input({C, T});
        Tensor *          w    = b.param({K, C}, 0.5f);
        Tensor *          st   = b.state({int64_t(K - 1) * C, R, n_slots}, 1.0f);
        return b.graph().conv1d_ssm(x, w, st, step);
    });
}

// The input as Qwen3-Next reads it: q, k and v parts straight out of in_proj_qkvz's rows, which
// hold per key head [q (dk) | k (dk) | v (r dv) | z (r dv)].
void conv_parts_case(OpHarness & h, int dk, int dv, int nk, int r, int R, const std::vector<Range> & rs, int n_slots) {
    h.set_replay_check(true);
    const int64_t C = int64_t(nk) * (2 * dk + r * dv);
    h.check("conv1d_ssm q|k|v parts dk" + std::to_string(dk) + " dv" + std::to_string(dv) + " heads " + std::to_string(nk) +
                "x" + std::to_string(r) + " R" + std::to_string(R) + ranges_name(rs),
            kConvTol, [&](OpBuilder & b) {
                int               T     = 0;
                spark::StepInputs step  = step_inputs(b, rs, T);
                spark::Graph &    g     = b.graph();
                const size_t      group = size_t(2 * dk + 2 * r * dv) * 4;
                Tensor *          qkvz  = b.input({int64_t(group / 4) * nk, T});
                Tensor *          q     = g.view(qkvz, {dk, nk, T}, {4, group, qkvz->nb[1]}, 0);
                Tensor *          k     = g.view(qkvz, {dk, nk, T}, {4, group, qkvz->nb[1]}, size_t(dk) * 4);
                Tensor *          v     = g.view(qkvz, {int64_t(r) * dv, nk, T}, {4, group, qkvz->nb[1]}, size_t(2 * dk) * 4);
                return g.conv1d_ssm({q, k, v}, b.param({4, C}, 0.5f), b.state({3 * C, R, n_slots}, 1.0f), step);
            });
}

// grouped: Qwen3-Next's form: raw q and k l2-normalised (q scaled) inside the op, a and b read in
// place from in_proj_ba's rows ([b (r) | a (r)] per key head).
void delta_case(OpHarness & h, int dk, int dv, int n_kh, int n_vh, int R, const std::vector<Range> & rs, int n_slots,
                bool grouped = false) {
    h.set_replay_check(true);
    const std::string name = "gated_delta dk" + std::to_string(dk) + " dv" + std::to_string(dv) + " heads " +
                             std::to_string(n_kh) + "/" + std::to_string(n_vh) + " R" + std::to_string(R) +
                             (grouped ? " qk-norm grouped-ab" : "") + ranges_name(rs);
    h.check(name, kDeltaTol, [&](OpBuilder & b) {
        int               T    = 0;
        spark::StepInputs step = step_inputs(b, rs, T);
        spark::Graph &    g    = b.graph();
        const float       ks   = grouped ? 1.0f : 1.0f / std::sqrt(float(dk));  // |q|, |k| ~ 1, as after l2_norm
        Tensor *          q    = b.input({dk, n_kh, T}, ks);
        Tensor *          k    = b.input({dk, n_kh, T}, ks);
        // v: a strided slice of a wider row, as the model's view of the conv output.
        Tensor * vw    = b.input({int64_t(dv) * n_vh + 64, T});
        Tensor * v     = g.view(vw, {dv, n_vh, T}, {4, size_t(dv) * 4, vw->nb[1]}, 64 * 4);
        Tensor * a     = b.input({n_vh, T});
        Tensor * bb    = b.input({n_vh, T});
        if (grouped) {
            const int64_t r  = n_vh / n_kh;
            Tensor *      ba = b.input({2 * n_vh, T});
            bb = g.view(ba, {r, n_kh, T}, {4, size_t(2 * r) * 4, ba->nb[1]}, 0);
            a  = g.view(ba, {r, n_kh, T}, {4, size_t(2 * r) * 4, ba->nb[1]}, size_t(r) * 4);
        }
        Tensor * A_log = b.param({n_vh}, 0.5f, -1.0f);  // decay exp(g) ~ 0.5 .. 0.95
        Tensor * dt    = b.param({n_vh}, 0.5f);
        Tensor * st    = b.state({int64_t(dk) * dv * n_vh, R, n_slots}, 0.1f);
        spark::QkNorm qk;
        if (grouped) qk = {true, 1e-6f, 1.0f / std::sqrt(float(dk))};
        return g.gated_delta(q, k, v, a, bb, A_log, dt, st, step, qk);
    });
}

}  // namespace

TEST_CASE("conv1d_ssm") {
    OpHarness h(201);
    // One state per slot (R = 1). Decode: one token per sequence.
    conv_case(h, 8192, 4, 1, {{0, 1}}, 1);
    conv_case(h, 256, 4, 1, {{2, 1}, {0, 1}, {1, 1}}, 3);
    conv_case(h, 1000, 4, 1, {{1, 1}, {0, 1}}, 2);  // channels not a multiple of the block
    // Several tokens.
    conv_case(h, 8192, 4, 1, {{0, 7}}, 1);
    conv_case(h, 2048, 4, 1, {{0, 64}}, 2);
    conv_case(h, 256, 4, 1, {{1, 2}, {0, 1}, {2, 64}}, 3);  // fewer tokens than the window, then more
    conv_case(h, 512, 3, 1, {{0, 9}}, 1);
    conv_case(h, 300, 2, 1, {{0, 5}, {1, 1}}, 2);
    // New sequences (position 0): zeros, not the ring's contents.
    conv_case(h, 1000, 4, 1, {{1, 1, 0}, {0, 7, 0}}, 2);
    // Rings: decode, then fewer tokens than R, exactly R and more, at positions 0 and 100.
    conv_case(h, 8192, 4, 3, {{0, 1}}, 1);
    conv_case(h, 256, 4, 3, {{2, 1}, {0, 1, 0}, {1, 1, 101}}, 3);
    conv_case(h, 256, 4, 3, {{1, 2, 0}, {0, 3}, {2, 64}}, 3);
    conv_case(h, 2048, 4, 5, {{0, 4}, {1, 5, 0}, {2, 7, 101}, {3, 1, 0}}, 4);
    conv_case(h, 512, 3, 5, {{0, 9, 0}}, 1);
    conv_case(h, 300, 2, 3, {{0, 5}, {1, 1, 0}}, 2);
    // Qwen3-Next's q | k | v parts (16 key heads x 2 value heads of 128: 8192 channels).
    conv_parts_case(h, 128, 128, 16, 2, 1, {{0, 1}}, 1);
    conv_parts_case(h, 128, 128, 16, 2, 3, {{1, 1}, {0, 7, 0}}, 2);
    conv_parts_case(h, 64, 32, 3, 3, 1, {{0, 64}}, 1);
}

TEST_CASE("gated_delta") {
    OpHarness h(202);
    // One state per slot (R = 1). Qwen3-Next shape: 16 key heads, 32 value heads, 128 x 128.
    delta_case(h, 128, 128, 16, 32, 1, {{0, 1}}, 1);
    delta_case(h, 128, 128, 16, 32, 1, {{1, 1}, {0, 1}}, 2);
    delta_case(h, 128, 128, 16, 32, 1, {{0, 64}}, 1);
    delta_case(h, 128, 128, 1, 2, 1, {{0, 7}}, 1);
    delta_case(h, 128, 128, 4, 16, 1, {{2, 7}, {0, 1}, {1, 64}}, 3);
    delta_case(h, 64, 64, 1, 2, 1, {{0, 1}}, 1);
    delta_case(h, 64, 64, 2, 8, 1, {{0, 7}}, 1);
    delta_case(h, 64, 64, 8, 8, 1, {{1, 64}, {0, 3}}, 2);
    delta_case(h, 64, 128, 2, 4, 1, {{0, 17}}, 1);
    // New sequences (position 0): zeros, not the ring's contents.
    delta_case(h, 128, 128, 16, 32, 1, {{0, 7, 0}, {1, 1, 0}}, 2);
    // Rings: decode, then fewer tokens than R, exactly R and more (across the 16-token staging),
    // at positions 0 and 100.
    delta_case(h, 128, 128, 16, 32, 3, {{1, 1}, {0, 1, 0}}, 2);
    delta_case(h, 128, 128, 4, 16, 3, {{2, 2, 0}, {0, 3}, {1, 64, 101}}, 3);
    delta_case(h, 64, 64, 8, 8, 5, {{1, 17}, {0, 5, 0}, {2, 4}}, 3);
    delta_case(h, 64, 128, 2, 4, 5, {{0, 64, 0}}, 1);
    delta_case(h, 64, 64, 2, 8, 3, {{0, 3, 101}, {1, 2}}, 2);
    // Qwen3-Next's form: q/k normalised in the op, a and b read in place.
    delta_case(h, 128, 128, 16, 32, 1, {{0, 1}}, 1, true);
    delta_case(h, 128, 128, 16, 32, 3, {{1, 1}, {0, 7, 0}}, 2, true);
    delta_case(h, 64, 64, 2, 8, 1, {{0, 64}}, 1, true);
}

TEST_CASE("linear attention: unsupported shapes are clear errors") {
    auto expect_unsupported = [](const char * what, const std::function<Tensor *(OpBuilder &)> & build) {
        try {
            run_cuda_only(build);
            FAIL(what << " ran");
        } catch (const spark::Error & e) {
            CHECK(e.status() == SPARK_ERR_UNSUPPORTED);
            MESSAGE(std::string(e.what()));
        }
    };
    expect_unsupported("conv kernel 9", [](OpBuilder & b) {
        int               T    = 0;
        spark::StepInputs step = step_inputs(b, {{0, 1}}, T);
        return b.graph().conv1d_ssm(b.input({64, T}), b.param({9, 64}), b.state({8 * 64, 1, 1}), step);
    });
    expect_unsupported("delta rule dk 96", [](OpBuilder & b) {
        int               T    = 0;
        spark::StepInputs step = step_inputs(b, {{0, 1}}, T);
        return b.graph().gated_delta(b.input({96, 1, T}), b.input({96, 1, T}), b.input({64, 2, T}), b.input({2, T}),
                                     b.input({2, T}), b.param({2}), b.param({2}), b.state({96 * 64 * 2, 1, 1}), step);
    });
    expect_unsupported("delta rule dv 40", [](OpBuilder & b) {
        int               T    = 0;
        spark::StepInputs step = step_inputs(b, {{0, 1}}, T);
        return b.graph().gated_delta(b.input({64, 1, T}), b.input({64, 1, T}), b.input({40, 2, T}), b.input({2, T}),
                                     b.input({2, T}), b.param({2}), b.param({2}), b.state({64 * 40 * 2, 1, 1}), step);
    });
}
