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

    // Throws spark::Error; on a validation error (bad token, batch, context full) nothing changed.
    void decode(const spark_batch & batch);

    const float * logits() const { return n_outputs_ ? logits_.data() : nullptr; }
    const float * logits_ith(int32_t i) const;
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
    void run_step(const Row * rows, int32_t n);

    Model &                 model_;
    spark_context_params    params_;
    std::unique_ptr<Memory> memory_;
    std::unique_ptr<Buffer> arena_;

    std::vector<float>   logits_;        // [n_outputs][n_vocab]
    std::vector<int32_t> output_of_row_; // batch row -> output index or -1
    int32_t              n_outputs_ = 0;
};

}  // namespace spark

struct spark_context {
    std::unique_ptr<spark::Context> impl;
    const spark_model *             model = nullptr;
};
