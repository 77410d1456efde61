// The interface every architecture implements (one file per architecture in this folder), and the
// pieces shared by all of them: the loader helpers and the per-step graph context.
#pragma once

#include "graph/graph.h"
#include "runtime/model.h"

#include <functional>
#include <memory>
#include <string>

namespace spark {

class Memory;

// Loading helpers shared by the architectures: resolve checkpoint tensors into backend weights.
class ModelLoader {
public:
    ModelLoader(Model & model, WeightResolver & resolver, const spark_model_params & params)
        : model_(model), resolver_(resolver), params_(params) {}

    // A Linear weight [n, k] of `module` in whatever format the checkpoint holds.
    QWeight linear(const std::string & module, int64_t n, int64_t k, uint64_t * bytes_counter = nullptr);
    QWeight dense(const std::string & name, int64_t n, int64_t k, uint64_t * bytes_counter = nullptr);
    // A float32 parameter; `ne` in ggml order, `hf_shape` the checkpoint's shape.
    Param   param(const std::string & name, std::initializer_list<int64_t> hf_shape, uint64_t * bytes_counter = nullptr);
    // A parameter computed on the host (e.g. converted), uploaded as is.
    Param   param_from(const std::vector<float> & values, std::vector<int64_t> ne, uint64_t * bytes_counter = nullptr);
    bool    has_module(const std::string & module) const { return resolver_.has_module(module); }
    // Reports loading progress in [0, 1]; throws SPARK_ERR_ABORTED when the callback says stop.
    void    progress(float fraction);
    int64_t n_params() const { return n_params_; }
    bool    has(const std::string & name) const { return resolver_.has(name); }
    WeightResolver & resolver() { return resolver_; }

private:
    Model &          model_;
    WeightResolver & resolver_;
    spark_model_params params_;
    int64_t          n_params_ = 0;
};

// Everything an architecture needs to build the graph of one step.
struct GraphContext {
    Graph &      graph;
    const Model & model;
    Memory &     memory;
    StepInputs   step;
    Tensor *     tokens  = nullptr;  // I32 [T]
    Tensor *     out_ids = nullptr;  // I32 [n_out]: rows whose logits are wanted
    int64_t      n_tokens = 0;
};

class Architecture {
public:
    virtual ~Architecture() = default;
    // Validates the hyper-parameters it needs and loads every tensor into model.layers etc.
    virtual void load(Model & model, ModelLoader & loader) = 0;
    // Builds the step graph; returns the logits [n_vocab, n_out] of the rows in gc.out_ids.
    virtual Tensor * build(GraphContext & gc) const = 0;
};

std::unique_ptr<Architecture> make_architecture(const std::string & model_type);

}  // namespace spark
