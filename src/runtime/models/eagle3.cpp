// EAGLE3 draft heads (LlamaForCausalLMEagle3, as SpecForge trains them and vLLM / SGLang run them).
// The target's step outputs its "aux" hidden states (the outputs of the layers listed in
// eagle_aux_hidden_state_layer_ids, concatenated in that order) projected by the head's fc: that is
// the head's hidden input for a token whose hidden state the target computed. The head is one
// Llama decoder layer whose attention reads [input_layernorm(embed(token)) | hidden_norm(hidden)]
// (q/k/v take 2H inputs; no q/k norms), followed by its MLP; the final norm and the head's own
// lm_head give logits over a draft vocabulary, which d2t maps to target token ids (target = draft +
// d2t[draft]). Chained drafts feed the layer's pre-norm output back as the hidden input, without fc.
// The embedding is the target's unless the head has its own.
#include "common/error.h"
#include "io/config_fields.h"
#include "io/mapped_file.h"
#include "runtime/graph_builders.h"
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
    const char * model_type() const override { return "eagle3"; }  // (a head: not in architectures())
    void load(Model &, ModelLoader &) override { fail(SPARK_ERR_INTERNAL, "EAGLE3 heads are loaded with load_eagle3_head"); }

    Tensor * build(GraphContext & gc) const override {
        const Model &        m  = gc.model;
        const HParams &      hp = m.hparams;
        const HeadWeights &  hw = *m.head;
        const LayerWeights & L  = m.layers[0];
        Graph &              g  = gc.graph;
        Tensor * e = g.rms_norm(g.get_rows(m.tok_embd, gc.tokens), param(gc, hw.norm_embd, "input_layernorm"), hp.rms_eps, false);
        Tensor * h = g.rms_norm(gc.hidden_in, param(gc, hw.norm_hidden, "hidden_norm"), hp.rms_eps, false);
        Tensor * x = g.add(build_attention(gc, g.concat(e, h), L.attn, 0, false, false), gc.hidden_in);
        Tensor * n = build_norm(gc, x, L.ffn_norm, hp.rms_eps, false, "post_attention_layernorm", 0);
        // The pre-norm output of every row is the next chained step's hidden input.
        Tensor * prenorm = gc.captured = g.named(g.add(x, build_ffn(gc, n, L.mlp.gate, L.mlp.up, L.mlp.down, 0)), "eagle3_prenorm");
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

}  // namespace

