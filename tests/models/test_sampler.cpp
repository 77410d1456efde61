// Each sampler stage on hand-made logits, against its formula: greedy, temperature, top-k, top-p,
// min-p, the repetition penalty (transformers' RepetitionPenaltyLogitsProcessor), OpenAI's presence /
// frequency penalties and logit_bias, the seeded random pick; cloning and reset. The distributions
// come from spark_sampler_probs (the chain up to its picking stage).
#include <spark/spark.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

// The chain's distribution over 4 tokens, from `logits` (default 0, 1, 2, 3), through `stage` then a
// random pick (so that spark_sampler_probs returns the softmax of the adjusted logits).
std::vector<float> probs_after(spark_sampler * stage, const std::vector<spark_token> & accepted,
                               const std::vector<float> & logits = {0.0f, 1.0f, 2.0f, 3.0f}) {
    spark_sampler * chain = spark_sampler_chain_init(spark_sampler_chain_default_params());
    REQUIRE(stage != nullptr);
    REQUIRE(spark_sampler_chain_add(chain, stage) == SPARK_OK);
    REQUIRE(spark_sampler_chain_add(chain, spark_sampler_init_dist(7)) == SPARK_OK);
    for (spark_token t : accepted) spark_sampler_accept(chain, t);
    std::vector<float> p(logits.size());
    REQUIRE(spark_sampler_probs(chain, logits.data(), int32_t(logits.size()), p.data()) == SPARK_OK);
    spark_sampler_free(chain);
    return p;
}

// softmax of the given logits
std::vector<float> softmax(const std::vector<double> & l) {
    double m = l[0];
    for (double x : l) m = std::max(m, x);
    double s = 0;
    for (double x : l) s += std::exp(x - m);
    std::vector<float> p;
    for (double x : l) p.push_back(float(std::exp(x - m) / s));
    return p;
}

void check_close(const std::vector<float> & got, const std::vector<float> & want) {
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));  // f32 softmax of 4 values
}

}  // namespace

TEST_CASE("sampler: presence and frequency penalties subtract presence * seen + frequency * count") {
    // token 3 accepted twice, token 1 once: logits 0, 1 - (0.5 + 0.25), 2, 3 - (0.5 + 2 * 0.25)
    check_close(probs_after(spark_sampler_init_presence_frequency(0.5f, 0.25f), {3, 1, 3}), softmax({0.0, 0.25, 2.0, 2.0}));
    // negative values encourage repetition, as OpenAI allows (-2 .. 2)
    check_close(probs_after(spark_sampler_init_presence_frequency(-1.0f, 0.0f), {0}), softmax({1.0, 1.0, 2.0, 3.0}));
    // nothing accepted yet: no change
    check_close(probs_after(spark_sampler_init_presence_frequency(2.0f, 2.0f), {}), softmax({0.0, 1.0, 2.0, 3.0}));
    // reset forgets the counts
    spark_sampler * s = spark_sampler_init_presence_frequency(1.0f, 1.0f);
    spark_sampler_accept(s, 3);
    spark_sampler_reset(s);
    check_close(probs_after(s, {}), softmax({0.0, 1.0, 2.0, 3.0}));
    CHECK(spark_sampler_init_presence_frequency(NAN, 0.0f) == nullptr);
    CHECK(spark_sampler_init_presence_frequency(0.0f, INFINITY) == nullptr);
}

TEST_CASE("sampler: logit_bias adds per token; -inf bans; bad arguments give NULL") {
    const spark_token ids[]    = {0, 3, 0, 99};
    const float       biases[] = {1.5f, -INFINITY, 0.5f, 100.0f};  // token 0 twice (summed); 99 is outside the vocabulary
    check_close(probs_after(spark_sampler_init_logit_bias(4, ids, biases), {}), {float(softmax({2.0, 1.0, 2.0})[0]),
                                                                                float(softmax({2.0, 1.0, 2.0})[1]),
                                                                                float(softmax({2.0, 1.0, 2.0})[2]), 0.0f});
    // a banned token is never sampled, even when it was the most likely
    spark_sampler * chain = spark_sampler_chain_init(spark_sampler_chain_default_params());
    const spark_token ban[] = {3};
    const float       inf[] = {-INFINITY};
    REQUIRE(spark_sampler_chain_add(chain, spark_sampler_init_logit_bias(1, ban, inf)) == SPARK_OK);
    REQUIRE(spark_sampler_chain_add(chain, spark_sampler_init_greedy()) == SPARK_OK);
    const float logits[] = {0.0f, 1.0f, 2.0f, 3.0f};
    spark_token t        = -1;
    REQUIRE(spark_sampler_sample_logits(chain, logits, 4, &t) == SPARK_OK);
    CHECK(t == 2);
    spark_sampler_free(chain);

    spark_sampler * none = spark_sampler_init_logit_bias(0, nullptr, nullptr);  // no biases: a no-op stage
    CHECK(none != nullptr);
    spark_sampler_free(none);
    CHECK(spark_sampler_init_logit_bias(-1, ids, biases) == nullptr);
    CHECK(spark_sampler_init_logit_bias(1, nullptr, biases) == nullptr);
    const float nan[] = {NAN}, pinf[] = {INFINITY};
    CHECK(spark_sampler_init_logit_bias(1, ids, nan) == nullptr);
    CHECK(spark_sampler_init_logit_bias(1, ids, pinf) == nullptr);
}

