#include "runtime/speculative/speculator.h"

#include "common/error.h"
#include "runtime/sampler.h"
#include "text/tokenizer.h"

#include <algorithm>
#include <chrono>
#include <numeric>

namespace spark::spec {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

Speculator::Speculator(Context & target, const spark_spec_params & p) : target_(target), params_(p) {
    const int32_t k = p.n_draft_max;
    if (target.speculating) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_init: the context already has a speculative loop (one per context)");
    if (p.kind != SPARK_SPEC_DRAFT_MODEL && p.kind != SPARK_SPEC_EAGLE3 && p.kind != SPARK_SPEC_MTP && p.kind != SPARK_SPEC_NGRAM)
        fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_init: unknown draft source kind %d", int(p.kind));
    if (k < 1 || k > SPARK_SPEC_MAX_DRAFT)
        fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_init: n_draft_max %d is outside [1, %d]", k, SPARK_SPEC_MAX_DRAFT);
    if (p.n_draft_min < 0 || p.n_draft_min > k)
        fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_init: n_draft_min %d is outside [0, n_draft_max = %d]", p.n_draft_min, k);
    if (!(p.p_min >= 0.0f && p.p_min <= 1.0f)) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_init: p_min %g is outside [0, 1]", double(p.p_min));
    if (p.sim_accept) {
        sim_accept_.assign(p.sim_accept, p.sim_accept + k);
        for (int32_t i = 0; i < k; ++i)
            if (!(sim_accept_[size_t(i)] >= 0.0f && sim_accept_[size_t(i)] <= (i ? sim_accept_[size_t(i - 1)] : 1.0f)))
                fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_init: sim_accept must be probabilities in [0, 1], non-increasing (entry %d is %g)", i,
                     double(sim_accept_[size_t(i)]));
        sim_rng_.seed(p.sim_seed);
    }
    if ((p.kind == SPARK_SPEC_DRAFT_MODEL || p.kind == SPARK_SPEC_EAGLE3) && (!p.path || !*p.path))
        fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_init: the %s source needs a path", p.kind == SPARK_SPEC_EAGLE3 ? "EAGLE3" : "draft model");
    const spark_context_params & tp = target.params();
    if (k + 1 > tp.n_ctx)
        fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_init: verifying %d drafts takes %d positions but the context holds %d (n_ctx)", k, k + 1, tp.n_ctx);
    if (k + 1 > tp.n_batch)
        fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_init: verifying %d drafts is a step of %d tokens, more than n_batch = %d", k, k + 1, tp.n_batch);

    SourceOptions o{p.kind, p.path ? p.path : "", k, p.ngram_min, p.ngram_max};
    switch (p.kind) {
        case SPARK_SPEC_DRAFT_MODEL: source_ = make_draft_model_source(target, o); break;
        case SPARK_SPEC_EAGLE3:
        case SPARK_SPEC_MTP: source_ = make_head_source(target, o); break;
        default: source_ = make_ngram_source(o); break;
    }
    // Only now is the target changed: the recurrent states of the last k positions are kept (the
    // rejected rows of a verify step are cut without recompute) and its steps output what the
    // source reads.
    if (target.memory().n_rollback() < k) target.set_rollback(k);
    target.set_capture(source_->capture());
    target.speculating = true;
    seqs_.resize(size_t(tp.n_seq_max));
    params_.path = nullptr;  // the caller's string is only valid during the call
}

Speculator::~Speculator() {
    target_.speculating = false;
    try {
        target_.set_capture({});
    } catch (...) {
    }
}

void Speculator::check_seq(int32_t seq) const {
    if (seq < 0 || seq >= int32_t(seqs_.size())) fail(SPARK_ERR_INVALID_ARGUMENT, "sequence id %d is outside [0, %zu)", seq, seqs_.size());
}

bool Speculator::is_eog(int32_t token) const {
    const Model & m = target_.model();
    if (m.tokenizer) return m.tokenizer->tokenizer.is_eog(token);
    return std::find(m.hparams.eos_token_ids.begin(), m.hparams.eos_token_ids.end(), token) != m.hparams.eos_token_ids.end();
}

