#include "engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <stdexcept>

namespace spark_server {

namespace {

using Clock = std::chrono::steady_clock;

// Prompts of models with linear-attention layers get a snapshot at their last multiple of this many
// tokens: conversations that share a long system prompt (or a document) reuse it from there.
constexpr int32_t kSnapshotBlock = 256;
constexpr double  kRateWindowS   = 10.0;
// A shared prefix worth a KV copy from another slot (below it, decoding the tokens is as cheap).
constexpr size_t  kMinCopy       = 64;

double ms_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

size_t common_prefix(const std::vector<spark_token> & a, const std::vector<spark_token> & b) {
    const size_t n = std::min(a.size(), b.size());
    size_t       i = 0;
    while (i < n && a[i] == b[i]) ++i;
    return i;
}

spark_sampler * make_sampler(const SamplingParams & s) {
    spark_sampler * chain = spark_sampler_chain_init(spark_sampler_chain_default_params());
    if (!chain) throw std::runtime_error("cannot create a sampler");
    auto add = [&](spark_sampler * stage) {
        if (!stage || spark_sampler_chain_add(chain, stage) != SPARK_OK) {
            spark_sampler_free(stage);
            spark_sampler_free(chain);
            throw std::runtime_error(std::string("cannot create a sampler stage: ") + spark_last_error());
        }
    };
    if (!s.logit_bias.empty()) {
        std::vector<spark_token> ids;
        std::vector<float>       bias;
        for (const auto & [t, b] : s.logit_bias) {
            ids.push_back(t);
            bias.push_back(b);
        }
        add(spark_sampler_init_logit_bias(int32_t(ids.size()), ids.data(), bias.data()));
    }
    if (s.repeat_penalty != 1.0f) add(spark_sampler_init_penalties(s.repeat_last_n, s.repeat_penalty));
    if (s.presence != 0.0f || s.frequency != 0.0f) add(spark_sampler_init_presence_frequency(s.presence, s.frequency));
    if (s.temperature <= 0.0f) {
        add(spark_sampler_init_greedy());
        return chain;
    }
    add(spark_sampler_init_top_k(s.top_k));
    add(spark_sampler_init_top_p(s.top_p, 1));
    add(spark_sampler_init_min_p(s.min_p, 1));
    add(spark_sampler_init_temp(s.temperature));
    add(spark_sampler_init_dist(s.seed));
    return chain;
}

// log-softmax of `logits` at `token`, and the `top` most likely tokens with theirs.
TokenLogprob logprobs_of(const float * logits, int32_t n_vocab, spark_token token, int32_t top) {
    float m = -INFINITY;
    for (int32_t i = 0; i < n_vocab; ++i) m = std::max(m, logits[i]);
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(double(logits[i]) - m);
    const float   lse = m + float(std::log(sum));
    TokenLogprob  out{token, token >= 0 && token < n_vocab ? logits[token] - lse : -INFINITY, {}};
    if (top > 0) {
        std::vector<int32_t> ids(static_cast<size_t>(n_vocab));
        std::iota(ids.begin(), ids.end(), 0);
        const int32_t k = std::min(top, n_vocab);
        std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
            return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
        });
        for (int32_t i = 0; i < k; ++i) out.top.push_back({ids[size_t(i)], logits[ids[size_t(i)]] - lse});
    }
    return out;
}

// The length of the longest suffix of `text` that is a proper prefix of one of the stop strings:
// text that may still become a stop string is held back.
size_t stop_prefix_tail(const std::string & text, const std::vector<std::string> & stops) {
    size_t hold = 0;
    for (const std::string & s : stops)
        for (size_t n = std::min(s.size() - 1, text.size()); n > hold; --n)
            if (text.compare(text.size() - n, n, s, 0, n) == 0) {
                hold = n;
                break;
            }
    return hold;
}

}  // namespace

// ---- Request ---------------------------------------------------------------------------------

std::vector<Event> Request::wait(Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_until(lock, deadline, [&] { return !events_.empty() || done_; });
    std::vector<Event> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
    events_.clear();
    return out;
}
bool Request::finished() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
}
std::string Request::finish_reason() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reason_;
}
std::string Request::error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
}
Usage Request::usage() const {
    std::lock_guard<std::mutex> lock(mu_);
    return usage_;
}
void Request::push(Event e) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        events_.push_back(std::move(e));
    }
    cv_.notify_all();
}
void Request::finish(const std::string & reason, const Usage & u) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        done_   = true;
        reason_ = reason;
        usage_  = u;
    }
    cv_.notify_all();
}
void Request::fail(const std::string & error, const Usage & u) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        done_  = true;
        error_ = error;
        usage_ = u;
    }
    cv_.notify_all();
}

