// The interface every architecture implements (one file per architecture in this folder), and the
// pieces shared by all of them: the loader helpers and the per-step graph context.
#pragma once

#include "graph/graph.h"
#include "io/config_fields.h"
#include "runtime/model.h"
#include "runtime/shard.h"
#include "runtime/synthetic.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace spark {

class Memory;
struct HiddenCapture;

// How an architecture gets its weights: from a checkpoint (CheckpointLoader) or random of the same
// shapes for benchmarks (SyntheticLoader, src/runtime/synthetic.cpp). Architectures only name the
// tensors and their logical shapes.
//
// A rank of a split model (runtime/shard.h) keeps a part of some tensors: a Cut. For a Linear
// [n, k], rows [begin, end) of n (column-parallel) or columns of k (row-parallel), one range; for
// a parameter, ranges of its first (outermost) checkpoint dimension, concatenated in order.
struct Cut {
    enum class Dim : uint8_t { None, Rows, Cols };
    Dim                dim = Dim::None;
    std::vector<Range> ranges;

    static Cut rows(Range r) { return {Dim::Rows, {r}}; }
    static Cut cols(Range r) { return {Dim::Cols, {r}}; }
    static Cut parts(std::vector<Range> r) { return {Dim::Rows, std::move(r)}; }
    bool       none() const { return dim == Dim::None; }
    // The length of the cut dimension (`whole` where there is no cut).
    int64_t    length(int64_t whole) const;
};

struct LinearSpec {
    std::string module;
    int64_t     n = 0, k = 0;
    Cut         cut;
};

class ModelLoader {
public:
    ModelLoader(Model & model, const spark_model_params & params) : model_(model), params_(params) {}
    virtual ~ModelLoader() = default;

    // A Linear weight [n, k] of `module` in whatever format the checkpoint holds; with a cut, the
    // rank's part of it ([n, k] stay the checkpoint's shape).
    virtual QWeight linear(const std::string & module, int64_t n, int64_t k, uint64_t * bytes_counter = nullptr, const Cut & cut = {}) = 0;
    // Several at once, in order: a loader may resolve them in parallel (a MoE layer's experts).
    virtual std::vector<QWeight> linears(const std::vector<LinearSpec> & specs, uint64_t * bytes_counter = nullptr);
    // A dense matrix [n, k] (the token embedding).
    virtual QWeight dense(const std::string & name, int64_t n, int64_t k, uint64_t * bytes_counter = nullptr) = 0;
    // A float32 parameter; `hf_shape` is the checkpoint's shape (uploaded in ggml order).
    virtual Param   param(const std::string & name, std::initializer_list<int64_t> hf_shape, uint64_t * bytes_counter = nullptr) = 0;
    // The rank's part of a float32 parameter (a cut of its first checkpoint dimension).
    Param           param(const std::string & name, std::initializer_list<int64_t> hf_shape, uint64_t * bytes_counter, const Cut & cut);
    // Whether the checkpoint has a tensor (optional parts: a Qwen3-Next MTP head).
    virtual bool    has(const std::string & name) const = 0;

    // Reports loading progress (bytes of weights moved out of the total) to the callbacks of
    // spark_model_params; throws SPARK_ERR_ABORTED when one says stop.
    void    report(uint64_t done, uint64_t total);
    int64_t n_params() const { return n_params_; }
    // Which part of a split model this load is (size 1: the whole model).
    const Shard & shard() const { return model_.shard; }

protected:
    // A parameter's dims in ggml order, collapsed to at most 2 (conv1d's [C, 1, K] becomes {K, C}).
    static std::vector<int64_t> ggml_dims(const std::string & name, std::initializer_list<int64_t> hf_shape);
    static std::vector<int64_t> ggml_dims(const std::string & name, const std::vector<int64_t> & hf_shape);
    // Uploads host values as a parameter; `hf_shape` collapses to at most 2 ggml dims.
    Param param_from(const std::string & name, const std::vector<float> & values, std::initializer_list<int64_t> hf_shape, uint64_t * counter);
    Param param_from(const std::string & name, const std::vector<float> & values, const std::vector<int64_t> & hf_shape, uint64_t * counter);
    // A parameter's values on the host (for cuts).
    virtual std::vector<float> param_values(const std::string & name, std::initializer_list<int64_t> hf_shape) = 0;
    // Backend memory holding `bytes` host bytes (the default uploads them at once).
    virtual void * store(const void * host, size_t bytes);
    QWeight count(const QWeight & w, uint64_t * counter);

    Model &            model_;
    spark_model_params params_;
    int64_t            n_params_ = 0;
};

// Weights from checkpoint tensors (a safetensors directory or a spark file). The architecture's
// load() only resolves tensors and reserves their backend memory (a WeightBatch); finish() then moves
// every byte at once, with the backend's parallel streaming where it has one.
class CheckpointLoader final : public ModelLoader {
public:
    CheckpointLoader(Model & model, WeightResolver & resolver, const spark_model_params & params);
    ~CheckpointLoader() override;
    QWeight linear(const std::string & module, int64_t n, int64_t k, uint64_t * counter, const Cut & cut) override;
    std::vector<QWeight> linears(const std::vector<LinearSpec> & specs, uint64_t * counter) override;
    QWeight dense(const std::string & name, int64_t n, int64_t k, uint64_t * counter) override;
    Param   param(const std::string & name, std::initializer_list<int64_t> hf_shape, uint64_t * counter) override;
    bool    has(const std::string & name) const override { return resolver_.has(name) || resolver_.has_module(name); }
    std::vector<float> param_values(const std::string & name, std::initializer_list<int64_t> hf_shape) override;

