#include "runtime/graph_builders.h"

#include "common/error.h"
#include "runtime/context.h"
#include "runtime/memory/memory.h"

#include <algorithm>
#include <cmath>

namespace spark {

Tensor * param(GraphContext & gc, const Param & p, const char * name) {
    SPARK_ASSERT(p.data != nullptr && !p.ne.empty());
    Tensor * t = nullptr;
    switch (p.ne.size()) {
        case 1: t = gc.graph.external(DType::F32, {p.ne[0]}, p.data, name); break;
        case 2: t = gc.graph.external(DType::F32, {p.ne[0], p.ne[1]}, p.data, name); break;
        default: SPARK_ASSERT(false);
    }
    return t;
}

Tensor * build_norm(GraphContext & gc, Tensor * x, const Param & w, float eps, bool zero_centered, const char * name, int il) {
    return gc.graph.named(gc.graph.rms_norm(x, param(gc, w, name), eps, zero_centered), name, il);
}

Tensor * build_ffn(GraphContext & gc, Tensor * x, const QWeight & gate, const QWeight & up, const QWeight & down, int il) {
    Graph &  g = gc.graph;
    Tensor * h = g.swiglu(g.matmul(x, gate), g.matmul(x, up));
    return g.named(g.matmul(h, down), "ffn_out", il);
}

Tensor * build_moe(GraphContext & gc, Tensor * x, const LayerWeights & L, int il, Tensor * shared, Tensor * shared_gate) {
    Graph &         g  = gc.graph;
    const HParams & hp = gc.model.hparams;
    const int64_t   T  = x->ne[1];
    Tensor * logits = g.named(g.matmul(x, L.router), "router_logits", il);
    Tensor * route  = g.moe_route(logits, int32_t(hp.n_expert_used), hp.norm_topk_prob);
    Tensor * ids    = g.moe_ids(route);
    Tensor * xe     = g.reshape(x, {x->ne[0], 1, T});  // one input row shared by the k slots
    const int32_t ne = int32_t(hp.n_expert);
    Tensor * gate   = g.matmul_id(xe, L.exp_gate.data(), ne, ids);
    Tensor * up     = g.matmul_id(xe, L.exp_up.data(), ne, ids);
    Tensor * act    = g.swiglu(gate, up);                        // [n_ff_expert, k, T]
    Tensor * down   = g.matmul_id(act, L.exp_down.data(), ne, ids);  // [n_embd, k, T]
    return g.named(g.moe_combine(down, g.moe_weights(route), shared, shared_gate), "moe_out", il);
}

Tensor * build_attention(GraphContext & gc, Tensor * x, const LayerWeights & L, int il, bool q_gated, bool zc) {
    Graph &         g  = gc.graph;
    const HParams & hp = gc.model.hparams;
    const int64_t   T = x->ne[1], hd = hp.head_dim, nh = hp.n_head, nkv = hp.n_head_kv;

    Tensor * q    = g.matmul(x, L.wq);
    Tensor * gate = nullptr;
    if (q_gated) {
        // q_proj rows are [q (hd) | gate (hd)] per head: split with strided views.
        Tensor * qg = g.reshape(q, {2 * hd, nh, T});
        gate        = g.view(qg, {hd, nh, T}, {4, qg->nb[1], qg->nb[2]}, size_t(hd) * 4);
        q           = g.view(qg, {hd, nh, T}, {4, qg->nb[1], qg->nb[2]}, 0);
    } else {
        q = g.reshape(q, {hd, nh, T});
    }
    Tensor * k = g.reshape(g.matmul(x, L.wk), {hd, nkv, T});
    Tensor * v = g.reshape(g.matmul(x, L.wv), {hd, nkv, T});

    // Each norm directly followed by its RoPE: backends may fuse the pair. Llama-style layers (an
    // EAGLE3 head) have no q/k norms.
    if (L.q_norm.data) q = g.rms_norm(q, param(gc, L.q_norm, "q_norm"), hp.rms_eps, zc);
    q = g.named(g.rope(q, gc.step.pos, int32_t(hp.n_rot), hp.rope_theta), "q_rope", il);
    if (L.k_norm.data) k = g.rms_norm(k, param(gc, L.k_norm, "k_norm"), hp.rms_eps, zc);
    k = g.named(g.rope(k, gc.step.pos, int32_t(hp.n_rot), hp.rope_theta), "k_rope", il);

    Tensor * o = g.attention(q, k, v, gc.memory.k_cache(g, il), gc.memory.v_cache(g, il), gc.step,
                             1.0f / std::sqrt(float(hd)));
    g.named(o, "attn", il);
    if (gate) o = g.mul_sigmoid(o, g.reshape(g.cont(gate), {hd * nh, T}));
    return g.named(g.matmul(o, L.wo), "attn_out", il);
}

void capture_layer(GraphContext & gc, int il, Tensor * x) {
    if (!gc.capture) return;
    const auto & layers = gc.capture->layers;
    gc.captured_parts.resize(layers.size(), nullptr);
    for (size_t i = 0; i < layers.size(); ++i)
        if (layers[i] == il) gc.captured_parts[i] = x;
}

namespace {

// The captured parts side by side, in the order asked for.
Tensor * concat_all(Graph & g, const std::vector<Tensor *> & parts) {
    SPARK_ASSERT(!parts.empty());
    Tensor * out = parts[0];
    size_t   i   = 1;
    if (parts.size() == 1) return g.cont(out);
    for (; i < parts.size(); i += 2) out = g.concat(out, parts[i], i + 1 < parts.size() ? parts[i + 1] : nullptr);
    return out;
}

}  // namespace

Tensor * build_output(GraphContext & gc, Tensor * x, bool zc) {
    Graph &    g       = gc.graph;
    const bool capture = gc.capture && !gc.capture->empty();
    const bool final   = capture && std::count(gc.capture->layers.begin(), gc.capture->layers.end(), HiddenCapture::kFinalNorm) > 0;
    // Only the rows that want logits go through the final norm and lm_head, unless the normed
    // hidden state of every row is captured.
    if (gc.out_ids->ne[0] != x->ne[1] && !final) x = g.get_rows(x, gc.out_ids);
    x = build_norm(gc, x, gc.model.output_norm, gc.model.hparams.rms_eps, zc, "output_norm", -1);
    if (capture) {
        capture_layer(gc, HiddenCapture::kFinalNorm, x);
        for (Tensor * p : gc.captured_parts) SPARK_ASSERT(p != nullptr);
        Tensor * c  = concat_all(g, gc.captured_parts);
        gc.captured = g.named(gc.capture->project ? g.matmul(c, *gc.capture->project) : c, "captured");
    }
    if (gc.out_ids->ne[0] != x->ne[1]) x = g.get_rows(x, gc.out_ids);
    Tensor * logits = g.named(g.matmul(x, gc.model.output), "logits");
    g.mark_output(logits);
    return logits;
}

}  // namespace spark
