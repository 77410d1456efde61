#include "runtime/context.h"

#include "common/error.h"
#include "common/log.h"
#include "runtime/rank_group.h"
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
    // 16M tokens is beyond what any KV cache holds today; larger values are mistakes or hostile.
    constexpr int32_t kMaxContext = 1 << 24;
    if (params_.n_ctx > kMaxContext)
        fail(SPARK_ERR_INVALID_ARGUMENT, "context: n_ctx %d exceeds the largest context spark allocates (%d tokens)", params_.n_ctx, kMaxContext);
    if (params_.n_ctx < 0 || params_.n_batch <= 0 || params_.n_seq_max <= 0 || params_.n_seq_max > 4096 || params_.n_snapshots < 0 ||
        params_.n_rollback < 0 || params_.n_rollback > 64)
        fail(SPARK_ERR_INVALID_ARGUMENT, "invalid context parameters (n_ctx %d, n_batch %d, n_seq_max %d, n_snapshots %d, n_rollback %d of at most 64)",
             params_.n_ctx, params_.n_batch, params_.n_seq_max, params_.n_snapshots, params_.n_rollback);
    executor_ = model_.backend->make_executor(params_.n_threads);
    memory_   = std::make_unique<Memory>(model_, params_.n_ctx, params_.n_seq_max, params_.n_snapshots, params_.n_rollback);
    for (auto & peer : model_.peers) {  // a split model: the other ranks' contexts follow this one
        BackendLock lock(*peer->backend);
        peers_.push_back(std::make_unique<Context>(*peer, params_));
    }
    if (!peers_.empty()) {
        rank_threads_ = std::make_unique<RankThreads>(int(peers_.size()) + 1);
        rank_comms_.push_back(model_.shard.comm);
        for (auto & p : peers_) rank_comms_.push_back(p->model().shard.comm);
    }
}

void Context::each_rank(const std::function<void(Context &)> & fn) {
    fn(*this);
    for (auto & p : peers_) {
        BackendLock lock(*p->model().backend);
        fn(*p);
    }
}

void Context::decode(const spark_batch & batch) {
    if (peers_.empty()) return decode_rank(batch);
    // A rank that fails aborts the group for good (no rank waits for one that has gone), so what
    // can be refused is refused here first, on the host, where it changes nothing: the batch, the
    // room in the cache (every rank's memory is the same), the abort callback (checked once a call:
    // a rank stopping between steps alone would end the group).
    {
        std::vector<Row>     rows;
        std::vector<int32_t> n_new;
        validate(batch, rows, n_new);
        memory_->check_room(n_new);
        if (abort_cb_ && abort_cb_(abort_data_)) fail(SPARK_ERR_ABORTED, "decode aborted by the abort callback");
    }
    // Every rank runs the same steps at once, joined by their all-reduces; rank 0 (this context)
    // on the calling thread. The caller holds rank 0's backend lock, each peer takes its own.
    rank_threads_->run(rank_comms_, [&](int r) {
        if (r == 0) return decode_rank(batch);
        Context &   peer = *peers_[size_t(r - 1)];
        BackendLock lock(*peer.model().backend);
        peer.decode_rank(batch);
    });
}

int32_t Context::output_index(int32_t i) const {
    if (n_outputs_ == 0) return -1;
    if (i < 0) return n_outputs_ + i >= 0 ? n_outputs_ + i : -1;
    if (size_t(i) >= output_of_row_.size()) return -1;
    return output_of_row_[size_t(i)];
}

