// Attention kernels (design: attention.h). Included by attention_decode.cu / attention_prefill.cu
// and by the CPU warp emulator (dev/kernels/attention/emu_test.cpp), so only the wrappers of
// common/ptx_sm80.cuh and plain CUDA built-ins are used here.
#pragma once

#include "backends/cuda/attention/attention.h"
#include "backends/cuda/common/pdl.cuh"
#include "backends/cuda/common/ptx_sm80.cuh"
#include "backends/cuda/common/rope.cuh"
#include "backends/cuda/common/step_trace.cuh"

#include <cmath>
#include <cstdint>

namespace spark::cuda::attn {

// ---------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------

// f32 -> f16 for the cache saturates: |x| > 65504 (f16's largest finite value; RNE would give inf
// from 65520 on) is stored as +-65504. K (RMS-normed) and V (a projection output) are far below
// that in practice; the clamp only keeps one outlier from becoming inf and turning every score and
// output that reads it into NaN. NaN stays NaN (the comparison is false), as in the CPU's cache.
// Used by the append kernel and by the decode kernel's fused append (identical values).
__device__ __forceinline__ float f16_saturate(float x) { return fabsf(x) > 65504.0f ? copysignf(65504.0f, x) : x; }

// The tokens [t_begin, t_end) a block's rows cover, their positions and slots into smem.
__device__ __forceinline__ void load_token_meta(const AttnParams & p, int t_begin, int t_end, int * tok_pos, int * tok_seq) {
    for (int i = threadIdx.x; i < t_end - t_begin; i += blockDim.x) {
        tok_pos[i] = p.pos[t_begin + i];
        tok_seq[i] = p.seq[t_begin + i];
    }
}

// The next run of equal sequence slots starting at token t (block-uniform: reads smem only).
// Returns te (exclusive end) and the run's KV length L (largest position + 1, clamped to the
// cache capacity; 0 for an invalid slot).
__device__ __forceinline__ int next_run(const AttnParams & p, const int * tok_pos, const int * tok_seq, int t_begin,
                                        int t, int t_end, int & L) {
    const int s       = tok_seq[t - t_begin];
    int       max_pos = tok_pos[t - t_begin];
    int       te      = t + 1;
    while (te < t_end && tok_seq[te - t_begin] == s) {
        max_pos = max(max_pos, tok_pos[te - t_begin]);
        ++te;
    }
    const int cap = p.max_pages * p.page_size;
    L             = (s >= 0 && s < p.n_slots) ? min(max_pos + 1, cap) : 0;
    if (L < 0) L = 0;
    return te;
}

// The power-of-two scale of one Q row (attention.h, "f16 range"): amax = the row's largest |x|,
// x = q * scale_log2. Returns s with amax * s in [2^(kQScaleExp-1), 2^kQScaleExp) = [2^14, 2^15):
// f16(x * s) <= 2^15 < 65504 is never inf, single f16 keeps 11 bits of every element down to 2^-28
// of amax, hi + lo ~22 bits down to 2^-17 of amax (absolute error 2^-39 amax below). inv = 1 / s
// exactly. amax = 0 (an empty or padding row) gives s = 2^15. The exponent is clamped to +-120 so
// that s and 1 / s are normal floats (reached only for amax < 2^-105).
__device__ __forceinline__ float q_row_scale(float amax, float & inv) {
    int e = 0;
    frexpf(amax, &e);  // amax in [2^(e-1), 2^e)
    const int sh = min(max(kQScaleExp - e, -120), 120);
    inv          = ldexpf(1.0f, -sh);
    return ldexpf(1.0f, sh);
}

// One row of Q for the prefill kernel (16-row tile row r, token t / head h, or zeros when !valid)
// into shared memory as single f16: x = q * scale_log2 * s (q_row_scale) at row r of q_s. Called by
// all 32 lanes of a warp (warp-uniform arguments); lane 0 stores 1 / s to q_inv[r].
template <int D, int kStr>
__device__ __forceinline__ void load_q_row(const AttnParams & p, bool valid, int t, int h, int r, uint16_t * q_s, float * q_inv,
                                           int lane) {
    constexpr int kPairs = D / 64;  // (d, d + 1) pairs per lane
    const float * qr     = valid ? reinterpret_cast<const float *>(p.q + t * p.q_nb2 + h * p.q_nb1) : nullptr;
    float         x[kPairs][2];
    float         amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
        const int d = 2 * (lane + 32 * j);
        x[j][0]     = valid ? qr[d] * p.scale_log2 : 0.0f;
        x[j][1]     = valid ? qr[d + 1] * p.scale_log2 : 0.0f;
        amax        = fmaxf(amax, fmaxf(fabsf(x[j][0]), fabsf(x[j][1])));
    }
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    float       inv = 1.0f;
    const float sc  = q_row_scale(amax, inv);
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
        const int   d  = 2 * (lane + 32 * j);
        *reinterpret_cast<uint32_t *>(q_s + r * kStr + d) = ptx::pack_f16x2(x[j][0] * sc, x[j][1] * sc);
    }
    if (lane == 0) q_inv[r] = inv;
}

