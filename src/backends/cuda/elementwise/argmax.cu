// ARGMAX: per row, the first index of the maximum -> I32 [rows]; built for vocabulary-wide rows
// (151936 floats) where one block per row would leave the GPU idle at batch 1.
//
// Pass 1 splits every row into chunks of kChunk floats, one block each (75 blocks for one Qwen3
// row); a block reduces its chunk to (max, first index) with float4 loads, warp shuffles and a
// shared-memory step, and writes the pair to the workspace. Pass 2 (one warp per row) reduces a
// row's chunk results. A row that fits one chunk is finished by pass 1 directly.
//
// Semantics are the CPU backend's loop (best = 0; best = i when x[i] > x[best]): the first index
// of the largest non-NaN value; NaN entries are never selected, except that a NaN at index 0 makes
// the answer 0 (nothing compares greater than it), and so does a row with only NaNs.
#include "backends/cuda/elementwise/ew_common.cuh"

#include <cfloat>

namespace spark::cuda {

namespace {

using ew::Rows;

constexpr int kThreads = 256;
constexpr int kChunk   = 2048;  // floats per pass-1 block: 8 per thread
constexpr int kNone    = 0x7fffffff;

struct Best {
    float   v;
    int32_t i;
};

// a better than b: larger value, or equal value at a lower index. NaN never enters (skipped at
// load), "none" is (-inf, kNone) so that a real -inf at any index still beats it.
__device__ __forceinline__ Best better(Best a, Best b) { return (a.v > b.v || (a.v == b.v && a.i < b.i)) ? a : b; }

__device__ __forceinline__ void offer(Best & b, float v, int64_t i) {
    if (v > b.v || (v == b.v && int32_t(i) < b.i)) b = Best{v, int32_t(i)};  // NaN: both comparisons false
}

__device__ __forceinline__ Best warp_best(Best b) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        Best other;
        other.v = __shfl_xor_sync(0xffffffffu, b.v, o);
        other.i = __shfl_xor_sync(0xffffffffu, b.i, o);
        b       = better(b, other);
    }
    return b;
}

// The CPU's answer for a row whose best non-NaN entry is `b`.
__device__ __forceinline__ int32_t finish(Best b, const float * row) {
    const float x0 = row[0];
    if (x0 != x0 || b.i == kNone) return 0;
    return b.i;
}

struct ArgmaxArgs {
    Rows      x;
    int64_t   n = 0, nrows = 0, chunks = 0;
    Best *    partial = nullptr;  // [nrows][chunks] when chunks > 1
    int32_t * out     = nullptr;  // [nrows]
};

template <int V> __global__ void argmax_chunks_kernel(const ArgmaxArgs args) {
    __shared__ Best warp_results[kThreads / 32];
    const int64_t c   = blockIdx.x;
    const int64_t beg = c * kChunk;
    const int64_t end = min(args.n, beg + kChunk);
    for (int64_t r = blockIdx.y; r < args.nrows; r += gridDim.y) {
        const float * row = reinterpret_cast<const float *>(args.x.row(r));
        Best          b{-INFINITY, kNone};
        // Each thread visits increasing indices, so ties inside a thread keep the first.
        for (int64_t i = beg + int64_t(threadIdx.x) * V; i < end; i += int64_t(kThreads) * V) {
            if constexpr (V == 4) {
                const float4 q = *reinterpret_cast<const float4 *>(row + i);
                offer(b, q.x, i);
                offer(b, q.y, i + 1);
                offer(b, q.z, i + 2);
                offer(b, q.w, i + 3);
            } else {
                offer(b, row[i], i);
            }
        }
        b = warp_best(b);
        if ((threadIdx.x & 31) == 0) warp_results[threadIdx.x >> 5] = b;
        __syncthreads();
        if (threadIdx.x < 32) {
            Best w = threadIdx.x < kThreads / 32 ? warp_results[threadIdx.x] : Best{-INFINITY, kNone};
            w      = warp_best(w);
            if (threadIdx.x == 0) {
                if (args.chunks == 1) args.out[r] = finish(w, row);
                else args.partial[r * args.chunks + c] = w;
            }
        }
        __syncthreads();  // warp_results is reused for the next row
    }
}

// One warp per row over its chunk results.
__global__ void argmax_rows_kernel(const ArgmaxArgs args) {
    const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (r >= args.nrows) return;
    const int lane = threadIdx.x & 31;
    Best      b{-INFINITY, kNone};
    for (int64_t c = lane; c < args.chunks; c += 32) b = better(b, args.partial[r * args.chunks + c]);
    b = warp_best(b);
    if (lane == 0) args.out[r] = finish(b, reinterpret_cast<const float *>(args.x.row(r)));
}

}  // namespace

void op_argmax(const Tensor & t, const OpContext & ctx) {
    const Tensor & x = *t.src[0];
    ew::require_f32_rows(x, "ARGMAX");
    ew::require(t.type == DType::I32 && t.nb[0] == sizeof(int32_t) && t.ne[0] == x.nrows() && t.nrows() == 1, "ARGMAX",
                "output must be contiguous I32 [rows]");
    ew::require(x.ne[0] <= 0x7fffffff, "ARGMAX", "rows longer than 2^31 - 1");
    ArgmaxArgs args;
    args.x     = ew::rows_of(x);
    args.n     = x.ne[0];
    args.nrows = x.nrows();
    args.out   = static_cast<int32_t *>(t.data);
    if (args.nrows == 0) return;
    if (args.n == 0) {  // the CPU answers 0 for an empty row
        SPARK_CUDA_CHECK(cudaMemsetAsync(args.out, 0, size_t(args.nrows) * sizeof(int32_t), ctx.stream));
        return;
    }
    args.chunks = ceil_div(args.n, kChunk);
    ew::require(args.chunks <= 0x7fffffff, "ARGMAX", "row too long");
    if (args.chunks > 1) {
        ew::require(ctx.workspace != nullptr, "ARGMAX", "needs a workspace");
        args.partial = static_cast<Best *>(ctx.workspace->get(size_t(args.nrows * args.chunks) * sizeof(Best)));
    }
    const dim3 grid1(unsigned(args.chunks), unsigned(std::min<int64_t>(args.nrows, 65535)));
    if (ew::vec4_ok(x)) argmax_chunks_kernel<4><<<grid1, kThreads, 0, ctx.stream>>>(args);
    else argmax_chunks_kernel<1><<<grid1, kThreads, 0, ctx.stream>>>(args);
    SPARK_CUDA_CHECK_LAUNCH();
    if (args.chunks > 1) {
        constexpr int kRowsPerBlock = 4;
        argmax_rows_kernel<<<unsigned(ceil_div(args.nrows, kRowsPerBlock)), 32 * kRowsPerBlock, 0, ctx.stream>>>(args);
        SPARK_CUDA_CHECK_LAUNCH();
    }
}

}  // namespace spark::cuda
