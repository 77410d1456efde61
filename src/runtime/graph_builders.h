// Building blocks shared by the architectures (llama.cpp's build_attn / build_ffn / build_norm):
// how a block's weights load (checkpoint names as transformers writes them) and how its graph is
// built; each graph builder reads like a line of the model card and names its intermediates.
#pragma once

#include "runtime/models/arch.h"

namespace spark {

// ---- loading

// The token embedding "model.embed_tokens" [n_vocab, n_embd] (kept bf16 by every producer).
void load_embedding(Model & m, ModelLoader & ml);
// The final norm "model.norm" and lm_head (the embedding itself where tie_word_embeddings).
void load_output(Model & m, ModelLoader & ml);

// Where an attention block's q_norm / k_norm apply.
enum class QkNormScope { None, PerHead, WholeProjection };

// Softmax attention "<prefix>" (a layer's self_attn): q/k/v/o over inputs of width `in` (n_embd;
// an EAGLE3 head's 2 x n_embd), q_proj with `q_per_head` x head_dim rows per head (2: Qwen3-Next's
// [q | gate]), and q_norm / k_norm of the kind `qk_norm` says. Bytes count into `bytes`.
AttentionWeights load_attention(ModelLoader & ml, const HParams & hp, const std::string & prefix, int64_t in, int64_t q_per_head,
                                QkNormScope qk_norm, uint64_t * bytes);

// A SwiGLU MLP "<prefix>" ({gate,up,down}_proj) of n_ff over n_embd.
MlpWeights load_mlp(ModelLoader & ml, const std::string & prefix, int64_t n_ff, int64_t n_embd, uint64_t * bytes);

// The names of an expert's three projections in a checkpoint.
struct ExpertNames {
    const char * gate = "gate_proj";
    const char * up   = "up_proj";
    const char * down = "down_proj";
};

// A mixture of experts "<prefix>" (a layer's mlp): the router "gate", the routed experts
// "experts.E.<names>" and, when hp.n_ff_shexp > 0, the shared expert "shared_expert" with its gate
// "shared_expert_gate".
MoeWeights load_moe(ModelLoader & ml, const HParams & hp, const std::string & prefix, uint64_t * bytes, const ExpertNames & names = {});

// ---- building

// A float32 parameter as a graph leaf.
Tensor * param(GraphContext & gc, const Param & p, const char * name);

// RMSNorm over rows with the layer's weight; zero_centered for Qwen3-Next's (1 + w) norms.
Tensor * build_norm(GraphContext & gc, Tensor * x, const Param & w, float eps, bool zero_centered, const char * name, int il);

// A row-parallel projection's partial output summed over the ranks of a split model (itself
// where the model is whole).
Tensor * reduce_ranks(GraphContext & gc, Tensor * partial);

// SwiGLU MLP: down(silu(gate(x)) * up(x)) (a rank's partial output in a split model: the caller
// reduces it, since a shared expert's joins the routed experts' first).
Tensor * build_ffn(GraphContext & gc, Tensor * x, const QWeight & gate, const QWeight & up, const QWeight & down, int il);

// Routed experts (a softmax router, or sigmoid scores chosen with the block's bias where
// hp.router_sigmoid; top-k, optional renormalisation), run only for the tokens routed to them,
// weighted and summed: x [n_embd, T] -> [n_embd, T]. A shared expert's output, where the
// layer has one, is added to the sum gated by sigmoid(shared_gate(x)).
Tensor * build_moe(GraphContext & gc, Tensor * x, const MoeWeights & w, int il);

// Softmax attention with q/k RMSNorm (when the layer has them: over each head, or over the whole
// projection before the split into heads, by the norm's length) and (partial) NEOX RoPE over the
// KV cache.
// q_gated: Qwen3-Next's q_proj holds [q | gate] per head and the output is multiplied by
// sigmoid(gate). Returns o_proj's output [n_embd, T].
Tensor * build_attention(GraphContext & gc, Tensor * x, const AttentionWeights & w, int il, bool q_gated, bool zero_centered_norms);

// Final norm, the rows that want logits, and lm_head: -> [n_vocab, n_out]. Captures the final
// normed hidden state of every row when gc.capture asks for it.
Tensor * build_output(GraphContext & gc, Tensor * x, bool zero_centered_norm);

// Records the output of layer il ([n_embd, T]) when gc.capture asks for it; architectures call it
// after every layer. build_output assembles gc.captured.
void capture_layer(GraphContext & gc, int il, Tensor * x);

}  // namespace spark