// The graph of one step shape, built and planned once and reused while the shape repeats (every
// batch-1 decode step has the same shape): a decode step then costs one upload, the backend's
// launch (a CUDA-graph replay) and one small download, with no graph building on the host.
struct Context::StepGraph {
    int32_t                n = 0, n_seqs = 0, n_out = 0;
    std::unique_ptr<Graph> graph;
    // The step's inputs live outside the arena, so that an input copied from the outputs of the
    // previous step (chained drafting) is never overwritten by this step's upload.
    std::unique_ptr<Buffer> input_buf, hidden_buf;
    Tensor *               inputs    = nullptr;  // I32: tokens | pos | seq | block table | seq ranges | out ids
    Tensor *               hidden_in = nullptr;  // heads: F32 [width, n]
    Tensor *               logits    = nullptr;
    Tensor *               best      = nullptr;  // greedy token per output row
    Tensor *               hidden    = nullptr;  // captured hidden states [width, n]
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
    g.set_comm(model_.shard.comm);  // a split model's ranks sum their partial outputs through it
    const int64_t pages  = memory_->max_pages_per_seq(), slots = memory_->n_seq_max();
    const int64_t total  = 3 * int64_t(n) + pages * slots + 3 * int64_t(n_seqs) + n_out;
    s->input_buf         = model_.backend->alloc(size_t(total) * 4);
    s->inputs            = g.external(DType::I32, {total}, s->input_buf->data(), "step_inputs");
    size_t       off     = 0;
    auto         part    = [&](int64_t count) {
        Tensor * v = g.view(s->inputs, {count}, {4}, off * 4);
        off += size_t(count);
        return v;
    };
    GraphContext gc{g, model_, *memory_, {}, nullptr, nullptr, n, nullptr, nullptr, nullptr, {}};
    gc.tokens   = part(n);
    gc.step.pos = part(n);
    gc.step.seq = part(n);
    gc.step.block_table = g.view(s->inputs, {pages, slots}, {4, size_t(pages) * 4}, off * 4);
    off += size_t(pages * slots);
    gc.step.seq_ranges = g.view(s->inputs, {3, n_seqs}, {4, 12}, off * 4);
    off += size_t(3 * n_seqs);
    gc.out_ids = part(n_out);
    gc.capture = &capture_;
    if (const int64_t w = model_.arch->hidden_input_width(model_); w > 0) {
        s->hidden_buf = model_.backend->alloc(size_t(w) * size_t(n) * 4);
        gc.hidden_in = s->hidden_in = g.external(DType::F32, {w, n}, s->hidden_buf->data(), "hidden_in");
    }
    s->logits = model_.arch->build(gc);
    g.set_prompt_step(n_out < n);  // rows without logits: a prompt (graph.h)
    SPARK_ASSERT(s->logits->ne[0] == model_.hparams.n_vocab && s->logits->ne[1] == n_out);
    // Greedy choice on the backend: a greedy loop copies one id per step, not the logits.
    s->best = model_.arch->greedy_tokens(gc, s->logits);
    g.mark_output(s->best);
    if ((s->hidden = gc.captured)) g.mark_output(s->hidden);
    s->plan = plan_memory(g, 256, model_.backend->launch_last_nodes(g));
    if (steps_.size() >= 16) {  // decode, verify of each draft length, prefill chunks
        if (last_step_ == steps_.front().get()) last_step_ = nullptr;
        steps_.erase(steps_.begin());
    }
    steps_.push_back(std::move(s));
    return *steps_.back();
}

void Context::set_capture(const HiddenCapture & c) {
    for (int32_t il : c.layers)
        if (il != HiddenCapture::kFinalNorm && (il < 0 || il >= model_.hparams.n_layer))
            fail(SPARK_ERR_INVALID_ARGUMENT, "hidden state of layer %d requested, but the model has layers 0 .. %lld", il,
                 (long long) model_.hparams.n_layer - 1);
    if (c.project && c.project->k != int64_t(c.layers.size()) * model_.hparams.n_embd)
        fail(SPARK_ERR_SHAPE_MISMATCH, "the projection of the captured hidden states takes %lld inputs, the %zu layers give %lld", (long long) c.project->k,
             c.layers.size(), (long long) (int64_t(c.layers.size()) * model_.hparams.n_embd));
    if (c == capture_) return;
    capture_ = c;
    steps_.clear();
    last_step_ = nullptr;
    n_outputs_ = 0;
}

void Context::set_rollback(int32_t n) {
    if (n < 0 || n > 64) fail(SPARK_ERR_INVALID_ARGUMENT, "n_rollback %d is outside [0, 64]", n);
    if (n == memory_->n_rollback()) return;
    memory_->set_rollback(n);
    params_.n_rollback = n;
    steps_.clear();  // the state tensors changed shape
    last_step_ = nullptr;
    n_outputs_ = 0;
}

int64_t Context::hidden_width() const {
    if (const int64_t w = model_.arch->hidden_output_width(model_); w > 0) return w;
    if (capture_.project) return capture_.project->n;
    return int64_t(capture_.layers.size()) * model_.hparams.n_embd;
}

void Context::download_pending() {
    if (pending_argmax_ && last_step_ && !pending_rows_.empty()) {
        std::vector<int32_t> ids(size_t(last_step_->n_out));
        model_.backend->download(ids.data(), last_step_->best->data, ids.size() * 4);
        for (auto [j, out] : pending_rows_) argmax_[size_t(out)] = ids[size_t(j)];
    }
    pending_argmax_ = false;
}

