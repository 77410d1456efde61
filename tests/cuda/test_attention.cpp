// ATTENTION on CUDA (src/backends/cuda/attention/) against the CPU backend: append of this step's
// k/v to the paged FP16 cache, then causal GQA attention; split-KV tensor-core decode for T <= 8
// tokens, tiled flash-attention prefill above. Shapes: head_dim 64 / 128 / 256 (demo model, Qwen3,
// Qwen3-Next), GQA groups 1 / 2 / 8 / 16; decode at contexts 1, 17, 300, 4096 (the earlier
// positions are the cache's random initial contents, reached through a shuffled block table),
// verify batches of 2..8 tokens of one sequence, two and three sequences in one step, prefill of
// 64..512 tokens in one sequence (from position 0 and after earlier context) and split over
// sequences. Every case also compares the updated K and V caches (harness states) and runs the CUDA
// side three times (eager, captured, replayed): the replays must be bit-identical.
//
// The decode cases also cover the fused decode kernel (one launch: this step's k/v appended by the
// kernel, the splits merged by each column's last block) at page boundaries for T = 1..8.
//
// Tolerances (normalized mean squared error against the CPU, see op_harness.h), with the reason:
//   2e-7  decode. The CUDA cache is FP16 (IEEE half, unit roundoff 2^-11): this step's k/v are
//         rounded to f16 on the GPU only (the CPU's float cache keeps them exact; the earlier
//         positions are f16-representable on both sides). At context 1 the output is v itself, so
//         the error is f16 rounding, nmse ~4e-8 (bf16's 2.6e-6 / 64: 8x smaller errors); with more
//         context the new token weighs less (~2e-10 at 300). Q and P enter the tensor cores as f16
//         hi + lo pairs (range-scaled, attention.h), so the kernel's own arithmetic error is ~1e-13.
//         The CPU warp emulator (dev/kernels/attention) measures 2e-12..5.5e-8 on these shapes.
//   5e-7  prefill. Every token of the step is rounded to f16 in the cache (~4e-8 at most), and Q and
//         P are single f16 operands of the tensor cores (flash-attention practice; relative
//         rounding 2^-12), ~4e-8..7e-8 more; the emulator measures 8e-8..1.4e-7 in all.
// Both leave a 3.5x margin for what the emulator does not model (the tensor cores' accumulation order
// and rounding, the GPU's exp2f). The caches themselves differ only in the appended rows (f16
// rounding), nmse < 4e-8. An indexing, masking or paging mistake gives nmse >= 1e-3.
#include "op_harness.h"

#include "common/error.h"
#include "graph/graph.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace test;

namespace {

constexpr double kDecodeTol  = 2e-7;
constexpr double kPrefillTol = 5e-7;
constexpr int    kPage       = 64;

struct Seq {
    int slot;   // sequence slot
    int start;  // position of the first new token (positions 0 .. start-1 are already cached)
    int n;      // new tokens in this step
};

struct Case {
    int              hd, n_head, n_kv;
    std::vector<Seq> seqs;
    int              max_pages = 0;  // block-table width (context capacity / 64); 0: just enough
    int              n_slots   = 0;  // 0: largest slot + 1
    bool             strided_q = false;  // q as a strided view (q rows interleaved with a gate, Qwen3-Next)
};

std::string describe(const Case & c) {
    std::string s = "attention hd" + std::to_string(c.hd) + " heads " + std::to_string(c.n_head) + "/" + std::to_string(c.n_kv);
    for (const Seq & q : c.seqs) s += " [slot " + std::to_string(q.slot) + " pos " + std::to_string(q.start) + "+" + std::to_string(q.n) + "]";
    if (c.max_pages) s += " cap " + std::to_string(c.max_pages * kPage);
    if (c.strided_q) s += " strided-q";
    return s;
}

void run(OpHarness & h, const Case & c, double tol) {
    h.set_replay_check(true);
    h.check(describe(c), tol, [&](OpBuilder & b) {
        int n_tok = 0, n_slots = c.n_slots, need_pages = 1;
        for (const Seq & s : c.seqs) {
            n_tok += s.n;
            n_slots    = std::max(n_slots, s.slot + 1);
            need_pages = std::max(need_pages, (s.start + s.n + kPage - 1) / kPage);
        }
        const int max_pages = std::max(c.max_pages, need_pages);
        // Pages: every sequence gets the pages it needs, in a shuffled order, from a pool with a
        // few spare pages; unused block-table entries are -1 (as the runtime's Memory).
        const int        n_pages = need_pages * n_slots + 3;
        std::vector<int> pool(static_cast<size_t>(n_pages));
        std::iota(pool.begin(), pool.end(), 0);
        std::mt19937 rng(uint32_t(n_tok * 7919 + c.hd));  // the same for both backends
        std::shuffle(pool.begin(), pool.end(), rng);
        std::vector<int32_t> table(size_t(max_pages) * size_t(n_slots), -1);
        size_t               next = 0;
        for (const Seq & s : c.seqs)
            for (int p = 0; p < (s.start + s.n + kPage - 1) / kPage; ++p) table[size_t(s.slot) * max_pages + p] = pool[next++];
        std::vector<int32_t> pos, seq;
        for (const Seq & s : c.seqs)
            for (int i = 0; i < s.n; ++i) {
                pos.push_back(s.start + i);
                seq.push_back(s.slot);
            }

        spark::Graph & g = b.graph();
        Tensor *       q = nullptr;
        if (c.strided_q) {
            Tensor * qg = b.input({2 * c.hd, c.n_head, n_tok});
            q           = g.view(qg, {c.hd, c.n_head, n_tok}, {4, qg->nb[1], qg->nb[2]}, 0);
        } else {
            q = b.input({c.hd, c.n_head, n_tok});
        }
        Tensor *          k  = b.input({c.hd, c.n_kv, n_tok});
        Tensor *          v  = b.input({c.hd, c.n_kv, n_tok});
        Tensor *          kc = b.state({int64_t(c.hd) * c.n_kv, kPage, n_pages}, 1.0f, true);
        Tensor *          vc = b.state({int64_t(c.hd) * c.n_kv, kPage, n_pages}, 1.0f, true);
        spark::StepInputs step;
        step.pos         = b.input_i32({n_tok}, pos);
        step.seq         = b.input_i32({n_tok}, seq);
        step.block_table = b.input_i32({max_pages, n_slots}, table);
        return g.attention(q, k, v, kc, vc, step, 1.0f / std::sqrt(float(c.hd)));
    });
}

}  // namespace

