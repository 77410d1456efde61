// spark-server's decode loop (tools/server/engine.h) on the bundled demo models, without HTTP:
//   - answers decoded together (continuous batching, prompts in chunks between answer rows) equal the
//     answers decoded alone, greedy, for the MoE model and for Qwen3-Next (recurrent layers);
//   - a prompt that shares a prefix with a slot's sequence decodes only the rest (attention: cut or
//     KV copy; Qwen3-Next: from a snapshot), with the same answer as a fresh engine;
//   - a cancelled request frees its slot, a full queue refuses, stop strings and max_tokens end an
//     answer, a seed repeats a sampled answer.
// SPARK_TEST_DEVICE=cuda runs it on the GPU (the decode GEMV's rows are independent as the CPU's).
// Exactness: answers must be equal strings; the rows of a step do not depend on each other on
// either backend, and a reused prefix's KV is what decoding it again would write.
#include "engine.h"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

using namespace spark_server;

namespace {

const std::string kModels = std::string(SPARK_TEST_DATA) + "/../../examples/models/";

spark_device_kind test_device() {
    const char * d = std::getenv("SPARK_TEST_DEVICE");
    return d && std::string(d) == "cuda" ? SPARK_DEVICE_CUDA : SPARK_DEVICE_CPU;
}

struct Setup {
    spark_model *   model = nullptr;
    spark_context * ctx   = nullptr;
    std::unique_ptr<Engine> engine;

    Setup(const std::string & name, EngineOptions opt) {
        spark_model_params mp = spark_model_default_params();
        mp.device             = test_device();
        mp.n_threads          = 2;
        INFO(name);
        REQUIRE(spark_model_load((kModels + name).c_str(), mp, &model) == SPARK_OK);
        spark_model_info info{};
        spark_model_get_info(model, &info);
        spark_context_params cp = spark_context_default_params();
        cp.n_ctx                = opt.n_ctx_slot * opt.n_parallel;
        cp.n_seq_max            = opt.n_parallel;
        cp.n_batch              = opt.n_batch;
        cp.n_threads            = 2;
        cp.n_snapshots          = info.n_layer_linear_attention > 0 ? 2 * opt.n_parallel : 0;
        REQUIRE(spark_context_init(model, cp, &ctx) == SPARK_OK);
        engine = std::make_unique<Engine>(model, ctx, opt);
    }
    ~Setup() {
        engine.reset();
        spark_context_free(ctx);
        spark_model_free(model);
    }

    // A chat prompt: the system text and the user text through the model's template.
    std::vector<spark_token> prompt(const std::string & system, const std::string & user) const {
        const spark_tokenizer *  tok    = spark_model_get_tokenizer(model);
        const spark_chat_message msgs[] = {{"system", system.c_str(), nullptr, nullptr, nullptr}, {"user", user.c_str(), nullptr, nullptr, nullptr}};
        std::string              text(8192 + system.size(), '\0');
        size_t                   len = 0;
        REQUIRE(spark_chat_apply_template(spark_tokenizer_chat_template(tok), msgs, 2, true, nullptr, nullptr, nullptr, nullptr, text.data(),
                                          text.size(), &len) == SPARK_OK);
        text.resize(len);
        std::vector<spark_token> ids(text.size() + 16);
        int32_t                  n = 0;
        REQUIRE(spark_tokenize(tok, text.data(), text.size(), true, ids.data(), int32_t(ids.size()), &n) == SPARK_OK);
        ids.resize(size_t(n));
        return ids;
    }
};

GenerationParams greedy(std::vector<spark_token> prompt, int32_t max_tokens) {
    GenerationParams g;
    g.prompt               = std::move(prompt);
    g.max_tokens           = max_tokens;
    g.sampling.temperature = 0.0f;
    return g;
}

struct Answer {
    std::string text, reason, error;
    Usage       usage;
};

// Everything a request produced, once it ended (300 s only guard against a hang).
Answer collect(const std::shared_ptr<Request> & req) {
    REQUIRE(req != nullptr);
    Answer     a;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(300);
    for (;;) {
        const bool done = req->finished();  // before taking the events: the last ones come before it
        for (Event & e : req->wait(done ? std::chrono::steady_clock::now() : std::chrono::steady_clock::now() + std::chrono::seconds(1))) a.text += e.text;
        if (done) break;
        REQUIRE(std::chrono::steady_clock::now() < give_up);
    }
    a.reason = req->finish_reason();
    a.error  = req->error();
    a.usage  = req->usage();
    return a;
}

std::string repeat(const std::string & s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
}

}  // namespace

TEST_CASE("engine: answers decoded together equal the answers decoded alone (greedy, prompts in chunks)") {
    for (const char * name : {"spark-demo-coder-moe", "spark-demo-coder-next"}) {
        SUBCASE(name) {
            EngineOptions opt;
            opt.n_parallel = 3;
            opt.n_ctx_slot = 512;
            opt.n_batch    = 48;  // prompts of 60-200 tokens go in over several steps, beside answer rows
            Setup s(name, opt);
            const std::vector<std::pair<std::string, std::string>> chats = {
                {"You write Python.", "Write a function that sorts a list."},
                {repeat("You are a careful programmer. ", 12), "Reverse a string."},
                {"Be brief.", "Parse a date from text."},
                {repeat("Answer with code only. ", 20), "Write a binary search."},
                {"You write tests.", "Test a function that adds two numbers."},
                {repeat("Use type hints. ", 6), "Read a CSV file."},
            };
            std::vector<std::vector<spark_token>> prompts;
            for (const auto & [sys, user] : chats) prompts.push_back(s.prompt(sys, user));
            std::vector<Answer> alone;
            for (size_t i = 0; i < prompts.size(); ++i) alone.push_back(collect(s.engine->submit(greedy(prompts[i], 24 + 4 * int(i)))));
            std::vector<std::shared_ptr<Request>> reqs;  // all at once: 3 run, 3 wait in the queue
            for (size_t i = 0; i < prompts.size(); ++i) reqs.push_back(s.engine->submit(greedy(prompts[i], 24 + 4 * int(i))));
            for (size_t i = 0; i < prompts.size(); ++i) {
                const Answer a = collect(reqs[i]);
                INFO("prompt " << i << " (" << prompts[i].size() << " tokens)");
                CHECK(a.error.empty());
                CHECK(!a.text.empty());
                CHECK(a.text == alone[i].text);
                CHECK(a.reason == alone[i].reason);
                CHECK(a.usage.completion_tokens == alone[i].usage.completion_tokens);
            }
            const EngineStats st = s.engine->stats();
            CHECK(st.requests_total == 12);
            CHECK(st.running == 0);
            CHECK(st.queued == 0);
        }
    }
}

