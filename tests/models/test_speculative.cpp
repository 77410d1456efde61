// Speculative decoding through the C API (spark_spec_*):
//   - greedy identity: for every fixture (3 architectures x their formats) and each applicable
//     source (n-gram; a draft model: the 2-layer qwen3-bf16 fixture, same vocabulary; MTP;
//     EAGLE3), k = 1..4, the ids equal plain greedy decoding's;
//   - no replay: the target ran exactly the prompt and the verify rows (rejected drafts of a
//     hybrid model are cut from the recurrent state without recompute);
//   - several sequences of one context speculate in one step, each as if alone;
//   - a conversation keeps its earlier turns (begin with a longer prompt decodes only the new part);
//   - bad input: a draft of another vocabulary, an EAGLE3 head whose aux layers the target lacks,
//     MTP without an MTP head, k larger than the context; each fails cleanly and changes nothing.
// Exactness: ids must be equal. The verify step computes k + 1 rows in one batch, plain decoding one
// row at a time; the CPU backend's per-row results do not depend on the batch (see harness note in
// test_sequences.cpp: 1e-5 between feeding modes), and the fixtures' greedy choices are not near
// ties at that scale.
#include "harness.h"

#include "runtime/context.h"

using namespace test;

namespace {

const char * kFixtures[] = {"qwen3-bf16",           "qwen3-fp8-block",           "qwen3-fp8-ct-channel",     "qwen3-int4-autoround",
                            "qwen3-int4-autoround-asym", "qwen3-nvfp4-ct",        "qwen3-nvfp4-modelopt",     "qwen3_moe-bf16",
                            "qwen3_moe-fp8-block",  "qwen3_moe-fp8-ct-channel",  "qwen3_moe-int4-autoround", "qwen3_moe-int4-autoround-asym",
                            "qwen3_moe-nvfp4-ct",   "qwen3_moe-nvfp4-modelopt",  "qwen3_next-bf16",          "qwen3_next-fp8-block",
                            "qwen3_next-int4-autoround", "qwen3_next-nvfp4-modelopt"};

constexpr int kGenerate = 40;

struct SpecDeleter {
    void operator()(spark_spec * s) const { spark_spec_free(s); }
};
using SpecPtr = std::unique_ptr<spark_spec, SpecDeleter>;

// Plain greedy decoding, one token per step.
std::vector<int32_t> plain_greedy(spark_model * m, const std::vector<int32_t> & prompt, int n) {
    ContextPtr         ctx = new_context(m, 256);
    std::vector<float> ignore;
    REQUIRE(decode_range(ctx.get(), prompt, 0, prompt.size(), 0, 0, ignore) == SPARK_OK);
    return greedy_continue(ctx.get(), int32_t(prompt.size()), n);
}

struct SpecRun {
    std::vector<int32_t> tokens;
    spark_spec_stats     stats{};
    int64_t              target_rows = 0;
};

// Greedy decoding through the speculative loop, n tokens (the last step's surplus dropped).
SpecRun spec_greedy(spark_model * m, spark_spec_params sp, const std::vector<int32_t> & prompt, int n, int32_t n_ctx = 256) {
    ContextPtr   ctx = new_context(m, n_ctx);
    spark_spec * raw = nullptr;
    INFO(std::string(spark_last_error()));
    REQUIRE(spark_spec_init(ctx.get(), sp, &raw) == SPARK_OK);
    SpecPtr         spec(raw);
    spark_sampler * greedy = spark_sampler_init_greedy();
    REQUIRE(spark_spec_begin(spec.get(), 0, prompt.data(), int32_t(prompt.size())) == SPARK_OK);
    SpecRun run;
    while (int(run.tokens.size()) < n) {
        spark_token  out[SPARK_SPEC_MAX_DRAFT + 2];
        int32_t      n_out = 0;
        spark_seq_id seq   = 0;
        INFO(std::string(spark_last_error()));
        REQUIRE(spark_spec_step(spec.get(), 1, &seq, &greedy, out, SPARK_SPEC_MAX_DRAFT + 2, &n_out) == SPARK_OK);
        REQUIRE(n_out >= 1);
        run.tokens.insert(run.tokens.end(), out, out + n_out);
    }
    run.tokens.resize(size_t(n));
    REQUIRE(spark_spec_get_stats(spec.get(), &run.stats) == SPARK_OK);
    run.target_rows = ctx->impl->rows_computed();
    spark_sampler_free(greedy);
    return run;
}

spark_spec_params spec_params(spark_spec_kind kind, int k, const std::string & path = "") {
    spark_spec_params p = spark_spec_default_params();
    p.kind              = kind;
    p.n_draft_max       = k;
    static std::string keep;  // spark_spec_init copies what it needs
    keep   = path;
    p.path = path.empty() ? nullptr : keep.c_str();
    return p;
}

void check_identity(spark_model * m, const std::vector<int32_t> & prompt, const std::vector<int32_t> & want, spark_spec_params sp) {
    const SpecRun run = spec_greedy(m, sp, prompt, int(want.size()));
    CHECK(run.tokens == want);
    // No replay: the target computed the prompt and each step's verify rows, nothing else.
    CHECK(run.target_rows == run.stats.n_prompt + run.stats.n_steps + run.stats.n_drafted);
    CHECK(run.stats.n_accepted <= run.stats.n_drafted);
}

}  // namespace

