// A split model through the C API (spark_model_params.n_devices / split_mode): decoding, the
// memory operations every rank must follow, and the model's info, against the whole model.
#include "models/harness.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace {

test::ModelPtr load(const std::string & dir, int32_t n_devices, spark_split_mode mode) {
    spark_model_params p = spark_model_default_params();
    p.device             = SPARK_DEVICE_CPU;
    p.n_threads          = 1;
    p.n_devices          = n_devices;
    p.split_mode         = mode;
    spark_model * m      = nullptr;
    const spark_status st = spark_model_load(dir.c_str(), p, &m);
    INFO(spark_last_error());
    REQUIRE(st == SPARK_OK);
    return test::ModelPtr(m);
}

// The prompt, then its last two tokens removed and decoded again (every rank's KV cache and
// recurrent state must follow the removal), then a second sequence copied from the first.
std::vector<float> session(spark_model * m, const test::Golden & g) {
    spark_context_params cp = spark_context_default_params();
    cp.n_ctx = 64, cp.n_batch = 64, cp.n_seq_max = 2, cp.n_threads = 1;
    cp.n_rollback = 2;  // Qwen3-Next: the recurrent states of the last positions stay removable
    spark_context * c = nullptr;
    REQUIRE(spark_context_init(m, cp, &c) == SPARK_OK);
    test::ContextPtr   ctx(c);
    std::vector<float> out;
    const size_t       n = g.prompt.size();
    REQUIRE(test::decode_range(ctx.get(), g.prompt, 0, n, 0, int32_t(g.n_vocab), out) == SPARK_OK);
    REQUIRE(spark_memory_seq_rm(ctx.get(), 0, int32_t(n - 2), -1) == SPARK_OK);
    REQUIRE(test::decode_range(ctx.get(), g.prompt, n - 2, n, 0, int32_t(g.n_vocab), out) == SPARK_OK);
    REQUIRE(spark_memory_seq_cp(ctx.get(), 0, 1) == SPARK_OK);
    REQUIRE(spark_memory_seq_rm(ctx.get(), 1, int32_t(n - 1), -1) == SPARK_OK);
    REQUIRE(test::decode_range(ctx.get(), g.prompt, n - 1, n, 1, int32_t(g.n_vocab), out) == SPARK_OK);
    return out;
}

}  // namespace

TEST_CASE("split models through the API: spark_decode and the memory operations on every rank") {
    for (const char * name : {"qwen3-int4-autoround", "qwen3_moe-nvfp4-modelopt", "qwen3_next-bf16", "minimax_m2-fp8-block"}) {
        const std::string  dir = test::model_dir(name);
        const test::Golden g   = test::load_golden(dir);
        CAPTURE(dir);
        test::ModelPtr           whole  = load(dir, 1, SPARK_SPLIT_NONE);
        const std::vector<float> expect = session(whole.get(), g);
        for (spark_split_mode mode : {SPARK_SPLIT_TENSOR, SPARK_SPLIT_EXPERT}) {
            test::ModelPtr   split = load(dir, 2, mode);
            spark_model_info a{}, b{};
            REQUIRE(spark_model_get_info(whole.get(), &a) == SPARK_OK);
            REQUIRE(spark_model_get_info(split.get(), &b) == SPARK_OK);
            CHECK(a.n_devices == 1);
            CHECK(a.split_mode == SPARK_SPLIT_NONE);
            CHECK(b.n_devices == 2);
            CHECK(b.split_mode == mode);
            CHECK(b.n_head == a.n_head);  // the whole model's shape
            CHECK(b.n_head_kv == a.n_head_kv);
            const std::vector<float> got = session(split.get(), g);
            REQUIRE(got.size() == expect.size());
            double worst = 0.0;
            for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, double(std::fabs(got[i] - expect[i])));
            CHECK(worst <= 1e-5);  // as test_split_models.cpp: the ranks' sums in another order
        }
    }
}

