// Speculative-decoding heads against transformers (fixtures: qwen3_next-mtp-bf16, the EAGLE3 pair
// qwen3-eagle3-target-bf16 + qwen3-eagle3-draft; tests/data/models/README.md says what the goldens
// hold):
//   - first pass: the head over every prompt position t with (token t + 1, the target's hidden
//     state at t), one causal pass, reproduces the golden logits;
//   - chain: drafting greedily from the end of the prompt (first input: the target's greedy next
//     token with its hidden state at T - 1, then each draft with the head's own hidden output at
//     the next position) reproduces the golden ids.
// The heads run through Context::step with their inputs taken from backend memory, exactly as the
// speculative loop runs them. Tolerances, those of the target goldens: on the CPU 1e-3 max abs logit
// difference (float32 vs transformers' float32: only summation order differs; the head adds one
// layer); on the GPU (SPARK_TEST_DEVICE=cuda) 1e-2 relative error per row, ||got - golden|| /
// ||golden|| (tests/cuda/test_models_cuda.cpp: fp16 KV cache, fp16 GEMM operands at prefill).
#include "harness.h"

#include "runtime/context.h"
#include "runtime/model.h"
#include "runtime/models/heads.h"
#include "converter.h"

#include <cstdio>

using namespace test;

std::string testing_str(const std::vector<int32_t> & v) {
    std::string s;
    for (int32_t x : v) s += std::to_string(x) + " ";
    return s;
}

namespace {

struct HeadGolden {
    std::vector<int32_t> prompt, chain;
    int32_t              target_next = -1;
    std::vector<float>   first_pass;  // [T-1][head vocab]
};

HeadGolden load_head_golden(const std::string & dir, const char * first, const char * chain) {
    auto       f = spark::io::SafetensorsFile::open(dir + "/golden.safetensors");
    HeadGolden g;
    g.prompt      = read_tensor<int32_t>(*f, "prompt");
    g.chain       = read_tensor<int32_t>(*f, chain);
    g.target_next = read_tensor<int32_t>(*f, "target_next").at(0);
    g.first_pass  = read_tensor<float>(*f, first);
    return g;
}

spark_model_params model_params() {
    spark_model_params p = spark_model_default_params();
    p.device             = test_device();
    p.n_threads          = 2;
    p.load_tokenizer     = false;
    return p;
}

spark_context_params context_params(int32_t n_batch) {
    spark_context_params p = spark_context_default_params();
    p.n_ctx                = 256;
    p.n_batch              = n_batch;
    p.n_threads            = 2;
    return p;
}

// Runs `head` over the golden's first pass and chain with the target's captured hidden states.
void check_head(spark::Model & target, spark::Model & head, const spark::HiddenCapture & capture, const HeadGolden & g) {
    const int32_t   T = int32_t(g.prompt.size());
    spark::Context  tctx(target, context_params(T));
    tctx.set_capture(capture);
    std::vector<spark::StepRow> rows;
    for (int32_t t = 0; t < T; ++t) rows.push_back({g.prompt[size_t(t)], t, 0, t == T - 1});
    tctx.step(rows);
    REQUIRE(tctx.argmax_ith(T - 1) == g.target_next);
    const float * hidden = tctx.device_hidden();
    const size_t  row    = size_t(tctx.hidden_width()) * 4;
    REQUIRE(tctx.hidden_width() == head.hparams.n_embd);

    // First pass: position t takes token t + 1 and the target's hidden state at t.
    spark::Context hctx(head, context_params(T));
    rows.clear();
    for (int32_t t = 0; t + 1 < T; ++t) rows.push_back({g.prompt[size_t(t + 1)], t, 0, true});
    hctx.step(rows, {}, {{0, T - 1, hidden}});
    const int64_t nv  = head.hparams.n_vocab;
    REQUIRE(int64_t(g.first_pass.size()) == int64_t(T - 1) * nv);
    std::vector<float> got(hctx.logits(), hctx.logits() + size_t(T - 1) * size_t(nv));
    if (test_device() == SPARK_DEVICE_CPU) {
        const float err = max_abs_diff(got, g.first_pass);
        MESSAGE("first pass: max |logit - golden| = " << err);
        CHECK(err <= 1e-3f);
    } else {
        double worst = 0;
        for (int32_t t = 0; t + 1 < T; ++t) {
            double num = 0, den = 0;
            for (int64_t v = 0; v < nv; ++v) {
                const double d = double(got[size_t(t * nv + v)]) - g.first_pass[size_t(t * nv + v)];
                num += d * d;
                den += double(g.first_pass[size_t(t * nv + v)]) * g.first_pass[size_t(t * nv + v)];
            }
            worst = std::max(worst, std::sqrt(num / den));
        }
        MESSAGE("first pass: worst relative logit error per row " << worst);
        CHECK(worst <= 1e-2);
    }

    // Chain: the target's next token with its last hidden state, then the head's own outputs.
    std::vector<int32_t> chain;
    hctx.step({{g.target_next, T - 1, 0, true}}, {}, {{0, 1, reinterpret_cast<const char *>(hidden) + size_t(T - 1) * row}});
    for (size_t i = 0; i < g.chain.size(); ++i) {
        chain.push_back(hctx.argmax_ith(0));
        if (i + 1 == g.chain.size()) break;
        hctx.step({{0, T + int32_t(i), 0, true}}, {{0, 1, hctx.device_tokens()}}, {{0, 1, hctx.device_hidden()}});
    }
    INFO("chain " << ::testing_str(chain) << " golden " << ::testing_str(g.chain));
    CHECK(chain == g.chain);
}

}  // namespace

