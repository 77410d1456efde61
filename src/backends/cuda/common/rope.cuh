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

// One warp's (RMS_NORM +) RoPE of a head, in three steps that callers may interleave over several
// heads (the attention decode kernel issues the loads of all its rows before any arithmetic and
// shares the angles of rows at one position); rope_head runs them in turn.
// Lane l holds the rotation pairs j = l + 32 k (elements j and j + n_rot / 2, k < NP; NP = ceil(n_rot
// / 64), a power of two) and the copied dims n_rot + l + 32 c (c < NC: 0, 2 or 8); lanes past the
// ends hold zeros there.
template <int NP, int NC> struct RopeRegs {
    float x0[NP], x1[NP], xc[NC > 0 ? NC : 1];
};

// The head x (hd floats) into registers.
template <int NP, int NC> __device__ __forceinline__ void rope_load(const float * x, int hd, int n_rot, int lane, RopeRegs<NP, NC> & v) {
    const int half = n_rot >> 1;
#pragma unroll
    for (int k = 0; k < NP; ++k) {
        const int j = lane + 32 * k;
        v.x0[k]     = j < half ? x[j] : 0.0f;
        v.x1[k]     = j < half ? x[j + half] : 0.0f;
    }
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        const int i = n_rot + lane + 32 * c;
        v.xc[c]     = i < hd ? x[i] : 0.0f;
    }
}

// The norm weight w (hd floats, or nullptr) into the same layout.
template <int NP, int NC> __device__ __forceinline__ void rope_load_weight(const float * w, int hd, int n_rot, int lane, RopeRegs<NP, NC> & v) {
    if (!w) return;
    const int half = n_rot >> 1;
#pragma unroll
    for (int k = 0; k < NP; ++k) {
        const int j = lane + 32 * k;
        if (j < half) {
            v.x0[k] = __ldg(w + j);
            v.x1[k] = __ldg(w + j + half);
        }
    }
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        const int i = n_rot + lane + 32 * c;
        if (i < hd) v.xc[c] = __ldg(w + i);
    }
}

// The angles of position pos: the single float product pos * inv_freq[j], sin / cos the precise
// sincosf.
template <int NP> __device__ __forceinline__ void rope_angles(int32_t pos, const RopeFreqs & f, int n_rot, int lane, float (&sn)[NP], float (&cs)[NP]) {
    const int   half = n_rot >> 1;
    const float p    = float(pos);
#pragma unroll
    for (int k = 0; k < NP; ++k) {
        const int j = lane + 32 * k;
        if (j < half) sincosf(__fmul_rn(p, f.inv_freq[j]), &sn[k], &cs[k]);
    }
}

// The sum of squares of the values v holds (per lane, in register order; the caller reduces).
template <int NP, int NC> __device__ __forceinline__ float rope_sum_sqr(const RopeRegs<NP, NC> & v) {
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < NP; ++k) ss += v.x0[k] * v.x0[k] + v.x1[k] * v.x1[k];
#pragma unroll
    for (int c = 0; c < NC; ++c) ss += v.xc[c] * v.xc[c];
    return ss;
}

// The RMS_NORM of v given inv = 1 / sqrtf(mean x^2 + eps): y = (x * inv) * w or * (1 + w) with zc
// (hw: a weight w is given).
template <int NP, int NC>
__device__ __forceinline__ void rope_norm_scale(RopeRegs<NP, NC> & v, const RopeRegs<NP, NC> & w, bool hw, bool zc, float inv) {
#pragma unroll
    for (int k = 0; k < NP; ++k) {
        v.x0[k] = v.x0[k] * inv;
        v.x1[k] = v.x1[k] * inv;
        if (hw) {
            v.x0[k] = v.x0[k] * (zc ? 1.0f + w.x0[k] : w.x0[k]);
            v.x1[k] = v.x1[k] * (zc ? 1.0f + w.x1[k] : w.x1[k]);
        }
    }
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        v.xc[c] = v.xc[c] * inv;
        if (hw) v.xc[c] = v.xc[c] * (zc ? 1.0f + w.xc[c] : w.xc[c]);
    }
}

// NORM: RMS-normalise the head first (rope_norm_scale), inv from a float sum of squares (per lane,
// then the warp butterfly). Then the rotation without FMA contraction in the CPU's order (o[j] = x0
// c - x1 s, o[j + half] = x1 c + x0 s): v becomes the output (x0 = o[j], x1 = o[j + half], xc the
// copied dims).
template <int NP, int NC, bool NORM>
__device__ __forceinline__ void rope_apply(RopeRegs<NP, NC> & v, const RopeRegs<NP, NC> & w, bool hw, float eps, bool zc, int hd,
                                           int n_rot, int lane, const float (&sn)[NP], const float (&cs)[NP]) {
    const int half = n_rot >> 1;
    if constexpr (NORM) {
        const float ss = warp_sum(rope_sum_sqr(v));
        rope_norm_scale(v, w, hw, zc, 1.0f / sqrtf(ss / float(hd) + eps));
    }
#pragma unroll
    for (int k = 0; k < NP; ++k) {
        const int   j  = lane + 32 * k;
        const float x0 = v.x0[k], x1 = v.x1[k];
        v.x0[k]        = j < half ? __fsub_rn(__fmul_rn(x0, cs[k]), __fmul_rn(x1, sn[k])) : 0.0f;
        v.x1[k]        = j < half ? __fadd_rn(__fmul_rn(x1, cs[k]), __fmul_rn(x0, sn[k])) : 0.0f;
    }
}

// The three steps for one head x at position pos (the rope kernel): every load issued first.
template <int NP, int NC, bool NORM>
__device__ __forceinline__ void rope_head(const float * x, const float * w, float eps, bool zc, int hd, int n_rot, int32_t pos,
                                          const RopeFreqs & f, int lane, RopeRegs<NP, NC> & v) {
    RopeRegs<NP, NC> wv;
    if (NORM) rope_load_weight(w, hd, n_rot, lane, wv);
    rope_load(x, hd, n_rot, lane, v);
    float sn[NP], cs[NP];
    rope_angles(pos, f, n_rot, lane, sn, cs);
    rope_apply<NP, NC, NORM>(v, wv, NORM && w != nullptr, eps, zc, hd, n_rot, lane, sn, cs);
}

}  // namespace spark::cuda
