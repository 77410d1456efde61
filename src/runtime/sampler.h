// Sampler chains inside spark: what speculative verification needs beyond spark_sampler_sample,
// namely the distribution a chain draws from and its random source.
#pragma once

#include <spark/spark.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace spark {

// The distribution a chain draws its next token from for one row of logits: its stages applied in
// order up to the picking stage. A greedy pick (a greedy stage, no picking stage, or temperature
// <= 0) is a point mass.
struct Distribution {
    std::vector<int32_t> ids;    // candidates, most likely first
    std::vector<float>   probs;  // their probabilities, summing to 1
    float p(int32_t id) const;   // probability of a token (0 for non-candidates)
};

Distribution sampler_distribution(spark_sampler * smpl, const float * logits, int32_t n_vocab);

// True for a chain that only picks the most likely token (no penalties, no randomness): the
// backend's argmax serves it and no logits need to reach the host.
bool sampler_is_pure_greedy(const spark_sampler * smpl);

// A uniform draw in [0, 1) from the chain's random stage (24 random bits, identical on every
// platform); 0 for a chain without one (a greedy chain never needs to draw).
double sampler_uniform(spark_sampler * smpl);

// Draws a token from `d` with u in [0, 1) (the cumulative walk spark_sampler_sample does).
int32_t draw(const Distribution & d, double u);

// Speculative verification of one drafted token against the target distribution p (Leviathan et
// al. 2023, Chen et al. 2023): the draft is accepted with probability min(1, p(d) / q(d)); on
// rejection the returned token is drawn from the normalised max(0, p - q). q is the drafter's
// distribution over n_vocab tokens, or null for a deterministic drafter (a point mass at d:
// greedy drafts, n-gram lookup). The output is then distributed exactly as p. Randomness comes
// from the chain (sampler_uniform); a point-mass p decides without drawing.
struct Verdict {
    bool    accepted;
    int32_t token;  // the draft when accepted, else the replacement
};
Verdict verify_draft(spark_sampler * smpl, const Distribution & p, int32_t draft, const float * q, int32_t n_vocab);

// Verifies n_draft drafted tokens in order (speculative decoding's acceptance): row(i) gives the
// target's logits for the token after draft i - 1 (row 0: after the last accepted token), for
// i = 0 .. n_draft; greedy(i) its greedy token, which is all a pure-greedy chain needs (no logits
// reach the host). Each emitted token is accepted into the chain (penalties see the accepted
// prefix). Stops after the first rejection (its replacement is emitted), after a token for which
// stop() is true (end of generation), or after the token drawn from row n_draft when every draft
// was accepted. q: the drafter's distributions [n_draft][n_vocab], or null for deterministic
// drafts. Writes the emitted tokens to out (n_draft + 1 capacity) and returns their count; the
// number of accepted drafts among them goes to *n_accepted.
int32_t verify_drafts(spark_sampler * smpl, int32_t n_draft, const int32_t * drafts, const float * q, int32_t n_vocab,
                      const std::function<const float *(int32_t)> & row, const std::function<int32_t(int32_t)> & greedy,
                      const std::function<bool(int32_t)> & stop, int32_t * out, int32_t * n_accepted = nullptr);

}  // namespace spark
