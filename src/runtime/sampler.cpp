// Sampler chain: each stage narrows or reshapes the candidate distribution of one row of logits;
// a final pick is greedy unless a dist stage draws a seeded random token.
#include "runtime/sampler.h"

#include "common/error.h"
#include "runtime/context.h"

#include <spark/spark.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

namespace spark {

namespace {

struct Candidate {
    int32_t id;
    float   logit;
    float   p;
};

struct Candidates {
    std::vector<Candidate> items;
    bool                   sorted   = false;  // by logit, descending
    bool                   by_id    = true;   // items[i].id == i (built in id order, not sorted since)
    int32_t                selected = -1;     // index into items once a stage picked

    void sort_desc() {
        if (!sorted) {
            std::stable_sort(items.begin(), items.end(), [](const Candidate & a, const Candidate & b) { return a.logit > b.logit; });
            by_id = false;
        }
        sorted = true;
    }
    // Calls fn(candidate, value) for each (id, value) of the map whose token is still a candidate:
    // directly while the candidates are in id order (a stage early in the chain: a few entries, not
    // a pass over the whole vocabulary per token), else in one pass with lookups.
    template <class Map, class Fn> void for_ids(const Map & ids, Fn fn) {
        if (by_id) {
            for (const auto & [id, v] : ids)
                if (id >= 0 && size_t(id) < items.size()) fn(items[size_t(id)], v);
        } else {
            for (Candidate & x : items)
                if (const auto it = ids.find(x.id); it != ids.end()) fn(x, it->second);
        }
        sorted = false;
    }
    void softmax() {
        sort_desc();
        const float m   = items.empty() ? 0.0f : items[0].logit;
        double      sum = 0.0;
        for (Candidate & c : items) sum += (c.p = std::isinf(c.logit) && c.logit < 0 ? 0.0f : std::exp(c.logit - m));
        for (Candidate & c : items) c.p = float(c.p / sum);
    }
};

class Stage {
public:
    virtual ~Stage() = default;
    virtual void apply(Candidates & c) = 0;
    virtual void accept(int32_t) {}
    virtual void reset() {}
    virtual std::unique_ptr<Stage> clone() const = 0;
};

class Greedy final : public Stage {
public:
    std::unique_ptr<Stage> clone() const override { return std::make_unique<Greedy>(*this); }
    void apply(Candidates & c) override {
        int32_t best = 0;
        for (int32_t i = 1; i < int32_t(c.items.size()); ++i)
            if (c.items[size_t(i)].logit > c.items[size_t(best)].logit) best = i;
        c.selected = best;
    }
};

class Dist final : public Stage {
public:
    explicit Dist(uint32_t seed) : seed_(seed), rng_(seed) {}
    std::unique_ptr<Stage> clone() const override { return std::make_unique<Dist>(*this); }
    void apply(Candidates & c) override {
        c.softmax();
        const double u   = uniform();
        double       acc = 0.0;
        c.selected       = int32_t(c.items.size()) - 1;
        for (size_t i = 0; i < c.items.size(); ++i) {
            acc += c.items[i].p;
            if (u < acc) {
                c.selected = int32_t(i);
                break;
            }
        }
    }
    // 24 random bits -> [0, 1): identical on every platform (std distributions are not).
    double uniform() { return double(rng_() >> 8) / double(1u << 24); }
    void reset() override { rng_.seed(seed_); }

private:
    uint32_t     seed_;
    std::mt19937 rng_;
};

class Temperature final : public Stage {
public:
    std::unique_ptr<Stage> clone() const override { return std::make_unique<Temperature>(*this); }
    explicit Temperature(float t) : t_(t) {}
    void apply(Candidates & c) override {
        if (t_ <= 0.0f) {  // temperature 0: only the best token survives
            c.sort_desc();
            c.items.resize(std::min<size_t>(1, c.items.size()));
            return;
        }
        for (Candidate & x : c.items) x.logit /= t_;
    }

private:
    float t_;
};

class TopK final : public Stage {
public:
    std::unique_ptr<Stage> clone() const override { return std::make_unique<TopK>(*this); }
    explicit TopK(int32_t k) : k_(k) {}
    void apply(Candidates & c) override {
        if (k_ <= 0 || size_t(k_) >= c.items.size()) return;
        c.sort_desc();
        c.items.resize(size_t(k_));
    }

private:
    int32_t k_;
};

class TopP final : public Stage {
public:
    std::unique_ptr<Stage> clone() const override { return std::make_unique<TopP>(*this); }
    TopP(float p, size_t min_keep) : p_(p), min_keep_(std::max<size_t>(1, min_keep)) {}
    void apply(Candidates & c) override {
        if (p_ >= 1.0f) return;
        c.softmax();
        double cum  = 0.0;
        size_t keep = c.items.size();
        for (size_t i = 0; i < c.items.size(); ++i) {
            cum += c.items[i].p;
            if (cum >= p_ && i + 1 >= min_keep_) {
                keep = i + 1;
                break;
            }
        }
        c.items.resize(keep);
    }

private:
    float  p_;
    size_t min_keep_;
};

class MinP final : public Stage {
public:
    std::unique_ptr<Stage> clone() const override { return std::make_unique<MinP>(*this); }
    MinP(float p, size_t min_keep) : p_(p), min_keep_(std::max<size_t>(1, min_keep)) {}
    void apply(Candidates & c) override {
        if (p_ <= 0.0f || c.items.empty()) return;
        c.softmax();
        const float threshold = c.items[0].p * p_;
        size_t      keep      = c.items.size();
        for (size_t i = 0; i < c.items.size(); ++i)
            if (c.items[i].p < threshold && i >= min_keep_) {
                keep = i;
                break;
            }
        c.items.resize(keep);
    }

private:
    float  p_;
    size_t min_keep_;
};

// transformers' RepetitionPenaltyLogitsProcessor over the last `last_n` tokens.
class Penalties final : public Stage {
public:
    std::unique_ptr<Stage> clone() const override { return std::make_unique<Penalties>(*this); }
    Penalties(int32_t last_n, float penalty) : last_n_(last_n), penalty_(penalty) {}
    void apply(Candidates & c) override {
        if (penalty_ == 1.0f || history_.empty()) return;
        std::vector<int32_t> seen(history_.begin(), history_.end());
        std::sort(seen.begin(), seen.end());
        seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
        for (Candidate & x : c.items)
            if (std::binary_search(seen.begin(), seen.end(), x.id)) x.logit = x.logit > 0 ? x.logit / penalty_ : x.logit * penalty_;
        c.sorted = false;
    }
    void accept(int32_t t) override {
        if (last_n_ == 0) return;
        history_.push_back(t);
        if (last_n_ > 0 && int32_t(history_.size()) > last_n_) history_.pop_front();
    }
    void reset() override { history_.clear(); }

private:
    int32_t             last_n_;
    float               penalty_;
    std::deque<int32_t> history_;
};

// OpenAI's presence and frequency penalties over the tokens accepted so far (the answer, when the
// host accepts no prompt tokens): logit -= presence * (count > 0) + frequency * count.
class PresenceFrequency final : public Stage {
public:
    std::unique_ptr<Stage> clone() const override { return std::make_unique<PresenceFrequency>(*this); }
    PresenceFrequency(float presence, float frequency) : presence_(presence), frequency_(frequency) {}
    void apply(Candidates & c) override {
        if (counts_.empty() || (presence_ == 0.0f && frequency_ == 0.0f)) return;
        c.for_ids(counts_, [&](Candidate & x, int32_t count) { x.logit -= presence_ + frequency_ * float(count); });
    }
    void accept(int32_t t) override { ++counts_[t]; }
    void reset() override { counts_.clear(); }

private:
    float                                presence_, frequency_;
    std::unordered_map<int32_t, int32_t> counts_;
};

// Fixed additive biases per token (OpenAI's logit_bias; -inf bans a token).
class LogitBias final : public Stage {
public:
    std::unique_ptr<Stage> clone() const override { return std::make_unique<LogitBias>(*this); }
    explicit LogitBias(std::unordered_map<int32_t, float> bias) : bias_(std::move(bias)) {}
    void apply(Candidates & c) override {
        c.for_ids(bias_, [](Candidate & x, float b) { x.logit += b; });
    }

private:
    std::unordered_map<int32_t, float> bias_;
};

}  // namespace

}  // namespace spark

