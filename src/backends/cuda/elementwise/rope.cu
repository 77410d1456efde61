// ROPE: NEOX ("rotate half") rotary embedding of the first n_rot dims of every head of x [hd, nh, T]
// at positions pos [T]; dims n_rot..hd are copied. And the fused per-head RMS_NORM + ROPE
// (op_rms_norm_rope: q/k norm, then RoPE of the normalised head, in one pass).
//
// Frequencies are bit-identical to the CPU backend's: the launcher evaluates the very same host
// expression inv_freq[i] = 1.0f / std::pow(theta, float(2i) / float(n_rot)) (common/rope_freqs.h)
// and passes the table by value as a kernel parameter (so a captured CUDA graph carries it). On the
// device the angle is the same single float multiply pos * inv_freq[i]; sin/cos are the precise
// sincosf (not the __sinf intrinsic), and the rotation is evaluated without FMA contraction, in the
// CPU's order. The fused norm is the RMS_NORM kernel's arithmetic: float32 sum of squares (per lane,
// then a warp butterfly), inv = 1 / sqrtf(mean + eps) (IEEE), y = (x * inv) * w or * (1 + w); the
// rotation then reads y exactly as the CPU's ROPE reads the RMS_NORM output. A head's arithmetic is
// common/rope.cuh (rope_head), which the attention decode kernel also runs for a fused q/k norm.
//
// The RMS_NORM of a whole projection (MiniMax-M2's q / k norms: the mean over all heads of a token)
// followed by the RoPE of its heads (op_whole_norm_rope_pair) runs the same arithmetic per head with
// the row's inv from a block-wide sum (rope_row_norm_kernel): one launch instead of four.
//
// One warp per (token, head), 4 per block, no shared memory and no barrier: lane l owns the rotation
// pairs j = l + 32 k (elements j and j + n_rot / 2) and the copied dims n_rot + l + 32 c, all in
// registers. Every load (position, head, norm weight) is issued first, so a head costs one memory
// round trip, NP precise sincosf per lane, a 5-step butterfly (fused norm) and the stores. (The
// previous kernel computed a token's cos/sin table in shared memory behind the position load and a
// barrier, then looped over (head, pair) items with 64-bit divisions and a load-store round trip per
// iteration.)
#include "backends/cuda/elementwise/rope_kernels.cuh"

#include <cmath>
#include <cstring>