// The decode kernel's Q: N rows in registers (as loaded, or as the fused RMS_NORM + ROPE made them:
// AttnParams::norm_rope; rope_apply's layout: lane l holds dims l + 32 k and l + 32 k + D / 2), each
// x = q * scale_log2 * s (q_row_scale, as load_q_row) split into f16 hi + lo = x - hi, row i to row
// r[i] of q_hi / q_lo; lane 0 stores 1 / s to q_inv[r[i]]. !valid[i]: a zero row. The rows' maxima
// are reduced together, their shuffle chains interleaved (the decode prologue's critical path).
template <int D, int kStr, int N>
__device__ __forceinline__ void store_q_rows(const RopeRegs<D / 64, 0> (&y)[N], const bool (&valid)[N], const int (&r)[N],
                                             float scale_log2, uint16_t * q_hi, uint16_t * q_lo, float * q_inv, int lane) {
    constexpr int NP = D / 64, kHalf = D / 2;
    float         x[N][2][NP];
    float         amax[N];
#pragma unroll
    for (int i = 0; i < N; ++i) {
        amax[i] = 0.0f;
#pragma unroll
        for (int k = 0; k < NP; ++k) {
            x[i][0][k] = valid[i] ? y[i].x0[k] * scale_log2 : 0.0f;
            x[i][1][k] = valid[i] ? y[i].x1[k] * scale_log2 : 0.0f;
            amax[i]    = fmaxf(amax[i], fmaxf(fabsf(x[i][0][k]), fabsf(x[i][1][k])));
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
#pragma unroll
        for (int i = 0; i < N; ++i) amax[i] = fmaxf(amax[i], __shfl_xor_sync(0xffffffffu, amax[i], off));
#pragma unroll
    for (int i = 0; i < N; ++i) {
        float       inv = 1.0f;
        const float sc  = q_row_scale(amax[i], inv);
#pragma unroll
        for (int e = 0; e < 2; ++e)
#pragma unroll
            for (int k = 0; k < NP; ++k) {
                const int   d  = lane + 32 * k + e * kHalf;
                const float v  = x[i][e][k] * sc;
                const float hi = ptx::f16_round(v);
                q_hi[r[i] * kStr + d] = ptx::f16_bits(hi);
                q_lo[r[i] * kStr + d] = ptx::f16_bits(v - hi);
            }
        if (lane == 0) q_inv[r[i]] = inv;
    }
}

// ---------------------------------------------------------------------------------------------
// Decode: split-KV, 16 rows per block, this step's k / v appended on the way, splits combined by the
// column's last block. grid (row groups, n_splits, n_kv), block kThreads. (attention.h, "Decode".)
// ---------------------------------------------------------------------------------------------

// The step token that supplies position ps of sequence s (the last one if several do), or -1.
__device__ __forceinline__ int fresh_token(const int * tok_pos, const int * tok_seq, int n_tok, int s, int ps) {
    int u = -1;
    for (int i = 0; i < n_tok; ++i)
        if (tok_seq[i] == s && tok_pos[i] == ps) u = i;
    return u;
}

// The short path of the decode kernel (attention.h, "Short contexts"): one token, KV length L <=
// AttnParams::short_ctx; block (0, y, kvh) takes query head kvh * group + y. x: warp 0 holds the q
// row, warp 1 this step's k row, warp 2 its v row (rope_apply's layout), w the q (warp 0) or k (warp
// 1) norm weight (NR); s, ps: the token's sequence slot and position.
template <int D, bool NR, class Freqs>
__device__ __forceinline__ void attn_decode_short(const AttnParams & p, const Freqs & f, unsigned char * smem, int L, int s, int ps,
                                                  RopeRegs<D / 64, 0> & x, const RopeRegs<D / 64, 0> & w) {
    using C = DecodeCfg<D>;
    constexpr int kStr = C::kStr, NP = D / 64, kHalf = D / 2, kC = C::kShort, ND = (D + kThreads - 1) / kThreads;
    uint16_t *    ks   = reinterpret_cast<uint16_t *>(smem + C::kOffKV);  // [kC][kStr] f16: the chunk's K rows
    uint16_t *    vs   = ks + kC * kStr;                                  // ... and V rows
    float *       qf   = reinterpret_cast<float *>(smem + C::kOffQhi);   // [D] the q row in the log2 domain
    float *       pf   = reinterpret_cast<float *>(smem + C::kOffPhi);   // [kC] exp2(S - the running maximum)
    float *       red  = reinterpret_cast<float *>(smem + C::kOffRed);   // [4] the warps' maxima, [4] their sums
    const int     tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int     kvh = blockIdx.z, h = kvh * p.group + int(blockIdx.y);
    const int64_t row_elems = int64_t(p.n_kv) * D;
    const int32_t * bt      = p.block_table + int64_t(L > 0 ? s : 0) * p.max_pages;
    const int       fresh   = ps < L ? ps : -1;  // this step's position, unless it is past the cache (L clamped)

    // The earlier positions' K and V rows of the chunk at c0 (thread i: position c0 + i), in one round
    // trip; rows of invalid pages read as zeros (as the long path's tiles).
    auto request = [&](int c0) {
        const int ip = c0 + tid;
        if (tid < kC && ip < L && ip != fresh) {
            const int     page = bt[ip / p.page_size];
            const bool    ok   = page >= 0 && page < p.n_pages;
            const int64_t off  = ok ? (int64_t(page) * p.page_size + ip % p.page_size) * row_elems + int64_t(kvh) * D : 0;
#pragma unroll
            for (int cc = 0; cc < D / 8; ++cc) {
                ptx::cp_async_16(ks + tid * kStr + cc * 8, p.k_cache + off + cc * 8, ok);
                ptx::cp_async_16(vs + tid * kStr + cc * 8, p.v_cache + off + cc * 8, ok);
            }
        }
        ptx::cp_async_commit();
    };
    request(0);
    trace::mark(trace::kSplit);
    pdl::launch_dependents();  // the first rows are requested (as the long path: its first tiles)

    // The rows of this step: q (NR: normalised and rotated) into the log2 domain as f32; k (NR:
    // likewise) and v stay in registers until their chunk, with the page of their position.
    int fresh_page = -1;  // (warps 1 and 2; -1: invalid)
    if (warp < 3) {
        float sn[NP], cs[NP];
        if constexpr (NR) {
            if (warp < 2) {
                rope_angles(ps, f, D, lane, sn, cs);
                const float * wp = warp == 0 ? p.norm_rope.q_w : p.norm_rope.k_w;
                rope_apply<NP, 0, true>(x, w, wp != nullptr, p.norm_rope.eps, p.norm_rope.zc, D, D, lane, sn, cs);
            }
        }
        if (warp == 0) {
#pragma unroll
            for (int k = 0; k < NP; ++k) {
                qf[lane + 32 * k]         = x.x0[k] * p.scale_log2;
                qf[lane + 32 * k + kHalf] = x.x1[k] * p.scale_log2;
            }
        } else if (fresh >= 0) {
            const int page = bt[fresh / p.page_size];
            fresh_page     = page >= 0 && page < p.n_pages ? page : -1;
        }
    }

    // The chunks in order, an online softmax over them (one chunk up to kC positions: no rescaling).
    const int n_chunks = L > kC ? (L + kC - 1) / kC : 1;
    float     m_run = -INFINITY, l_run = 0.0f, o_run[ND];
#pragma unroll
    for (int e = 0; e < ND; ++e) o_run[e] = 0.0f;
    for (int ch = 0; ch < n_chunks; ++ch) {
        const int c0 = ch * kC, Lc = min(L - c0, kC);
        if (ch > 0) request(c0);  // (the barrier that ended the last chunk freed the rows)
        const bool fresh_here = fresh >= c0 && fresh < c0 + kC;
        if (fresh_here && (warp == 1 || warp == 2)) {  // this step's k / v as the cache's f16 (zeros: invalid page)
            uint16_t * row = (warp == 1 ? ks : vs) + (fresh - c0) * kStr;
#pragma unroll
            for (int k = 0; k < NP; ++k) {
                row[lane + 32 * k]         = fresh_page >= 0 ? ptx::f16_bits(f16_saturate(x.x0[k])) : uint16_t(0);
                row[lane + 32 * k + kHalf] = fresh_page >= 0 ? ptx::f16_bits(f16_saturate(x.x1[k])) : uint16_t(0);
            }
        }
        ptx::cp_async_wait<0>();
        __syncthreads();  // the chunk's rows in shared memory

        // This step's k and v to the cache: block 0 of the column, one store per 16 bytes (warp 1's
        // and warp 2's lanes, which hold the page).
        if (fresh_here && fresh_page >= 0 && blockIdx.y == 0 && (warp == 1 || warp == 2) && lane < D / 8) {
            const int64_t  off  = (int64_t(fresh_page) * p.page_size + fresh % p.page_size) * row_elems + int64_t(kvh) * D + lane * 8;
            const uint4    r4   = *reinterpret_cast<const uint4 *>((warp == 2 ? vs : ks) + (fresh - c0) * kStr + lane * 8);
            const uint32_t hw[4] = {r4.x, r4.y, r4.z, r4.w};
            ptx::st_global_16((warp == 2 ? p.v_cache : p.k_cache) + off, hw);
        }

        // Scores (log2 domain): four partial sums per position, added in a fixed order.
        float sc = -INFINITY;
        if (tid < Lc) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int cc = 0; cc < D / 8; ++cc) {
                const uint4    k4    = *reinterpret_cast<const uint4 *>(ks + tid * kStr + cc * 8);
                const float4   qa    = *reinterpret_cast<const float4 *>(qf + cc * 8);
                const float4   qb    = *reinterpret_cast<const float4 *>(qf + cc * 8 + 4);
                const float2   k0 = ptx::unpack_f16x2(k4.x), k1 = ptx::unpack_f16x2(k4.y);
                const float2   k2 = ptx::unpack_f16x2(k4.z), k3 = ptx::unpack_f16x2(k4.w);
                acc[0] = fmaf(qa.y, k0.y, fmaf(qa.x, k0.x, acc[0]));
                acc[1] = fmaf(qa.w, k1.y, fmaf(qa.z, k1.x, acc[1]));
                acc[2] = fmaf(qb.y, k2.y, fmaf(qb.x, k2.x, acc[2]));
                acc[3] = fmaf(qb.w, k3.y, fmaf(qb.z, k3.x, acc[3]));
            }
            sc = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        }
        // The chunk's maximum over the block, then P = exp2(S - M) with M the running maximum.
        float mw = sc;
        for (int off = 16; off > 0; off >>= 1) mw = fmaxf(mw, __shfl_xor_sync(0xffffffffu, mw, off));
        if (lane == 0) red[warp] = mw;
        __syncthreads();
        const float M     = fmaxf(m_run, fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3])));
        const float alpha = m_run == -INFINITY ? 0.0f : exp2f(m_run - M);
        const float pe    = tid < Lc ? exp2f(sc - M) : 0.0f;  // (M > -inf wherever tid < Lc)
        const float lw    = warp_sum(pe);
        if (tid < kC) pf[tid] = pe;
        if (lane == 0) red[4 + warp] = lw;
        __syncthreads();
        l_run = l_run * alpha + ((red[4] + red[5]) + (red[6] + red[7]));
        m_run = M;

        // O = O * alpha + P V: thread d takes dims d, d + 128; eight positions a step, four sums.
