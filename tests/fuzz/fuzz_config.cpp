// config.json -> hyper-parameters, quantization config, EAGLE3 head config and the memory a context
// of the model would need (docs/RELIABILITY.md, "config.json"). The input is one JSON document,
// read as a model's config.json, as hf_quant_config.json and as an EAGLE3 head's config.json.
#include "fuzz_util.h"
#include "runtime/hparams.h"
#include "runtime/memory/memory.h"
#include "runtime/model.h"
#include "runtime/models/heads.h"
#include "runtime/quant_config.h"

#include <nlohmann/json.hpp>

using json = nlohmann::json;

namespace {

// The target an EAGLE3 head is checked against: the shape of the eagle3 target fixture.
const spark::HParams & eagle3_target() {
    static const spark::HParams hp = spark::parse_hparams(json{{"model_type", "qwen3"}, {"vocab_size", 512}, {"hidden_size", 128},
                                                               {"intermediate_size", 256}, {"num_hidden_layers", 8}, {"num_attention_heads", 4},
                                                               {"num_key_value_heads", 2}, {"head_dim", 64}});
    return hp;
}

void size_contexts(const spark::HParams & hp) {
    spark::Model m;
    m.hparams                        = hp;
    const spark::MemoryLayout layout = spark::MemoryLayout::of(m);
    const int32_t n_ctx              = int32_t(std::min<int64_t>(hp.n_ctx_train, 1 << 20));
    for (const int32_t n_seq : {1, 4096}) (void) spark::MemoryFootprint::of(layout, spark::DType::F32, n_ctx, n_seq, 64, 64).total();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const json config = json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded()) return 0;  // the loaders report invalid JSON before parsing fields
    fuzz::expect_spark_errors_only([&] {
        const spark::HParams hp = spark::parse_hparams(config, "config.json");
        (void) hp.n_layer_of(spark::LayerKind::LinearAttention);
        size_contexts(hp);
    });
    fuzz::expect_spark_errors_only([&] { (void) spark::parse_quant_config(config, json(), "config.json").describe(); });
    fuzz::expect_spark_errors_only([&] { (void) spark::parse_quant_config(json::object(), config, "hf_quant_config.json"); });
    fuzz::expect_spark_errors_only([&] {
        std::vector<int32_t> aux;
        (void) spark::parse_eagle3_config(config, eagle3_target(), aux, "config.json");
    });
    return 0;
}
