// The append kernel: this step's k, v (f32) rounded to f16 into the paged cache. Included by
// attention_decode.cu only (one definition) and by the CPU warp emulator.
#pragma once

#include "backends/cuda/attention/attention.h"
#include "backends/cuda/attention/ptx.cuh"

#include <cmath>
#include <cstdint>

namespace spark::cuda::attn {

// f32 -> f16 for the cache saturates: |x| > 65504 (f16's largest finite value; RNE would give inf
// from 65520 on) is stored as +-65504. K (RMS-normed) and V (a projection output) are far below
// that in practice; the clamp only keeps one outlier from becoming inf and turning every score and
// output that reads it into NaN. NaN stays NaN (the comparison is false), as in the CPU's cache.
__device__ __forceinline__ float f16_saturate(float x) { return fabsf(x) > 65504.0f ? copysignf(65504.0f, x) : x; }

// ---------------------------------------------------------------------------------------------
// Append this step's k, v to the cache. grid (T), block kThreads. Tokens with an invalid slot, position or page store nothing.
// ---------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads) attn_append_kernel(const AttnParams p) {
    const int t  = blockIdx.x;
    const int s  = p.seq[t];
    const int ps = p.pos[t];
    if (s < 0 || s >= p.n_slots || ps < 0 || ps >= p.max_pages * p.page_size) return;  // invalid: not stored
    const int page = p.block_table[int64_t(s) * p.max_pages + ps / p.page_size];
    if (page < 0 || page >= p.n_pages) return;
    const int     D    = p.head_dim;
    const int     half = D / 2;
    const int64_t row  = (int64_t(page) * p.page_size + ps % p.page_size) * (int64_t(p.n_kv) * D);
    for (int i = threadIdx.x; i < p.n_kv * half; i += blockDim.x) {
        const int     h  = i / half;
        const int     d  = (i % half) * 2;
        const float * kr = reinterpret_cast<const float *>(p.k + t * p.k_nb2 + h * p.k_nb1);
        const float * vr = reinterpret_cast<const float *>(p.v + t * p.v_nb2 + h * p.v_nb1);
        *reinterpret_cast<uint32_t *>(p.k_cache + row + int64_t(h) * D + d) =
            ptx::pack_f16x2(f16_saturate(kr[d]), f16_saturate(kr[d + 1]));
        *reinterpret_cast<uint32_t *>(p.v_cache + row + int64_t(h) * D + d) =
            ptx::pack_f16x2(f16_saturate(vr[d]), f16_saturate(vr[d + 1]));
    }
}

}  // namespace spark::cuda::attn
