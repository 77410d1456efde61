// Qwen3-MoE (Qwen3MoeForCausalLM, e.g. Qwen3-Coder-30B-A3B): Qwen3 with a routed mixture of
// experts (softmax router, top-k, optional renormalisation) in the layers chosen by
// decoder_sparse_step / mlp_only_layers, and Qwen3's dense MLP elsewhere.
#include "common/error.h"
#include "runtime/graph_builders.h"
#include "runtime/models/qwen3.h"

namespace spark {

namespace {

class Qwen3Moe final : public Qwen3 {
public:
    const char * model_type() const override { return "qwen3_moe"; }
    const char * hf_class() const override { return "Qwen3MoeForCausalLM"; }
    const char * file_arch() const override { return "qwen3moe"; }
    void         parse_hparams(const ConfigFields & f, HParams & hp) const override {
        Qwen3::parse_hparams(f, hp);
        parse_moe_fields(f, hp, false);
    }
    void hf_config_defaults(const HParams &, nlohmann::json & c) const override {
        c["decoder_sparse_step"]  = 1;
        c["mlp_only_layers"]      = nlohmann::json::array();
        c["norm_topk_prob"]       = false;  // the class's (and spark's) default
        c["output_router_logits"] = false;
        c["router_aux_loss_coef"] = 0.001;
        c["sliding_window"]       = nullptr;
        c["use_sliding_window"]   = false;
    }
    std::vector<std::pair<std::string, nlohmann::json>> synthetic_shapes() const override {
        return {
            {"qwen3-30b-a3b",
             {{"model_type", "qwen3_moe"}, {"vocab_size", 151936}, {"hidden_size", 2048}, {"intermediate_size", 6144}, {"num_hidden_layers", 48},
              {"num_attention_heads", 32}, {"num_key_value_heads", 4}, {"head_dim", 128}, {"max_position_embeddings", 40960},
              {"rms_norm_eps", 1e-6}, {"rope_theta", 1000000.0}, {"tie_word_embeddings", false}, {"num_experts", 128},
              {"num_experts_per_tok", 8}, {"moe_intermediate_size", 768}, {"norm_topk_prob", true}, {"decoder_sparse_step", 1},
              {"mlp_only_layers", nlohmann::json::array()}}},
            {"tiny-qwen3-moe",
             {{"model_type", "qwen3_moe"}, {"vocab_size", 512}, {"hidden_size", 128}, {"intermediate_size", 256}, {"num_hidden_layers", 2},
              {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 64}, {"rope_theta", 1000000.0}, {"num_experts", 8},
              {"num_experts_per_tok", 2}, {"moe_intermediate_size", 128}, {"norm_topk_prob", true}}},
            // The 30B-A3B's routing (8 slots) at a test's size: a decode step takes the kernels of 8
            // slots a token (the down projection with the combine in one launch), which top-2 does not.
            {"tiny-qwen3-moe-top8",
             {{"model_type", "qwen3_moe"}, {"vocab_size", 512}, {"hidden_size", 256}, {"intermediate_size", 512}, {"num_hidden_layers", 2},
              {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 64}, {"rope_theta", 1000000.0}, {"num_experts", 16},
              {"num_experts_per_tok", 8}, {"moe_intermediate_size", 128}, {"norm_topk_prob", true}}},
        };
    }

protected:
    void load_ffn(Model & m, ModelLoader & ml, int64_t il) override {
        if (!m.hparams.is_moe_layer(il)) return Qwen3::load_ffn(m, ml, il);
        m.layers[size_t(il)].moe = load_moe(ml, m.hparams, "model.layers." + std::to_string(il) + ".mlp", &m.info.weight_bytes_ffn);
    }

    Tensor * build_ffn_block(GraphContext & gc, Tensor * h, const LayerWeights & L, int il) const override {
        if (!gc.model.hparams.is_moe_layer(il)) return Qwen3::build_ffn_block(gc, h, L, il);
        return build_moe(gc, h, L.moe, il);
    }
};

}  // namespace

std::unique_ptr<Architecture> make_qwen3_moe() { return std::make_unique<Qwen3Moe>(); }

}  // namespace spark
