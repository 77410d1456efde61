// Decode GEMV instantiations for int4 weights (kept one format per file so the 6-target build
// compiles them in parallel).
#include "backends/cuda/matmul/gemv_kernels.cuh"

namespace spark::cuda::mm {

void gemv_launch_int4(int r_tmpl, bool glu, const GemvArgs & a, dim3 grid, cudaStream_t s) {
    // Zero points only where some weight has them: the symmetric decoder subtracts immediates.
    if (a.int4_zeros)
        gemv_launch<GvInt4<true>>(r_tmpl, glu, a, grid, s);
    else
        gemv_launch<GvInt4<false>>(r_tmpl, glu, a, grid, s);
}

}  // namespace spark::cuda::mm
