// Row norms: RMS_NORM (plain weight or zero-centred 1 + w), L2_NORM, and the fused residual
// add + RMS_NORM (the sum is written to the ADD node's output, the norm to the RMS_NORM node's).
//
// A row is handled by a group of G threads: one warp for rows up to 1024 floats (many rows per
// block: per-head q/k norms, hidden-size norms at prefill), a whole block of 256 or 1024 threads for
// longer rows. Pass 1 accumulates the sum of squares (float32, per-thread then tree), pass 2 re-reads
// the row (an L1/L2 hit) and writes x * inv * w with the CPU backend's operation order.
#include "backends/cuda/elementwise/ew_common.cuh"

#include <type_traits>

namespace spark::cuda {

namespace {

using ew::Rows;

struct NormArgs {
    Rows          x;        // input rows (RMS_NORM / L2_NORM), or `a` of the fused add
    Rows          b;        // fused add: the other addend
    Rows          sum;      // fused add: where a + b goes (the ADD node's output)
    Rows          out;      // normalised rows
    const float * w = nullptr;  // weight [n] or nullptr
    int64_t       n = 0, nrows = 0;
    float         eps = 0.0f;
    bool          zero_centered = false;
    bool          l2            = false;  // L2_NORM: inv = 1 / sqrt(sum + eps)
    bool          b_one_row     = false;  // fused add: b broadcast over rows
};

__device__ __forceinline__ float4 ld4(const float * p) { return *reinterpret_cast<const float4 *>(p); }
__device__ __forceinline__ void   st4(float * p, float4 v) { *reinterpret_cast<float4 *>(p) = v; }

// G threads per row (G == 32: rows per block = blockDim.x / 32; G > 32: blockDim.x == G, one row
// per block). V = 4: float4 accesses (rows, sum, out and w all 16-byte aligned, n % 4 == 0).
template <int G, int V, bool ADD> __global__ void norm_kernel(const NormArgs args) {
    __shared__ float scratch[32];
    const int     rows_per_block = G == 32 ? int(blockDim.x) / 32 : 1;
    const int     t              = G == 32 ? int(threadIdx.x & 31) : int(threadIdx.x);
    const int64_t r              = int64_t(blockIdx.x) * rows_per_block + (G == 32 ? int(threadIdx.x >> 5) : 0);
    if (G == 32 && r >= args.nrows) return;  // whole warps only: no block-wide barrier in this mode
    const int64_t n = args.n;

    const float * x = reinterpret_cast<const float *>(args.x.row(r));
    float *       o = reinterpret_cast<float *>(args.out.row(r));
    const float * src = x;  // what pass 2 normalises
    float         ss  = 0.0f;
    if constexpr (ADD) {
        const float * b = reinterpret_cast<const float *>(args.b.row(args.b_one_row ? 0 : r));
        float *       s = reinterpret_cast<float *>(args.sum.row(r));
        for (int64_t i = int64_t(t) * V; i < n; i += int64_t(G) * V) {
            if constexpr (V == 4) {
                const float4 u = ld4(x + i), v = ld4(b + i);
                const float4 y = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
                st4(s + i, y);
                ss += y.x * y.x + y.y * y.y + y.z * y.z + y.w * y.w;
            } else {
                const float y = x[i] + b[i];
                s[i]          = y;
                ss += y * y;
            }
        }
        src = s;  // pass 2 re-reads this thread's own writes
    } else {
        for (int64_t i = int64_t(t) * V; i < n; i += int64_t(G) * V) {
            if constexpr (V == 4) {
                const float4 u = ld4(x + i);
                ss += u.x * u.x + u.y * u.y + u.z * u.z + u.w * u.w;
            } else {
                ss += x[i] * x[i];
            }
        }
    }
    ss = ew::group_sum<G>(ss, scratch);

    // Same expressions as the CPU backend: mean in float, then 1 / sqrt (IEEE, not rsqrtf).
    const float inv = args.l2 ? 1.0f / sqrtf(ss + args.eps) : 1.0f / sqrtf(ss / float(n) + args.eps);
    const float * w  = args.w;  // CPU order: (x * inv) * w
    const bool    zc = args.zero_centered;
    for (int64_t i = int64_t(t) * V; i < n; i += int64_t(G) * V) {
        if constexpr (V == 4) {
            const float4 u = ld4(src + i);
            float4       v = make_float4(u.x * inv, u.y * inv, u.z * inv, u.w * inv);
            if (w) {
                float4 g = ld4(w + i);
                if (zc) g = make_float4(1.0f + g.x, 1.0f + g.y, 1.0f + g.z, 1.0f + g.w);
                v = make_float4(v.x * g.x, v.y * g.y, v.z * g.z, v.w * g.w);
            }
            st4(o + i, v);
        } else {
            float v = src[i] * inv;
            if (w) v *= zc ? (1.0f + w[i]) : w[i];
            o[i] = v;
        }
    }
}

template <bool ADD> void launch_norm(const NormArgs & args, bool vec, const OpContext & ctx) {
    if (args.nrows == 0 || args.n == 0) return;
    auto go = [&](auto g_tag, auto v_tag) {
        constexpr int  G = decltype(g_tag)::value;
        constexpr int  V = decltype(v_tag)::value;
        const int      threads = G == 32 ? 128 : G;
        const int64_t  rows_per_block = G == 32 ? threads / 32 : 1;
        const int64_t  blocks = ceil_div(args.nrows, rows_per_block);
        if (blocks > 0x7fffffff) fail(SPARK_ERR_UNSUPPORTED, "cuda norm: too many rows (%lld)", (long long) args.nrows);
        norm_kernel<G, V, ADD><<<unsigned(blocks), threads, 0, ctx.stream>>>(args);
        SPARK_CUDA_CHECK_LAUNCH();
    };
    using G32   = std::integral_constant<int, 32>;
    using G256  = std::integral_constant<int, 256>;
    using G1024 = std::integral_constant<int, 1024>;
    using V1    = std::integral_constant<int, 1>;
    using V4    = std::integral_constant<int, 4>;
    if (args.n <= 1024) vec ? go(G32{}, V4{}) : go(G32{}, V1{});
    else if (args.n <= 8192) vec ? go(G256{}, V4{}) : go(G256{}, V1{});
    else vec ? go(G1024{}, V4{}) : go(G1024{}, V1{});
}

const float * norm_weight(const Tensor & norm, int64_t n, bool & aligned) {
    aligned = true;
    const Tensor * w = norm.src[1];
    if (!w) return nullptr;
    ew::require_f32_rows(*w, "RMS_NORM");
    ew::require(w->ne[0] == n && w->nrows() == 1, "RMS_NORM", "weight must be [ne0]");
    aligned = reinterpret_cast<uintptr_t>(w->data) % 16 == 0;
    return static_cast<const float *>(w->data);
}

bool overlaps(const Tensor & p, const Tensor & q) {
    const char * p0 = static_cast<const char *>(p.data);
    const char * q0 = static_cast<const char *>(q.data);
    return p.nelements() > 0 && q.nelements() > 0 && p0 < q0 + q.nbytes() && q0 < p0 + p.nbytes();
}

}  // namespace

void op_rms_norm(const Tensor & t, const OpContext & ctx) {
    const Tensor & x = *t.src[0];
    ew::require_f32_rows(x, "RMS_NORM");
    ew::require_f32_rows(t, "RMS_NORM");
    ew::require(ew::same_shape(x, t), "RMS_NORM", "output shape differs from the input");
    NormArgs args;
    args.x             = ew::rows_of(x);
    args.out           = ew::rows_of(t);
    args.n             = x.ne[0];
    args.nrows         = x.nrows();
    args.eps           = t.fp[0];
    args.zero_centered = t.ip[0] != 0;
    bool w_aligned     = true;
    args.w             = norm_weight(t, args.n, w_aligned);
    launch_norm<false>(args, w_aligned && ew::vec4_ok(x) && ew::vec4_ok(t), ctx);
}

void op_l2_norm(const Tensor & t, const OpContext & ctx) {
    const Tensor & x = *t.src[0];
    ew::require_f32_rows(x, "L2_NORM");
    ew::require_f32_rows(t, "L2_NORM");
    ew::require(ew::same_shape(x, t), "L2_NORM", "output shape differs from the input");
    NormArgs args;
    args.x     = ew::rows_of(x);
    args.out   = ew::rows_of(t);
    args.n     = x.ne[0];
    args.nrows = x.nrows();
    args.eps   = t.fp[0];
    args.l2    = true;
    launch_norm<false>(args, ew::vec4_ok(x) && ew::vec4_ok(t), ctx);
}

void op_add_rms_norm(const Tensor & add, const Tensor & norm, const OpContext & ctx) {
    ew::require(add.op == Op::ADD && norm.op == Op::RMS_NORM && norm.src[0] == &add, "ADD+RMS_NORM",
                "norm must be the RMS_NORM of the ADD node");
    const Tensor & a = *add.src[0];
    const Tensor & b = *add.src[1];
    ew::require_f32_rows(a, "ADD+RMS_NORM");
    ew::require_f32_rows(b, "ADD+RMS_NORM");
    ew::require_f32_rows(add, "ADD+RMS_NORM");
    ew::require_f32_rows(norm, "ADD+RMS_NORM");
    ew::require(ew::same_shape(a, add) && ew::same_shape(add, norm), "ADD+RMS_NORM", "shapes differ");
    ew::require(b.ne[0] == a.ne[0] && (b.nrows() == 1 || b.nrows() == a.nrows()), "ADD+RMS_NORM", "src1 shape");
    // The planner may place the norm's output over a or b (both are dead after the ADD node). One
    // row per block is still safe (a row is fully read before any of it is written, across a
    // barrier), but with several rows in flight a block could overwrite a row another block has
    // yet to read: then run the two ops one after the other (the sum never aliases a, b or out).
    if (a.nrows() > 1 && (overlaps(norm, a) || overlaps(norm, b))) {
        op_binary(add, ctx);
        op_rms_norm(norm, ctx);
        return;
    }
    NormArgs args;
    args.x             = ew::rows_of(a);
    args.b             = ew::rows_of(b);
    args.sum           = ew::rows_of(add);
    args.out           = ew::rows_of(norm);
    args.n             = a.ne[0];
    args.nrows         = a.nrows();
    args.eps           = norm.fp[0];
    args.zero_centered = norm.ip[0] != 0;
    args.b_one_row     = b.nrows() == 1;
    bool w_aligned     = true;
    args.w             = norm_weight(norm, args.n, w_aligned);
    const bool vec = w_aligned && ew::vec4_ok(a) && ew::vec4_ok(b) && ew::vec4_ok(add) && ew::vec4_ok(norm);
    launch_norm<true>(args, vec, ctx);
}

}  // namespace spark::cuda
