// MMA decode GEMV instantiations for int4 weights (one format per file: the 6-target build compiles
// them in parallel).
#include "backends/cuda/matmul/gemv_mma_kernels.cuh"

namespace spark::cuda::mm {

void gemv_mma_launch_int4(int r_tmpl, bool glu, const GemvArgs & a, dim3 grid, int smem, cudaStream_t s) {
    // Zero points only where some weight has them: the symmetric decoder subtracts immediates.
    if (a.int4_zeros)
        gemv_mma_launch<MmaInt4<true>>(r_tmpl, glu, a, grid, smem, s);
    else
        gemv_mma_launch<MmaInt4<false>>(r_tmpl, glu, a, grid, smem, s);
}

}  // namespace spark::cuda::mm
