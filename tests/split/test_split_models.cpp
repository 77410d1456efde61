// A model split over ranks (docs/DISTRIBUTED.md) computes what the whole model computes: every
// fixture architecture in every format, tensor-parallel and expert-parallel over 2 and 4 ranks of
// the in-process group (ranks as threads, the CPU backend), against the same model on one rank.
#include "models/harness.h"
#include "runtime/context.h"
#include "runtime/rank_group.h"

#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace spark;

spark_model_params cpu_params() {
    spark_model_params p = spark_model_default_params();
    p.device             = SPARK_DEVICE_CPU;
    p.n_threads          = 1;
    p.load_tokenizer     = false;
    return p;
}

spark_context_params context_params() {
    spark_context_params p = spark_context_default_params();
    p.n_ctx                = 64;
    p.n_batch              = 64;
    p.n_seq_max            = 1;
    p.n_threads            = 1;
    return p;
}

// The prompt's tokens in one step with every row's logits, then two one-token steps (decode
// through the KV cache and the recurrent states): the logits of all of them, in order.
std::vector<float> run(Context & ctx, const std::vector<int32_t> & prompt, int64_t n_vocab) {
    std::vector<float> out;
    auto step = [&](size_t begin, size_t end) {
        spark_batch b = spark_batch_init(int32_t(end - begin), 1);
        for (size_t i = begin; i < end; ++i) {
            const int32_t j = int32_t(i - begin);
            b.token[j] = prompt[i], b.pos[j] = int32_t(i), b.n_seq_id[j] = 1, b.seq_id[j][0] = 0, b.logits[j] = 1;
        }
        b.n_tokens = int32_t(end - begin);
        try {
            ctx.decode(b);
        } catch (...) {
            spark_batch_free(b);
            throw;
        }
        spark_batch_free(b);
        const float * l = ctx.logits();
        out.insert(out.end(), l, l + (end - begin) * size_t(n_vocab));
    };
    const size_t n = prompt.size();
    step(0, n - 2);
    step(n - 2, n - 1);
    step(n - 1, n);
    return out;
}

struct SplitCase {
    SplitMode mode;
    int       size;
};

}  // namespace

TEST_CASE("split models: tensor and expert parallelism over 2 and 4 ranks give the whole model's logits, every fixture") {
    const SplitCase cases[] = {{SplitMode::Tensor, 2}, {SplitMode::Tensor, 4}, {SplitMode::Expert, 2}, {SplitMode::Expert, 4}};
    for (const char * name : test::kGoldenFixtures) {
        const std::string dir = test::model_dir(name);
        CAPTURE(dir);
        const test::Golden g = test::load_golden(dir);
        REQUIRE(g.prompt.size() >= 4);
        std::unique_ptr<Model> whole = load_model(dir, cpu_params());
        std::vector<float>     expect;
        {
            Context ctx(*whole, context_params());
            expect = run(ctx, g.prompt, g.n_vocab);
        }
        for (const SplitCase & c : cases) {
            const std::string mode = split_mode_name(c.mode);
            CAPTURE(mode);
            CAPTURE(c.size);
            RankGroup group = load_rank_group(dir, cpu_params(), c.mode, c.size);
            std::vector<std::unique_ptr<Context>> ctx;
            for (auto & m : group.ranks) ctx.push_back(std::make_unique<Context>(*m, context_params()));
            std::vector<std::vector<float>> got(size_t(c.size));
            run_ranks(group.communicators(), [&](int r) { got[size_t(r)] = run(*ctx[size_t(r)], g.prompt, g.n_vocab); });
            // The ranks' sums are added in another order than the whole model's matmuls add their
            // products (float rounding: ~1e-7 of each partial sum); the logits stay within 1e-5.
            REQUIRE(got[0].size() == expect.size());
            double worst = 0.0;
            for (size_t i = 0; i < expect.size(); ++i) worst = std::max(worst, double(std::fabs(got[0][i] - expect[i])));
            MESSAGE(std::string(name) << " " << mode << " x" << c.size << ": max |diff| " << worst);
            CHECK(worst <= 1e-5);
            // Every rank ends each step with the same bits (the all-reduce sums in rank order).
            for (int r = 1; r < c.size; ++r) CHECK(got[size_t(r)] == got[0]);
        }
    }
}

TEST_CASE("split models: a rank that fails ends the step with its error on every rank, none waits") {
    const std::string      dir   = test::model_dir("qwen3_moe-bf16");
    const test::Golden     g     = test::load_golden(dir);
    RankGroup              group = load_rank_group(dir, cpu_params(), SplitMode::Tensor, 4);
    std::vector<std::unique_ptr<Context>> ctx;
    for (auto & m : group.ranks) ctx.push_back(std::make_unique<Context>(*m, context_params()));
    ctx[2]->fail_after_steps(1);  // rank 2's second step fails as a device error would
    try {
        run_ranks(group.communicators(), [&](int r) { run(*ctx[size_t(r)], g.prompt, g.n_vocab); });
        FAIL("no error");
    } catch (const Error & e) {
        CHECK(e.status() != SPARK_ERR_ABORTED);  // rank 2's own error, not the aborts it caused
    }
}

TEST_CASE("split models: what cannot be split is refused with the reason") {
    const std::string dir = test::model_dir("qwen3-bf16");  // 4 query heads
    try {
        load_rank_group(dir, cpu_params(), SplitMode::Tensor, 8);
        FAIL("no error");
    } catch (const Error & e) {
        CHECK(e.status() == SPARK_ERR_UNSUPPORTED);
        CHECK(std::string(e.what()).find("attention heads") != std::string::npos);
    }
    CHECK_THROWS_AS(load_rank_group(dir, cpu_params(), SplitMode::Tensor, 1), Error);
}
