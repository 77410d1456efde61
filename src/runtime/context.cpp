#include "runtime/context.h"

#include "graph/error.h"
#include "graph/planner.h"
#include "runtime/models/arch.h"

#include <algorithm>
#include <cstring>

namespace spark {

Context::Context(Model & model, const spark_context_params & params) : model_(model), params_(params) {
    if (params_.n_ctx == 0) params_.n_ctx = int32_t(std::min<int64_t>(model.hparams.n_ctx_train, 1 << 20));
    if (params_.n_ctx < 0 || params_.n_batch <= 0 || params_.n_seq_max <= 0 || params_.n_seq_max > 4096 || params_.n_snapshots < 0)
        fail(SPARK_ERR_INVALID_ARGUMENT, "invalid context parameters (n_ctx %d, n_batch %d, n_seq_max %d, n_snapshots %d)",
             params_.n_ctx, params_.n_batch, params_.n_seq_max, params_.n_snapshots);
    memory_ = std::make_unique<Memory>(model_, params_.n_ctx, params_.n_seq_max, params_.n_snapshots);
}

int32_t Context::output_index(int32_t i) const {
    if (n_outputs_ == 0) return -1;
    if (i < 0) return n_outputs_ + i >= 0 ? n_outputs_ + i : -1;
    if (size_t(i) >= output_of_row_.size()) return -1;
    return output_of_row_[size_t(i)];
}

const float * Context::logits() {
    if (n_outputs_ == 0) return nullptr;
    if (pending_logits_) {
        const size_t row_bytes = size_t(model_.hparams.n_vocab) * 4;
        for (auto [j, out] : pending_rows_)
            model_.backend->download(logits_.data() + size_t(out) * size_t(model_.hparams.n_vocab), pending_logits_ + size_t(j) * row_bytes, row_bytes);
        pending_logits_ = nullptr;
        pending_rows_.clear();
    }
    return logits_.data();
}

const float * Context::logits_ith(int32_t i) {
    const int32_t out = output_index(i);
    if (out < 0) return nullptr;
    return logits() + size_t(out) * size_t(model_.hparams.n_vocab);
}

int32_t Context::argmax_ith(int32_t i) const {
    const int32_t out = output_index(i);
    return out < 0 ? -1 : argmax_[size_t(out)];
}

void Context::validate(const spark_batch & b, std::vector<Row> & rows, std::vector<int32_t> & n_new) const {
    if (b.n_tokens <= 0) fail(SPARK_ERR_INVALID_ARGUMENT, "batch has no tokens");
    if (!b.token || !b.pos || !b.n_seq_id || !b.seq_id)
        fail(SPARK_ERR_INVALID_ARGUMENT, "batch is missing token, pos or seq_id arrays");
    const int32_t n_vocab = int32_t(model_.hparams.n_vocab);
    n_new.assign(size_t(params_.n_seq_max), 0);
    std::vector<int32_t> next = [&] {
        std::vector<int32_t> v(static_cast<size_t>(params_.n_seq_max));
        for (int32_t s = 0; s < params_.n_seq_max; ++s) v[size_t(s)] = memory_->seq_length(s);
        return v;
    }();
    rows.resize(size_t(b.n_tokens));
    for (int32_t i = 0; i < b.n_tokens; ++i) {
        const spark_token t = b.token[i];
        if (t < 0 || t >= n_vocab) fail(SPARK_ERR_INVALID_TOKEN, "batch row %d: token id %d is outside [0, %d)", i, t, n_vocab);
        if (b.n_seq_id[i] != 1 || !b.seq_id[i])
            fail(SPARK_ERR_INVALID_BATCH, "batch row %d: a token must belong to exactly one sequence (n_seq_id = %d)", i, b.n_seq_id[i]);
        const spark_seq_id s = b.seq_id[i][0];
        if (s < 0 || s >= params_.n_seq_max) fail(SPARK_ERR_INVALID_BATCH, "batch row %d: sequence id %d is outside [0, %d)", i, s, params_.n_seq_max);
        if (b.pos[i] != next[size_t(s)])
            fail(SPARK_ERR_INVALID_BATCH, "batch row %d: position %d does not continue sequence %d, whose next position is %d", i, b.pos[i], s, next[size_t(s)]);
        ++next[size_t(s)];
        ++n_new[size_t(s)];
        rows[size_t(i)] = {i, t, b.pos[i], s, b.logits ? b.logits[i] != 0 : i == b.n_tokens - 1};
    }
    // Stateful ops want each step's tokens grouped by sequence, in position order.
    std::stable_sort(rows.begin(), rows.end(), [](const Row & a, const Row & c) { return a.seq < c.seq; });
}

void Context::decode(const spark_batch & batch) {
    std::vector<Row>     rows;
    std::vector<int32_t> n_new;
    validate(batch, rows, n_new);
    memory_->reserve(n_new);  // SPARK_ERR_CONTEXT_FULL leaves everything unchanged

    const int32_t n_vocab = int32_t(model_.hparams.n_vocab);
    output_of_row_.assign(size_t(batch.n_tokens), -1);
    n_outputs_ = 0;
    for (int32_t i = 0; i < batch.n_tokens; ++i)
        if (batch.logits ? batch.logits[i] != 0 : i == batch.n_tokens - 1) output_of_row_[size_t(i)] = n_outputs_++;
    logits_.resize(size_t(n_outputs_) * size_t(n_vocab));
    argmax_.assign(size_t(n_outputs_), -1);
    pending_logits_ = nullptr;
    pending_rows_.clear();

    std::vector<int32_t> start_len(static_cast<size_t>(params_.n_seq_max));
    for (int32_t s = 0; s < params_.n_seq_max; ++s) start_len[size_t(s)] = memory_->seq_length(s);
    try {
        model_.backend->set_n_threads(params_.n_threads);
        for (size_t first = 0; first < rows.size(); first += size_t(params_.n_batch)) {
            const int32_t n = int32_t(std::min(rows.size() - first, size_t(params_.n_batch)));
            run_step(rows.data() + first, n, first + size_t(n) == rows.size());
        }
    } catch (...) {
        // Undo the lengths of this call; pages beyond them return to the free list.
        for (int32_t s = 0; s < params_.n_seq_max; ++s) memory_->advance(s, start_len[size_t(s)] - memory_->seq_length(s));
        memory_->release_unused();
        n_outputs_ = 0;
        throw;
    }
}

void Context::run_step(const Row * rows, int32_t n, bool last) {
    Backend &       be = *model_.backend;
    const HParams & hp = model_.hparams;

    Graph        graph;
    GraphContext gc{graph, model_, *memory_, {}, nullptr, nullptr, n};
    gc.tokens = graph.input(DType::I32, {n}, "tokens");
    gc.step.pos = graph.input(DType::I32, {n}, "pos");
    gc.step.seq = graph.input(DType::I32, {n}, "seq");
    gc.step.block_table = graph.input(DType::I32, {memory_->max_pages_per_seq(), memory_->n_seq_max()}, "block_table");

    const size_t         count = static_cast<size_t>(n);
    std::vector<int32_t> tokens(count), pos(count), seq(count), out_rows, ranges;
    for (int32_t i = 0; i < n; ++i) {
        tokens[size_t(i)] = rows[i].token;
        pos[size_t(i)]    = rows[i].pos;
        seq[size_t(i)]    = rows[i].seq;
        if (rows[i].want_logits) out_rows.push_back(i);
        if (i == 0 || rows[i].seq != rows[i - 1].seq) ranges.insert(ranges.end(), {rows[i].seq, i, 0});
        ranges.back() += 1;
    }
    const bool any_out = !out_rows.empty();
    if (!any_out) out_rows.push_back(n - 1);  // the graph always ends in logits; these are dropped
    gc.step.seq_ranges = graph.input(DType::I32, {3, int64_t(ranges.size() / 3)}, "seq_ranges");
    gc.out_ids         = graph.input(DType::I32, {int64_t(out_rows.size())}, "out_ids");

    Tensor * logits = model_.arch->build(gc);
    SPARK_ASSERT(logits->ne[0] == hp.n_vocab && logits->ne[1] == int64_t(out_rows.size()));
    // Greedy choice on the backend: a greedy loop copies one id per step, not the logits.
    Tensor * best = graph.argmax(logits);
    graph.mark_output(best);

    MemoryPlan plan = plan_memory(graph);
    if (!arena_ || arena_->size() < plan.arena_bytes) {
        arena_.reset();
        arena_ = be.alloc(plan.arena_bytes + plan.arena_bytes / 8);  // headroom for the next shapes
    }
    bind_memory(graph, plan, arena_->data());

    be.upload(gc.tokens->data, tokens.data(), tokens.size() * 4);
    be.upload(gc.step.pos->data, pos.data(), pos.size() * 4);
    be.upload(gc.step.seq->data, seq.data(), seq.size() * 4);
    be.upload(gc.step.block_table->data, memory_->block_table().data(), memory_->block_table().size() * 4);
    be.upload(gc.step.seq_ranges->data, ranges.data(), ranges.size() * 4);
    be.upload(gc.out_ids->data, out_rows.data(), out_rows.size() * 4);

    be.compute(graph);

    if (any_out) {
        std::vector<int32_t> ids(out_rows.size());
        be.download(ids.data(), best->data, ids.size() * 4);  // the step's only synchronisation
        for (size_t j = 0; j < out_rows.size(); ++j) {
            const int32_t out = output_of_row_[size_t(rows[out_rows[j]].batch_index)];
            argmax_[size_t(out)] = ids[j];
            pending_rows_.push_back({int32_t(j), out});
        }
        // The arena is reused by the next step: only the last step's logits may stay there.
        pending_logits_ = static_cast<const char *>(logits->data);
        if (!last) this->logits();
    }
    for (size_t r = 0; r < ranges.size(); r += 3) memory_->advance(ranges[r], ranges[r + 2]);
}

}  // namespace spark
