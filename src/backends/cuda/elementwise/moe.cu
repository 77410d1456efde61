// MoE routing and combine.
//
// MOE_ROUTE: softmax over the E router logits of a token, top-k (highest probability first, ties to
// the lower expert id), optional renormalisation of the k weights, all in ONE kernel: E <= 256 with
// one warp per token and no shared memory, lane l holding experts l, l + 32, ... (at most 8 values
// per lane in registers); E > 256 (Qwen3-Next's 512) with one block of 4 warps per token, each warp
// as the one-warp kernel over its 128 experts, then the 4 lists' k largest keys by rank
// (moe_kernels.cuh: moe_route_wide_kernel; the same results bit for bit). Output row: k F32
// weights, then k expert ids as I32 bits (and, with the shared slot, the id E after them).
//   softmax: m = max logit (one redux.sync over order-preserving integer keys), e = expf(x - m),
//            s = per-lane sum then a 5-step butterfly, p = e / s (IEEE) -- the same expressions and
//            summation order as before, so p is bit-identical to the previous kernel's;
//   select:  every lane sorts its own values once (a register bitonic network on 64-bit keys
//            (p, ~id)), so its best remaining candidate is always its head. A selection round is
//            then two warp reductions in hardware (redux.sync max of the heads' probability keys,
//            redux.sync min of the ids whose key equals it: ties to the lower id) and a register
//            shift in the winning lane -- instead of a per-lane scan plus a 5-step, two-shuffle
//            (value, id) butterfly and an owner broadcast per round. The rounds touch no memory:
//            a softmax weight is decoded from the winning key; a sigmoid score (the key holds
//            score + bias) comes from the registers of the lane that holds the winner (one
//            shuffle).
//   sigmoid scoring (MiniMax-M2): p = 1 / (1 + expf(-x)) per expert, no max and no sum; the experts
//            are chosen by p + bias (the optional e_score_correction_bias; the key is the
//            order-preserving integer of any float) and weighted by p alone. The bias is a weight:
//            read before the PDL wait, so its trip to DRAM overlaps the router GEMV.
// The kernel lets the next one start at its own start: the experts' gate/up GEMV after it converts
// its activations (written before the router GEMV, whose FMA kernel triggers after its wait) while
// the routing runs (GemvArgs::x_early; docs/PERF.md, "The experts' activations converted while the
// routing runs").
// The ids are always distinct and in [0, E): a NaN probability ranks below every number, so k <= E
// valid experts always exist (MATMUL_ID indexes expert tables with them).
// Arithmetic mirrors the CPU backend: m = max logit, e = expf(x - m), p = e / sum(e), weights summed
// in selection order for the renormalisation. The sum is float (the CPU's is double): weights differ
// by an ulp or so; the ranking cannot differ except between probabilities within an ulp.
//
// MOE_COMBINE: out[:, t] = sum_j w[j, t] * y[:, j, t], accumulated from 0 in the CPU's order
// without FMA contraction (bit-identical to the CPU backend). A thread owns 4 (or 1) columns of a
// token and issues all k weight and y loads before the first add (up to 16 slots per batch), so a
// token costs one memory round trip, not one per slot.
#include "backends/cuda/elementwise/moe_kernels.cuh"

