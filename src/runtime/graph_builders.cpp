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

namespace {

// The whole model's hyper-parameters (a split model's rank has its part of them in model.hparams).
const HParams & whole(const ModelLoader & ml, const HParams & hp) { return ml.shard().split() ? ml.shard().full : hp; }

// The part [rank * n, (rank + 1) * n) of a width split evenly over the ranks (n: the rank's).
Range even_part(const Shard & s, int64_t n) { return {s.rank * n, (s.rank + 1) * n}; }

// Whether one launch's kernels can take both weights through one expert table: the same format,
// shape and quantization layout (the tables' entries differ only in their pointers and scales).
bool same_layout(const QWeight & a, const QWeight & b) {
    return a.n > 0 && a.format == b.format && a.n == b.n && a.k == b.k && a.group_size == b.group_size && a.n_groups == b.n_groups &&
           a.zero_offset == b.zero_offset && a.scale_type == b.scale_type && (a.zeros == nullptr) == (b.zeros == nullptr) &&
           (a.g_idx == nullptr) == (b.g_idx == nullptr) && a.block_n == b.block_n && a.block_k == b.block_k;
}

}  // namespace

AttentionWeights load_attention(ModelLoader & ml, const HParams & hp, const std::string & p, int64_t in, int64_t q_per_head, QkNormScope qk_norm,
                                uint64_t * bytes) {
    // Split over ranks: whole heads, q rows (o columns) of the rank's query heads, k / v rows of its
    // KV heads (replicas where the ranks outnumber them).
    const Shard &   s  = ml.shard();
    const HParams & f  = whole(ml, hp);
    const int64_t   hd = hp.head_dim;
    const Range     qh = s.units(f.n_head, "attention heads"), kvh = s.units(f.n_head_kv, "key-value heads");
    const auto      span = [&](Range u, int64_t w) { return s.split() ? Range{u.begin * w, u.end * w} : Range{}; };
    const auto      rows = [&](Range u, int64_t w) { return s.split() ? Cut::rows(span(u, w)) : Cut{}; };
    AttentionWeights w;
    w.wq = ml.linear(p + ".q_proj", q_per_head * f.n_head * hd, in, bytes, rows(qh, q_per_head * hd));
    w.wk = ml.linear(p + ".k_proj", f.n_head_kv * hd, in, bytes, rows(kvh, hd));
    w.wv = ml.linear(p + ".v_proj", f.n_head_kv * hd, in, bytes, rows(kvh, hd));
    w.wo = ml.linear(p + ".o_proj", f.n_embd, f.n_head * hd, bytes, s.split() ? Cut::cols(span(qh, hd)) : Cut{});
    if (qk_norm == QkNormScope::PerHead) {
        w.q_norm = ml.param(p + ".q_norm.weight", {hd}, bytes);
        w.k_norm = ml.param(p + ".k_norm.weight", {hd}, bytes);
    } else if (qk_norm == QkNormScope::WholeProjection) {
        w.whole_norms = true;
        w.q_norm = ml.param(p + ".q_norm.weight", {f.n_head * hd}, bytes, rows(qh, hd));
        w.k_norm = ml.param(p + ".k_norm.weight", {f.n_head_kv * hd}, bytes, rows(kvh, hd));
    }
    return w;
}

MlpWeights load_mlp(ModelLoader & ml, const std::string & p, int64_t n_ff, int64_t n_embd, uint64_t * bytes) {
    // Split over ranks: n_ff is the rank's part; gate / up keep its rows, down its columns.
    const Shard & s    = ml.shard();
    const int64_t full = n_ff * s.size;
    MlpWeights    w;
    w.gate = ml.linear(p + ".gate_proj", full, n_embd, bytes, s.split() ? Cut::rows(even_part(s, n_ff)) : Cut{});
    w.up   = ml.linear(p + ".up_proj", full, n_embd, bytes, s.split() ? Cut::rows(even_part(s, n_ff)) : Cut{});
    w.down = ml.linear(p + ".down_proj", n_embd, full, bytes, s.split() ? Cut::cols(even_part(s, n_ff)) : Cut{});
    return w;
}