// ---- Engine ----------------------------------------------------------------------------------

struct Engine::Slot {
    int32_t                  id = 0;
    std::shared_ptr<Request> req;          // nullptr: idle
    std::vector<spark_token> cached;       // the tokens sequence `id` holds (reusable by the next request)
    uint64_t                 last_used = 0;
    bool                     answering = false;  // the prompt is in; `last` is the next row
    spark_token              last      = -1;
    spark_sampler *          smpl      = nullptr;
    spark_detok_stream *     detok     = nullptr;
    std::string              held;       // answer text held back: it may be the start of a stop string
    std::vector<TokenLogprob> held_lp;
    int32_t                  n_generated = 0;
    int32_t                  snapshot_at = 0;  // the prompt's block boundary (0: none)
    Usage                    usage;
    Clock::time_point        t_start, t_prompt_done;
    struct Snapshot {
        int32_t id = -1, pos = 0;
    } snaps[2];  // [0]: a prompt's last block boundary, [1]: a prompt's end
};

Engine::Engine(spark_model * model, spark_context * ctx, EngineOptions opt)
    : model_(model), ctx_(ctx), tok_(spark_model_get_tokenizer(model)), opt_(opt) {
    spark_model_info info{};
    if (spark_model_get_info(model, &info) != SPARK_OK) throw std::runtime_error(spark_last_error());
    if (!tok_) throw std::runtime_error("the model has no tokenizer");
    n_vocab_   = info.n_vocab;
    recurrent_ = info.n_layer_linear_attention > 0;
    batch_     = spark_batch_init(opt_.n_batch, 1);
    if (!batch_.token) throw std::runtime_error("cannot allocate the batch");
    for (int32_t i = 0; i < opt_.n_parallel; ++i) {
        slots_.push_back(std::make_unique<Slot>());
        slots_.back()->id = i;
    }
    thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
    shutdown();
    for (auto & s : slots_)
        for (auto & snap : s->snaps)
            if (snap.id >= 0) spark_memory_snapshot_free(ctx_, snap.id);
    spark_batch_free(batch_);
}

void Engine::shutdown() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto & r : queue_) r->fail("the server is shutting down", {});
    queue_.clear();
    for (auto & s : slots_) {
        if (s->req) s->req->fail("the server is shutting down", s->usage);
        release(*s);
    }
}

std::shared_ptr<Request> Engine::submit(GenerationParams params) {
    auto req = std::make_shared<Request>(std::move(params));
    // The HTTP layer refuses these first (400); here they would index past the prompt or the slot.
    if (req->params.prompt.empty() || int32_t(req->params.prompt.size()) >= opt_.n_ctx_slot) {
        req->fail("the prompt must have 1 to " + std::to_string(opt_.n_ctx_slot - 1) + " tokens", {});
        return req;
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_ || int32_t(queue_.size()) >= opt_.max_queue) {
            ++stats_.requests_rejected;
            return nullptr;
        }
        queue_.push_back(req);
        ++stats_.requests_total;
        stats_.queued = int32_t(queue_.size());
    }
    cv_.notify_all();
    return req;
}

EngineStats Engine::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    EngineStats s = stats_;
    const auto  now = Clock::now();
    int64_t     n   = 0;
    for (const auto & [t, k] : recent_)
        if (std::chrono::duration<double>(now - t).count() <= kRateWindowS) n += k;
    s.generated_per_s = double(n) / kRateWindowS;
    return s;
}

