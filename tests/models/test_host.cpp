// Host plumbing (issue 15): the library prints nothing itself and reports through spark_log_set.
#include "harness.h"

#include <cstdlib>
#include <mutex>

using namespace test;

namespace {

struct Captured {
    std::mutex                                   mutex;
    std::vector<std::pair<spark_log_level, std::string>> messages;
};

void capture(spark_log_level level, const char * text, void * user_data) {
    auto * c = static_cast<Captured *>(user_data);
    std::lock_guard<std::mutex> lock(c->mutex);
    c->messages.push_back({level, text});
}

int32_t n_vocab(const spark_model * m) {
    spark_model_info info{};
    REQUIRE(spark_model_get_info(m, &info) == SPARK_OK);
    return info.n_vocab;
}

}  // namespace

TEST_CASE("library messages go to the host's log callback, and nowhere once it is removed") {
    // SPARK_PROFILE makes every model load report its phases, and every context its step timings
    // when it is freed.
    ::setenv("SPARK_PROFILE", "1", 1);
    Captured captured;
    spark_log_set(&capture, &captured);
    {
        ModelPtr   m   = load_model(model_dir("qwen3-bf16"));
        ContextPtr ctx = new_context(m.get());
        std::vector<float> out;
        REQUIRE(decode_range(ctx.get(), {1, 2, 3}, 0, 3, 0, n_vocab(m.get()), out) == SPARK_OK);
    }
    spark_log_set(nullptr, nullptr);
    {
        ModelPtr   m   = load_model(model_dir("qwen3-bf16"));
        ContextPtr ctx = new_context(m.get());
        std::vector<float> out;
        REQUIRE(decode_range(ctx.get(), {1, 2, 3}, 0, 3, 0, n_vocab(m.get()), out) == SPARK_OK);
    }
    ::unsetenv("SPARK_PROFILE");
    REQUIRE(captured.messages.size() == 2);  // the first load's and the first context's reports only
    CHECK(captured.messages[0].first == SPARK_LOG_INFO);
    CHECK(captured.messages[0].second.find("resolving") != std::string::npos);
    CHECK(captured.messages[1].first == SPARK_LOG_INFO);
    CHECK(captured.messages[1].second.find("1 steps, per step") != std::string::npos);
}

namespace {

std::vector<uint8_t> save_state(spark_context * ctx, int32_t seq) {
    std::vector<uint8_t> bytes(spark_state_seq_size(ctx, seq));
    size_t               written = 0;
    INFO(spark_last_error());
    REQUIRE(spark_state_seq_save(ctx, seq, bytes.data(), bytes.size(), &written) == SPARK_OK);
    REQUIRE(written == bytes.size());
    return bytes;
}

// Decodes prompt[begin, end) into `seq` at positions begin.. and returns the last row's logits.
std::vector<float> continue_seq(spark_context * ctx, const std::vector<int32_t> & prompt, size_t begin, size_t end, int32_t seq, int32_t nv) {
    std::vector<float> out;
    INFO(spark_last_error());
    REQUIRE(decode_range(ctx, prompt, begin, end, seq, nv, out) == SPARK_OK);
    return std::vector<float>(out.end() - nv, out.end());
}

}  // namespace

