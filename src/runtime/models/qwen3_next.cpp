// Qwen3-Next (Qwen3NextForCausalLM, e.g. Qwen3-Next-80B-A3B): a hybrid of Gated DeltaNet
// (linear attention with a recurrent state) and gated softmax attention, every layer followed by a
// MoE with a sigmoid-gated shared expert. All RMSNorms are zero-centred, (1 + w), except the gated
// norm inside linear attention. Reference: transformers models/qwen3_next/modular_qwen3_next.py
// (formats.md 7.3).
#include "common/error.h"
#include "runtime/graph_builders.h"
#include "runtime/memory/memory.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace spark {

namespace {

// Gated DeltaNet "<p>" (a layer's linear_attn): the fused projections, the causal conv over
// [q | k | v], the decay and step-bias parameters and the gated norm.
// Split over ranks, a rank keeps whole value heads and the key heads they read (replicas where
// the ranks outnumber the key heads): of each key head's [q | k | v | z] rows of in_proj_qkvz and
// [b | a] rows of in_proj_ba, its q and k and the parts of its value heads; the conv channels of
// those q, k, v; out_proj's columns of its value heads.
LinearAttentionWeights load_linear_attention(ModelLoader & ml, const HParams & hp, const std::string & p, uint64_t * bytes) {
    const Shard &   s  = ml.shard();
    const HParams & f  = s.split() ? s.full : hp;
    const int64_t   nk = f.ssm_n_k_heads, nv = f.ssm_n_v_heads, dk = f.ssm_k_dim, dv = f.ssm_v_dim, E = f.n_embd, r = nv / nk;
    const int64_t   key_dim = nk * dk, value_dim = nv * dv, conv_dim = 2 * key_dim + value_dim;
    LinearAttentionWeights w;
    Cut qkvz, ba, conv, heads, out;
    if (s.split()) {
        const Range kh = s.units(nk, "linear-attention key heads"), vh = s.units(nv, "linear-attention value heads");
        qkvz.dim = ba.dim = Cut::Dim::Rows;
        for (int64_t g = kh.begin; g < kh.end; ++g) {
            // this key head's value heads [j0, j1) of its r
            const int64_t j0 = std::max(vh.begin, g * r) - g * r, j1 = std::min(vh.end, (g + 1) * r) - g * r;
            const int64_t at = g * (2 * dk + 2 * r * dv);
            qkvz.ranges.push_back({at, at + 2 * dk});
            qkvz.ranges.push_back({at + 2 * dk + j0 * dv, at + 2 * dk + j1 * dv});
            qkvz.ranges.push_back({at + 2 * dk + (r + j0) * dv, at + 2 * dk + (r + j1) * dv});
            ba.ranges.push_back({g * 2 * r + j0, g * 2 * r + j1});
            ba.ranges.push_back({g * 2 * r + r + j0, g * 2 * r + r + j1});
        }
        conv  = Cut::parts({{kh.begin * dk, kh.end * dk}, {key_dim + kh.begin * dk, key_dim + kh.end * dk},
                            {2 * key_dim + vh.begin * dv, 2 * key_dim + vh.end * dv}});
        heads = Cut::rows(vh);
        out   = Cut::cols({vh.begin * dv, vh.end * dv});
    }
    w.in_proj_qkvz = ml.linear(p + ".in_proj_qkvz", 2 * key_dim + 2 * value_dim, E, bytes, qkvz);
    w.in_proj_ba   = ml.linear(p + ".in_proj_ba", 2 * nv, E, bytes, ba);
    w.out_proj     = ml.linear(p + ".out_proj", E, value_dim, bytes, out);
    w.conv         = ml.param(p + ".conv1d.weight", {conv_dim, 1, f.ssm_conv_kernel}, bytes, conv);
    w.A_log        = ml.param(p + ".A_log", {nv}, bytes, heads);
    w.dt_bias      = ml.param(p + ".dt_bias", {nv}, bytes, heads);
    w.norm         = ml.param(p + ".norm.weight", {dv}, bytes);
    return w;
}

// One decoder layer's weights ("model.layers.N" or the MTP head's "mtp.layers.0").
void load_layer(Model & m, ModelLoader & ml, const std::string & p, LayerWeights & L, LayerKind kind, bool moe) {
    const HParams & hp = m.hparams;
    const int64_t   E  = hp.n_embd;
    uint64_t *      a  = &m.info.weight_bytes_attention;
    L.attn_norm        = ml.param(p + ".input_layernorm.weight", {E}, a);
    if (kind == LayerKind::Attention) L.attn = load_attention(ml, hp, p + ".self_attn", E, 2, QkNormScope::PerHead, a);  // q_proj: [q | gate] per head
    else L.linear_attn = load_linear_attention(ml, hp, p + ".linear_attn", a);
    uint64_t * f = &m.info.weight_bytes_ffn;
    L.ffn_norm   = ml.param(p + ".post_attention_layernorm.weight", {E}, f);
    if (moe) {
        L.moe = load_moe(ml, hp, p + ".mlp", f);
    } else {
        if (hp.n_ff == 0) fail(SPARK_ERR_INVALID_FORMAT, "config.json: %s has a dense MLP but intermediate_size is missing", p.c_str());
        L.mlp = load_mlp(ml, p + ".mlp", hp.n_ff, E, f);
    }
}

// MoE + sigmoid-gated shared expert (or a dense MLP in mlp_only layers).
Tensor * build_ffn_block(GraphContext & gc, Tensor * h, const LayerWeights & L, int il) {
    if (!gc.model.hparams.is_moe_layer(il)) return reduce_ranks(gc, build_ffn(gc, h, L.mlp.gate, L.mlp.up, L.mlp.down, il));
    return gc.graph.named(build_moe(gc, h, L.moe, il), "ffn_out", il);
}

// The multi-token-prediction head (vLLM's Qwen3NextMTP): for the token at position t + 1 and the
// target's final normed hidden state at t, h = fc([norm_e(embed(token)) | norm_h(hidden)]), one
// full-attention MoE decoder layer (its own KV cache) and mtp.norm give the hidden state whose
// logits (the target's lm_head) predict the token at t + 2. Chained drafts feed that normed hidden
// state back (k > 1 applies the one layer repeatedly, as vLLM does). All norms are zero-centred.
class Qwen3NextMtp final : public Architecture {
public:
    const char * model_type() const override { return "qwen3_next_mtp"; }  // (a head: not in architectures())
    void load(Model &, ModelLoader &) override { fail(SPARK_ERR_INTERNAL, "the MTP head is loaded with its target"); }

