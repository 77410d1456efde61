#include "runtime/hparams.h"

#include "common/checked.h"
#include "common/error.h"
#include "io/config_fields.h"
#include "runtime/models/arch.h"

#include <algorithm>
#include <cmath>

namespace spark {

using json = nlohmann::json;

namespace {

using Fields = ConfigFields;
using namespace config_limits;

// rope_theta and the scaling type live in one of three places depending on the transformers version.
void parse_rope(const Fields & f, HParams & hp) {
    constexpr double kMaxTheta = 1e15;
    hp.rope_theta               = f.positive_float("rope_theta", 10000.0, kMaxTheta);
    const json * scaling        = f.find("rope_scaling");
    const char * scaling_name   = "rope_scaling";
    if (const json * params = f.find("rope_parameters")) {
        if (!params->is_object()) f.bad("rope_parameters", "must be an object");
        hp.rope_theta = Fields(*params, f.origin(), "rope_parameters.").positive_float("rope_theta", hp.rope_theta, kMaxTheta);
        scaling       = params;
        scaling_name  = "rope_parameters";
    }
    if (scaling) {
        if (!scaling->is_object()) f.bad(scaling_name, "must be an object or null");
        const Fields s(*scaling, f.origin(), std::string(scaling_name) + ".");
        std::string  type = "default";
        if (const json * t = s.find("rope_type")) type = t->is_string() ? t->get<std::string>() : Fields::shown(*t);
        else if (const json * t2 = s.find("type")) type = t2->is_string() ? t2->get<std::string>() : Fields::shown(*t2);
        if (type != "default")
            fail(SPARK_ERR_UNSUPPORTED, "%s: rope scaling type '%s' is not supported (only default RoPE)", f.origin().c_str(), type.c_str());
    }
}

}  // namespace

bool HParams::is_moe_layer(int64_t il) const {
    if (n_expert == 0) return false;
    if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), int(il)) != mlp_only_layers.end()) return false;
    return sparse_step > 0 && (il + 1) % sparse_step == 0;
}

int64_t HParams::n_layer_of(LayerKind kind) const {
    return std::count(layer_kinds.begin(), layer_kinds.end(), kind);
}

int64_t HParams::conv_state_floats() const {
    constexpr spark_status st   = SPARK_ERR_INVALID_FORMAT;
    const char *           what = "config.json: the linear-attention conv state";
    const int64_t          qk   = product_or_fail(st, what, {2, ssm_n_k_heads, ssm_k_dim});
    const int64_t          v    = product_or_fail(st, what, {ssm_n_v_heads, ssm_v_dim});
    return product_or_fail(st, what, {std::max<int64_t>(ssm_conv_kernel - 1, 0), sum_or_fail(st, what, qk, v)});
}

int64_t HParams::ssm_state_floats() const {
    return product_or_fail(SPARK_ERR_INVALID_FORMAT, "config.json: the linear-attention state", {ssm_k_dim, ssm_v_dim, ssm_n_v_heads});
}

void parse_rotary(const ConfigFields & f, HParams & hp, double default_factor) {
    // transformers 5 moves the factor into rope_parameters (its value wins there, as in
    // transformers' convert_rope_params_to_dict).
    double partial = f.number("partial_rotary_factor", default_factor, 0.0, 1.0, true);
    if (const json * params = f.find("rope_parameters"); params && params->is_object())
        partial = Fields(*params, f.origin(), "rope_parameters.").number("partial_rotary_factor", partial, 0.0, 1.0, true);
    hp.n_rot             = int64_t(double(hp.head_dim) * partial);
    if (hp.n_rot <= 0 || hp.n_rot % 2) f.bad("partial_rotary_factor", "= %g gives %lld rotated dims of %lld (must be even and positive)", partial, (long long) hp.n_rot, (long long) hp.head_dim);
}

void parse_moe_fields(const ConfigFields & f, HParams & hp, bool norm_topk_default) {
    const int64_t local = f.integer("num_local_experts", 0, 0, kMaxExperts);
    hp.n_expert         = f.integer("num_experts", local, 0, kMaxExperts);
    if (hp.n_expert == 0) f.bad(f.find("num_experts") ? "num_experts" : "num_local_experts", "must be positive for a mixture of experts");
    hp.n_expert_used    = f.integer("num_experts_per_tok", 0, 1, hp.n_expert, true);
    hp.n_ff_expert      = f.integer("moe_intermediate_size", 0, 1, kMaxFF, true);
    hp.norm_topk_prob   = f.boolean("norm_topk_prob", norm_topk_default);
    hp.sparse_step      = f.integer("decoder_sparse_step", 1, 1, kMaxLayers);
    if (const json * m = f.find("mlp_only_layers")) {
        if (!m->is_array()) f.bad("mlp_only_layers", "must be a list");
        for (const json & x : *m) {
            const bool in_range = x.is_number_integer() && (x.is_number_unsigned() ? x.get<uint64_t>() < uint64_t(hp.n_layer)
                                                                                   : x.get<int64_t>() >= 0 && x.get<int64_t>() < hp.n_layer);
            if (!in_range)
                f.bad("mlp_only_layers", "entries must be layer indices in [0, %lld), not %s", (long long) hp.n_layer, Fields::shown(x).c_str());
            hp.mlp_only_layers.push_back(int(x.get<int64_t>()));
        }
    }
}

