// Feeding, batching and rollback on the MoE and hybrid architectures (issue 5): the prompt in one
// batch, token by token and in uneven chunks gives the same logits; two sequences in one batch match
// each alone; a snapshot restores the recurrent state and the KV cache exactly.
// Tolerances: 1e-3 vs the goldens (float32 CPU); 1e-5 between feeding modes (same arithmetic, only
// matmul blocking and the order of per-token recurrent updates vs. batched ones differ); exact (0)
// after a snapshot restore (the very same computation is repeated).
#include "harness.h"

#include "runtime/context.h"

using namespace test;

namespace {

const char * kModels[] = {"qwen3_moe-bf16", "qwen3_moe-int4-autoround", "qwen3_next-bf16", "qwen3_next-nvfp4-modelopt"};

}  // namespace

TEST_CASE("MoE / hybrid: one batch, token by token and uneven chunks agree") {
    for (const char * name : kModels) {
        SUBCASE(name) {
            Golden   g  = load_golden(model_dir(name));
            ModelPtr m  = load_model(model_dir(name));
            const int32_t nv = int32_t(g.n_vocab);
            auto one      = prompt_logits(new_context(m.get()).get(), g.prompt, nv);
            auto by_token = prompt_logits(new_context(m.get()).get(), g.prompt, nv, {1});
            auto uneven   = prompt_logits(new_context(m.get()).get(), g.prompt, nv, {5, 2, 7});
            auto stepped  = prompt_logits(new_context(m.get(), 256, 1, 3).get(), g.prompt, nv);  // n_batch 3
            CHECK(max_abs_diff(one, g.logits) <= 1e-3f);
            for (auto * v : {&by_token, &uneven, &stepped}) {
                CHECK(max_abs_diff(*v, g.logits) <= 1e-3f);
                CHECK(max_abs_diff(*v, one) <= 1e-5f);
            }
        }
    }
}

TEST_CASE("MoE / hybrid: two sequences in one batch match each alone") {
    for (const char * name : kModels) {
        SUBCASE(name) {
            Golden   g  = load_golden(model_dir(name));
            ModelPtr m  = load_model(model_dir(name));
            const int32_t nv = int32_t(g.n_vocab);
            std::vector<int32_t> a = g.prompt;
            std::vector<int32_t> b(g.prompt.begin() + 3, g.prompt.end());
            std::reverse(b.begin(), b.end());
            auto alone_a = prompt_logits(new_context(m.get()).get(), a, nv);
            auto alone_b = prompt_logits(new_context(m.get()).get(), b, nv);

            ContextPtr  ctx = new_context(m.get(), 256, 2);
            const int32_t n = int32_t(a.size() + b.size());
            spark_batch batch = spark_batch_init(n, 1);
            std::vector<std::pair<int, size_t>> order;
            for (size_t i = 0; i < a.size(); ++i) {
                order.push_back({0, i});
                if (i < b.size()) order.push_back({1, i});
            }
            for (int32_t r = 0; r < n; ++r) {
                auto [s, i]        = order[size_t(r)];
                batch.token[r]     = s == 0 ? a[i] : b[i];
                batch.pos[r]       = int32_t(i);
                batch.n_seq_id[r]  = 1;
                batch.seq_id[r][0] = s;
                batch.logits[r]    = 1;
            }
            batch.n_tokens = n;
            REQUIRE(spark_decode(ctx.get(), &batch) == SPARK_OK);
            std::vector<float> got_a, got_b;
            for (int32_t r = 0; r < n; ++r) {
                const float * l = spark_get_logits_ith(ctx.get(), r);
                REQUIRE(l != nullptr);
                auto & dst = order[size_t(r)].first == 0 ? got_a : got_b;
                dst.insert(dst.end(), l, l + nv);
            }
            spark_batch_free(batch);
            CHECK(max_abs_diff(got_a, alone_a) <= 1e-5f);
            CHECK(max_abs_diff(got_b, alone_b) <= 1e-5f);
        }
    }
}