TEST_CASE("engine: a shared prefix is decoded once; the answer is a fresh engine's") {
    for (const char * name : {"spark-demo-coder-moe", "spark-demo-coder-next"}) {
        SUBCASE(name) {
            EngineOptions opt;
            opt.n_parallel = 2;
            opt.n_ctx_slot = 1024;
            opt.n_batch    = 128;
            const std::string system = repeat("You are a careful Python programmer who writes short functions. ", 30);  // > 256 tokens
            Answer            fresh;
            {
                Setup s(name, opt);
                fresh = collect(s.engine->submit(greedy(s.prompt(system, "Write a function that reverses a string."), 32)));
                CHECK(fresh.usage.cached_tokens == 0);
            }
            Setup      s(name, opt);
            const auto a = s.prompt(system, "Write a function that sorts a list.");
            const auto b = s.prompt(system, "Write a function that reverses a string.");
            size_t     common = 0;
            while (common < a.size() && common < b.size() && a[common] == b[common]) ++common;
            REQUIRE(common > 256);
            const Answer first = collect(s.engine->submit(greedy(a, 32)));
            const Answer second = collect(s.engine->submit(greedy(b, 32)));
            CHECK(first.usage.cached_tokens == 0);
            // Attention only: everything shared; Qwen3-Next: up to its last 256-token block.
            if (std::string(name).find("next") == std::string::npos) CHECK(second.usage.cached_tokens == int32_t(common));
            else CHECK(second.usage.cached_tokens == int32_t(common / 256 * 256));
            CHECK(second.text == fresh.text);
            // Attention only: b started from a KV copy of a's slot, so a's conversation is still
            // there for its next turn (a prompt that extends a).
            if (std::string(name).find("next") == std::string::npos) {
                std::vector<spark_token> a2 = a;
                for (int i = 0; i < 3; ++i) a2.push_back(a[size_t(i) + 5]);
                const Answer third = collect(s.engine->submit(greedy(a2, 8)));
                CHECK(third.usage.cached_tokens == int32_t(a.size()));
            }
        }
    }
}

TEST_CASE("engine: cancel frees the slot, a full queue refuses, stop strings / max_tokens / seeds") {
    EngineOptions opt;
    opt.n_parallel = 1;
    opt.n_ctx_slot = 2048;
    opt.n_batch    = 64;
    opt.max_queue  = 1;
    Setup      s("spark-demo-coder-moe", opt);
    const auto p = s.prompt("You write Python.", "Write a long class with many methods.");

    auto long_req = s.engine->submit(greedy(p, 1500));
    REQUIRE(long_req != nullptr);
    REQUIRE(!long_req->wait(std::chrono::steady_clock::now() + std::chrono::seconds(300)).empty());  // it holds the slot
    auto queued = s.engine->submit(greedy(p, 6));
    REQUIRE(queued != nullptr);
    CHECK(s.engine->submit(greedy(p, 6)) == nullptr);  // one running, one queued: the queue (1) is full
    long_req->cancel();
    const Answer c = collect(long_req);
    CHECK(c.error == "cancelled");
    CHECK(c.usage.completion_tokens < 1500);
    const Answer q = collect(queued);  // the freed slot serves the queued request
    CHECK(q.error.empty());
    CHECK(q.reason == "length");
    CHECK(q.usage.completion_tokens == 6);
    EngineStats st = s.engine->stats();
    CHECK(st.requests_cancelled == 1);
    CHECK(st.requests_rejected == 1);
    CHECK(st.running == 0);

    // A prompt that is empty or leaves no room for an answer comes back failed, not queued.
    for (const size_t n : {size_t(0), size_t(opt.n_ctx_slot)}) {
        const Answer bad = collect(s.engine->submit(greedy(std::vector<spark_token>(n, p[0]), 4)));
        CHECK(!bad.error.empty());
    }

    // A stop string cuts the answer before it.
    const Answer whole = collect(s.engine->submit(greedy(p, 40)));
    REQUIRE(whole.text.size() > 12);
    GenerationParams g = greedy(p, 40);
    g.stop             = {whole.text.substr(8, 4)};
    const Answer cut   = collect(s.engine->submit(g));
    CHECK(cut.reason == "stop");
    CHECK(cut.text == whole.text.substr(0, whole.text.find(g.stop[0])));

    // A seed repeats a sampled answer.
    GenerationParams r = greedy(p, 24);
    r.sampling         = SamplingParams{};  // temperature 0.8, top-k 40, ...
    r.sampling.seed    = 1234;
    const Answer r1    = collect(s.engine->submit(r));
    const Answer r2    = collect(s.engine->submit(r));
    CHECK(r1.text == r2.text);
    CHECK(r1.usage.completion_tokens == 24);
}
