// Feeding, batching and rollback on the MoE and hybrid architectures (issue 5): the prompt in one
// batch, token by token and in uneven chunks gives the same logits; two sequences in one batch match
// each alone; a snapshot restores the recurrent state and the KV cache exactly.
// Tolerances: 1e-3 vs the goldens (float32 CPU); 1e-5 between feeding modes (same arithmetic, only
// matmul blocking and the order of per-token recurrent updates vs. batched ones differ); exact (0)
// after a snapshot restore (the very same computation is repeated).
#include "harness.h"

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