TEST_CASE("speculative greedy decoding prints what plain greedy decoding prints: every fixture, n-gram and draft model, k = 1..4") {
    ModelPtr draft = load_model(model_dir("qwen3-bf16"));
    for (const char * name : kFixtures) {
        SUBCASE(name) {
            Golden               g    = load_golden(model_dir(name));
            ModelPtr             m    = load_model(model_dir(name));
            const auto           want = plain_greedy(m.get(), g.prompt, kGenerate);
            for (int k = 1; k <= 4; ++k) {
                INFO("k = " << k);
                check_identity(m.get(), g.prompt, want, spec_params(SPARK_SPEC_NGRAM, k));
                check_identity(m.get(), g.prompt, want, spec_params(SPARK_SPEC_DRAFT_MODEL, k, model_dir("qwen3-bf16")));
            }
        }
    }
}

TEST_CASE("speculative greedy decoding with heads: MTP (Qwen3-Next) and EAGLE3 (Qwen3), k = 1..4") {
    SUBCASE("mtp") {
        Golden     g    = load_golden(model_dir("qwen3_next-mtp-bf16"));
        ModelPtr   m    = load_model(model_dir("qwen3_next-mtp-bf16"));
        const auto want = plain_greedy(m.get(), g.prompt, kGenerate);
        for (int k = 1; k <= 4; ++k) {
            INFO("k = " << k);
            check_identity(m.get(), g.prompt, want, spec_params(SPARK_SPEC_MTP, k));
        }
    }
    SUBCASE("eagle3") {
        ModelPtr             m = load_model(model_dir("qwen3-eagle3-target-bf16"));
        std::vector<int32_t> prompt;
        for (int i = 0; i < 24; ++i) prompt.push_back((i * 37 + 11) % 512);
        const auto want = plain_greedy(m.get(), prompt, kGenerate);
        for (int k = 1; k <= 4; ++k) {
            INFO("k = " << k);
            check_identity(m.get(), prompt, want, spec_params(SPARK_SPEC_EAGLE3, k, model_dir("qwen3-eagle3-draft")));
        }
    }
}

