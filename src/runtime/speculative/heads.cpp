// Drafts from a head that reads the target's hidden states: an EAGLE3 head or Qwen3-Next's MTP
// head (src/runtime/models/eagle3.cpp, qwen3_next.cpp). The head's input at position p is the pair
// (token p + 1, the target's hidden state at p); it has its own KV cache (one attention layer) in its
// own context.
//
// Per sequence the source keeps `head_len`, the pairs the head's cache holds (positions
// 0 .. head_len - 1), and the target's hidden states of the positions after it, copied from the
// target's steps into a buffer of its own (the target's arena is reused by its next step). While
// the prompt is decoded every pair but the last is fed at once; the last waits for the first
// answer token. Drafting feeds the waiting pairs (after a verify step: the kept rows), whose last
// output is the first draft, then chains: the draft token with the head's own hidden output at the
// next position, k - 1 times, each step taking its inputs from the previous step's outputs on the
// backend. The chained positions are dropped from the head's cache afterwards.
#include "common/error.h"
#include "runtime/models/heads.h"
#include "runtime/speculative/draft_source.h"

#include <algorithm>

namespace spark::spec {

namespace {

class HeadSource final : public DraftSource {
public:
    HeadSource(Context & target, std::unique_ptr<Model> owned, Model & head, HiddenCapture capture, const char * name, int32_t k_max)
        : owned_(std::move(owned)), head_(head), capture_(std::move(capture)), name_(name) {
        const spark_context_params & tp = target.params();
        spark_context_params         p  = tp;
        p.n_ctx       = tp.n_ctx + k_max + 1;  // the chain runs past the target's last position
        p.n_batch     = tp.n_batch + k_max + 2;
        p.n_snapshots = 0;
        p.n_rollback  = 0;
        ctx_          = std::make_unique<Context>(head_, p);
        width_        = head_.arch->hidden_input_width(head_);
        cap_rows_     = p.n_batch;
        Backend & be  = *head_.backend;
        drafts_       = be.alloc(size_t(tp.n_seq_max) * size_t(k_max) * 4);
        seqs_.resize(size_t(tp.n_seq_max));
        for (Seq & s : seqs_) s.hidden = be.alloc(size_t(cap_rows_) * row_bytes());
    }

    const char *  name() const override { return name_; }
    HiddenCapture capture() const override { return capture_; }

    int32_t keep(int32_t seq, int32_t common) const override {
        const Seq & s = seqs_[size_t(seq)];
        // Past the pairs already fed, the hidden states the source holds reach head_len + n_hidden.
        if (common > s.head_len) return std::min(common, s.head_len + s.n_hidden);
        // A changed token at `common` invalidates the pair fed before it; the target then recomputes
        // the position whose hidden state that pair needs.
        return std::max(common - 1, 0);
    }

    void truncate(int32_t seq, int32_t len) override {
        Seq & s = seqs_[size_t(seq)];
        if (len >= s.head_len) {
            s.n_hidden = std::min(s.n_hidden, len - s.head_len);
        } else {
            s.head_len = len;
            s.n_hidden = 0;
        }
        ctx_->memory().seq_rm(seq, s.head_len, -1);
    }

    void prefilled(const Context & target, const std::vector<Span> & spans, const std::vector<const SeqState *> & st) override {
        for (size_t i = 0; i < spans.size(); ++i) {
            const Span & sp = spans[i];
            Seq &        s  = seqs_[size_t(sp.seq)];
            SPARK_ASSERT(sp.pos0 == s.head_len + s.n_hidden && s.n_hidden + sp.count <= cap_rows_);
            keep_hidden(target, sp.first, sp.count, s);
            // Every pair but the last has its token: feed them now.
            const int32_t n = s.n_hidden - 1;
            if (n <= 0) continue;
            std::vector<StepRow> rows;
            for (int32_t r = 0; r < n; ++r) rows.push_back({st[i]->tokens[size_t(s.head_len + r + 1)], s.head_len + r, sp.seq, false});
            ctx_->step(rows, {}, {{0, n, s.hidden->data()}});
            s.head_len += n;
            head_.backend->copy(s.hidden->data(), hidden_row(s, n), row_bytes());  // the waiting pair moves to row 0
            s.n_hidden = 1;
        }
    }

