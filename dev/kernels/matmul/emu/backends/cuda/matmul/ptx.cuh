// Emulator stand-in for src/backends/cuda/matmul/ptx.cuh (found first on the include path of the
// emulator build, dev/kernels/matmul/emu_gemv.cpp): the wrappers the GEMV uses, on plain memory.
#pragma once

#include "../../../emu_matmul.h"
#include "backends/cuda/arch.h"

#include <cmath>

namespace spark::cuda::mm {

__device__ __forceinline__ uint64_t l2_evict_first_policy() { return 0; }

// 16 bytes of weights: must be 16-byte aligned (the real ld.global.v4 faults otherwise).
__device__ __forceinline__ uint4 ld_stream_v4(const void * ptr, uint64_t) {
    if ((reinterpret_cast<uintptr_t>(ptr) & 15u) != 0) emu::die("unaligned 16-byte weight load");
    uint4 v;
    std::memcpy(&v, ptr, 16);
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + std::exp(-g)); }

}  // namespace spark::cuda::mm