void Context::fetch_outputs() {
    logits();
    download_pending();
    if (n_outputs_ > 0 && hidden_width() > 0) hidden_ith(-1);
    pending_rows_.clear();
    pending_hidden_.clear();
}

const float * Context::logits() {
    if (n_outputs_ == 0) return nullptr;
    if (pending_logits_ && last_step_) {
        const size_t row_bytes = size_t(model_.hparams.n_vocab) * 4;
        const char * src       = static_cast<const char *>(last_step_->logits->data);
        for (auto [j, out] : pending_rows_) model_.backend->download(logits_.data() + size_t(out) * size_t(model_.hparams.n_vocab), src + size_t(j) * row_bytes, row_bytes);
    }
    pending_logits_ = false;
    return logits_.data();
}

const float * Context::logits_ith(int32_t i) {
    const int32_t out = output_index(i);
    if (out < 0) return nullptr;
    return logits() + size_t(out) * size_t(model_.hparams.n_vocab);
}

int32_t Context::argmax_ith(int32_t i) {
    const int32_t out = output_index(i);
    if (out < 0) return -1;
    if (pending_argmax_) download_pending();
    return argmax_[size_t(out)];
}

const float * Context::hidden_ith(int32_t i) {
    const int32_t out = output_index(i);
    const int64_t w   = hidden_width();
    if (out < 0 || w == 0) return nullptr;
    if (pending_hid_ && last_step_ && last_step_->hidden) {
        const size_t row_bytes = size_t(w) * 4;
        const char * src       = static_cast<const char *>(last_step_->hidden->data);
        for (auto [row, o] : pending_hidden_) model_.backend->download(hidden_.data() + size_t(o) * size_t(w), src + size_t(row) * row_bytes, row_bytes);
    }
    pending_hid_ = false;
    return hidden_.data() + size_t(out) * size_t(w);
}

const int32_t * Context::device_tokens() const { return last_step_ ? static_cast<const int32_t *>(last_step_->best->data) : nullptr; }
const float *   Context::device_logits() const { return last_step_ ? static_cast<const float *>(last_step_->logits->data) : nullptr; }
const float *   Context::device_hidden() const {
    return last_step_ && last_step_->hidden ? static_cast<const float *>(last_step_->hidden->data) : nullptr;
}

