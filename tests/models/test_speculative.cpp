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

// Tokens of sequence 0 from speculative steps until at least n (all of the last step's).
std::vector<int32_t> steps_until(spark_spec * spec, spark_sampler * smpl, size_t n) {
    std::vector<int32_t> got;
    while (got.size() < n) {
        spark_token  out[SPARK_SPEC_MAX_DRAFT + 2];
        int32_t      n_out = 0;
        spark_seq_id seq   = 0;
        INFO(std::string(spark_last_error()));
        REQUIRE(spark_spec_step(spec, 1, &seq, &smpl, out, SPARK_SPEC_MAX_DRAFT + 2, &n_out) == SPARK_OK);
        got.insert(got.end(), out, out + n_out);
    }
    return got;
}

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
    run.tokens = steps_until(spec.get(), greedy, size_t(n));
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
    for (const char * name : kGoldenFixtures) {
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
            const std::vector<int32_t> answer = steps_until(spec.get(), greedy, 12);
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
            std::vector<int32_t> next = steps_until(spec.get(), greedy, 16);
            next.resize(16);
            CHECK(next == plain_greedy(m.get(), conv, 16));
            spark_sampler_free(greedy);
        }
    }
}

TEST_CASE("linear-attention models reuse a prompt from the host's snapshot when the answer is replaced") {
    // A server's turn 2 that shares only turn 1's prompt: the recurrent state cannot be cut back over
    // the answer, so begin restores the snapshot the host took inside turn 1's prompt and decodes
    // only from there; without a snapshot it decodes the whole prompt again. Either way the
    // continuation is what a fresh context prints.
    struct Source {
        const char *      model;
        spark_spec_params params;
    };
    for (const Source & src : {Source{"qwen3_next-mtp-bf16", spec_params(SPARK_SPEC_MTP, 3)},
                               Source{"qwen3_next-bf16", spec_params(SPARK_SPEC_DRAFT_MODEL, 3, model_dir("qwen3-bf16"))}}) {
        for (const bool with_snapshot : {true, false}) {
            const std::string what = std::string(src.model) + (with_snapshot ? ", with a snapshot" : ", without a snapshot");
            INFO(what);
            ModelPtr             m = load_model(model_dir(src.model));
            Golden               g = load_golden(model_dir(src.model));
            spark_context_params p = spark_context_default_params();
            p.n_ctx                = 256;
            p.n_snapshots          = 1;
            p.n_threads            = 2;
            spark_context * raw_ctx = nullptr;
            REQUIRE(spark_context_init(m.get(), p, &raw_ctx) == SPARK_OK);
            ContextPtr   ctx(raw_ctx);
            spark_spec * raw = nullptr;
            spark_spec_params sp = src.params;
            if (sp.kind == SPARK_SPEC_DRAFT_MODEL) sp = spec_params(SPARK_SPEC_DRAFT_MODEL, 3, model_dir("qwen3-bf16"));
            REQUIRE(spark_spec_init(ctx.get(), sp, &raw) == SPARK_OK);
            SpecPtr         spec(raw);
            spark_sampler * greedy = spark_sampler_init_greedy();
            // The snapshot is taken one token before the prompt's end (a second begin adds the last
            // token): a head drafts from the target's hidden state of the position before a changed
            // token, so the target must decode that position again.
            const int32_t n_prompt = int32_t(g.prompt.size());
            REQUIRE(spark_spec_begin(spec.get(), 0, g.prompt.data(), n_prompt - 1) == SPARK_OK);
            int32_t snap = -1;
            if (with_snapshot) REQUIRE(spark_memory_seq_snapshot(ctx.get(), 0, &snap) == SPARK_OK);
            REQUIRE(spark_spec_begin(spec.get(), 0, g.prompt.data(), n_prompt) == SPARK_OK);
            steps_until(spec.get(), greedy, 10);  // turn 1's answer: more than the rollback window (3)
            std::vector<int32_t> conv = g.prompt;
            for (int32_t t : {7, 8, 9, 10, 11}) conv.push_back(t);  // turn 2 replaces the answer
            spark_spec_stats before{}, after{};
            spark_spec_get_stats(spec.get(), &before);
            REQUIRE(spark_spec_begin(spec.get(), 0, conv.data(), int32_t(conv.size())) == SPARK_OK);
            spark_spec_get_stats(spec.get(), &after);
            CHECK(after.n_prompt - before.n_prompt == (with_snapshot ? 6 : int64_t(conv.size())));
            std::vector<int32_t> next = steps_until(spec.get(), greedy, 16);
            next.resize(16);
            CHECK(next == plain_greedy(m.get(), conv, 16));
            if (with_snapshot) {  // the snapshot stays the host's (restored, not freed): usable again
                CHECK(spark_memory_seq_restore(ctx.get(), 0, snap) == SPARK_OK);
                spark_memory_snapshot_free(ctx.get(), snap);
            }
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
    // One loop per context; while attached it owns the context's hidden outputs.
    spark_spec * second = nullptr;
    CHECK(spark_spec_init(ctx.get(), spec_params(SPARK_SPEC_NGRAM, 2), &second) == SPARK_ERR_INVALID_ARGUMENT);
    const int32_t final_norm = SPARK_HIDDEN_FINAL_NORM;
    CHECK(spark_set_hidden_outputs(ctx.get(), &final_norm, 1) == SPARK_ERR_INVALID_ARGUMENT);
    spec.reset();
    CHECK(spark_set_hidden_outputs(ctx.get(), &final_norm, 1) == SPARK_OK);
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

TEST_CASE("the pieces for a host's own loop: hidden outputs, argmax, spark_sampler_verify, can_rm, probs, clone") {
    ModelPtr             m = load_model(model_dir("qwen3_next-bf16"));
    Golden               g = load_golden(model_dir("qwen3_next-bf16"));
    const auto           want = plain_greedy(m.get(), g.prompt, 30);
    spark_context_params p    = spark_context_default_params();
    p.n_ctx = 256, p.n_threads = 2, p.n_rollback = 2;
    spark_context * raw = nullptr;
    REQUIRE(spark_context_init(m.get(), p, &raw) == SPARK_OK);
    ContextPtr ctx(raw);

    // Hidden states: the final normed state, or layers side by side.
    const int32_t final_norm = SPARK_HIDDEN_FINAL_NORM, two[] = {0, 1}, bad = 7;
    CHECK(spark_set_hidden_outputs(ctx.get(), &bad, 1) == SPARK_ERR_INVALID_ARGUMENT);
    REQUIRE(spark_set_hidden_outputs(ctx.get(), two, 2) == SPARK_OK);
    CHECK(spark_n_hidden(ctx.get()) == 2 * 128);
    REQUIRE(spark_set_hidden_outputs(ctx.get(), &final_norm, 1) == SPARK_OK);
    CHECK(spark_n_hidden(ctx.get()) == 128);

    // A host-run loop: verify two drafts per step (taken from the reference with every third one
    // wrong), cut the rejected rows, and print what plain greedy decoding prints.
    std::vector<float> scratch;
    REQUIRE(decode_range(ctx.get(), g.prompt, 0, g.prompt.size(), 0, int32_t(g.n_vocab), scratch) == SPARK_OK);
    REQUIRE(spark_get_hidden_ith(ctx.get(), -1) != nullptr);
    spark_sampler *      greedy = spark_sampler_init_greedy();
    std::vector<int32_t> got    = {spark_get_argmax_ith(ctx.get(), -1)};
    int32_t              pos    = int32_t(g.prompt.size());
    spark_batch          b      = spark_batch_init(3, 1);
    int                  step   = 0;
    while (got.size() < want.size()) {
        const size_t  i     = got.size();
        const int32_t d[2]  = {i < want.size() ? want[i] : 0, i + 1 < want.size() ? want[i + 1] : 0};
        int32_t       draft[2] = {d[0], (step++ % 3 == 2) ? (d[1] + 1) % 512 : d[1]};
        const int32_t rows[3]  = {got.back(), draft[0], draft[1]};
        for (int r = 0; r < 3; ++r) {
            b.token[r] = rows[r], b.pos[r] = pos + r, b.n_seq_id[r] = 1, b.seq_id[r][0] = 0, b.logits[r] = 1;
        }
        b.n_tokens = 3;
        REQUIRE(spark_decode(ctx.get(), &b) == SPARK_OK);
        const int32_t idxs[3] = {0, 1, 2};
        spark_token   out[3];
        int32_t       n = 0;
        REQUIRE(spark_sampler_verify(greedy, ctx.get(), idxs, draft, 2, nullptr, out, &n) == SPARK_OK);
        REQUIRE(spark_memory_seq_can_rm(ctx.get(), 0, pos + n, -1));
        REQUIRE(spark_memory_seq_rm(ctx.get(), 0, pos + n, -1) == SPARK_OK);
        pos += n;
        got.insert(got.end(), out, out + n);
    }
    spark_batch_free(b);
    got.resize(want.size());
    CHECK(got == want);
    const int32_t no_logits[1] = {5};
    spark_token   out[1];
    int32_t       n = 0;
    CHECK(spark_sampler_verify(greedy, ctx.get(), no_logits, nullptr, 0, nullptr, out, &n) == SPARK_ERR_INVALID_ARGUMENT);
    spark_sampler_free(greedy);

    // Probabilities and clones of a sampling chain.
    spark_sampler * chain = spark_sampler_chain_init(spark_sampler_chain_default_params());
    spark_sampler_chain_add(chain, spark_sampler_init_top_k(5));
    spark_sampler_chain_add(chain, spark_sampler_init_temp(0.8f));
    spark_sampler_chain_add(chain, spark_sampler_init_dist(3));
    std::vector<float> logits(512), probs(512);
    for (int i = 0; i < 512; ++i) logits[size_t(i)] = float((i * 37) % 101) / 10.0f;
    REQUIRE(spark_sampler_probs(chain, logits.data(), 512, probs.data()) == SPARK_OK);
    double sum = 0;
    int    nonzero = 0;
    for (float x : probs) sum += x, nonzero += x > 0;
    CHECK(std::fabs(sum - 1.0) < 1e-5);
    CHECK(nonzero == 5);
    spark_token a = -1, c = -2;
    spark_sampler_sample_logits(chain, logits.data(), 512, &a);  // advance the state, then clone
    spark_sampler * copy = spark_sampler_clone(chain);
    REQUIRE(copy != nullptr);
    for (int t = 0; t < 20; ++t) {
        spark_sampler_sample_logits(chain, logits.data(), 512, &a);
        spark_sampler_sample_logits(copy, logits.data(), 512, &c);
        CHECK(a == c);
    }
    spark_sampler_free(copy);
    spark_sampler_free(chain);
}
