// MoE routing and combine.
//
// MOE_ROUTE: softmax over the E router logits of a token, top-k (highest probability first, ties to
// the lower expert id), optional renormalisation of the k weights, all in ONE kernel with one warp
// per token and no shared memory: lane l holds experts l, l + 32, ... (E <= 512: at most 16 values
// per lane in registers). Each of the k selection rounds is a per-lane scan of its remaining values
// and a 5-step butterfly (max, lower id) reduction that leaves the winner in every lane; the lane
// owning the winner retires it. Output row: k F32 weights, then k expert ids as I32 bits.
// The ids are always distinct and in [0, E): a NaN probability ranks below every number, so k <= E
// valid experts always exist (MATMUL_ID indexes expert tables with them).
// Arithmetic mirrors the CPU backend: m = max logit, e = expf(x - m), p = e / sum(e), weights summed
// in selection order for the renormalisation. The sum is float (the CPU's is double): weights differ
// by an ulp or so; the ranking cannot differ except between probabilities within an ulp.
//
// MOE_COMBINE: out[:, t] = sum_j w[j, t] * y[:, j, t], accumulated from 0 in the CPU's order
// without FMA contraction (bit-identical to the CPU backend).
#include "backends/cuda/elementwise/ew_common.cuh"

namespace spark::cuda {

namespace {

using ew::Rows;

constexpr int kMaxExperts = 512;
constexpr int kMaxTopK    = 32;  // one result per lane
constexpr int kRouteWarps = 4;   // tokens per block

struct RouteArgs {
    Rows    logits;
    Rows    out;
    int64_t n_expert = 0, nrows = 0;
    int     k         = 0;
    bool    normalize = false;
};

struct Cand {
    float   v;
    int32_t i;
};

__device__ __forceinline__ bool beats(float v, int32_t i, const Cand & c) { return v > c.v || (v == c.v && i < c.i); }

// NPL values per lane (power of two, 32 * NPL >= E).
template <int NPL> __global__ void moe_route_kernel(const RouteArgs args) {
    const int64_t r    = int64_t(blockIdx.x) * kRouteWarps + (threadIdx.x >> 5);
    const int     lane = threadIdx.x & 31;
    if (r >= args.nrows) return;  // whole warps
    const int     E = int(args.n_expert);
    const float * x = reinterpret_cast<const float *>(args.logits.row(r));

    float    p[NPL];
    uint32_t retired = 0;  // bit j: value j of this lane is taken or does not exist
    float    m       = -INFINITY;
#pragma unroll
    for (int j = 0; j < NPL; ++j) {
        const int e = lane + 32 * j;
        if (e < E) {
            p[j] = x[e];
            if (p[j] > m) m = p[j];
        } else {
            p[j] = 0.0f;
            retired |= 1u << j;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, m, o);
        if (other > m) m = other;
    }
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < NPL; ++j)
        if (!(retired >> j & 1u)) {
            p[j] = expf(p[j] - m);
            s += p[j];
        }
    s = ew::warp_sum(s);
#pragma unroll
    for (int j = 0; j < NPL; ++j)
        if (!(retired >> j & 1u)) p[j] = p[j] / s;

    float   wsum = 0.0f, my_w = 0.0f;
    int32_t my_id = 0;
    for (int it = 0; it < args.k; ++it) {
        Cand c{-INFINITY, 0x7fffffff};
#pragma unroll
        for (int j = 0; j < NPL; ++j) {
            const float key = p[j] == p[j] ? p[j] : -INFINITY;  // NaN ranks last
            const int   e   = lane + 32 * j;
            if (!(retired >> j & 1u) && beats(key, e, c)) c = Cand{key, e};
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            Cand other;
            other.v = __shfl_xor_sync(0xffffffffu, c.v, o);
            other.i = __shfl_xor_sync(0xffffffffu, c.i, o);
            if (beats(other.v, other.i, c)) c = other;
        }
        // The owner retires the winner and broadcasts its probability (the key hides a NaN).
        const int owner = c.i & 31, slot = c.i >> 5;
        float     mine  = 0.0f;
#pragma unroll
        for (int j = 0; j < NPL; ++j)
            if (j == slot) mine = p[j];
        if (lane == owner) retired |= 1u << slot;
        const float pv = __shfl_sync(0xffffffffu, mine, owner);
        wsum += pv;  // the CPU's order: selection order
        if (lane == it) {
            my_w  = pv;
            my_id = c.i;
        }
    }
    if (lane < args.k) {
        float *   w   = reinterpret_cast<float *>(args.out.row(r));
        int32_t * ids = reinterpret_cast<int32_t *>(w + args.k);
        w[lane]       = args.normalize ? my_w / wsum : my_w;
        ids[lane]     = my_id;
    }
}

struct CombineArgs {
    const char * y = nullptr;
    const char * w = nullptr;
    Rows         out;
    int64_t      y_nb1 = 0, y_nb2 = 0, w_nb1 = 0;
    int64_t      h = 0, k = 0, n_tok = 0, chunks = 0;
};

template <int V> __global__ void moe_combine_kernel(const CombineArgs args) {
    const int64_t items = args.n_tok * args.chunks;
    for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
        const int64_t tok = item / args.chunks;
        const int64_t c   = item - tok * args.chunks;
        const int64_t i   = (c * blockDim.x + threadIdx.x) * V;
        if (i >= args.h) continue;
        const float * wt = reinterpret_cast<const float *>(args.w + tok * args.w_nb1);
        float         acc[V];
#pragma unroll
        for (int v = 0; v < V; ++v) acc[v] = 0.0f;
        for (int64_t j = 0; j < args.k; ++j) {
            const float   wj = wt[j];
            const float * yj = reinterpret_cast<const float *>(args.y + j * args.y_nb1 + tok * args.y_nb2) + i;
            if constexpr (V == 4) {
                const float4 q = *reinterpret_cast<const float4 *>(yj);
                acc[0]         = __fadd_rn(acc[0], __fmul_rn(wj, q.x));
                acc[1]         = __fadd_rn(acc[1], __fmul_rn(wj, q.y));
                acc[2]         = __fadd_rn(acc[2], __fmul_rn(wj, q.z));
                acc[3]         = __fadd_rn(acc[3], __fmul_rn(wj, q.w));
            } else {
                acc[0] = __fadd_rn(acc[0], __fmul_rn(wj, *yj));
            }
        }
        float * o = reinterpret_cast<float *>(args.out.row(tok)) + i;
        if constexpr (V == 4) *reinterpret_cast<float4 *>(o) = make_float4(acc[0], acc[1], acc[2], acc[3]);
        else *o = acc[0];
    }
}

}  // namespace

