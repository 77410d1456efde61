// Drafts from a second, smaller model of the same vocabulary, run in its own context on the
// target's backend (same device, same stream: no synchronisation between the two).
//
// Per sequence the draft's cache holds the first `len` tokens of the sequence. Drafting feeds what
// it lacks up to the pending token (chunks of n_batch; the last row's greedy token is the first
// draft), then k - 1 steps of one token each, each fed the previous step's greedy token on the
// backend. Those chained tokens stay in the draft's cache as far as the target accepts them.
#include "common/error.h"
#include "runtime/speculative/draft_source.h"
#include "text/tokenizer.h"

#include <algorithm>

namespace spark::spec {

namespace {

class DraftModelSource final : public DraftSource {
public:
    DraftModelSource(Context & target, std::unique_ptr<Model> model, int32_t k_max) : model_(std::move(model)) {
        spark_context_params p = target.params();
        p.n_ctx       = target.params().n_ctx + k_max;
        p.n_snapshots = 0;
        p.n_rollback  = k_max;  // a hybrid draft model drops its rejected chain exactly too
        ctx_          = std::make_unique<Context>(*model_, p);
        drafts_       = model_->backend->alloc(size_t(p.n_seq_max) * size_t(k_max) * 4);
        len_.assign(size_t(p.n_seq_max), 0);
    }

    const char * name() const override { return "draft"; }

    void truncate(int32_t seq, int32_t len) override {
        int32_t & have = len_[size_t(seq)];
        have           = std::min(have, len);
        if (!ctx_->memory().can_rm(seq, have, -1)) have = 0;  // a recurrent draft too far back: start over
        ctx_->memory().seq_rm(seq, have, -1);
    }

    void draft(const std::vector<const SeqState *> & st, const std::vector<int32_t> & seqs, const std::vector<int32_t> & k, int32_t k_max,
               float p_min, Drafts & out) override {
        Backend & be = *model_->backend;
        out.k        = k_max;
        out.n.assign(seqs.size(), 0);
        out.host.clear();
        out.device = static_cast<const int32_t *>(drafts_->data());

        // Catch up: everything but the last few tokens of each sequence in steps of their own, then
        // one step with every sequence's tail, whose last rows give the first drafts.
        const int32_t        n_batch = ctx_->params().n_batch;
        const int32_t        tail    = std::max<int32_t>(1, n_batch / int32_t(seqs.size()));
        std::vector<StepRow> rows;
        for (size_t i = 0; i < seqs.size(); ++i) {
            const std::vector<int32_t> & tok = st[i]->tokens;
            int32_t &                    len = len_[size_t(seqs[i])];
            while (int32_t(tok.size()) - len > tail) {
                const int32_t n = std::min<int32_t>(n_batch, int32_t(tok.size()) - len - tail);
                rows.clear();
                for (int32_t r = 0; r < n; ++r) rows.push_back({tok[size_t(len + r)], len + r, seqs[i], false});
                ctx_->step(rows);
                len += n;
            }
        }
        rows.clear();
        std::vector<int32_t> last_row(seqs.size());
        for (size_t i = 0; i < seqs.size(); ++i) {
            const std::vector<int32_t> & tok = st[i]->tokens;
            int32_t &                    len = len_[size_t(seqs[i])];
            SPARK_ASSERT(int32_t(tok.size()) > len);
            for (; len < int32_t(tok.size()); ++len) rows.push_back({tok[size_t(len)], len, seqs[i], len + 1 == int32_t(tok.size()) && k[i] > 0});
            last_row[i] = int32_t(rows.size()) - 1;
        }
        ctx_->step(rows);

        // Chain: each drafting sequence's greedy token is its next input, on the backend.
        struct Link {
            size_t  i;
            int32_t out, row;
        };
        std::vector<Link> active;
        for (size_t i = 0, o = 0; i < seqs.size(); ++i)
            if (k[i] > 0) active.push_back({i, int32_t(o++), last_row[i]});
        for (int32_t d = 0; !active.empty(); ++d) {
            const int32_t *   tokens = ctx_->device_tokens();
            std::vector<Link> next;
            for (const Link & a : active) {
                if (p_min > 0.0f && top_probability(ctx_->logits_ith(a.row), model_->hparams.n_vocab) < p_min) continue;
                be.copy(static_cast<int32_t *>(drafts_->data()) + a.i * size_t(k_max) + size_t(d), tokens + a.out, 4);
                out.n[a.i] = d + 1;
                if (d + 1 < k[a.i]) next.push_back(a);
            }
            if (next.empty()) break;
            rows.clear();
            std::vector<DeviceRows> feed;
            for (size_t j = 0; j < next.size(); ++j) {
                int32_t & len = len_[size_t(seqs[next[j].i])];
                rows.push_back({0, len++, seqs[next[j].i], true});
                feed.push_back({int32_t(j), 1, tokens + next[j].out});
                next[j].out = next[j].row = int32_t(j);
            }
            ctx_->step(rows, feed);
            active = std::move(next);
        }
    }

