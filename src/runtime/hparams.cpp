#include "runtime/hparams.h"

#include "graph/error.h"

#include <algorithm>

namespace spark {

using json = nlohmann::json;

namespace {

const json * find_key(const json & j, const char * key) {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
}

int64_t get_int(const json & j, const char * key, int64_t fallback, bool required = false) {
    const json * v = find_key(j, key);
    if (!v) {
        if (required) fail(SPARK_ERR_INVALID_FORMAT, "config.json: missing '%s'", key);
        return fallback;
    }
    if (!v->is_number_integer()) fail(SPARK_ERR_INVALID_FORMAT, "config.json: '%s' must be an integer", key);
    int64_t x = v->get<int64_t>();
    if (x < 0) fail(SPARK_ERR_INVALID_FORMAT, "config.json: '%s' must not be negative", key);
    return x;
}

double get_num(const json & j, const char * key, double fallback) {
    const json * v = find_key(j, key);
    if (!v) return fallback;
    if (!v->is_number()) fail(SPARK_ERR_INVALID_FORMAT, "config.json: '%s' must be a number", key);
    return v->get<double>();
}

bool get_bool(const json & j, const char * key, bool fallback) {
    const json * v = find_key(j, key);
    if (!v) return fallback;
    if (!v->is_boolean()) fail(SPARK_ERR_INVALID_FORMAT, "config.json: '%s' must be a boolean", key);
    return v->get<bool>();
}

// rope_theta and the scaling type live in one of three places depending on the transformers version.
void parse_rope(const json & j, HParams & hp) {
    hp.rope_theta = float(get_num(j, "rope_theta", 10000.0));
    const json * scaling = find_key(j, "rope_scaling");
    if (const json * params = find_key(j, "rope_parameters")) {
        if (!params->is_object()) fail(SPARK_ERR_INVALID_FORMAT, "config.json: rope_parameters must be an object");
        hp.rope_theta = float(get_num(*params, "rope_theta", hp.rope_theta));
        scaling       = params;
    }
    if (scaling) {
        if (!scaling->is_object()) fail(SPARK_ERR_INVALID_FORMAT, "config.json: rope_scaling must be an object or null");
        std::string type = "default";
        if (const json * t = find_key(*scaling, "rope_type")) type = t->is_string() ? t->get<std::string>() : "?";
        else if (const json * t2 = find_key(*scaling, "type")) type = t2->is_string() ? t2->get<std::string>() : "?";
        if (type != "default")
            fail(SPARK_ERR_UNSUPPORTED, "config.json: rope scaling type '%s' is not supported (only default RoPE)", type.c_str());
    }
    if (!(hp.rope_theta > 0.0f)) fail(SPARK_ERR_INVALID_FORMAT, "config.json: rope_theta must be positive");
}

std::vector<int32_t> token_ids(const json * v) {
    std::vector<int32_t> out;
    if (!v) return out;
    if (v->is_number_integer()) out.push_back(v->get<int32_t>());
    else if (v->is_array())
        for (const json & x : *v)
            if (x.is_number_integer()) out.push_back(x.get<int32_t>());
    return out;
}

}  // namespace

bool is_supported_arch(const std::string & t) { return t == "qwen3" || t == "qwen3_moe" || t == "qwen3_next"; }

bool HParams::is_moe_layer(int64_t il) const {
    if (n_expert == 0) return false;
    if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), int(il)) != mlp_only_layers.end()) return false;
    return sparse_step > 0 && (il + 1) % sparse_step == 0;
}

int64_t HParams::n_layer_of(LayerKind kind) const {
    return std::count(layer_kinds.begin(), layer_kinds.end(), kind);
}

int64_t HParams::conv_state_floats() const {
    return std::max<int64_t>(ssm_conv_kernel - 1, 0) * (2 * ssm_n_k_heads * ssm_k_dim + ssm_n_v_heads * ssm_v_dim);
}