void require_full_attention(const ConfigFields & f) {
    // Qwen3 lists "full_attention" / "sliding_attention"; sliding windows are not supported.
    if (const json * lt = f.find("layer_types"))
        if (lt->is_array())
            for (const json & v : *lt)
                if (!v.is_string() || v.get<std::string>() != "full_attention")
                    fail(SPARK_ERR_UNSUPPORTED, "%s: layer type '%s' is not supported", f.origin().c_str(), Fields::shown(v).c_str());
}

HParams parse_hparams(const json & j, const std::string & origin) {
    if (!j.is_object()) fail(SPARK_ERR_INVALID_FORMAT, "%s is not a JSON object", origin.c_str());
    const Fields f(j, origin);
    HParams      hp;
    const json * mt = f.find("model_type");
    if (!mt || !mt->is_string()) f.bad("model_type", "is missing or not a string");
    hp.arch                   = mt->get<std::string>();
    const Architecture * arch = find_architecture(hp.arch);
    if (!arch)
        fail(SPARK_ERR_UNSUPPORTED, "%s: architecture '%s' is not supported (supported: %s)", origin.c_str(), hp.arch.c_str(),
             architecture_names().c_str());

    hp.n_vocab        = f.integer("vocab_size", 0, 1, kMaxVocab, true);
    hp.n_embd         = f.integer("hidden_size", 0, 1, kMaxEmbd, true);
    hp.n_layer        = f.integer("num_hidden_layers", 0, 1, kMaxLayers, true);
    hp.n_head         = f.integer("num_attention_heads", 0, 1, kMaxHeads, true);
    hp.n_head_kv      = f.integer("num_key_value_heads", hp.n_head, 1, kMaxHeads);
    hp.n_ff           = f.integer("intermediate_size", 0, 0, kMaxFF);
    hp.n_ctx_train    = f.integer("max_position_embeddings", 4096, 1, kMaxPositions);
    hp.rms_eps        = f.positive_float("rms_norm_eps", 1e-6, 1.0);
    hp.tie_embeddings = f.boolean("tie_word_embeddings", false);
    if (hp.n_head % hp.n_head_kv != 0)
        f.bad("num_attention_heads", "(%lld) is not a multiple of num_key_value_heads (%lld)", (long long) hp.n_head, (long long) hp.n_head_kv);
    hp.head_dim = f.integer("head_dim", hp.n_embd / hp.n_head, 0, kMaxHeadDim);
    if (hp.head_dim == 0 || hp.head_dim % 2) f.bad("head_dim", "must be even and positive (got %lld)", (long long) hp.head_dim);

    parse_rope(f, hp);
    parse_rotary(f, hp, 1.0);
    hp.layer_kinds.assign(size_t(hp.n_layer), LayerKind::Attention);
    arch->parse_hparams(f, hp);  // its own fields (experts, linear attention, ...)

    if (f.boolean("use_sliding_window", false)) fail(SPARK_ERR_UNSUPPORTED, "%s: sliding-window attention is not supported", origin.c_str());
    if (f.boolean("attention_bias", false)) fail(SPARK_ERR_UNSUPPORTED, "%s: attention_bias is not supported", origin.c_str());
    if (const json * act = f.find("hidden_act"))
        if (!act->is_string() || act->get<std::string>() != "silu")
            fail(SPARK_ERR_UNSUPPORTED, "%s: hidden_act %s is not supported (only silu)", origin.c_str(), Fields::shown(*act).c_str());

    hp.eos_token_ids = f.token_ids("eos_token_id", hp.n_vocab);
    if (const json * b = f.find("bos_token_id")) {
        if (b->is_array()) f.bad("bos_token_id", "must be one token id, not %s", Fields::shown(*b).c_str());
        const std::vector<int32_t> bos = f.token_ids("bos_token_id", hp.n_vocab);
        hp.bos_token_id                = bos.empty() ? -1 : bos[0];
    }
    return hp;
}

}  // namespace spark
