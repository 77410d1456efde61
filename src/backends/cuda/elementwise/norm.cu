// Row norms: RMS_NORM (plain weight or zero-centred 1 + w; gated by silu(gate) when it has one; of
// rows split over ranks when it has their sums of squares, src3), L2_NORM, and the fused residual
// add + RMS_NORM (the sum is written to the ADD node's output, the norm to the RMS_NORM node's); and
// SUM_SQR (a split RMS_NORM's part of the sums: the same row groups, one float out per row).
//
// A row is handled by a group of G threads: one warp for rows up to 1024 floats (4 rows per block:
// per-head q/k norms, hidden-size norms at prefill), a whole block of 256 threads for rows up to
// 8192 floats and 512 threads up to 16384 (hidden-size norms, one row per block).
//
// Latency at one token is what matters here (a few rows, nothing to hide a memory round trip
// behind), so the row is loaded ONCE into registers: every load of the row, the other addend and the
// weight is issued up front (NIT float4 per thread, unrolled and predicated), then the sum of squares
// (float32, per thread then tree; the block step is one barrier), then the normalised row is written
// from registers with the CPU backend's operation order. One dependent memory round trip, one
// barrier. (A loop of load-then-store iterations, as before, serialises one round trip per iteration:
// the compiler cannot hoist the next load above a store that may alias it.)
// Rows that do not fit (misaligned views, rows over 16384 floats) take the streaming two-pass kernel.
#include "backends/cuda/elementwise/norm_kernels.cuh"

#include <type_traits>

