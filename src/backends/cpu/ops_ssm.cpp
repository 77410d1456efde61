// Linear-attention ops of Qwen3-Next (Gated DeltaNet): the causal depthwise conv with rolling state
// and the gated delta rule recurrence, token by token per sequence (exact; a chunked form is a
// faster equivalent used on the GPU).
#include "backends/cpu/cpu_ops.h"
#include "common/error.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace spark::cpu {

namespace {
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }  // torch threshold 20
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

struct SeqRange { int32_t slot, first, count; };

std::vector<SeqRange> seq_ranges(const Tensor & ranges) {
    std::vector<SeqRange> out;
    const int32_t *       d = static_cast<const int32_t *>(ranges.data);
    for (int64_t i = 0; i < ranges.ne[1]; ++i) out.push_back({d[3 * i], d[3 * i + 1], d[3 * i + 2]});
    return out;
}

// The ring of states of one sequence slot (graph.h: "Recurrent state with rollback").
struct StateRing {
    float * base;       // [R][size]
    int64_t size, R;
    int32_t pos0, count;  // first position of the step, tokens of the step
    // The state the step starts from: after position pos0 - 1 (none at position 0).
    const float * initial() const { return pos0 == 0 ? nullptr : at(pos0 - 1); }
    float *       at(int64_t p) const { return base + (p % R) * size; }
    // Whether the state after token i of the step is kept (the last R positions).
    bool          keeps(int32_t i) const { return i >= count - R; }
};

StateRing ring_of(const Tensor & st, const Tensor & pos, const SeqRange & r) {
    SPARK_ASSERT(st.is_contiguous() && r.slot >= 0 && r.slot < st.ne[2]);
    const int64_t size = st.ne[0], R = st.ne[1];
    const int32_t pos0 = static_cast<const int32_t *>(pos.data)[r.first];
    SPARK_ASSERT(pos0 >= 0);
    return {static_cast<float *>(st.data) + int64_t(r.slot) * R * size, size, R, pos0, r.count};
}

}  // namespace

// The conv input's channel c at token tok, from up to three parts [len, groups, T] whose channels
// are concatenated (graph.h: Graph::conv1d_ssm).
class ConvInput {
public:
    explicit ConvInput(const Tensor & t) {
        for (int i = 0; i < t.ip[0]; ++i) parts_[n_++] = t.src[kConvPartSrc[i]];
    }
    float at(int64_t c, int64_t tok) const {
        for (int i = 0; i < n_; ++i) {
            const Tensor & x = *parts_[i];
            const int64_t  len = x.ne[0];
            if (c < len * x.ne[1]) return reinterpret_cast<const float *>(x.row(c / len, tok))[c % len];
            c -= len * x.ne[1];
        }
        SPARK_ASSERT(!"conv1d_ssm: channel out of range");
        return 0.0f;
    }

private:
    const Tensor * parts_[3] = {};
    int            n_        = 0;
};

void op_conv1d_ssm(const Tensor & t, ThreadPool & pool) {
    const ConvInput x(t);
    const float *   w  = static_cast<const float *>(t.src[1]->data);
    const int64_t   C = t.ne[0], K = t.src[1]->ne[0];
    const auto      ranges = seq_ranges(*t.src[7]);
    for (const SeqRange & r : ranges) {
        const StateRing ring = ring_of(*t.src[2], *t.src[5], r);  // a state: [K-1][C]
        pool.parallel_for(C, 256, [&](int64_t c0, int64_t c1, int) {
            std::vector<float> hist(size_t(K - 1));
            for (int64_t c = c0; c < c1; ++c) {
                const float * wc   = w + c * K;
                const float * init = ring.initial();
                for (int64_t j = 0; j < K - 1; ++j) hist[size_t(j)] = init ? init[j * C + c] : 0.0f;
                for (int32_t i = 0; i < r.count; ++i) {
                    const int64_t tok = r.first + i;
                    const float   xin = x.at(c, tok);
                    float         acc = wc[K - 1] * xin;
                    for (int64_t j = 0; j < K - 1; ++j) acc += wc[j] * hist[size_t(j)];
                    reinterpret_cast<float *>(t.row(tok))[c] = silu(acc);
                    for (int64_t j = 0; j + 1 < K - 1; ++j) hist[size_t(j)] = hist[size_t(j + 1)];
                    hist[size_t(K - 2)] = xin;
                    if (ring.keeps(i)) {
                        float * out = ring.at(ring.pos0 + i);
                        for (int64_t j = 0; j < K - 1; ++j) out[j * C + c] = hist[size_t(j)];
                    }
                }
            }
        });
    }
}