TEST_CASE("attention decode: one token at contexts 1, 17, 300, 4096") {
    OpHarness h(101);
    // (head_dim, heads, kv heads): demo-model-like g1, Qwen3-30B-A3B g8, Qwen3-Next g8 at hd 256,
    // g2 and g16.
    const int shapes[][3] = {{64, 4, 4}, {128, 32, 4}, {256, 16, 2}, {128, 8, 4}, {128, 32, 2}};
    for (const auto & s : shapes)
        for (int ctx : {1, 17, 300, 4096}) run(h, {s[0], s[1], s[2], {{0, ctx - 1, 1}}}, kDecodeTol);
}

TEST_CASE("attention decode: large capacity, short sequence (most splits past the length)") {
    OpHarness h(102);
    run(h, {128, 32, 4, {{0, 299, 1}}, 512}, kDecodeTol);  // 32K-token block table
    run(h, {256, 16, 2, {{1, 40, 1}}, 256, 3}, kDecodeTol);
    run(h, {64, 8, 8, {{0, 0, 1}}, 128}, kDecodeTol);
}

TEST_CASE("attention decode: verify batches of one sequence (T = 2..8)") {
    OpHarness h(103);
    for (int T = 2; T <= 8; ++T) run(h, {128, 32, 4, {{0, 200 + 13 * T, T}}}, kDecodeTol);
    run(h, {256, 16, 2, {{0, 1000, 8}}}, kDecodeTol);
    run(h, {64, 32, 2, {{0, 63, 5}}}, kDecodeTol);  // group 16: a token's rows fill a whole block
    run(h, {64, 4, 4, {{0, 0, 8}}}, kDecodeTol);     // from an empty sequence
    run(h, {128, 16, 2, {{0, 90, 3}}, 0, 1, true}, kDecodeTol);
}

TEST_CASE("attention decode: several sequences in one step") {
    OpHarness h(104);
    run(h, {128, 32, 4, {{0, 33, 1}, {1, 2000, 1}}}, kDecodeTol);
    run(h, {128, 32, 4, {{2, 5, 1}, {0, 700, 1}, {1, 64, 1}}}, kDecodeTol);
    run(h, {256, 16, 2, {{1, 300, 2}, {0, 10, 1}, {2, 129, 4}}}, kDecodeTol);
    run(h, {64, 4, 4, {{3, 0, 1}, {1, 17, 1}}, 0, 5}, kDecodeTol);
}