void Engine::loop() {
    for (;;) {
        std::vector<Admission> admitted;
        {
            std::unique_lock<std::mutex> lock(mu_);
            auto any_active = [&] {
                return std::any_of(slots_.begin(), slots_.end(), [](const auto & s) { return s->req != nullptr; });
            };
            auto any_idle = [&] {
                return std::any_of(slots_.begin(), slots_.end(), [](const auto & s) { return s->req == nullptr; });
            };
            cv_.wait(lock, [&] { return stop_ || any_active() || (!queue_.empty() && any_idle()); });
            if (stop_) return;
            // Requests whose client left while they waited.
            for (auto it = queue_.begin(); it != queue_.end();)
                if ((*it)->cancelled()) {
                    (*it)->fail("cancelled", {});
                    ++stats_.requests_cancelled;
                    it = queue_.erase(it);
                } else {
                    ++it;
                }
            // First come, first served; each takes the idle slot that holds most of its prompt
            // (the least recently used one among equals, so that other caches live longer).
            while (!queue_.empty()) {
                const auto & prompt = queue_.front()->params.prompt;
                Slot *       best = nullptr;
                size_t       best_len = 0;
                auto         taken = [&](const Slot * s) {
                    return std::any_of(admitted.begin(), admitted.end(), [&](const Admission & a) { return a.slot == s; });
                };
                for (auto & s : slots_) {
                    if (s->req || taken(s.get())) continue;
                    const size_t len = common_prefix(s->cached, prompt);
                    if (!best || len > best_len || (len == best_len && s->last_used < best->last_used)) {
                        best     = s.get();
                        best_len = len;
                    }
                }
                if (!best) break;
                Admission a{best, queue_.front(), nullptr};
                // Attention-only models: when another slot (busy or not) holds more of the prompt, or
                // the best idle slot would lose tokens of another conversation, copy that slot's
                // sequence into the least recently used idle slot instead (a KV copy: both caches
                // stay usable).
                if (!recurrent_ && !opt_.spec) {
                    Slot * source = nullptr;
                    size_t source_len = 0;
                    for (auto & s : slots_) {
                        const size_t len = common_prefix(s->cached, prompt);
                        if (len > source_len) source = s.get(), source_len = len;
                    }
                    const bool loses = best_len < best->cached.size();
                    if (source && source_len >= kMinCopy && (source_len > best_len || loses)) {
                        Slot * target = nullptr;
                        for (auto & s : slots_)
                            if (!s->req && !taken(s.get()) && s.get() != source && (!target || s->last_used < target->last_used)) target = s.get();
                        if (target) a = {target, queue_.front(), source};
                    }
                }
                admitted.push_back(a);
                queue_.pop_front();
            }
            stats_.queued = int32_t(queue_.size());
        }
        for (Admission & a : admitted) {
            if (a.copy_from && spark_memory_seq_cp(ctx_, a.copy_from->id, a.slot->id) == SPARK_OK) a.slot->cached = a.copy_from->cached;
            admit(*a.slot, a.req);
        }
        for (auto & s : slots_)
            if (s->req && s->req->cancelled()) {
                end(*s, "", "cancelled");
            }
        {
            std::lock_guard<std::mutex> lock(mu_);
            stats_.running = int32_t(std::count_if(slots_.begin(), slots_.end(), [](const auto & s) { return s->req != nullptr; }));
        }
        if (opt_.spec) spec_step();
        else step();
    }
}

void Engine::admit(Slot & slot, std::shared_ptr<Request> req) {
    const std::vector<spark_token> & prompt = req->params.prompt;
    slot.t_start     = Clock::now();
    slot.last_used   = ++use_counter_;
    slot.usage       = {};
    slot.n_generated = 0;
    slot.held.clear();
    slot.held_lp.clear();
    // Keep the shared prefix, but decode at least the prompt's last token: its logits start the answer.
    // (The speculative loop keeps prefixes itself: spec_begin.)
    int32_t keep = int32_t(std::min(common_prefix(slot.cached, prompt), prompt.size() - 1));
    if (!opt_.spec && keep < int32_t(slot.cached.size())) {
        if (spark_memory_seq_can_rm(ctx_, slot.id, keep, -1)) {
            spark_memory_seq_rm(ctx_, slot.id, keep, -1);
        } else {
            // A recurrent state goes back only to a snapshot: the latest one inside the prefix.
            Slot::Snapshot * from = nullptr;
            for (auto & s : slot.snaps)
                if (s.id >= 0 && s.pos <= keep && (!from || s.pos > from->pos)) from = &s;
            if (from && spark_memory_seq_restore(ctx_, slot.id, from->id) == SPARK_OK) {
                keep = from->pos;
            } else {
                spark_memory_seq_rm(ctx_, slot.id, 0, -1);
                keep = 0;
            }
        }
        for (auto & s : slot.snaps)
            if (s.id >= 0 && s.pos > keep) {
                spark_memory_snapshot_free(ctx_, s.id);
                s = {};
            }
        slot.cached.resize(size_t(keep));
    }
    slot.usage.prompt_tokens = int32_t(prompt.size());
    slot.usage.cached_tokens = keep;
    slot.snapshot_at = recurrent_ ? int32_t((prompt.size() - 1) / kSnapshotBlock) * kSnapshotBlock : 0;
    try {
        slot.smpl = make_sampler(req->params.sampling);
    } catch (const std::exception & e) {
        req->fail(e.what(), slot.usage);
        return;
    }
    slot.detok = spark_detok_stream_init(tok_, true);
    slot.req   = std::move(req);
    if (opt_.spec) spec_begin(slot);
}

