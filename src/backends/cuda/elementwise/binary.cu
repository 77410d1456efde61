// Element-wise ops on rows: ADD, MUL, SWIGLU, MUL_SIGMOID (src1 broadcast as in graph.h: one row for
// all rows, or for MUL_SIGMOID one value per row) and SCALE.
//
// Every value is computed with the CPU backend's exact expression (IEEE division and expf, no
// contraction opportunities), so results differ from the CPU only by expf's last-ulp differences.
#include "backends/cuda/common/pdl.cuh"
#include "backends/cuda/elementwise/ew_common.cuh"

namespace spark::cuda {

namespace {

using ew::Rows;

enum class BinOp : int { ADD, MUL, SWIGLU, MUL_SIGMOID, SCALE };

template <BinOp OP> __device__ __forceinline__ float apply(float x, float y) {
    if constexpr (OP == BinOp::ADD) return x + y;
    if constexpr (OP == BinOp::MUL) return x * y;
    if constexpr (OP == BinOp::SWIGLU) return silu(x) * y;
    if constexpr (OP == BinOp::MUL_SIGMOID) return x * (1.0f / (1.0f + expf(-y)));
    if constexpr (OP == BinOp::SCALE) return x * y;  // y is the scale
    return 0.0f;
}

struct BinArgs {
    Rows    a, b, o;
    int64_t n      = 0;      // row length
    int64_t nrows  = 0;
    int64_t chunks = 0;      // per row: ceil(n / (blockDim * V))
    bool    b_one_row = false;  // src1 has a single row, used for every row
    bool    b_scalar  = false;  // src1 has one value per row (MUL_SIGMOID gate)
    float   scale     = 1.0f;   // SCALE
};

// Blocks stride over (row, chunk) pairs; a thread handles V consecutive elements of its row.
template <BinOp OP, int V> __global__ void binary_kernel(const BinArgs args) {
    pdl::launch_dependents();
    pdl::wait();
    const int64_t items = args.nrows * args.chunks;
    for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
        const int64_t r = item / args.chunks;
        const int64_t c = item - r * args.chunks;
        const int64_t i = (c * blockDim.x + threadIdx.x) * V;
        if (i >= args.n) continue;
        const float * x = reinterpret_cast<const float *>(args.a.row(r)) + i;
        float *       o = reinterpret_cast<float *>(args.o.row(r)) + i;
        float         xv[V], yv[V], ov[V];
        if constexpr (V == 4) {
            const float4 t = *reinterpret_cast<const float4 *>(x);
            xv[0] = t.x, xv[1] = t.y, xv[2] = t.z, xv[3] = t.w;
        } else {
            xv[0] = *x;
        }
        if constexpr (OP == BinOp::SCALE) {
#pragma unroll
            for (int v = 0; v < V; ++v) yv[v] = args.scale;
        } else {
            const float * yrow = reinterpret_cast<const float *>(args.b.row(args.b_one_row ? 0 : r));
            if (args.b_scalar) {
                const float g = yrow[0];
#pragma unroll
                for (int v = 0; v < V; ++v) yv[v] = g;
            } else if constexpr (V == 4) {
                const float4 t = *reinterpret_cast<const float4 *>(yrow + i);
                yv[0] = t.x, yv[1] = t.y, yv[2] = t.z, yv[3] = t.w;
            } else {
                yv[0] = yrow[i];
            }
        }
#pragma unroll
        for (int v = 0; v < V; ++v) ov[v] = apply<OP>(xv[v], yv[v]);
        if constexpr (V == 4) *reinterpret_cast<float4 *>(o) = make_float4(ov[0], ov[1], ov[2], ov[3]);
        else *o = ov[0];
    }
}

template <BinOp OP> void launch_binary(BinArgs & args, bool vec, const OpContext & ctx) {
    constexpr int kThreads = 256;
    if (args.nrows == 0 || args.n == 0) return;
    const int V   = vec ? 4 : 1;
    args.chunks   = ceil_div(args.n, int64_t(kThreads) * V);
    const unsigned grid = ew::grid_for(args.nrows * args.chunks, ctx);
    if (vec) launch(binary_kernel<OP, 4>, grid, kThreads, 0, ctx.stream, args);
    else launch(binary_kernel<OP, 1>, grid, kThreads, 0, ctx.stream, args);
    SPARK_CUDA_CHECK_LAUNCH();
}

}  // namespace

void op_binary(const Tensor & t, const OpContext & ctx) {
    const char * name = op_name(t.op);
    ew::require(t.src[0] && t.src[1], name, "needs two sources");
    const Tensor & a = *t.src[0];
    const Tensor & b = *t.src[1];
    ew::require_f32_rows(a, name);
    ew::require_f32_rows(b, name);
    ew::require_f32_rows(t, name);
    ew::require(ew::same_shape(a, t), name, "output shape differs from src0");
    BinArgs args;
    args.a         = ew::rows_of(a);
    args.b         = ew::rows_of(b);
    args.o         = ew::rows_of(t);
    args.n         = a.ne[0];
    args.nrows     = a.nrows();
    args.b_one_row = b.nrows() == 1;
    args.b_scalar  = t.op == Op::MUL_SIGMOID && b.ne[0] == 1;
    ew::require(b.ne[0] == a.ne[0] || args.b_scalar, name, "src1 row length must match src0 (or be 1 for MUL_SIGMOID)");
    ew::require(args.b_one_row || b.nrows() == a.nrows(), name, "src1 must have one row or as many rows as src0");
    const bool vec = ew::vec4_ok(a) && ew::vec4_ok(t) && (args.b_scalar || ew::vec4_ok(b));
    switch (t.op) {
        case Op::ADD: return launch_binary<BinOp::ADD>(args, vec, ctx);
        case Op::MUL: return launch_binary<BinOp::MUL>(args, vec, ctx);
        case Op::SWIGLU: return launch_binary<BinOp::SWIGLU>(args, vec, ctx);
        case Op::MUL_SIGMOID: return launch_binary<BinOp::MUL_SIGMOID>(args, vec, ctx);
        default: ew::require(false, name, "is not a binary op");
    }
}

void op_scale(const Tensor & t, const OpContext & ctx) {
    const Tensor & a = *t.src[0];
    ew::require_f32_rows(a, "SCALE");
    ew::require_f32_rows(t, "SCALE");
    ew::require(ew::same_shape(a, t), "SCALE", "output shape differs from the source");
    BinArgs args;
    args.a     = ew::rows_of(a);
    args.o     = ew::rows_of(t);
    args.n     = a.ne[0];
    args.nrows = a.nrows();
    args.scale = t.fp[0];
    launch_binary<BinOp::SCALE>(args, ew::vec4_ok(a) && ew::vec4_ok(t), ctx);
}

}  // namespace spark::cuda
