// ARGMAX: per row, the first index of the maximum -> I32 [rows].
//
// Semantics are the CPU backend's loop (best = 0; best = i when x[i] > x[best]): the first index
// of the largest non-NaN value; NaN entries are never selected, except that a NaN at index 0 makes
// the answer 0 (nothing compares greater than it), and so does a row with only NaNs.
//
// Three launch shapes, each ONE kernel:
//  * rows up to kRowMax floats: one block of 256 threads per row (but see the next case);
//  * vocabulary-wide rows (151936 floats for Qwen3), and rows over 8192 floats when there are at
//    most 256 rows, on sm_90+: a thread block cluster of 8 CTAs x 1024 threads per row, each CTA
//    scanning a contiguous eighth with all of a thread's loads in flight at once; the CTAs' results
//    meet in CTA 0's shared memory (distributed shared memory, one exposed cluster barrier), so no
//    workspace, no second kernel and no grid-wide atomics. 8 SMs pull the 600 KB row out of L2 in
//    parallel (one SM would need ~10K cycles just to ingest it);
//  * long rows before sm_90: the chunked two-kernel path (blocks of kChunk floats, then one warp per
//    row over the chunk results).
// Inside a thread indices are visited in increasing order (ties keep the first); across threads the
// (value, index) candidates are combined with order-preserving integer keys in redux.sync (max of the
// value key, then min of the index among the equal ones: ties to the lower index). -0 is folded to
// +0 first so that the integer order ties them, as float compares do.
#include "backends/cuda/elementwise/argmax_kernels.cuh"

#include <atomic>

namespace spark::cuda {

namespace {

using namespace ew;

template <int V> void launch_cluster(const ArgmaxArgs & args, const OpContext & ctx) {
    launch_kernel_cluster(argmax_cluster_kernel<V>, dim3(kClusterN, unsigned(args.nrows), 1), dim3(kClusterThr, 1, 1), kClusterN, 0,
                          ctx.stream, pdl_enabled(), args);
}

// Whether this build's code for the current device has the cluster kernel's body (compiled for
// sm_90 or newer; a device running an sm_80 cubin gets the empty stub). Cached per device.
bool cluster_kernel_built() {
    static std::atomic<int> cache[64];  // 0 unknown, 1 no, 2 yes
    int                     dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
    int v = cache[dev].load(std::memory_order_relaxed);
    if (v == 0) {
        cudaFuncAttributes attr{};
        v = cudaFuncGetAttributes(&attr, argmax_cluster_kernel<4>) == cudaSuccess && attr.binaryVersion >= 90 ? 2 : 1;
        cache[dev].store(v, std::memory_order_relaxed);
    }
    return v == 2;
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
    const bool vec = ew::vec4_ok(x);
    // A cluster per row for long rows, and for rows over 8192 floats when there are few rows (one
    // block would stream them through one SM); one block per row otherwise.
    const int  cc      = ctx.props ? ctx.props->cc : 0;
    const bool cluster = cc >= 900 && args.nrows <= 65535 && args.n > 8192 && (args.n > kRowMax || args.nrows <= 256) &&
                         cluster_kernel_built();
    if (cluster) {
        if (vec) launch_cluster<4>(args, ctx);
        else launch_cluster<1>(args, ctx);
        return;
    }
    if (args.n <= kRowMax) {
        const unsigned grid = unsigned(std::min<int64_t>(args.nrows, 0x7fffffff));
        if (vec) launch(argmax_row_kernel<4>, grid, kArgmaxThreads, 0, ctx.stream, args);
        else launch(argmax_row_kernel<1>, grid, kArgmaxThreads, 0, ctx.stream, args);
        SPARK_CUDA_CHECK_LAUNCH();
        return;
    }
    args.chunks = ceil_div(args.n, kChunk);
    ew::require(ctx.workspace != nullptr, "ARGMAX", "needs a workspace");
    args.partial = static_cast<Best *>(ctx.workspace->get(size_t(args.nrows * args.chunks) * sizeof(Best)));
    const dim3 grid1(unsigned(args.chunks), unsigned(std::min<int64_t>(args.nrows, 65535)));
    if (vec) launch(argmax_chunks_kernel<4>, grid1, kArgmaxThreads, 0, ctx.stream, args);
    else launch(argmax_chunks_kernel<1>, grid1, kArgmaxThreads, 0, ctx.stream, args);
    SPARK_CUDA_CHECK_LAUNCH();
    constexpr int kRowsPerBlock = 4;
    launch(argmax_rows_kernel, unsigned(ceil_div(args.nrows, kRowsPerBlock)), 32 * kRowsPerBlock, 0, ctx.stream, args);
    SPARK_CUDA_CHECK_LAUNCH();
}

}  // namespace spark::cuda
