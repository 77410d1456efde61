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
    // SPARK_PROFILE makes every context report its step timings when it is freed.
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
    REQUIRE(captured.messages.size() == 1);  // the first context's report only
    CHECK(captured.messages[0].first == SPARK_LOG_INFO);
    CHECK(captured.messages[0].second.find("1 steps, per step") != std::string::npos);
}
