// Small device helpers several kernel families share. Plain CUDA (no inline PTX), so the CPU warp
// emulator (dev/emu) compiles them as they are.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace spark::cuda {

// The sum of v over the 32 lanes of the warp (butterfly: every lane gets the same total, added in
// the same order on every lane).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// silu(x) = x * sigmoid(x), as the CPU backend computes it: x / (1 + e^-x).
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

}  // namespace spark::cuda
