// Tiled (flash-attention 2 style) prefill kernel (attention_kernels.cuh), instantiated for head_dim
// 64, 128 and 256.
#include "backends/cuda/attention/attention_kernels.cuh"
#include "backends/cuda/common/launch.h"
#include "backends/cuda/cuda_common.h"

namespace spark::cuda::attn {

namespace {

template <int D> void prefill_d(const AttnParams & p, const AttnPlan & plan, cudaStream_t stream) {
    static SmemLimit smem_set;
    raise_smem_limit(reinterpret_cast<const void *>(&attn_prefill_kernel<D>), PrefillCfg<D>::kSmem, smem_set);
    launch(attn_prefill_kernel<D>, dim3(plan.grid_x, plan.grid_y, 1), kThreads, PrefillCfg<D>::kSmem, stream, p);
    SPARK_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_prefill(const AttnParams & p, const AttnPlan & plan, cudaStream_t stream) {
    switch (p.head_dim) {
        case 64: return prefill_d<64>(p, plan, stream);
        case 128: return prefill_d<128>(p, plan, stream);
        case 256: return prefill_d<256>(p, plan, stream);
    }
    fail(SPARK_ERR_UNSUPPORTED, "attention (CUDA): head_dim %d is not supported (64, 128, 256)", p.head_dim);
}

}  // namespace spark::cuda::attn