namespace {
std::string demo(const char * name) { return std::string(SPARK_TEST_DATA) + "/../../examples/models/" + name; }

// The demo's golden prompt: the spec's greedy ids equal the plain ones (and transformers' golden),
// and the drafts of a trained drafter are mostly accepted (a wiring mistake accepts ~none).
void check_demo(const std::string & target, spark_spec_kind kind, const std::string & draft, double min_first_acceptance) {
    Golden     g    = load_golden(demo(target.c_str()));
    ModelPtr   m    = load_model(demo(target.c_str()));
    const auto want = plain_greedy(m.get(), g.prompt, int(g.greedy.size()));
    CHECK(want == g.greedy);
    for (int k = 1; k <= 4; ++k) {
        INFO(target << " " << draft << " k = " << k);
        const SpecRun run = spec_greedy(m.get(), spec_params(kind, k, draft.empty() ? "" : demo(draft.c_str())), g.prompt, int(want.size()));
        CHECK(run.tokens == want);
        CHECK(run.target_rows == run.stats.n_prompt + run.stats.n_steps + run.stats.n_drafted);
        const double first = run.stats.drafted_at[0] ? double(run.stats.accepted_at[0]) / double(run.stats.drafted_at[0]) : 0.0;
        MESSAGE(target << " " << draft << " k=" << k << ": " << run.stats.n_emitted << " tokens in " << run.stats.n_steps
                       << " steps, acceptance at position 1: " << first);
        CHECK(first >= min_first_acceptance);
    }
}
}  // namespace

TEST_CASE("demo models: speculative greedy output is the plain greedy output") {
    SUBCASE("moe + draft model") { check_demo("spark-demo-coder-moe", SPARK_SPEC_DRAFT_MODEL, "spark-demo-coder-draft", 0.5); }
    SUBCASE("moe + eagle3") { check_demo("spark-demo-coder-moe", SPARK_SPEC_EAGLE3, "spark-demo-coder-eagle3", 0.4); }
    SUBCASE("moe + ngram") { check_demo("spark-demo-coder-moe", SPARK_SPEC_NGRAM, "", 0.0); }
    SUBCASE("next + mtp") { check_demo("spark-demo-coder-next", SPARK_SPEC_MTP, "", 0.6); }
    SUBCASE("next + ngram") { check_demo("spark-demo-coder-next", SPARK_SPEC_NGRAM, "", 0.0); }
}

TEST_CASE("several sequences speculate in one step, each as if alone") {
    ModelPtr                          m = load_model(model_dir("qwen3_next-bf16"));
    Golden                            g = load_golden(model_dir("qwen3_next-bf16"));
    std::vector<std::vector<int32_t>> prompts = {g.prompt, std::vector<int32_t>(g.prompt.begin() + 5, g.prompt.end()),
                                                 std::vector<int32_t>(g.prompt.rbegin(), g.prompt.rend())};
    std::vector<std::vector<int32_t>> want;
    for (const auto & p : prompts) want.push_back(plain_greedy(m.get(), p, kGenerate));
    for (spark_spec_kind kind : {SPARK_SPEC_NGRAM, SPARK_SPEC_DRAFT_MODEL}) {
        ContextPtr   ctx = new_context(m.get(), 512, 3);
        spark_spec * raw = nullptr;
        REQUIRE(spark_spec_init(ctx.get(), spec_params(kind, 3, model_dir("qwen3_next-int4-autoround")), &raw) == SPARK_OK);
        SpecPtr spec(raw);
        for (int32_t s = 0; s < 3; ++s) REQUIRE(spark_spec_begin(spec.get(), s, prompts[size_t(s)].data(), int32_t(prompts[size_t(s)].size())) == SPARK_OK);
        std::vector<std::vector<int32_t>> got(3);
        spark_sampler *                   greedy[3] = {spark_sampler_init_greedy(), spark_sampler_init_greedy(), spark_sampler_init_greedy()};
        while (got[0].size() < size_t(kGenerate) || got[1].size() < size_t(kGenerate) || got[2].size() < size_t(kGenerate)) {
            const spark_seq_id seqs[3] = {2, 0, 1};  // any order
            spark_sampler *    smpl[3] = {greedy[2], greedy[0], greedy[1]};
            constexpr int32_t  cap     = SPARK_SPEC_MAX_DRAFT + 2;
            spark_token        out[3 * cap];
            int32_t            n[3];
            INFO(std::string(spark_last_error()));
            REQUIRE(spark_spec_step(spec.get(), 3, seqs, smpl, out, cap, n) == SPARK_OK);
            for (int i = 0; i < 3; ++i) got[size_t(seqs[i])].insert(got[size_t(seqs[i])].end(), out + i * cap, out + i * cap + n[i]);
        }
        for (int s = 0; s < 3; ++s) {
            got[size_t(s)].resize(size_t(kGenerate));
            CHECK(got[size_t(s)] == want[size_t(s)]);
        }
        for (spark_sampler * s : greedy) spark_sampler_free(s);
    }
}

