// Kernel of ROPE and of the fused per-head RMS_NORM + ROPE; launched by rope.cu, also compiled by
// the CPU warp emulator test (dev/kernels/elementwise/emu_test.cpp). See rope.cu.
#pragma once

#include "backends/cuda/common/pdl.cuh"
#include "backends/cuda/elementwise/ew_common.cuh"

namespace spark::cuda::ew {

constexpr int kMaxRotHalf = 256;  // n_rot <= 512
constexpr int kRopeWarps  = 4;    // (token, head) items per block
constexpr int kMaxCopyReg = 256;  // copied dims held in registers (8 per lane); more: a tail loop

struct RopeFreqs {
    float inv_freq[kMaxRotHalf];
};

// A second set of heads rotated by the same launch (the k heads of a fused q/k pair: same tokens,
// positions, head size, rotation and norm settings; its own tensors and norm weight).
struct RopeHeads {
    const char *  x = nullptr;
    char *        o = nullptr;
    const float * w = nullptr;
    int64_t       x_nb1 = 0, x_nb2 = 0, o_nb1 = 0, o_nb2 = 0;
    int           nh = 0, items = 0;  // items = 0: none
};

struct RopeArgs {
    const char *    x   = nullptr;  // ROPE input, or the RMS_NORM input when fused
    char *          o   = nullptr;  // ROPE output
    const int32_t * pos = nullptr;
    int64_t         x_nb1 = 0, x_nb2 = 0, o_nb1 = 0, o_nb2 = 0;
    int             hd = 0, nh = 0, n_rot = 0, items = 0;  // items = n_tok * nh
    // fused norm
    const float * w   = nullptr;
    float         eps = 0.0f;
    bool          zc  = false;
    RopeHeads     second;  // items [items, items + second.items) of the launch
};

// NP: rotation pairs per lane (ceil(n_rot / 64), power of two); NC: copied dims per lane held in
// registers (0, 2 or 8); NORM: RMS-normalise the head first.
template <int NP, int NC, bool NORM> __global__ void __launch_bounds__(32 * kRopeWarps) rope_kernel(const RopeArgs a, const RopeFreqs f) {
    pdl::launch_dependents();
    pdl::wait();
    const int       lane   = int(threadIdx.x & 31);
    int             item   = int(blockIdx.x) * kRopeWarps + int(threadIdx.x >> 5);
    const bool      second = item >= a.items;
    const RopeHeads s      = second ? a.second : RopeHeads{a.x, a.o, a.w, a.x_nb1, a.x_nb2, a.o_nb1, a.o_nb2, a.nh, a.items};
    if (second) item -= a.items;
    if (item >= s.items) return;  // whole warps
    const int     tok  = item / s.nh;
    const int     h    = item - tok * s.nh;
    const int     half = a.n_rot >> 1;
    const float * x    = reinterpret_cast<const float *>(s.x + h * s.x_nb1 + tok * s.x_nb2);
    float *       o    = reinterpret_cast<float *>(s.o + h * s.o_nb1 + tok * s.o_nb2);

    // ---- every load first
    const int32_t pi = __ldg(a.pos + tok);
    float         w0[NP], w1[NP], wc[NC > 0 ? NC : 1];
    if (NORM && s.w) {
#pragma unroll
        for (int k = 0; k < NP; ++k) {
            const int j = lane + 32 * k;
            if (j < half) {
                w0[k] = ldg(s.w + j);
                w1[k] = ldg(s.w + j + half);
            }
        }
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const int i = a.n_rot + lane + 32 * c;
            if (i < a.hd) wc[c] = ldg(s.w + i);
        }
    }
    float x0[NP], x1[NP], xc[NC > 0 ? NC : 1];
#pragma unroll
    for (int k = 0; k < NP; ++k) {
        const int j = lane + 32 * k;
        x0[k]       = j < half ? x[j] : 0.0f;
        x1[k]       = j < half ? x[j + half] : 0.0f;
    }
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        const int i = a.n_rot + lane + 32 * c;
        xc[c]       = i < a.hd ? x[i] : 0.0f;
    }

    // ---- angles (need only the position)
    const float p = float(pi);
    float       sn[NP], cs[NP];
#pragma unroll
    for (int k = 0; k < NP; ++k) {
        const int j = lane + 32 * k;
        if (j < half) sincosf(__fmul_rn(p, f.inv_freq[j]), &sn[k], &cs[k]);
    }

    // ---- fused RMS norm of the whole head
    if constexpr (NORM) {
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < NP; ++k) ss += x0[k] * x0[k] + x1[k] * x1[k];
#pragma unroll
        for (int c = 0; c < NC; ++c) ss += xc[c] * xc[c];
        ss              = warp_sum(ss);
        const float inv = 1.0f / sqrtf(ss / float(a.hd) + a.eps);
        const bool  hw  = s.w != nullptr;
        const bool  zc  = a.zc;
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
            xc[c] = xc[c] * inv;
            if (hw) xc[c] = xc[c] * (zc ? 1.0f + wc[c] : wc[c]);
        }
    }

    // ---- rotate (CPU order: o[j] = x0 c - x1 s, o[j + half] = x1 c + x0 s) and copy
#pragma unroll
    for (int k = 0; k < NP; ++k) {
        const int j = lane + 32 * k;
        if (j < half) {
            o[j]        = __fsub_rn(__fmul_rn(x0[k], cs[k]), __fmul_rn(x1[k], sn[k]));
            o[j + half] = __fadd_rn(__fmul_rn(x1[k], cs[k]), __fmul_rn(x0[k], sn[k]));
        }
    }
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        const int i = a.n_rot + lane + 32 * c;
        if (i < a.hd) o[i] = xc[c];
    }
    if constexpr (!NORM) {  // copied dims beyond the registers (head_dim - n_rot > 256; no model does)
        for (int i = a.n_rot + 32 * NC + lane; i < a.hd; i += 32) o[i] = x[i];
    }
}

}  // namespace spark::cuda::ew