// A restored state is the very same memory, so what follows is bit-identical (tolerance 0).
TEST_CASE("a saved sequence state, loaded into another context and sequence, continues exactly") {
    for (const char * name : {"qwen3-bf16", "qwen3_next-bf16", "qwen3_moe-int4-autoround"}) {
        SUBCASE(name) {
            Golden        g    = load_golden(model_dir(name));
            ModelPtr      m    = load_model(model_dir(name));
            const int32_t nv   = int32_t(g.n_vocab);
            const size_t  half = g.prompt.size() / 2;

            ContextPtr a = new_context(m.get());
            continue_seq(a.get(), g.prompt, 0, half, 0, nv);
            std::vector<uint8_t> state = save_state(a.get(), 0);
            const std::string    path  = std::string(SPARK_BINARY_DIR) + "/test-state-" + name + ".bin";
            REQUIRE(spark_state_seq_save_file(a.get(), 0, path.c_str()) == SPARK_OK);
            const auto expect = continue_seq(a.get(), g.prompt, half, g.prompt.size(), 0, nv);

            // From the buffer, into sequence 1 of a context whose sequence 1 held something else.
            ContextPtr b = new_context(m.get(), 256, 2);
            continue_seq(b.get(), g.prompt, 0, 3, 1, nv);
            INFO(spark_last_error());
            REQUIRE(spark_state_seq_load(b.get(), 1, state.data(), state.size()) == SPARK_OK);
            CHECK(spark_memory_seq_length(b.get(), 1) == int32_t(half));
            CHECK(max_abs_diff(continue_seq(b.get(), g.prompt, half, g.prompt.size(), 1, nv), expect) == 0.0f);

            // From the file.
            ContextPtr c = new_context(m.get());
            REQUIRE(spark_state_seq_load_file(c.get(), 0, path.c_str()) == SPARK_OK);
            CHECK(max_abs_diff(continue_seq(c.get(), g.prompt, half, g.prompt.size(), 0, nv), expect) == 0.0f);
            std::remove(path.c_str());

            // An empty sequence saves and loads as empty.
            std::vector<uint8_t> empty = save_state(new_context(m.get()).get(), 0);
            REQUIRE(spark_state_seq_load(c.get(), 0, empty.data(), empty.size()) == SPARK_OK);
            CHECK(spark_memory_seq_length(c.get(), 0) == 0);
        }
    }
}

TEST_CASE("a state from another model, another version, corrupt, truncated or too long is refused and changes nothing") {
    Golden        g  = load_golden(model_dir("qwen3-bf16"));
    ModelPtr      m  = load_model(model_dir("qwen3-bf16"));
    ModelPtr      other = load_model(model_dir("qwen3-int4-autoround"));  // the same shapes, other weights
    const int32_t nv = int32_t(g.n_vocab);

    ContextPtr src = new_context(m.get());
    continue_seq(src.get(), g.prompt, 0, 6, 0, nv);
    const std::vector<uint8_t> good = save_state(src.get(), 0);
    ContextPtr foreign_ctx = new_context(other.get());
    continue_seq(foreign_ctx.get(), g.prompt, 0, 6, 0, nv);
    const std::vector<uint8_t> foreign = save_state(foreign_ctx.get(), 0);

    // The target holds 4 tokens; each refused load must leave exactly them.
    ContextPtr dst = new_context(m.get(), 16);
    continue_seq(dst.get(), g.prompt, 0, 4, 0, nv);
    ContextPtr ref = new_context(m.get(), 16);
    continue_seq(ref.get(), g.prompt, 0, 4, 0, nv);
    const auto expect = continue_seq(ref.get(), g.prompt, 4, 5, 0, nv);

    auto refused = [&](std::vector<uint8_t> bytes, spark_status want, const char * message) {
        CAPTURE(message);
        CHECK(spark_state_seq_load(dst.get(), 0, bytes.data(), bytes.size()) == want);
        CHECK(std::string(spark_last_error()).find(message) != std::string::npos);
        CHECK(spark_memory_seq_length(dst.get(), 0) == 4);
    };
    refused(foreign, SPARK_ERR_INVALID_FORMAT, "another model");
    auto v = good;
    v[8] = 2;  // format version
    refused(v, SPARK_ERR_INVALID_FORMAT, "format version 2");
    v = good;
    v[0] = 'X';
    refused(v, SPARK_ERR_INVALID_FORMAT, "not a spark sequence state");
    v = good;
    v[v.size() / 2 + 40] ^= 1;
    refused(v, SPARK_ERR_INVALID_FORMAT, "checksum");
    v = good;
    v.pop_back();
    refused(v, SPARK_ERR_INVALID_FORMAT, "expected");
    v = good;
    v.resize(40);
    refused(v, SPARK_ERR_INVALID_FORMAT, "shorter than its header");
    v = good;
    v.push_back(0);
    refused(v, SPARK_ERR_INVALID_FORMAT, "expected");
    v = good;
    v[24] = 0x7f;  // n_tokens: 127 > n_ctx 16
    refused(v, SPARK_ERR_CONTEXT_FULL, "at most 16");

    // A file: missing, then truncated.
    const std::string path = std::string(SPARK_BINARY_DIR) + "/test-state-refused.bin";
    std::remove(path.c_str());
    CHECK(spark_state_seq_load_file(dst.get(), 0, path.c_str()) == SPARK_ERR_IO);
    {
        std::FILE * f = std::fopen(path.c_str(), "wb");
        REQUIRE(f);
        std::fwrite(good.data(), 1, good.size() - 10, f);
        std::fclose(f);
    }
    CHECK(spark_state_seq_load_file(dst.get(), 0, path.c_str()) == SPARK_ERR_INVALID_FORMAT);
    CHECK(std::string(spark_last_error()).find("truncated") != std::string::npos);
    std::remove(path.c_str());

    // Bad arguments.
    CHECK(spark_state_seq_load(dst.get(), 5, good.data(), good.size()) == SPARK_ERR_INVALID_ARGUMENT);
    std::vector<uint8_t> small(good.size() - 1);
    CHECK(spark_state_seq_save(src.get(), 0, small.data(), small.size(), nullptr) == SPARK_ERR_INVALID_ARGUMENT);
    CHECK(spark_state_seq_size(src.get(), 7) == 0);

    CHECK(spark_memory_seq_length(dst.get(), 0) == 4);
    CHECK(max_abs_diff(continue_seq(dst.get(), g.prompt, 4, 5, 0, nv), expect) == 0.0f);
}

