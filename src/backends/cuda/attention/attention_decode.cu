// Fused decode (append + split-KV decode + in-kernel combine; with or without the fused q / k norm
// + RoPE), the fallback combine kernel and the prefill path's append kernel (attention_kernels.cuh, append_kernels.cuh), instantiated for
// head_dim 64, 128 and 256; the decode launch helpers (arrival counters, programmatic dependent
// launch).
#include "backends/cuda/attention/append_kernels.cuh"
#include "backends/cuda/attention/attention_kernels.cuh"
#include "backends/cuda/common/arch.h"
#include "backends/cuda/common/launch.h"
#include "backends/cuda/cuda_common.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace spark::cuda::attn {

namespace {

bool env_off(const char * name) {
    const char * e = std::getenv(name);
    return e && std::string(e) == "0";
}

// SPARK_ATTN_COMBINE=0: always merge the splits with the separate combine kernel (A/B timing).
bool fused_combine_enabled() {
    static const bool on = !env_off("SPARK_ATTN_COMBINE");
    return on;
}

// SPARK_ATTN_SHORT=0: steps of one token take the long path at every context; =N: the short path
// up to N chunks (A/B timing). Unset: the plan's.
int short_ctx_of(const AttnPlan & plan, int head_dim) {
    static const int chunks = [] {
        const char * e = std::getenv("SPARK_ATTN_SHORT");
        if (!e || !*e) return -1;
        const long n = std::strtol(e, nullptr, 10);
        return n < 0 ? -1 : int(n < 1024 ? n : 1024);  // (1024 chunks: past any context a graph holds)
    }();
    if (plan.short_ctx <= 0 || chunks < 0) return plan.short_ctx;
    return chunks * decode_short_chunk(head_dim);
}

template <int D> void decode_d(const AttnParams & p, const AttnPlan & plan, cudaStream_t stream, const RopeFreqs * freqs) {
    const dim3 grid(plan.grid_x, plan.grid_y, plan.grid_z);
    if (p.norm_rope.on) {
        if (!freqs) fail(SPARK_ERR_INTERNAL, "attention decode: the fused norm + RoPE has no frequency table");
        static SmemLimit smem_set;
        raise_smem_limit(reinterpret_cast<const void *>(&attn_decode_norm_rope_kernel<D>), DecodeCfg<D>::kSmem, smem_set);
        launch(attn_decode_norm_rope_kernel<D>, grid, dim3(kThreads), DecodeCfg<D>::kSmem, stream, p, *freqs);
    } else {
        static SmemLimit smem_set;
        raise_smem_limit(reinterpret_cast<const void *>(&attn_decode_kernel<D>), DecodeCfg<D>::kSmem, smem_set);
        launch(attn_decode_kernel<D>, grid, dim3(kThreads), DecodeCfg<D>::kSmem, stream, p);
    }
    if (plan.n_splits > 1 && !p.counters) launch(attn_combine_kernel<D>, dim3(p.n_head, p.n_tok), dim3(D), 0, stream, p);
}

template <int D> int blocks_per_sm_d() {
    static SmemLimit smem_set;
    raise_smem_limit(reinterpret_cast<const void *>(&attn_decode_kernel<D>), DecodeCfg<D>::kSmem, smem_set);
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

uint32_t * decode_counters(cudaStream_t stream, int64_t count) {
    // 16K columns (row groups x KV heads) is far more than any decode step has (T <= 8).
    constexpr int64_t kCounters = 16384;
    if (count > kCounters) return nullptr;
    static std::mutex                                        mu;
    static std::map<std::pair<int, cudaStream_t>, uint32_t *> buffers;  // (device, stream) -> counters
    int                                                      dev = 0;
    SPARK_CUDA_CHECK(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(mu);
    auto                        it = buffers.find({dev, stream});
    if (it != buffers.end()) return it->second;
    // A stream's first decode step is eager (the backend runs every step shape once before it
    // captures it); a capture that gets here anyway uses the combine kernel.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    SPARK_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) return nullptr;
    // One buffer per (device, stream): two streams may run decode steps at the same time. Kept for
    // the life of the process (captured graphs hold the pointer); a stream handle that is reused
    // finds the counters at 0, as every launch leaves them.
    void * ptr = nullptr;
    SPARK_CUDA_CHECK(cudaMalloc(&ptr, size_t(kCounters) * sizeof(uint32_t)));
    SPARK_CUDA_CHECK(cudaMemsetAsync(ptr, 0, size_t(kCounters) * sizeof(uint32_t), stream));
    buffers[{dev, stream}] = static_cast<uint32_t *>(ptr);
    return static_cast<uint32_t *>(ptr);
}

void launch_append(const AttnParams & p, cudaStream_t stream) {
    launch(attn_append_kernel, p.n_tok, kThreads, 0, stream, p);
    SPARK_CUDA_CHECK_LAUNCH();
}

void launch_decode(const AttnParams & params, const AttnPlan & plan, cudaStream_t stream, const RopeFreqs * freqs) {
    if (plan.n_splits > 1 && (!params.part_o || !params.part_ml))
        fail(SPARK_ERR_INTERNAL, "attention decode: no workspace for %d splits", plan.n_splits);
    AttnParams p = params;
    p.counters   = plan.n_splits > 1 && fused_combine_enabled() ? decode_counters(stream, int64_t(plan.grid_x) * plan.grid_z) : nullptr;
    p.short_ctx  = decode_short_ctx_with(plan, p.counters != nullptr, short_ctx_of(plan, p.head_dim));
    switch (p.head_dim) {
        case 64: return decode_d<64>(p, plan, stream, freqs);
        case 128: return decode_d<128>(p, plan, stream, freqs);
        case 256: return decode_d<256>(p, plan, stream, freqs);
    }
    fail(SPARK_ERR_UNSUPPORTED, "attention (CUDA): head_dim %d is not supported (64, 128, 256)", p.head_dim);
}

void launch_attention(const AttnParams & p, const AttnPlan & plan, cudaStream_t stream, const RopeFreqs * freqs) {
    if (p.n_tok <= 0) return;
    if (plan.path == AttnPath::Decode) {
        launch_decode(p, plan, stream, freqs);  // appends this step's k, v itself
    } else {
        if (p.norm_rope.on) fail(SPARK_ERR_INTERNAL, "attention: the fused norm + RoPE is a decode path");
        launch_append(p, stream);
        launch_prefill(p, plan, stream);
    }
}

}  // namespace spark::cuda::attn
