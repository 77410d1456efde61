// Lossless sampling with speculation: the tokens are distributed exactly as sampling the target
// alone gives (rejection sampling, Leviathan et al. 2023 / Chen et al. 2023).
//
//   1. The acceptance rule alone (verify_draft), on a 6-token vocabulary, with a drafter that is a
//      point mass (greedy / n-gram drafts) and one that samples its own distribution q: the
//      histogram of the emitted token over 60,000 trials passes a chi-square test against p; the
//      same harness rejects two wrong rules (accept any draft the target could sample; accept with
//      min(1, p/q) but resample from p instead of the residual max(0, p - q)).
//   2. End to end through spark_spec_*: the first two answer tokens of a fixture model sampled with
//      temperature 1 and top-k 3 (9 possible pairs), 3,000 seeds, against the exact joint
//      distribution computed from the target's logits; drafts from a draft model (the target itself:
//      its greedy drafts are accepted with probability p(d), so both the accept and the residual
//      draw happen often) and from n-gram lookup (the prompt holds every token once, so the last
//      token always has an earlier occurrence to continue).
// Chi-square significance 1e-6: seeds are fixed, so the test is deterministic; a correct rule
// fails it with probability 1e-6 per seed choice, a wrong one (above) gives p-values below 1e-30.
#include "harness.h"

#include "runtime/sampler.h"

#include <random>

using namespace test;

namespace {

// Upper tail of the chi-square distribution (regularized upper incomplete gamma Q(k/2, x/2)).
double chi2_sf(double x, int df) {
    const double a = df / 2.0, z = x / 2.0;
    if (z <= 0) return 1.0;
    const double lg = std::lgamma(a);
    if (z < a + 1) {  // series for P, then Q = 1 - P
        double sum = 1.0 / a, term = sum;
        for (int n = 1; n < 1000; ++n) {
            term *= z / (a + n);
            sum += term;
            if (term < sum * 1e-15) break;
        }
        return 1.0 - std::exp(-z + a * std::log(z) - lg) * sum;
    }
    double b = z + 1 - a, c = 1e300, d = 1 / b, h = d;  // continued fraction for Q
    for (int i = 1; i < 1000; ++i) {
        const double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        if (std::fabs(d) < 1e-300) d = 1e-300;
        c = b + an / c;
        if (std::fabs(c) < 1e-300) c = 1e-300;
        d        = 1 / d;
        const double del = d * c;
        h *= del;
        if (std::fabs(del - 1) < 1e-15) break;
    }
    return std::exp(-z + a * std::log(z) - lg) * h;
}

// p-value of observed counts against expected probabilities (cells with p = 0 must be empty).
double chi2_pvalue(const std::vector<int64_t> & counts, const std::vector<double> & p) {
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    double x  = 0;
    int    df = -1;
    for (size_t i = 0; i < p.size(); ++i) {
        if (p[i] == 0) {
            if (counts[i]) return 0.0;
            continue;
        }
        const double e = p[i] * double(total);
        x += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
        ++df;
    }
    return chi2_sf(x, df);
}

constexpr double kAlpha = 1e-6;

struct SamplerDeleter {
    void operator()(spark_sampler * s) const { spark_sampler_free(s); }
};
using SamplerPtr = std::unique_ptr<spark_sampler, SamplerDeleter>;

SamplerPtr sampling_chain(uint32_t seed, int top_k = 0) {
    spark_sampler * s = spark_sampler_chain_init(spark_sampler_chain_default_params());
    if (top_k > 0) spark_sampler_chain_add(s, spark_sampler_init_top_k(top_k));
    spark_sampler_chain_add(s, spark_sampler_init_temp(1.0f));
    spark_sampler_chain_add(s, spark_sampler_init_dist(seed));
    return SamplerPtr(s);
}

enum class Rule { Correct, AcceptIfPossible, ResampleFromP };

// The emitted token of one verification under `rule`.
int32_t emit(spark_sampler * smpl, const spark::Distribution & p, int32_t draft, const std::vector<float> & q, bool point_mass, Rule rule) {
    const int32_t nv = int32_t(q.size());
    if (rule == Rule::Correct) return spark::verify_draft(smpl, p, draft, point_mass ? nullptr : q.data(), nv).token;
    const double pd = p.p(draft), qd = point_mass ? 1.0 : q[size_t(draft)];
    if (rule == Rule::AcceptIfPossible) return pd > 0 ? draft : spark::draw(p, spark::sampler_uniform(smpl));
    if (spark::sampler_uniform(smpl) < std::min(1.0, pd / qd)) return draft;
    return spark::draw(p, spark::sampler_uniform(smpl));
}

double rule_pvalue(Rule rule, bool point_mass) {
    const std::vector<float> logits = {1.2f, 0.3f, -0.5f, 2.0f, 0.0f, -1.5f};
    std::vector<float>       q      = {0.05f, 0.40f, 0.05f, 0.20f, 0.25f, 0.05f};  // the drafter's own distribution
    SamplerPtr               target = sampling_chain(7);
    const spark::Distribution p     = spark::sampler_distribution(target.get(), logits.data(), 6);
    std::vector<double>       want(6);
    for (int i = 0; i < 6; ++i) want[size_t(i)] = p.p(i);
    std::mt19937            drafter(11);
    std::discrete_distribution<int> qd(q.begin(), q.end());
    std::vector<int64_t>    counts(6, 0);
    for (int t = 0; t < 60000; ++t) {
        const int32_t d = point_mass ? 1 : qd(drafter);  // point mass: always token 1
        counts[size_t(emit(target.get(), p, d, q, point_mass, rule))]++;
    }
    return chi2_pvalue(counts, want);
}

}  // namespace