TEST_CASE("MoE / hybrid: a snapshot after token t restored reproduces the logits of token t+1 exactly") {
    for (const char * name : kModels) {
        SUBCASE(name) {
            Golden     g   = load_golden(model_dir(name));
            ModelPtr   m   = load_model(model_dir(name));
            ContextPtr ctx = new_context(m.get());
            const int32_t nv = int32_t(g.n_vocab);
            const size_t  t  = 10;
            std::vector<float> scratch;
            REQUIRE(decode_range(ctx.get(), g.prompt, 0, t + 1, 0, nv, scratch) == SPARK_OK);
            int32_t snap = -1;
            REQUIRE(spark_memory_seq_snapshot(ctx.get(), 0, &snap) == SPARK_OK);

            std::vector<float> first, second;
            REQUIRE(decode_range(ctx.get(), g.prompt, t + 1, t + 2, 0, nv, first) == SPARK_OK);
            // Run on: a few more tokens change the KV cache and the recurrent state.
            REQUIRE(decode_range(ctx.get(), g.prompt, t + 2, t + 6, 0, nv, scratch) == SPARK_OK);
            REQUIRE(spark_memory_seq_length(ctx.get(), 0) == int32_t(t + 6));

            REQUIRE(spark_memory_seq_restore(ctx.get(), 0, snap) == SPARK_OK);
            CHECK(spark_memory_seq_length(ctx.get(), 0) == int32_t(t + 1));
            REQUIRE(decode_range(ctx.get(), g.prompt, t + 1, t + 2, 0, nv, second) == SPARK_OK);
            CHECK(max_abs_diff(first, second) == 0.0f);
            // And it matches the golden at that position.
            std::vector<float> golden_row(g.logits.begin() + (t + 1) * nv, g.logits.begin() + (t + 2) * nv);
            CHECK(max_abs_diff(second, golden_row) <= 1e-3f);

            // Restoring again works (the snapshot stays valid); a foreign sequence id is refused.
            CHECK(spark_memory_seq_restore(ctx.get(), 0, snap) == SPARK_OK);
            CHECK(spark_memory_seq_restore(ctx.get(), 1, snap) == SPARK_ERR_INVALID_ARGUMENT);
            spark_memory_snapshot_free(ctx.get(), snap);
            CHECK(spark_memory_seq_restore(ctx.get(), 0, snap) == SPARK_ERR_INVALID_ARGUMENT);
        }
    }
}

TEST_CASE("hybrid: a partial tail removal of recurrent state is refused; full removal works") {
    Golden     g   = load_golden(model_dir("qwen3_next-bf16"));
    ModelPtr   m   = load_model(model_dir("qwen3_next-bf16"));
    ContextPtr ctx = new_context(m.get());
    std::vector<float> first, again;
    REQUIRE(decode_range(ctx.get(), g.prompt, 0, g.prompt.size(), 0, int32_t(g.n_vocab), first) == SPARK_OK);
    CHECK(spark_memory_seq_rm(ctx.get(), 0, 5, -1) == SPARK_ERR_UNSUPPORTED);
    CHECK(spark_memory_seq_length(ctx.get(), 0) == int32_t(g.prompt.size()));
    CHECK(spark_memory_seq_rm(ctx.get(), 0, 0, -1) == SPARK_OK);
    CHECK(spark_memory_seq_length(ctx.get(), 0) == 0);
    REQUIRE(decode_range(ctx.get(), g.prompt, 0, g.prompt.size(), 0, int32_t(g.n_vocab), again) == SPARK_OK);
    CHECK(max_abs_diff(first, again) == 0.0f);
}

TEST_CASE("dense: tail removal and re-decoding reproduce the logits (KV-only rollback)") {
    Golden     g   = load_golden(model_dir("qwen3_moe-bf16"));
    ModelPtr   m   = load_model(model_dir("qwen3_moe-bf16"));
    ContextPtr ctx = new_context(m.get());
    const int32_t nv = int32_t(g.n_vocab);
    std::vector<float> all, tail;
    REQUIRE(decode_range(ctx.get(), g.prompt, 0, g.prompt.size(), 0, nv, all) == SPARK_OK);
    REQUIRE(spark_memory_seq_rm(ctx.get(), 0, 12, -1) == SPARK_OK);
    REQUIRE(decode_range(ctx.get(), g.prompt, 12, g.prompt.size(), 0, nv, tail) == SPARK_OK);
    std::vector<float> expect(all.begin() + 12 * nv, all.end());
    CHECK(max_abs_diff(tail, expect) <= 1e-5f);
    CHECK(spark_memory_seq_rm(ctx.get(), 0, 3, 5) == SPARK_ERR_UNSUPPORTED);  // a hole in the middle
}