TEST_CASE("perf counters count decode calls, steps, prompt and generation tokens, failures; reset clears them") {
    Golden        g  = load_golden(model_dir("qwen3-bf16"));
    ModelPtr      m  = load_model(model_dir("qwen3-bf16"));
    const int32_t nv = int32_t(g.n_vocab);
    ContextPtr    ctx = new_context(m.get(), 256, 1, 4);  // n_batch 4: a prompt of 6 is 2 steps
    continue_seq(ctx.get(), g.prompt, 0, 6, 0, nv);
    for (size_t i = 6; i < 9; ++i) continue_seq(ctx.get(), g.prompt, i, i + 1, 0, nv);
    spark_perf_context_data p{};
    REQUIRE(spark_perf_context(ctx.get(), &p) == SPARK_OK);
    CHECK(p.n_decode == 4);
    CHECK(p.n_steps == 5);
    CHECK(p.n_tokens == 9);
    CHECK(p.n_prompt_tokens == 6);
    CHECK(p.n_gen_tokens == 3);
    CHECK(p.t_prompt_ms > 0.0);
    CHECK(p.t_gen_ms > 0.0);
    CHECK(p.n_failed == 0);

    spark_context_set_abort_callback(ctx.get(), [](void *) { return true; }, nullptr);
    std::vector<float> out;
    CHECK(decode_range(ctx.get(), g.prompt, 9, 10, 0, nv, out) == SPARK_ERR_ABORTED);
    REQUIRE(spark_perf_context(ctx.get(), &p) == SPARK_OK);
    CHECK(p.n_failed == 1);
    CHECK(p.n_decode == 4);

    spark_perf_context_reset(ctx.get());
    REQUIRE(spark_perf_context(ctx.get(), &p) == SPARK_OK);
    CHECK(p.n_decode == 0);
    CHECK(p.n_steps == 0);
    CHECK(p.t_gen_ms == 0.0);
    CHECK(spark_perf_context(nullptr, &p) == SPARK_ERR_INVALID_ARGUMENT);
}