TEST_CASE("rejection sampling keeps the target distribution; wrong rules are caught") {
    for (bool point_mass : {true, false}) {
        INFO("point-mass drafter: " << point_mass);
        const double ok = rule_pvalue(Rule::Correct, point_mass);
        MESSAGE("correct rule p-value " << ok);
        CHECK(ok > kAlpha);
        CHECK(rule_pvalue(Rule::AcceptIfPossible, point_mass) < kAlpha);
        CHECK(rule_pvalue(Rule::ResampleFromP, point_mass) < kAlpha);
    }
}

namespace {

// Exact joint distribution of the first two answer tokens under the chain: cell (a, b) is the
// a-th candidate of the first token followed by the b-th candidate after it. ids lists the first
// token's candidates, then, for each of them, the second token's.
std::vector<double> exact_pairs(spark_model * m, const std::vector<int32_t> & prompt, int top_k, std::vector<int32_t> & ids) {
    spark_model_info info{};
    spark_model_get_info(m, &info);
    auto last_row = [&](const std::vector<int32_t> & seq) {
        ContextPtr         ctx = new_context(m, 1024);
        std::vector<float> l;
        REQUIRE(decode_range(ctx.get(), seq, 0, seq.size(), 0, info.n_vocab, l) == SPARK_OK);
        return std::vector<float>(l.end() - info.n_vocab, l.end());
    };
    SamplerPtr                s  = sampling_chain(1, top_k);
    const std::vector<float>  l0 = last_row(prompt);
    const spark::Distribution p0 = spark::sampler_distribution(s.get(), l0.data(), info.n_vocab);
    ids                          = p0.ids;
    std::vector<double> joint;
    for (size_t a = 0; a < p0.ids.size(); ++a) {
        std::vector<int32_t> seq = prompt;
        seq.push_back(p0.ids[a]);
        const std::vector<float>  l1 = last_row(seq);
        const spark::Distribution p1 = spark::sampler_distribution(s.get(), l1.data(), info.n_vocab);
        for (size_t b = 0; b < p1.ids.size(); ++b) joint.push_back(double(p0.probs[a]) * double(p1.probs[b]));
        ids.insert(ids.end(), p1.ids.begin(), p1.ids.end());
    }
    return joint;
}

}  // namespace

TEST_CASE("speculative sampling end to end: the first two answer tokens are distributed as the target's") {
    ModelPtr             m = load_model(model_dir("qwen3_moe-bf16"));
    std::vector<int32_t> prompt;
    for (int32_t i = 0; i < 512; ++i) prompt.push_back((i * 37 + 5) % 512);
    constexpr int        kTopK = 3;
    std::vector<int32_t> cell_ids;  // first token's candidates, then per first token its second's
    const auto           joint = exact_pairs(m.get(), prompt, kTopK, cell_ids);
    REQUIRE(joint.size() == size_t(kTopK * kTopK));

    for (spark_spec_kind kind : {SPARK_SPEC_DRAFT_MODEL, SPARK_SPEC_NGRAM}) {
        INFO("source " << int(kind));
        ContextPtr        ctx = new_context(m.get(), 1024);
        spark_spec_params sp  = spark_spec_default_params();
        sp.kind               = kind;
        sp.n_draft_max        = 3;
        const std::string draft = model_dir("qwen3_moe-bf16");
        sp.path                 = kind == SPARK_SPEC_DRAFT_MODEL ? draft.c_str() : nullptr;
        spark_spec * spec       = nullptr;
        REQUIRE(spark_spec_init(ctx.get(), sp, &spec) == SPARK_OK);
        std::vector<int64_t> counts(joint.size(), 0);
        int64_t              drafted = 0;
        for (uint32_t seed = 0; seed < 3000; ++seed) {
            SamplerPtr smpl = sampling_chain(seed + 1000, kTopK);
            REQUIRE(spark_spec_begin(spec, 0, prompt.data(), int32_t(prompt.size())) == SPARK_OK);
            std::vector<int32_t> got;
            while (got.size() < 2) {
                spark_token    out[SPARK_SPEC_MAX_DRAFT + 2];
                int32_t        n   = 0;
                spark_seq_id   seq = 0;
                spark_sampler * s  = smpl.get();
                REQUIRE(spark_spec_step(spec, 1, &seq, &s, out, SPARK_SPEC_MAX_DRAFT + 2, &n) == SPARK_OK);
                got.insert(got.end(), out, out + n);
            }
            const auto a = std::find(cell_ids.begin(), cell_ids.begin() + kTopK, got[0]) - cell_ids.begin();
            REQUIRE(a < kTopK);
            const auto   second = cell_ids.begin() + kTopK * (1 + a);
            const auto   b      = std::find(second, second + kTopK, got[1]) - second;
            REQUIRE(b < kTopK);
            counts[size_t(a * kTopK + b)]++;
        }
        spark_spec_stats st{};
        spark_spec_get_stats(spec, &st);
        drafted = st.n_drafted;
        spark_spec_free(spec);
        const double pv = chi2_pvalue(counts, joint);
        MESSAGE("p-value " << pv << " over " << joint.size() << " pairs, " << drafted << " drafts verified, " << st.n_accepted << " accepted");
        CHECK(drafted > (kind == SPARK_SPEC_NGRAM ? 300 : 3000));
        CHECK(pv > kAlpha);
    }
}
