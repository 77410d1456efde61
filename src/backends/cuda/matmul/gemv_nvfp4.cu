// Decode GEMV instantiations for nvfp4 weights (kept one format per file so the 6-target build
// compiles them in parallel).
#include "backends/cuda/matmul/gemv_kernels.cuh"

namespace spark::cuda::mm {

void gemv_launch_nvfp4(int r_tmpl, bool glu, const GemvArgs & a, dim3 grid, cudaStream_t s) {
    gemv_launch<GvNvfp4>(r_tmpl, glu, a, grid, s);
}

}  // namespace spark::cuda::mm
