// Prefill GEMM instantiations for int4 weights (one format per file: the 6-target build compiles
// them in parallel).
#include "backends/cuda/matmul/gemm_kernels.cuh"

namespace spark::cuda::mm {

void gemm_launch_int4(int mt, bool glu, const GemmArgs & a, dim3 grid, cudaStream_t s) {
    gemm_launch<FmtInt4>(mt, glu, a, grid, s);
}

}  // namespace spark::cuda::mm