namespace spark::cuda {

namespace {

using ew::NormArgs;
using ew::Rows;

template <int G, int NIT, bool ADD, bool GATE> void go_reg(const NormArgs & args, const OpContext & ctx) {
    const int64_t rows_per_block = G == 32 ? 4 : 1;
    const int64_t blocks         = ceil_div(args.nrows, rows_per_block);
    if (blocks > 0x7fffffff) fail(SPARK_ERR_UNSUPPORTED, "cuda norm: too many rows (%lld)", (long long) args.nrows);
    launch(ew::norm_reg_kernel<G, NIT, ADD, GATE>, unsigned(blocks), G == 32 ? 128 : G, 0, ctx.stream, args);
    SPARK_CUDA_CHECK_LAUNCH();
}

template <int G, int V, bool ADD, bool GATE> void go_stream(const NormArgs & args, const OpContext & ctx) {
    const int     threads        = G == 32 ? 128 : G;
    const int64_t rows_per_block = G == 32 ? threads / 32 : 1;
    const int64_t blocks         = ceil_div(args.nrows, rows_per_block);
    if (blocks > 0x7fffffff) fail(SPARK_ERR_UNSUPPORTED, "cuda norm: too many rows (%lld)", (long long) args.nrows);
    launch(ew::norm_stream_kernel<G, V, ADD, GATE>, unsigned(blocks), threads, 0, ctx.stream, args);
    SPARK_CUDA_CHECK_LAUNCH();
}

template <bool ADD, bool GATE = false> void launch_norm(const NormArgs & args, bool vec, const OpContext & ctx) {
    if (args.nrows == 0 || args.n == 0) return;
    const int64_t n = args.n;
    if (vec) {
        // float4 per thread per iteration; NIT rounded up to a power of two (predicated tail).
        if (n <= 128) return go_reg<32, 1, ADD, GATE>(args, ctx);
        if (n <= 256) return go_reg<32, 2, ADD, GATE>(args, ctx);
        if (n <= 512) return go_reg<32, 4, ADD, GATE>(args, ctx);
        if (n <= 1024) return go_reg<32, 8, ADD, GATE>(args, ctx);
        if (n <= 2048) return go_reg<256, 2, ADD, GATE>(args, ctx);
        if (n <= 4096) return go_reg<256, 4, ADD, GATE>(args, ctx);
        if (n <= 8192) return go_reg<256, 8, ADD, GATE>(args, ctx);
        if (n <= 16384) return go_reg<512, 8, ADD, GATE>(args, ctx);
        return go_stream<1024, 4, ADD, GATE>(args, ctx);
    }
    if (n <= 1024) return go_stream<32, 1, ADD, GATE>(args, ctx);
    if (n <= 8192) return go_stream<256, 1, ADD, GATE>(args, ctx);
    return go_stream<1024, 1, ADD, GATE>(args, ctx);
}

template <int G, int V> void go_sum_sqr(const NormArgs & args, const OpContext & ctx) {
    const int     threads        = G == 32 ? 128 : G;
    const int64_t rows_per_block = G == 32 ? threads / 32 : 1;
    const int64_t blocks         = ceil_div(args.nrows, rows_per_block);
    if (blocks > 0x7fffffff) fail(SPARK_ERR_UNSUPPORTED, "cuda sum_sqr: too many rows (%lld)", (long long) args.nrows);
    launch(ew::sum_sqr_kernel<G, V>, unsigned(blocks), threads, 0, ctx.stream, args);
    SPARK_CUDA_CHECK_LAUNCH();
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
    args.w             = ew::norm_weight(t, args.n, w_aligned);
    const bool vec     = w_aligned && ew::vec4_ok(x) && ew::vec4_ok(t);
    if (const Tensor * sums = t.src[3]) {  // rms_norm_split: the rows' sums of squares over every rank
        ew::require_f32_rows(*sums, "RMS_NORM");
        ew::require(sums->ne[0] == 1 && sums->nrows() == x.nrows(), "RMS_NORM", "sums must be [1, rows]");
        ew::require(t.fp[1] > 0.0f, "RMS_NORM", "split row width (fp[1]) must be positive");
        args.sums   = ew::rows_of(*sums);
        args.sums_n = t.fp[1];
    }
    if (const Tensor * gate = t.src[2]) {  // rms_norm_gated: rows of the gate in x's row order
        ew::require_f32_rows(*gate, "RMS_NORM");
        ew::require(gate->ne[0] == x.ne[0] && gate->nrows() == x.nrows(), "RMS_NORM", "gate shape");
        args.gate = ew::rows_of(*gate);
        return launch_norm<false, true>(args, vec && ew::vec4_ok(*gate), ctx);
    }
    launch_norm<false>(args, vec, ctx);
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

void op_sum_sqr(const Tensor & t, const OpContext & ctx) {
    const Tensor & x = *t.src[0];
    ew::require_f32_rows(x, "SUM_SQR");
    ew::require_f32_rows(t, "SUM_SQR");
    ew::require(t.ne[0] == 1 && t.nrows() == x.nrows(), "SUM_SQR", "output must be [1, rows of the input]");
    NormArgs args;
    args.x     = ew::rows_of(x);
    args.out   = ew::rows_of(t);
    args.n     = x.ne[0];
    args.nrows = x.nrows();
    args.scale = t.fp[0];
    if (args.nrows == 0) return;  // (n == 0: every row's sum is 0, written)
    const int64_t n = args.n;
    if (ew::vec4_ok(x)) {
        if (n <= 1024) return go_sum_sqr<32, 4>(args, ctx);
        if (n <= 8192) return go_sum_sqr<256, 4>(args, ctx);
        return go_sum_sqr<1024, 4>(args, ctx);
    }
    if (n <= 1024) return go_sum_sqr<32, 1>(args, ctx);
    if (n <= 8192) return go_sum_sqr<256, 1>(args, ctx);
    go_sum_sqr<1024, 1>(args, ctx);
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
    // The planner may place the norm's output over a or b (both are dead after the ADD node). A
    // row is fully read before any of it is written (across a barrier), so exactly in place (each
    // output row over the same input row: what the planner does when it reuses a's or b's buffer)
    // is safe with any number of rows; a shifted overlap is not with several rows in flight (a
    // block could overwrite a row another block has yet to read): then the two ops run one after
    // the other (the sum never aliases a, b or out). Verify steps of speculative decoding (3-5
    // rows) take the fused kernel.
    auto in_place = [&](const Tensor & x) { return x.data == norm.data && x.nb[1] == norm.nb[1] && x.nrows() == norm.nrows(); };
    const bool shifted = (overlaps(norm, a) && !in_place(a)) || (overlaps(norm, b) && !in_place(b));
    if ((a.nrows() > 1 && shifted) || norm.src[2] || norm.src[3]) {  // (gated or split norms have no fused form)
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
    args.w             = ew::norm_weight(norm, args.n, w_aligned);
    const bool vec = w_aligned && ew::vec4_ok(a) && ew::vec4_ok(b) && ew::vec4_ok(add) && ew::vec4_ok(norm);
    launch_norm<true>(args, vec, ctx);
}

}  // namespace spark::cuda