#pragma unroll
        for (int e = 0; e < ND; ++e) {
            const int d = tid + kThreads * e;
            if (d >= D) break;
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int i0 = 0; i0 < Lc; i0 += 8) {
                const float4 pa = *reinterpret_cast<const float4 *>(pf + i0);
                const float4 pb = *reinterpret_cast<const float4 *>(pf + i0 + 4);
                const float  pp[8] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const float v = i0 + j < Lc ? ptx::f16_float(vs[(i0 + j) * kStr + d]) : 0.0f;  // (rows past Lc: stale)
                    acc[j & 3]    = fmaf(pp[j], v, acc[j & 3]);
                }
            }
            o_run[e] = o_run[e] * alpha + ((acc[0] + acc[1]) + (acc[2] + acc[3]));
        }
        if (ch + 1 < n_chunks) __syncthreads();  // every thread done with the chunk's rows, pf and red
    }
    float * out = reinterpret_cast<float *>(p.out) + int64_t(h) * D;  // (one token: row 0)
#pragma unroll
    for (int e = 0; e < ND; ++e) {
        const int d = tid + kThreads * e;
        if (d < D) out[d] = l_run > 0.0f ? o_run[e] / l_run : 0.0f;
    }
    trace::mark(trace::kEnd);
}

// The decode kernel's body. NR: the fused q / k norm + RoPE (AttnParams::norm_rope), f its frequency
// table (without NR: unused).
template <int D, bool NR, class Freqs> __device__ __forceinline__ void attn_decode(const AttnParams & p, const Freqs & f) {
    using C = DecodeCfg<D>;
    constexpr int kN = C::kN, kStr = C::kStr, kPStr = C::kPStr, kPW = C::kPW, kDW = C::kDW, kS = C::kStages;
    SPARK_DYNAMIC_SMEM(unsigned char, smem);
    uint16_t * q_hi    = reinterpret_cast<uint16_t *>(smem + C::kOffQhi);
    uint16_t * q_lo    = reinterpret_cast<uint16_t *>(smem + C::kOffQlo);
    uint16_t * kv_s    = reinterpret_cast<uint16_t *>(smem + C::kOffKV);
    uint16_t * p_hi    = reinterpret_cast<uint16_t *>(smem + C::kOffPhi);
    uint16_t * p_lo    = reinterpret_cast<uint16_t *>(smem + C::kOffPlo);
    float *    red_max = reinterpret_cast<float *>(smem + C::kOffRed);
    float *    red_sum = red_max + 4 * 16;
    int *      tok_pos = reinterpret_cast<int *>(smem + C::kOffTok);
    int *      tok_seq = tok_pos + 16;
    float *    q_inv   = reinterpret_cast<float *>(smem + C::kOffQInv);
    int *      flag    = reinterpret_cast<int *>(smem + C::kOffFlag);
    uint16_t * fresh_k = reinterpret_cast<uint16_t *>(smem + C::kOffFresh);   // this step's k rows, f16
    uint16_t * fresh_v = reinterpret_cast<uint16_t *>(smem + C::kOffFreshV);  // ... and v rows

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int split = blockIdx.y, kvh = blockIdx.z;
    const int n_rows  = p.n_tok * p.group;  // rows of this KV head
    const int R0      = blockIdx.x * 16;
    const int t_begin = R0 / p.group;
    const int t_end   = min(p.n_tok, (R0 + 15) / p.group + 1);
    // Without arrival counters (n_splits > 1) every block writes its partials for the combine kernel.
    const bool separate_combine = p.n_splits > 1 && p.counters == nullptr;

    // Programmatic dependent launch: nothing above touched global memory; everything below may read
    // what the previous kernel wrote. The next kernel may launch only once this block's first tiles
    // are requested (below): launched at the start, the next GEMV's blocks issue their weight loads
    // while this kernel's short chain of round trips runs, and every one of those trips (the rows,
    // the page, the tiles) then queues behind them (measured: docs/PERF.md, "The attention decode's
    // prologue").
    pdl::wait();

    // The block's q rows (warp w: rows w, w + 4, w + 8, w + 12) and this step's k and v rows of its
    // KV head (all tokens: a run's fresh positions may come from tokens of other row groups; warp w:
    // tokens w, w + 4) into registers, in rope_apply's layout. Split 0 always has work (it writes a
    // one-split run's output), so it requests them before the token metadata and the two round
    // trips overlap; the other splits once they know they have positions.
    constexpr int   NP = D / 64;
    RopeRegs<NP, 0> qw, kw, qv[4], kv[2], vv[2];
    auto            load_rows = [&]() {
        if constexpr (NR) {
            rope_load_weight(p.norm_rope.q_w, D, D, lane, qw);
            rope_load_weight(p.norm_rope.k_w, D, D, lane, kw);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int R = R0 + warp + 4 * i;
            if (R < n_rows)
                rope_load(reinterpret_cast<const float *>(p.q + (R / p.group) * p.q_nb2 + (kvh * p.group + R % p.group) * p.q_nb1), D, D,
                          lane, qv[i]);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int u = warp + 4 * i;
            if (u >= p.n_tok) continue;
            rope_load(reinterpret_cast<const float *>(p.k + u * p.k_nb2 + kvh * p.k_nb1), D, D, lane, kv[i]);
            rope_load(reinterpret_cast<const float *>(p.v + u * p.v_nb2 + kvh * p.v_nb1), D, D, lane, vv[i]);
        }
    };
    const bool rows_first = split == 0;
    if (rows_first) load_rows();
    // The short path's rows (AttnParams::short_ctx: one token), requested with the metadata: warp 0
    // its query head's q row, warp 1 this step's k row, warp 2 its v row (and the norms' weights).
    const bool      short_block = p.short_ctx > 0 && split < p.group;
    RopeRegs<NP, 0> sx, sw;
    if (short_block && warp < 3) {
        const char * row = warp == 0 ? p.q + (kvh * p.group + split) * p.q_nb1 : warp == 1 ? p.k + kvh * p.k_nb1 : p.v + kvh * p.v_nb1;
        if constexpr (NR) {
            if (warp < 2) rope_load_weight(warp == 0 ? p.norm_rope.q_w : p.norm_rope.k_w, D, D, lane, sw);
        }
        rope_load(reinterpret_cast<const float *>(row), D, D, lane, sx);
    }

    // All of the step's tokens (T <= 8): this step's k / v of a run's sequence may come from tokens
    // of other row groups.
    load_token_meta(p, 0, p.n_tok, tok_pos, tok_seq);
    __syncthreads();
    if (p.short_ctx > 0) {
        int L = 0;
        next_run(p, tok_pos, tok_seq, 0, 0, 1, L);
        if (L <= p.short_ctx) {
            if (short_block) attn_decode_short<D, NR>(p, f, smem, L, tok_seq[0], tok_pos[0], sx, sw);
            return;
        }
    }
    if (split >= p.n_splits) return;  // (the short path's extra blocks)

    // The block's work (block-uniform, and the same in every block of the column): does split
    // `split` have positions in any run, and how many splits the column's last block combines.
    bool has_work   = separate_combine;
    int  n_combined = 0;
    for (int t = t_begin; t < t_end;) {
        int       L     = 0;
        const int te    = next_run(p, tok_pos, tok_seq, 0, t, t_end, L);
        const int n_act = decode_active_splits(L, decode_chunk(L, p.n_splits, kN));
        if (split < n_act) has_work = true;
        if (n_act > 1) n_combined = max(n_combined, n_act);
        t = te;
    }
    if (!has_work) return;  // past every run's length (most splits at short contexts)
    if (!rows_first) load_rows();

    // The first run's first tile's page, requested before the rows' arithmetic below so that the
    // round trip overlaps it (load_tile takes it for that tile).
    int first_page = -1;
    {
        int       L     = 0;
        next_run(p, tok_pos, tok_seq, 0, t_begin, t_end, L);
        const int c0 = split * decode_chunk(L, p.n_splits, kN);
        if (c0 < L) first_page = p.block_table[int64_t(tok_seq[t_begin]) * p.max_pages + c0 / p.page_size];
    }

    // The rows into shared memory: this step's k (NR: normalised and rotated) and v rows as the
    // cache's f16 (saturated, as the append rounds them) for load_tile, and the q rows (NR:
    // normalised and rotated) pre-scaled into the log2 domain and by their power-of-two scales, as
    // f16 hi + lo (store_q_rows). Rows of one token share their angles.
    float sn[NP], cs[NP];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int u = warp + 4 * i;
        if (u >= p.n_tok) continue;  // (warp-uniform)
        if constexpr (NR) {
            rope_angles(tok_pos[u], f, D, lane, sn, cs);
            rope_apply<NP, 0, true>(kv[i], kw, p.norm_rope.k_w != nullptr, p.norm_rope.eps, p.norm_rope.zc, D, D, lane, sn, cs);
        }
#pragma unroll
        for (int k = 0; k < NP; ++k) {
            const int d = lane + 32 * k;
            fresh_k[u * C::kFStr + d]         = ptx::f16_bits(f16_saturate(kv[i].x0[k]));
            fresh_k[u * C::kFStr + d + D / 2] = ptx::f16_bits(f16_saturate(kv[i].x1[k]));
            fresh_v[u * C::kFStr + d]         = ptx::f16_bits(f16_saturate(vv[i].x0[k]));
            fresh_v[u * C::kFStr + d + D / 2] = ptx::f16_bits(f16_saturate(vv[i].x1[k]));
        }
    }
    int  angle_tok = -1;
    bool q_valid[4];
    int  q_row[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        q_row[i]   = warp + 4 * i;
        const int R = R0 + q_row[i];
        q_valid[i] = R < n_rows;
        if constexpr (NR) {
            if (q_valid[i]) {  // (warp-uniform)
                const int t = R / p.group;
                if (t != angle_tok) {
                    rope_angles(tok_pos[t], f, D, lane, sn, cs);
                    angle_tok = t;
                }
                rope_apply<NP, 0, true>(qv[i], qw, p.norm_rope.q_w != nullptr, p.norm_rope.eps, p.norm_rope.zc, D, D, lane, sn, cs);
            }
        }
    }
    store_q_rows<D, kStr>(qv, q_valid, q_row, p.scale_log2, q_hi, q_lo, q_inv, lane);
    __syncthreads();  // the fresh rows for load_tile (q_hi / q_lo are published by the tile loop's first barrier as well)

    // This thread's two rows (mma C layout): g and g + 8.
    int row_tok[2], row_pos[2], row_head[2];
    for (int rr = 0; rr < 2; ++rr) {
        const int R  = R0 + g + 8 * rr;
        row_tok[rr]  = R < n_rows ? R / p.group : -1;
        row_head[rr] = R < n_rows ? kvh * p.group + R % p.group : -1;
        row_pos[rr]  = R < n_rows ? tok_pos[row_tok[rr]] : -1;
    }

    const int64_t row_elems = int64_t(p.n_kv) * D;
    const int64_t all_rows  = int64_t(p.n_tok) * p.n_head;

    for (int t = t_begin; t < t_end;) {
        int       L  = 0;
        const int te = next_run(p, tok_pos, tok_seq, 0, t, t_end, L);
        bool      in_run[2];
        for (int rr = 0; rr < 2; ++rr) in_run[rr] = row_tok[rr] >= t && row_tok[rr] < te;

        // This block's chunk of 0 .. L-1.
        const int chunk   = decode_chunk(L, p.n_splits, kN);
        const int n_act   = decode_active_splits(L, chunk);
        const int c0      = split * chunk;
        const int c1      = min(L, c0 + chunk);
        const int n_tiles = c1 > c0 ? (c1 - c0 + kN - 1) / kN : 0;
        const int s       = tok_seq[t];
        const int32_t * bt = p.block_table + int64_t(L > 0 ? s : 0) * p.max_pages;
        // Positions of this step's tokens of sequence s inside the chunk: [f_lo, f_hi] (empty: f_lo > f_hi).
        int f_lo = c1, f_hi = c0 - 1;
        for (int u = 0; u < p.n_tok; ++u)
            if (tok_seq[u] == s && tok_pos[u] >= c0 && tok_pos[u] < c1) {
                f_lo = min(f_lo, tok_pos[u]);
                f_hi = max(f_hi, tok_pos[u]);
            }

        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
        float o[kDW / 8][4];
        for (int nd = 0; nd < kDW / 8; ++nd)
            for (int e = 0; e < 4; ++e) o[nd][e] = 0.0f;

        // K and V rows of tile `it` into its stage (zero-filled past c1). Rows of this step's tokens
        // come from fresh_k / fresh_v (plain shared stores, visible after the barrier that publishes
        // the tile), and the block that owns the token stores them to the cache too.
        const bool first_run = t == t_begin;
        auto load_tile = [&](int it) {
            uint16_t *    ks      = kv_s + (it % kS) * 2 * kN * kStr;
            uint16_t *    vs      = ks + kN * kStr;
            const int     p0      = c0 + it * kN;
            const int     page    = first_run && it == 0 ? first_page : bt[p0 / p.page_size];
            const bool    page_ok = page >= 0 && page < p.n_pages;
            const bool    fresh   = page_ok && p0 <= f_hi && p0 + kN > f_lo;  // block-uniform
            const int64_t row0    = (int64_t(page_ok ? page : 0) * p.page_size + p0 % p.page_size) * row_elems + int64_t(kvh) * D;
            for (int i = tid; i < kN * (D / 8); i += kThreads) {
                const int     r   = i / (D / 8), cc = i % (D / 8);
                const bool    ok  = page_ok && p0 + r < c1;
                const int64_t off = ok ? row0 + int64_t(r) * row_elems + cc * 8 : 0;
                const int     u   = fresh && ok ? fresh_token(tok_pos, tok_seq, p.n_tok, s, p0 + r) : -1;
                if (u < 0) {
                    ptx::cp_async_16(ks + r * kStr + cc * 8, p.k_cache + off, ok);
                    ptx::cp_async_16(vs + r * kStr + cc * 8, p.v_cache + off, ok);
                    continue;
                }
                const bool writer = u >= t && u < te && (u * p.group) / 16 == int(blockIdx.x);
                const uint4 k4 = *reinterpret_cast<const uint4 *>(fresh_k + u * C::kFStr + cc * 8);
                const uint4 v4 = *reinterpret_cast<const uint4 *>(fresh_v + u * C::kFStr + cc * 8);
                const uint32_t hk[4] = {k4.x, k4.y, k4.z, k4.w}, hv[4] = {v4.x, v4.y, v4.z, v4.w};
                uint32_t * dk = reinterpret_cast<uint32_t *>(ks + r * kStr + cc * 8);
                uint32_t * dv = reinterpret_cast<uint32_t *>(vs + r * kStr + cc * 8);
                for (int j = 0; j < 4; ++j) {
                    dk[j] = hk[j];
                    dv[j] = hv[j];
                }
                if (writer) {
                    ptx::st_global_16(p.k_cache + off, hk);
                    ptx::st_global_16(p.v_cache + off, hv);
                }
            }
        };

        for (int st = 0; st < kS - 1; ++st) {
            if (st < n_tiles) load_tile(st);
            ptx::cp_async_commit();
        }
        trace::mark(trace::kSplit);  // (step trace builds: the prologue done, this run's first tiles requested)
        if (first_run) pdl::launch_dependents();  // (blocks without work exit: that counts too)
        for (int it = 0; it < n_tiles; ++it) {
            ptx::cp_async_wait<kS - 2>();
            __syncthreads();  // tile `it` visible; everyone is done with tile it-1 (its stage is refilled next)
            if (it + kS - 1 < n_tiles) load_tile(it + kS - 1);
            ptx::cp_async_commit();

            const uint16_t * ks = kv_s + (it % kS) * 2 * kN * kStr;
            const uint16_t * vs = ks + kN * kStr;
            const int        p0 = c0 + it * kN;

            // ---- scores S[16 rows][this warp's kPW positions]
            float sc[kPW / 8][4];
            for (int j = 0; j < kPW / 8; ++j)
                for (int e = 0; e < 4; ++e) sc[j][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                uint32_t ah[4], al[4];
                ptx::ldmatrix_x4(ah, q_hi + (lane & 15) * kStr + kk * 16 + (lane >> 4) * 8);
                ptx::ldmatrix_x4(al, q_lo + (lane & 15) * kStr + kk * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int j = 0; j < kPW / 8; ++j) {
                    uint32_t b[2];
                    ptx::ldmatrix_x2(b, ks + (warp * kPW + j * 8 + (lane & 7)) * kStr + kk * 16 + ((lane >> 3) & 1) * 8);
                    ptx::mma_m16n8k16<__half>(sc[j], ah, b[0], b[1]);
                    ptx::mma_m16n8k16<__half>(sc[j], al, b[0], b[1]);
                }
            }
            // ---- undo the Q scales, mask, per-row maximum over the block's kN positions
            const float qi[2] = {q_inv[g], q_inv[g + 8]};
            float       mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int j = 0; j < kPW / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int  rr  = e >> 1;
                    const int  ps  = p0 + warp * kPW + j * 8 + c * 2 + (e & 1);
                    const bool ok  = in_run[rr] && ps < c1 && ps <= row_pos[rr];
                    sc[j][e]       = ok ? sc[j][e] * qi[rr] : -INFINITY;
                    mx[rr]         = fmaxf(mx[rr], sc[j][e]);
                }
            for (int rr = 0; rr < 2; ++rr) {
                mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], 1));
                mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], 2));
            }
            if (c == 0) {
                red_max[warp * 16 + g]     = mx[0];
                red_max[warp * 16 + g + 8] = mx[1];
            }
            __syncthreads();
            float alpha[2], m_use[2];
            for (int rr = 0; rr < 2; ++rr) {
                float tmax = red_max[g + 8 * rr];
                for (int w = 1; w < 4; ++w) tmax = fmaxf(tmax, red_max[w * 16 + g + 8 * rr]);
                const float m_new = fmaxf(m[rr], tmax);
                m_use[rr]         = m_new == -INFINITY ? 0.0f : m_new;  // fully masked so far: p = 0, no NaN
                alpha[rr]         = exp2f(m[rr] - m_use[rr]);
                m[rr]             = m_new;
            }
            // ---- P = exp2(S - m) * kPScale to smem as f16 hi + lo; row sums of this warp's positions
            float sum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int j = 0; j < kPW / 8; ++j) {
                const int col = warp * kPW + j * 8 + c * 2;
#pragma unroll
                for (int rr = 0; rr < 2; ++rr) {
                    const float e0 = exp2f(sc[j][2 * rr] - m_use[rr]) * kPScale;
                    const float e1 = exp2f(sc[j][2 * rr + 1] - m_use[rr]) * kPScale;
                    sum[rr] += e0 + e1;
                    const float h0 = ptx::f16_round(e0), h1 = ptx::f16_round(e1);
                    *reinterpret_cast<uint32_t *>(p_hi + (g + 8 * rr) * kPStr + col) = ptx::pack_f16x2(h0, h1);
                    *reinterpret_cast<uint32_t *>(p_lo + (g + 8 * rr) * kPStr + col) = ptx::pack_f16x2(e0 - h0, e1 - h1);
                }
            }
            for (int rr = 0; rr < 2; ++rr) {
                sum[rr] += __shfl_xor_sync(0xffffffffu, sum[rr], 1);
                sum[rr] += __shfl_xor_sync(0xffffffffu, sum[rr], 2);
            }
            if (c == 0) {
                red_sum[warp * 16 + g]     = sum[0];
                red_sum[warp * 16 + g + 8] = sum[1];
            }
            __syncthreads();
            for (int rr = 0; rr < 2; ++rr) {
                float tsum = 0.0f;
                for (int w = 0; w < 4; ++w) tsum += red_sum[w * 16 + g + 8 * rr];
                l[rr] = l[rr] * alpha[rr] + tsum;
            }
