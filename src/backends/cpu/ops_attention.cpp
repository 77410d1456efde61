// Causal GQA attention over the paged KV cache (float32 cache on the CPU).
#include "backends/cpu/cpu_ops.h"
#include "common/error.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace spark::cpu {

void op_attention(const Tensor & t, ThreadPool & pool) {
    const Tensor & q = *t.src[0];
    const Tensor & k = *t.src[1];
    const Tensor & v = *t.src[2];
    const Tensor & kc = *t.src[3];
    const Tensor & vc = *t.src[4];
    const int32_t * pos = static_cast<const int32_t *>(t.src[5]->data);
    const int32_t * seq = static_cast<const int32_t *>(t.src[6]->data);
    const Tensor &  bt  = *t.src[7];
    const int32_t * table     = static_cast<const int32_t *>(bt.data);
    const int64_t   max_pages = bt.ne[0], n_slots = bt.ne[1];
    const int64_t   hd = q.ne[0], n_head = q.ne[1], n_tok = q.ne[2], n_kv = k.ne[1];
    const int64_t   page_size = kc.ne[1], n_pages = kc.ne[2];
    const int64_t   group = n_head / n_kv;
    const float     scale = t.fp[0];
    SPARK_ASSERT(kc.type == DType::F32 && vc.type == DType::F32 && kc.is_contiguous() && vc.is_contiguous());

    // Cache row of (slot, position).
    auto cache_row = [&](int32_t slot, int32_t p) -> int64_t {
        SPARK_ASSERT(slot >= 0 && slot < n_slots && p >= 0 && p / page_size < max_pages);
        const int32_t page = table[slot * max_pages + p / page_size];
        SPARK_ASSERT(page >= 0 && page < n_pages);
        return int64_t(page) * page_size + p % page_size;
    };

    // 1. Append this step's keys and values.
    const size_t head_bytes = size_t(hd) * 4;
    for (int64_t tok = 0; tok < n_tok; ++tok) {
        const int64_t r  = cache_row(seq[tok], pos[tok]);
        char *        kd = static_cast<char *>(kc.data) + r * kc.nb[1];
        char *        vd = static_cast<char *>(vc.data) + r * vc.nb[1];
        for (int64_t h = 0; h < n_kv; ++h) {
            std::memcpy(kd + h * head_bytes, k.row(h, tok), head_bytes);
            std::memcpy(vd + h * head_bytes, v.row(h, tok), head_bytes);
        }
    }

    // 2. Each (token, head) attends to positions 0 .. pos of its sequence.
    pool.parallel_for(n_tok * n_head, 1, [&](int64_t b, int64_t e, int) {
        std::vector<float>   scores;
        std::vector<int64_t> rows;
        std::vector<float>   acc(static_cast<size_t>(hd));
        for (int64_t i = b; i < e; ++i) {
            const int64_t tok = i / n_head, h = i % n_head, g = h / group;
            const int32_t n_ctx = pos[tok] + 1;
            const float * qh    = reinterpret_cast<const float *>(q.row(h, tok));
            scores.resize(size_t(n_ctx));
            rows.resize(size_t(n_ctx));
            float m = -INFINITY;
            for (int32_t p = 0; p < n_ctx; ++p) {
                rows[size_t(p)]  = cache_row(seq[tok], p);
                const float * kh = reinterpret_cast<const float *>(static_cast<const char *>(kc.data) + rows[size_t(p)] * kc.nb[1]) + g * hd;
                float         s  = 0.0f;
                for (int64_t d = 0; d < hd; ++d) s += qh[d] * kh[d];
                s *= scale;
                scores[size_t(p)] = s;
                m = std::max(m, s);
            }
            double sum = 0.0;
            for (float & s : scores) {
                s = std::exp(s - m);
                sum += s;
            }
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int32_t p = 0; p < n_ctx; ++p) {
                const float * vh = reinterpret_cast<const float *>(static_cast<const char *>(vc.data) + rows[size_t(p)] * vc.nb[1]) + g * hd;
                const float   w  = scores[size_t(p)];
                for (int64_t d = 0; d < hd; ++d) acc[size_t(d)] += w * vh[d];
            }
            float *     o   = reinterpret_cast<float *>(t.row(tok)) + h * hd;
            const float inv = float(1.0 / sum);
            for (int64_t d = 0; d < hd; ++d) o[d] = acc[size_t(d)] * inv;
        }
    });
}

}  // namespace spark::cpu
