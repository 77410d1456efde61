// A decoding context: sequence memory, compute arena, and the logits of the last decode.
#pragma once

#include "runtime/memory.h"
#include "runtime/model.h"

#include <spark/spark.h>

#include <memory>
#include <vector>

namespace spark {

class Context {
public:
    Context(Model & model, const spark_context_params & params);
    ~Context();

    // Throws spark::Error; on a validation error (bad token, batch, context full) nothing changed.
    void decode(const spark_batch & batch);

    // Logits of the last decode, [n_outputs][n_vocab] on the host (copied from the backend on first
    // access: a greedy decode loop never copies them).
    const float * logits();
    const float * logits_ith(int32_t i);
    // The argmax of output row i (as logits_ith), computed on the backend; -1 if row i has none.
    int32_t       argmax_ith(int32_t i) const;
    int32_t       n_outputs() const { return n_outputs_; }

    Model &        model() { return model_; }
    Memory &       memory() { return *memory_; }
    const Memory & memory() const { return *memory_; }
    const spark_context_params & params() const { return params_; }
    size_t         compute_bytes() const { return arena_ ? arena_->size() : 0; }

private:
    struct Row {
        int32_t batch_index;
        int32_t token, pos, seq;
        bool    want_logits;
    };
    void validate(const spark_batch & batch, std::vector<Row> & rows, std::vector<int32_t> & n_new) const;
    void run_step(const Row * rows, int32_t n, bool last);
    struct StepGraph;
    StepGraph & step_graph(int32_t n, int32_t n_seqs, int32_t n_out);
    int32_t output_index(int32_t i) const;  // batch row (or negative from the end) -> output index

    Model &                 model_;
    spark_context_params    params_;
    std::unique_ptr<Memory> memory_;
    std::unique_ptr<Buffer> arena_;
    std::vector<std::unique_ptr<StepGraph>> steps_;  // recent step shapes (graph + plan)
    std::vector<int32_t>    staging_;                 // packed step inputs

    struct Profile {  // SPARK_PROFILE=1: host time per step, printed when the context is freed
        int64_t steps = 0;
        double  prepare_us = 0, launch_us = 0, wait_us = 0;
    };
    std::unique_ptr<Profile> profile_;

    std::vector<float>   logits_;        // [n_outputs][n_vocab]
    std::vector<int32_t> argmax_;        // [n_outputs]
    std::vector<int32_t> output_of_row_; // batch row -> output index or -1
    int32_t              n_outputs_ = 0;
    // Logits of the last step still on the backend: (row in the step's logits, output index).
    const char *                         pending_logits_ = nullptr;
    std::vector<std::pair<int32_t, int32_t>> pending_rows_;
};

}  // namespace spark

struct spark_context {
    std::unique_ptr<spark::Context> impl;
    const spark_model *             model = nullptr;
};
