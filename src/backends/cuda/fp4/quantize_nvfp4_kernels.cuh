// The NVFP4 activation quantizer kernel (device code; the launcher is quantize_activations_nvfp4 in
// fp4/w4a4.cu, compiled for every target, and the CPU warp emulator runs this header in an sm_120a
// pass: dev/kernels/fp4/emu_w4a4.cpp). One thread per 16-element block (one NVFP4 scale): 4 float4
// loads (or 16 scalar loads where rows are not 16-byte aligned), the block's amax, scale and divisor
// from fp4/nvfp4_act_ref.h, 16 codes stored as one 8-byte word, one scale byte. Adjacent threads
// take adjacent blocks of a row, so loads and stores are coalesced; a grid-stride loop covers what
// the grid does not.
//
// On sm_120a / sm_121a (SPARK_ARCH_FP4_MMA_SYNC) the final f32 -> E2M1 rounding is the hardware
// convert `cvt.rn.satfinite.e2m1x2.f32`; elsewhere it is the software encoder of nvfp4_act_ref.h.
// Both produce the bytes quantize_activations_nvfp4_ref defines.
#pragma once

#include "backends/cuda/common/arch.h"
#include "backends/cuda/common/pdl.cuh"
#include "backends/cuda/common/ptx_sm120.cuh"
#include "backends/cuda/fp4/nvfp4_act_ref.h"

#include <algorithm>
#include <cstdint>

namespace spark::cuda::fp4 {

constexpr int kQuantThreads = 256;

// The launcher's grid for `total` blocks of 16 (one thread each), capped: the kernel loops.
inline int64_t quantize_nvfp4_blocks(int64_t total) { return std::min<int64_t>((total + kQuantThreads - 1) / kQuantThreads, int64_t(1) << 20); }
// Whether the launcher runs the float4 variant: rows 16-byte aligned.
inline bool quantize_nvfp4_vec(const float * x, int64_t row_stride) { return reinterpret_cast<uintptr_t>(x) % 16 == 0 && row_stride % 4 == 0; }

template <bool VEC>
__global__ void __launch_bounds__(kQuantThreads)
    quantize_nvfp4_kernel(const float * __restrict__ x, int64_t rows, int64_t k, int64_t row_stride, float global_scale,
                          uint8_t * __restrict__ codes, uint8_t * __restrict__ scales) {
    pdl::launch_dependents();
    pdl::wait();
    const int64_t per_row = k / kNvfp4Block;
    const int64_t total   = rows * per_row;
    for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += int64_t(gridDim.x) * blockDim.x) {
        const int64_t r  = idx / per_row;
        const int64_t b  = idx - r * per_row;
        const float * xb = x + r * row_stride + b * kNvfp4Block;
        float         v[kNvfp4Block];
        if constexpr (VEC) {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float4 f = reinterpret_cast<const float4 *>(xb)[q];
                v[4 * q + 0]   = f.x;
                v[4 * q + 1]   = f.y;
                v[4 * q + 2]   = f.z;
                v[4 * q + 3]   = f.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < kNvfp4Block; ++i) v[i] = xb[i];
        }
        uint32_t lo, hi;
        uint8_t  scale;
#if SPARK_ARCH_FP4_MMA_SYNC
        {
            scale               = nvfp4_act_scale_code(nvfp4_act_amax(v), global_scale);
            const float divisor = nvfp4_act_divisor(scale, global_scale);
#pragma unroll
            for (int i = 0; i < kNvfp4Block; ++i) v[i] = nvfp4_act_scaled(v[i], divisor);
            lo = ptx::cvt_e2m1x8(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
            hi = ptx::cvt_e2m1x8(v[8], v[9], v[10], v[11], v[12], v[13], v[14], v[15]);
        }
#else
        scale = nvfp4_act_quantize_block(v, global_scale, lo, hi);
#endif
        *reinterpret_cast<uint2 *>(codes + r * (k / 2) + b * (kNvfp4Block / 2)) = make_uint2(lo, hi);
        scales[r * per_row + b]                                                 = scale;
    }
}

}  // namespace spark::cuda::fp4
