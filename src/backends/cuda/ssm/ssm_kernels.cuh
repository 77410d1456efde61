// Kernels of the linear-attention ops (design: ssm.h). Included by ssm.cu and by the CPU warp
// emulator (dev/kernels/attention/emu_test.cpp): plain CUDA built-ins only.
#pragma once

#include "backends/cuda/common/math.cuh"
#include "backends/cuda/common/pdl.cuh"
#include "backends/cuda/ssm/ssm.h"

#include <cmath>
#include <cstdint>

namespace spark::cuda::ssm {

__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }  // torch threshold 20
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

// grid (ceil(C / blockDim.x), n_seqs), block (channels, token lanes).
__global__ void __launch_bounds__(256) conv1d_ssm_kernel(const ConvParams p) {
    const int       c     = blockIdx.x * blockDim.x + threadIdx.x;
    const int32_t * r     = p.ranges + 3 * int64_t(blockIdx.y);
    const int       slot  = r[0], first = r[1], count = r[2];
    const int       K     = p.K, R = p.R;
    const int32_t   pos0  = count > 0 ? p.pos[first] : -1;  // on the device: graph replays bring new positions
    const bool      ok    = slot >= 0 && slot < p.n_slots && count > 0 && pos0 >= 0;  // block-uniform
    const bool      alive = ok && c < p.C;

    // This thread's channel in the ring entry of the state after position `at` (a state: [K-1][C]).
    const int64_t state_size = int64_t(K - 1) * p.C;
    float * const ring       = p.state + (ok ? int64_t(slot) : 0) * R * state_size + (c < p.C ? c : 0);
    auto          entry      = [&](int at) { return ring + int64_t(at % R) * state_size; };

    // Before the wait (ssm.h, "Before the wait"): the taps (weights) and the previous K-1 inputs
    // (the state earlier steps wrote), all indices compile-time: registers. A sequence starting at
    // position 0 has no previous inputs (zeros, whatever the ring holds).
    float wr[kConvMaxK], hist[kConvMaxK - 1];
    float w_last = 0.0f;
#pragma unroll
    for (int j = 0; j < kConvMaxK; ++j) wr[j] = (alive && j < K) ? p.w[int64_t(c) * K + j] : 0.0f;
    const float * prev = alive && pos0 > 0 ? entry(pos0 - 1) : nullptr;
#pragma unroll
    for (int j = 0; j < kConvMaxK - 1; ++j) hist[j] = (prev && j < K - 1) ? __ldcg(prev + int64_t(j) * p.C) : 0.0f;
    if (alive) w_last = p.w[int64_t(c) * K + K - 1];
    pdl::wait();
    pdl::launch_dependents();

    // This thread's channel in the input parts: its first token's address and the token stride.
    const char * xc    = nullptr;
    int64_t      x_tok = 0;
    if (alive) {
        int cc = c;
#pragma unroll
        for (int i = 0; i < kConvMaxParts; ++i) {
            const ConvPart & pt = p.part[i];
            const int        n  = i < p.n_parts ? pt.len * pt.groups : 0;
            if (!xc && cc < n) {
                xc    = pt.x + int64_t(cc / pt.len) * pt.nb1 + int64_t(cc % pt.len) * 4;
                x_tok = pt.nb2;
            }
            if (!xc) cc -= n;
        }
    }

    // Input m of the sequence (m < 0: from the previous state).
    auto input = [&](int m) -> float {
        if (m >= 0) return *reinterpret_cast<const float *>(xc + int64_t(first + m) * x_tok);
        const int idx = K - 1 + m;
        float     v   = 0.0f;
#pragma unroll
        for (int q = 0; q < kConvMaxK - 1; ++q)
            if (q == idx) v = hist[q];
        return v;
    };

    if (alive) {
        for (int i = threadIdx.y; i < count; i += blockDim.y) {
            float acc = w_last * input(i);  // the CPU reference's order: current tap first
#pragma unroll
            for (int j = 0; j < kConvMaxK - 1; ++j)
                if (j < K - 1) acc += wr[j] * input(i - (K - 1) + j);
            reinterpret_cast<float *>(reinterpret_cast<char *>(p.out) + int64_t(first + i) * p.out_nb1)[c] = silu(acc);
        }
    }
    __syncthreads();  // every thread has read the old state of its channel: the ring may be overwritten
    if (alive) {
        // The state after token i (the K-1 inputs up to it) for the last min(count, R) tokens.
        for (int i = max(count - R, 0) + int(threadIdx.y); i < count; i += blockDim.y) {
            float nh[kConvMaxK - 1];
#pragma unroll
            for (int j = 0; j < kConvMaxK - 1; ++j) nh[j] = j < K - 1 ? input(i + 1 - (K - 1) + j) : 0.0f;
            float * dst = entry(pos0 + i);
#pragma unroll
            for (int j = 0; j < kConvMaxK - 1; ++j)
                if (j < K - 1) dst[int64_t(j) * p.C] = nh[j];
        }
    }
}