void Speculator::begin(int32_t seq, const int32_t * prompt, int32_t n) {
    const auto t0 = Clock::now();
    check_seq(seq);
    Memory &      mem     = target_.memory();
    const int32_t n_ctx   = target_.params().n_ctx;
    const int32_t n_vocab = int32_t(target_.model().hparams.embd_vocab());
    if (!prompt || n <= 0) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_begin: empty prompt");
    for (int32_t i = 0; i < n; ++i)
        if (prompt[i] < 0 || prompt[i] >= n_vocab) fail(SPARK_ERR_INVALID_TOKEN, "spark_spec_begin: prompt token %d is %d, outside [0, %d)", i, prompt[i], n_vocab);

    // Keep the longest prefix the target's cache shares with the prompt (a chat's earlier turns);
    // at least the last prompt token is decoded, for its logits. A sequence changed behind the
    // loop's back starts over.
    SeqState & st     = seqs_[size_t(seq)];
    int32_t    cached = st.cached();
    if (mem.seq_length(seq) != cached) cached = 0;
    int32_t common = 0;
    while (common < cached && common < n - 1 && st.tokens[size_t(common)] == prompt[common]) ++common;
    int32_t keep = source_->keep(seq, common);
    // A recurrent state cannot be cut back to any position: it goes back to the latest snapshot the
    // host took of this sequence inside the prefix (a server's cached system prompt), else to 0.
    int32_t snapshot = -1;
    if (!mem.can_rm(seq, keep, -1)) {
        snapshot = mem.latest_snapshot(seq, keep);
        keep     = snapshot >= 0 ? mem.snapshot_length(snapshot) : 0;
    }
    if (mem.total_tokens() - mem.seq_length(seq) + n > n_ctx)
        fail(SPARK_ERR_CONTEXT_FULL, "spark_spec_begin: a prompt of %d tokens does not fit the context (%d of n_ctx = %d used by other sequences)", n,
             mem.total_tokens() - mem.seq_length(seq), n_ctx);

    if (snapshot >= 0) mem.restore(seq, snapshot);
    mem.seq_rm(seq, keep, -1);
    source_->truncate(seq, keep);
    st.tokens.resize(size_t(keep));
    st.pending = st.begun = false;
    try {
        const int32_t n_batch = target_.params().n_batch;
        int32_t       last    = 0;
        for (int32_t i = keep; i < n; i += n_batch) {
            const int32_t        m = std::min(n_batch, n - i);
            std::vector<StepRow> rows;
            for (int32_t r = 0; r < m; ++r) rows.push_back({prompt[i + r], i + r, seq, i + r == n - 1});
            target_.step(rows);
            st.tokens.insert(st.tokens.end(), prompt + i, prompt + i + m);
            source_->prefilled(target_, {Span{seq, 0, m, i}}, {&st});
            last = m - 1;
        }
        st.first_greedy = target_.argmax_ith(last);
        const float * l = target_.logits_ith(last);
        st.first_logits.assign(l, l + target_.model().hparams.n_vocab);
        st.begun = true;
    } catch (...) {
        // A failed step (a device error) leaves the sequence empty everywhere.
        st = SeqState{};
        mem.seq_rm(seq, 0, -1);
        source_->truncate(seq, 0);
        throw;
    }
    stats_.t_prefill_s += seconds_since(t0);
    stats_.n_prompt += n - keep;
}

