// Building blocks shared by the architectures (llama.cpp's build_attn / build_ffn / build_norm):
// each reads like a line of the model card and names its intermediates.
#pragma once

#include "runtime/models/arch.h"

namespace spark {

// A float32 parameter as a graph leaf.
Tensor * param(GraphContext & gc, const Param & p, const char * name);

// RMSNorm over rows with the layer's weight; zero_centered for Qwen3-Next's (1 + w) norms.
Tensor * build_norm(GraphContext & gc, Tensor * x, const Param & w, float eps, bool zero_centered, const char * name, int il);

// SwiGLU MLP: down(silu(gate(x)) * up(x)).
Tensor * build_ffn(GraphContext & gc, Tensor * x, const QWeight & gate, const QWeight & up, const QWeight & down, int il);

// Routed experts (softmax router, top-k, optional renormalisation), run only for the tokens routed
// to them, weighted and summed: x [n_embd, T] -> [n_embd, T]. A shared expert's output [n_embd, T]
// (optional) is added to the sum gated by sigmoid(shared_gate [1, T]).
Tensor * build_moe(GraphContext & gc, Tensor * x, const LayerWeights & L, int il, Tensor * shared = nullptr,
                   Tensor * shared_gate = nullptr);

// Softmax attention with per-head q/k RMSNorm (when the layer has them) and (partial) NEOX RoPE
// over the KV cache.
// q_gated: Qwen3-Next's q_proj holds [q | gate] per head and the output is multiplied by
// sigmoid(gate). Returns o_proj's output [n_embd, T].
Tensor * build_attention(GraphContext & gc, Tensor * x, const LayerWeights & L, int il, bool q_gated, bool zero_centered_norms);

// Final norm, the rows that want logits, and lm_head: -> [n_vocab, n_out]. Captures the final
// normed hidden state of every row when gc.capture asks for it.
Tensor * build_output(GraphContext & gc, Tensor * x, bool zero_centered_norm);

// Records the output of layer il ([n_embd, T]) when gc.capture asks for it; architectures call it
// after every layer. build_output assembles gc.captured.
void capture_layer(GraphContext & gc, int il, Tensor * x);

}  // namespace spark