// The head's hyper-parameters, checked against its target's.
HParams parse_eagle3_config(const json & j, const HParams & t, std::vector<int32_t> & aux, const std::string & origin) {
    using namespace config_limits;
    if (!j.is_object()) fail(SPARK_ERR_INVALID_FORMAT, "%s is not a JSON object", origin.c_str());
    const ConfigFields f(j, origin);
    bool eagle3 = false;
    if (const json * a = f.find("architectures"); a && a->is_array())
        for (const json & x : *a) eagle3 = eagle3 || (x.is_string() && x.get<std::string>().find("Eagle3") != std::string::npos);
    if (!eagle3)
        fail(SPARK_ERR_UNSUPPORTED, "%s: not an EAGLE3 head: 'architectures' names no *Eagle3* class (LlamaForCausalLMEagle3)", origin.c_str());
    HParams hp;
    hp.arch        = "eagle3";
    hp.n_embd      = f.integer("hidden_size", 0, 1, kMaxEmbd, true);
    hp.n_layer     = 1;
    hp.n_head      = f.integer("num_attention_heads", 0, 1, kMaxHeads, true);
    hp.n_head_kv   = f.integer("num_key_value_heads", hp.n_head, 1, kMaxHeads);
    hp.head_dim    = f.integer("head_dim", hp.n_embd / hp.n_head, 0, kMaxHeadDim);
    hp.n_ff        = f.integer("intermediate_size", 0, 1, kMaxFF, true);
    hp.n_ctx_train = f.integer("max_position_embeddings", 4096, 1, kMaxPositions);
    hp.rms_eps     = f.positive_float("rms_norm_eps", 1e-6, 1.0);
    hp.rope_theta  = f.positive_float("rope_theta", 10000.0, 1e15);
    hp.n_rot       = hp.head_dim;
    hp.layer_kinds = {LayerKind::Attention};
    const int64_t vocab = f.integer("vocab_size", 0, 1, kMaxVocab, true);
    hp.n_vocab          = f.integer("draft_vocab_size", vocab, 1, kMaxVocab);
    hp.n_vocab_in       = vocab;
    if (const int64_t n = f.integer("num_hidden_layers", 1, 1, kMaxLayers); n != 1)
        fail(SPARK_ERR_UNSUPPORTED, "%s: EAGLE3 head with %lld decoder layers (1 is supported)", origin.c_str(), (long long) n);
    if (hp.n_head % hp.n_head_kv)
        f.bad("num_attention_heads", "(%lld) is not a multiple of num_key_value_heads (%lld)", (long long) hp.n_head, (long long) hp.n_head_kv);
    if (hp.head_dim == 0 || hp.head_dim % 2) f.bad("head_dim", "must be even and positive (got %lld)", (long long) hp.head_dim);
    if (const json * rs = f.find("rope_scaling"))
        fail(SPARK_ERR_UNSUPPORTED, "%s: rope_scaling %s is not supported", origin.c_str(), ConfigFields::shown(*rs).c_str());
    if (vocab != t.n_vocab)
        fail(SPARK_ERR_INVALID_ARGUMENT, "the EAGLE3 head is for a vocabulary of %lld tokens, the target has %lld", (long long) vocab, (long long) t.n_vocab);
    if (hp.n_vocab > vocab) f.bad("draft_vocab_size", "= %lld exceeds vocab_size %lld", (long long) hp.n_vocab, (long long) vocab);
    const int64_t target_hidden = f.integer("target_hidden_size", hp.n_embd, 1, kMaxEmbd);
    if (hp.n_embd != t.n_embd || target_hidden != t.n_embd)
        fail(SPARK_ERR_INVALID_ARGUMENT, "the EAGLE3 head has hidden size %lld (target hidden size %lld), the target %lld", (long long) hp.n_embd,
             (long long) target_hidden, (long long) t.n_embd);
    // The aux layers: eagle_aux_hidden_state_layer_ids (outputs of those target layers). Without
    // them, the layers vLLM picks by default (its ids count layer inputs: 2, L/2, L-3 are the
    // outputs of layers 1, L/2 - 1, L-4).
    aux.clear();
    const json * ec = f.find("eagle_config");
    if (ec && !ec->is_object()) f.bad("eagle_config", "must be an object");
    const ConfigFields e(ec ? *ec : j, origin, "eagle_config.");
    if (const json * ids = ec ? e.find("eagle_aux_hidden_state_layer_ids") : nullptr) {
        if (!ids->is_array() || ids->empty() || ids->size() > size_t(kMaxLayers)) e.bad("eagle_aux_hidden_state_layer_ids", "must be a non-empty list of layers");
        for (const json & x : *ids) {
            if (!x.is_number_integer() || (x.is_number_unsigned() && x.get<uint64_t>() > uint64_t(INT64_MAX)))
                e.bad("eagle_aux_hidden_state_layer_ids", "must hold layer indices, not %s", ConfigFields::shown(x).c_str());
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

std::unique_ptr<Model> load_eagle3_head(const std::string & path, const Model & target, const spark_model_params & params) {
    ModelSource src = open_model_source(path);
    json        config;
    try {
        config = json::parse(src.config_json);
    } catch (const json::exception & e) {
        fail(SPARK_ERR_INVALID_FORMAT, "%s: not valid JSON: %s", src.config_origin.c_str(), e.what());
    }
    auto head     = std::make_unique<Model>();
    auto hw       = std::make_unique<HeadWeights>();
    head->path    = path;
    head->hparams = parse_eagle3_config(config, target.hparams, hw->aux_layers, src.config_origin);
    head->quant   = parse_quant_config(config, json(), src.config_origin);
    head->source  = std::move(src.tensors);
    head->arch    = std::make_unique<Eagle3Head>();
    head->backend = target.backend;
    head->device  = target.device;
    head->layers.resize(1);

    const HParams &  hp = head->hparams;
    const int64_t    E = hp.n_embd, n_aux = int64_t(hw->aux_layers.size());
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
    L.attn                  = load_attention(ml, hp, layer + ".self_attn", 2 * E, 1, QkNormScope::None, nullptr);
    L.ffn_norm              = ml.param(layer + ".post_attention_layernorm.weight", {E});
    L.mlp                   = load_mlp(ml, layer + ".mlp", hp.n_ff, E, nullptr);
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
            int64_t id = -1;
            if (__builtin_add_overflow(i, off, &id) || id < 0 || id >= hp.n_vocab_in)
                fail(SPARK_ERR_INVALID_FORMAT, "%s: d2t maps draft token %lld to %lld + %lld, outside the target vocabulary of %lld", path.c_str(),
                     (long long) i, (long long) i, (long long) off, (long long) hp.n_vocab_in);
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
    loader.finish();
    head->head = std::move(hw);
    head->backend->synchronize();
    head->info.n_params = ml.n_params();
    return head;
}

}  // namespace spark