void Speculator::step(int32_t n_seqs, const int32_t * seq_ids, spark_sampler ** samplers, int32_t * out, int32_t capacity, int32_t * n_out) {
    const int32_t k_max = params_.n_draft_max;
    if (n_seqs <= 0 || !seq_ids || !samplers || !out || !n_out) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_step: bad argument");
    if (capacity < k_max + 2) fail(SPARK_ERR_BUFFER_TOO_SMALL, "spark_spec_step: capacity %d per sequence, need n_draft_max + 2 = %d", capacity, k_max + 2);
    Memory &             mem = target_.memory();
    const int32_t        n_ctx = target_.params().n_ctx, n_batch = target_.params().n_batch;
    std::vector<int32_t> order(static_cast<size_t>(n_seqs));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return seq_ids[a] < seq_ids[b]; });
    for (int32_t j = 0; j < n_seqs; ++j) {
        const int32_t s = seq_ids[order[size_t(j)]];
        check_seq(s);
        if (j > 0 && s == seq_ids[order[size_t(j - 1)]]) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_step: sequence %d is listed twice", s);
        if (!samplers[order[size_t(j)]]) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_step: no sampler for sequence %d", s);
        const SeqState & st = seqs_[size_t(s)];
        if (!st.begun) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_step: sequence %d has no prompt (call spark_spec_begin first)", s);
        if (mem.seq_length(s) != st.cached())
            fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_step: sequence %d was changed outside the speculative loop (call spark_spec_begin again)", s);
    }
    // Room: each sequence verifies its pending token and up to k drafts.
    const int32_t room = n_ctx - mem.total_tokens();
    if (room < n_seqs) fail(SPARK_ERR_CONTEXT_FULL, "spark_spec_step: context full (%d of %d positions used)", mem.total_tokens(), n_ctx);
    if (n_seqs > n_batch) fail(SPARK_ERR_INVALID_ARGUMENT, "spark_spec_step: %d sequences in one step, more than n_batch = %d", n_seqs, n_batch);
    const int32_t k_room = std::min({k_max, room / n_seqs - 1, n_batch / n_seqs - 1});

    std::vector<int32_t> seqs(static_cast<size_t>(n_seqs)), emitted_n(static_cast<size_t>(n_seqs), 0);
    std::vector<std::vector<int32_t>> emitted(static_cast<size_t>(n_seqs));
    for (int32_t j = 0; j < n_seqs; ++j) seqs[size_t(j)] = seq_ids[order[size_t(j)]];

    // The first token of an answer comes from the prompt's logits.
    std::vector<size_t> active;
    for (size_t j = 0; j < seqs.size(); ++j) {
        SeqState &      st   = seqs_[size_t(seqs[j])];
        spark_sampler * smpl = samplers[order[j]];
        if (!st.pending) {
            int32_t t = st.first_greedy;
            if (sampler_is_pure_greedy(smpl)) spark_sampler_accept(smpl, t);
            else if (spark_sampler_sample_logits(smpl, st.first_logits.data(), int32_t(st.first_logits.size()), &t) != SPARK_OK)
                fail(SPARK_ERR_INTERNAL, "sampling the first token failed: %s", spark_last_error());
            st.tokens.push_back(t);
            st.pending = true;
            emitted[j].push_back(t);
            if (is_eog(t)) continue;
        }
        active.push_back(j);
    }
    if (active.empty()) {
        for (int32_t j = 0; j < n_seqs; ++j) {
            stats_.n_emitted += int64_t(emitted[size_t(j)].size());
            n_out[order[size_t(j)]] = int32_t(emitted[size_t(j)].size());
            std::copy(emitted[size_t(j)].begin(), emitted[size_t(j)].end(), out + size_t(order[size_t(j)]) * size_t(capacity));
        }
        return;
    }

    // Drafts.
    auto                            t0 = Clock::now();
    std::vector<const SeqState *>   st_of;
    std::vector<int32_t>            draft_seqs, k_of;
    for (size_t j : active) {
        st_of.push_back(&seqs_[size_t(seqs[j])]);
        draft_seqs.push_back(seqs[j]);
        k_of.push_back(std::max(k_room, 0));
    }
    Drafts drafts;
    source_->draft(st_of, draft_seqs, k_of, k_max, params_.p_min, drafts);
    for (size_t a = 0; a < active.size(); ++a) {
        int32_t & n = drafts.n[a];
        if (n < params_.n_draft_min) n = 0;
        // Simulated acceptance verifies full drafts: short ones (n-gram, p_min) are padded, on the
        // host with the last token, on the device with whatever the draft buffer holds (valid ids:
        // the tokens are not the point of a simulation).
        if (!sim_accept_.empty() && n < k_of[a]) {
            if (!drafts.device)
                for (int32_t d = n; d < k_of[a]; ++d)
                    drafts.host[a * size_t(drafts.k) + size_t(d)] = d ? drafts.host[a * size_t(drafts.k) + size_t(d - 1)] : st_of[a]->tokens.back();
            n = k_of[a];
        }
    }
    stats_.t_draft_s += seconds_since(t0);

    // Verify: one target step over [pending, drafts...] of every active sequence.
    t0 = Clock::now();
    std::vector<StepRow>    rows;
    std::vector<DeviceRows> feed;
    std::vector<Span>       spans;
    for (size_t a = 0; a < active.size(); ++a) {
        const SeqState & st = *st_of[a];
        const int32_t    n  = drafts.n[a], first = int32_t(rows.size()), pos0 = st.cached();
        spans.push_back({draft_seqs[a], first, n + 1, pos0});
        rows.push_back({st.tokens.back(), pos0, draft_seqs[a], true});
        for (int32_t d = 0; d < n; ++d)
            rows.push_back({drafts.device ? 0 : drafts.host[a * size_t(drafts.k) + size_t(d)], pos0 + 1 + d, draft_seqs[a], true});
        if (drafts.device && n > 0) feed.push_back({first + 1, n, drafts.device + a * size_t(drafts.k)});
    }
    target_.step(rows, feed);
    std::vector<int32_t> host_drafts = drafts.host;
    if (drafts.device) {
        host_drafts.resize(active.size() * size_t(drafts.k));
        target_.model().backend->download(host_drafts.data(), drafts.device, host_drafts.size() * 4);
    }
    stats_.t_verify_s += seconds_since(t0);

    // Accept a prefix of each sequence's drafts, and cut the rest from the target's memory.
    t0 = Clock::now();
    const int32_t        n_vocab = int32_t(target_.model().hparams.n_vocab);
    std::vector<int32_t> kept(active.size());
    for (size_t a = 0; a < active.size(); ++a) {
        const size_t  j     = active[a];
        SeqState &    st    = seqs_[size_t(draft_seqs[a])];
        const Span &  sp    = spans[a];
        const int32_t n     = drafts.n[a];
        int32_t       e[SPARK_SPEC_MAX_DRAFT + 1];
        int32_t       n_acc = 0, m = 0;
        if (sim_accept_.empty()) {
            m = verify_drafts(
                samplers[order[j]], n, host_drafts.data() + a * size_t(drafts.k), nullptr, n_vocab,
                [&](int32_t i) { return target_.logits_ith(sp.first + i); }, [&](int32_t i) { return target_.argmax_ith(sp.first + i); },
                [&](int32_t t) { return is_eog(t); }, e, &n_acc);
        } else {
            // Benchmarks: accept by chance, then the target's greedy token (no end of generation).
            const double u = double(sim_rng_() >> 8) / double(1u << 24);
            while (n_acc < n && u < double(sim_accept_[size_t(n_acc)])) ++n_acc;
            for (int32_t d = 0; d < n_acc; ++d) e[d] = host_drafts[a * size_t(drafts.k) + size_t(d)];
            e[n_acc] = target_.argmax_ith(sp.first + n_acc);
            m        = n_acc + 1;
        }
        // The pending token and the accepted drafts are now cached; the last emitted token is the
        // new pending one.
        mem.seq_rm(sp.seq, sp.pos0 + m, -1);
        st.tokens.insert(st.tokens.end(), e, e + m);
        emitted[j].insert(emitted[j].end(), e, e + m);
        kept[a] = m;
        stats_.n_steps += 1;
        stats_.n_drafted += n;
        stats_.n_accepted += n_acc;
        for (int32_t d = 0; d < n; ++d) stats_.drafted_at[d] += 1;
        for (int32_t d = 0; d < n_acc; ++d) stats_.accepted_at[d] += 1;
    }
    source_->verified(target_, spans, kept);
    stats_.t_accept_s += seconds_since(t0);

    for (int32_t j = 0; j < n_seqs; ++j) {
        const auto & e = emitted[size_t(j)];
        stats_.n_emitted += int64_t(e.size());
        n_out[order[size_t(j)]] = int32_t(e.size());
        std::copy(e.begin(), e.end(), out + size_t(order[size_t(j)]) * size_t(capacity));
    }
}

}  // namespace spark::spec