#pragma unroll
            for (int nd = 0; nd < kDW / 8; ++nd) {
                o[nd][0] *= alpha[0];
                o[nd][1] *= alpha[0];
                o[nd][2] *= alpha[1];
                o[nd][3] *= alpha[1];
            }
            // ---- O[16 rows][this warp's kDW dims] += P V
#pragma unroll
            for (int kk = 0; kk < kN / 16; ++kk) {
                uint32_t ah[4], al[4];
                ptx::ldmatrix_x4(ah, p_hi + (lane & 15) * kPStr + kk * 16 + (lane >> 4) * 8);
                ptx::ldmatrix_x4(al, p_lo + (lane & 15) * kPStr + kk * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int np = 0; np < kDW / 16; ++np) {
                    uint32_t b[4];
                    ptx::ldmatrix_x4_trans(b, vs + (kk * 16 + (lane & 15)) * kStr + warp * kDW + np * 16 + (lane >> 4) * 8);
                    ptx::mma_m16n8k16<__half>(o[2 * np], ah, b[0], b[1]);
                    ptx::mma_m16n8k16<__half>(o[2 * np], al, b[0], b[1]);
                    ptx::mma_m16n8k16<__half>(o[2 * np + 1], ah, b[2], b[3]);
                    ptx::mma_m16n8k16<__half>(o[2 * np + 1], al, b[2], b[3]);
                }
            }
        }
        ptx::cp_async_wait<0>();
        __syncthreads();  // smem free for the next run
        trace::mark(trace::kLoop);

        // ---- results of this run's rows: the output itself when split 0 is the only split with
        // positions, else this split's partial state (for the column's last block / the combine kernel)
        const bool direct  = !separate_combine && n_act == 1 && split == 0;
        const bool partial = separate_combine || (n_act > 1 && split < n_act);
        for (int rr = 0; rr < 2; ++rr) {
            if (!in_run[rr]) continue;
            const int dcol = warp * kDW + c * 2;
            if (direct) {
                const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
                float *     out = reinterpret_cast<float *>(reinterpret_cast<char *>(p.out) + row_tok[rr] * p.out_nb1) + int64_t(row_head[rr]) * D;
                for (int nd = 0; nd < kDW / 8; ++nd) {
                    out[dcol + nd * 8]     = o[nd][2 * rr] * inv;
                    out[dcol + nd * 8 + 1] = o[nd][2 * rr + 1] * inv;
                }
            } else if (partial) {
                const int64_t base = int64_t(split) * all_rows + int64_t(row_tok[rr]) * p.n_head + row_head[rr];
                if (warp == 0 && c == 0) {
                    p.part_ml[2 * base]     = m[rr];
                    p.part_ml[2 * base + 1] = l[rr];
                }
                if (n_tiles > 0) {  // empty chunks leave part_o unwritten (the combines skip l == 0)
                    float * po = p.part_o + base * D;
                    for (int nd = 0; nd < kDW / 8; ++nd) {
                        po[dcol + nd * 8]     = o[nd][2 * rr];
                        po[dcol + nd * 8 + 1] = o[nd][2 * rr + 1];
                    }
                }
            }
        }
        t = te;
    }

    // ---- the column's last block merges the splits (in split order: the same result whichever
    // block is last) of every run that has more than one.
    if (separate_combine || n_combined == 0 || split >= n_combined) return trace::mark(trace::kEnd);
    __threadfence();  // this thread's partials are visible device-wide ...
    __syncthreads();  // ... before the block counts itself
    if (tid == 0) {
        uint32_t * ctr  = p.counters + int64_t(kvh) * gridDim.x + blockIdx.x;
        const bool last = atomicAdd(ctr, 1u) == uint32_t(n_combined - 1);
        if (last) *ctr = 0;  // every block of the column has counted: ready for the next launch
        flag[0] = last ? 1 : 0;
    }
    __syncthreads();
    if (!flag[0]) return trace::mark(trace::kEnd);
    __threadfence();
    float * wts     = reinterpret_cast<float *>(kv_s);  // [16 rows][n_act] split weights (K/V stages are free)
    float * row_sum = red_sum;                          // [16]
    for (int t = t_begin; t < t_end;) {
        int       L     = 0;
        const int te    = next_run(p, tok_pos, tok_seq, 0, t, t_end, L);
        const int n_act = decode_active_splits(L, decode_chunk(L, p.n_splits, kN));
        if (n_act > 1) {
            // Weights exp2(m_s - M) of the splits with l_s > 0 and the total sum, warp w: rows w, w + 4, ...
            // The (m, l) pairs of all the warp's rows are requested together, 32 kMlSlots splits
            // at a time (one round trip to L2 per group; read row by row, l before m and again for
            // the weights, they were three dependent trips per row), and kept in registers when
            // one group holds them all (read twice otherwise). Each row's M, weights and sum: lane y's splits y, y + 32, ...
            // in order, then the shuffle tree (the same arithmetic in any case).
            constexpr int kMlSlots = 2;  // 64 splits a group: MiniMax-M2's 33 and most of the 30B-A3B's 66 in one
            const int     n_groups = (n_act + 32 * kMlSlots - 1) / (32 * kMlSlots);
            bool          rv[4];
            int64_t       Rg[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int R = R0 + warp + 4 * i, tok = R / p.group;
                rv[i]       = !(R >= n_rows || tok < t || tok >= te);  // warp-uniform
                Rg[i]       = int64_t(tok) * p.n_head + kvh * p.group + R % p.group;
            }
            float mv[4][kMlSlots], lv[4][kMlSlots];
            auto  load_group = [&](int gi) {
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < kMlSlots; ++j) {
                        const int y = lane + 32 * (gi * kMlSlots + j);
                        mv[i][j] = lv[i][j] = 0.0f;
                        if (rv[i] && y < n_act) {
                            const float * ml = p.part_ml + 2 * (int64_t(y) * all_rows + Rg[i]);
                            mv[i][j]         = ptx::ld_cg_f32(ml);
                            lv[i][j]         = ptx::ld_cg_f32(ml + 1);
                        }
                    }
            };
            float M[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int gi = 0; gi < n_groups; ++gi) {
                load_group(gi);
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < kMlSlots; ++j)
                        if (lv[i][j] > 0.0f) M[i] = fmaxf(M[i], mv[i][j]);  // (l = 0 past n_act)
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
                for (int off = 16; off > 0; off >>= 1) M[i] = fmaxf(M[i], __shfl_xor_sync(0xffffffffu, M[i], off));
            for (int gi = 0; gi < n_groups; ++gi) {
                if (n_groups > 1) load_group(gi);
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < kMlSlots; ++j) {
                        const int y = lane + 32 * (gi * kMlSlots + j);
                        if (!rv[i] || y >= n_act) continue;
                        const float w = lv[i][j] > 0.0f ? exp2f(mv[i][j] - M[i]) : 0.0f;
                        sum[i] += w * lv[i][j];
                        wts[(warp + 4 * i) * n_act + y] = w;
                    }
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                if (!rv[i]) continue;
                for (int off = 16; off > 0; off >>= 1) sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], off);
                if (lane == 0) row_sum[warp + 4 * i] = sum[i];
            }
            __syncthreads();
            // O = sum_s w_s O_s / sum, four dims per thread and item.
            constexpr int kD4 = D / 4;
            for (int i = tid; i < 16 * kD4; i += kThreads) {
                const int r = i / kD4, d = (i % kD4) * 4;
                const int R = R0 + r, tok = R / p.group;
                if (R >= n_rows || tok < t || tok >= te) continue;
                const int     h  = kvh * p.group + R % p.group;
                const int64_t Rg = int64_t(tok) * p.n_head + h;
                float         acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                const float * po     = p.part_o + Rg * D + d;
#pragma unroll 16
                for (int y = 0; y < n_act; ++y) {  // every active split wrote part_o (n_tiles > 0); 16 loads in flight
                    float     v[4];
                    ptx::ld_cg_f32x4(po + int64_t(y) * all_rows * D, v);
                    const float w = wts[r * n_act + y];
                    for (int e = 0; e < 4; ++e) acc[e] += w > 0.0f ? w * v[e] : 0.0f;  // l = 0: skipped, as the combine kernel
                }
                const float sum = row_sum[r];
                float *     out = reinterpret_cast<float *>(reinterpret_cast<char *>(p.out) + tok * p.out_nb1) + int64_t(h) * D + d;
                for (int e = 0; e < 4; ++e) out[e] = sum > 0.0f ? acc[e] / sum : 0.0f;
            }
            __syncthreads();  // weights free for the next run
        }
        t = te;
    }
    trace::mark(trace::kEnd);  // the merge done
}

