// Row-wise and element-wise ops: copies, norms, RoPE, gating, argmax.
#include "backends/cpu/cpu_ops.h"
#include "common/error.h"

#include <cmath>
#include <cstring>

namespace spark::cpu {

namespace {

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Rows per task so that tiny ops do not pay for thread wake-ups.
int64_t grain_for(int64_t row_len) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(row_len, 1)); }

}  // namespace

void op_cont(const Tensor & t, ThreadPool & pool) {
    const Tensor & s   = *t.src[0];
    const size_t   row = size_t(s.ne[0]) * dtype_size(s.type);
    SPARK_ASSERT(s.nb[0] == dtype_size(s.type));
    pool.parallel_for(t.nrows(), grain_for(s.ne[0]), [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) std::memcpy(row_ptr(t, r), row_ptr(s, r), row);
    });
}

void op_concat(const Tensor & t, ThreadPool & pool) {
    pool.parallel_for(t.nrows(), grain_for(t.ne[0]), [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) {
            char * o = row_ptr(t, r);
            for (int i = 0; i < 3 && t.src[i]; ++i) {
                const Tensor & s = *t.src[i];
                SPARK_ASSERT(s.nb[0] == 4);
                std::memcpy(o, row_ptr(s, r), size_t(s.ne[0]) * 4);
                o += s.ne[0] * 4;
            }
        }
    });
}

void op_binary(const Tensor & t, ThreadPool & pool) {
    const Tensor & a = *t.src[0];
    const Tensor & b = *t.src[1];
    const int64_t  n = a.ne[0];
    const bool     b_one_row = b.nrows() == 1;
    const bool     b_scalar  = b.ne[0] == 1;  // MUL_SIGMOID gate of one value per row
    SPARK_ASSERT(a.nb[0] == 4 && b.nb[0] == 4);
    pool.parallel_for(a.nrows(), grain_for(n), [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) {
            const float * x = reinterpret_cast<const float *>(row_ptr(a, r));
            const float * y = reinterpret_cast<const float *>(row_ptr(b, b_one_row ? 0 : r));
            float *       o = reinterpret_cast<float *>(row_ptr(t, r));
            switch (t.op) {
                case Op::ADD:
                    for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
                    break;
                case Op::MUL:
                    for (int64_t i = 0; i < n; ++i) o[i] = x[i] * y[i];
                    break;
                case Op::SWIGLU:
                    for (int64_t i = 0; i < n; ++i) o[i] = silu(x[i]) * y[i];
                    break;
                case Op::MUL_SIGMOID:
                    for (int64_t i = 0; i < n; ++i) o[i] = x[i] * sigmoid(y[b_scalar ? 0 : i]);
                    break;
                default: SPARK_ASSERT(false);
            }
        }
    });
}

void op_scale(const Tensor & t, ThreadPool & pool) {
    const Tensor & a = *t.src[0];
    const float    s = t.fp[0];
    pool.parallel_for(a.nrows(), grain_for(a.ne[0]), [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) {
            const float * x = reinterpret_cast<const float *>(row_ptr(a, r));
            float *       o = reinterpret_cast<float *>(row_ptr(t, r));
            for (int64_t i = 0; i < a.ne[0]; ++i) o[i] = x[i] * s;
        }
    });
}

// Matches transformers' RMSNorm in float32: x * rsqrt(mean(x^2) + eps) * w (or * (1 + w)).
void op_rms_norm(const Tensor & t, ThreadPool & pool) {
    const Tensor & a   = *t.src[0];
    const float *  w   = t.src[1] ? static_cast<const float *>(t.src[1]->data) : nullptr;
    const float    eps = t.fp[0];
    const bool     zc  = t.ip[0] != 0;
    const Tensor * gate = t.src[2];  // rms_norm_gated: silu(gate) * norm, as SWIGLU computes it
    const Tensor * sums = t.src[3];  // a row split over ranks: its sums of squares over them all
    const int64_t  n   = a.ne[0];
    pool.parallel_for(a.nrows(), grain_for(n), [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) {
            const float * x  = reinterpret_cast<const float *>(row_ptr(a, r));
            float *       o  = reinterpret_cast<float *>(row_ptr(t, r));
            const float * g  = gate ? reinterpret_cast<const float *>(row_ptr(*gate, r)) : nullptr;
            double        ss = 0.0;
            if (sums) ss = double(reinterpret_cast<const float *>(row_ptr(*sums, r))[0]);
            else
                for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
            const float inv = 1.0f / std::sqrt(float(ss / double(sums ? t.fp[1] : float(n))) + eps);
            for (int64_t i = 0; i < n; ++i) {
                float v = x[i] * inv;
                if (w) v *= zc ? (1.0f + w[i]) : w[i];
                o[i] = g ? silu(g[i]) * v : v;
            }
        }
    });
}