    void verified(const Context &, const std::vector<Span> & spans, const std::vector<int32_t> & kept) override {
        // The draft fed the pending token at pos0 and its chain of drafts after it: as many of those
        // as the target kept are right.
        for (size_t i = 0; i < spans.size(); ++i) {
            const int32_t agree = std::min(len_[size_t(spans[i].seq)], spans[i].pos0 + kept[i]);
            truncate(spans[i].seq, agree);
        }
    }

private:
    std::unique_ptr<Model>   model_;
    std::unique_ptr<Context> ctx_;
    std::unique_ptr<Buffer>  drafts_;  // [n_seq_max][k_max] I32
    std::vector<int32_t>     len_;     // per sequence: tokens in the draft's cache that are the sequence's
};

// A draft must speak the target's vocabulary: same number of logits and, where both have
// tokenizers, the same token for every id.
void check_vocabulary(const Model & target, const Model & draft) {
    const int64_t nt = target.hparams.n_vocab, nd = draft.hparams.n_vocab;
    if (nt != nd)
        fail(SPARK_ERR_INVALID_ARGUMENT, "the draft model %s has a vocabulary of %lld tokens, the target %s %lld: they must be the same",
             draft.path.c_str(), (long long) nd, target.path.c_str(), (long long) nt);
    if (!target.tokenizer || !draft.tokenizer) return;
    const Tokenizer & a = target.tokenizer->tokenizer;
    const Tokenizer & b = draft.tokenizer->tokenizer;
    if (a.n_vocab() != b.n_vocab())
        fail(SPARK_ERR_INVALID_ARGUMENT, "the draft model's tokenizer has %d tokens, the target's %d: they must be the same", b.n_vocab(), a.n_vocab());
    for (int32_t id = 0; id < a.n_vocab(); ++id)
        if (a.piece(id) != b.piece(id))
            fail(SPARK_ERR_INVALID_ARGUMENT, "the draft model's tokenizer differs from the target's: token %d is '%s' for the target and '%s' for the draft", id,
                 std::string(a.piece(id)).c_str(), std::string(b.piece(id)).c_str());
}

}  // namespace

std::unique_ptr<DraftSource> make_draft_model_source(Context & target, const SourceOptions & o) {
    spark_model_params mp = spark_model_default_params();
    mp.device             = target.model().device;
    auto draft            = load_model(o.path, mp, target.model().backend);
    check_vocabulary(target.model(), *draft);
    return std::make_unique<DraftModelSource>(target, std::move(draft), o.k_max);
}

float top_probability(const float * logits, int64_t n) {
    if (!logits || n <= 0) return 0.0f;
    const float m   = *std::max_element(logits, logits + n);
    double      sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(double(logits[i] - m));
    return float(1.0 / sum);
}

}  // namespace spark::spec