// The speculative loop decodes a prompt in one call (spark_spec_begin), keeping what the sequence
// shares with it. On a model with linear-attention layers it goes back to the latest snapshot inside
// the shared prefix: the prompt is decoded in up to three calls, a snapshot after each of the first
// two, at the last block boundary and one token before the end (a head drafts from the hidden state
// of the position before a changed token, so that position is decoded again).
void Engine::spec_begin(Slot & slot) {
    const std::vector<spark_token> & prompt = slot.req->params.prompt;
    const int32_t                    n      = int32_t(prompt.size());
    spark_spec_stats                 before{}, after{};
    spark_spec_get_stats(opt_.spec, &before);
    // Snapshot positions the sequence does not hold yet (below them nothing is decoded again).
    const int32_t        common = int32_t(common_prefix(slot.cached, prompt));
    std::vector<int32_t> stops;
    if (recurrent_) {
        for (int32_t q : {slot.snapshot_at, n - 1})
            if (q > common && q < n && (stops.empty() || q > stops.back())) stops.push_back(q);
    }
    stops.push_back(n);
    spark_status st = SPARK_OK;
    for (size_t i = 0; i < stops.size() && st == SPARK_OK; ++i) {
        st = spark_spec_begin(opt_.spec, slot.id, prompt.data(), stops[i]);
        if (st == SPARK_OK && i + 1 < stops.size()) take_snapshot(slot, stops[i] == n - 1 ? 1 : 0, stops[i]);
    }
    spark_spec_get_stats(opt_.spec, &after);
    const auto now = Clock::now();
    if (st != SPARK_OK) {
        end(slot, "", std::string("cannot decode the prompt: ") + spark_last_error());
        slot.cached.clear();
        return;
    }
    slot.cached                = prompt;
    slot.usage.cached_tokens   = n - int32_t(after.n_prompt - before.n_prompt);
    slot.usage.prompt_ms       = ms_between(slot.t_start, now);
    slot.t_prompt_done         = now;
    slot.answering             = true;
    std::lock_guard<std::mutex> lock(mu_);
    stats_.prompt_tokens += after.n_prompt - before.n_prompt;
    stats_.cached_prompt_tokens += slot.usage.cached_tokens;
}

