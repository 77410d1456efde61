// Host helpers shared by the attention and linear-attention launchers.
#pragma once

#include "backends/cuda/cuda_common.h"

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

namespace spark::cuda {

// Raises a kernel's dynamic shared-memory limit once per device (cudaFuncSetAttribute is not a
// stream operation; the first run of a step shape is eager, so this never happens during capture).
inline void set_smem_limit_once(const void * kernel, int bytes, std::atomic<uint32_t> & done_mask) {
    if (bytes <= 48 * 1024) return;
    int dev = 0;
    SPARK_CUDA_CHECK(cudaGetDevice(&dev));
    const uint32_t bit = dev < 32 ? 1u << dev : 0u;  // devices past 32: set every time
    if (bit && (done_mask.load(std::memory_order_acquire) & bit)) return;
    SPARK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    done_mask.fetch_or(bit, std::memory_order_release);
}

}  // namespace spark::cuda