TEST_CASE("a conversation keeps its earlier turns: begin decodes only what the sequence does not hold") {
    for (const char * name : {"qwen3_moe-bf16", "qwen3_next-bf16"}) {
        SUBCASE(name) {
            ModelPtr   m   = load_model(model_dir(name));
            Golden     g   = load_golden(model_dir(name));
            ContextPtr ctx = new_context(m.get(), 256);
            spark_spec * raw = nullptr;
            REQUIRE(spark_spec_init(ctx.get(), spec_params(SPARK_SPEC_DRAFT_MODEL, 3, model_dir("qwen3-bf16")), &raw) == SPARK_OK);
            SpecPtr         spec(raw);
            spark_sampler * greedy = spark_sampler_init_greedy();
            // Turn 1: the prompt and 12 answer tokens.
            std::vector<int32_t> conv = g.prompt;
            REQUIRE(spark_spec_begin(spec.get(), 0, conv.data(), int32_t(conv.size())) == SPARK_OK);
            std::vector<int32_t> answer;
            while (answer.size() < 12) {
                spark_token out[SPARK_SPEC_MAX_DRAFT + 2];
                int32_t     n = 0;
                spark_seq_id seq = 0;
                REQUIRE(spark_spec_step(spec.get(), 1, &seq, &greedy, out, SPARK_SPEC_MAX_DRAFT + 2, &n) == SPARK_OK);
                answer.insert(answer.end(), out, out + n);
            }
            // Turn 2: the whole conversation (the answer + a new user message) again; only the part
            // the cache lacks is decoded: the answer's last token (emitted, not yet decoded) and the
            // new message.
            conv.insert(conv.end(), answer.begin(), answer.end());
            for (int32_t t : {7, 8, 9, 10, 11}) conv.push_back(t);
            spark_spec_stats before{}, after{};
            spark_spec_get_stats(spec.get(), &before);
            REQUIRE(spark_spec_begin(spec.get(), 0, conv.data(), int32_t(conv.size())) == SPARK_OK);
            spark_spec_get_stats(spec.get(), &after);
            CHECK(after.n_prompt - before.n_prompt == 6);
            // What follows is what a fresh context would print for the whole conversation.
            std::vector<int32_t> next;
            while (next.size() < 16) {
                spark_token out[SPARK_SPEC_MAX_DRAFT + 2];
                int32_t     n = 0;
                spark_seq_id seq = 0;
                REQUIRE(spark_spec_step(spec.get(), 1, &seq, &greedy, out, SPARK_SPEC_MAX_DRAFT + 2, &n) == SPARK_OK);
                next.insert(next.end(), out, out + n);
            }
            next.resize(16);
            CHECK(next == plain_greedy(m.get(), conv, 16));
            spark_sampler_free(greedy);
        }
    }
}