void Context::validate(const spark_batch & b, std::vector<Row> & rows, std::vector<int32_t> & n_new) const {
    if (b.n_tokens <= 0) fail(SPARK_ERR_INVALID_ARGUMENT, "batch has no tokens");
    if (!b.token || !b.pos || !b.n_seq_id || !b.seq_id)
        fail(SPARK_ERR_INVALID_ARGUMENT, "batch is missing token, pos or seq_id arrays");
    const int32_t n_vocab = int32_t(model_.hparams.embd_vocab());
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

void Context::begin_outputs(int32_t n_outputs) {
    n_outputs_ = n_outputs;
    logits_.resize(size_t(n_outputs) * size_t(model_.hparams.n_vocab));
    argmax_.assign(size_t(n_outputs), -1);
    hidden_.resize(size_t(n_outputs) * size_t(hidden_width()));
    pending_rows_.clear();
    pending_hidden_.clear();
    pending_logits_ = pending_argmax_ = pending_hid_ = false;
    last_step_ = nullptr;
}

void Context::decode_rank(const spark_batch & batch) {
    std::vector<Row>     rows;
    std::vector<int32_t> n_new;
    validate(batch, rows, n_new);
    memory_->reserve(n_new);  // SPARK_ERR_CONTEXT_FULL leaves everything unchanged

    output_of_row_.assign(size_t(batch.n_tokens), -1);
    int32_t n_out = 0;
    for (int32_t i = 0; i < batch.n_tokens; ++i)
        if (batch.logits ? batch.logits[i] != 0 : i == batch.n_tokens - 1) output_of_row_[size_t(i)] = n_out++;
    begin_outputs(n_out);

    // Steps of at most n_batch tokens. A step that fails or is aborted leaves no trace; the steps
    // completed before it are kept (each sequence's length tells how far the decode got).
    const bool several_steps = rows.size() > size_t(params_.n_batch);
    std::vector<int32_t> step_start(static_cast<size_t>(params_.n_seq_max));
    for (size_t first = 0; first < rows.size(); first += size_t(params_.n_batch)) {
        const int32_t n = int32_t(std::min(rows.size() - first, size_t(params_.n_batch)));
        for (int32_t s = 0; s < params_.n_seq_max; ++s) step_start[size_t(s)] = memory_->seq_length(s);
        const auto t_start = std::chrono::steady_clock::now();
        memory_->drop_backup();
        try {
            if (abort_cb_ && peers_.empty() && abort_cb_(abort_data_)) fail(SPARK_ERR_ABORTED, "decode aborted by the abort callback");
            // A step that can stop half-way (a later step of the call may fail; the CPU checks the
            // abort callback between ops) and writes the ring entry its sequence started from must
            // be able to put that state back.
            if (memory_->has_recurrent() && (several_steps || abort_cb_)) {
                std::vector<int32_t> count(size_t(params_.n_seq_max), 0), seqs;
                for (int32_t i = 0; i < n; ++i) ++count[size_t(rows[first + size_t(i)].seq)];
                for (int32_t s = 0; s < params_.n_seq_max; ++s)
                    if (count[size_t(s)] >= memory_->ring_size()) seqs.push_back(s);
                if (!seqs.empty()) memory_->backup(seqs);
            }
            run_step(rows.data() + first, n, {}, {});
            const bool last = first + size_t(n) == rows.size();
            // The arena is reused by the next step: only the last step's outputs may stay there.
            if (!last) fetch_outputs();
            // spark_decode returns when the step is done (a device error surfaces here, not later).
            else if (pending_argmax_) download_pending();
            else model_.backend->synchronize();
        } catch (...) {
            ++perf_.n_failed;
            memory_->undo(step_start);
            n_outputs_ = 0;
            last_step_ = nullptr;
            throw;
        }
        // Prompt-like steps carry several tokens of one sequence (rows are grouped by sequence).
        bool several_of_one = false;
        for (int32_t i = 1; i < n; ++i) several_of_one |= rows[first + size_t(i)].seq == rows[first + size_t(i) - 1].seq;
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_start).count();
        (several_of_one ? perf_.n_prompt_tokens : perf_.n_gen_tokens) += n;
        (several_of_one ? perf_.t_prompt_ms : perf_.t_gen_ms) += ms;
    }
    ++perf_.n_decode;
}

void Context::set_abort(spark_abort_callback cb, void * data) {
    abort_cb_   = cb;
    abort_data_ = data;
    // A split context checks it before each call only (decode): see there.
    if (executor_ && peers_.empty()) executor_->should_abort = cb ? std::function<bool()>([cb, data] { return cb(data); }) : std::function<bool()>();
}

void Context::step(const std::vector<StepRow> & in, const std::vector<DeviceRows> & tokens, const std::vector<DeviceRows> & hidden) {
    if (!peers_.empty())
        fail(SPARK_ERR_UNSUPPORTED, "speculative decoding with a model split over %d devices is not supported yet", model_.shard.size);
    const int32_t n = int32_t(in.size());
    if (n <= 0 || n > params_.n_batch) fail(SPARK_ERR_INTERNAL, "context step of %d rows (n_batch %d)", n, params_.n_batch);
    std::vector<Row>     rows(in.size());
    std::vector<int32_t> n_new(size_t(params_.n_seq_max), 0);
    output_of_row_.assign(in.size(), -1);
    int32_t n_out = 0;
    for (int32_t i = 0; i < n; ++i) {
        const StepRow & r = in[size_t(i)];
        SPARK_ASSERT(r.seq >= 0 && r.seq < params_.n_seq_max);
        SPARK_ASSERT(r.pos == memory_->seq_length(r.seq) + n_new[size_t(r.seq)]);
        SPARK_ASSERT(i == 0 || r.seq >= in[size_t(i - 1)].seq);
        ++n_new[size_t(r.seq)];
        rows[size_t(i)] = {i, r.token, r.pos, r.seq, r.logits};
        if (r.logits) output_of_row_[size_t(i)] = n_out++;
    }
    memory_->reserve(n_new);
    begin_outputs(n_out);
    std::vector<int32_t> start_len(static_cast<size_t>(params_.n_seq_max));
    for (int32_t s = 0; s < params_.n_seq_max; ++s) start_len[size_t(s)] = memory_->seq_length(s);
    memory_->drop_backup();
    try {
        run_step(rows.data(), n, tokens, hidden);
    } catch (...) {
        ++perf_.n_failed;
        memory_->undo(start_len);
        n_outputs_ = 0;
        last_step_ = nullptr;
        throw;
    }
}

