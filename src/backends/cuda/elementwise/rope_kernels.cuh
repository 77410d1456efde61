// Kernel of ROPE and of the fused per-head RMS_NORM + ROPE; launched by rope.cu, also compiled by
// the CPU warp emulator test (dev/kernels/elementwise/emu_test.cpp). See rope.cu.
#pragma once

#include "backends/cuda/common/pdl.cuh"
#include "backends/cuda/common/rope.cuh"
#include "backends/cuda/elementwise/ew_common.cuh"

namespace spark::cuda::ew {

constexpr int kRopeWarps  = 4;    // (token, head) items per block
constexpr int kMaxCopyReg = 256;  // copied dims held in registers (8 per lane); more: a tail loop
// The RMS_NORM of a whole projection + ROPE (rope_row_norm_kernel): a block per (token, set of
// heads), warp w holding heads w, w + kRowWarps, ... (kRowHeads each at most).
constexpr int kRowWarps = 16;
constexpr int kRowHeads = 4;

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

// NP, NC, NORM: rope_head's (common/rope.cuh). One warp per (token, head) item.
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

    RopeRegs<NP, NC> y;
    rope_head<NP, NC, NORM>(x, s.w, a.eps, a.zc, a.hd, a.n_rot, __ldg(a.pos + tok), f, lane, y);
#pragma unroll
    for (int k = 0; k < NP; ++k) {
        const int j = lane + 32 * k;
        if (j < half) {
            o[j]        = y.x0[k];
            o[j + half] = y.x1[k];
        }
    }
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        const int i = a.n_rot + lane + 32 * c;
        if (i < a.hd) o[i] = y.xc[c];
    }
    if constexpr (!NORM) {  // copied dims beyond the registers (head_dim - n_rot > 256; no model does)
        for (int i = a.n_rot + 32 * NC + lane; i < a.hd; i += 32) o[i] = x[i];
    }
}

// The RMS_NORM of each token's whole row of nh heads (MiniMax-M2's q and k norms: the mean is over
// nh * hd values), then the RoPE of every head, in one launch: block b < a.items is token b of the
// first set of heads (a.items = its tokens), the blocks after it the tokens of a.second. The norm
// weights (hd * nh floats) are requested before the PDL wait; a block reads its whole row into
// registers, sums the squares (per lane, the warp butterfly, then the warps in order through shared
// memory), scales, rotates and stores: every read of a row precedes the barrier and every write
// follows it, so the output may be the input exactly (in place).
template <int NP, int NC> __global__ void __launch_bounds__(32 * kRowWarps) rope_row_norm_kernel(const RopeArgs a, const RopeFreqs f) {
    __shared__ float part[kRowWarps];
    pdl::launch_dependents();
    const int       lane   = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
    int             tok    = int(blockIdx.x);
    const bool      second = tok >= a.items;
    const RopeHeads s      = second ? a.second : RopeHeads{a.x, a.o, a.w, a.x_nb1, a.x_nb2, a.o_nb1, a.o_nb2, a.nh, a.items};
    if (second) tok -= a.items;
    const bool hw = s.w != nullptr;
    RopeRegs<NP, NC> v[kRowHeads] = {}, wv[kRowHeads] = {};
#pragma unroll
    for (int i = 0; i < kRowHeads; ++i) {
        const int h = warp + kRowWarps * i;
        if (hw && h < s.nh) rope_load_weight(s.w + int64_t(h) * a.hd, a.hd, a.n_rot, lane, wv[i]);
    }
    pdl::wait();
    const int32_t pos = __ldg(a.pos + tok);
#pragma unroll
    for (int i = 0; i < kRowHeads; ++i) {
        const int h = warp + kRowWarps * i;
        if (h < s.nh) rope_load(reinterpret_cast<const float *>(s.x + h * s.x_nb1 + tok * s.x_nb2), a.hd, a.n_rot, lane, v[i]);
    }
    float sn[NP], cs[NP];
    rope_angles(pos, f, a.n_rot, lane, sn, cs);
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kRowHeads; ++i) ss += rope_sum_sqr(v[i]);
    ss = warp_sum(ss);
    if (lane == 0) part[warp] = ss;
    __syncthreads();
    float row = 0.0f;
#pragma unroll
    for (int w = 0; w < kRowWarps; ++w) row += part[w];
    const float inv = 1.0f / sqrtf(row / float(a.hd * s.nh) + a.eps);
    const int   half = a.n_rot >> 1;
#pragma unroll
    for (int i = 0; i < kRowHeads; ++i) {
        const int h = warp + kRowWarps * i;
        if (h >= s.nh) continue;
        rope_norm_scale(v[i], wv[i], hw, a.zc, inv);
        rope_apply<NP, NC, false>(v[i], wv[i], false, a.eps, a.zc, a.hd, a.n_rot, lane, sn, cs);
        float * o = reinterpret_cast<float *>(s.o + h * s.o_nb1 + tok * s.o_nb2);
#pragma unroll
        for (int k = 0; k < NP; ++k) {
            const int j = lane + 32 * k;
            if (j < half) {
                o[j]        = v[i].x0[k];
                o[j + half] = v[i].x1[k];
            }
        }
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            const int j = a.n_rot + lane + 32 * c;
            if (j < a.hd) o[j] = v[i].xc[c];
        }
    }
}

}  // namespace spark::cuda::ew