TEST_CASE("Qwen3-Next MTP head: first pass and chain match transformers") {
    const std::string dir    = model_dir("qwen3_next-mtp-bf16");
    auto              target = spark::load_model(dir, model_params());
    REQUIRE(target->mtp != nullptr);
    check_head(*target, *target->mtp, {{spark::HiddenCapture::kFinalNorm}}, load_head_golden(dir, "mtp_first_pass_logits", "mtp_chain"));
}

TEST_CASE("EAGLE3 head: first pass and chain match transformers") {
    auto target = spark::load_model(model_dir("qwen3-eagle3-target-bf16"), model_params());
    auto head   = spark::load_eagle3_head(model_dir("qwen3-eagle3-draft"), *target, model_params());
    REQUIRE(head->head->aux_layers == std::vector<int32_t>{1, 3, 4});
    spark::HiddenCapture capture{head->head->aux_layers};
    capture.project = &head->head->fc;
    check_head(*target, *head, capture, load_head_golden(model_dir("qwen3-eagle3-draft"), "eagle3_first_pass_logits", "eagle3_chain"));
}

TEST_CASE("A Qwen3-Next checkpoint without MTP tensors loads without a head") {
    auto target = spark::load_model(model_dir("qwen3_next-bf16"), model_params());
    CHECK(target->mtp == nullptr);
}

TEST_CASE("spark-convert keeps the MTP head: the spark file reproduces the MTP goldens, and a quantized file speculates") {
    const std::string dir = model_dir("qwen3_next-mtp-bf16");
    const std::string out = std::string(SPARK_BINARY_DIR) + "/test_mtp_head.spark";
    spark::convert::Options o;
    o.input     = dir;
    o.output    = out;
    o.overwrite = true;
    spark::convert::convert(o);
    auto target = spark::load_model(out, model_params());
    REQUIRE(target->mtp != nullptr);
    check_head(*target, *target->mtp, {{spark::HiddenCapture::kFinalNorm}}, load_head_golden(dir, "mtp_first_pass_logits", "mtp_chain"));

    // Quantized to INT4 (the head's projections too): the head loads in that format and
    // speculative greedy decoding prints what plain greedy decoding of the same file prints.
    o.quantize = spark::convert::Quantize::INT4;
    spark::convert::convert(o);
    ModelPtr m = test::load_model(out);
    REQUIRE(m->impl->mtp != nullptr);
    CHECK(m->impl->mtp->layers[0].attn.wq.format == spark::WeightFormat::INT4);
    const auto prompt = load_head_golden(dir, "mtp_first_pass_logits", "mtp_chain").prompt;
    ContextPtr plain = new_context(m.get(), 128);
    std::vector<float> scratch;
    REQUIRE(decode_range(plain.get(), prompt, 0, prompt.size(), 0, 0, scratch) == SPARK_OK);
    const auto want = greedy_continue(plain.get(), int32_t(prompt.size()), 24);
    ContextPtr        ctx = new_context(m.get(), 128);
    spark_spec_params sp  = spark_spec_default_params();
    sp.kind               = SPARK_SPEC_MTP;
    spark_spec * spec     = nullptr;
    REQUIRE(spark_spec_init(ctx.get(), sp, &spec) == SPARK_OK);
    REQUIRE(spark_spec_begin(spec, 0, prompt.data(), int32_t(prompt.size())) == SPARK_OK);
    spark_sampler *      greedy = spark_sampler_init_greedy();
    std::vector<int32_t> got;
    while (got.size() < want.size()) {
        spark_token  t[SPARK_SPEC_MAX_DRAFT + 2];
        int32_t      n   = 0;
        spark_seq_id seq = 0;
        REQUIRE(spark_spec_step(spec, 1, &seq, &greedy, t, SPARK_SPEC_MAX_DRAFT + 2, &n) == SPARK_OK);
        got.insert(got.end(), t, t + n);
    }
    got.resize(want.size());
    CHECK(got == want);
    spark_sampler_free(greedy);
    spark_spec_free(spec);
    std::remove(out.c_str());
}
