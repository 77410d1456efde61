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

// The sum of v over the G threads of a row: the norms' sums of squares (the row norms, and the norm
// prologue of the decode GEMV, which adds in the same order and so gets the same bits). G == 32: a
// warp butterfly. G > 32 (blockDim.x == G, one row per block): warp butterflies, one barrier, then
// every warp folds the per-warp partials itself (no second barrier); `scratch` holds G / 32 floats,
// written once per kernel (a second sum needs scratch of its own).
template <int G> __device__ __forceinline__ float row_sum(float v, float * scratch) {
    v = warp_sum(v);
    if constexpr (G > 32) {
        constexpr int W    = G / 32;
        const int     lane = threadIdx.x & 31;
        if (lane == 0) scratch[threadIdx.x >> 5] = v;
        __syncthreads();
        if constexpr (W <= 8) {
            // W partials, summed in warp order by every thread (broadcast reads).
            v = 0.0f;
#pragma unroll
            for (int i = 0; i < W; ++i) v += scratch[i];
        } else {
            v = warp_sum(lane < W ? scratch[lane] : 0.0f);
        }
    }
    return v;
}

// silu(x) = x * sigmoid(x), as the CPU backend computes it: x / (1 + e^-x).
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

}  // namespace spark::cuda
