// Qwen3 dense. Qwen3-MoE derives from it and replaces only the feed-forward block; MiniMax-M2 also
// its q/k norms' scope.
#pragma once

#include "runtime/graph_builders.h"

namespace spark {

class Qwen3 : public Architecture {
public:
    const char * model_type() const override { return "qwen3"; }
    const char * hf_class() const override { return "Qwen3ForCausalLM"; }
    void         parse_hparams(const ConfigFields & f, HParams & hp) const override;
    void         hf_config_defaults(const HParams & hp, nlohmann::json & c) const override;
    std::vector<std::pair<std::string, nlohmann::json>> synthetic_shapes() const override;

    void     load(Model & m, ModelLoader & ml) override;
    Tensor * build(GraphContext & gc) const override;

protected:
    virtual QkNormScope qk_norm_scope() const { return QkNormScope::PerHead; }
    virtual void     load_ffn(Model & m, ModelLoader & ml, int64_t il);
    virtual Tensor * build_ffn_block(GraphContext & gc, Tensor * h, const LayerWeights & L, int il) const;
};

}  // namespace spark