TEST_CASE("speculative decoding: bad input is a clear error and changes nothing") {
    ModelPtr   m   = load_model(model_dir("qwen3_next-bf16"));
    ContextPtr ctx = new_context(m.get(), 256);
    auto       expect = [&](spark_spec_params p, spark_status want, const char * words) {
        spark_spec * s  = nullptr;
        spark_status st = spark_spec_init(ctx.get(), p, &s);
        INFO(std::string(spark_last_error()));
        CHECK(st == want);
        CHECK(s == nullptr);
        CHECK(std::string(spark_last_error()).find(words) != std::string::npos);
        spark_memory_info info{};
        spark_memory_get_info(ctx.get(), &info);
        CHECK(spark_n_hidden(ctx.get()) == 0);  // the target was not changed
    };
    // A draft with another vocabulary (the demo draft: 8192 tokens vs 512).
    expect(spec_params(SPARK_SPEC_DRAFT_MODEL, 3, demo("spark-demo-coder-draft")), SPARK_ERR_INVALID_ARGUMENT, "vocabulary of 8192 tokens");
    // An EAGLE3 head whose aux layers the target lacks (the fixture head reads layer 4 of 8; this target has 2).
    expect(spec_params(SPARK_SPEC_EAGLE3, 3, model_dir("qwen3-eagle3-draft")), SPARK_ERR_INVALID_ARGUMENT, "reads the output of layer 3");
    // MTP on a model without an MTP head.
    expect(spec_params(SPARK_SPEC_MTP, 3), SPARK_ERR_UNSUPPORTED, "has no MTP head");
    // k larger than the context allows, or than the limit.
    ContextPtr small = new_context(m.get(), 4);
    spark_spec * s   = nullptr;
    CHECK(spark_spec_init(small.get(), spec_params(SPARK_SPEC_NGRAM, 4), &s) == SPARK_ERR_INVALID_ARGUMENT);
    CHECK(std::string(spark_last_error()).find("context holds 4") != std::string::npos);
    expect(spec_params(SPARK_SPEC_NGRAM, SPARK_SPEC_MAX_DRAFT + 1), SPARK_ERR_INVALID_ARGUMENT, "n_draft_max");
    expect(spec_params(SPARK_SPEC_DRAFT_MODEL, 3), SPARK_ERR_INVALID_ARGUMENT, "needs a path");
    expect(spec_params(SPARK_SPEC_DRAFT_MODEL, 3, "/nonexistent/draft"), SPARK_ERR_IO, "/nonexistent/draft");

    // Steps: a sequence that was not begun, a bad token, a too small buffer.
    REQUIRE(spark_spec_init(ctx.get(), spec_params(SPARK_SPEC_NGRAM, 3), &s) == SPARK_OK);
    SpecPtr         spec(s);
    spark_sampler * greedy = spark_sampler_init_greedy();
    spark_token     out[SPARK_SPEC_MAX_DRAFT + 2];
    int32_t         n   = 0;
    spark_seq_id    seq = 0;
    CHECK(spark_spec_step(spec.get(), 1, &seq, &greedy, out, SPARK_SPEC_MAX_DRAFT + 2, &n) == SPARK_ERR_INVALID_ARGUMENT);
    const int32_t bad[] = {1, 2, 600};
    CHECK(spark_spec_begin(spec.get(), 0, bad, 3) == SPARK_ERR_INVALID_TOKEN);
    CHECK(spark_memory_seq_length(ctx.get(), 0) == 0);
    const int32_t good[] = {1, 2, 3};
    REQUIRE(spark_spec_begin(spec.get(), 0, good, 3) == SPARK_OK);
    CHECK(spark_spec_step(spec.get(), 1, &seq, &greedy, out, 4, &n) == SPARK_ERR_BUFFER_TOO_SMALL);
    CHECK(spark_memory_seq_length(ctx.get(), 0) == 3);
    CHECK(spark_spec_step(spec.get(), 1, &seq, &greedy, out, SPARK_SPEC_MAX_DRAFT + 2, &n) == SPARK_OK);
    spark_sampler_free(greedy);
}

TEST_CASE("synthetic Qwen3-Next shapes carry an MTP head (spark-bench measures its draft cost)") {
    for (const char * fmt : {"bf16", "int4"}) {
        SUBCASE(fmt) {
            ModelPtr             m = load_model(std::string("synthetic:tiny-qwen3-next:") + fmt);
            std::vector<int32_t> prompt;
            for (int i = 0; i < 20; ++i) prompt.push_back((i * 91 + 3) % 512);
            const auto want = plain_greedy(m.get(), prompt, 24);
            check_identity(m.get(), prompt, want, spec_params(SPARK_SPEC_MTP, 3));
        }
    }
}