void op_gated_delta(const Tensor & t, ThreadPool & pool) {
    const Tensor & q = *t.src[0];
    const Tensor & k = *t.src[1];
    const Tensor & v = *t.src[2];
    const Tensor & a = *t.src[3];
    const Tensor & b = *t.src[4];
    const float *  A_log   = static_cast<const float *>(t.src[5]->data);
    const float *  dt_bias = static_cast<const float *>(t.src[6]->data);
    const int64_t  dk = q.ne[0], n_kh = q.ne[1], dv = v.ne[0], n_vh = v.ne[1];
    const int64_t  ratio   = n_vh / n_kh;
    const auto     ranges  = seq_ranges(*t.src[8]);
    // a and b of value head h: [r, groups, T] (graph.h).
    auto gate = [](const Tensor & g, int64_t h, int64_t tok) {
        return reinterpret_cast<const float *>(g.row(h / g.ne[0], tok))[h % g.ne[0]];
    };
    // use_qk_l2norm_in_kernel: the l2_norm op's arithmetic, then SCALE's multiply of q.
    const bool  qk_norm = t.ip[0] != 0;
    const float eps = t.fp[0], q_scale = t.fp[1];
    auto        l2_normed = [&](const float * x, float * out, float scale) {
        double ss = 0.0;
        for (int64_t i = 0; i < dk; ++i) ss += double(x[i]) * x[i];
        const float inv = 1.0f / std::sqrt(float(ss) + eps);
        for (int64_t i = 0; i < dk; ++i) out[i] = (x[i] * inv) * scale;  // (* 1 for k: exact)
    };
    for (const SeqRange & r : ranges) {
        const StateRing ring = ring_of(*t.src[7], *t.src[9], r);  // a state: [n_vh][dk][dv]
        pool.parallel_for(n_vh, 1, [&](int64_t h0, int64_t h1, int) {
            std::vector<float> kv(static_cast<size_t>(dv)), delta(static_cast<size_t>(dv)), S(size_t(dk * dv));
            std::vector<float> qn(size_t(qk_norm ? dk : 0)), kn(size_t(qk_norm ? dk : 0));
            for (int64_t h = h0; h < h1; ++h) {
                const int64_t head = h * dk * dv;
                const int64_t kh   = h / ratio;
                if (const float * init = ring.initial()) std::copy(init + head, init + head + dk * dv, S.begin());
                else std::fill(S.begin(), S.end(), 0.0f);
                for (int32_t i = 0; i < r.count; ++i) {
                    const int64_t tok  = r.first + i;
                    const float * qt   = reinterpret_cast<const float *>(q.row(kh, tok));
                    const float * kt   = reinterpret_cast<const float *>(k.row(kh, tok));
                    if (qk_norm) {
                        l2_normed(qt, qn.data(), q_scale);
                        l2_normed(kt, kn.data(), 1.0f);
                        qt = qn.data();
                        kt = kn.data();
                    }
                    const float * vt   = reinterpret_cast<const float *>(v.row(h, tok));
                    const float   at   = gate(a, h, tok);
                    const float   bt   = gate(b, h, tok);
                    const float   g    = -std::exp(A_log[h]) * softplus(at + dt_bias[h]);
                    const float   beta = sigmoid(bt);
                    const float   decay = std::exp(g);
                    for (float & e : S) e *= decay;
                    std::fill(kv.begin(), kv.end(), 0.0f);
                    for (int64_t ki = 0; ki < dk; ++ki)
                        for (int64_t j = 0; j < dv; ++j) kv[size_t(j)] += S[size_t(ki * dv + j)] * kt[ki];
                    for (int64_t j = 0; j < dv; ++j) delta[size_t(j)] = (vt[j] - kv[size_t(j)]) * beta;
                    for (int64_t ki = 0; ki < dk; ++ki)
                        for (int64_t j = 0; j < dv; ++j) S[size_t(ki * dv + j)] += kt[ki] * delta[size_t(j)];
                    float * o = reinterpret_cast<float *>(t.row(h, tok));
                    for (int64_t j = 0; j < dv; ++j) o[j] = 0.0f;
                    for (int64_t ki = 0; ki < dk; ++ki)
                        for (int64_t j = 0; j < dv; ++j) o[j] += S[size_t(ki * dv + j)] * qt[ki];
                    if (ring.keeps(i)) std::copy(S.begin(), S.end(), ring.at(ring.pos0 + i) + head);
                }
            }
        });
    }
}

}  // namespace spark::cpu