    void draft(const std::vector<const SeqState *> & st, const std::vector<int32_t> & seqs, const std::vector<int32_t> & k, int32_t k_max,
               float p_min, Drafts & out) override {
        Backend & be = *head_.backend;
        out.k        = k_max;
        out.n.assign(seqs.size(), 0);
        out.host.clear();
        out.device = static_cast<const int32_t *>(drafts_->data());

        // The waiting pairs of every sequence; the last one's output is the first draft.
        std::vector<StepRow>    rows;
        std::vector<DeviceRows> hidden;
        std::vector<int32_t>    last_row(seqs.size(), -1);
        for (size_t i = 0; i < seqs.size(); ++i) {
            Seq &         s   = seqs_[size_t(seqs[i])];
            const int32_t len = st[i]->cached();
            SPARK_ASSERT(st[i]->pending && s.n_hidden >= 1 && s.head_len + s.n_hidden == len);
            hidden.push_back({int32_t(rows.size()), s.n_hidden, s.hidden->data()});
            for (int32_t r = 0; r < s.n_hidden; ++r)
                rows.push_back({st[i]->tokens[size_t(s.head_len + r + 1)], s.head_len + r, seqs[i], r + 1 == s.n_hidden && k[i] > 0});
            last_row[i] = int32_t(rows.size()) - 1;
            s.head_len  = len;
            s.n_hidden  = 0;
        }
        ctx_->step(rows, {}, hidden);

        // Then chain: each drafting sequence's last output feeds its next step.
        struct Link {
            size_t  i;            // index in seqs
            int32_t out, row;     // its output index and hidden row in the previous step
        };
        std::vector<Link> active;
        for (size_t i = 0, o = 0; i < seqs.size(); ++i)
            if (k[i] > 0) active.push_back({i, int32_t(o++), last_row[i]});
        for (int32_t d = 0; !active.empty(); ++d) {
            // Draft d of each active sequence is the previous step's output.
            const int32_t * tokens = ctx_->device_tokens();
            const char *    hid    = reinterpret_cast<const char *>(ctx_->device_hidden());
            std::vector<Link> next;
            for (const Link & a : active) {
                if (p_min > 0.0f && top_probability(ctx_->logits_ith(a.row), head_.hparams.n_vocab) < p_min) continue;
                be.copy(static_cast<int32_t *>(drafts_->data()) + a.i * size_t(k_max) + size_t(d), tokens + a.out, 4);
                out.n[a.i] = d + 1;
                if (d + 1 < k[a.i]) next.push_back(a);
            }
            if (next.empty()) break;
            rows.clear();
            std::vector<DeviceRows> feed_tokens, feed_hidden;
            for (size_t j = 0; j < next.size(); ++j) {
                const size_t i = next[j].i;
                rows.push_back({0, st[i]->cached() + d, seqs[i], true});
                feed_tokens.push_back({int32_t(j), 1, tokens + next[j].out});
                feed_hidden.push_back({int32_t(j), 1, hid + size_t(next[j].row) * row_bytes()});
                next[j].out = next[j].row = int32_t(j);
            }
            ctx_->step(rows, feed_tokens, feed_hidden);
            active = std::move(next);
        }
        // The chained positions leave the head's cache (they were fed the head's own guesses).
        for (int32_t seq : seqs) ctx_->memory().seq_rm(seq, seqs_[size_t(seq)].head_len, -1);
    }

    void verified(const Context & target, const std::vector<Span> & spans, const std::vector<int32_t> & kept) override {
        for (size_t i = 0; i < spans.size(); ++i) {
            Seq & s = seqs_[size_t(spans[i].seq)];
            SPARK_ASSERT(s.n_hidden == 0 && spans[i].pos0 == s.head_len && kept[i] <= cap_rows_);
            keep_hidden(target, spans[i].first, kept[i], s);
        }
    }

private:
    struct Seq {
        int32_t                 head_len = 0;  // pairs in the head's cache
        int32_t                 n_hidden = 0;  // target hidden states held, of positions head_len ...
        std::unique_ptr<Buffer> hidden;        // [cap_rows][width]
    };
    size_t row_bytes() const { return size_t(width_) * 4; }
    char * hidden_row(Seq & s, int32_t r) const { return static_cast<char *>(s.hidden->data()) + size_t(r) * row_bytes(); }
    void   keep_hidden(const Context & target, int32_t first, int32_t count, Seq & s) {
        SPARK_ASSERT(target.hidden_width() == width_);
        const char * src = reinterpret_cast<const char *>(target.device_hidden()) + size_t(first) * row_bytes();
        head_.backend->copy(hidden_row(s, s.n_hidden), src, size_t(count) * row_bytes());
        s.n_hidden += count;
    }

    std::unique_ptr<Model>   owned_;
    Model &                  head_;
    HiddenCapture            capture_;
    const char *             name_;
    std::unique_ptr<Context> ctx_;
    int64_t                  width_    = 0;
    int32_t                  cap_rows_ = 0;
    std::unique_ptr<Buffer>  drafts_;  // [n_seq_max][k_max] I32
    std::vector<Seq>         seqs_;
};

}  // namespace

std::unique_ptr<DraftSource> make_head_source(Context & target, const SourceOptions & o) {
    Model & tm = target.model();
    if (o.kind == SPARK_SPEC_MTP) {
        if (!tm.mtp) {
            if (!tm.arch->has_mtp_head()) {
                std::string with;
                for (const Architecture * a : architectures())
                    if (a->has_mtp_head()) with += (with.empty() ? "" : ", ") + std::string(a->model_type());
                fail(SPARK_ERR_UNSUPPORTED, "%s is a %s model: it has no MTP head (MTP heads exist for %s models)", tm.path.c_str(),
                     tm.hparams.arch.c_str(), with.c_str());
            }
            fail(SPARK_ERR_UNSUPPORTED, "%s has no MTP head (num_nextn_predict_layers = %lld, no mtp.* tensors in the checkpoint)",
                 tm.path.c_str(), (long long) tm.hparams.n_mtp_layers);
        }
        return std::make_unique<HeadSource>(target, nullptr, *tm.mtp, HiddenCapture{{HiddenCapture::kFinalNorm}}, "mtp", o.k_max);
    }
    spark_model_params mp = spark_model_default_params();
    mp.device             = tm.device;
    mp.load_tokenizer     = false;
    auto          head    = load_eagle3_head(o.path, tm, mp);
    HiddenCapture capture{head->head->aux_layers};
    capture.project = &head->head->fc;
    Model & h       = *head;
    return std::make_unique<HeadSource>(target, std::move(head), h, capture, "eagle3", o.k_max);
}

}  // namespace spark::spec
