// Synthetic models ("synthetic:<shape>:<format>", spark-bench's random real-shape models) load and run
// on the CPU in every format, and their roofline figures are consistent.
#include "harness.h"

#include <cmath>

using namespace test;

TEST_CASE("synthetic models run in every format with finite logits") {
    for (const char * shape : {"tiny-qwen3", "tiny-qwen3-moe", "tiny-qwen3-next"})
        for (const char * fmt : {"bf16", "int4", "nvfp4", "fp8"}) {
            const std::string path = std::string("synthetic:") + shape + ":" + fmt;
            CAPTURE(path);
            ModelPtr   m   = load_model(path, SPARK_DEVICE_CPU);
            ContextPtr ctx = new_context(m.get());
            spark_model_info info{};
            REQUIRE(spark_model_get_info(m.get(), &info) == SPARK_OK);
            std::vector<int32_t> prompt = {1, 7, 42, 300, 5};
            auto logits = prompt_logits(ctx.get(), prompt, info.n_vocab);
            bool finite = true;
            for (float v : logits) finite &= std::isfinite(v);
            CHECK(finite);
            CHECK(info.decode_weight_bytes > 0);
            CHECK(info.decode_weight_bytes < info.weight_bytes);
            // CPU KV cache is float32: layers x (K + V) x kv heads x head dim x 4 bytes.
            CHECK(info.kv_bytes_per_token == uint64_t(info.n_layer_attention) * 2 * uint64_t(info.n_head_kv * info.head_dim) * 4);
            CHECK((info.recurrent_bytes > 0) == (info.n_layer_linear_attention > 0));
        }
    spark_model * m = nullptr;
    CHECK(spark_model_load("synthetic:qwen3-9000b:int4", spark_model_default_params(), &m) == SPARK_ERR_INVALID_ARGUMENT);
    CHECK(spark_model_load("synthetic:tiny-qwen3:q4_k", spark_model_default_params(), &m) == SPARK_ERR_INVALID_ARGUMENT);
}
