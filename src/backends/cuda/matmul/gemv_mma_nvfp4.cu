// MMA decode GEMV instantiations for nvfp4 weights (one format per file: the 6-target build compiles
// them in parallel).
#include "backends/cuda/matmul/gemv_mma_kernels.cuh"

namespace spark::cuda::mm {

void gemv_mma_launch_nvfp4(int r_tmpl, bool glu, const GemvArgs & a, dim3 grid, int smem, cudaStream_t s) {
    gemv_mma_launch<MmaNvfp4>(r_tmpl, glu, a, grid, smem, s);
}

}  // namespace spark::cuda::mm