namespace {
ContextPtr rollback_context(spark_model * m, int32_t n_rollback, int32_t n_batch = 512) {
    spark_context_params p = spark_context_default_params();
    p.n_ctx                = 256;
    p.n_batch              = n_batch;
    p.n_threads            = 2;
    p.n_rollback           = n_rollback;
    spark_context * c      = nullptr;
    REQUIRE(spark_context_init(m, p, &c) == SPARK_OK);
    return ContextPtr(c);
}
}  // namespace

TEST_CASE("hybrid with n_rollback: up to n_rollback trailing tokens are removed exactly, without recompute") {
    Golden        g  = load_golden(model_dir("qwen3_next-bf16"));
    ModelPtr      m  = load_model(model_dir("qwen3_next-bf16"));
    const int32_t nv = int32_t(g.n_vocab);
    ContextPtr    ctx = rollback_context(m.get(), 4);
    std::vector<float> all, again;
    // 20 tokens in one step, then 4 one at a time: the states after the last 5 positions are kept.
    REQUIRE(decode_range(ctx.get(), g.prompt, 0, 20, 0, nv, all) == SPARK_OK);
    for (size_t t = 20; t < 24; ++t) REQUIRE(decode_range(ctx.get(), g.prompt, t, t + 1, 0, nv, all) == SPARK_OK);
    CHECK(spark_memory_seq_can_rm(ctx.get(), 0, 20, -1));
    CHECK(!spark_memory_seq_can_rm(ctx.get(), 0, 19, -1));  // 5 back: beyond n_rollback
    CHECK(spark_memory_seq_rm(ctx.get(), 0, 19, -1) == SPARK_ERR_UNSUPPORTED);
    CHECK(std::string(spark_last_error()).find("n_rollback = 4") != std::string::npos);
    CHECK(spark_memory_seq_length(ctx.get(), 0) == 24);
    // Cut 3, decode them again: identical logits (the very same arithmetic from the same state).
    REQUIRE(spark_memory_seq_rm(ctx.get(), 0, 21, -1) == SPARK_OK);
    REQUIRE(decode_range(ctx.get(), g.prompt, 21, 24, 0, nv, again) == SPARK_OK);
    std::vector<float> want(all.begin() + 21 * nv, all.end());
    // The step of 3 rows vs 3 steps of 1: same per-row arithmetic on the CPU backend (1e-5 at most).
    CHECK(max_abs_diff(again, want) <= 1e-5f);
    // After a cut, the floor stays: lengths below 20 are still out of reach.
    CHECK(!spark_memory_seq_can_rm(ctx.get(), 0, 19, -1));
    CHECK(spark_memory_seq_can_rm(ctx.get(), 0, 0, -1));
    // One step of 4 (a verify batch): every one of its positions can be returned to exactly.
    REQUIRE(spark_memory_seq_rm(ctx.get(), 0, 20, -1) == SPARK_OK);
    std::vector<float> batch4;
    REQUIRE(decode_range(ctx.get(), g.prompt, 20, 24, 0, nv, batch4) == SPARK_OK);
    for (int32_t keep = 23; keep >= 20; --keep) {
        REQUIRE(spark_memory_seq_rm(ctx.get(), 0, keep, -1) == SPARK_OK);
        std::vector<float> one;
        REQUIRE(decode_range(ctx.get(), g.prompt, size_t(keep), size_t(keep) + 1, 0, nv, one) == SPARK_OK);
        std::vector<float> ref(batch4.begin() + (keep - 20) * nv, batch4.begin() + (keep - 19) * nv);
        CHECK(max_abs_diff(one, ref) <= 1e-5f);
        REQUIRE(spark_memory_seq_rm(ctx.get(), 0, keep, -1) == SPARK_OK);
    }
}