template <int D> __global__ void __launch_bounds__(kThreads, 2) attn_decode_kernel(const AttnParams p) {
    struct NoRope {};
    attn_decode<D, false>(p, NoRope{});
}

// With the fused q / k norm + RoPE (AttnParams::norm_rope).
template <int D> __global__ void __launch_bounds__(kThreads, 2) attn_decode_norm_rope_kernel(const AttnParams p, const RopeFreqs f) {
    attn_decode<D, true>(p, f);
}

// ---------------------------------------------------------------------------------------------
// Combine the decode splits (only when the decode kernel had no arrival counters). grid (n_head, T),
// block D.
// ---------------------------------------------------------------------------------------------
template <int D> __global__ void __launch_bounds__(256) attn_combine_kernel(const AttnParams p) {
    pdl::launch_dependents();
    pdl::wait();  // the partials come from the decode kernel
    const int     h = blockIdx.x, t = blockIdx.y, d = threadIdx.x;
    const int64_t all_rows = int64_t(p.n_tok) * p.n_head;
    const int64_t R        = int64_t(t) * p.n_head + h;
    float         M        = -INFINITY;
    for (int s = 0; s < p.n_splits; ++s) {
        const float * ml = p.part_ml + 2 * (int64_t(s) * all_rows + R);
        if (ml[1] > 0.0f) M = fmaxf(M, ml[0]);
    }
    float acc = 0.0f, sum = 0.0f;
    for (int s = 0; s < p.n_splits; ++s) {
        const float * ml = p.part_ml + 2 * (int64_t(s) * all_rows + R);
        if (ml[1] > 0.0f) {
            const float w = exp2f(ml[0] - M);
            sum += w * ml[1];
            acc += w * p.part_o[(int64_t(s) * all_rows + R) * D + d];
        }
    }
    float * out = reinterpret_cast<float *>(reinterpret_cast<char *>(p.out) + t * p.out_nb1) + int64_t(h) * D;
    out[d]      = sum > 0.0f ? acc / sum : 0.0f;
}

