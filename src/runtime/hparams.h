// Hyper-parameters of every supported architecture, parsed from a Hugging Face config.json (both
// spellings found in the wild: top-level rope_theta / rope_scaling and transformers 5's
// rope_parameters; num_experts or num_local_experts; layer_types or full_attention_interval).
#pragma once

#include "io/config_fields.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace spark {

enum class LayerKind : uint8_t { Attention, LinearAttention };

struct HParams {
    std::string arch;  // config.json's model_type (models/arch.h: architectures())

    int64_t n_vocab     = 0;  // logits per token
    int64_t n_vocab_in  = 0;  // token ids the embedding takes, when they differ (an EAGLE3 head)
    int64_t n_embd      = 0;
    int64_t n_layer     = 0;
    int64_t n_head      = 0;
    int64_t n_head_kv   = 0;
    int64_t head_dim    = 0;
    int64_t n_ff        = 0;  // dense MLP intermediate size
    int64_t n_ctx_train = 0;
    float   rms_eps     = 1e-6f;
    float   rope_theta  = 10000.0f;
    int64_t n_rot       = 0;  // rotated dims per head (partial rotary)
    bool    tie_embeddings = false;

    // MoE
    int64_t          n_expert        = 0;
    int64_t          n_expert_used   = 0;
    int64_t          n_ff_expert     = 0;
    int64_t          n_ff_shexp      = 0;  // shared expert (Qwen3-Next)
    bool             norm_topk_prob  = false;
    bool             router_sigmoid  = false;  // sigmoid expert scores, not a softmax (MiniMax-M2)
    int64_t          sparse_step     = 1;
    std::vector<int> mlp_only_layers;

    // Hybrid (Qwen3-Next)
    std::vector<LayerKind> layer_kinds;  // one per layer
    int64_t ssm_conv_kernel = 0;
    int64_t ssm_n_k_heads   = 0;
    int64_t ssm_n_v_heads   = 0;
    int64_t ssm_k_dim       = 0;
    int64_t ssm_v_dim       = 0;
    int64_t n_mtp_layers    = 0;

    std::vector<int32_t> eos_token_ids;
    int32_t              bos_token_id = -1;

    int64_t embd_vocab() const { return n_vocab_in ? n_vocab_in : n_vocab; }
    bool is_moe_layer(int64_t il) const;
    int64_t n_layer_of(LayerKind kind) const;
    // Floats of one sequence's recurrent state in one linear-attention layer: the conv window (the
    // previous K-1 inputs of the q|k|v channels) and the delta-rule matrices (dk x dv per value head).
    int64_t conv_state_floats() const;
    int64_t ssm_state_floats() const;
};

// Throws Error(SPARK_ERR_INVALID_FORMAT) for missing, ill-typed or implausible fields (every
// dimension has an upper bound, docs/RELIABILITY.md), Error(SPARK_ERR_UNSUPPORTED) for unknown
// architectures or rope scaling types. Messages start with `origin`, the file the JSON came from.
// The common fields are read here, the architecture's own by its parse_hparams (models/arch.h).
HParams parse_hparams(const nlohmann::json & config, const std::string & origin = "config.json");

// Building blocks of the architectures' parse_hparams.
// n_rot from partial_rotary_factor (default `default_factor`) and head_dim.
void parse_rotary(const ConfigFields & f, HParams & hp, double default_factor);
// A mixture of experts' fields (num_experts / num_local_experts, num_experts_per_tok,
// moe_intermediate_size, norm_topk_prob, decoder_sparse_step, mlp_only_layers).
void parse_moe_fields(const ConfigFields & f, HParams & hp, bool norm_topk_default);
// layer_types, where given, lists only full attention (no sliding windows).
void require_full_attention(const ConfigFields & f);

}  // namespace spark
