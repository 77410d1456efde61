// MoE routing (softmax + top-k, as transformers' Qwen2MoeTopKRouter; or sigmoid scores chosen with
// a bias, as MiniMaxM2TopKRouter) and the weighted combine.
#include "backends/cpu/cpu_ops.h"
#include "common/error.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

namespace spark::cpu {

void op_moe_route(const Tensor & t, ThreadPool & pool) {
    const Tensor & lg        = *t.src[0];
    const int64_t  n_expert  = lg.ne[0];
    const int      k         = t.ip[0];
    const bool     normalize = t.ip[1] != 0;
    const bool     sigmoid   = t.ip[2] == int32_t(RouterScore::Sigmoid);
    const float *  bias      = t.src[1] ? static_cast<const float *>(t.src[1]->data) : nullptr;  // sigmoid only
    const bool     shared    = t.ip[3] != 0;  // ids end with E: the shared expert's slot (Graph::moe_route)
    pool.parallel_for(lg.nrows(), 8, [&](int64_t b, int64_t e, int) {
        std::vector<float> p(static_cast<size_t>(n_expert)), choice;
        std::vector<int>   order(static_cast<size_t>(n_expert));
        for (int64_t r = b; r < e; ++r) {
            const float * x = reinterpret_cast<const float *>(row_ptr(lg, r));
            if (sigmoid) {
                for (int64_t i = 0; i < n_expert; ++i) p[size_t(i)] = 1.0f / (1.0f + std::exp(-x[i]));
                choice = p;
                if (bias)
                    for (int64_t i = 0; i < n_expert; ++i) choice[size_t(i)] += bias[i];
            } else {
                float  m = *std::max_element(x, x + n_expert);
                double s = 0.0;
                for (int64_t i = 0; i < n_expert; ++i) s += (p[size_t(i)] = std::exp(x[i] - m));
                for (float & v : p) v = float(v / s);
            }
            // A NaN score ranks below every number (a strict order for the sort, as the CUDA kernel's).
            const std::vector<float> & scores = sigmoid ? choice : p;
            auto key = [&](int a) { return scores[size_t(a)] == scores[size_t(a)] ? scores[size_t(a)] : -INFINITY; };
            std::iota(order.begin(), order.end(), 0);
            // Highest score first; ties go to the lower expert id (torch.topk on CPU).
            std::partial_sort(order.begin(), order.begin() + k, order.end(),
                              [&](int a, int c) { return key(a) > key(c) || (key(a) == key(c) && a < c); });
            float wsum = 0.0f;
            for (int j = 0; j < k; ++j) wsum += p[size_t(order[size_t(j)])];
            float *   w   = reinterpret_cast<float *>(row_ptr(t, r));
            int32_t * ids = reinterpret_cast<int32_t *>(w + k);
            for (int j = 0; j < k; ++j) {
                w[j]   = normalize ? p[size_t(order[size_t(j)])] / wsum : p[size_t(order[size_t(j)])];
                ids[j] = order[size_t(j)];
            }
            if (shared) ids[k] = int32_t(n_expert);
        }
    });
}

void op_moe_combine(const Tensor & t, ThreadPool & pool) {
    const Tensor & y = *t.src[0];
    const Tensor & w = *t.src[1];
    const int64_t  H = y.ne[0], k = y.ne[1];
    const Tensor * shared = t.src[2];  // optional: + shared * sigmoid(gate)
    const Tensor * gate   = t.src[3];
    pool.parallel_for(y.ne[2], 1, [&](int64_t b, int64_t e, int) {
        for (int64_t tok = b; tok < e; ++tok) {
            float *       o  = reinterpret_cast<float *>(t.row(tok));
            const float * wt = reinterpret_cast<const float *>(w.row(tok));
            std::fill(o, o + H, 0.0f);
            for (int64_t j = 0; j < k; ++j) {
                const float * yj = reinterpret_cast<const float *>(y.row(j, tok));
                for (int64_t i = 0; i < H; ++i) o[i] += wt[j] * yj[i];
            }
            if (shared) {  // MUL_SIGMOID's then ADD's arithmetic
                const float * s   = reinterpret_cast<const float *>(row_ptr(*shared, tok));
                const float   sig = 1.0f / (1.0f + std::exp(-reinterpret_cast<const float *>(row_ptr(*gate, tok))[0]));
                for (int64_t i = 0; i < H; ++i) o[i] = o[i] + s[i] * sig;
            }
        }
    });
}

}  // namespace spark::cpu
