// Qwen3-MoE (Qwen3MoeForCausalLM, e.g. Qwen3-Coder-30B-A3B): Qwen3 with a routed mixture of
// experts (softmax router, top-k, optional renormalisation) in the layers chosen by
// decoder_sparse_step / mlp_only_layers, and Qwen3's dense MLP elsewhere.
#include "common/error.h"
#include "runtime/graph_builders.h"
#include "runtime/models/qwen3.h"

namespace spark {

// The router and routed experts of one layer (shared with Qwen3-Next).
void load_experts(Model & m, ModelLoader & ml, const std::string & mlp, LayerWeights & L) {
    const HParams & hp = m.hparams;
    uint64_t *      f  = &m.info.weight_bytes_ffn;
    L.router           = ml.linear(mlp + ".gate", hp.n_expert, hp.n_embd, f);
    std::vector<LinearSpec> specs;
    for (int64_t e = 0; e < hp.n_expert; ++e) {
        const std::string x = mlp + ".experts." + std::to_string(e);
        specs.push_back({x + ".gate_proj", hp.n_ff_expert, hp.n_embd});
        specs.push_back({x + ".up_proj", hp.n_ff_expert, hp.n_embd});
        specs.push_back({x + ".down_proj", hp.n_embd, hp.n_ff_expert});
    }
    const std::vector<QWeight> w = ml.linears(specs, f);
    L.exp_gate.clear();
    L.exp_up.clear();
    L.exp_down.clear();
    for (size_t e = 0; e < size_t(hp.n_expert); ++e) {
        L.exp_gate.push_back(w[3 * e]);
        L.exp_up.push_back(w[3 * e + 1]);
        L.exp_down.push_back(w[3 * e + 2]);
    }
}

namespace {

class Qwen3Moe final : public Qwen3 {
protected:
    void load_ffn(Model & m, ModelLoader & ml, int64_t il) override {
        if (!m.hparams.is_moe_layer(il)) return Qwen3::load_ffn(m, ml, il);
        load_experts(m, ml, "model.layers." + std::to_string(il) + ".mlp", m.layers[size_t(il)]);
    }

    Tensor * build_ffn_block(GraphContext & gc, Tensor * h, const LayerWeights & L, int il) const override {
        if (!gc.model.hparams.is_moe_layer(il)) return Qwen3::build_ffn_block(gc, h, L, il);
        return build_moe(gc, h, L, il);
    }
};

}  // namespace

std::unique_ptr<Architecture> make_qwen3_moe() { return std::make_unique<Qwen3Moe>(); }

}  // namespace spark
