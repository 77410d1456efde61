// A loaded model: hyper-parameters, weights on the backend, tokenizer, metadata. Immutable after
// load and shared by every context created from it.
#pragma once

#include "backends/backend.h"
#include "io/tensor_source.h"
#include "quant/qweight.h"
#include "runtime/hparams.h"
#include "runtime/quant_config.h"
#include "runtime/weight_resolver.h"

#include <spark/spark.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

struct spark_tokenizer;

namespace spark {

class Architecture;

// A float32 parameter vector (norm weights, conv kernels, A_log, ...) in backend memory.
struct Param {
    void *               data = nullptr;
    std::vector<int64_t> ne;  // ggml order (innermost first)
};

// Weights of one decoder layer; each architecture fills the members it uses.
struct LayerWeights {
    Param attn_norm, ffn_norm;

    // softmax attention
    QWeight wq, wk, wv, wo;
    Param   q_norm, k_norm;

    // dense MLP
    QWeight ffn_gate, ffn_up, ffn_down;

    // MoE
    QWeight              router;  // [n_expert, n_embd]
    std::vector<QWeight> exp_gate, exp_up, exp_down;
    QWeight              shexp_gate, shexp_up, shexp_down;
    QWeight              shexp_router;  // [1, n_embd] sigmoid gate of the shared expert

    // Gated DeltaNet (linear attention)
    QWeight in_proj_qkvz, in_proj_ba, out_proj;
    Param   ssm_conv, ssm_A_log, ssm_dt_bias, ssm_norm;
};

// What a speculative-decoding head has beyond its decoder layer (an EAGLE3 head, the Qwen3-Next MTP
// head). The head is a Model of its own (one attention layer, its own KV cache in its contexts)
// that borrows the target's embedding (and, for MTP, its lm_head).
struct HeadWeights {
    // EAGLE3: fc [H, n_aux * H_target] over the target's aux hidden states (computed in the target's
    // step); MTP: fc [H, 2H] over [normed embedding | normed hidden state].
    QWeight fc;
    // MTP: pre_fc_norm_embedding / pre_fc_norm_hidden; EAGLE3: input_layernorm (the embedding) and
    // hidden_norm (the hidden state) before their concatenation.
    Param norm_embd, norm_hidden;
    // EAGLE3: the target layers whose outputs fc reads, in order, and the target token id of each
    // draft-vocabulary token (I32 [draft_vocab] in backend memory).
    std::vector<int32_t> aux_layers;
    const void *         draft_to_target = nullptr;
};

struct Model {
    HParams                          hparams;
    QuantConfig                      quant;
    std::string                      path;
    std::unique_ptr<Architecture>    arch;
    std::shared_ptr<Backend>         backend;  // shared with the heads and draft models of speculation
    spark_device_kind                device = SPARK_DEVICE_CPU;

    QWeight                          tok_embd;
    QWeight                          output;  // lm_head (== tok_embd when tied)
    Param                            output_norm;
    std::vector<LayerWeights>        layers;

    std::unique_ptr<HeadWeights>     head;  // set when this model is a speculative head
    std::unique_ptr<Model>           mtp;   // Qwen3-Next: the MTP head, when the checkpoint has one

    std::unique_ptr<spark_tokenizer> tokenizer;
    std::map<std::string, std::string> meta;  // spark_model_meta()

    // Memory: the mapped checkpoint (CPU weights point into it), converted host buffers, and
    // backend storage (device copies, parameter vectors).
    std::unique_ptr<io::TensorSource>      source;
    HostStore                              host_store;
    std::vector<std::unique_ptr<Buffer>>   storage;
    spark_model_info                       info{};

    Model();
    ~Model();

    // Identity of the weights (saved sequence states are refused by other models): a hash of the
    // architecture, the hyper-parameters and every checkpoint tensor's name, type, shape and
    // sampled bytes. Computed on first use (it touches a few pages of each tensor).
    uint64_t fingerprint() const;

private:
    mutable std::once_flag fingerprint_once_;
    mutable uint64_t       fingerprint_ = 0;
};

// Loads from a Hugging Face directory or a spark file. Throws spark::Error. A draft model of
// speculative decoding shares its target's backend (same device, same stream).
std::unique_ptr<Model> load_model(const std::string & path, const spark_model_params & params, std::shared_ptr<Backend> backend = nullptr);

}  // namespace spark

struct spark_model {
    std::unique_ptr<spark::Model> impl;
};
