// A decoding context: sequence memory, compute arena, and the outputs of the last decode.
//
// Two ways in: decode() is spark_decode (a batch checked on the host, split into steps of at most
// n_batch tokens, logits and greedy tokens on the host afterwards); step() runs one step for the
// speculative loop, whose drafts and hidden states stay on the backend: some inputs are copied
// from backend memory (DeviceRows), and the outputs stay where they are until asked for.
#pragma once

#include "runtime/memory/memory.h"
#include "runtime/model.h"

#include <spark/spark.h>

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace spark {

class RankThreads;

// Hidden states a step outputs besides the logits (the inputs of EAGLE3 and MTP heads): the
// outputs of the listed layers, concatenated in that order, for every token of the step. A layer
// id of kFinalNorm stands for the final normed hidden state (what lm_head reads). With `project`,
// the concatenation is multiplied by that weight in the step (an EAGLE3 head's fc).
struct HiddenCapture {
    static constexpr int32_t kFinalNorm = -1;
    std::vector<int32_t>     layers;
    const QWeight *          project = nullptr;
    bool                     empty() const { return layers.empty(); }
    bool                     operator==(const HiddenCapture &) const = default;
};

// Rows of a step input copied from backend memory: rows [first, first + count) of the input, from
// `src` (contiguous rows of the input's width).
struct DeviceRows {
    int32_t      first = 0, count = 0;
    const void * src   = nullptr;
};

// Holds the backend's exclusive lock for the scope, when the backend shares its resources between
// contexts (Backend::exclusive): the API glue takes it around every call that uses a context.
class BackendLock {
public:
    explicit BackendLock(Backend & be) {
        if (std::mutex * m = be.exclusive()) lock_ = std::unique_lock<std::mutex>(*m);
    }

private:
    std::unique_lock<std::mutex> lock_;
};

struct StepRow {
    int32_t token = 0, pos = 0, seq = 0;  // token is ignored where DeviceRows supply it
    bool    logits = false;
};

class Context {
public:
    Context(Model & model, const spark_context_params & params);
    ~Context();

    // spark_decode. Throws spark::Error; on a validation error (bad token, batch, context full)
    // nothing changed, and after any other failure the memory is as before the call. A split
    // model's context runs the batch on every rank at once (its peers).
    void decode(const spark_batch & batch);
    // fn on this context and, for a split model, every other rank's (memory operations).
    void each_rank(const std::function<void(Context &)> & fn);

    // One internal step (rows grouped by sequence, each sequence's positions continuing it, at most
    // n_batch rows). tokens / hidden: inputs taken from backend memory. Returns without waiting
    // for the backend; outputs are read with the accessors below.
    void step(const std::vector<StepRow> & rows, const std::vector<DeviceRows> & tokens = {},
              const std::vector<DeviceRows> & hidden = {});

    // Outputs of the last decode or step. Host copies are made on first access (a greedy loop
    // never copies logits): logits [n_outputs][n_vocab], greedy token of output row i (the model's
    // pick: the argmax, mapped to target ids by an EAGLE3 head), hidden states [T][width] of the
    // last step's rows (every row of the step, not only those with logits).
    const float * logits();
    const float * logits_ith(int32_t i);
    int32_t       argmax_ith(int32_t i);
    int32_t       n_outputs() const { return n_outputs_; }
    const float * hidden_ith(int32_t i);  // batch row i of the last decode (a row with logits)
    int64_t       hidden_width() const;

    // Backend pointers of the last step's outputs, valid until the next step of this context.
    const int32_t * device_tokens() const;  // greedy token per output row, I32 [n_outputs]
    const float *   device_logits() const;  // [n_outputs][n_vocab]
    const float *   device_hidden() const;  // [T][hidden_width()]

    // Hidden states the steps output from now on (step graphs are rebuilt).
    void                  set_capture(const HiddenCapture & c);
    // A speculative loop is attached (it owns the capture; one loop per context).
    bool                  speculating = false;
    const HiddenCapture & capture() const { return capture_; }
    // Keeps the recurrent states after the last n positions (spark_context_params.n_rollback).
    void set_rollback(int32_t n);

    Model &        model() { return model_; }
    const Model &  model() const { return model_; }
    Memory &       memory() { return *memory_; }
    const Memory & memory() const { return *memory_; }
    const spark_context_params & params() const { return params_; }
    size_t         compute_bytes() const { return arena_ ? arena_->size() : 0; }
    // Tokens run through the model so far (every row of every step): tests prove that a rollback
    // recomputes nothing.
    int64_t        rows_computed() const { return rows_computed_; }
    // spark_perf_context.
    const spark_perf_context_data & perf() const { return perf_; }
    void                            reset_perf() { perf_ = spark_perf_context_data{}; }
    // spark_context_set_abort_callback: checked before every step and, on the CPU, between ops.
    void set_abort(spark_abort_callback cb, void * data);

    // Tests: the step after the next n steps fails as a device error would (proves that a failed
    // decode leaves the memory as it was). -1: off.
    void           fail_after_steps(int32_t n) { fail_after_ = n; }

private:
    struct Row {
        int32_t batch_index;
        int32_t token, pos, seq;
        bool    want_logits;
    };
    void decode_rank(const spark_batch & batch);
    void validate(const spark_batch & batch, std::vector<Row> & rows, std::vector<int32_t> & n_new) const;
    void begin_outputs(int32_t n_outputs);
    void run_step(const Row * rows, int32_t n, const std::vector<DeviceRows> & tokens, const std::vector<DeviceRows> & hidden);
    void download_pending();  // greedy tokens
    void fetch_outputs();     // everything the last step left on the backend, to the host
    struct StepGraph;
    StepGraph & step_graph(int32_t n, int32_t n_seqs, int32_t n_out);
    int32_t output_index(int32_t i) const;  // batch row (or negative from the end) -> output index

    Model &                 model_;
    spark_context_params    params_;
    std::unique_ptr<Executor> executor_;  // this context's CPU threads (the model's weights are shared)
    std::unique_ptr<Memory> memory_;
    std::vector<std::unique_ptr<Context>> peers_;  // a split model's other ranks, in rank order
    std::unique_ptr<RankThreads>          rank_threads_;  // the threads the peers' steps run on
    std::vector<Communicator *>           rank_comms_;    // every rank's communicator, in rank order
    std::unique_ptr<Buffer> arena_;
    std::vector<std::unique_ptr<StepGraph>> steps_;  // recent step shapes (graph + plan)
    std::vector<int32_t>    staging_;                 // packed step inputs
    HiddenCapture           capture_;
    int64_t                 rows_computed_ = 0;
    spark_perf_context_data perf_{};
    int32_t                 fail_after_    = -1;
    spark_abort_callback    abort_cb_      = nullptr;
    void *                  abort_data_    = nullptr;

    struct Profile {  // SPARK_PROFILE=1: host time per step, printed when the context is freed
        int64_t steps = 0;
        double  prepare_us = 0, launch_us = 0;
    };
    std::unique_ptr<Profile> profile_;

    // Outputs of the last decode on the host, filled from the backend on first access.
    std::vector<float>   logits_;         // [n_outputs][n_vocab]
    std::vector<int32_t> argmax_;         // [n_outputs]
    std::vector<float>   hidden_;         // [n_outputs][hidden width]
    std::vector<int32_t> output_of_row_;  // batch row -> output index or -1
    int32_t              n_outputs_ = 0;
    // What the last step left on the backend: its graph, and which of its output rows feed which
    // output index (a decode of several steps copies the earlier steps' outputs right away).
    StepGraph *                              last_step_ = nullptr;
    std::vector<std::pair<int32_t, int32_t>> pending_rows_;     // (row in the step's outputs, output index)
    std::vector<std::pair<int32_t, int32_t>> pending_hidden_;   // (token row in the step, output index)
    bool                                     pending_logits_ = false, pending_argmax_ = false, pending_hid_ = false;
};

}  // namespace spark

struct spark_context {
    std::unique_ptr<spark::Context> impl;
    const spark_model *             model = nullptr;
};
