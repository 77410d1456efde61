// MiniMax-M2 / M2.5 (MiniMaxM2ForCausalLM): every layer is softmax attention followed by a routed
// mixture of experts. What differs from Qwen3-MoE:
//   - q_norm / k_norm are RMSNorms over the whole q and k projections (n_head x head_dim, n_head_kv x
//     head_dim) before the split into heads, not per head;
//   - partial RoPE (rotary_dim 64 of head_dim 128), theta 5e6 by default;
//   - the router scores experts with a sigmoid each; e_score_correction_bias is added to the scores
//     only to choose the top-k, whose weights are the chosen scores renormalised to sum 1;
//   - no shared expert, no dense layers; the experts are block_sparse_moe.experts.E.{w1 (gate),
//     w3 (up), w2 (down)} in the released checkpoints.
// The layer is otherwise Qwen3's (pre-norm attention and feed-forward with residuals), so the class
// derives from it and replaces the norms' scope and the feed-forward block.
// Reference: transformers models/minimax_m2/modular_minimax_m2.py (MiniMaxM2TopKRouter,
// MiniMaxM2Attention) and its checkpoint conversion mapping (the mixtral pattern).
#include "common/error.h"
#include "runtime/models/qwen3.h"

namespace spark {

namespace {

using json = nlohmann::json;

class MiniMaxM2 final : public Qwen3 {
public:
    const char * model_type() const override { return "minimax_m2"; }
    const char * hf_class() const override { return "MiniMaxM2ForCausalLM"; }
    const char * file_arch() const override { return "minimax-m2"; }  // llama.cpp's LLM_ARCH_MINIMAX_M2

    void parse_hparams(const ConfigFields & f, HParams & hp) const override {
        using namespace config_limits;
        // theta: the class's default where the file names none (top level or rope_parameters).
        const json * params = f.find("rope_parameters");
        if (!f.find("rope_theta") && !(params && params->is_object() && params->contains("rope_theta"))) hp.rope_theta = 5e6f;
        // The rotated dims: partial_rotary_factor (transformers; the common parse has read it into
        // n_rot) or rotary_dim (the release's own config and vLLM); where both are given they must agree.
        const bool has_factor = f.find("partial_rotary_factor") || (params && params->is_object() && params->contains("partial_rotary_factor"));
        if (f.find("rotary_dim")) {
            const int64_t rotary_dim = f.integer("rotary_dim", 0, 2, hp.head_dim, true);
            if (rotary_dim % 2) f.bad("rotary_dim", "must be even (got %lld)", (long long) rotary_dim);
            if (has_factor && hp.n_rot != rotary_dim)
                f.bad("rotary_dim", "(%lld) disagrees with partial_rotary_factor (%lld rotated dims of %lld)", (long long) rotary_dim,
                      (long long) hp.n_rot, (long long) hp.head_dim);
            hp.n_rot = rotary_dim;
        }

        // Every layer is a mixture of experts; intermediate_size is the experts' width.
        const int64_t local = f.integer("num_local_experts", 0, 0, kMaxExperts);
        hp.n_expert         = f.integer("num_experts", local, 0, kMaxExperts);
        if (hp.n_expert == 0) f.bad("num_local_experts", "must be positive for a mixture of experts");
        hp.n_expert_used  = f.integer("num_experts_per_tok", 0, 1, hp.n_expert, true);
        hp.n_ff_expert    = f.integer("intermediate_size", 0, 1, kMaxFF, true);
        hp.n_ff           = 0;
        hp.norm_topk_prob = true;  // MiniMaxM2TopKRouter always renormalises
        hp.router_sigmoid = true;
        hp.sparse_step    = 1;

        // The release's config spells out choices transformers' class hard-codes: refuse others.
        if (const json * s = f.find("scoring_func"); s && !(s->is_string() && s->get<std::string>() == "sigmoid"))
            fail(SPARK_ERR_UNSUPPORTED, "%s: scoring_func %s is not supported (MiniMax-M2 scores experts with a sigmoid)", f.origin().c_str(),
                 ConfigFields::shown(*s).c_str());
        if (!f.boolean("use_qk_norm", true)) fail(SPARK_ERR_UNSUPPORTED, "%s: use_qk_norm = false is not supported", f.origin().c_str());
        if (const json * t = f.find("qk_norm_type"); t && !(t->is_string() && t->get<std::string>() == "per_layer"))
            fail(SPARK_ERR_UNSUPPORTED, "%s: qk_norm_type %s is not supported (only per_layer)", f.origin().c_str(), ConfigFields::shown(*t).c_str());
        if (f.integer("shared_intermediate_size", 0, 0, kMaxFF) != 0)
            fail(SPARK_ERR_UNSUPPORTED, "%s: a shared expert (shared_intermediate_size) is not supported for minimax_m2", f.origin().c_str());
        if (const json * types = f.find("attn_type_list")) {
            if (!types->is_array()) f.bad("attn_type_list", "must be a list");
            for (const json & t : *types)
                if (!(t.is_number_integer() && t.get<int64_t>() == 1))
                    fail(SPARK_ERR_UNSUPPORTED, "%s: attn_type_list entry %s is not supported (only 1, full attention)", f.origin().c_str(),
                         ConfigFields::shown(t).c_str());
        }
    }