TEST_CASE("split models through the API: refused parameters say why and change nothing") {
    const std::string  dir = test::model_dir("qwen3-bf16");
    spark_model_params p   = spark_model_default_params();
    p.device               = SPARK_DEVICE_CPU;
    spark_model * m        = nullptr;
    p.n_devices            = 9;
    CHECK(spark_model_load(dir.c_str(), p, &m) == SPARK_ERR_INVALID_ARGUMENT);
    p.n_devices  = 2;
    const int32_t bad_mode = 7;  // what a C host may store; no C++ enum value (stored as its bytes)
    std::memcpy(&p.split_mode, &bad_mode, sizeof bad_mode);
    CHECK(spark_model_load(dir.c_str(), p, &m) == SPARK_ERR_INVALID_ARGUMENT);
    p.split_mode = SPARK_SPLIT_TENSOR;
    p.n_devices  = 8;  // 4 attention heads
    CHECK(spark_model_load(dir.c_str(), p, &m) == SPARK_ERR_UNSUPPORTED);
    CHECK(std::string(spark_last_error()).find("attention heads") != std::string::npos);
    CHECK(m == nullptr);
}

TEST_CASE("split models through the API: what a split model does not do yet is refused, and changes nothing") {
    const std::string  dir   = test::model_dir("qwen3_moe-bf16");
    const test::Golden g     = test::load_golden(dir);
    test::ModelPtr     split = load(dir, 2, SPARK_SPLIT_TENSOR);
    test::ContextPtr   ctx   = test::new_context(split.get(), 64, 1, 64);
    std::vector<float> first, again;
    REQUIRE(test::decode_range(ctx.get(), g.prompt, 0, 4, 0, int32_t(g.n_vocab), first) == SPARK_OK);
    // Speculative decoding and sequence states hold one rank's view: refused with the reason.
    spark_spec * spec = nullptr;
    CHECK(spark_spec_init(ctx.get(), spark_spec_default_params(), &spec) == SPARK_ERR_UNSUPPORTED);
    CHECK(spec == nullptr);
    CHECK(std::string(spark_last_error()).find("split") != std::string::npos);
    std::vector<uint8_t> buf(1 << 20);
    size_t               written = 0;
    CHECK(spark_state_seq_save(ctx.get(), 0, buf.data(), buf.size(), &written) == SPARK_ERR_UNSUPPORTED);
    CHECK(spark_state_seq_load(ctx.get(), 0, buf.data(), buf.size()) == SPARK_ERR_UNSUPPORTED);
    // So are a bad token, a full context and the abort callback, before any rank starts.
    std::vector<int32_t> bad = g.prompt;
    bad[4]                   = int32_t(g.n_vocab) + 5;
    std::vector<float> ignored;
    CHECK(test::decode_range(ctx.get(), bad, 4, 5, 0, int32_t(g.n_vocab), ignored) == SPARK_ERR_INVALID_TOKEN);
    std::vector<int32_t> many(100, g.prompt[0]);
    CHECK(test::decode_range(ctx.get(), many, 4, 100, 0, int32_t(g.n_vocab), ignored) == SPARK_ERR_CONTEXT_FULL);
    spark_context_set_abort_callback(ctx.get(), [](void *) { return true; }, nullptr);
    CHECK(test::decode_range(ctx.get(), g.prompt, 4, 5, 0, int32_t(g.n_vocab), ignored) == SPARK_ERR_ABORTED);
    spark_context_set_abort_callback(ctx.get(), nullptr, nullptr);
    // The context goes on as before: the same logits as a context that never failed.
    REQUIRE(test::decode_range(ctx.get(), g.prompt, 4, 5, 0, int32_t(g.n_vocab), again) == SPARK_OK);
    CHECK(spark_memory_seq_length(ctx.get(), 0) == 5);
    test::ContextPtr   fresh = test::new_context(split.get(), 64, 1, 64);
    std::vector<float> expect;
    REQUIRE(test::decode_range(fresh.get(), g.prompt, 0, 4, 0, int32_t(g.n_vocab), expect) == SPARK_OK);
    expect.clear();
    REQUIRE(test::decode_range(fresh.get(), g.prompt, 4, 5, 0, int32_t(g.n_vocab), expect) == SPARK_OK);
    CHECK(again == expect);  // the same steps: the same bits
}