struct spark_sampler {
    std::unique_ptr<spark::Stage>                 stage;  // a single stage ...
    std::vector<std::unique_ptr<spark_sampler>>   chain;  // ... or a chain of samplers
    bool                                          is_chain = false;
};

using namespace spark;

namespace {

spark_sampler * make_stage(std::unique_ptr<Stage> s) {
    auto * smpl  = new (std::nothrow) spark_sampler();
    if (smpl) smpl->stage = std::move(s);
    return smpl;
}

// The stages of a chain in order (chains nest).
void flatten(spark_sampler * s, std::vector<Stage *> & out) {
    if (s->is_chain)
        for (auto & child : s->chain) flatten(child.get(), out);
    else out.push_back(s->stage.get());
}

bool picks(const Stage * s) { return dynamic_cast<const Greedy *>(s) || dynamic_cast<const Dist *>(s); }

// A chain that only picks the best token: the context's on-device argmax serves it.
bool is_pure_greedy(const spark_sampler * s) {
    if (!s->is_chain) return dynamic_cast<const Greedy *>(s->stage.get()) != nullptr;
    for (const auto & c : s->chain)
        if (!is_pure_greedy(c.get())) return false;
    return true;
}

// The chain's stages up to its picking stage, returned (nullptr: none, a greedy pick).
Stage * narrow(spark_sampler * smpl, const float * logits, int32_t n_vocab, Candidates & c) {
    c.items.resize(size_t(n_vocab));
    for (int32_t i = 0; i < n_vocab; ++i) c.items[size_t(i)] = {i, logits[i], 0.0f};
    c.sorted = false;
    c.by_id  = true;
    std::vector<Stage *> stages;
    flatten(smpl, stages);
    for (Stage * st : stages) {
        if (picks(st)) return st;
        st->apply(c);
        if (c.items.empty()) fail(SPARK_ERR_INTERNAL, "sampler removed every candidate");
    }
    return nullptr;
}

spark_token sample(spark_sampler * smpl, const float * logits, int32_t n_vocab) {
    Candidates c;
    Stage *    picker = narrow(smpl, logits, n_vocab, c);
    if (picker) picker->apply(c);
    else Greedy().apply(c);
    const spark_token t = c.items[size_t(c.selected)].id;
    spark_sampler_accept(smpl, t);
    return t;
}

}  // namespace

