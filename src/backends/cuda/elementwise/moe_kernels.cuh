// Kernels of MOE_ROUTE and MOE_COMBINE; launched by moe.cu, also compiled by the CPU warp emulator
// test (dev/kernels/elementwise/emu_test.cpp). See moe.cu.
#pragma once

#include "backends/cuda/common/pdl.cuh"
#include "backends/cuda/elementwise/ew_common.cuh"

namespace spark::cuda::ew {

constexpr int kMaxExperts = 512;
constexpr int kMaxTopK    = 32;  // one result per lane
constexpr int kRouteWarps = 4;   // tokens per block

struct RouteArgs {
    Rows          logits;
    Rows          out;
    int64_t       n_expert = 0, nrows = 0;
    int           k         = 0;
    bool          normalize = false;
    bool          sigmoid   = false;    // sigmoid scores instead of a softmax (MiniMax-M2)
    const float * bias      = nullptr;  // sigmoid only, optional: added to the scores to choose, not to the weights
    bool          shared    = false;    // ids end with n_expert: the shared expert's slot k (Graph::moe_route)
};

__device__ __forceinline__ float route_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
// The choice key of a sigmoid score plus bias (any float): NaN below every number, as prob_key.
__device__ __forceinline__ uint32_t choice_key(float c) { return c == c ? ordered_key(c) : 1u; }

// Probability key: larger p -> larger key; NaN below every number; 0 = no candidate (retired or
// beyond E). p is in [0, 1] (or NaN), so bits + 2 never overflows and decodes exactly.
__device__ __forceinline__ uint32_t prob_key(float p) { return p == p ? __float_as_uint(p) + 2u : 1u; }
__device__ __forceinline__ float    key_prob(uint32_t k) { return k >= 2u ? __uint_as_float(k - 2u) : __int_as_float(0x7fffffff); }

// ---- routing building blocks (one warp's candidates: lane l holds experts base + l + 32 j, j < NPL)

// The candidates as 64-bit keys (score key, then ~id: equal keys rank the lower id first), sorted
// descending per lane by a register bitonic network.
template <int NPL> __device__ __forceinline__ void route_sort_desc(uint64_t (&c)[NPL]) {
#pragma unroll
    for (int size = 2; size <= NPL; size <<= 1)
#pragma unroll
        for (int stride = size >> 1; stride > 0; stride >>= 1)
#pragma unroll
            for (int i = 0; i < NPL; ++i) {
                const int l = i ^ stride;
                if (l > i) {
                    const bool     desc = (i & size) == 0;
                    const uint64_t hi = c[i] > c[l] ? c[i] : c[l], lo = c[i] > c[l] ? c[l] : c[i];
                    c[i]              = desc ? hi : lo;
                    c[l]              = desc ? lo : hi;
                }
            }
}

// k selection rounds over a warp's sorted candidates, register work only (no memory): lane it < k
// ends with the it-th winner's key and weight (softmax: the probability its key holds; sigmoid: the
// score without the bias, from the registers of the lane that holds it: e % 32, slot (e / 32) % NPL),
// wsum with the k weights summed in selection order (the CPU's order). Past the warp's candidates
// the winners are key 0 (no candidate).
template <int NPL>
__device__ __forceinline__ void route_select(uint64_t (&c)[NPL], const float (&p)[NPL], int k, bool sigmoid, int lane, uint64_t & my_key,
                                             float & my_w, float & wsum) {
    wsum = 0.0f, my_w = 0.0f, my_key = 0ull;
    for (int it = 0; it < k; ++it) {
        const uint32_t hk   = uint32_t(c[0] >> 32);
        const uint32_t hid  = ~uint32_t(c[0]);
        const uint32_t kmax = __reduce_max_sync(0xffffffffu, hk);
        const uint32_t wid  = __reduce_min_sync(0xffffffffu, hk == kmax ? hid : 0xffffffffu);
        if (hid == wid) {  // the winner's lane drops its head
#pragma unroll
            for (int j = 0; j + 1 < NPL; ++j) c[j] = c[j + 1];
            c[NPL - 1] = 0ull;
        }
        float pv;
        if (sigmoid) {  // slot (wid / 32) % NPL (warp-uniform) of lane wid % 32, by a tree of selects on
                        // the slot's bits (a dynamic index would put p in local memory)
            const uint32_t slot = (wid >> 5) & uint32_t(NPL - 1);
            float          v[NPL];
#pragma unroll
            for (int j = 0; j < NPL; ++j) v[j] = p[j];
#pragma unroll
            for (int b = NPL / 2; b >= 1; b >>= 1)
#pragma unroll
                for (int j = 0; j < b; ++j) v[j] = slot & uint32_t(b) ? v[j + b] : v[j];
            pv = __shfl_sync(0xffffffffu, v[0], int(wid & 31u));
        } else {
            pv = key_prob(kmax);  // the softmax probability the key holds
        }
        wsum += pv;
        if (lane == it) {
            my_w   = pv;
            my_key = (uint64_t(kmax) << 32) | uint64_t(~wid);
        }
    }
}

// A row's output: k weights (renormalised by wsum when asked), k ids, the shared expert's id E.
__device__ __forceinline__ void route_store(const RouteArgs & args, int64_t r, int lane, uint64_t key, float w_val, float wsum) {
    float * w = reinterpret_cast<float *>(args.out.row(r));
    if (lane < args.k) {
        int32_t * ids = reinterpret_cast<int32_t *>(w + args.k);
        w[lane]       = args.normalize ? w_val / wsum : w_val;
        ids[lane]     = int32_t(~uint32_t(key));
    } else if (lane == args.k && args.shared) {
        reinterpret_cast<int32_t *>(w)[2 * args.k] = int32_t(args.n_expert);
    }
}

// The choice bias of this lane's experts (a weight, written at load time): requested before the PDL
// wait, so its trip to DRAM (the step's weight stream has evicted it from L2) overlaps the router
// GEMV's end.
template <int NPL> __device__ __forceinline__ void route_load_bias(const RouteArgs & args, bool row_ok, int e0, float (&bias)[NPL]) {
#pragma unroll
    for (int j = 0; j < NPL; ++j) {
        const int e = e0 + 32 * j;
        bias[j]     = args.bias && e < args.n_expert && row_ok ? __ldg(args.bias + e) : 0.0f;
    }
}

// Sigmoid scores: p becomes the score each expert would be weighted by, c its choice key (p + bias).
template <int NPL>
__device__ __forceinline__ void route_sigmoid_keys(int e0, int E, const float (&bias)[NPL], float (&p)[NPL], uint64_t (&c)[NPL]) {
#pragma unroll
    for (int j = 0; j < NPL; ++j) {
        const uint32_t e = uint32_t(e0 + 32 * j);
        p[j]             = route_sigmoid(p[j]);
        c[j]             = e < uint32_t(E) ? (uint64_t(choice_key(p[j] + bias[j])) << 32) | uint64_t(~e) : 0ull;
    }
}

// Softmax keys from p = exp(x - m) / s.
template <int NPL> __device__ __forceinline__ void route_softmax_keys(int e0, int E, float s, const float (&ex)[NPL], uint64_t (&c)[NPL]) {
#pragma unroll
    for (int j = 0; j < NPL; ++j) {
        const uint32_t e = uint32_t(e0 + 32 * j);
        c[j]             = e < uint32_t(E) ? (uint64_t(prob_key(ex[j] / s)) << 32) | uint64_t(~e) : 0ull;
    }
}

// The row's logits of this lane's experts (0 past E).
template <int NPL> __device__ __forceinline__ void route_load_logits(const RouteArgs & args, int64_t r, int e0, float (&p)[NPL]) {
    const float * x = reinterpret_cast<const float *>(args.logits.row(r));
#pragma unroll
    for (int j = 0; j < NPL; ++j) {
        const int e = e0 + 32 * j;
        p[j]        = e < args.n_expert ? x[e] : 0.0f;
    }
}

// The warp's largest logit as an order key (NaN-free logits give the same maximum as a float max; a
// NaN makes every p NaN either way).
template <int NPL> __device__ __forceinline__ uint32_t route_max_key(int e0, int E, const float (&p)[NPL]) {
    uint32_t mk = 0;
#pragma unroll
    for (int j = 0; j < NPL; ++j)
        if (e0 + 32 * j < E) mk = max(mk, ordered_key(p[j]));
    return __reduce_max_sync(0xffffffffu, mk);
}

// E <= 256: one warp per token (NPL values per lane, a power of two, 32 NPL >= E), kRouteWarps
// tokens a block.
template <int NPL> __global__ void __launch_bounds__(32 * kRouteWarps) moe_route_kernel(const RouteArgs args) {
    pdl::launch_dependents();
    const int64_t r    = int64_t(blockIdx.x) * kRouteWarps + (threadIdx.x >> 5);
    const int     lane = threadIdx.x & 31;
    const int     E    = int(args.n_expert);
    float         bias[NPL];
    route_load_bias(args, r < args.nrows, lane, bias);
    pdl::wait();
    if (r >= args.nrows) return;  // whole warps
    float p[NPL];
    route_load_logits(args, r, lane, p);
    uint64_t c[NPL];
    if (args.sigmoid) {
        route_sigmoid_keys(lane, E, bias, p, c);
    } else {
        const float m = from_ordered_key(route_max_key(lane, E, p));
        float       s = 0.0f;
#pragma unroll
        for (int j = 0; j < NPL; ++j)
            if (lane + 32 * j < E) {
                p[j] = expf(p[j] - m);
                s += p[j];
            }
        route_softmax_keys(lane, E, warp_sum(s), p, c);
    }
    route_sort_desc(c);
    uint64_t my_key;
    float    my_w, wsum;
    route_select(c, p, args.k, args.sigmoid, lane, my_key, my_w, wsum);
    route_store(args, r, lane, my_key, my_w, wsum);
}

// E > 256: one block of W warps per token, warp w holding experts 128 w .. 128 w + 127 (4 a lane),
// so no lane sorts or shifts more than 4 keys (16 in one warp at E = 512 made the kernel twice as
// long as 4 at E = 128). The results are the one-warp kernel's bit for bit: the softmax's maximum is a
// maximum; its sum runs per lane in the same slot order (the exponentials through shared memory,
// every warp summing all of them) and the same butterfly; each warp selects its own top k, and the
// k largest keys of the W lists (a key's rank: its index plus the keys above it in the other lists;
// keys are unique) are the k winners in selection order, their weights summed in that order.
constexpr int kRouteWideNPL = 4;
template <int W> __global__ void __launch_bounds__(32 * W) moe_route_wide_kernel(const RouteArgs args) {
    constexpr int NPL = kRouteWideNPL, kPerWarp = 32 * NPL;
    __shared__ uint32_t max_s[W];
    __shared__ float    ex_s[W * kPerWarp];
    __shared__ uint64_t key_s[W][kMaxTopK];
    __shared__ float    w_s[W][kMaxTopK];
    __shared__ uint64_t win_key[kMaxTopK];
    __shared__ float    win_w[kMaxTopK];
    pdl::launch_dependents();
    const int64_t r    = blockIdx.x;
    const int     warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int     E = int(args.n_expert), e0 = kPerWarp * warp + lane;
    float         bias[NPL];
    route_load_bias(args, r < args.nrows, e0, bias);
    pdl::wait();
    if (r >= args.nrows) return;  // the whole block
    float p[NPL];
    route_load_logits(args, r, e0, p);
    uint64_t c[NPL];
    if (args.sigmoid) {
        route_sigmoid_keys(e0, E, bias, p, c);
    } else {
        uint32_t mk = route_max_key(e0, E, p);
        if (lane == 0) max_s[warp] = mk;
        __syncthreads();
#pragma unroll
        for (int v = 0; v < W; ++v) mk = max(mk, max_s[v]);
        const float m = from_ordered_key(mk);
#pragma unroll
        for (int j = 0; j < NPL; ++j) {
            const int e = e0 + 32 * j;
            if (e < E) ex_s[e] = p[j] = expf(p[j] - m);
        }
        __syncthreads();
        float s = 0.0f;  // lane l: experts l, l + 32, ... in order, as the one-warp kernel's lane
#pragma unroll
        for (int j = 0; j < W * NPL; ++j)
            if (lane + 32 * j < E) s += ex_s[lane + 32 * j];
        route_softmax_keys(e0, E, warp_sum(s), p, c);
    }
    route_sort_desc(c);
    uint64_t my_key;
    float    my_w, wsum;
    route_select(c, p, args.k, args.sigmoid, lane, my_key, my_w, wsum);
    if (lane < args.k) {
        key_s[warp][lane] = my_key;
        w_s[warp][lane]   = my_w;
    }
    __syncthreads();
    if (lane < args.k) {  // this warp's it-th winner: its rank among all W lists
        int rank = lane;
#pragma unroll
        for (int v = 0; v < W; ++v)
            if (v != warp)
                for (int j = 0; j < args.k; ++j) rank += key_s[v][j] > my_key ? 1 : 0;
        if (rank < args.k) {  // (keys 0, past a warp's candidates, always rank k or later)
            win_key[rank] = my_key;
            win_w[rank]   = my_w;
        }
    }
    __syncthreads();
    if (warp != 0) return;
    wsum = 0.0f;
    for (int it = 0; it < args.k; ++it) wsum += win_w[it];  // selection order
    route_store(args, r, lane, lane < args.k ? win_key[lane] : 0ull, lane < args.k ? win_w[lane] : 0.0f, wsum);
}

// The route kernel of E experts and its launch (host side: the launcher and the emulator test).
using RouteKernel = void (*)(RouteArgs);
struct RouteLaunch {
    RouteKernel kernel;
    int         rows_per_block, threads;
};
// Past 256 experts the block per token (Qwen3-Next, 512: tg128 +2%, H200); at 256
// (MiniMax-M2) two warps measured 0.5% slower than one warp of 8 values a lane.
inline RouteLaunch route_launch_for(int64_t E) {
    if (E > 256) return {moe_route_wide_kernel<4>, 1, 32 * 4};
    return {E <= 32 ? moe_route_kernel<1> : E <= 64 ? moe_route_kernel<2> : E <= 128 ? moe_route_kernel<4> : moe_route_kernel<8>, kRouteWarps,
            32 * kRouteWarps};
}

struct CombineArgs {
    const char * y = nullptr;
    const char * w = nullptr;
    Rows         out;
    int64_t      y_nb1 = 0, y_nb2 = 0, w_nb1 = 0;
    int64_t      h = 0, k = 0, n_tok = 0, chunks = 0;
    // Optional shared expert: + s * sigmoid(g), s [H, T], g [1, T] (rows s_nb1 / g_nb1 bytes apart).
    const char * s = nullptr;
    const char * g = nullptr;
    int64_t      s_nb1 = 0, g_nb1 = 0;
    // Optional residual ADD and the producer's half of the RMS_NORM of that sum
    // (op_combine_norm_matmul): out = the combine + resid (the ADD's output), norm_x = out * w (1 + w:
    // zero_centered; the norm's weighted rows, whose 1 / rms the GEMV after it applies), and warp w
    // of each block item (token t, chunk c) writes the sum of squares of its part of out to
    // parts[(t * chunks + c) * kCombineWarps + w]. resid == nullptr: a plain combine.
    const char *  resid    = nullptr;
    int64_t       resid_nb1 = 0;
    Rows          norm_x;
    const float * norm_w   = nullptr;
    int32_t       zero_centered = 0;
    float *       parts    = nullptr;
};

constexpr int kCombineThreads = 128;
constexpr int kCombineWarps   = kCombineThreads / 32;

// V consecutive floats (16-byte aligned for V = 4).
template <int V> __device__ __forceinline__ void load_columns(const float * p, float (&v)[V]) {
    if constexpr (V == 4) {
        const float4 q = *reinterpret_cast<const float4 *>(p);
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
        v[0] = *p;
    }
}
template <int V> __device__ __forceinline__ void store_columns(float * p, const float (&v)[V]) {
    if constexpr (V == 4) *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
    else *p = v[0];
}

// Columns i .. i + V - 1 of token tok: the weighted sum of the slots (and the shared expert), stored
// to out; with a residual (CombineArgs::resid) the ADD's sum there and the norm's weighted row to
// norm_x, and the sum of the sum's squares is returned (0 otherwise).
template <int V, int KC, bool NORM> __device__ __forceinline__ float combine_columns(const CombineArgs & args, int64_t tok, int64_t i) {
    const float * wt = reinterpret_cast<const float *>(args.w + tok * args.w_nb1);
    const char *  yt = args.y + tok * args.y_nb2;
    float         acc[V], sv[V], rv[V], nw[V], sig = 0.0f;
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = 0.0f;
    if (args.s) {  // issued with the slots' loads
        load_columns<V>(reinterpret_cast<const float *>(args.s + tok * args.s_nb1) + i, sv);
        sig = 1.0f / (1.0f + expf(-*reinterpret_cast<const float *>(args.g + tok * args.g_nb1)));  // MUL_SIGMOID's
    }
    if constexpr (NORM) {  // likewise
        load_columns<V>(reinterpret_cast<const float *>(args.resid + tok * args.resid_nb1) + i, rv);
#pragma unroll
        for (int v = 0; v < V; ++v) nw[v] = 1.0f;
        if (args.norm_w) load_columns<V>(args.norm_w + i, nw);
    }
    for (int64_t j0 = 0; j0 < args.k; j0 += KC) {
        float wj[KC], yv[KC][V];
#pragma unroll
        for (int u = 0; u < KC; ++u) {
            const int64_t j = j0 + u;
            if (j < args.k) {
                wj[u] = wt[j];
                load_columns<V>(reinterpret_cast<const float *>(yt + j * args.y_nb1) + i, yv[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < KC; ++u)
            if (j0 + u < args.k)
#pragma unroll
                for (int v = 0; v < V; ++v) acc[v] = __fadd_rn(acc[v], __fmul_rn(wj[u], yv[u][v]));
    }
    if (args.s) {
#pragma unroll
        for (int v = 0; v < V; ++v) acc[v] = __fadd_rn(acc[v], __fmul_rn(sv[v], sig));  // then ADD's
    }
    float ss = 0.0f;
    if constexpr (NORM) {  // the residual ADD (its bits: a + b is b + a), the norm's weighted row, the squares
        float nx[V];
#pragma unroll
        for (int v = 0; v < V; ++v) {
            acc[v] = __fadd_rn(rv[v], acc[v]);
            ss     = fmaf(acc[v], acc[v], ss);
            nx[v]  = acc[v] * (args.zero_centered ? 1.0f + nw[v] : nw[v]);
        }
        store_columns<V>(reinterpret_cast<float *>(args.norm_x.row(tok)) + i, nx);
    }
    store_columns<V>(reinterpret_cast<float *>(args.out.row(tok)) + i, acc);
    return ss;
}

// KC slots per batch: all KC weight and y loads are in flight before the first add. NORM: the
// producer of op_combine_norm_matmul (CombineArgs::resid, parts; its own instantiation, so that the
// plain combine compiles as it would without it).
template <int V, int KC, bool NORM = false> __global__ void __launch_bounds__(kCombineThreads) moe_combine_kernel(const CombineArgs args) {
    pdl::launch_dependents();
    pdl::wait();
    const int64_t items = args.n_tok * args.chunks;
    for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
        const int64_t tok = item / args.chunks;
        const int64_t c   = item - tok * args.chunks;
        const int64_t i   = (c * kCombineThreads + threadIdx.x) * V;
        if constexpr (!NORM) {
            if (i < args.h) combine_columns<V, KC, false>(args, tok, i);
        } else {
            // Each warp's sum of squares (a butterfly: fixed, so every run writes the same bits); no
            // barrier: the GEMV after it sums the warps' parts.
            const float ss = warp_sum(i < args.h ? combine_columns<V, KC, true>(args, tok, i) : 0.0f);
            if ((threadIdx.x & 31) == 0) args.parts[item * kCombineWarps + (threadIdx.x >> 5)] = ss;
        }
    }
}
}  // namespace spark::cuda::ew