void Context::run_step(const Row * rows, int32_t n, const std::vector<DeviceRows> & tokens, const std::vector<DeviceRows> & hidden) {
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
    if (step.hidden_in && hidden.empty()) fail(SPARK_ERR_INTERNAL, "a head step needs hidden-state inputs");

    staging_.clear();
    for (int32_t i = 0; i < n; ++i) staging_.push_back(rows[i].token);
    for (int32_t i = 0; i < n; ++i) staging_.push_back(rows[i].pos);
    for (int32_t i = 0; i < n; ++i) staging_.push_back(rows[i].seq);
    staging_.insert(staging_.end(), memory_->block_table().begin(), memory_->block_table().end());
    staging_.insert(staging_.end(), ranges.begin(), ranges.end());
    staging_.insert(staging_.end(), out_rows.begin(), out_rows.end());
    SPARK_ASSERT(int64_t(staging_.size()) == step.inputs->ne[0]);

    const auto t1 = std::chrono::steady_clock::now();
    // Inputs first: device-fed rows may come from the previous step's outputs in the arena, which
    // a growing arena frees.
    be.upload(step.inputs->data, staging_.data(), staging_.size() * 4);
    for (const DeviceRows & d : tokens) {
        SPARK_ASSERT(d.first >= 0 && d.count >= 0 && d.first + d.count <= n);
        be.copy(static_cast<char *>(step.inputs->data) + size_t(d.first) * 4, d.src, size_t(d.count) * 4);
    }
    if (step.hidden_in) {
        const size_t row_bytes = size_t(step.hidden_in->ne[0]) * 4;
        int32_t      covered   = 0;
        for (const DeviceRows & d : hidden) {
            SPARK_ASSERT(d.first >= 0 && d.count >= 0 && d.first + d.count <= n);
            be.copy(static_cast<char *>(step.hidden_in->data) + size_t(d.first) * row_bytes, d.src, size_t(d.count) * row_bytes);
            covered += d.count;
        }
        SPARK_ASSERT(covered == n);
    }
    if (!arena_ || arena_->size() < step.plan.arena_bytes) {
        for (auto & s : steps_) s->bound_to = nullptr;
        last_step_ = nullptr;
        be.synchronize();  // copies above may still read the old arena
        arena_.reset();
        arena_ = be.alloc(step.plan.arena_bytes + step.plan.arena_bytes / 8);  // headroom for the next shapes
    }
    if (step.bound_to != arena_->data()) {
        bind_memory(*step.graph, step.plan, arena_->data());
        step.bound_to = arena_->data();
    }
    if (fail_after_ == 0) {
        fail_after_ = -1;
        fail(SPARK_ERR_DEVICE, "injected failure (test)");
    }
    if (fail_after_ > 0) --fail_after_;
    be.compute(*step.graph, executor_.get());
    rows_computed_ += n;
    ++perf_.n_steps;
    perf_.n_tokens += n;

    // The outputs stay on the backend until asked for.
    last_step_ = &step;
    if (any_out)
        for (size_t j = 0; j < out_rows.size(); ++j) {
            const int32_t out = output_of_row_[size_t(rows[out_rows[j]].batch_index)];
            pending_rows_.push_back({int32_t(j), out});
            pending_hidden_.push_back({out_rows[j], out});
        }
    pending_logits_ = pending_argmax_ = pending_hid_ = any_out;
    for (size_t r = 0; r < ranges.size(); r += 3) memory_->advance(ranges[r], ranges[r + 2]);
    if (profile_) {
        const auto t2 = std::chrono::steady_clock::now();
        auto us = [](auto a, auto b) { return std::chrono::duration<double, std::micro>(b - a).count(); };
        profile_->steps += 1;
        profile_->prepare_us += us(t0, t1);
        profile_->launch_us += us(t1, t2);
    }
}

Context::~Context() {
    if (profile_ && profile_->steps)
        log(SPARK_LOG_INFO, "spark: %lld steps, per step: prepare %.1f us, upload + launch %.1f us\n", (long long) profile_->steps,
                     profile_->prepare_us / double(profile_->steps), profile_->launch_us / double(profile_->steps));
}

}  // namespace spark