TEST_CASE("a snapshot becomes invalid when its sequence is truncated below it, cleared, overwritten or restored past") {
    Golden        g  = load_golden(model_dir("qwen3_next-bf16"));
    ModelPtr      m  = load_model(model_dir("qwen3_next-bf16"));
    const int32_t nv = int32_t(g.n_vocab);
    spark_context_params p = spark_context_default_params();
    p.n_ctx = 256, p.n_seq_max = 2, p.n_snapshots = 4, p.n_threads = 2;
    spark_context * raw = nullptr;
    REQUIRE(spark_context_init(m.get(), p, &raw) == SPARK_OK);
    ContextPtr         ctx(raw);
    std::vector<float> scratch;
    auto               snap_at = [&](size_t len) {
        REQUIRE(spark_memory_seq_rm(ctx.get(), 0, 0, -1) == SPARK_OK);
        REQUIRE(decode_range(ctx.get(), g.prompt, 0, len, 0, nv, scratch) == SPARK_OK);
        int32_t s = -1;
        REQUIRE(spark_memory_seq_snapshot(ctx.get(), 0, &s) == SPARK_OK);
        REQUIRE(decode_range(ctx.get(), g.prompt, len, len + 4, 0, nv, scratch) == SPARK_OK);
        return s;
    };
    // Truncated below it (to 0: recurrent models cut fully), then grown past it again.
    int32_t s = snap_at(10);
    REQUIRE(spark_memory_seq_rm(ctx.get(), 0, 0, -1) == SPARK_OK);
    REQUIRE(decode_range(ctx.get(), g.prompt, 0, 16, 0, nv, scratch) == SPARK_OK);
    CHECK(spark_memory_seq_restore(ctx.get(), 0, s) == SPARK_ERR_INVALID_ARGUMENT);
    CHECK(std::string(spark_last_error()).find("truncated below it") != std::string::npos);
    spark_memory_snapshot_free(ctx.get(), s);
    // Cleared.
    s = snap_at(10);
    spark_memory_clear(ctx.get());
    REQUIRE(decode_range(ctx.get(), g.prompt, 0, 16, 0, nv, scratch) == SPARK_OK);
    CHECK(spark_memory_seq_restore(ctx.get(), 0, s) == SPARK_ERR_INVALID_ARGUMENT);
    CHECK(std::string(spark_last_error()).find("cleared") != std::string::npos);
    spark_memory_snapshot_free(ctx.get(), s);
    // Overwritten by a copy.
    s = snap_at(10);
    REQUIRE(decode_range(ctx.get(), g.prompt, 0, 20, 1, nv, scratch) == SPARK_OK);
    REQUIRE(spark_memory_seq_cp(ctx.get(), 1, 0) == SPARK_OK);
    CHECK(spark_memory_seq_restore(ctx.get(), 0, s) == SPARK_ERR_INVALID_ARGUMENT);
    CHECK(std::string(spark_last_error()).find("overwritten by a copy") != std::string::npos);
    spark_memory_snapshot_free(ctx.get(), s);
    // A later snapshot is invalid after restoring an earlier one; the earlier stays valid.
    int32_t early = snap_at(8), late = -1;
    REQUIRE(spark_memory_seq_snapshot(ctx.get(), 0, &late) == SPARK_OK);
    REQUIRE(spark_memory_seq_restore(ctx.get(), 0, early) == SPARK_OK);
    CHECK(spark_memory_seq_restore(ctx.get(), 0, late) == SPARK_ERR_INVALID_ARGUMENT);
    CHECK(spark_memory_seq_restore(ctx.get(), 0, early) == SPARK_OK);
}