void op_sum_sqr(const Tensor & t, ThreadPool & pool) {
    const Tensor & a = *t.src[0];
    const int64_t  n = a.ne[0];
    pool.parallel_for(a.nrows(), grain_for(n), [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) {
            const float * x  = reinterpret_cast<const float *>(row_ptr(a, r));
            double        ss = 0.0;
            for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
            reinterpret_cast<float *>(row_ptr(t, r))[0] = float(ss) * t.fp[0];
        }
    });
}

void op_l2_norm(const Tensor & t, ThreadPool & pool) {
    const Tensor & a   = *t.src[0];
    const float    eps = t.fp[0];
    const int64_t  n   = a.ne[0];
    pool.parallel_for(a.nrows(), grain_for(n), [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) {
            const float * x  = reinterpret_cast<const float *>(row_ptr(a, r));
            float *       o  = reinterpret_cast<float *>(row_ptr(t, r));
            double        ss = 0.0;
            for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
            const float inv = 1.0f / std::sqrt(float(ss) + eps);
            for (int64_t i = 0; i < n; ++i) o[i] = x[i] * inv;
        }
    });
}

// NEOX ("rotate half") RoPE on the first n_rot dims of each head. Frequencies are computed in
// float32 exactly as transformers does: inv_freq[i] = 1 / theta^(2i / n_rot), angle = pos * inv_freq.
void op_rope(const Tensor & t, ThreadPool & pool) {
    const Tensor &  a     = *t.src[0];
    const int32_t * pos   = static_cast<const int32_t *>(t.src[1]->data);
    const int       n_rot = t.ip[0];
    const int       half  = n_rot / 2;
    const float     theta = t.fp[0];
    std::vector<float> inv_freq(static_cast<size_t>(half));
    for (int i = 0; i < half; ++i) inv_freq[size_t(i)] = 1.0f / std::pow(theta, float(2 * i) / float(n_rot));
    const int64_t hd = a.ne[0], nh = a.ne[1], nt = a.ne[2];
    pool.parallel_for(nt * nh, grain_for(hd), [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) {
            const int64_t tok = r / nh, h = r % nh;
            const float * x   = reinterpret_cast<const float *>(a.row(h, tok));
            float *       o   = reinterpret_cast<float *>(t.row(h, tok));
            const float   p   = float(pos[tok]);
            for (int i = 0; i < half; ++i) {
                const float ang = p * inv_freq[size_t(i)];
                const float c = std::cos(ang), s = std::sin(ang);
                const float x0 = x[i], x1 = x[i + half];
                o[i]        = x0 * c - x1 * s;
                o[i + half] = x1 * c + x0 * s;
            }
            for (int64_t i = n_rot; i < hd; ++i) o[i] = x[i];
        }
    });
}

void op_argmax(const Tensor & t, ThreadPool & pool) {
    const Tensor & a   = *t.src[0];
    int32_t *      out = static_cast<int32_t *>(t.data);
    pool.parallel_for(a.nrows(), 1, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) {
            const float * x    = reinterpret_cast<const float *>(row_ptr(a, r));
            int64_t       best = 0;
            for (int64_t i = 1; i < a.ne[0]; ++i)
                if (x[i] > x[best]) best = i;
            out[r] = int32_t(best);
        }
    });
}

}  // namespace spark::cpu
