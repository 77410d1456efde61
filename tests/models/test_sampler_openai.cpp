// The OpenAI-style sampler stages (presence / frequency penalties, logit_bias), checked on hand-made
// logits against the formulas of the OpenAI API reference.
#include <spark/spark.h>

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

namespace {

// The chain's distribution over 4 tokens, from logits 0, 1, 2, 3, through `stage` then temperature 1
// and a random pick (so that spark_sampler_probs returns the softmax of the adjusted logits).
std::vector<float> probs_after(spark_sampler * stage, const std::vector<spark_token> & accepted) {
    spark_sampler * chain = spark_sampler_chain_init(spark_sampler_chain_default_params());
    REQUIRE(stage != nullptr);
    REQUIRE(spark_sampler_chain_add(chain, stage) == SPARK_OK);
    REQUIRE(spark_sampler_chain_add(chain, spark_sampler_init_dist(7)) == SPARK_OK);
    for (spark_token t : accepted) spark_sampler_accept(chain, t);
    const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 3.0f};
    std::vector<float>       p(4);
    REQUIRE(spark_sampler_probs(chain, logits.data(), 4, p.data()) == SPARK_OK);
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