    Tensor * build(GraphContext & gc) const override {
        const Model &       m  = gc.model;
        const HParams &     hp = m.hparams;
        const HeadWeights & hw = *m.head;
        Graph &             g  = gc.graph;
        Tensor * e = g.rms_norm(g.get_rows(m.tok_embd, gc.tokens), param(gc, hw.norm_embd, "mtp_norm_embd"), hp.rms_eps, true);
        Tensor * h = g.rms_norm(gc.hidden_in, param(gc, hw.norm_hidden, "mtp_norm_hidden"), hp.rms_eps, true);
        Tensor * x = g.named(g.matmul(g.concat(e, h), hw.fc), "mtp_fc");
        const LayerWeights & L = m.layers[0];
        Tensor * n = build_norm(gc, x, L.attn_norm, hp.rms_eps, true, "attn_norm", 0);
        x          = g.add(x, build_attention(gc, n, L.attn, 0, true, true));
        n          = build_norm(gc, x, L.ffn_norm, hp.rms_eps, true, "ffn_norm", 0);
        x          = g.add(x, build_ffn_block(gc, n, L, 0));
        // The normed output of every row is the next chained step's hidden input.
        Tensor * out = gc.captured = build_norm(gc, x, m.output_norm, hp.rms_eps, true, "mtp_norm", -1);
        if (gc.out_ids->ne[0] != out->ne[1]) out = g.get_rows(out, gc.out_ids);
        Tensor * logits = g.named(g.matmul(out, m.output), "logits");
        g.mark_output(logits);
        return logits;
    }
    int64_t hidden_input_width(const Model & m) const override { return m.hparams.n_embd; }
    int64_t hidden_output_width(const Model & m) const override { return m.hparams.n_embd; }
};

// Loads the MTP head of a Qwen3-Next checkpoint (mtp.*) as a model of one attention layer that
// shares the target's backend, embedding and lm_head.
void load_mtp_head(Model & m, ModelLoader & ml) {
    const HParams & hp   = m.hparams;
    auto            head = std::make_unique<Model>();
    head->hparams               = hp;
    head->hparams.n_layer       = 1;
    head->hparams.layer_kinds   = {LayerKind::Attention};
    head->hparams.n_mtp_layers  = 0;
    head->hparams.mlp_only_layers.clear();
    head->hparams.sparse_step   = 1;
    head->shard                 = m.shard;  // split as the target: its layer loads through the same cuts
    const bool moe              = ml.has("mtp.layers.0.mlp.gate");
    if (!moe) head->hparams.n_expert = 0;
    head->path     = m.path + " (MTP head)";
    head->arch     = std::make_unique<Qwen3NextMtp>();
    head->backend  = m.backend;
    head->device   = m.device;
    head->tok_embd = m.tok_embd;
    head->output   = m.output;
    // Weights are stored with the target (which outlives its head) and count towards its bytes;
    // the layer has the target's dimensions.
    const int64_t E = hp.n_embd;
    auto          hw = std::make_unique<HeadWeights>();
    hw->fc           = ml.linear("mtp.fc", E, 2 * E, &m.info.weight_bytes_attention);
    hw->norm_embd    = ml.param("mtp.pre_fc_norm_embedding.weight", {E}, &m.info.weight_bytes_attention);
    hw->norm_hidden  = ml.param("mtp.pre_fc_norm_hidden.weight", {E}, &m.info.weight_bytes_attention);
    head->head       = std::move(hw);
    head->layers.resize(1);
    load_layer(m, ml, "mtp.layers.0", head->layers[0], LayerKind::Attention, moe);
    head->output_norm = ml.param("mtp.norm.weight", {E}, &m.info.weight_bytes_output);
    m.mtp             = std::move(head);
}

bool ends_with(const std::string & s, const char * suffix) {
    const size_t n = std::strlen(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

class Qwen3Next final : public Architecture {
public:
    const char * model_type() const override { return "qwen3_next"; }
    const char * hf_class() const override { return "Qwen3NextForCausalLM"; }
    const char * file_arch() const override { return "qwen3next"; }
    bool         has_mtp_head() const override { return true; }

    void parse_hparams(const ConfigFields & f, HParams & hp) const override {
        using namespace config_limits;
        parse_rotary(f, hp, 0.25);
        parse_moe_fields(f, hp, true);
        hp.n_ff_shexp      = f.integer("shared_expert_intermediate_size", 0, 0, kMaxFF);
        hp.ssm_conv_kernel = f.integer("linear_conv_kernel_dim", 4, 2, kMaxConvKernel);
        hp.ssm_n_k_heads   = f.integer("linear_num_key_heads", 0, 1, kMaxHeads, true);
        hp.ssm_n_v_heads   = f.integer("linear_num_value_heads", 0, 1, kMaxHeads, true);
        hp.ssm_k_dim       = f.integer("linear_key_head_dim", 0, 1, kMaxHeadDim, true);
        hp.ssm_v_dim       = f.integer("linear_value_head_dim", 0, 1, kMaxHeadDim, true);
        hp.n_mtp_layers    = f.integer("num_nextn_predict_layers", 0, 0, kMaxLayers);
        if (hp.ssm_n_v_heads % hp.ssm_n_k_heads != 0)
            f.bad("linear_num_value_heads", "(%lld) is not a multiple of linear_num_key_heads (%lld)", (long long) hp.ssm_n_v_heads,
                  (long long) hp.ssm_n_k_heads);
        if (const nlohmann::json * lt = f.find("layer_types")) {
            if (!lt->is_array() || int64_t(lt->size()) != hp.n_layer) f.bad("layer_types", "must list one type per layer (%lld)", (long long) hp.n_layer);
            for (size_t i = 0; i < lt->size(); ++i) {
                const nlohmann::json & v = (*lt)[i];
                const std::string      s = v.is_string() ? v.get<std::string>() : ConfigFields::shown(v);
                if (s == "linear_attention") hp.layer_kinds[i] = LayerKind::LinearAttention;
                else if (s == "full_attention") hp.layer_kinds[i] = LayerKind::Attention;
                else fail(SPARK_ERR_UNSUPPORTED, "%s: layer type '%s' is not supported", f.origin().c_str(), s.c_str());
            }
        } else {
            const int64_t interval = f.integer("full_attention_interval", 4, 1, INT64_MAX);
            for (int64_t i = 0; i < hp.n_layer; ++i)
                hp.layer_kinds[size_t(i)] = (i + 1) % interval == 0 ? LayerKind::Attention : LayerKind::LinearAttention;
        }
        // Sized here once, so that an overflow is reported as a bad config.json.
        (void) hp.conv_state_floats();
        (void) hp.ssm_state_floats();
    }

    // llama.cpp's keys for the linear attention and the MTP head (docs/FORMAT.md).
    void file_hparams(const HParams & hp, const std::function<void(const char *, int64_t)> & put) const override {
        put("ssm.conv_kernel", hp.ssm_conv_kernel);
        put("ssm.state_size", hp.ssm_k_dim);
        put("ssm.group_count", hp.ssm_n_k_heads);
        put("ssm.time_step_rank", hp.ssm_n_v_heads);
        put("ssm.inner_size", hp.ssm_v_dim * hp.ssm_n_v_heads);
        put("nextn_predict_layers", hp.n_mtp_layers);
    }

    void hf_config_defaults(const HParams & hp, nlohmann::json & c) const override {
        nlohmann::json layer_types = nlohmann::json::array();
        for (LayerKind k : hp.layer_kinds) layer_types.push_back(k == LayerKind::Attention ? "full_attention" : "linear_attention");
        c["decoder_sparse_step"]     = 1;
        c["mlp_only_layers"]         = nlohmann::json::array();
        c["norm_topk_prob"]          = true;  // the class's (and spark's) default
        c["output_router_logits"]    = false;
        c["router_aux_loss_coef"]    = 0.001;
        c["full_attention_interval"] = 4;
        c["layer_types"]             = layer_types;
        c["linear_conv_kernel_dim"]  = 4;
        c["partial_rotary_factor"]   = 0.25;
    }

    std::vector<std::pair<std::string, nlohmann::json>> synthetic_shapes() const override {
        return {
            {"qwen3-next-80b-a3b",
             {{"model_type", "qwen3_next"}, {"vocab_size", 151936}, {"hidden_size", 2048}, {"intermediate_size", 5120}, {"num_hidden_layers", 48},
              {"num_attention_heads", 16}, {"num_key_value_heads", 2}, {"head_dim", 256}, {"max_position_embeddings", 262144},
              {"rms_norm_eps", 1e-6}, {"rope_theta", 10000000.0}, {"tie_word_embeddings", false}, {"partial_rotary_factor", 0.25},
              {"full_attention_interval", 4}, {"linear_conv_kernel_dim", 4}, {"linear_key_head_dim", 128}, {"linear_value_head_dim", 128},
              {"linear_num_key_heads", 16}, {"linear_num_value_heads", 32}, {"num_experts", 512}, {"num_experts_per_tok", 10},
              {"moe_intermediate_size", 512}, {"shared_expert_intermediate_size", 512}, {"norm_topk_prob", true}, {"decoder_sparse_step", 1},
              {"mlp_only_layers", nlohmann::json::array()}, {"num_nextn_predict_layers", 1}}},
            {"tiny-qwen3-next",
             {{"model_type", "qwen3_next"}, {"vocab_size", 512}, {"hidden_size", 128}, {"intermediate_size", 256}, {"num_hidden_layers", 4},
              {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 64}, {"rope_theta", 1000000.0}, {"full_attention_interval", 2},
              {"linear_key_head_dim", 64}, {"linear_value_head_dim", 64}, {"linear_num_key_heads", 1}, {"linear_num_value_heads", 2},
              {"num_experts", 8}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 128}, {"shared_expert_intermediate_size", 128},
              {"num_nextn_predict_layers", 1}}},
        };
    }

    // Its norms are zero-centred (1 + w: values around 0) except the gated norm inside linear
    // attention; the linear attention's decay, step bias and conv have their own ranges.
    SyntheticTensor::Init synthetic_param_init(const std::string & name) const override {
        using Init = SyntheticTensor::Init;
        if (ends_with(name, "A_log")) return Init::ALog;
        if (ends_with(name, "dt_bias")) return Init::DtBias;
        if (ends_with(name, "conv1d.weight")) return Init::Conv;
        return ends_with(name, "linear_attn.norm.weight") ? Init::Norm : Init::NormZeroCentred;
    }

    void load(Model & m, ModelLoader & ml) override {
        const HParams & hp = m.hparams;
        load_embedding(m, ml);
        for (int64_t il = 0; il < hp.n_layer; ++il)
            load_layer(m, ml, "model.layers." + std::to_string(il), m.layers[size_t(il)], hp.layer_kinds[size_t(il)], hp.is_moe_layer(il));
        load_output(m, ml);
        // Checkpoints that keep the MTP head have mtp.* tensors (many quantized ones drop them).
        if (hp.n_mtp_layers > 0 && ml.has("mtp.fc")) load_mtp_head(m, ml);
    }

    Tensor * build(GraphContext & gc) const override {
        const Model &   m  = gc.model;
        const HParams & hp = m.hparams;
        Graph &         g  = gc.graph;
        Tensor * x = g.named(g.get_rows(m.tok_embd, gc.tokens), "embd");
        for (int64_t il = 0; il < hp.n_layer; ++il) {
            const LayerWeights & L = m.layers[size_t(il)];
            Tensor * h = build_norm(gc, x, L.attn_norm, hp.rms_eps, true, "attn_norm", int(il));
            h = hp.layer_kinds[size_t(il)] == LayerKind::Attention ? build_attention(gc, h, L.attn, int(il), true, true)
                                                                   : build_gated_delta_net(gc, h, L.linear_attn, int(il));
            x = g.add(x, h);
            h = build_norm(gc, x, L.ffn_norm, hp.rms_eps, true, "ffn_norm", int(il));
            x = g.named(g.add(x, build_ffn_block(gc, h, L, int(il))), "l_out", int(il));
            capture_layer(gc, int(il), x);
        }
        return build_output(gc, x, true);
    }

private:
    // Gated DeltaNet layer (formats.md 7.3.2-7.3.3).
    static Tensor * build_gated_delta_net(GraphContext & gc, Tensor * x, const LinearAttentionWeights & w, int il) {
        Graph &         g  = gc.graph;
        const HParams & hp = gc.model.hparams;
        const int64_t   T  = x->ne[1];
        const int64_t   nk = hp.ssm_n_k_heads, nv = hp.ssm_n_v_heads, dk = hp.ssm_k_dim, dv = hp.ssm_v_dim;
        const int64_t   r = nv / nk;  // value heads per key head
        const size_t    f = sizeof(float);

        // in_proj_qkvz rows come grouped per key head: [q (dk) | k (dk) | v (r*dv) | z (r*dv)]; the
        // ops below read them in place (strided views), so no copy makes them contiguous.
        Tensor *      qkvz  = g.matmul(x, w.in_proj_qkvz);
        const int64_t group = 2 * dk + 2 * r * dv;
        const size_t  gb = size_t(group) * f, tb = size_t(nk) * gb;
        Tensor * q = g.view(qkvz, {dk, nk, T}, {f, gb, tb}, 0);
        Tensor * k = g.view(qkvz, {dk, nk, T}, {f, gb, tb}, size_t(dk) * f);
        Tensor * v = g.view(qkvz, {r * dv, nk, T}, {f, gb, tb}, size_t(2 * dk) * f);
        Tensor * z = g.view(qkvz, {dv, r, nk, T}, {f, size_t(dv) * f, gb, tb}, size_t(2 * dk + r * dv) * f);
        // in_proj_ba rows per key head: [b (r) | a (r)].
        Tensor *     ba  = g.matmul(x, w.in_proj_ba);
        const size_t bab = size_t(2 * r) * f;
        Tensor *     b   = g.view(ba, {r, nk, T}, {f, bab, size_t(nk) * bab}, 0);
        Tensor *     a   = g.view(ba, {r, nk, T}, {f, bab, size_t(nk) * bab}, size_t(r) * f);

        // Causal conv over the channels [q | k | v] (silu applied), with the rolling conv state.
        Tensor * conv = g.named(g.conv1d_ssm({q, k, v}, param(gc, w.conv, "ssm_conv"), gc.memory.conv_state(g, il), gc.step), "ssm_conv_out", il);
        const size_t cb = size_t(conv->ne[0]) * f;
        q = g.view(conv, {dk, nk, T}, {f, size_t(dk) * f, cb}, 0);
        k = g.view(conv, {dk, nk, T}, {f, size_t(dk) * f, cb}, size_t(nk * dk) * f);
        v = g.view(conv, {dv, nv, T}, {f, size_t(dv) * f, cb}, size_t(2 * nk * dk) * f);

        // q and k are l2-normalised and q scaled inside the op (use_qk_l2norm_in_kernel).
        Tensor * o = g.gated_delta(q, k, v, a, b, param(gc, w.A_log, "ssm_A_log"), param(gc, w.dt_bias, "ssm_dt_bias"),
                                   gc.memory.ssm_state(g, il), gc.step, {true, 1e-6f, 1.0f / std::sqrt(float(dk))});
        g.named(o, "ssm_out", il);

        // Gated RMSNorm per value head: rmsnorm(o) * w * silu(z) (plain weight, norm before gate).
        Tensor * gated = g.rms_norm_gated(o, param(gc, w.norm, "ssm_norm"), z, hp.rms_eps);  // [dv, nv, T]
        Tensor * out   = g.matmul(g.reshape(gated, {nv * dv, T}), w.out_proj);
        // A replica of a value head another rank holds first adds nothing to the ranks' sum.
        const Shard & s = gc.model.shard;
        if (s.split() && s.duplicate_unit(s.full.ssm_n_v_heads)) out = g.scale(out, 0.0f);
        return g.named(reduce_ranks(gc, out), "linear_attn_out", il);
    }
};

}  // namespace

std::unique_ptr<Architecture> make_qwen3_next() { return std::make_unique<Qwen3Next>(); }

}  // namespace spark
