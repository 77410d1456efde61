// Kernel of ROPE and of the fused per-head RMS_NORM + ROPE; launched by rope.cu, also compiled by
// the CPU warp emulator test (dev/kernels/elementwise/emu_test.cpp). See rope.cu.
#pragma once

#include "backends/cuda/common/pdl.cuh"
#include "backends/cuda/common/rope.cuh"
#include "backends/cuda/elementwise/ew_common.cuh"

namespace spark::cuda::ew {

constexpr int kRopeWarps  = 4;    // (token, head) items per block
constexpr int kMaxCopyReg = 256;  // copied dims held in registers (8 per lane); more: a tail loop

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

}  // namespace spark::cuda::ew
