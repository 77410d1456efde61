// EAGLE3 draft heads (LlamaForCausalLMEagle3, as SpecForge trains them and vLLM / SGLang run them).
// The target's step outputs its "aux" hidden states (the outputs of the layers listed in
// eagle_aux_hidden_state_layer_ids, concatenated in that order) projected by the head's fc: that is
// the head's hidden input for a token whose hidden state the target computed. The head is one
// Llama decoder layer whose attention reads [input_layernorm(embed(token)) | hidden_norm(hidden)]
// (q/k/v take 2H inputs; no q/k norms), followed by its MLP; the final norm and the head's own
// lm_head give logits over a draft vocabulary, which d2t maps to target token ids (target = draft +
// d2t[draft]). Chained drafts feed the layer's pre-norm output back as the hidden input, without fc.
// The embedding is the target's unless the head has its own.
#include "graph/error.h"
#include "runtime/graph_builders.h"
#include "runtime/io/mapped_file.h"
#include "runtime/model_source.h"
#include "runtime/models/heads.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

namespace spark {

namespace {

using json = nlohmann::json;

class Eagle3Head final : public Architecture {
public:
    void load(Model &, ModelLoader &) override { fail(SPARK_ERR_INTERNAL, "EAGLE3 heads are loaded with load_eagle3_head"); }

    Tensor * build(GraphContext & gc) const override {
        const Model &        m  = gc.model;
        const HParams &      hp = m.hparams;
        const HeadWeights &  hw = *m.head;
        const LayerWeights & L  = m.layers[0];
        Graph &              g  = gc.graph;
        Tensor * e = g.rms_norm(g.get_rows(m.tok_embd, gc.tokens), param(gc, hw.norm_embd, "input_layernorm"), hp.rms_eps, false);
        Tensor * h = g.rms_norm(gc.hidden_in, param(gc, hw.norm_hidden, "hidden_norm"), hp.rms_eps, false);
        Tensor * x = g.add(build_attention(gc, g.concat(e, h), L, 0, false, false), gc.hidden_in);
        Tensor * n = build_norm(gc, x, L.ffn_norm, hp.rms_eps, false, "post_attention_layernorm", 0);
        // The pre-norm output of every row is the next chained step's hidden input.
        Tensor * prenorm = gc.captured = g.named(g.add(x, build_ffn(gc, n, L.ffn_gate, L.ffn_up, L.ffn_down, 0)), "eagle3_prenorm");
        Tensor * out     = prenorm;
        if (gc.out_ids->ne[0] != out->ne[1]) out = g.get_rows(out, gc.out_ids);
        out             = build_norm(gc, out, m.output_norm, hp.rms_eps, false, "norm", -1);
        Tensor * logits = g.named(g.matmul(out, m.output), "logits");
        g.mark_output(logits);
        return logits;
    }

    Tensor * greedy_tokens(GraphContext & gc, Tensor * logits) const override {
        Graph &        g    = gc.graph;
        Tensor *       best = g.argmax(logits);
        const Model &  m    = gc.model;
        if (!m.head->draft_to_target) return best;
        Tensor * table = g.external(DType::I32, {1, m.hparams.n_vocab}, const_cast<void *>(m.head->draft_to_target), "d2t");
        return g.reshape(g.get_rows(table, best), {best->ne[0]});
    }