int64_t HParams::ssm_state_floats() const { return ssm_k_dim * ssm_v_dim * ssm_n_v_heads; }

HParams parse_hparams(const json & j) {
    if (!j.is_object()) fail(SPARK_ERR_INVALID_FORMAT, "config.json is not a JSON object");
    HParams hp;
    const json * mt = find_key(j, "model_type");
    if (!mt || !mt->is_string()) fail(SPARK_ERR_INVALID_FORMAT, "config.json: missing 'model_type'");
    hp.arch = mt->get<std::string>();
    if (!is_supported_arch(hp.arch))
        fail(SPARK_ERR_UNSUPPORTED, "architecture '%s' is not supported (supported: qwen3, qwen3_moe, qwen3_next)", hp.arch.c_str());

    hp.n_vocab     = get_int(j, "vocab_size", 0, true);
    hp.n_embd      = get_int(j, "hidden_size", 0, true);
    hp.n_layer     = get_int(j, "num_hidden_layers", 0, true);
    hp.n_head      = get_int(j, "num_attention_heads", 0, true);
    hp.n_head_kv   = get_int(j, "num_key_value_heads", hp.n_head);
    hp.n_ff        = get_int(j, "intermediate_size", 0);
    hp.n_ctx_train = get_int(j, "max_position_embeddings", 4096);
    hp.rms_eps     = float(get_num(j, "rms_norm_eps", 1e-6));
    hp.tie_embeddings = get_bool(j, "tie_word_embeddings", false);
    if (hp.n_vocab == 0 || hp.n_embd == 0 || hp.n_layer == 0 || hp.n_head == 0 || hp.n_head_kv == 0)
        fail(SPARK_ERR_INVALID_FORMAT, "config.json: vocab/hidden/layer/head sizes must be positive");
    if (hp.n_head % hp.n_head_kv != 0)
        fail(SPARK_ERR_INVALID_FORMAT, "config.json: num_attention_heads (%lld) is not a multiple of num_key_value_heads (%lld)",
             (long long) hp.n_head, (long long) hp.n_head_kv);
    hp.head_dim = get_int(j, "head_dim", hp.n_embd / hp.n_head);
    if (hp.head_dim == 0 || hp.head_dim % 2) fail(SPARK_ERR_INVALID_FORMAT, "config.json: head_dim must be even and positive");
    if (hp.n_layer > 4096 || hp.n_embd > (1 << 20) || hp.n_vocab > (1 << 24))
        fail(SPARK_ERR_INVALID_FORMAT, "config.json: implausible model dimensions");

    parse_rope(j, hp);
    const double partial = get_num(j, "partial_rotary_factor", hp.arch == "qwen3_next" ? 0.25 : 1.0);
    hp.n_rot             = int64_t(double(hp.head_dim) * partial);
    if (hp.n_rot <= 0 || hp.n_rot > hp.head_dim || hp.n_rot % 2)
        fail(SPARK_ERR_INVALID_FORMAT, "config.json: partial_rotary_factor gives %lld rotated dims", (long long) hp.n_rot);

    if (hp.arch == "qwen3_moe" || hp.arch == "qwen3_next") {
        hp.n_expert       = get_int(j, "num_experts", get_int(j, "num_local_experts", 0));
        hp.n_expert_used  = get_int(j, "num_experts_per_tok", 0, true);
        hp.n_ff_expert    = get_int(j, "moe_intermediate_size", 0, true);
        hp.norm_topk_prob = get_bool(j, "norm_topk_prob", hp.arch == "qwen3_next");
        hp.sparse_step    = get_int(j, "decoder_sparse_step", 1);
        if (const json * m = find_key(j, "mlp_only_layers")) {
            if (!m->is_array()) fail(SPARK_ERR_INVALID_FORMAT, "config.json: mlp_only_layers must be a list");
            for (const json & x : *m) {
                if (!x.is_number_integer()) fail(SPARK_ERR_INVALID_FORMAT, "config.json: mlp_only_layers entries must be integers");
                hp.mlp_only_layers.push_back(x.get<int>());
            }
        }
        if (hp.n_expert == 0 || hp.n_expert_used == 0 || hp.n_expert_used > hp.n_expert)
            fail(SPARK_ERR_INVALID_FORMAT, "config.json: num_experts_per_tok (%lld) must be in [1, num_experts (%lld)]",
                 (long long) hp.n_expert_used, (long long) hp.n_expert);
    }

    hp.layer_kinds.assign(size_t(hp.n_layer), LayerKind::Attention);
    if (hp.arch == "qwen3_next") {
        hp.n_ff_shexp      = get_int(j, "shared_expert_intermediate_size", 0);
        hp.ssm_conv_kernel = get_int(j, "linear_conv_kernel_dim", 4);
        hp.ssm_n_k_heads   = get_int(j, "linear_num_key_heads", 0, true);
        hp.ssm_n_v_heads   = get_int(j, "linear_num_value_heads", 0, true);
        hp.ssm_k_dim       = get_int(j, "linear_key_head_dim", 0, true);
        hp.ssm_v_dim       = get_int(j, "linear_value_head_dim", 0, true);
        hp.n_mtp_layers    = get_int(j, "num_nextn_predict_layers", 0);
        if (hp.ssm_n_k_heads == 0 || hp.ssm_n_v_heads % hp.ssm_n_k_heads != 0 || hp.ssm_conv_kernel < 2)
            fail(SPARK_ERR_INVALID_FORMAT, "config.json: invalid linear-attention head configuration");
        if (const json * lt = find_key(j, "layer_types")) {
            if (!lt->is_array() || int64_t(lt->size()) != hp.n_layer)
                fail(SPARK_ERR_INVALID_FORMAT, "config.json: layer_types must list one type per layer");
            for (size_t i = 0; i < lt->size(); ++i) {
                const json & v = (*lt)[i];
                std::string  s = v.is_string() ? v.get<std::string>() : "";
                if (s == "linear_attention") hp.layer_kinds[i] = LayerKind::LinearAttention;
                else if (s == "full_attention") hp.layer_kinds[i] = LayerKind::Attention;
                else fail(SPARK_ERR_UNSUPPORTED, "config.json: layer type '%s' is not supported", s.c_str());
            }
        } else {
            const int64_t interval = get_int(j, "full_attention_interval", 4);
            if (interval == 0) fail(SPARK_ERR_INVALID_FORMAT, "config.json: full_attention_interval must be positive");
            for (int64_t i = 0; i < hp.n_layer; ++i)
                hp.layer_kinds[size_t(i)] = (i + 1) % interval == 0 ? LayerKind::Attention : LayerKind::LinearAttention;
        }
    } else if (const json * lt = find_key(j, "layer_types")) {
        // Qwen3 lists "full_attention" / "sliding_attention"; sliding windows are not supported.
        if (lt->is_array())
            for (const json & v : *lt)
                if (!v.is_string() || v.get<std::string>() != "full_attention")
                    fail(SPARK_ERR_UNSUPPORTED, "config.json: layer type '%s' is not supported", v.dump().c_str());
    }
    if (get_bool(j, "use_sliding_window", false))
        fail(SPARK_ERR_UNSUPPORTED, "config.json: sliding-window attention is not supported");
    if (get_bool(j, "attention_bias", false))
        fail(SPARK_ERR_UNSUPPORTED, "config.json: attention_bias is not supported");
    if (const json * act = find_key(j, "hidden_act"))
        if (!act->is_string() || act->get<std::string>() != "silu")
            fail(SPARK_ERR_UNSUPPORTED, "config.json: hidden_act %s is not supported (only silu)", act->dump().c_str());

    hp.eos_token_ids = token_ids(find_key(j, "eos_token_id"));
    if (const json * b = find_key(j, "bos_token_id"))
        if (b->is_number_integer()) hp.bos_token_id = b->get<int32_t>();
    return hp;
}

}  // namespace spark
