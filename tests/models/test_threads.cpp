// Threads as spark.h promises: one model shared by several contexts, each used by its own thread.
// 4 threads x 4 contexts (2 CPU threads each) decode the demo model at once, three rounds, and every
// context prints the tokens one context prints alone. (Run under ThreadSanitizer by .ci/run: the
// contexts share the weights and nothing else on the CPU; each has its own thread pool.)
#include "harness.h"

#include <thread>

using namespace test;

namespace {

std::string demo(const char * name) { return std::string(SPARK_TEST_DATA) + "/../../examples/models/" + name; }

// Greedy tokens after the demo golden's prompt, in a fresh context of `m`.
std::vector<int32_t> run_once(spark_model * m, const std::vector<int32_t> & prompt, int n, spark_status & err) {
    spark_context_params p = spark_context_default_params();
    p.n_ctx     = 256;
    p.n_threads = 2;
    spark_context * ctx = nullptr;
    if ((err = spark_context_init(m, p, &ctx)) != SPARK_OK) return {};
    std::vector<int32_t> out;
    spark_batch          b = spark_batch_init(int32_t(prompt.size()), 1);
    for (size_t i = 0; i < prompt.size(); ++i) {
        b.token[i] = prompt[i], b.pos[i] = int32_t(i), b.n_seq_id[i] = 1, b.seq_id[i][0] = 0, b.logits[i] = i + 1 == prompt.size();
    }
    b.n_tokens = int32_t(prompt.size());
    err        = spark_decode(ctx, &b);
    for (int i = 0; i < n && err == SPARK_OK; ++i) {
        const spark_token t = spark_get_argmax_ith(ctx, -1);
        out.push_back(t);
        b.n_tokens = 1, b.token[0] = t, b.pos[0] = int32_t(prompt.size()) + i, b.logits[0] = 1;
        err = spark_decode(ctx, &b);
    }
    spark_batch_free(b);
    spark_context_free(ctx);
    return out;
}

}  // namespace

TEST_CASE("4 threads x 4 contexts of one model decode at once and print what one context prints alone") {
    Golden        g = load_golden(demo("spark-demo-coder-moe"));
    ModelPtr      m = load_model(demo("spark-demo-coder-moe"));
    constexpr int kTokens = 24, kThreads = 4, kPerThread = 4, kRounds = 3;
    spark_status  err  = SPARK_OK;
    const auto    want = run_once(m.get(), g.prompt, kTokens, err);
    REQUIRE(err == SPARK_OK);
    for (int round = 0; round < kRounds; ++round) {
        std::vector<std::vector<int32_t>> got(size_t(kThreads * kPerThread));
        std::vector<spark_status>         status(got.size(), SPARK_OK);
        std::vector<std::thread>          threads;
        for (int t = 0; t < kThreads; ++t)
            threads.emplace_back([&, t] {
                for (int c = 0; c < kPerThread; ++c) {
                    const size_t i = size_t(t * kPerThread + c);
                    got[i]         = run_once(m.get(), g.prompt, kTokens, status[i]);
                }
            });
        for (auto & th : threads) th.join();
        for (size_t i = 0; i < got.size(); ++i) {
            INFO("round " << round << ", context " << i);
            CHECK(status[i] == SPARK_OK);
            CHECK(got[i] == want);
        }
    }
}