// One speculative step of every answering slot (spark_spec_step verifies all of them in one target
// step); each slot's tokens go out as the plain loop's do.
void Engine::spec_step() {
    std::vector<Slot *>          active;
    std::vector<spark_seq_id>    seqs;
    std::vector<spark_sampler *> samplers;
    for (auto & s : slots_)
        if (s->req && s->answering) {
            active.push_back(s.get());
            seqs.push_back(s->id);
            samplers.push_back(s->smpl);
        }
    if (active.empty()) return;
    constexpr int32_t    kCap = SPARK_SPEC_MAX_DRAFT + 2;
    std::vector<spark_token> out(active.size() * kCap);
    std::vector<int32_t>     n_out(active.size());
    const spark_status st  = spark_spec_step(opt_.spec, int32_t(active.size()), seqs.data(), samplers.data(), out.data(), kCap, n_out.data());
    const auto         now = Clock::now();
    if (st != SPARK_OK) {
        const std::string why = std::string("speculative step failed: ") + spark_last_error();
        std::fprintf(stderr, "spark-server: %s\n", why.c_str());
        for (Slot * s : active) end(*s, "", why);
        return;
    }
    int32_t generated = 0;
    for (size_t i = 0; i < active.size(); ++i) {
        Slot & s = *active[i];
        for (int32_t k = 0; k < n_out[i]; ++k) {
            const spark_token t = out[i * kCap + size_t(k)];
            s.cached.push_back(t);
            ++generated;
            if (!take_token(s, t, nullptr, now)) break;
        }
        // The sequence holds the prompt and the answer but its last token (not decoded yet).
        s.cached.resize(std::min(s.cached.size(), size_t(std::max(0, spark_memory_seq_length(ctx_, s.id)))));
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.steps;
    stats_.generated_tokens += generated;
    recent_.emplace_back(now, generated);
    while (!recent_.empty() && std::chrono::duration<double>(now - recent_.front().first).count() > kRateWindowS) recent_.pop_front();
    stats_.running = int32_t(std::count_if(slots_.begin(), slots_.end(), [](const auto & x) { return x->req != nullptr; }));
}

// Ends the slot's request. The slot is free, and counted so, before the reader learns that its
// request ended.
void Engine::end(Slot & slot, const std::string & reason, const std::string & error) {
    const std::shared_ptr<Request> req   = slot.req;
    const Usage                    usage = slot.usage;
    release(slot);
    {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.running = int32_t(std::count_if(slots_.begin(), slots_.end(), [](const auto & x) { return x->req != nullptr; }));
        if (error == "cancelled") ++stats_.requests_cancelled;
        else if (!error.empty()) ++stats_.requests_failed;
    }
    if (error.empty()) req->finish(reason, usage);
    else req->fail(error, usage);
}

void Engine::release(Slot & slot) {
    spark_sampler_free(slot.smpl);
    slot.smpl = nullptr;
    spark_detok_stream_free(slot.detok);
    slot.detok     = nullptr;
    slot.req       = nullptr;
    slot.answering = false;
}

void Engine::take_snapshot(Slot & slot, int which, int32_t pos) {
    Slot::Snapshot & s = slot.snaps[which];
    if (s.id >= 0) spark_memory_snapshot_free(ctx_, s.id);
    s = {};
    int32_t id = -1;
    if (spark_memory_seq_snapshot(ctx_, slot.id, &id) == SPARK_OK) s = {id, pos};
}

void Engine::step() {
    struct Part {
        Slot *  slot;
        int32_t row0, n;  // rows [row0, row0 + n) of the batch
        bool    prompt;   // a chunk of the prompt (else the answer's last token)
    };
    std::vector<Part> parts;
    batch_.n_tokens = 0;
    auto add_row    = [&](Slot & s, spark_token t, bool logits) {
        const int32_t i   = batch_.n_tokens++;
        batch_.token[i]   = t;
        batch_.pos[i]     = int32_t(s.cached.size()) + (i - parts.back().row0);
        batch_.n_seq_id[i] = 1;
        batch_.seq_id[i][0] = s.id;
        batch_.logits[i]  = logits ? 1 : 0;
    };
    for (auto & s : slots_)
        if (s->req && s->answering) {
            parts.push_back({s.get(), batch_.n_tokens, 1, false});
            add_row(*s, s->last, true);
        }
    for (auto & s : slots_) {
        const int32_t room = opt_.n_batch - batch_.n_tokens;
        if (!s->req || s->answering || room <= 0) continue;
        const auto &  prompt = s->req->params.prompt;
        const int32_t done   = int32_t(s->cached.size());
        int32_t       n      = std::min(int32_t(prompt.size()) - done, room);
        if (s->snapshot_at > done) n = std::min(n, s->snapshot_at - done);  // end the chunk at the snapshot's position
        parts.push_back({s.get(), batch_.n_tokens, n, true});
        for (int32_t k = 0; k < n; ++k) add_row(*s, prompt[size_t(done + k)], done + k + 1 == int32_t(prompt.size()));
    }
    if (parts.empty()) return;

    const spark_status st = spark_decode(ctx_, &batch_);
    const auto         now = Clock::now();
    if (st != SPARK_OK) {
        // The step left no trace; its requests fail (the server goes on with the others).
        const std::string why = std::string("decode failed: ") + spark_last_error();
        std::fprintf(stderr, "spark-server: %s\n", why.c_str());
        for (auto & p : parts) end(*p.slot, "", why);
        return;
    }
    int32_t generated = 0;
    for (auto & p : parts) {
        Slot & s = *p.slot;
        for (int32_t k = 0; k < p.n; ++k) s.cached.push_back(batch_.token[p.row0 + k]);
        if (!s.answering) {
            const auto & prompt = s.req->params.prompt;
            if (recurrent_ && s.snapshot_at > 0 && int32_t(s.cached.size()) == s.snapshot_at) take_snapshot(s, 0, s.snapshot_at);
            if (s.cached.size() < prompt.size()) continue;
            s.t_prompt_done   = now;
            s.usage.prompt_ms = ms_between(s.t_start, now);
            if (recurrent_) take_snapshot(s, 1, int32_t(s.cached.size()));
            std::lock_guard<std::mutex> lock(mu_);
            stats_.cached_prompt_tokens += s.usage.cached_tokens;
        }
        emit_token(s, p.row0 + p.n - 1, now);
        ++generated;
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.steps;
    stats_.generated_tokens += generated;
    for (auto & p : parts)
        if (p.prompt) stats_.prompt_tokens += p.n;
    recent_.emplace_back(now, generated);
    while (!recent_.empty() && std::chrono::duration<double>(now - recent_.front().first).count() > kRateWindowS) recent_.pop_front();
    stats_.running = int32_t(std::count_if(slots_.begin(), slots_.end(), [](const auto & s) { return s->req != nullptr; }));
}

void Engine::emit_token(Slot & s, int32_t row, Clock::time_point now) {
    spark_token t = -1;
    if (spark_sampler_sample(s.smpl, ctx_, row, &t) != SPARK_OK) {
        end(s, "", std::string("sampling failed: ") + spark_last_error());
        return;
    }
    TokenLogprob lp{};
    const bool   with_lp = s.req->params.logprobs >= 0 && spark_get_logits_ith(ctx_, row) != nullptr;
    if (with_lp) lp = logprobs_of(spark_get_logits_ith(ctx_, row), n_vocab_, t, s.req->params.logprobs);
    if (take_token(s, t, with_lp ? &lp : nullptr, now)) {
        s.last      = t;
        s.answering = true;
    }
}

bool Engine::take_token(Slot & s, spark_token t, const TokenLogprob * lp, Clock::time_point now) {
    Request & req = *s.req;
    ++s.n_generated;
    s.usage.completion_tokens = s.n_generated;
    s.usage.generation_ms     = ms_between(s.t_prompt_done, now);
    if (lp) s.held_lp.push_back(*lp);

    // Ends the answer: what the detokenizer still holds, cut at the first stop string.
    auto finish = [&](std::string reason) {
        char   buf[64];
        size_t len = 0;
        if (spark_detok_stream_flush(s.detok, buf, sizeof buf, &len) == SPARK_OK) s.held.append(buf, std::min(len, sizeof buf));
        size_t cut = std::string::npos;
        for (const std::string & stop : req.params.stop) cut = std::min(cut, s.held.find(stop));
        if (cut != std::string::npos) {
            s.held.resize(cut);
            reason = "stop";
        }
        if (!s.held.empty() || !s.held_lp.empty()) req.push({std::move(s.held), std::move(s.held_lp)});
        s.held.clear();
        s.held_lp.clear();
        end(s, reason, "");
    };

    if (spark_tokenizer_is_eog(tok_, t)) {
        finish("stop");
        return false;
    }
    // The token's text (complete UTF-8 characters only; the stream holds back a split one).
    char         piece[256];  // a token's text; a longer one is pushed again into a buffer of its size
    size_t       len = 0;
    spark_status st  = spark_detok_stream_push(s.detok, t, piece, sizeof piece, &len);
    if (st == SPARK_OK) {
        s.held.append(piece, len);
    } else if (st == SPARK_ERR_BUFFER_TOO_SMALL) {
        std::string longer(len, '\0');
        if (spark_detok_stream_push(s.detok, t, longer.data(), longer.size(), &len) == SPARK_OK) s.held.append(longer.data(), len);
    }
    bool stopped = false;
    for (const std::string & stop : req.params.stop) stopped = stopped || s.held.find(stop) != std::string::npos;
    const bool at_max   = req.params.max_tokens >= 0 && s.n_generated >= req.params.max_tokens;
    const bool ctx_full = int32_t(s.cached.size()) + 1 > opt_.n_ctx_slot;  // no room to decode t
    if (stopped || at_max || ctx_full) {
        finish(stopped ? "stop" : "length");
        return false;
    }
    // Hold back what may still become a stop string; the rest goes out now.
    const size_t hold = stop_prefix_tail(s.held, req.params.stop);
    if (s.held.size() > hold || !s.held_lp.empty()) {
        Event e{s.held.substr(0, s.held.size() - hold), std::move(s.held_lp)};
        s.held.erase(0, s.held.size() - hold);
        s.held_lp.clear();
        req.push(std::move(e));
    }
    return true;
}

}  // namespace spark_server
