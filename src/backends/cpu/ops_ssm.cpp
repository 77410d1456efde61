// Linear-attention ops of Qwen3-Next (Gated DeltaNet): the causal depthwise conv with rolling state
// and the gated delta rule recurrence, token by token per sequence (exact; a chunked form is a
// faster equivalent used on the GPU).
#include "backends/cpu/cpu_ops.h"
#include "graph/error.h"

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
}  // namespace

void op_conv1d_ssm(const Tensor & t, ThreadPool & pool) {
    const Tensor & x  = *t.src[0];
    const float *  w  = static_cast<const float *>(t.src[1]->data);
    const Tensor & st = *t.src[2];
    const int64_t  C = x.ne[0], K = t.src[1]->ne[0];
    const auto     ranges = seq_ranges(*t.src[7]);
    SPARK_ASSERT(x.nb[0] == 4 && st.is_contiguous());
    for (const SeqRange & r : ranges) {
        float * state = static_cast<float *>(st.data) + int64_t(r.slot) * (K - 1) * C;  // [K-1][C]
        pool.parallel_for(C, 256, [&](int64_t c0, int64_t c1, int) {
            for (int64_t c = c0; c < c1; ++c) {
                const float * wc = w + c * K;
                for (int32_t i = 0; i < r.count; ++i) {
                    const int64_t tok = r.first + i;
                    const float   xin = reinterpret_cast<const float *>(x.row(tok))[c];
                    float         acc = wc[K - 1] * xin;
                    for (int64_t j = 0; j < K - 1; ++j) acc += wc[j] * state[j * C + c];
                    reinterpret_cast<float *>(t.row(tok))[c] = silu(acc);
                    for (int64_t j = 0; j + 1 < K - 1; ++j) state[j * C + c] = state[(j + 1) * C + c];
                    state[(K - 2) * C + c] = xin;
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
    const Tensor & st      = *t.src[7];
    const int64_t  dk = q.ne[0], n_kh = q.ne[1], dv = v.ne[0], n_vh = v.ne[1];
    const int64_t  ratio   = n_vh / n_kh;
    const auto     ranges  = seq_ranges(*t.src[8]);
    for (const SeqRange & r : ranges) {
        float * state = static_cast<float *>(st.data) + int64_t(r.slot) * dk * dv * n_vh;
        pool.parallel_for(n_vh, 1, [&](int64_t h0, int64_t h1, int) {
            std::vector<float> kv(static_cast<size_t>(dv)), delta(static_cast<size_t>(dv));
            for (int64_t h = h0; h < h1; ++h) {
                float *       S  = state + h * dk * dv;  // [dk][dv]
                const int64_t kh = h / ratio;
                for (int32_t i = 0; i < r.count; ++i) {
                    const int64_t tok  = r.first + i;
                    const float * qt   = reinterpret_cast<const float *>(q.row(kh, tok));
                    const float * kt   = reinterpret_cast<const float *>(k.row(kh, tok));
                    const float * vt   = reinterpret_cast<const float *>(v.row(h, tok));
                    const float   at   = reinterpret_cast<const float *>(a.row(tok))[h];
                    const float   bt   = reinterpret_cast<const float *>(b.row(tok))[h];
                    const float   g    = -std::exp(A_log[h]) * softplus(at + dt_bias[h]);
                    const float   beta = sigmoid(bt);
                    const float   decay = std::exp(g);
                    for (int64_t e = 0; e < dk * dv; ++e) S[e] *= decay;
                    std::fill(kv.begin(), kv.end(), 0.0f);
                    for (int64_t ki = 0; ki < dk; ++ki)
                        for (int64_t j = 0; j < dv; ++j) kv[size_t(j)] += S[ki * dv + j] * kt[ki];
                    for (int64_t j = 0; j < dv; ++j) delta[size_t(j)] = (vt[j] - kv[size_t(j)]) * beta;
                    for (int64_t ki = 0; ki < dk; ++ki)
                        for (int64_t j = 0; j < dv; ++j) S[ki * dv + j] += kt[ki] * delta[size_t(j)];
                    float * o = reinterpret_cast<float *>(t.row(h, tok));
                    for (int64_t j = 0; j < dv; ++j) o[j] = 0.0f;
                    for (int64_t ki = 0; ki < dk; ++ki)
                        for (int64_t j = 0; j < dv; ++j) o[j] += S[ki * dv + j] * qt[ki];
                }
            }
        });
    }
}

}  // namespace spark::cpu