namespace spark {

float Distribution::p(int32_t id) const {
    for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] == id) return probs[i];
    return 0.0f;
}

Distribution sampler_distribution(spark_sampler * smpl, const float * logits, int32_t n_vocab) {
    Candidates   c;
    Stage *      picker = narrow(smpl, logits, n_vocab, c);
    Distribution d;
    if (dynamic_cast<Dist *>(picker)) {
        c.softmax();
        for (const Candidate & x : c.items) {
            d.ids.push_back(x.id);
            d.probs.push_back(x.p);
        }
        return d;
    }
    Greedy().apply(c);
    d.ids   = {c.items[size_t(c.selected)].id};
    d.probs = {1.0f};
    return d;
}

bool sampler_is_pure_greedy(const spark_sampler * smpl) { return smpl && is_pure_greedy(smpl); }

double sampler_uniform(spark_sampler * smpl) {
    std::vector<Stage *> stages;
    flatten(smpl, stages);
    for (Stage * st : stages)
        if (picks(st)) {
            if (auto * d = dynamic_cast<Dist *>(st)) return d->uniform();
            return 0.0;
        }
    return 0.0;
}

int32_t draw(const Distribution & d, double u) {
    double acc = 0.0;
    for (size_t i = 0; i < d.ids.size(); ++i) {
        acc += d.probs[i];
        if (u < acc) return d.ids[i];
    }
    return d.ids.back();
}

Verdict verify_draft(spark_sampler * smpl, const Distribution & p, int32_t draft, const float * q, int32_t n_vocab) {
    const float pd = p.p(draft);
    const float qd = q ? (draft >= 0 && draft < n_vocab ? q[draft] : 0.0f) : 1.0f;
    if (p.ids.size() == 1) {  // a point mass decides without randomness (greedy: token identity)
        if (pd == 1.0f && qd > 0.0f) return {true, draft};
        return {false, p.ids[0]};
    }
    if (qd > 0.0f && (pd >= qd || sampler_uniform(smpl) < double(pd) / double(qd))) return {true, draft};
    // Rejected: draw from the residual max(0, p - q), renormalised.
    Distribution residual;
    for (size_t i = 0; i < p.ids.size(); ++i) {
        const int32_t id = p.ids[i];
        const float   qi = q ? (id < n_vocab ? q[id] : 0.0f) : (id == draft ? 1.0f : 0.0f);
        const float   r  = std::max(0.0f, p.probs[i] - qi);
        if (r > 0.0f) {
            residual.ids.push_back(id);
            residual.probs.push_back(r);
        }
    }
    double z = 0.0;
    for (float r : residual.probs) z += r;
    if (residual.ids.empty() || z <= 0.0) return {false, p.ids[0]};  // p <= q everywhere: only possible by rounding
    for (float & r : residual.probs) r = float(double(r) / z);
    return {false, draw(residual, sampler_uniform(smpl))};
}