    void hf_config_defaults(const HParams &, json & c) const override {
        c["num_local_experts"]    = 256;
        c["output_router_logits"] = false;
        c["router_aux_loss_coef"] = 0.001;
        c["router_jitter_noise"]  = 0.0;
        c["rope_parameters"]      = {{"rope_theta", 5000000.0}, {"rope_type", "default"}, {"partial_rotary_factor", 0.5}};
    }

    std::vector<std::pair<std::string, json>> synthetic_shapes() const override {
        return {
            // MiniMax-M2 / M2.5 (the two share the shape).
            {"minimax-m2",
             {{"model_type", "minimax_m2"}, {"vocab_size", 200064}, {"hidden_size", 3072}, {"intermediate_size", 1536}, {"num_hidden_layers", 62},
              {"num_attention_heads", 48}, {"num_key_value_heads", 8}, {"head_dim", 128}, {"max_position_embeddings", 196608},
              {"rms_norm_eps", 1e-6}, {"rope_theta", 5000000.0}, {"rotary_dim", 64}, {"tie_word_embeddings", false},
              {"num_local_experts", 256}, {"num_experts_per_tok", 8}, {"scoring_func", "sigmoid"}, {"use_qk_norm", true}}},
            {"tiny-minimax-m2",
             {{"model_type", "minimax_m2"}, {"vocab_size", 512}, {"hidden_size", 128}, {"intermediate_size", 128}, {"num_hidden_layers", 2},
              {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 64}, {"rotary_dim", 32}, {"num_local_experts", 8},
              {"num_experts_per_tok", 2}}},
        };
    }

    std::vector<std::string> dense_modules() const override { return {"lm_head", "*block_sparse_moe.gate"}; }

    // Its norms are plain (around 1); the choice bias is small, about the spread of the scores.
    SyntheticTensor::Init synthetic_param_init(const std::string & name) const override {
        const std::string bias = "e_score_correction_bias";
        const bool is_bias = name.size() >= bias.size() && name.compare(name.size() - bias.size(), bias.size(), bias) == 0;
        return is_bias ? SyntheticTensor::Init::NormZeroCentred : SyntheticTensor::Init::Norm;
    }

protected:
    QkNormScope qk_norm_scope() const override { return QkNormScope::WholeProjection; }

    void load_ffn(Model & m, ModelLoader & ml, int64_t il) override {
        const HParams &   hp  = m.hparams;
        const std::string moe = "model.layers." + std::to_string(il) + ".block_sparse_moe";
        LayerWeights &    L   = m.layers[size_t(il)];
        uint64_t *        f   = &m.info.weight_bytes_ffn;
        L.moe                 = load_moe(ml, hp, moe, f, {"w1", "w3", "w2"});
        // Optional (use_routing_bias): without it the scores alone choose.
        if (ml.has(moe + ".e_score_correction_bias")) L.moe.choice_bias = ml.param(moe + ".e_score_correction_bias", {hp.n_expert}, f);
    }

    Tensor * build_ffn_block(GraphContext & gc, Tensor * h, const LayerWeights & L, int il) const override { return build_moe(gc, h, L.moe, il); }
};

}  // namespace

std::unique_ptr<Architecture> make_minimax_m2() { return std::make_unique<MiniMaxM2>(); }

}  // namespace spark