TEST_CASE("sampler: greedy picks the largest logit, the first of equals; temperature 0 is greedy") {
    spark_sampler * g        = spark_sampler_init_greedy();
    const float     logits[] = {0.5f, 3.0f, -1.0f, 3.0f};
    spark_token     t        = -1;
    REQUIRE(spark_sampler_sample_logits(g, logits, 4, &t) == SPARK_OK);
    CHECK(t == 1);
    spark_sampler_free(g);
    check_close(probs_after(spark_sampler_init_temp(0.0f), {}, {0.5f, 3.0f, -1.0f, 2.0f}), {0.0f, 1.0f, 0.0f, 0.0f});
}

TEST_CASE("sampler: temperature divides the logits") {
    check_close(probs_after(spark_sampler_init_temp(2.0f), {}), softmax({0.0, 0.5, 1.0, 1.5}));
    check_close(probs_after(spark_sampler_init_temp(0.5f), {}), softmax({0.0, 2.0, 4.0, 6.0}));
}

TEST_CASE("sampler: top-k keeps the k largest; k <= 0 or k >= n keeps all") {
    const std::vector<float> two = softmax({2.0, 3.0});
    check_close(probs_after(spark_sampler_init_top_k(2), {}), {0.0f, 0.0f, two[0], two[1]});
    check_close(probs_after(spark_sampler_init_top_k(0), {}), softmax({0.0, 1.0, 2.0, 3.0}));
    check_close(probs_after(spark_sampler_init_top_k(9), {}), softmax({0.0, 1.0, 2.0, 3.0}));
}

TEST_CASE("sampler: top-p keeps the smallest most likely set reaching p; min_keep holds") {
    const std::vector<float> p = softmax({0.0, 1.0, 2.0, 3.0});  // 0.032 0.087 0.237 0.644
    const std::vector<float> top2 = softmax({2.0, 3.0});
    check_close(probs_after(spark_sampler_init_top_p(0.8f, 1), {}), {0.0f, 0.0f, top2[0], top2[1]});  // 0.644 < 0.8 <= 0.881
    check_close(probs_after(spark_sampler_init_top_p(0.5f, 1), {}), {0.0f, 0.0f, 0.0f, 1.0f});        // 0.644 >= 0.5
    check_close(probs_after(spark_sampler_init_top_p(0.5f, 2), {}), {0.0f, 0.0f, top2[0], top2[1]});  // min_keep 2
    check_close(probs_after(spark_sampler_init_top_p(1.0f, 1), {}), p);
}

TEST_CASE("sampler: min-p keeps tokens at least p times as likely as the most likely one") {
    // relative to the best: e^-3 = 0.050, e^-2 = 0.135, e^-1 = 0.368, 1
    const std::vector<float> top2 = softmax({2.0, 3.0}), top3 = softmax({1.0, 2.0, 3.0});
    check_close(probs_after(spark_sampler_init_min_p(0.2f, 1), {}), {0.0f, 0.0f, top2[0], top2[1]});
    check_close(probs_after(spark_sampler_init_min_p(0.1f, 1), {}), {0.0f, top3[0], top3[1], top3[2]});
    check_close(probs_after(spark_sampler_init_min_p(0.9f, 3), {}), {0.0f, top3[0], top3[1], top3[2]});  // min_keep 3
}

