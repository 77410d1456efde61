// n-gram (prompt lookup) drafts: the last n tokens of the sequence (its pending token included) are
// looked up earlier in the sequence, longest n first, latest occurrence first; the tokens that
// followed that occurrence are the drafts. No weights and no device work: the common win when an
// answer repeats its input (code editing, quoting, summaries).
#include "common/error.h"
#include "runtime/speculative/draft_source.h"

#include <algorithm>

namespace spark::spec {

namespace {

class NgramSource final : public DraftSource {
public:
    explicit NgramSource(const SourceOptions & o) : n_min_(o.ngram_min), n_max_(o.ngram_max) {}
    const char * name() const override { return "ngram"; }
    void         truncate(int32_t, int32_t) override {}

    void draft(const std::vector<const SeqState *> & st, const std::vector<int32_t> &, const std::vector<int32_t> & k, int32_t k_max, float,
               Drafts & out) override {
        out.k = k_max;
        out.n.assign(st.size(), 0);
        out.host.assign(st.size() * size_t(k_max), 0);
        out.device = nullptr;
        for (size_t i = 0; i < st.size(); ++i) out.n[i] = lookup(st[i]->tokens, k[i], out.host.data() + i * size_t(k_max));
    }

private:
    int32_t lookup(const std::vector<int32_t> & h, int32_t k, int32_t * drafts) const {
        const int64_t L = int64_t(h.size());
        for (int64_t n = n_max_; n >= n_min_ && k > 0; --n) {
            if (L < n + 1) continue;
            const int32_t * suffix = h.data() + (L - n);
            for (int64_t j = L - n - 1; j >= 0; --j) {
                if (!std::equal(suffix, suffix + n, h.data() + j)) continue;
                const int64_t m = std::min<int64_t>(k, L - (j + n));
                std::copy(h.data() + j + n, h.data() + j + n + m, drafts);
                return int32_t(m);
            }
        }
        return 0;
    }

    int32_t n_min_, n_max_;
};

}  // namespace

std::unique_ptr<DraftSource> make_ngram_source(const SourceOptions & o) {
    if (o.ngram_min < 1 || o.ngram_max < o.ngram_min || o.ngram_max > 64)
        fail(SPARK_ERR_INVALID_ARGUMENT, "n-gram sizes %d .. %d: need 1 <= ngram_min <= ngram_max <= 64", o.ngram_min, o.ngram_max);
    return std::make_unique<NgramSource>(o);
}

}  // namespace spark::spec