void op_moe_route(const Tensor & t, const OpContext & ctx) {
    const Tensor & lg = *t.src[0];
    ew::require_f32_rows(lg, "MOE_ROUTE");
    ew::require(t.nb[0] == 4 && (t.type == DType::F32 || t.type == DType::I32), "MOE_ROUTE", "output must be 4-byte cells");
    const int     k = t.ip[0];
    const int64_t E = lg.ne[0];
    ew::require(E >= 1 && E <= kMaxExperts, "MOE_ROUTE", "more than 512 experts is not supported");
    ew::require(k >= 1 && k <= E && k <= kMaxTopK, "MOE_ROUTE", "top-k must be in [1, min(E, 32)]");
    ew::require(t.ne[0] == 2 * int64_t(k) && t.nrows() == lg.nrows(), "MOE_ROUTE", "output must be [2k, rows]");
    RouteArgs args;
    args.logits    = ew::rows_of(lg);
    args.out       = ew::rows_of(t);
    args.n_expert  = E;
    args.nrows     = lg.nrows();
    args.k         = k;
    args.normalize = t.ip[1] != 0;
    if (args.nrows == 0) return;
    const int64_t blocks = ceil_div(args.nrows, kRouteWarps);
    ew::require(blocks <= 0x7fffffff, "MOE_ROUTE", "too many tokens");
    const unsigned grid = unsigned(blocks), threads = 32 * kRouteWarps;
    if (E <= 32) moe_route_kernel<1><<<grid, threads, 0, ctx.stream>>>(args);
    else if (E <= 64) moe_route_kernel<2><<<grid, threads, 0, ctx.stream>>>(args);
    else if (E <= 128) moe_route_kernel<4><<<grid, threads, 0, ctx.stream>>>(args);
    else if (E <= 256) moe_route_kernel<8><<<grid, threads, 0, ctx.stream>>>(args);
    else moe_route_kernel<16><<<grid, threads, 0, ctx.stream>>>(args);
    SPARK_CUDA_CHECK_LAUNCH();
}

void op_moe_combine(const Tensor & t, const OpContext & ctx) {
    const Tensor & y = *t.src[0];
    const Tensor & w = *t.src[1];
    ew::require_f32_rows(y, "MOE_COMBINE");
    ew::require_f32_rows(w, "MOE_COMBINE");
    ew::require_f32_rows(t, "MOE_COMBINE");
    ew::require(y.ne[3] == 1 && w.ne[0] == y.ne[1] && w.ne[1] == y.ne[2] && w.ne[2] == 1 && w.ne[3] == 1, "MOE_COMBINE",
                "expects y [H, k, T] and w [k, T]");
    ew::require(t.ne[0] == y.ne[0] && t.nrows() == y.ne[2], "MOE_COMBINE", "output must be [H, T]");
    CombineArgs args;
    args.y     = static_cast<const char *>(y.data);
    args.w     = static_cast<const char *>(w.data);
    args.out   = ew::rows_of(t);
    args.y_nb1 = int64_t(y.nb[1]);
    args.y_nb2 = int64_t(y.nb[2]);
    args.w_nb1 = int64_t(w.nb[1]);
    args.h     = y.ne[0];
    args.k     = y.ne[1];
    args.n_tok = y.ne[2];
    if (args.h == 0 || args.n_tok == 0) return;
    constexpr int kThreads = 256;
    const bool    vec      = ew::vec4_ok(y) && ew::vec4_ok(t);
    const int     V        = vec ? 4 : 1;
    args.chunks            = ceil_div(args.h, int64_t(kThreads) * V);
    const unsigned grid    = ew::grid_for(args.n_tok * args.chunks, ctx);
    if (vec) moe_combine_kernel<4><<<grid, kThreads, 0, ctx.stream>>>(args);
    else moe_combine_kernel<1><<<grid, kThreads, 0, ctx.stream>>>(args);
    SPARK_CUDA_CHECK_LAUNCH();
}

}  // namespace spark::cuda
