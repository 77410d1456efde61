// The bundled demo models (examples/models) against their transformers goldens.
// Tolerance 1e-3 on logits (float32 CPU path vs float32 transformers; only summation order differs).
#include "harness.h"

using namespace test;

namespace {
std::string demo(const char * name) { return std::string(SPARK_TEST_DATA) + "/../../examples/models/" + name; }

void check_demo(const char * name) {
    const std::string dir = demo(name);
    Golden     g   = load_golden(dir);
    ModelPtr   m   = load_model(dir);
    ContextPtr ctx = new_context(m.get(), int32_t(g.prompt.size() + g.greedy.size() + 8));
    auto logits = prompt_logits(ctx.get(), g.prompt, int32_t(g.n_vocab));
    CHECK(max_abs_diff(logits, g.logits) <= 1e-3f);
    CHECK(greedy_continue(ctx.get(), int32_t(g.prompt.size()), int(g.greedy.size())) == g.greedy);
}
}  // namespace

TEST_CASE("demo model spark-demo-coder-moe matches its golden") { check_demo("spark-demo-coder-moe"); }
TEST_CASE("demo draft model spark-demo-coder-draft matches its golden") { check_demo("spark-demo-coder-draft"); }
TEST_CASE("demo model spark-demo-coder-next (Qwen3-Next + MTP head) matches its golden") { check_demo("spark-demo-coder-next"); }