MoeWeights load_moe(ModelLoader & ml, const HParams & hp, const std::string & p, uint64_t * bytes, const ExpertNames & names) {
    // Split over ranks: the router whole on every rank; tensor parallelism cuts every expert as a
    // MLP, expert parallelism keeps a range of whole experts (the others stay empty).
    const Shard & s      = ml.shard();
    const bool    cut    = s.split() && s.mode == SplitMode::Tensor;
    const int64_t nff    = hp.n_ff_expert, full = cut ? nff * s.size : nff;
    const Range   held   = s.experts(hp.n_expert);
    const Cut     rows   = cut ? Cut::rows(even_part(s, nff)) : Cut{};
    const Cut     cols   = cut ? Cut::cols(even_part(s, nff)) : Cut{};
    MoeWeights    w;
    w.router = ml.linear(p + ".gate", hp.n_expert, hp.n_embd, bytes);
    std::vector<LinearSpec> specs;
    for (int64_t e = held.begin; e < held.end; ++e) {
        const std::string x = p + ".experts." + std::to_string(e);
        specs.push_back({x + "." + names.gate, full, hp.n_embd, rows});
        specs.push_back({x + "." + names.up, full, hp.n_embd, rows});
        specs.push_back({x + "." + names.down, hp.n_embd, full, cols});
    }
    const std::vector<QWeight> experts = ml.linears(specs, bytes);  // resolved in parallel
    w.gate.resize(size_t(hp.n_expert));
    w.up.resize(size_t(hp.n_expert));
    w.down.resize(size_t(hp.n_expert));
    for (int64_t e = held.begin; e < held.end; ++e) {
        const size_t i = size_t(e - held.begin) * 3;
        w.gate[size_t(e)] = experts[i];
        w.up[size_t(e)]   = experts[i + 1];
        w.down[size_t(e)] = experts[i + 2];
    }
    if (hp.n_ff_shexp > 0) {
        w.shared      = load_mlp(ml, p + ".shared_expert", hp.n_ff_shexp, hp.n_embd, bytes);
        w.shared_gate = ml.linear(p + ".shared_expert_gate", 1, hp.n_embd, bytes);
        // Laid out as the routed experts (Qwen3-Next: both 512 wide, one format): the shared
        // expert joins the expert arrays as entry n_expert (MoeWeights::shared_slot).
        // (any expert this rank holds: expert parallelism leaves the others empty)
        const auto layout_of = [](const std::vector<QWeight> & set, const QWeight & shared) {
            const auto held = std::find_if(set.begin(), set.end(), [](const QWeight & q) { return q.n > 0; });
            return held != set.end() && same_layout(shared, *held);
        };
        if (layout_of(w.gate, w.shared.gate) && layout_of(w.up, w.shared.up) && layout_of(w.down, w.shared.down)) {
            w.gate.push_back(w.shared.gate);
            w.up.push_back(w.shared.up);
            w.down.push_back(w.shared.down);
            w.shared      = MlpWeights{};
            w.shared_slot = true;
        }
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

Tensor * reduce_ranks(GraphContext & gc, Tensor * partial) {
    return gc.model.shard.split() ? gc.graph.all_reduce(partial) : partial;
}

Tensor * build_norm(GraphContext & gc, Tensor * x, const Param & w, float eps, bool zero_centered, const char * name, int il) {
    return gc.graph.named(gc.graph.rms_norm(x, param(gc, w, name), eps, zero_centered), name, il);
}

Tensor * build_ffn(GraphContext & gc, Tensor * x, const QWeight & gate, const QWeight & up, const QWeight & down, int il) {
    Graph &  g = gc.graph;
    Tensor * g_x = g.matmul(x, gate);  // (in this order: the graph's node order does not depend on the compiler)
    Tensor * u_x = g.matmul(x, up);
    Tensor * h   = g.swiglu(g_x, u_x);
    return g.named(g.matmul(h, down), "ffn_out", il);
}

Tensor * build_moe(GraphContext & gc, Tensor * x, const MoeWeights & w, int il) {
    Graph &         g  = gc.graph;
    const HParams & hp = gc.model.hparams;
    const int64_t   T  = x->ne[1];
    // The shared expert first; its gate logit's matmul right before the router's (the CUDA backend
    // runs adjacent matmuls of one input as one launch); its output joins the routed experts' in
    // the combine.
    // A shared expert in the expert arrays (shared_slot) is slot k of the routed matmuls instead.
    Tensor * shared = nullptr, * shared_gate = nullptr;
    if (w.shared.gate.n) shared = build_ffn(gc, x, w.shared.gate, w.shared.up, w.shared.down, il);
    if (w.shared_gate.n) shared_gate = g.matmul(x, w.shared_gate);
    Tensor * logits = g.named(g.matmul(x, w.router), "router_logits", il);
    Tensor * bias   = w.choice_bias.data ? param(gc, w.choice_bias, "router_bias") : nullptr;
    const int32_t k = int32_t(hp.n_expert_used);
    Tensor * route  = g.moe_route(logits, k, hp.norm_topk_prob, hp.router_sigmoid ? RouterScore::Sigmoid : RouterScore::Softmax, bias,
                                  w.shared_slot);
    Tensor * ids    = g.moe_ids(route);
    Tensor * xe     = g.reshape(x, {x->ne[0], 1, T});  // one input row shared by the slots
    const int32_t ne = int32_t(w.gate.size());           // (n_expert, + 1 with the shared slot)
    Tensor * gate   = g.matmul_id(xe, w.gate.data(), ne, ids);
    Tensor * up     = g.matmul_id(xe, w.up.data(), ne, ids);
    Tensor * act    = g.swiglu(gate, up);                        // [n_ff_expert, slots, T]
    Tensor * down   = g.matmul_id(act, w.down.data(), ne, ids);  // [n_embd, slots, T]
    Tensor * routed = down;
    if (w.shared_slot) {
        routed = g.view(down, {down->ne[0], k, T}, {4, down->nb[1], down->nb[2]}, 0);
        shared = g.view(down, {down->ne[0], T}, {4, down->nb[2]}, size_t(k) * down->nb[1]);
    }
    return g.named(reduce_ranks(gc, g.moe_combine(routed, g.moe_weights(route), shared, shared_gate)), "moe_out", il);
}

namespace {

// RMSNorm over a whole projection of n_heads heads (MiniMax-M2's q / k norms). Split over ranks, each
// holds n_heads of the model's `heads_whole`: the rows' sums of squares are summed over the ranks, a
// replica of a head another rank holds first adding nothing.
Tensor * whole_norm(GraphContext & gc, Tensor * x, const Param & w, const char * name, int64_t n_heads, int64_t heads_whole, bool zc) {
    Graph &         g  = gc.graph;
    const HParams & hp = gc.model.hparams;
    const Shard &   s  = gc.model.shard;
    if (!s.split()) return g.rms_norm(x, param(gc, w, name), hp.rms_eps, zc);
    Tensor * sums = g.all_reduce(g.sum_sqr(x, s.duplicate_unit(heads_whole) ? 0.0f : 1.0f));
    return g.rms_norm_split(x, param(gc, w, name), sums, heads_whole * hp.head_dim, hp.rms_eps, zc);
}

}  // namespace

Tensor * build_attention(GraphContext & gc, Tensor * x, const AttentionWeights & w, int il, bool q_gated, bool zc) {
    Graph &         g  = gc.graph;
    const HParams & hp = gc.model.hparams;
    const int64_t   T = x->ne[1], hd = hp.head_dim, nh = hp.n_head, nkv = hp.n_head_kv;

    // The three matmuls stay adjacent (one launch on CUDA).
    const bool whole_q = w.q_norm.data && w.whole_norms, whole_k = w.k_norm.data && w.whole_norms;
    Tensor *   q       = g.matmul(x, w.wq);
    Tensor *   k       = g.matmul(x, w.wk);
    Tensor *   v       = g.reshape(g.matmul(x, w.wv), {hd, nkv, T});
    Tensor *   gate    = nullptr;
    if (q_gated) {
        // q_proj rows are [q (hd) | gate (hd)] per head: split with strided views (a norm of the
        // whole projection first: it covers the gates too).
        if (whole_q) q = whole_norm(gc, q, w.q_norm, "q_norm", hp.n_head, gc.model.shard.full.n_head, zc);
        Tensor * qg = g.reshape(q, {2 * hd, nh, T});
        gate        = g.view(qg, {hd, nh, T}, {4, qg->nb[1], qg->nb[2]}, size_t(hd) * 4);
        q           = g.view(qg, {hd, nh, T}, {4, qg->nb[1], qg->nb[2]}, 0);
    } else if (!whole_q) {
        q = g.reshape(q, {hd, nh, T});
    }
    if (!whole_k) k = g.reshape(k, {hd, nkv, T});

    // Each norm directly followed by its RoPE: backends may fuse the pair. A norm of the whole
    // projection (MiniMax-M2) comes before the split into heads. Llama-style layers (an EAGLE3 head)
    // have no q/k norms.
    if (whole_q && !q_gated) q = g.reshape(whole_norm(gc, q, w.q_norm, "q_norm", hp.n_head, gc.model.shard.full.n_head, zc), {hd, nh, T});
    else if (w.q_norm.data && !whole_q) q = g.rms_norm(q, param(gc, w.q_norm, "q_norm"), hp.rms_eps, zc);
    q = g.named(g.rope(q, gc.step.pos, int32_t(hp.n_rot), hp.rope_theta), "q_rope", il);
    if (whole_k) k = g.reshape(whole_norm(gc, k, w.k_norm, "k_norm", hp.n_head_kv, gc.model.shard.full.n_head_kv, zc), {hd, nkv, T});
    else if (w.k_norm.data) k = g.rms_norm(k, param(gc, w.k_norm, "k_norm"), hp.rms_eps, zc);
    k = g.named(g.rope(k, gc.step.pos, int32_t(hp.n_rot), hp.rope_theta), "k_rope", il);

    Tensor * o = g.attention(q, k, v, gc.memory.k_cache(g, il), gc.memory.v_cache(g, il), gc.step,
                             1.0f / std::sqrt(float(hd)));
    g.named(o, "attn", il);
    // The gate read in place (a strided view of the q projection): no copy launch.
    if (gate) o = g.reshape(g.mul_sigmoid(g.reshape(o, {hd, nh, T}), gate), {hd * nh, T});
    return g.named(reduce_ranks(gc, g.matmul(o, w.wo)), "attn_out", il);
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