// ---------------------------------------------------------------------------------------------
// Prefill: 64 rows per block, 16 per warp. grid (ceil(T * group / 64), n_kv), block kThreads.
// ---------------------------------------------------------------------------------------------
template <int D> __global__ void __launch_bounds__(kThreads) attn_prefill_kernel(const AttnParams p) {
    pdl::launch_dependents();
    pdl::wait();
    using C = PrefillCfg<D>;
    constexpr int kN = C::kN, kStr = C::kStr;
    SPARK_DYNAMIC_SMEM(unsigned char, smem);
    uint16_t * q_s     = reinterpret_cast<uint16_t *>(smem + C::kOffQ);
    uint16_t * k_s     = reinterpret_cast<uint16_t *>(smem + C::kOffK);
    uint16_t * v_s     = reinterpret_cast<uint16_t *>(smem + C::kOffV);
    int *      tok_pos = reinterpret_cast<int *>(smem + C::kOffTok);
    int *      tok_seq = tok_pos + C::kRows;
    float *    q_inv   = reinterpret_cast<float *>(smem + C::kOffQInv);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int kvh     = blockIdx.y;
    const int n_rows  = p.n_tok * p.group;
    // Blocks of later tokens attend to more positions: launch them first (smaller tail).
    const int R0      = int(gridDim.x - 1 - blockIdx.x) * C::kRows;
    const int t_begin = R0 / p.group;
    const int t_end   = min(p.n_tok, (R0 + C::kRows - 1) / p.group + 1);

    load_token_meta(p, t_begin, t_end, tok_pos, tok_seq);
    // Q rows (log2 domain, power-of-two row scales) as single f16; warp w loads its own rows.
#pragma unroll 4
    for (int i = 0; i < 16; ++i) {
        const int r = warp * 16 + i, R = R0 + r;
        load_q_row<D, kStr>(p, R < n_rows, R / p.group, kvh * p.group + R % p.group, r, q_s, q_inv, lane);
    }
    __syncthreads();
    const float qi[2] = {q_inv[warp * 16 + g], q_inv[warp * 16 + g + 8]};

    int row_tok[2], row_pos[2], row_head[2];
    for (int rr = 0; rr < 2; ++rr) {
        const int R  = R0 + warp * 16 + g + 8 * rr;
        row_tok[rr]  = R < n_rows ? R / p.group : -1;
        row_head[rr] = R < n_rows ? kvh * p.group + R % p.group : -1;
        row_pos[rr]  = R < n_rows ? tok_pos[row_tok[rr] - t_begin] : -1;
    }
    const int64_t row_elems = int64_t(p.n_kv) * D;

    for (int t = t_begin; t < t_end;) {
        int       L  = 0;
        const int te = next_run(p, tok_pos, tok_seq, t_begin, t, t_end, L);
        bool      in_run[2];
        int       warp_max = -1;  // largest position any of this warp's rows in the run attends to
        for (int rr = 0; rr < 2; ++rr) {
            in_run[rr] = row_tok[rr] >= t && row_tok[rr] < te;
            if (in_run[rr]) warp_max = max(warp_max, row_pos[rr]);
        }
        for (int off = 1; off < 32; off <<= 1) warp_max = max(warp_max, __shfl_xor_sync(0xffffffffu, warp_max, off));
        const int       n_tiles = (L + kN - 1) / kN;
        const int       s       = tok_seq[t - t_begin];
        const int32_t * bt      = p.block_table + int64_t(L > 0 ? s : 0) * p.max_pages;

        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this thread's partial row sums (times kPScale)
        float o[D / 8][4];
        for (int nd = 0; nd < D / 8; ++nd)
            for (int e = 0; e < 4; ++e) o[nd][e] = 0.0f;

        auto load_rows = [&](uint16_t * dst, const uint16_t * cache, int it) {
            const int     p0      = it * kN;
            const int     page    = bt[p0 / p.page_size];
            const bool    page_ok = page >= 0 && page < p.n_pages;
            const int64_t row0    = (int64_t(page_ok ? page : 0) * p.page_size + p0 % p.page_size) * row_elems + int64_t(kvh) * D;
            for (int i = tid; i < kN * (D / 8); i += kThreads) {
                const int     r   = i / (D / 8), cc = i % (D / 8);
                const bool    ok  = page_ok && p0 + r < L;
                const int64_t off = ok ? row0 + int64_t(r) * row_elems + cc * 8 : 0;
                ptx::cp_async_16(dst + r * kStr + cc * 8, cache + off, ok);
            }
        };

        if (n_tiles > 0) load_rows(k_s, p.k_cache, 0);
        ptx::cp_async_commit();
        for (int it = 0; it < n_tiles; ++it) {
            ptx::cp_async_wait<0>();
            __syncthreads();  // K(it) visible; everyone is done with V(it-1)
            load_rows(v_s, p.v_cache, it);
            ptx::cp_async_commit();

            const int  p0     = it * kN;
            const bool active = p0 <= warp_max;  // warp-uniform
            float      sc[kN / 8][4];
            if (active) {
                for (int j = 0; j < kN / 8; ++j)
                    for (int e = 0; e < 4; ++e) sc[j][e] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk) {
                    uint32_t a[4];
                    ptx::ldmatrix_x4(a, q_s + (warp * 16 + (lane & 15)) * kStr + kk * 16 + (lane >> 4) * 8);
#pragma unroll
                    for (int j = 0; j < kN / 8; ++j) {
                        uint32_t b[2];
                        ptx::ldmatrix_x2(b, k_s + (j * 8 + (lane & 7)) * kStr + kk * 16 + ((lane >> 3) & 1) * 8);
                        ptx::mma_m16n8k16<__half>(sc[j], a, b[0], b[1]);
                    }
                }
                float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
                for (int j = 0; j < kN / 8; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int  rr = e >> 1;
                        const int  ps = p0 + j * 8 + c * 2 + (e & 1);
                        const bool ok = in_run[rr] && ps <= row_pos[rr];
                        sc[j][e]      = ok ? sc[j][e] * qi[rr] : -INFINITY;
                        mx[rr]        = fmaxf(mx[rr], sc[j][e]);
                    }
                for (int rr = 0; rr < 2; ++rr) {
                    mx[rr]             = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], 1));
                    mx[rr]             = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], 2));
                    const float m_new  = fmaxf(m[rr], mx[rr]);
                    const float m_use  = m_new == -INFINITY ? 0.0f : m_new;
                    const float alpha  = exp2f(m[rr] - m_use);
                    m[rr]              = m_new;
                    float sum          = 0.0f;
