// A loaded model: hyper-parameters, weights on the backend, tokenizer, metadata. Immutable after
// load and shared by every context created from it.
#pragma once

#include "backends/backend.h"
#include "backends/comm.h"
#include "io/tensor_source.h"
#include "quant/qweight.h"
#include "quant/slice.h"
#include "runtime/hparams.h"
#include "runtime/quant_config.h"
#include "runtime/shard.h"
#include "runtime/weight_resolver.h"

#include <spark/spark.h>

#include <functional>
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

// How a decode step reads a weight: what the byte counts and the reported format derive from
// (fill_info, model.cpp). Each block below declares its weights through visit().
enum class WeightRole : uint8_t {
    Projection,  // a layer's main projection, read every step: these decide the format reported
    Auxiliary,   // read every step, but often kept bf16 by the producers (lm_head, routers, gates,
                 // shared experts, small projections): they do not decide the format
    Expert,      // one of a layer's routed experts: a step reads n_expert_used of them
    Embedding,   // the token embedding: a step reads one row
};

// Sees every weight a model holds (the ones loaded: an unset member is skipped).
struct WeightVisitor {
    std::function<void(const QWeight &, WeightRole)> weight;
    std::function<void(const Param &)>               param;
    void operator()(const QWeight & w, WeightRole r) const {
        if (w.n) weight(w, r);
    }
    void operator()(const Param & p) const {
        if (p.data) param(p);
    }
};

// Softmax attention (build_attention): q/k/v/o and the optional q/k RMSNorms, over each head
// ([head_dim]: Qwen3) or over the whole projection ([n_head * head_dim]: MiniMax-M2).
struct AttentionWeights {
    QWeight wq, wk, wv, wo;
    Param   q_norm, k_norm;
    bool    whole_norms = false;  // q_norm / k_norm over the whole projection, not per head
    void    visit(const WeightVisitor & v) const;
};

// Gated DeltaNet linear attention (Qwen3-Next).
struct LinearAttentionWeights {
    QWeight in_proj_qkvz, in_proj_ba, out_proj;
    Param   conv, A_log, dt_bias, norm;  // conv1d kernel, decay, step bias, gated norm
    void    visit(const WeightVisitor & v) const;
};

// SwiGLU MLP (build_ffn): down(silu(gate(x)) * up(x)).
struct MlpWeights {
    QWeight gate, up, down;
    void    visit(const WeightVisitor & v, WeightRole role) const;
};

// A routed mixture of experts (build_moe), with an optional sigmoid-gated shared expert.
struct MoeWeights {
    QWeight              router;       // [n_expert, n_embd]
    Param                choice_bias;  // [n_expert]: added to sigmoid scores to choose (MiniMax-M2)
    std::vector<QWeight> gate, up, down;  // one per expert (then the shared expert, with shared_slot)
    // The shared expert, where it is laid out as the routed experts are (same format and shape):
    // entry n_expert of gate / up / down, computed as one more slot of the routed matmuls (two
    // launches fewer a layer); otherwise in `shared`.
    bool                 shared_slot = false;
    MlpWeights           shared;
    QWeight              shared_gate;  // [1, n_embd]
    void                 visit(const WeightVisitor & v) const;
};

// One decoder layer: its two norms and the blocks its architecture uses (the others stay empty).
struct LayerWeights {
    Param                  attn_norm, ffn_norm;
    AttentionWeights       attn;
    LinearAttentionWeights linear_attn;
    MlpWeights             mlp;
    MoeWeights             moe;
    void                   visit(const WeightVisitor & v) const;
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
    HParams                          hparams;  // this rank's (shard_hparams) where the model is split
    Shard                            shard;    // which part of a split model this is (size 1: whole)
    // Rank 0 of a split model owns the group: the communicators (they outlive every rank's
    // model: declared before them) and the other ranks' models.
    std::vector<std::unique_ptr<Communicator>> comms;
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
    std::vector<std::unique_ptr<Model>> peers;  // rank 0 of a split model: ranks 1..

    std::unique_ptr<spark_tokenizer> tokenizer;
    std::map<std::string, std::string> meta;  // spark_model_meta()

    // Memory: the mapped checkpoint (CPU weights point into it), converted host buffers, and
    // backend storage (device copies, parameter vectors).
    std::unique_ptr<io::TensorSource>      source;
    HostStore                              host_store;
    SliceOwner                             slices;  // the parts of cut weights a rank keeps
    std::vector<std::unique_ptr<Buffer>>   storage;
    spark_model_info                       info{};

    Model();
    ~Model();

    // Every weight of the model (not of its MTP head, a Model of its own).
    void visit_weights(const WeightVisitor & v) const;

    // Identity of the weights (saved sequence states are refused by other models): a hash of the
    // architecture, the hyper-parameters and every checkpoint tensor's name, type, shape and
    // sampled bytes. Computed on first use (it touches a few pages of each tensor).
    uint64_t fingerprint() const;

private:
    mutable std::once_flag fingerprint_once_;
    mutable uint64_t       fingerprint_ = 0;
};

// Loads from a Hugging Face directory or a spark file. Throws spark::Error. A draft model of
// speculative decoding shares its target's backend (same device, same stream). With a shard of
// size > 1, the rank's part of a split model (runtime/shard.h).
std::unique_ptr<Model> load_model(const std::string & path, const spark_model_params & params, std::shared_ptr<Backend> backend = nullptr,
                                  const Shard & shard = {});

}  // namespace spark

struct spark_model {
    std::unique_ptr<spark::Model> impl;
};