    // Moves the weights' bytes into the backend, reporting progress. Call once, after load().
    void finish();

private:
    void *  store(const void * host, size_t bytes) override;
    QWeight cut(const QWeight & whole, const Cut & cut);

    WeightResolver &             resolver_;
    std::unique_ptr<HostReader>  reader_;  // the checkpoint's bytes, for the batch (before it: it is asked at add())
    std::unique_ptr<WeightBatch> batch_;
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

    // Speculative decoding. capture: hidden states the step must output (a target feeding an
    // EAGLE3 or MTP head; see capture_layer / build_output). hidden_in: a head's input rows
    // [hidden_input_width, T]. captured: set by the build, the hidden states [width, T] the step
    // outputs (the captured layers, or a head's own output for chained drafting).
    const HiddenCapture * capture   = nullptr;
    Tensor *              hidden_in = nullptr;
    Tensor *              captured  = nullptr;
    std::vector<Tensor *> captured_parts;  // in the order of capture->layers
};

// One architecture, one unit (a file in this folder): what it is called, the config.json fields it
// reads beyond the common ones, its synthetic shapes, its weights and its graph. architectures()
// lists them; nothing outside their files names one.
class Architecture {
public:
    virtual ~Architecture() = default;

    // ---- what it is
    virtual const char * model_type() const = 0;  // config.json's "model_type" (a head: what it is)
    virtual const char * hf_class() const { return ""; }  // transformers' class (config.json "architectures")
    // general.architecture of a spark file: llama.cpp's name where it has one (docs/FORMAT.md).
    virtual const char * file_arch() const { return model_type(); }
    // Its config.json fields beyond the common ones (parse_hparams, hparams.cpp), read and bounded
    // through `f`; it may also replace a common default (a partial rotary factor).
    virtual void parse_hparams(const ConfigFields & f, HParams & hp) const { (void) f, (void) hp; }
    // The hyper-parameters of its own a spark file stores (spark-convert), as (key, value) pairs.
    virtual void file_hparams(const HParams & hp, const std::function<void(const char * key, int64_t value)> & put) const {
        (void) hp, (void) put;
    }
    // The config.json fields transformers' class writes with their defaults (spark-convert --synthetic).
    virtual void hf_config_defaults(const HParams & hp, nlohmann::json & config) const { (void) hp, (void) config; }
    // Synthetic shapes ("synthetic:<name>:<format>"): the name and the config.json fields spark reads.
    virtual std::vector<std::pair<std::string, nlohmann::json>> synthetic_shapes() const { return {}; }
    // How the synthetic loader makes the values of parameter `name` (norm weights: around 1).
    virtual SyntheticTensor::Init synthetic_param_init(const std::string & name) const;
    // The modules its quantized checkpoints keep in bf16 (the routers, lm_head), as fnmatch patterns
    // in ModelOpt's exclude_modules spelling: what synthetic models and checkpoints leave dense.
    virtual std::vector<std::string> dense_modules() const { return {"lm_head", "*.mlp.gate", "*shared_expert_gate*"}; }
    // Whether its checkpoints may carry a multi-token-prediction head (spark_spec kind MTP).
    virtual bool has_mtp_head() const { return false; }

    // ---- what it does
    // Validates the hyper-parameters it needs and loads every tensor into model.layers etc.
    virtual void load(Model & model, ModelLoader & loader) = 0;
    // Builds the step graph; returns the logits [n_vocab, n_out] of the rows in gc.out_ids.
    virtual Tensor * build(GraphContext & gc) const = 0;
    // The greedy token of each logits row (an EAGLE3 head maps its draft vocabulary to the target's).
    virtual Tensor * greedy_tokens(GraphContext & gc, Tensor * logits) const { return gc.graph.argmax(logits); }
    // Heads of speculative decoding: the width of the hidden-state input each token takes, and of
    // the hidden state each token outputs for the next chained step (0: not a head).
    virtual int64_t hidden_input_width(const Model &) const { return 0; }
    virtual int64_t hidden_output_width(const Model &) const { return 0; }
};

// Every architecture spark runs, in a fixed order (models/arch.cpp's list).
const std::vector<const Architecture *> & architectures();
// The architecture of config.json's model_type `t`, or nullptr.
const Architecture * find_architecture(const std::string & t);
// The architecture of model_type `t`; SPARK_ERR_UNSUPPORTED (naming the supported ones) for another.
const Architecture & architecture_of(const std::string & t);
// Their model types, "qwen3, qwen3_moe, ..." (for messages).
std::string architecture_names();
// A new instance of model_type's architecture; SPARK_ERR_UNSUPPORTED (naming the supported ones)
// for another.
std::unique_ptr<Architecture> make_architecture(const std::string & model_type);

}  // namespace spark
