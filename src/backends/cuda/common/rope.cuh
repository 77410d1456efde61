// One warp's (RMS_NORM +) RoPE of one head, in registers: the arithmetic of the ROPE kernels
// (elementwise/rope.cu says why it is exactly the CPU backend's) as a building block, so that the
// attention decode kernel can normalise and rotate its q and k rows itself (a fused q/k norm +
// RoPE: attention.h). Plain CUDA: the CPU warp emulator compiles it as it is.
#pragma once

#include "backends/cuda/common/math.cuh"
#include "backends/cuda/common/rope_freqs.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace spark::cuda {

// Head x (hd floats, loaded here); lane l holds on return the rotation pairs j = l + 32 k of the
// output (y0[k] = o[j], y1[k] = o[j + n_rot / 2], j < n_rot / 2) and the copied dims
// n_rot + l + 32 c (yc[c], i < hd); lanes past the ends hold zeros there. NP: rotation pairs per
// lane (ceil(n_rot / 64), a power of two); NC: copied dims per lane (0, 2 or 8); NORM: RMS-normalise
// the head first, y = (x * inv) * w or * (1 + w) with zc (w nullptr: no weight), inv =
// 1 / sqrtf(mean x^2 + eps) from a float sum of squares (per lane, then the warp butterfly). pos: the
// token's position; the angle is the single float product pos * inv_freq[j], sin / cos the precise
// sincosf, and the rotation runs without FMA contraction in the CPU's order (o[j] = x0 c - x1 s,
// o[j + half] = x1 c + x0 s). Every load is issued before the arithmetic.
template <int NP, int NC, bool NORM>
__device__ __forceinline__ void rope_head(const float * x, const float * w, float eps, bool zc, int hd, int n_rot, int32_t pos,
                                          const RopeFreqs & f, int lane, float (&y0)[NP], float (&y1)[NP], float (&yc)[NC > 0 ? NC : 1]) {
    const int half = n_rot >> 1;
    float     w0[NP], w1[NP], wc[NC > 0 ? NC : 1];
    if (NORM && w) {
#pragma unroll
        for (int k = 0; k < NP; ++k) {
            const int j = lane + 32 * k;
            if (j < half) {
                w0[k] = __ldg(w + j);
                w1[k] = __ldg(w + j + half);
            }
        }
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const int i = n_rot + lane + 32 * c;
            if (i < hd) wc[c] = __ldg(w + i);
        }
    }
    float x0[NP], x1[NP];
#pragma unroll
    for (int k = 0; k < NP; ++k) {
        const int j = lane + 32 * k;
        x0[k]       = j < half ? x[j] : 0.0f;
        x1[k]       = j < half ? x[j + half] : 0.0f;
    }
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        const int i = n_rot + lane + 32 * c;
        yc[c]       = i < hd ? x[i] : 0.0f;
    }

    // ---- angles (need only the position)
    const float p = float(pos);
    float       sn[NP], cs[NP];
#pragma unroll
    for (int k = 0; k < NP; ++k) {
        const int j = lane + 32 * k;
        if (j < half) sincosf(__fmul_rn(p, f.inv_freq[j]), &sn[k], &cs[k]);
    }

    // ---- the RMS norm of the whole head
    if constexpr (NORM) {
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < NP; ++k) ss += x0[k] * x0[k] + x1[k] * x1[k];
#pragma unroll
        for (int c = 0; c < NC; ++c) ss += yc[c] * yc[c];
        ss              = warp_sum(ss);
        const float inv = 1.0f / sqrtf(ss / float(hd) + eps);
        const bool  hw  = w != nullptr;
#pragma unroll
        for (int k = 0; k < NP; ++k) {
            x0[k] = x0[k] * inv;
            x1[k] = x1[k] * inv;
            if (hw) {
                x0[k] = x0[k] * (zc ? 1.0f + w0[k] : w0[k]);
                x1[k] = x1[k] * (zc ? 1.0f + w1[k] : w1[k]);
            }
        }
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            yc[c] = yc[c] * inv;
            if (hw) yc[c] = yc[c] * (zc ? 1.0f + wc[c] : wc[c]);
        }
    }

    // ---- rotate
#pragma unroll
    for (int k = 0; k < NP; ++k) {
        const int j = lane + 32 * k;
        y0[k]       = j < half ? __fsub_rn(__fmul_rn(x0[k], cs[k]), __fmul_rn(x1[k], sn[k])) : 0.0f;
        y1[k]       = j < half ? __fadd_rn(__fmul_rn(x1[k], cs[k]), __fmul_rn(x0[k], sn[k])) : 0.0f;
    }
}

}  // namespace spark::cuda