TEST_CASE("attention decode: fused append at page boundaries (T = 1..8 at contexts 1, 63, 64, 65, 300, 4096)") {
    // The decode kernel appends this step's k/v itself and, with several splits, merges them in the
    // column's last block (attention.h). T tokens of one sequence, the first at context ctx
    // (positions ctx-1 .. ctx+T-2, so tokens cross the page boundaries at 64 and 128), with a block
    // table just wide enough (one split up to 128 positions) and with a 4608-token one (36..66
    // splits, most of them past the length at short contexts).
    OpHarness h(107);
    for (int T = 1; T <= 8; ++T)
        for (int ctx : {1, 63, 64, 65, 300, 4096}) {
            run(h, {128, 32, 4, {{0, ctx - 1, T}}}, kDecodeTol);
            run(h, {128, 32, 4, {{0, ctx - 1, T}}, 72}, kDecodeTol);
        }
    // Qwen3-Next's hd256 16/2 and the demo model's hd64 4/4 at the same boundaries.
    for (int T : {1, 2, 5, 8})
        for (int ctx : {1, 63, 64, 65, 300, 4096}) {
            run(h, {256, 16, 2, {{0, ctx - 1, T}}, 72}, kDecodeTol);
            run(h, {64, 4, 4, {{0, ctx - 1, T}}}, kDecodeTol);
        }
    // Group 6: a token's rows straddle two row groups (its cache row belongs to the first block);
    // group 32: one token spans two row groups.
    run(h, {64, 12, 2, {{0, 62, 4}}}, kDecodeTol);
    run(h, {64, 12, 2, {{1, 300, 3}, {0, 64, 2}}, 16}, kDecodeTol);
    run(h, {64, 64, 2, {{0, 129, 3}}, 8}, kDecodeTol);
}

TEST_CASE("attention decode: a layer's q / k RMS_NORM + RoPE folded into the decode kernel") {
    // The per-head q and k norms and their RoPE directly before the attention (a Qwen3 layer): the
    // backend runs the five nodes as one decode launch (op_attention_norm_rope, attention.h
    // NormRope) where every dim rotates, and as the norm + RoPE pair and the attention otherwise
    // (partial rotation, a prefill step). Either way it must be the CPU's ops in turn, at the decode
    // tolerance (the norm's and sincosf's ulps move q and k by ~1e-7 relative, far below the f16
    // cache's rounding). The CPU warp emulator checks that the fused kernel's output and cache are
    // bit for bit the unfused kernels' (dev/kernels/attention, "normrope" cases). Replayed from a
    // captured graph too (set_replay_check).
    struct C {
        int  hd, n_head, n_kv, start, n, n_rot;
        bool zc;
    };
    const C cases[] = {
        {128, 32, 4, 0, 1, 128, false},    {128, 32, 4, 299, 1, 128, false}, {128, 32, 8, 4095, 1, 128, false},
        {128, 16, 2, 62, 4, 128, true},    {64, 8, 4, 40, 2, 64, false},     {256, 16, 2, 130, 3, 256, false},
        {128, 16, 2, 20, 1, 64, false},  // partial rotation: the pair and the attention
        {128, 16, 2, 3, 24, 128, false},  // prefill: the pair and the append + prefill kernels
    };
    OpHarness h(108);
    h.set_replay_check(true);
    for (const C & c : cases) {
        const std::string name = "q/k norm + rope + attention hd" + std::to_string(c.hd) + " heads " + std::to_string(c.n_head) + "/" +
                                 std::to_string(c.n_kv) + " pos " + std::to_string(c.start) + "+" + std::to_string(c.n) + " n_rot " +
                                 std::to_string(c.n_rot) + (c.zc ? " zero-centred" : "");
        h.check(name, c.n > 8 ? kPrefillTol : kDecodeTol, [&](OpBuilder & b) {
            const int            pages = (c.start + c.n + kPage - 1) / kPage;
            std::vector<int32_t> pos, table(static_cast<size_t>(pages));
            for (int i = 0; i < c.n; ++i) pos.push_back(c.start + i);
            for (int p = 0; p < pages; ++p) table[size_t(p)] = pages + 1 - p;  // distinct pages, in reverse order
            spark::Graph &    g  = b.graph();
            Tensor *          q  = b.input({c.hd, c.n_head, c.n}, 3.0f);
            Tensor *          k  = b.input({c.hd, c.n_kv, c.n}, 3.0f);
            Tensor *          v  = b.input({c.hd, c.n_kv, c.n});
            Tensor *          qw = b.param({c.hd}, 0.2f, c.zc ? 0.0f : 1.0f);
            Tensor *          kw = b.param({c.hd}, 0.2f, c.zc ? 0.0f : 1.0f);
            Tensor *          kc = b.state({int64_t(c.hd) * c.n_kv, kPage, pages + 2}, 1.0f, true);
            Tensor *          vc = b.state({int64_t(c.hd) * c.n_kv, kPage, pages + 2}, 1.0f, true);
            spark::StepInputs step;
            step.pos         = b.input_i32({c.n}, pos);
            step.seq         = b.input_i32({c.n}, std::vector<int32_t>(static_cast<size_t>(c.n), 0));
            step.block_table = b.input_i32({pages, 1}, table);
            // As build_attention: q norm, q rope, k norm, k rope, then the attention.
            Tensor * qr = g.rope(g.rms_norm(q, qw, 1e-6f, c.zc), step.pos, c.n_rot, 1e6f);
            Tensor * kr = g.rope(g.rms_norm(k, kw, 1e-6f, c.zc), step.pos, c.n_rot, 1e6f);
            return g.attention(qr, kr, v, kc, vc, step, 1.0f / std::sqrt(float(c.hd)));
        });
    }
}

