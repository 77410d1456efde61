#include "runtime/context.h"

#include "graph/error.h"
#include "graph/planner.h"
#include "runtime/models/arch.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace spark {

Context::Context(Model & model, const spark_context_params & params) : model_(model), params_(params) {
    if (const char * p = std::getenv("SPARK_PROFILE"); p && *p && *p != '0') profile_ = std::make_unique<Profile>();
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

// The graph of one step shape, built and planned once and reused while the shape repeats (every
// batch-1 decode step has the same shape): a decode step then costs one upload, the backend's
// launch (a CUDA-graph replay) and one small download, with no graph building on the host.
struct Context::StepGraph {
    int32_t                n = 0, n_seqs = 0, n_out = 0;
    std::unique_ptr<Graph> graph;
    Tensor *               inputs = nullptr;  // I32: tokens | pos | seq | block table | seq ranges | out ids
    Tensor *               logits = nullptr;
    Tensor *               best   = nullptr;
    MemoryPlan             plan;
    void *                 bound_to = nullptr;  // arena the plan is bound to
};

Context::StepGraph & Context::step_graph(int32_t n, int32_t n_seqs, int32_t n_out) {
    for (auto & s : steps_)
        if (s->n == n && s->n_seqs == n_seqs && s->n_out == n_out) return *s;
    auto s    = std::make_unique<StepGraph>();
    s->n      = n;
    s->n_seqs = n_seqs;
    s->n_out  = n_out;
    s->graph  = std::make_unique<Graph>();
    Graph &       g      = *s->graph;
    const int64_t pages  = memory_->max_pages_per_seq(), slots = memory_->n_seq_max();
    const int64_t total  = 3 * int64_t(n) + pages * slots + 3 * int64_t(n_seqs) + n_out;
    s->inputs            = g.input(DType::I32, {total}, "step_inputs");
    size_t       off     = 0;
    auto         part    = [&](int64_t count) {
        Tensor * v = g.view(s->inputs, {count}, {4}, off * 4);
        off += size_t(count);
        return v;
    };
    GraphContext gc{g, model_, *memory_, {}, nullptr, nullptr, n};
    gc.tokens   = part(n);
    gc.step.pos = part(n);
    gc.step.seq = part(n);
    gc.step.block_table = g.view(s->inputs, {pages, slots}, {4, size_t(pages) * 4}, off * 4);
    off += size_t(pages * slots);
    gc.step.seq_ranges = g.view(s->inputs, {3, n_seqs}, {4, 12}, off * 4);
    off += size_t(3 * n_seqs);
    gc.out_ids = part(n_out);
    s->logits  = model_.arch->build(gc);
    SPARK_ASSERT(s->logits->ne[0] == model_.hparams.n_vocab && s->logits->ne[1] == n_out);
    // Greedy choice on the backend: a greedy loop copies one id per step, not the logits.
    s->best = g.argmax(s->logits);
    g.mark_output(s->best);
    s->plan = plan_memory(g);
    if (steps_.size() >= 8) steps_.erase(steps_.begin());
    steps_.push_back(std::move(s));
    return *steps_.back();
}

void Context::run_step(const Row * rows, int32_t n, bool last) {
    Backend &  be = *model_.backend;
    const auto t0 = std::chrono::steady_clock::now();

    // This step's inputs, packed in the order of StepGraph::inputs.
    std::vector<int32_t> out_rows, ranges;
    for (int32_t i = 0; i < n; ++i) {
        if (rows[i].want_logits) out_rows.push_back(i);
        if (i == 0 || rows[i].seq != rows[i - 1].seq) ranges.insert(ranges.end(), {rows[i].seq, i, 0});
        ranges.back() += 1;
    }
    const bool any_out = !out_rows.empty();
    if (!any_out) out_rows.push_back(n - 1);  // the graph always ends in logits; these are dropped
    const int32_t n_seqs = int32_t(ranges.size() / 3);
    StepGraph &   step   = step_graph(n, n_seqs, int32_t(out_rows.size()));

    staging_.clear();
    for (int32_t i = 0; i < n; ++i) staging_.push_back(rows[i].token);
    for (int32_t i = 0; i < n; ++i) staging_.push_back(rows[i].pos);
    for (int32_t i = 0; i < n; ++i) staging_.push_back(rows[i].seq);
    staging_.insert(staging_.end(), memory_->block_table().begin(), memory_->block_table().end());
    staging_.insert(staging_.end(), ranges.begin(), ranges.end());
    staging_.insert(staging_.end(), out_rows.begin(), out_rows.end());
    SPARK_ASSERT(int64_t(staging_.size()) == step.inputs->ne[0]);

    if (!arena_ || arena_->size() < step.plan.arena_bytes) {
        arena_.reset();
        arena_ = be.alloc(step.plan.arena_bytes + step.plan.arena_bytes / 8);  // headroom for the next shapes
    }
    if (step.bound_to != arena_->data()) {
        bind_memory(*step.graph, step.plan, arena_->data());
        step.bound_to = arena_->data();
    }
    const auto t1 = std::chrono::steady_clock::now();
    be.upload(step.inputs->data, staging_.data(), staging_.size() * 4);
    be.compute(*step.graph);
    const auto t2 = std::chrono::steady_clock::now();

    if (any_out) {
        std::vector<int32_t> ids(out_rows.size());
        be.download(ids.data(), step.best->data, ids.size() * 4);  // the step's only synchronisation
        for (size_t j = 0; j < out_rows.size(); ++j) {
            const int32_t out = output_of_row_[size_t(rows[out_rows[j]].batch_index)];
            argmax_[size_t(out)] = ids[j];
            pending_rows_.push_back({int32_t(j), out});
        }
        // The arena is reused by the next step: only the last step's logits may stay there.
        pending_logits_ = static_cast<const char *>(step.logits->data);
        if (!last) this->logits();
    } else {
        be.synchronize();
    }
    for (size_t r = 0; r < ranges.size(); r += 3) memory_->advance(ranges[r], ranges[r + 2]);
    if (profile_) {
        const auto t3 = std::chrono::steady_clock::now();
        auto us = [](auto a, auto b) { return std::chrono::duration<double, std::micro>(b - a).count(); };
        profile_->steps += 1;
        profile_->prepare_us += us(t0, t1);
        profile_->launch_us += us(t1, t2);
        profile_->wait_us += us(t2, t3);
    }
}

Context::~Context() {
    if (profile_ && profile_->steps)
        std::fprintf(stderr, "spark: %lld steps, per step: prepare %.1f us, upload + launch %.1f us, wait %.1f us\n",
                     (long long) profile_->steps, profile_->prepare_us / double(profile_->steps), profile_->launch_us / double(profile_->steps),
                     profile_->wait_us / double(profile_->steps));
}

}  // namespace spark