int32_t verify_drafts(spark_sampler * smpl, int32_t n_draft, const int32_t * drafts, const float * q, int32_t n_vocab,
                      const std::function<const float *(int32_t)> & row, const std::function<int32_t(int32_t)> & greedy,
                      const std::function<bool(int32_t)> & stop, int32_t * out, int32_t * n_accepted) {
    const bool pure_greedy = is_pure_greedy(smpl);
    int32_t    n = 0, accepted_drafts = 0;
    for (int32_t i = 0; i <= n_draft; ++i) {
        int32_t token;
        bool    accepted = false;
        if (pure_greedy) {
            token    = greedy(i);
            accepted = i < n_draft && token == drafts[i];
        } else if (i < n_draft) {
            const Verdict v = verify_draft(smpl, sampler_distribution(smpl, row(i), n_vocab), drafts[i], q ? q + size_t(i) * size_t(n_vocab) : nullptr, n_vocab);
            token           = v.token;
            accepted        = v.accepted;
        } else {
            const Distribution d = sampler_distribution(smpl, row(i), n_vocab);
            token                = d.ids.size() == 1 ? d.ids[0] : draw(d, sampler_uniform(smpl));
        }
        out[n++] = token;
        accepted_drafts += accepted ? 1 : 0;
        spark_sampler_accept(smpl, token);
        if (!accepted || stop(token)) break;
    }
    if (n_accepted) *n_accepted = accepted_drafts;
    return n;
}

}  // namespace spark

