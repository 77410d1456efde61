// W4A4 NVFP4 GEMM for sm_120a / sm_121a (compiled only for those targets, see CMakeLists.txt): the
// launcher of fp4/gemm_w4a4_kernels.cuh (the kernel, its data flow and its launch configurations).
// This file could only be compiled here (no sm_120 GPU); the kernel also runs on the CPU warp
// emulator (dev/kernels/fp4/emu_w4a4.cpp): see docs/SM120.md.
#include "backends/cuda/common/arch.h"
#include "backends/cuda/common/launch.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/fp4/gemm_w4a4_kernels.cuh"
#include "backends/cuda/fp4/w4a4.h"
#include "common/error.h"

#include <atomic>

#if defined(__CUDA_ARCH__) && !SPARK_ARCH_FP4_MMA_SYNC
#error "gemm_w4a4_sm120.cu must be compiled for sm_120a / sm_121a only (arch-specific targets)"
#endif

namespace spark::cuda {

namespace {

using fp4::W4A4Args;

template <class C> constexpr auto kernel_of = fp4::gemm_w4a4_kernel<C::MT, C::NT, C::WARPS_M, C::WARPS_N>;

template <class C> void launch_tiles(const W4A4Args & args, cudaStream_t stream) {
    const int64_t gx = ceil_div(args.n, int64_t(C::kFeatures));
    const int64_t gy = ceil_div(args.rows, int64_t(C::kTokens));
    if (gx > 0x7fffffff || gy > 65535) fail(SPARK_ERR_UNSUPPORTED, "gemm_nvfp4_w4a4: problem too large for one launch");
    launch(kernel_of<C>, dim3(unsigned(gx), unsigned(gy), 1u), C::kThreads, 0, stream, args);
    SPARK_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace fp4_detail {

bool gemm_nvfp4_w4a4_sm120_runs_here() {
    // Asked once per device (the first call of a step runs eagerly, before any graph capture).
    constexpr int            kMaxDevices = 64;
    static std::atomic<int8_t> known[kMaxDevices] = {};  // 0 unknown, 1 yes, 2 no
    int                       dev = 0;
    SPARK_CUDA_CHECK(cudaGetDevice(&dev));
    if (dev >= 0 && dev < kMaxDevices && known[dev].load() != 0) return known[dev].load() == 1;
    cudaFuncAttributes attr{};
    const cudaError_t  err = cudaFuncGetAttributes(&attr, kernel_of<fp4::W4A4Small>);
    if (err != cudaSuccess) cudaGetLastError();  // "no kernel image" is an answer, not a failure
    const bool ok = err == cudaSuccess;
    if (dev >= 0 && dev < kMaxDevices) known[dev].store(ok ? 1 : 2);
    return ok;
}

void gemm_nvfp4_w4a4_sm120(const DeviceWeight & w, const uint8_t * a_codes, const uint8_t * a_scales, float a_global, int64_t rows,
                           float * y, int64_t y_stride, cudaStream_t stream) {
    W4A4Args args;
    args.w_codes  = static_cast<const uint8_t *>(w.data);
    args.w_scales = static_cast<const uint8_t *>(w.scales);
    args.a_codes  = a_codes;
    args.a_scales = a_scales;
    args.y        = y;
    args.n        = w.n;
    args.k        = w.k;
    args.rows     = rows;
    args.y_stride = y_stride;
    args.alpha    = a_global * w.global_scale;
    args.w_tiled  = w.tiled;
    if (rows <= fp4::kW4A4SmallRows) launch_tiles<fp4::W4A4Small>(args, stream);
    else launch_tiles<fp4::W4A4Large>(args, stream);
}

}  // namespace fp4_detail

}  // namespace spark::cuda
