// How the CUDA backend launches its kernels (host side): launch() / launch_kernel() with
// programmatic dependent launch where the device and the step allow it (pdl_enabled, PdlStep:
// launch.cpp; the device half, with the rules every kernel launched this way follows, is pdl.cuh),
// and the dynamic shared-memory opt-in (raise_smem_limit).
#pragma once

#include "backends/cuda/cuda_common.h"

#include <cuda_runtime.h>

#include <atomic>

namespace spark::cuda {

// Whether kernels on the current device are launched with programmatic dependent launch (pdl.cuh):
// sm_90 and newer, unless SPARK_PDL=0 (A/B runs) or the calling thread is inside a PdlStep that
// turned it off.
bool pdl_enabled();

// For the launches of one step on this thread: PDL on or off. Decode and verify steps (a few rows,
// latency-bound kernels) use it; prefill steps do not: their long kernels gained nothing, and
// prefill at depth was measured slower with it (H100, Qwen3-30B-A3B int4 pp512 at depth 8192:
// 9066 -> 8103 tokens/s). The dispatch also turns it off for the launch after a collective (ALL_REDUCE,
// cuda_backend.cpp: no kernel of ours before it to overlap with).
class PdlStep {
public:
    explicit PdlStep(bool on);
    ~PdlStep();
    PdlStep(const PdlStep &)             = delete;
    PdlStep & operator=(const PdlStep &) = delete;

private:
    bool previous_;
};

#if defined(SPARK_STEP_TRACE)
// Trace builds: the launch joins the step trace's list of the step under way (step_trace.h).
void trace_note_launch(const void * kernel, dim3 grid);
#endif

#ifdef __CUDACC__  // (kernel files only: the CPU warp emulator compiles the kernel headers that include this)
// The dynamic shared memory a kernel has been allowed per device so far (one per kernel: a static
// of its launch function).
struct SmemLimit {
    std::atomic<int> bytes[64] = {};  // devices past 64: set at every launch
};

// Raises `kernel`'s dynamic shared-memory limit to at least `bytes` on the current device (above the
// default 48 KB; once per device and larger size). cudaFuncSetAttribute is not a stream operation,
// and the first run of a step shape is eager, so this never happens during graph capture.
inline void raise_smem_limit(const void * kernel, int bytes, SmemLimit & limit) {
    if (bytes <= 48 * 1024) return;
    int dev = 0;
    SPARK_CUDA_CHECK(cudaGetDevice(&dev));
    if (dev < 64 && limit.bytes[dev].load(std::memory_order_acquire) >= bytes) return;
    SPARK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    if (dev < 64) {
        int seen = limit.bytes[dev].load(std::memory_order_relaxed);
        while (seen < bytes && !limit.bytes[dev].compare_exchange_weak(seen, bytes, std::memory_order_release)) {
        }
    }
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization when `pdl`
// (sm_90+): the kernel may start while the previous kernel of the stream finishes, and waits for it
// in-kernel (pdl::wait, pdl.cuh) before it reads that kernel's outputs. Launch errors throw. Every
// kernel launched this way must follow the rules of pdl.cuh.
// cluster_x > 0: thread block clusters of cluster_x blocks along x (sm_90+).
template <class... KernelArgs, class... Args>
void launch_kernel_cluster(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, unsigned cluster_x, size_t smem, cudaStream_t stream,
                           bool pdl, Args &&... args) {
    cudaLaunchAttribute attr[2];
    unsigned            n = 0;
    if (cluster_x > 0) {
        attr[n].id               = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster_x;
        attr[n].val.clusterDim.y = 1;
        attr[n].val.clusterDim.z = 1;
        ++n;
    }
    if (pdl) {
        attr[n].id                                         = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        ++n;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim            = grid;
    cfg.blockDim           = block;
    cfg.dynamicSmemBytes   = smem;
    cfg.stream             = stream;
    cfg.attrs              = n ? attr : nullptr;
    cfg.numAttrs           = n;
#if defined(SPARK_STEP_TRACE)
    trace_note_launch(reinterpret_cast<const void *>(kernel), grid);
#endif
    SPARK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...));
}

template <class... KernelArgs, class... Args>
void launch_kernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                   Args &&... args) {
    launch_kernel_cluster(kernel, grid, block, 0, smem, stream, pdl, static_cast<Args &&>(args)...);
}

// The same with PDL as pdl_enabled() says: how the ops launch their kernels.
template <class... KernelArgs, class... Args>
void launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args &&... args) {
    launch_kernel(kernel, grid, block, smem, stream, pdl_enabled(), static_cast<Args &&>(args)...);
}
#endif

}  // namespace spark::cuda