extern "C" {

SPARK_API spark_sampler_chain_params spark_sampler_chain_default_params(void) { return spark_sampler_chain_params{false}; }

SPARK_API spark_sampler * spark_sampler_chain_init(spark_sampler_chain_params) {
    auto * s = new (std::nothrow) spark_sampler();
    if (s) s->is_chain = true;
    return s;
}

SPARK_API spark_status spark_sampler_chain_add(spark_sampler * chain, spark_sampler * smpl) {
    return api_guard([&] {
        if (!chain || !smpl || !chain->is_chain || chain == smpl) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_sampler_chain_add: need a chain and a sampler");
        chain->chain.emplace_back(smpl);
    });
}

SPARK_API int32_t spark_sampler_chain_n(const spark_sampler * chain) { return chain && chain->is_chain ? int32_t(chain->chain.size()) : 0; }

SPARK_API spark_sampler * spark_sampler_init_greedy(void) { return make_stage(std::make_unique<Greedy>()); }
SPARK_API spark_sampler * spark_sampler_init_dist(uint32_t seed) { return make_stage(std::make_unique<Dist>(seed)); }
SPARK_API spark_sampler * spark_sampler_init_temp(float t) { return make_stage(std::make_unique<Temperature>(t)); }
SPARK_API spark_sampler * spark_sampler_init_top_k(int32_t k) { return make_stage(std::make_unique<TopK>(k)); }
SPARK_API spark_sampler * spark_sampler_init_top_p(float p, size_t min_keep) { return make_stage(std::make_unique<TopP>(p, min_keep)); }
SPARK_API spark_sampler * spark_sampler_init_min_p(float p, size_t min_keep) { return make_stage(std::make_unique<MinP>(p, min_keep)); }
SPARK_API spark_sampler * spark_sampler_init_penalties(int32_t last_n, float penalty) {
    return make_stage(std::make_unique<Penalties>(last_n, penalty));
}

SPARK_API spark_sampler * spark_sampler_init_presence_frequency(float presence, float frequency) {
    if (!std::isfinite(presence) || !std::isfinite(frequency)) return nullptr;
    return make_stage(std::make_unique<PresenceFrequency>(presence, frequency));
}
SPARK_API spark_sampler * spark_sampler_init_logit_bias(int32_t n, const spark_token * tokens, const float * biases) {
    if (n < 0 || (n > 0 && (!tokens || !biases))) return nullptr;
    std::unordered_map<int32_t, float> bias;
    for (int32_t i = 0; i < n; ++i) {
        if (std::isnan(biases[i]) || biases[i] == INFINITY) return nullptr;  // +inf would make every other token impossible and NaN poisons the softmax
        bias[tokens[i]] += biases[i];
    }
    return make_stage(std::make_unique<LogitBias>(std::move(bias)));
}

SPARK_API spark_status spark_sampler_sample(spark_sampler * smpl, spark_context * ctx, int32_t idx, spark_token * out) {
    return api_guard([&] {
        if (!smpl || !ctx || !out) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_sampler_sample: NULL argument");
        BackendLock lock(*ctx->impl->model().backend);
        if (is_pure_greedy(smpl)) {
            const int32_t t = ctx->impl->argmax_ith(idx);
            if (t < 0) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_sampler_sample: row %d of the last decode has no logits", idx);
            spark_sampler_accept(smpl, t);
            *out = t;
            return;
        }
        const float * logits = ctx->impl->logits_ith(idx);
        if (!logits) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_sampler_sample: row %d of the last decode has no logits", idx);
        *out = sample(smpl, logits, int32_t(ctx->impl->model().hparams.n_vocab));
    });
}

SPARK_API spark_status spark_sampler_sample_logits(spark_sampler * smpl, const float * logits, int32_t n_vocab, spark_token * out) {
    return api_guard([&] {
        if (!smpl || !logits || !out || n_vocab <= 0) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_sampler_sample_logits: bad argument");
        *out = sample(smpl, logits, n_vocab);
    });
}

SPARK_API spark_sampler * spark_sampler_clone(const spark_sampler * smpl) {
    if (!smpl) return nullptr;
    auto * c = new (std::nothrow) spark_sampler();
    if (!c) return nullptr;
    c->is_chain = smpl->is_chain;
    if (smpl->stage) c->stage = smpl->stage->clone();
    for (const auto & child : smpl->chain) {
        spark_sampler * cc = spark_sampler_clone(child.get());
        if (!cc) {
            delete c;
            return nullptr;
        }
        c->chain.emplace_back(cc);
    }
    return c;
}

SPARK_API spark_status spark_sampler_probs(spark_sampler * smpl, const float * logits, int32_t n_vocab, float * probs) {
    return api_guard([&] {
        if (!smpl || !logits || !probs || n_vocab <= 0) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_sampler_probs: bad argument");
        const Distribution d = sampler_distribution(smpl, logits, n_vocab);
        std::fill(probs, probs + n_vocab, 0.0f);
        for (size_t i = 0; i < d.ids.size(); ++i) probs[d.ids[i]] = d.probs[i];
    });
}

SPARK_API spark_status spark_sampler_verify(spark_sampler * smpl, spark_context * ctx, const int32_t * idxs, const spark_token * draft,
                                            int32_t n_draft, const float * draft_probs, spark_token * out, int32_t * n_out) {
    return api_guard([&] {
        if (!smpl || !ctx || !idxs || (n_draft > 0 && !draft) || !out || !n_out || n_draft < 0)
            fail(SPARK_ERR_INVALID_ARGUMENT, "spark_sampler_verify: bad argument");
        BackendLock lock(*ctx->impl->model().backend);
        Context &     c       = *ctx->impl;
        const int32_t n_vocab = int32_t(c.model().hparams.n_vocab);
        const bool    greedy  = is_pure_greedy(smpl);
        // Check everything first: a failed call changes nothing (sampler state included).
        for (int32_t i = 0; i <= n_draft; ++i)
            if ((greedy ? c.argmax_ith(idxs[i]) : (c.logits_ith(idxs[i]) ? 0 : -1)) < 0)
                fail(SPARK_ERR_INVALID_ARGUMENT, "spark_sampler_verify: row %d of the last decode has no logits", idxs[i]);
        for (int32_t i = 0; i < n_draft; ++i)
            if (draft[i] < 0 || draft[i] >= n_vocab) fail(SPARK_ERR_INVALID_TOKEN, "spark_sampler_verify: draft %d is token %d, outside [0, %d)", i, draft[i], n_vocab);
        *n_out = verify_drafts(
            smpl, n_draft, draft, draft_probs, n_vocab, [&](int32_t i) { return c.logits_ith(idxs[i]); },
            [&](int32_t i) { return c.argmax_ith(idxs[i]); }, [](int32_t) { return false; }, out);
    });
}

SPARK_API void spark_sampler_accept(spark_sampler * smpl, spark_token token) {
    if (!smpl) return;
    if (smpl->is_chain)
        for (auto & c : smpl->chain) spark_sampler_accept(c.get(), token);
    else smpl->stage->accept(token);
}

SPARK_API void spark_sampler_reset(spark_sampler * smpl) {
    if (!smpl) return;
    if (smpl->is_chain)
        for (auto & c : smpl->chain) spark_sampler_reset(c.get());
    else smpl->stage->reset();
}

SPARK_API void spark_sampler_free(spark_sampler * smpl) { delete smpl; }

}  // extern "C"