TEST_CASE("a decode that fails part-way keeps its completed steps and leaves no trace of the failing one") {
    Golden        g  = load_golden(model_dir("qwen3_next-bf16"));
    ModelPtr      m  = load_model(model_dir("qwen3_next-bf16"));
    const int32_t nv = int32_t(g.n_vocab);
    ContextPtr    ctx = rollback_context(m.get(), 0, 4);  // n_batch 4: a 12-token batch is three steps
    std::vector<float> ref, got, scratch;
    REQUIRE(decode_range(ctx.get(), g.prompt, 0, 8, 0, nv, scratch) == SPARK_OK);
    ctx->impl->fail_after_steps(2);  // the third step fails; the two before it stay
    CHECK(decode_range(ctx.get(), g.prompt, 8, 20, 0, nv, scratch) == SPARK_ERR_DEVICE);
    REQUIRE(spark_memory_seq_length(ctx.get(), 0) == 16);
    REQUIRE(decode_range(ctx.get(), g.prompt, 16, 20, 0, nv, got) == SPARK_OK);
    ContextPtr fresh = rollback_context(m.get(), 0, 4);
    REQUIRE(decode_range(fresh.get(), g.prompt, 0, 16, 0, nv, scratch) == SPARK_OK);
    REQUIRE(decode_range(fresh.get(), g.prompt, 16, 20, 0, nv, ref) == SPARK_OK);
    CHECK(max_abs_diff(got, ref) == 0.0f);
}

namespace {
struct AbortAfter {
    int calls = 0, trip = 0;
    // The calls made before a step (the sequence's length changed since the previous call).
    spark_context *  ctx = nullptr;
    int32_t          last_length = -1;
    std::vector<int> before_step;
    static bool check(void * p) {
        auto * a = static_cast<AbortAfter *>(p);
        ++a->calls;
        if (a->ctx && spark_memory_seq_length(a->ctx, 0) != a->last_length) {
            a->last_length = spark_memory_seq_length(a->ctx, 0);
            a->before_step.push_back(a->calls);
        }
        return a->calls == a->trip;
    }
};
}  // namespace

TEST_CASE("the abort callback stops a decode between steps and, on the CPU, inside a step; nothing half-done stays") {
    Golden        g  = load_golden(model_dir("qwen3_next-bf16"));
    ModelPtr      m  = load_model(model_dir("qwen3_next-bf16"));
    const int32_t nv = int32_t(g.n_vocab);
    ContextPtr    fresh = rollback_context(m.get(), 0, 4);
    std::vector<float> ref, scratch;
    REQUIRE(decode_range(fresh.get(), g.prompt, 0, 20, 0, nv, ref) == SPARK_OK);
    // Count the callback's calls in a whole 20-token decode (5 steps of 4), then stop at each one.
    AbortAfter count;
    {
        ContextPtr ctx = rollback_context(m.get(), 0, 4);
        count.ctx      = ctx.get();
        spark_context_set_abort_callback(ctx.get(), &AbortAfter::check, &count);
        REQUIRE(decode_range(ctx.get(), g.prompt, 0, 20, 0, nv, scratch) == SPARK_OK);
    }
    REQUIRE(count.before_step.size() == 5);
    // Before each step, and on the CPU between the ops of each too.
    if (test_device() == SPARK_DEVICE_CPU) REQUIRE(count.calls > 5);
    else REQUIRE(count.calls == 5);
    // Inside steps, and before each step (after earlier steps backed up their recurrent states).
    std::vector<int> trips = {2, count.calls / 3, count.calls / 2, count.calls - 1};
    trips.insert(trips.end(), count.before_step.begin(), count.before_step.end());
    for (int trip : trips) {
        INFO("abort at call " << trip << " of " << count.calls);
        ContextPtr ctx = rollback_context(m.get(), 0, 4);
        AbortAfter a;
        a.trip = trip;
        spark_context_set_abort_callback(ctx.get(), &AbortAfter::check, &a);
        CHECK(decode_range(ctx.get(), g.prompt, 0, 20, 0, nv, scratch) == SPARK_ERR_ABORTED);
        const int32_t kept = spark_memory_seq_length(ctx.get(), 0);
        CHECK(kept % 4 == 0);  // whole steps only
        CHECK(kept < 20);
        // Go on from there: the logits of the rest are exactly those of an uninterrupted decode.
        spark_context_set_abort_callback(ctx.get(), nullptr, nullptr);
        std::vector<float> rest;
        REQUIRE(decode_range(ctx.get(), g.prompt, size_t(kept), 20, 0, nv, rest) == SPARK_OK);
        std::vector<float> want(ref.begin() + size_t(kept) * size_t(nv), ref.end());
        CHECK(max_abs_diff(rest, want) <= 1e-5f);  // same steps after `kept`; 1e-5: the step split differs
    }
}
