// The append kernel of the prefill path: this step's k, v (f32) rounded to f16 (f16_saturate, then
// RNE: the conversion the fused decode kernel uses too) into the paged cache. Included by
// attention_decode.cu only (one definition) and by the CPU warp emulator.
#pragma once

#include "backends/cuda/attention/attention.h"
#include "backends/cuda/attention/attention_kernels.cuh"
#include "backends/cuda/common/pdl.cuh"
#include "backends/cuda/common/ptx_sm80.cuh"

#include <cmath>
#include <cstdint>

namespace spark::cuda::attn {

// ---------------------------------------------------------------------------------------------
// Append this step's k, v to the cache. grid (T), block kThreads. Tokens with an invalid slot, position or page store nothing.
// ---------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads) attn_append_kernel(const AttnParams p) {
    pdl::launch_dependents();
    pdl::wait();
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