namespace spark::cuda {

namespace {

using ew::kMaxCopyReg;
using ew::kRopeWarps;
using ew::kRowHeads;
using ew::kRowWarps;
using ew::RopeArgs;
using ew::RopeHeads;

template <int NP, int NC, bool NORM> void launch_np_nc(const RopeArgs & args, const RopeFreqs & freqs, const OpContext & ctx) {
    const unsigned blocks = unsigned(ceil_div(int64_t(args.items) + args.second.items, kRopeWarps));
    launch(ew::rope_kernel<NP, NC, NORM>, blocks, 32 * kRopeWarps, 0, ctx.stream, args, freqs);
    SPARK_CUDA_CHECK_LAUNCH();
}

template <int NP, bool NORM> void launch_np(const RopeArgs & args, const RopeFreqs & freqs, const OpContext & ctx) {
    const int copy = args.hd - args.n_rot;
    if (copy == 0) return launch_np_nc<NP, 0, NORM>(args, freqs, ctx);
    if (copy <= 64) return launch_np_nc<NP, 2, NORM>(args, freqs, ctx);
    return launch_np_nc<NP, 8, NORM>(args, freqs, ctx);  // beyond 256: tail loop (ROPE only)
}

template <bool NORM> void launch_rope(const RopeArgs & args, const RopeFreqs & freqs, const OpContext & ctx) {
    if (args.items == 0 && args.second.items == 0) return;
    const int half = args.n_rot / 2;
    if (half <= 32) return launch_np<1, NORM>(args, freqs, ctx);
    if (half <= 64) return launch_np<2, NORM>(args, freqs, ctx);
    if (half <= 128) return launch_np<4, NORM>(args, freqs, ctx);
    return launch_np<8, NORM>(args, freqs, ctx);
}

// Validates a ROPE node over `x` (its input, or the fused norm's input of the same shape) and fills
// the rotation part of the arguments and the frequency table.
void setup_rope(const Tensor & t, const Tensor & x, RopeArgs & args, RopeFreqs & freqs) {
    const Tensor & pos = *t.src[1];
    ew::require_f32_rows(x, "ROPE");
    ew::require_f32_rows(t, "ROPE");
    ew::require(ew::same_shape(x, t), "ROPE", "output shape differs from the input");
    ew::require(x.ne[3] == 1, "ROPE", "input must be [head_dim, n_head, n_tokens]");
    ew::require(pos.type == DType::I32 && pos.nb[0] == sizeof(int32_t) && pos.ne[0] == x.ne[2], "ROPE",
                "positions must be contiguous I32 [n_tokens]");
    const int n_rot = t.ip[0];
    ew::require(n_rot > 0 && n_rot % 2 == 0 && n_rot <= x.ne[0], "ROPE", "n_rot must be even and within head_dim");
    ew::require(n_rot / 2 <= kMaxRotHalf, "ROPE", "n_rot above 512 is not supported");
    ew::require(x.ne[0] <= 0x7fffffff && x.ne[1] * x.ne[2] <= 0x7fffffff - kRopeWarps, "ROPE", "too many heads x tokens for one launch");

    freqs = rope_freqs(t.fp[0], n_rot);  // exactly the CPU backend's table

    args.x     = static_cast<const char *>(x.data);
    args.o     = static_cast<char *>(t.data);
    args.pos   = static_cast<const int32_t *>(pos.data);
    args.x_nb1 = int64_t(x.nb[1]);
    args.x_nb2 = int64_t(x.nb[2]);
    args.o_nb1 = int64_t(t.nb[1]);
    args.o_nb2 = int64_t(t.nb[2]);
    args.hd    = int(x.ne[0]);
    args.nh    = int(x.ne[1]);
    args.n_rot = n_rot;
    args.items = int(x.ne[1] * x.ne[2]);
}

}  // namespace

void op_rope(const Tensor & t, const OpContext & ctx) {
    RopeArgs  args;
    RopeFreqs freqs{};
    setup_rope(t, *t.src[0], args, freqs);
    launch_rope<false>(args, freqs, ctx);
}

namespace {

// The arguments of one fused RMS_NORM + ROPE; false when the pair must run as two ops.
bool setup_norm_rope(const Tensor & norm, const Tensor & rope, RopeArgs & args, RopeFreqs & freqs) {
    ew::require(norm.op == Op::RMS_NORM && rope.op == Op::ROPE && rope.src[0] == &norm, "RMS_NORM+ROPE",
                "rope must be the ROPE of the RMS_NORM node");
    const Tensor & x = *norm.src[0];
    ew::require_f32_rows(norm, "RMS_NORM+ROPE");
    ew::require(ew::same_shape(x, norm), "RMS_NORM+ROPE", "norm output shape differs from its input");
    setup_rope(rope, x, args, freqs);  // the rotation reads the norm's input directly
    bool w_aligned = true;             // (scalar weight loads: any alignment)
    args.w         = ew::norm_weight(norm, x.ne[0], w_aligned);
    args.eps       = norm.fp[0];
    args.zc        = norm.ip[0] != 0;
    // One warp holds a whole head: at most 256 copied dims in registers. The output may be placed
    // over the norm's input (dead after the norm): exactly in place is safe (a warp reads its head
    // before it writes it), any other overlap is not. Otherwise (or too wide): the two ops in turn.
    bool in_place = x.data == rope.data;
    for (int d = 1; d < kMaxDims; ++d) in_place = in_place && (x.ne[d] == 1 || x.nb[d] == rope.nb[d]);
    // (A gated norm, rms_norm_gated, or one of rows split over ranks, rms_norm_split, has no fused
    // form: never a per-head q/k norm.)
    return !(norm.src[2] || norm.src[3] || x.ne[0] - rope.ip[0] > kMaxCopyReg || (!in_place && overlaps(rope, x)));
}

}  // namespace

void op_rms_norm_rope(const Tensor & norm, const Tensor & rope, const OpContext & ctx) {
    RopeArgs  args;
    RopeFreqs freqs{};
    if (!setup_norm_rope(norm, rope, args, freqs)) {
        op_rms_norm(norm, ctx);
        op_rope(rope, ctx);
        return;
    }
    launch_rope<true>(args, freqs, ctx);
}

void op_rms_norm_rope_pair(const Tensor & norm_q, const Tensor & rope_q, const Tensor & norm_k, const Tensor & rope_k,
                           const OpContext & ctx) {
    RopeArgs  q, k;
    RopeFreqs fq{}, fk{};
    // One launch when both are fusable and rotate alike (the same positions, rotation, table and
    // norm settings) and the k heads' output overlaps neither q input nor q output (and the other
    // way round).
    const bool both = setup_norm_rope(norm_q, rope_q, q, fq) && setup_norm_rope(norm_k, rope_k, k, fk);
    if (!both || q.pos != k.pos || q.hd != k.hd || q.n_rot != k.n_rot || q.eps != k.eps || q.zc != k.zc ||
        std::memcmp(&fq, &fk, sizeof fq) != 0 || overlaps(rope_k, *norm_q.src[0]) || overlaps(rope_k, rope_q) ||
        overlaps(rope_q, *norm_k.src[0])) {
        op_rms_norm_rope(norm_q, rope_q, ctx);
        op_rms_norm_rope(norm_k, rope_k, ctx);
        return;
    }
    q.second = RopeHeads{k.x, k.o, k.w, k.x_nb1, k.x_nb2, k.o_nb1, k.o_nb2, k.nh, k.items};
    launch_rope<true>(q, fq, ctx);
}

namespace {

// The arguments of one RMS_NORM of whole rows whose output, reshaped into heads, only the ROPE
// `rope` reads; false when the pair must run as two ops (RopeArgs::x is then the norm's input).
bool setup_whole_norm_rope(const Tensor & norm, const Tensor & rope, RopeArgs & args, RopeFreqs & freqs) {
    const Tensor * heads = rope.src[0];
    ew::require(norm.op == Op::RMS_NORM && rope.op == Op::ROPE && heads && heads->op == Op::VIEW && heads->src[0] == &norm,
                "RMS_NORM+ROPE", "rope must be the ROPE of a view of the RMS_NORM node");
    const Tensor & x = *norm.src[0];
    ew::require_f32_rows(norm, "RMS_NORM+ROPE");
    ew::require_f32_rows(x, "RMS_NORM+ROPE");
    ew::require(ew::same_shape(x, norm), "RMS_NORM+ROPE", "norm output shape differs from its input");
    setup_rope(rope, *heads, args, freqs);
    // The view must be the norm's rows cut into heads: [hd, nh, T] over [hd * nh, T], both contiguous.
    const bool reshaped = heads->view_offs == 0 && norm.is_contiguous() && heads->is_contiguous() && x.ne[0] == heads->ne[0] * heads->ne[1] &&
                          x.nrows() == heads->ne[2];
    if (!reshaped || norm.src[2] || norm.src[3] || x.nb[0] != 4) return false;
    args.x         = static_cast<const char *>(x.data);
    args.x_nb1     = int64_t(args.hd) * 4;
    args.x_nb2     = int64_t(x.nb[1]);
    bool w_aligned = true;
    args.w         = ew::norm_weight(norm, x.ne[0], w_aligned);
    args.eps       = norm.fp[0];
    args.zc        = norm.ip[0] != 0;
    // The kernel's register budget (kRowHeads heads of at most 64 rotation pairs and 64 copied dims
    // per warp), and the output either exactly in place or apart from the input.
    const bool in_place = x.data == rope.data && x.nb[1] == rope.nb[2];
    return args.nh <= kRowWarps * kRowHeads && args.n_rot <= 256 && args.hd - args.n_rot <= 64 && (in_place || !overlaps(rope, x));
}

template <int NP, int NC> void launch_row_norm(const RopeArgs & args, const RopeFreqs & freqs, const OpContext & ctx) {
    const unsigned blocks = unsigned(int64_t(args.items) + args.second.items);
    launch(ew::rope_row_norm_kernel<NP, NC>, blocks, 32 * kRowWarps, 0, ctx.stream, args, freqs);
    SPARK_CUDA_CHECK_LAUNCH();
}

}  // namespace

void op_whole_norm_rope_pair(const Tensor & norm_q, const Tensor & rope_q, const Tensor * norm_k, const Tensor * rope_k,
                             const OpContext & ctx) {
    RopeArgs  q, k;
    RopeFreqs fq{}, fk{};
    bool      fused = setup_whole_norm_rope(norm_q, rope_q, q, fq);
    if (norm_k)
        fused = fused && setup_whole_norm_rope(*norm_k, *rope_k, k, fk) && q.pos == k.pos && q.hd == k.hd && q.n_rot == k.n_rot &&
                q.eps == k.eps && q.zc == k.zc && std::memcmp(&fq, &fk, sizeof fq) == 0 && !overlaps(*rope_k, *norm_q.src[0]) &&
                !overlaps(*rope_k, rope_q) && !overlaps(rope_q, *norm_k->src[0]);
    if (!fused) {  // the nodes in their order
        op_rms_norm(norm_q, ctx);
        op_rope(rope_q, ctx);
        if (norm_k) {
            op_rms_norm(*norm_k, ctx);
            op_rope(*rope_k, ctx);
        }
        return;
    }
    // (items: tokens here; nh the heads of a token's row)
    q.items = int(rope_q.ne[2]);
    if (norm_k) q.second = RopeHeads{k.x, k.o, k.w, k.x_nb1, k.x_nb2, k.o_nb1, k.o_nb2, k.nh, int(rope_k->ne[2])};
    if (q.items == 0) return;
    const int half = q.n_rot / 2, copy = q.hd - q.n_rot;
    if (half <= 32) return copy == 0 ? launch_row_norm<1, 0>(q, fq, ctx) : launch_row_norm<1, 2>(q, fq, ctx);
    if (half <= 64) return copy == 0 ? launch_row_norm<2, 0>(q, fq, ctx) : launch_row_norm<2, 2>(q, fq, ctx);
    return copy == 0 ? launch_row_norm<4, 0>(q, fq, ctx) : launch_row_norm<4, 2>(q, fq, ctx);
}

}  // namespace spark::cuda