    int64_t hidden_input_width(const Model & m) const override { return m.hparams.n_embd; }
    int64_t hidden_output_width(const Model & m) const override { return m.hparams.n_embd; }
};

const json * find(const json & j, const char * key) {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
}

int64_t positive(const json & j, const char * key, int64_t fallback) {
    const json * v = find(j, key);
    if (!v) {
        if (fallback > 0) return fallback;
        fail(SPARK_ERR_INVALID_FORMAT, "EAGLE3 config.json: missing '%s'", key);
    }
    if (!v->is_number_integer() || v->get<int64_t>() <= 0 || v->get<int64_t>() > (int64_t(1) << 24))
        fail(SPARK_ERR_INVALID_FORMAT, "EAGLE3 config.json: '%s' must be a positive integer", key);
    return v->get<int64_t>();
}

double number(const json & j, const char * key, double fallback) {
    const json * v = find(j, key);
    if (!v) return fallback;
    if (!v->is_number()) fail(SPARK_ERR_INVALID_FORMAT, "EAGLE3 config.json: '%s' must be a number", key);
    return v->get<double>();
}

// The head's hyper-parameters, checked against its target.
HParams parse(const json & j, const Model & target, std::vector<int32_t> & aux) {
    if (!j.is_object()) fail(SPARK_ERR_INVALID_FORMAT, "EAGLE3 config.json is not a JSON object");
    bool eagle3 = false;
    if (const json * a = find(j, "architectures"); a && a->is_array())
        for (const json & x : *a) eagle3 = eagle3 || (x.is_string() && x.get<std::string>().find("Eagle3") != std::string::npos);
    if (!eagle3) fail(SPARK_ERR_UNSUPPORTED, "not an EAGLE3 head: config.json 'architectures' names no *Eagle3* class (LlamaForCausalLMEagle3)");
    const HParams & t = target.hparams;
    HParams         hp;
    hp.arch        = "eagle3";
    hp.n_embd      = positive(j, "hidden_size", 0);
    hp.n_layer     = 1;
    hp.n_head      = positive(j, "num_attention_heads", 0);
    hp.n_head_kv   = positive(j, "num_key_value_heads", hp.n_head);
    hp.head_dim    = positive(j, "head_dim", hp.n_embd / hp.n_head);
    hp.n_ff        = positive(j, "intermediate_size", 0);
    hp.n_ctx_train = positive(j, "max_position_embeddings", 4096);
    hp.rms_eps     = float(number(j, "rms_norm_eps", 1e-6));
    hp.rope_theta  = float(number(j, "rope_theta", 10000.0));
    hp.n_rot       = hp.head_dim;
    hp.layer_kinds = {LayerKind::Attention};
    const int64_t vocab = positive(j, "vocab_size", 0);
    hp.n_vocab          = positive(j, "draft_vocab_size", vocab);
    hp.n_vocab_in       = vocab;
    if (positive(j, "num_hidden_layers", 1) != 1) fail(SPARK_ERR_UNSUPPORTED, "EAGLE3 head with %lld decoder layers (1 is supported)", (long long) positive(j, "num_hidden_layers", 1));
    if (hp.n_head % hp.n_head_kv || hp.head_dim % 2 || !(hp.rope_theta > 0.0f) || !(hp.rms_eps > 0.0f))
        fail(SPARK_ERR_INVALID_FORMAT, "EAGLE3 config.json: inconsistent attention shape, rope_theta or rms_norm_eps");
    if (const json * rs = find(j, "rope_scaling"))
        fail(SPARK_ERR_UNSUPPORTED, "EAGLE3 config.json: rope_scaling %s is not supported", rs->dump().c_str());
    if (vocab != t.n_vocab)
        fail(SPARK_ERR_INVALID_ARGUMENT, "the EAGLE3 head is for a vocabulary of %lld tokens, the target has %lld", (long long) vocab, (long long) t.n_vocab);
    if (hp.n_vocab > vocab) fail(SPARK_ERR_INVALID_FORMAT, "EAGLE3 config.json: draft_vocab_size %lld exceeds vocab_size %lld", (long long) hp.n_vocab, (long long) vocab);
    if (hp.n_embd != t.n_embd || positive(j, "target_hidden_size", hp.n_embd) != t.n_embd)
        fail(SPARK_ERR_INVALID_ARGUMENT, "the EAGLE3 head has hidden size %lld (target hidden size %lld), the target %lld", (long long) hp.n_embd,
             (long long) positive(j, "target_hidden_size", hp.n_embd), (long long) t.n_embd);
    // The aux layers: eagle_aux_hidden_state_layer_ids (outputs of those target layers). Without
    // them, the layers vLLM picks by default (its ids count layer inputs: 2, L/2, L-3 are the
    // outputs of layers 1, L/2 - 1, L-4).
    aux.clear();
    const json * ec = find(j, "eagle_config");
    if (const json * ids = ec ? find(*ec, "eagle_aux_hidden_state_layer_ids") : nullptr) {
        if (!ids->is_array() || ids->empty()) fail(SPARK_ERR_INVALID_FORMAT, "EAGLE3 config.json: eagle_aux_hidden_state_layer_ids must be a non-empty list");
        for (const json & x : *ids) {
            if (!x.is_number_integer()) fail(SPARK_ERR_INVALID_FORMAT, "EAGLE3 config.json: eagle_aux_hidden_state_layer_ids must hold integers");
            const int64_t il = x.get<int64_t>();
            if (il < 0 || il >= t.n_layer)
                fail(SPARK_ERR_INVALID_ARGUMENT, "the EAGLE3 head reads the output of layer %lld, but the target has layers 0 .. %lld", (long long) il,
                     (long long) t.n_layer - 1);
            aux.push_back(int32_t(il));
        }
    } else {
        if (t.n_layer < 4) fail(SPARK_ERR_INVALID_ARGUMENT, "the EAGLE3 head names no aux layers and the target has too few layers for the default");
        aux = {1, int32_t(t.n_layer / 2 - 1), int32_t(t.n_layer - 4)};
    }
    return hp;
}

}  // namespace

std::unique_ptr<Model> load_eagle3_head(const std::string & path, const Model & target, const spark_model_params & params) {
    ModelSource src = open_model_source(path);
    json        config;
    try {
        config = json::parse(src.config_json);
    } catch (const json::exception & e) {
        fail(SPARK_ERR_INVALID_FORMAT, "%s: config.json is not valid JSON: %s", path.c_str(), e.what());
    }
    auto head     = std::make_unique<Model>();
    auto hw       = std::make_unique<HeadWeights>();
    head->path    = path;
    head->hparams = parse(config, target, hw->aux_layers);
    head->quant   = parse_quant_config(config, json());
    head->source  = std::move(src.tensors);
    head->arch    = std::make_unique<Eagle3Head>();
    head->backend = target.backend;
    head->device  = target.device;
    head->layers.resize(1);

    const HParams &  hp = head->hparams;
    const int64_t    E = hp.n_embd, hd = hp.head_dim, n_aux = int64_t(hw->aux_layers.size());
    WeightResolver   resolver(*head->source, head->quant, head->host_store);
    CheckpointLoader loader(*head, resolver, params);
    ModelLoader &    ml = loader;
    auto             first = [&](std::initializer_list<const char *> names) -> std::string {
        for (const char * n : names)
            if (ml.has(n)) return n;
        return *names.begin();  // the error names the usual spelling
    };
    const std::string layer = first({"midlayer", "model.layers.0", "layers.0"});
    LayerWeights &    L     = head->layers[0];
    L.wq                    = ml.linear(layer + ".self_attn.q_proj", hp.n_head * hd, 2 * E);
    L.wk                    = ml.linear(layer + ".self_attn.k_proj", hp.n_head_kv * hd, 2 * E);
    L.wv                    = ml.linear(layer + ".self_attn.v_proj", hp.n_head_kv * hd, 2 * E);
    L.wo                    = ml.linear(layer + ".self_attn.o_proj", E, hp.n_head * hd);
    L.ffn_norm              = ml.param(layer + ".post_attention_layernorm.weight", {E});
    L.ffn_gate              = ml.linear(layer + ".mlp.gate_proj", hp.n_ff, E);
    L.ffn_up                = ml.linear(layer + ".mlp.up_proj", hp.n_ff, E);
    L.ffn_down              = ml.linear(layer + ".mlp.down_proj", E, hp.n_ff);
    hw->norm_embd           = ml.param(layer + ".input_layernorm.weight", {E});
    hw->norm_hidden         = ml.param(layer + ".hidden_norm.weight", {E});
    hw->fc                  = ml.linear(first({"fc", "model.fc"}), E, n_aux * target.hparams.n_embd);
    head->output_norm       = ml.param(first({"norm.weight", "model.norm.weight"}), {E});
    head->output            = ml.linear("lm_head", hp.n_vocab, E);
    const std::string embd  = first({"embed_tokens.weight", "model.embed_tokens.weight"});
    head->tok_embd          = ml.has(embd) ? ml.dense(embd, hp.n_vocab_in, E) : target.tok_embd;

    // d2t: target id = draft id + d2t[draft id]; absent when the draft vocabulary is the target's.
    if (const io::TensorInfo * d2t = head->source->find("d2t")) {
        if (d2t->dtype != DType::I64 || d2t->numel() != hp.n_vocab)
            fail(SPARK_ERR_SHAPE_MISMATCH, "%s: d2t must be I64 [%lld], not %s %s", path.c_str(), (long long) hp.n_vocab, dtype_name(d2t->dtype),
                 d2t->shape_str().c_str());
        std::vector<int32_t> map(size_t(hp.n_vocab));
        for (int64_t i = 0; i < hp.n_vocab; ++i) {
            int64_t off;
            std::memcpy(&off, d2t->data + i * 8, 8);
            const int64_t id = i + off;
            if (id < 0 || id >= hp.n_vocab_in)
                fail(SPARK_ERR_INVALID_FORMAT, "%s: d2t maps draft token %lld to %lld, outside the target vocabulary of %lld", path.c_str(), (long long) i,
                     (long long) id, (long long) hp.n_vocab_in);
            map[size_t(i)] = int32_t(id);
        }
        auto buf = head->backend->alloc(map.size() * 4);
        head->backend->upload(buf->data(), map.data(), map.size() * 4);
        hw->draft_to_target = buf->data();
        head->storage.push_back(std::move(buf));
    } else if (hp.n_vocab != hp.n_vocab_in) {
        fail(SPARK_ERR_MISSING_TENSOR, "%s: the draft vocabulary (%lld) is smaller than the target's (%lld) but there is no d2t map", path.c_str(),
             (long long) hp.n_vocab, (long long) hp.n_vocab_in);
    }
    head->head = std::move(hw);
    head->backend->synchronize();
    head->info.n_params = ml.n_params();
    return head;
}

}  // namespace spark