#pragma unroll
                    for (int j = 0; j < kN / 8; ++j) {
                        sc[j][2 * rr]     = exp2f(sc[j][2 * rr] - m_use) * kPScale;  // P in [0, 2^14]
                        sc[j][2 * rr + 1] = exp2f(sc[j][2 * rr + 1] - m_use) * kPScale;
                        sum += sc[j][2 * rr] + sc[j][2 * rr + 1];
                    }
                    l[rr] = l[rr] * alpha + sum;
#pragma unroll
                    for (int nd = 0; nd < D / 8; ++nd) {
                        o[nd][2 * rr] *= alpha;
                        o[nd][2 * rr + 1] *= alpha;
                    }
                }
            }
            ptx::cp_async_wait<0>();
            __syncthreads();  // V(it) visible; everyone is done with K(it)
            if (it + 1 < n_tiles) load_rows(k_s, p.k_cache, it + 1);
            ptx::cp_async_commit();
            if (active) {
#pragma unroll
                for (int kk = 0; kk < kN / 16; ++kk) {
                    uint32_t a[4];
                    a[0] = ptx::pack_f16x2(sc[2 * kk][0], sc[2 * kk][1]);
                    a[1] = ptx::pack_f16x2(sc[2 * kk][2], sc[2 * kk][3]);
                    a[2] = ptx::pack_f16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
                    a[3] = ptx::pack_f16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
                    for (int np = 0; np < D / 16; ++np) {
                        uint32_t b[4];
                        ptx::ldmatrix_x4_trans(b, v_s + (kk * 16 + (lane & 15)) * kStr + np * 16 + (lane >> 4) * 8);
                        ptx::mma_m16n8k16<__half>(o[2 * np], a, b[0], b[1]);
                        ptx::mma_m16n8k16<__half>(o[2 * np + 1], a, b[2], b[3]);
                    }
                }
            }
        }
        ptx::cp_async_wait<0>();
        __syncthreads();  // smem free for the next run

        for (int rr = 0; rr < 2; ++rr) {
            l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
            l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
        }
        for (int rr = 0; rr < 2; ++rr) {
            if (!in_run[rr]) continue;
            const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
            float *     out = reinterpret_cast<float *>(reinterpret_cast<char *>(p.out) + row_tok[rr] * p.out_nb1) + int64_t(row_head[rr]) * D;
            for (int nd = 0; nd < D / 8; ++nd) {
                out[nd * 8 + c * 2]     = o[nd][2 * rr] * inv;
                out[nd * 8 + c * 2 + 1] = o[nd][2 * rr + 1] * inv;
            }
        }
        t = te;
    }
}

}  // namespace spark::cuda::attn
