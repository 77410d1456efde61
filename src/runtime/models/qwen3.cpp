// Qwen3 dense (Qwen3ForCausalLM): pre-norm decoder layers of GQA attention with per-head q/k
// RMSNorm and RoPE, and a SwiGLU MLP; tied or untied lm_head.
#include "runtime/models/qwen3.h"

#include "common/error.h"
#include "runtime/graph_builders.h"

namespace spark {

void Qwen3::parse_hparams(const ConfigFields & f, HParams &) const { require_full_attention(f); }

void Qwen3::hf_config_defaults(const HParams & hp, nlohmann::json & c) const {
    nlohmann::json layer_types = nlohmann::json::array();
    for (int64_t i = 0; i < hp.n_layer; ++i) layer_types.push_back("full_attention");
    c["layer_types"]        = layer_types;
    c["max_window_layers"]  = hp.n_layer;
    c["sliding_window"]     = nullptr;
    c["use_sliding_window"] = false;
}

std::vector<std::pair<std::string, nlohmann::json>> Qwen3::synthetic_shapes() const {
    return {
        {"qwen3-8b",
         {{"model_type", "qwen3"}, {"vocab_size", 151936}, {"hidden_size", 4096}, {"intermediate_size", 12288}, {"num_hidden_layers", 36},
          {"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"head_dim", 128}, {"max_position_embeddings", 40960}, {"rms_norm_eps", 1e-6},
          {"rope_theta", 1000000.0}, {"tie_word_embeddings", false}}},
        // A tiny variant of the family, for tests.
        {"tiny-qwen3",
         {{"model_type", "qwen3"}, {"vocab_size", 512}, {"hidden_size", 128}, {"intermediate_size", 256}, {"num_hidden_layers", 2},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 64}, {"rope_theta", 1000000.0}}},
    };
}

void Qwen3::load(Model & m, ModelLoader & ml) {
    const HParams & hp = m.hparams;
    const int64_t   E  = hp.n_embd;
    load_embedding(m, ml);
    for (int64_t il = 0; il < hp.n_layer; ++il) {
        const std::string p = "model.layers." + std::to_string(il);
        LayerWeights &    L = m.layers[size_t(il)];
        uint64_t *        a = &m.info.weight_bytes_attention;
        L.attn_norm = ml.param(p + ".input_layernorm.weight", {E}, a);
        L.attn      = load_attention(ml, hp, p + ".self_attn", E, 1, qk_norm_scope(), a);
        L.ffn_norm  = ml.param(p + ".post_attention_layernorm.weight", {E}, &m.info.weight_bytes_ffn);
        load_ffn(m, ml, il);
    }
    load_output(m, ml);
}

void Qwen3::load_ffn(Model & m, ModelLoader & ml, int64_t il) {
    const HParams &   hp = m.hparams;
    const std::string p  = "model.layers." + std::to_string(il) + ".mlp";
    LayerWeights &    L  = m.layers[size_t(il)];
    if (hp.n_ff == 0) fail(SPARK_ERR_INVALID_FORMAT, "config.json: layer %lld has a dense MLP but intermediate_size is missing", (long long) il);
    L.mlp = load_mlp(ml, p, hp.n_ff, hp.n_embd, &m.info.weight_bytes_ffn);
}

Tensor * Qwen3::build_ffn_block(GraphContext & gc, Tensor * h, const LayerWeights & L, int il) const {
    return reduce_ranks(gc, build_ffn(gc, h, L.mlp.gate, L.mlp.up, L.mlp.down, il));
}

Tensor * Qwen3::build(GraphContext & gc) const {
    const Model &   m  = gc.model;
    const HParams & hp = m.hparams;
    Graph &         g  = gc.graph;
    Tensor * x = g.named(g.get_rows(m.tok_embd, gc.tokens), "embd");
    for (int64_t il = 0; il < hp.n_layer; ++il) {
        const LayerWeights & L = m.layers[size_t(il)];
        Tensor * h = build_norm(gc, x, L.attn_norm, hp.rms_eps, false, "attn_norm", int(il));
        x          = g.add(x, build_attention(gc, h, L.attn, int(il), false, false));
        h          = build_norm(gc, x, L.ffn_norm, hp.rms_eps, false, "ffn_norm", int(il));
        x          = g.named(g.add(x, build_ffn_block(gc, h, L, int(il))), "l_out", int(il));
        capture_layer(gc, int(il), x);
    }
    return build_output(gc, x, false);
}

std::unique_ptr<Architecture> make_qwen3() { return std::make_unique<Qwen3>(); }

}  // namespace spark