// grid (n_vh * dv / kGdnCols, n_seqs), block kGdnThreads.
template <int DK> __global__ void __launch_bounds__(kGdnThreads, 4) gated_delta_kernel(const GdnParams p) {
    constexpr int kRows = DK / 8;  // state rows per thread
    __shared__ float k_s[kGdnTok][DK], q_s[kGdnTok][DK], v_s[kGdnTok][kGdnCols], dec_s[kGdnTok], beta_s[kGdnTok];

    const int       ncb  = p.dv / kGdnCols;
    const int       h    = blockIdx.x / ncb, cb = blockIdx.x % ncb;
    const int32_t * rg   = p.ranges + 3 * int64_t(blockIdx.y);
    const int       slot = rg[0], first = rg[1], count = rg[2];
    const int32_t   pos0 = slot >= 0 && slot < p.n_slots && count > 0 ? p.pos[first] : -1;  // (graph replays bring new positions)
    const bool      work = pos0 >= 0;  // block-uniform

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int jl = warp * 4 + (lane & 3);  // column within the block
    const int j  = cb * kGdnCols + jl;     // column of S (value dim)
    const int i0 = lane >> 2;              // rows i0 + 8 r
    const int kh = h / (p.n_vh / p.n_kh);

    // This thread's elements (rows i0 + 8 r of column j of head h) in the ring entry of the state
    // after position `at`. No other thread reads or writes them, so the writes after kept tokens
    // can follow the read without a barrier.
    const int64_t state_size = int64_t(p.n_vh) * DK * p.dv;
    float * const ring       = p.state + int64_t(work ? slot : 0) * p.R * state_size + (int64_t(h) * DK + i0) * p.dv + j;
    auto          entry      = [&](int at) { return ring + int64_t(at % p.R) * state_size; };
    // Before the wait (ssm.h, "Before the wait"): the state earlier steps wrote and the head's
    // parameters, so their trip to DRAM overlaps the kernels before this one.
    float s[kRows];
    if (work && pos0 > 0) {
        const float * prev = entry(pos0 - 1);
#pragma unroll
        for (int r = 0; r < kRows; ++r) s[r] = __ldcg(prev + int64_t(8 * r) * p.dv);
    } else {
#pragma unroll
        for (int r = 0; r < kRows; ++r) s[r] = 0.0f;  // position 0: no previous state, whatever the ring holds
    }
    const float neg_A = work ? -expf(p.A_log[h]) : 0.0f;
    const float dtb   = work ? p.dt_bias[h] : 0.0f;
    pdl::wait();
    pdl::launch_dependents();
    if (!work) return;

    for (int c0 = 0; c0 < count; c0 += kGdnTok) {
        const int nc = min(kGdnTok, count - c0);
        __syncthreads();  // the previous tokens are consumed
        for (int idx = tid; idx < nc * DK; idx += kGdnThreads) {
            const int tt = idx / DK, i = idx % DK, tok = first + c0 + tt;
            k_s[tt][i] = reinterpret_cast<const float *>(p.k + tok * p.k_nb2 + kh * p.k_nb1)[i];
            q_s[tt][i] = reinterpret_cast<const float *>(p.q + tok * p.q_nb2 + kh * p.q_nb1)[i];
        }
        for (int idx = tid; idx < nc * kGdnCols; idx += kGdnThreads) {
            const int tt = idx / kGdnCols, jj = idx % kGdnCols, tok = first + c0 + tt;
            v_s[tt][jj] = reinterpret_cast<const float *>(p.v + tok * p.v_nb2 + h * p.v_nb1)[cb * kGdnCols + jj];
        }
        if (tid < nc) {
            const int   tok = first + c0 + tid;
            const float a   = reinterpret_cast<const float *>(p.a + tok * p.a_nbt + (h / p.a_r) * p.a_nbg)[h % p.a_r];
            const float b   = reinterpret_cast<const float *>(p.b + tok * p.b_nbt + (h / p.b_r) * p.b_nbg)[h % p.b_r];
            dec_s[tid]      = expf(neg_A * softplus_f(a + dtb));
            beta_s[tid]     = sigmoid_f(b);
        }
        __syncthreads();
        if (p.qk_l2norm) {  // one warp per token: the l2_norm op's expression, then q * q_scale
            for (int tt = warp; tt < nc; tt += kGdnThreads / 32) {
                float sk = 0.0f, sq = 0.0f;
#pragma unroll
                for (int i = lane; i < DK; i += 32) {
                    sk += k_s[tt][i] * k_s[tt][i];
                    sq += q_s[tt][i] * q_s[tt][i];
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) {
                    sk += __shfl_xor_sync(0xffffffffu, sk, o);
                    sq += __shfl_xor_sync(0xffffffffu, sq, o);
                }
                const float ik = 1.0f / sqrtf(sk + p.qk_eps), iq = 1.0f / sqrtf(sq + p.qk_eps);
#pragma unroll
                for (int i = lane; i < DK; i += 32) {
                    k_s[tt][i] = k_s[tt][i] * ik;
                    q_s[tt][i] = (q_s[tt][i] * iq) * p.q_scale;
                }
            }
            __syncthreads();
        }
        for (int tt = 0; tt < nc; ++tt) {
            const float decay = dec_s[tt], beta = beta_s[tt];
            float       kr[kRows];
            float       kv = 0.0f;
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                kr[r] = k_s[tt][i0 + 8 * r];
                s[r] *= decay;
                kv += s[r] * kr[r];
            }
            kv += __shfl_xor_sync(0xffffffffu, kv, 4);
            kv += __shfl_xor_sync(0xffffffffu, kv, 8);
            kv += __shfl_xor_sync(0xffffffffu, kv, 16);
            const float delta = (v_s[tt][jl] - kv) * beta;
            float       o     = 0.0f;
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                s[r] += kr[r] * delta;
                o += s[r] * q_s[tt][i0 + 8 * r];
            }
            o += __shfl_xor_sync(0xffffffffu, o, 4);
            o += __shfl_xor_sync(0xffffffffu, o, 8);
            o += __shfl_xor_sync(0xffffffffu, o, 16);
            const int i = c0 + tt;  // token of the sequence
            if (i0 == 0) {
                const int tok = first + i;
                reinterpret_cast<float *>(reinterpret_cast<char *>(p.out) + tok * p.out_nb2 + h * p.out_nb1)[j] = o;
            }
            if (i >= count - p.R) {  // one of the last R tokens: keep the state after it
                float * dst = entry(pos0 + i);
#pragma unroll
                for (int r = 0; r < kRows; ++r) dst[int64_t(8 * r) * p.dv] = s[r];
            }
        }
    }
}

}  // namespace spark::cuda::ssm