TEST_CASE("attention prefill: one sequence") {
    OpHarness h(105);
    run(h, {128, 32, 4, {{0, 0, 64}}}, kPrefillTol);
    run(h, {128, 32, 4, {{0, 0, 512}}}, kPrefillTol);
    run(h, {64, 4, 4, {{0, 0, 200}}}, kPrefillTol);
    run(h, {256, 16, 2, {{0, 0, 300}}}, kPrefillTol);
    run(h, {128, 8, 4, {{0, 777, 100}}}, kPrefillTol);   // after earlier context, unaligned start
    run(h, {256, 16, 2, {{0, 1500, 64}}, 0, 1, true}, kPrefillTol);
    run(h, {128, 32, 2, {{0, 5, 9}}}, kPrefillTol);      // T = 9: the smallest prefill step, group 16
}

TEST_CASE("attention prefill: several sequences in one step") {
    OpHarness h(106);
    run(h, {128, 32, 4, {{1, 0, 100}, {0, 64, 37}, {2, 300, 200}}}, kPrefillTol);
    run(h, {64, 4, 4, {{0, 0, 64}, {1, 0, 64}}}, kPrefillTol);
    run(h, {256, 16, 2, {{2, 10, 70}, {0, 0, 1}, {1, 500, 90}}}, kPrefillTol);
}

TEST_CASE("attention: unsupported shapes are clear errors") {
    // head_dim 96 has no kernel instance: SPARK_ERR_UNSUPPORTED from the launcher, not a crash.
    auto build = [](OpBuilder & b) {
        spark::Graph &    g  = b.graph();
        Tensor *          q  = b.input({96, 4, 1});
        Tensor *          k  = b.input({96, 2, 1});
        Tensor *          v  = b.input({96, 2, 1});
        Tensor *          kc = b.state({96 * 2, kPage, 2}, 1.0f, true);
        Tensor *          vc = b.state({96 * 2, kPage, 2}, 1.0f, true);
        spark::StepInputs step;
        step.pos         = b.input_i32({1}, {5});
        step.seq         = b.input_i32({1}, {0});
        step.block_table = b.input_i32({1, 1}, {1});
        return g.attention(q, k, v, kc, vc, step, 0.1f);
    };
    try {
        run_cuda_only(build);
        FAIL("head_dim 96 ran");
    } catch (const spark::Error & e) {
        CHECK(e.status() == SPARK_ERR_UNSUPPORTED);
        MESSAGE(std::string(e.what()));
    }
}

TEST_CASE("attention: a KV cache that is not F16 is a clear error") {
    // The kernels read f16 bits; a BF16 (the former format) or F32 cache is refused before any
    // launch (the caches are never read, so they have no storage here).
    for (DType type : {DType::BF16, DType::F32}) {
        auto build = [type](OpBuilder & b) {
            spark::Graph &    g  = b.graph();
            Tensor *          q  = b.input({128, 4, 1});
            Tensor *          k  = b.input({128, 2, 1});
            Tensor *          v  = b.input({128, 2, 1});
            Tensor *          kc = g.external(type, {128 * 2, kPage, 2}, nullptr, "k_cache");
            Tensor *          vc = g.external(type, {128 * 2, kPage, 2}, nullptr, "v_cache");
            spark::StepInputs step;
            step.pos         = b.input_i32({1}, {5});
            step.seq         = b.input_i32({1}, {0});
            step.block_table = b.input_i32({1, 1}, {1});
            return g.attention(q, k, v, kc, vc, step, 0.1f);
        };
        try {
            run_cuda_only(build);
            FAIL("attention ran on a " << spark::dtype_name(type) << " cache");
        } catch (const spark::Error & e) {
            CHECK(e.status() == SPARK_ERR_UNSUPPORTED);
            MESSAGE(std::string(e.what()));
        }
    }
}
