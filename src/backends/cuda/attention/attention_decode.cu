// Append, split-KV decode and combine kernels (attention_kernels.cuh), instantiated for head_dim
// 64, 128 and 256.
#include "backends/cuda/attention/attention_append.cuh"
#include "backends/cuda/attention/attention_kernels.cuh"
#include "backends/cuda/attention/launch_util.h"
#include "backends/cuda/cuda_common.h"

#include <map>
#include <mutex>
#include <utility>

namespace spark::cuda::attn {

namespace {

template <int D> void decode_d(const AttnParams & p, const AttnPlan & plan, cudaStream_t stream) {
    static std::atomic<uint32_t> smem_set{0};
    set_smem_limit_once(reinterpret_cast<const void *>(&attn_decode_kernel<D>), DecodeCfg<D>::kSmem, smem_set);
    attn_decode_kernel<D><<<dim3(plan.grid_x, plan.grid_y, plan.grid_z), kThreads, DecodeCfg<D>::kSmem, stream>>>(p);
    SPARK_CUDA_CHECK_LAUNCH();
    if (plan.n_splits > 1) {
        attn_combine_kernel<D><<<dim3(p.n_head, p.n_tok), D, 0, stream>>>(p);
        SPARK_CUDA_CHECK_LAUNCH();
    }
}

template <int D> int blocks_per_sm_d() {
    static std::atomic<uint32_t> smem_set{0};
    set_smem_limit_once(reinterpret_cast<const void *>(&attn_decode_kernel<D>), DecodeCfg<D>::kSmem, smem_set);
    int n = 0;
    SPARK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attn_decode_kernel<D>, kThreads, DecodeCfg<D>::kSmem));
    return n > 0 ? n : 1;
}

}  // namespace

int decode_blocks_per_sm(int head_dim) {
    static std::mutex         mu;
    static std::map<std::pair<int, int>, int> cache;  // (device, head_dim) -> blocks
    int                       dev = 0;
    SPARK_CUDA_CHECK(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(mu);
    auto                        it = cache.find({dev, head_dim});
    if (it != cache.end()) return it->second;
    int n = 1;
    switch (head_dim) {
        case 64: n = blocks_per_sm_d<64>(); break;
        case 128: n = blocks_per_sm_d<128>(); break;
        case 256: n = blocks_per_sm_d<256>(); break;
        default: fail(SPARK_ERR_UNSUPPORTED, "attention (CUDA): head_dim %d is not supported (64, 128, 256)", head_dim);
    }
    cache[{dev, head_dim}] = n;
    return n;
}

void launch_append(const AttnParams & p, cudaStream_t stream) {
    attn_append_kernel<<<p.n_tok, kThreads, 0, stream>>>(p);
    SPARK_CUDA_CHECK_LAUNCH();
}

void launch_decode(const AttnParams & p, const AttnPlan & plan, cudaStream_t stream) {
    if (plan.n_splits > 1 && (!p.part_o || !p.part_ml)) fail(SPARK_ERR_INTERNAL, "attention decode: no workspace for %d splits", plan.n_splits);
    switch (p.head_dim) {
        case 64: return decode_d<64>(p, plan, stream);
        case 128: return decode_d<128>(p, plan, stream);
        case 256: return decode_d<256>(p, plan, stream);
    }
    fail(SPARK_ERR_UNSUPPORTED, "attention (CUDA): head_dim %d is not supported (64, 128, 256)", p.head_dim);
}

void launch_attention(const AttnParams & p, const AttnPlan & plan, cudaStream_t stream) {
    if (p.n_tok <= 0) return;
    launch_append(p, stream);
    if (plan.path == AttnPath::Decode) launch_decode(p, plan, stream);
    else launch_prefill(p, plan, stream);
}

}  // namespace spark::cuda::attn
