#include "runtime/graph_builders.h"

#include "common/error.h"
#include "runtime/context.h"
#include "runtime/memory/memory.h"

#include <algorithm>
#include <cmath>

namespace spark {

void load_embedding(Model & m, ModelLoader & ml) {
    m.tok_embd = ml.dense("model.embed_tokens.weight", m.hparams.n_vocab, m.hparams.n_embd, &m.info.weight_bytes_embedding);
}

void load_output(Model & m, ModelLoader & ml) {
    const HParams & hp = m.hparams;
    m.output_norm      = ml.param("model.norm.weight", {hp.n_embd}, &m.info.weight_bytes_output);
    // As transformers: with tie_word_embeddings the embedding is the lm_head.
    if (hp.tie_embeddings) m.output = m.tok_embd;
    else m.output = ml.linear("lm_head", hp.n_vocab, hp.n_embd, &m.info.weight_bytes_output);
}

AttentionWeights load_attention(ModelLoader & ml, const HParams & hp, const std::string & p, int64_t in, int64_t q_per_head, QkNormScope qk_norm,
                                uint64_t * bytes) {
    const int64_t    hd = hp.head_dim;
    AttentionWeights w;
    w.wq = ml.linear(p + ".q_proj", q_per_head * hp.n_head * hd, in, bytes);
    w.wk = ml.linear(p + ".k_proj", hp.n_head_kv * hd, in, bytes);
    w.wv = ml.linear(p + ".v_proj", hp.n_head_kv * hd, in, bytes);
    w.wo = ml.linear(p + ".o_proj", hp.n_embd, hp.n_head * hd, bytes);
    if (qk_norm != QkNormScope::None) {
        const bool whole = qk_norm == QkNormScope::WholeProjection;
        w.q_norm         = ml.param(p + ".q_norm.weight", {whole ? hp.n_head * hd : hd}, bytes);
        w.k_norm         = ml.param(p + ".k_norm.weight", {whole ? hp.n_head_kv * hd : hd}, bytes);
    }
    return w;
}

MlpWeights load_mlp(ModelLoader & ml, const std::string & p, int64_t n_ff, int64_t n_embd, uint64_t * bytes) {
    MlpWeights w;
    w.gate = ml.linear(p + ".gate_proj", n_ff, n_embd, bytes);
    w.up   = ml.linear(p + ".up_proj", n_ff, n_embd, bytes);
    w.down = ml.linear(p + ".down_proj", n_embd, n_ff, bytes);
    return w;
}

MoeWeights load_moe(ModelLoader & ml, const HParams & hp, const std::string & p, uint64_t * bytes, const ExpertNames & names) {
    MoeWeights w;
    w.router = ml.linear(p + ".gate", hp.n_expert, hp.n_embd, bytes);
    std::vector<LinearSpec> specs;
    for (int64_t e = 0; e < hp.n_expert; ++e) {
        const std::string x = p + ".experts." + std::to_string(e);
        specs.push_back({x + "." + names.gate, hp.n_ff_expert, hp.n_embd});
        specs.push_back({x + "." + names.up, hp.n_ff_expert, hp.n_embd});
        specs.push_back({x + "." + names.down, hp.n_embd, hp.n_ff_expert});
    }
    const std::vector<QWeight> experts = ml.linears(specs, bytes);  // resolved in parallel
    for (size_t e = 0; e < size_t(hp.n_expert); ++e) {
        w.gate.push_back(experts[3 * e]);
        w.up.push_back(experts[3 * e + 1]);
        w.down.push_back(experts[3 * e + 2]);
    }
    if (hp.n_ff_shexp > 0) {
        w.shared      = load_mlp(ml, p + ".shared_expert", hp.n_ff_shexp, hp.n_embd, bytes);
        w.shared_gate = ml.linear(p + ".shared_expert_gate", 1, hp.n_embd, bytes);
    }
    return w;
}

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

Tensor * build_moe(GraphContext & gc, Tensor * x, const MoeWeights & w, int il) {
    Graph &         g  = gc.graph;
    const HParams & hp = gc.model.hparams;
    const int64_t   T  = x->ne[1];
    // The shared expert first; its gate logit's matmul right before the router's (the CUDA backend
    // runs adjacent matmuls of one input as one launch); its output joins the routed experts' in
    // the combine.
    Tensor * shared = nullptr, * shared_gate = nullptr;
    if (w.shared.gate.n) {
        shared      = build_ffn(gc, x, w.shared.gate, w.shared.up, w.shared.down, il);
        shared_gate = g.matmul(x, w.shared_gate);
    }
    Tensor * logits = g.named(g.matmul(x, w.router), "router_logits", il);
    Tensor * bias   = w.choice_bias.data ? param(gc, w.choice_bias, "router_bias") : nullptr;
    Tensor * route  = g.moe_route(logits, int32_t(hp.n_expert_used), hp.norm_topk_prob,
                                  hp.router_sigmoid ? RouterScore::Sigmoid : RouterScore::Softmax, bias);
    Tensor * ids    = g.moe_ids(route);
    Tensor * xe     = g.reshape(x, {x->ne[0], 1, T});  // one input row shared by the k slots
    const int32_t ne = int32_t(hp.n_expert);
    Tensor * gate   = g.matmul_id(xe, w.gate.data(), ne, ids);
    Tensor * up     = g.matmul_id(xe, w.up.data(), ne, ids);
    Tensor * act    = g.swiglu(gate, up);                        // [n_ff_expert, k, T]
    Tensor * down   = g.matmul_id(act, w.down.data(), ne, ids);  // [n_embd, k, T]
    return g.named(g.moe_combine(down, g.moe_weights(route), shared, shared_gate), "moe_out", il);
}

Tensor * build_attention(GraphContext & gc, Tensor * x, const AttentionWeights & w, int il, bool q_gated, bool zc) {
    Graph &         g  = gc.graph;
    const HParams & hp = gc.model.hparams;
    const int64_t   T = x->ne[1], hd = hp.head_dim, nh = hp.n_head, nkv = hp.n_head_kv;

    // A norm of the whole projection (MiniMax-M2) comes before the split into heads; the three
    // matmuls stay adjacent (one launch on CUDA).
    const bool whole_q = w.q_norm.data && w.q_norm.ne[0] != hd, whole_k = w.k_norm.data && w.k_norm.ne[0] != hd;
    Tensor *   q       = g.matmul(x, w.wq);
    Tensor *   k       = g.matmul(x, w.wk);
    Tensor *   v       = g.reshape(g.matmul(x, w.wv), {hd, nkv, T});
    if (whole_q) q = g.rms_norm(q, param(gc, w.q_norm, "q_norm"), hp.rms_eps, zc);
    if (whole_k) k = g.rms_norm(k, param(gc, w.k_norm, "k_norm"), hp.rms_eps, zc);
    k = g.reshape(k, {hd, nkv, T});
    Tensor * gate = nullptr;
    if (q_gated) {
        // q_proj rows are [q (hd) | gate (hd)] per head: split with strided views.
        Tensor * qg = g.reshape(q, {2 * hd, nh, T});
        gate        = g.view(qg, {hd, nh, T}, {4, qg->nb[1], qg->nb[2]}, size_t(hd) * 4);
        q           = g.view(qg, {hd, nh, T}, {4, qg->nb[1], qg->nb[2]}, 0);
    } else {
        q = g.reshape(q, {hd, nh, T});
    }

    // Each norm directly followed by its RoPE: backends may fuse the pair. Llama-style layers (an
    // EAGLE3 head) have no q/k norms.
    if (w.q_norm.data && !whole_q) q = g.rms_norm(q, param(gc, w.q_norm, "q_norm"), hp.rms_eps, zc);
    q = g.named(g.rope(q, gc.step.pos, int32_t(hp.n_rot), hp.rope_theta), "q_rope", il);
    if (w.k_norm.data && !whole_k) k = g.rms_norm(k, param(gc, w.k_norm, "k_norm"), hp.rms_eps, zc);
    k = g.named(g.rope(k, gc.step.pos, int32_t(hp.n_rot), hp.rope_theta), "k_rope", il);

    Tensor * o = g.attention(q, k, v, gc.memory.k_cache(g, il), gc.memory.v_cache(g, il), gc.step,
                             1.0f / std::sqrt(float(hd)));
    g.named(o, "attn", il);
    if (gate) o = g.mul_sigmoid(o, g.reshape(g.cont(gate), {hd * nh, T}));
    return g.named(g.matmul(o, w.wo), "attn_out", il);
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