TEST_CASE("sampler: repetition penalty divides positive and multiplies negative logits of recent tokens") {
    // logits -1, 1, 2, 3; tokens 0 and 3 seen: -1 * 2 = -2, 3 / 2 = 1.5
    check_close(probs_after(spark_sampler_init_penalties(64, 2.0f), {0, 3}, {-1.0f, 1.0f, 2.0f, 3.0f}), softmax({-2.0, 1.0, 2.0, 1.5}));
    // last_n = 1: only the latest token (3) counts
    check_close(probs_after(spark_sampler_init_penalties(1, 2.0f), {0, 3}, {-1.0f, 1.0f, 2.0f, 3.0f}), softmax({-1.0, 1.0, 2.0, 1.5}));
    // penalty 1: no change
    check_close(probs_after(spark_sampler_init_penalties(64, 1.0f), {0, 3}), softmax({0.0, 1.0, 2.0, 3.0}));
}

TEST_CASE("sampler: the seeded random pick follows the distribution, repeats after reset and in a clone") {
    spark_sampler * chain = spark_sampler_chain_init(spark_sampler_chain_default_params());
    REQUIRE(spark_sampler_chain_add(chain, spark_sampler_init_dist(42)) == SPARK_OK);
    const float        logits[] = {0.0f, 1.0f, 2.0f, 3.0f};
    const auto         p        = softmax({0.0, 1.0, 2.0, 3.0});
    constexpr int      kDraws   = 20000;
    std::vector<int>   counts(4, 0);
    std::vector<int>   first;
    for (int i = 0; i < kDraws; ++i) {
        spark_token t = -1;
        REQUIRE(spark_sampler_sample_logits(chain, logits, 4, &t) == SPARK_OK);
        REQUIRE(t >= 0);
        REQUIRE(t < 4);
        ++counts[size_t(t)];
        if (i < 32) first.push_back(t);
    }
    // Each count within 5 standard deviations of its expectation (binomial): a wrong pick rule (e.g.
    // off by one in the cumulative sum) moves the counts by far more.
    for (size_t k = 0; k < 4; ++k) {
        const double mean = kDraws * p[k], sd = std::sqrt(kDraws * p[k] * (1.0 - p[k]));
        CHECK(std::abs(counts[k] - mean) < 5.0 * sd);
    }
    spark_sampler_reset(chain);
    spark_sampler * copy = spark_sampler_clone(chain);
    for (int i = 0; i < 32; ++i) {
        spark_token a = -1, b = -1;
        REQUIRE(spark_sampler_sample_logits(chain, logits, 4, &a) == SPARK_OK);
        REQUIRE(spark_sampler_sample_logits(copy, logits, 4, &b) == SPARK_OK);
        CHECK(a == first[size_t(i)]);  // reset re-seeds
        CHECK(b == a);                 // a clone has the same random state
    }
    spark_sampler_free(copy);
    spark_sampler_free(chain);
}

TEST_CASE("sampler: logit_bias and the OpenAI penalties after a stage that sorted the candidates") {
    // top-k 3 sorts and drops token 0 first: the later stages find tokens by id in the sorted list.
    spark_sampler * chain = spark_sampler_chain_init(spark_sampler_chain_default_params());
    const spark_token ids[]    = {1, 3, 0};
    const float       biases[] = {2.5f, -1.0f, 100.0f};  // token 0 is no longer a candidate
    REQUIRE(spark_sampler_chain_add(chain, spark_sampler_init_top_k(3)) == SPARK_OK);
    REQUIRE(spark_sampler_chain_add(chain, spark_sampler_init_logit_bias(3, ids, biases)) == SPARK_OK);
    REQUIRE(spark_sampler_chain_add(chain, spark_sampler_init_presence_frequency(0.5f, 0.0f)) == SPARK_OK);
    REQUIRE(spark_sampler_chain_add(chain, spark_sampler_init_dist(1)) == SPARK_OK);
    spark_sampler_accept(chain, 2);
    const float        logits[] = {0.0f, 1.0f, 2.0f, 3.0f};
    std::vector<float> p(4);
    REQUIRE(spark_sampler_probs(chain, logits, 4, p.data()) == SPARK_OK);
    const std::vector<float> want = softmax({3.5, 1.5, 2.0});  // tokens 1, 2, 3: 1 + 2.5, 2 - 0.5, 3 - 1
    check_close(p, {0.0f, want[0], want[1], want[2]});
    spark_sampler_free(chain);
}