namespace spark::cuda {

namespace {

using ew::CombineArgs;
using ew::kCombineThreads;
using ew::kMaxExperts;
using ew::kMaxTopK;
using ew::RouteArgs;
using ew::moe_combine_kernel;

}  // namespace

void op_moe_route(const Tensor & t, const OpContext & ctx) {
    const Tensor & lg = *t.src[0];
    ew::require_f32_rows(lg, "MOE_ROUTE");
    ew::require(t.nb[0] == 4 && (t.type == DType::F32 || t.type == DType::I32), "MOE_ROUTE", "output must be 4-byte cells");
    const int     k = t.ip[0];
    const int64_t E = lg.ne[0];
    ew::require(E >= 1 && E <= kMaxExperts, "MOE_ROUTE", "more than 512 experts is not supported");
    const bool    shared = t.ip[3] != 0;
    ew::require(k >= 1 && k <= E && k + (shared ? 1 : 0) <= kMaxTopK, "MOE_ROUTE", "top-k (and the shared slot) must be in [1, min(E, 32)]");
    ew::require(t.ne[0] == 2 * int64_t(k) + (shared ? 1 : 0) && t.nrows() == lg.nrows(), "MOE_ROUTE",
                "output must be [2k, rows] ([2k + 1, rows] with the shared slot)");
    RouteArgs args;
    args.logits    = ew::rows_of(lg);
    args.out       = ew::rows_of(t);
    args.n_expert  = E;
    args.nrows     = lg.nrows();
    args.k         = k;
    args.normalize = t.ip[1] != 0;
    args.sigmoid   = t.ip[2] == int32_t(RouterScore::Sigmoid);
    args.shared    = shared;
    if (const Tensor * bias = t.src[1]) {
        ew::require(args.sigmoid && bias->type == DType::F32 && bias->ne[0] == E && bias->nrows() == 1 && bias->nb[0] == 4, "MOE_ROUTE",
                    "the choice bias must be F32 [E] (sigmoid scoring only)");
        args.bias = static_cast<const float *>(bias->data);
    }
    if (args.nrows == 0) return;
    const ew::RouteLaunch rl     = ew::route_launch_for(E);
    const int64_t         blocks = ceil_div(args.nrows, int64_t(rl.rows_per_block));
    ew::require(blocks <= 0x7fffffff, "MOE_ROUTE", "too many tokens");
    launch(rl.kernel, unsigned(blocks), unsigned(rl.threads), 0, ctx.stream, args);
    SPARK_CUDA_CHECK_LAUNCH();
}

namespace {

// The combine's arguments and its V (4: every row 16-byte aligned), chunks set; false: nothing to do.
bool combine_args(const Tensor & t, CombineArgs & args, bool & vec) {
    const Tensor & y = *t.src[0];
    const Tensor & w = *t.src[1];
    ew::require_f32_rows(y, "MOE_COMBINE");
    ew::require_f32_rows(w, "MOE_COMBINE");
    ew::require_f32_rows(t, "MOE_COMBINE");
    ew::require(y.ne[3] == 1 && w.ne[0] == y.ne[1] && w.ne[1] == y.ne[2] && w.ne[2] == 1 && w.ne[3] == 1, "MOE_COMBINE",
                "expects y [H, k, T] and w [k, T]");
    ew::require(t.ne[0] == y.ne[0] && t.nrows() == y.ne[2], "MOE_COMBINE", "output must be [H, T]");
    args.y     = static_cast<const char *>(y.data);
    args.w     = static_cast<const char *>(w.data);
    args.out   = ew::rows_of(t);
    args.y_nb1 = int64_t(y.nb[1]);
    args.y_nb2 = int64_t(y.nb[2]);
    args.w_nb1 = int64_t(w.nb[1]);
    args.h     = y.ne[0];
    args.k     = y.ne[1];
    args.n_tok = y.ne[2];
    bool shared_vec = true;
    if (const Tensor * s = t.src[2]) {  // + shared * sigmoid(gate)
        const Tensor & g = *t.src[3];
        ew::require_f32_rows(*s, "MOE_COMBINE");
        ew::require_f32_rows(g, "MOE_COMBINE");
        ew::require(s->ne[0] == y.ne[0] && s->ne[1] == y.ne[2] && s->nrows() == s->ne[1] && g.ne[0] == 1 &&
                        g.ne[1] == y.ne[2] && g.nrows() == g.ne[1],
                    "MOE_COMBINE", "expects the shared expert [H, T] and its gate [1, T]");
        args.s     = static_cast<const char *>(s->data);
        args.g     = static_cast<const char *>(g.data);
        args.s_nb1 = int64_t(s->nb[1]);
        args.g_nb1 = int64_t(g.nb[1]);
        shared_vec = ew::vec4_ok(*s);
    }
    vec         = ew::vec4_ok(y) && ew::vec4_ok(t) && shared_vec;
    args.chunks = ceil_div(args.h, int64_t(kCombineThreads) * (vec ? 4 : 1));
    return args.h > 0 && args.n_tok > 0;
}

void launch_combine(const CombineArgs & args, bool vec, const OpContext & ctx) {
    const unsigned grid = ew::grid_for(args.n_tok * args.chunks, ctx);
    const bool     wide = args.k > 8;
    if (args.parts != nullptr) {  // (launch_combine_norm: 16-byte rows only)
        if (wide) launch(moe_combine_kernel<4, 16, true>, grid, kCombineThreads, 0, ctx.stream, args);
        else launch(moe_combine_kernel<4, 8, true>, grid, kCombineThreads, 0, ctx.stream, args);
    } else if (vec) {
        if (wide) launch(moe_combine_kernel<4, 16>, grid, kCombineThreads, 0, ctx.stream, args);
        else launch(moe_combine_kernel<4, 8>, grid, kCombineThreads, 0, ctx.stream, args);
    } else {
        if (wide) launch(moe_combine_kernel<1, 16>, grid, kCombineThreads, 0, ctx.stream, args);
        else launch(moe_combine_kernel<1, 8>, grid, kCombineThreads, 0, ctx.stream, args);
    }
    SPARK_CUDA_CHECK_LAUNCH();
}

}  // namespace

void op_moe_combine(const Tensor & t, const OpContext & ctx) {
    CombineArgs args;
    bool        vec = false;
    if (combine_args(t, args, vec)) launch_combine(args, vec, ctx);
}

int64_t combine_norm_parts(const Tensor & comb, const Tensor & add, const Tensor & norm) {
    const Tensor & y     = *comb.src[0];
    const Tensor & resid = add.src[0] == &comb ? *add.src[1] : *add.src[0];
    for (const Tensor * t : std::initializer_list<const Tensor *>{&y, &comb, comb.src[2], &resid, &add, &norm, norm.src[1]})
        if (t && !ew::vec4_ok(*t)) return 0;
    return ceil_div(y.ne[0], int64_t(kCombineThreads) * 4) * ew::kCombineWarps;
}

void launch_combine_norm(const Tensor & comb, const Tensor & add, const Tensor & norm, float * parts, const OpContext & ctx) {
    CombineArgs args;
    bool        vec = false;
    if (!combine_args(comb, args, vec)) return;
    const Tensor & resid = add.src[0] == &comb ? *add.src[1] : *add.src[0];
    ew::require_f32_rows(resid, "MOE_COMBINE+ADD+RMS_NORM");
    ew::require_f32_rows(add, "MOE_COMBINE+ADD+RMS_NORM");
    ew::require_f32_rows(norm, "MOE_COMBINE+ADD+RMS_NORM");
    if (combine_norm_parts(comb, add, norm) == 0)
        fail(SPARK_ERR_INTERNAL, "combine_norm: the rows must be 16-byte aligned (op_combine_norm_matmul checks it first)");
    args.out           = ew::rows_of(add);  // (the combine's own output is not written: only the ADD reads it)
    args.resid         = static_cast<const char *>(resid.data);
    args.resid_nb1     = int64_t(resid.nb[1]);
    args.norm_x        = ew::rows_of(norm);
    args.norm_w        = norm.src[1] ? static_cast<const float *>(norm.src[1]->data) : nullptr;
    args.zero_centered = norm.ip[0];
    args.parts         = parts;
    launch_combine(args, vec, ctx);
}

}  // namespace spark::cuda
