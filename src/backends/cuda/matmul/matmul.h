// Internal interface of the matmul kernels (src/backends/cuda/matmul/): plain argument structs shared
// by the host dispatch (matmul.cpp, plain C++) and the kernel files (*.cu), and the launch functions
// the kernel files export. Nothing here is part of the backend interface (ops.h).
#pragma once

#include "backends/cuda/device_weight.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace spark::cuda::mm {

// ---- activation rows -------------------------------------------------------------------------
// Where row r of the activations lives (F32, ne[0] = K contiguous).
//   dense mode (k_slots == 0): r = i1 + ne1 * (i2 + ne2 * i3) at base + i1 nb1 + i2 nb2 + i3 nb3;
//   pair mode  (k_slots > 0):  MATMUL_ID pair r = j + k_slots * t at base + j nb1 + t nb2
//                              (nb1 = 0 when the k slots share one input row).
struct XRows {
    const char * base    = nullptr;
    int64_t      ne1     = 1, ne2 = 1;
    int64_t      nb1     = 0, nb2 = 0, nb3 = 0;  // bytes
    int32_t      k_slots = 0;
};

// Routing ids of a MATMUL_ID: expert of pair (j, t) = p[j * s0 + t * s1] (strides in elements).
// held: the expert table when some expert is absent (expert parallelism: absent_expert entries,
// device_weight.h), else nullptr; the grouping kernels (moe_route, zero_invalid_pairs, the generic
// kernel) then treat a pair routed to an absent expert as one with an invalid id (dropped, output 0).
// The GEMVs read each pair's table entry anyway and test its data pointer themselves.
struct Ids {
    const int32_t *      p         = nullptr;
    int64_t              s0        = 0, s1 = 0;
    int32_t              k_slots   = 1;
    int32_t              n_experts = 0;
    const DeviceWeight * held      = nullptr;
};

// ---- planning (plan.cpp) ----------------------------------------------------------------------
// Elements of one 16-byte chunk of a weight row (4 f32, 8 f16/bf16, 16 fp8, 32 int4/nvfp4).
int elems_per_chunk(WeightFormat f);
// Whether the chunked kernels (GEMV, GEMM tile loader) take this weight: K a multiple of the chunk,
// INT4 groups a multiple of 32 (or one group), FP8 k-blocks a multiple of 16 (or one block).
bool chunk_ok(const DeviceWeight & w);

struct GemvPlan {
    bool    mma    = false;  // the tensor-core decode kernel (gemv_mma_kernels.cuh) instead of the FMA one
    int     r_tmpl = 1, wk = 1, lpr = 32, ksplit = 1;
    int64_t cps    = 0;  // per split (gridDim.y blocks cover K): chunks (FMA kernel), 128-K blocks (MMA)
    int     rows_per_block = 0;  // output rows of one block (multi-weight launches tile each weight by it)
    int     smem           = 0;  // dynamic shared memory bytes per block (MMA kernel)
    bool    mma_kpair      = false;  // MMA kernel, nw = 1: 16 rows per warp, two K blocks per step
    bool    mma_wave       = false;  // MMA kernel at one row: the one-wave variant
    dim3    grid{0, 0, 0};       // (row tiles, ksplit, jobs); x = 0: no plan (no candidate fitted)
    // Split-K scratch (ksplit > 1): partial floats [ksplit][nw][out_rows][n] and arrival counters
    // (one per row tile and job, zeroed on the stream before the launch).
    int64_t counters() const { return ksplit > 1 ? int64_t(grid.x) * grid.z : 0; }
};
struct GemvOpts {
    bool            mma        = false;      // the weights take the MMA kernel (gemv_mma_ok) and it is enabled
    int             smem_optin = 48 * 1024;  // opt-in shared memory per block of the device (DeviceProps)
    int             n_mats     = 1;          // > 1: a multi-weight launch over mat_n[0 .. n_mats) rows (N = sum)
    const int64_t * mat_n      = nullptr;
    // The device's streaming bandwidth (bytes per microsecond) and one SM's issue rate (lanes per
    // microsecond; DeviceProps); 0: an H100's, 3.0e6 and 128 x 1750, where the costs were fitted.
    double          bw_per_us       = 0.0;
    double          issue_per_sm_us = 0.0;
    // The plan of a GEMV with the residual add + RMS_NORM in its prologue (GemvNorm): the 2-block MMA
    // kernel, no K split, at least kGemvNormMinRows rows per block and at least one block per SM;
    // none (an FMA plan, which the fusion refuses) otherwise.
    bool            norm_prologue = false;
};
// Each block of the norm prologue reads the two addends and the norm's weight (12 K bytes) where a
// plain GEMV block reads one row (4 K): at 64 rows per block (32 K bytes of INT4 weights) the extra
// is 37% of its weight bytes, at 32 rows 73%. And the taller blocks must still cover the SMs. On
// the H200 (docs/PERF.md, "The residual add + RMS_NORM inside the GEMV"), tg128: Qwen3-Next, whose
// in_proj (193 blocks) and q/k/v (144) take 64-row plans, +2.8% (int4) / +2.0% (nvfp4); the q/k/v of
// Qwen3-8B, 30B-A3B and MiniMax-M2 at 32 rows level to -1.3%, at 64 rows (96, 80 and 128 blocks:
// idle SMs) -4 to -5.5%: they keep the separate launches.
constexpr int kGemvNormMinRows = 64;
// The GEMV launch for `rows` (<= 8) activation rows, `jobs` MATMUL_ID pairs (1 for MATMUL), nw
// weights (2: fused gate/up): a small cost model over lanes per row (FMA kernel), K-warps and K
// splits (plan.cpp).
GemvPlan plan_gemv(WeightFormat f, int64_t N, int64_t K, int64_t jobs, int rows, int nw, int sm_count, const GemvOpts & o = GemvOpts{});
// The experts' down projection with the MoE combine (GemvArgs::slot_w): no cost model, the kernel's
// one form: a K-warp per slot (k_slots == the block's warps), each its slot's whole K, two 128-K
// blocks a step (16 rows a block, the most blocks), one token a block z; no plan (grid.x 0) where
// the blocks outnumber the SMs: each block streams 8 experts' rows, so a second block on some SMs
// doubles their time (MiniMax-M2's 192 blocks on the H200's 132 SMs: 2.5% slower, docs/PERF.md).
GemvPlan plan_experts_combine(int64_t N, int64_t K, int k_slots, int64_t tokens, int sm_count);
// Whether a weight takes the tensor-core decode GEMV: INT4 with groups of a multiple of 128 (or one
// group per row), NVFP4; K a multiple of 32.
bool gemv_mma_ok(const DeviceWeight & w);

// The experts of a MATMUL_ID set laid out at one stride: expert e's data, scales and zeros at expert
// 0's plus e strides (bytes), every other field alike (NVFP4: one global scale). A GEMV block then
// computes its expert's addresses from the id instead of reading its table entry first (one
// dependent trip less before its weights).
struct ExpertGrid {
    int64_t data = 0, scales = 0, zeros = 0;
    int32_t uniform = 0;  // 0: no such layout (an absent expert, act-order, differing fields or strides)
};
// expert(e) -> const DeviceWeight & (host copies), e < n.
template <class Expert> ExpertGrid expert_grid_by(Expert expert, int32_t n) {
    ExpertGrid g;
    if (n < 1) return g;
    const DeviceWeight & e0   = expert(0);
    auto                 diff = [](const void * p, const void * q) { return int64_t(reinterpret_cast<intptr_t>(p) - reinterpret_cast<intptr_t>(q)); };
    if (n > 1) {
        const DeviceWeight & e1 = expert(1);
        g.data = diff(e1.data, e0.data), g.scales = diff(e1.scales, e0.scales), g.zeros = diff(e1.zeros, e0.zeros);
    }
    for (int32_t e = 0; e < n; ++e) {
        const DeviceWeight & w     = expert(e);
        const bool           alike = w.data != nullptr && w.perm == nullptr && w.format == e0.format && w.scale_type == e0.scale_type &&
                           w.tiled == e0.tiled && w.group_size == e0.group_size && w.n_groups == e0.n_groups && w.block_n == e0.block_n &&
                           w.block_k == e0.block_k && w.n == e0.n && w.k == e0.k && w.act_scale == e0.act_scale &&
                           w.global_scale == e0.global_scale && (w.scales == nullptr) == (e0.scales == nullptr) &&
                           (w.zeros == nullptr) == (e0.zeros == nullptr);
        if (!alike || diff(w.data, e0.data) != e * g.data || (w.scales && diff(w.scales, e0.scales) != e * g.scales) ||
            (w.zeros && diff(w.zeros, e0.zeros) != e * g.zeros))
            return ExpertGrid{};
    }
    g.uniform = 1;
    return g;
}
inline ExpertGrid expert_grid(const DeviceWeight * experts, int32_t n) {
    return expert_grid_by([experts](int32_t e) -> const DeviceWeight & { return experts[e]; }, n);
}
// Whether the MMA decode GEMV is used at all: compute capability 8.0+, unless SPARK_GEMV_MMA=0 (or
// a test override, tuning.h).
bool gemv_mma_enabled(int cc);

// ---- GEMV (rows <= 8) -------------------------------------------------------------------------
constexpr int kGemvThreads = 256;  // 8 warps
constexpr int kGemvMaxRows = 8;
constexpr int kGemvMaxMats = 4;    // weights of one multi-weight launch (op_matmul_multi)

// Weight rows per row group (U), by the row template r (1, 2, 4, 8), the number of fused weights nw
// (2: gate + up) and the chunk's element count e: a lane issues U * nw 16-byte loads per step (4 for
// 1-2 rows, fewer where the R-row accumulators and decoded values need the registers).
constexpr int gemv_rows_per_warp(int r, int nw, int e) {
    const int loads = r <= 2 ? 4 : r <= 4 ? 2 : (e >= 32 ? 1 : 2);
    return loads / nw > 0 ? loads / nw : 1;
}
// Steps in flight per lane (the register ring of D x U * nw 16-byte loads): 2 for 1-2 rows; 4-8 rows
// are bound by the FMAs (R per weight) and need the registers for their accumulators.
constexpr int gemv_depth(int r, int nw, int e) { return (void) nw, (void) e, r <= 2 ? 2 : 1; }
// Blocks per SM the kernel is compiled for (__launch_bounds__; register cap 65536 / (256 x this)):
// one activation row fits 80 registers (3 blocks, 24 warps) except NVFP4 and INT4 with zero points
// (their larger scale state would spill: 2 blocks); 2-4 rows 128 registers; 8 rows 255.
constexpr int gemv_min_blocks(int r, WeightFormat f) {
    return r == 1 ? (f == WeightFormat::NVFP4 ? 2 : 3) : r <= 4 ? 2 : 1;
}

// MMA decode GEMV (gemv_mma_kernels.cuh). A warp owns row tiles of 16 weight rows (2 tiles per step: two of
// one weight, or gate and up), a step is one 128-K block of them (8 mma.sync m16n8k16 per tile).
constexpr int kMmaK = 128;                                                     // K per step
constexpr int gemv_mma_tiles(int nw) { return nw == 2 ? 1 : 2; }               // row tiles per warp (per weight)
constexpr int kGemvMmaSplit = 2;                                                // f16 parts per activation: hi, lo
constexpr int gemv_mma_parts(int r) { return kGemvMmaSplit * r; }               // B columns
constexpr int gemv_mma_depth(int r) { return r <= 4 ? 2 : 1; }                 // steps in flight per lane
constexpr int gemv_mma_min_blocks(int r) { return r <= 4 ? 2 : 1; }            // __launch_bounds__ blocks per SM
// The one-wave variant at one activation row (GemvPlan::mma_wave): one step in flight per lane and 3
// blocks per SM (80 registers instead of 114-121: 24 warps per SM instead of 16), the grid one wave of
// them. The kernels are held by latency, not by bytes in flight: on the H200 the warps gained more
// than the deeper ring for the fused gate/up + SwiGLU (docs/PERF.md, "The one-wave gate/up"), and for a
// single weight where the grid fills more than two blocks per SM (MiniMax-M2's experts' down).
constexpr int kGemvMmaWaveBlocks = 3;
constexpr int gemv_mma_depth(int r, bool wave) { return wave ? 1 : gemv_mma_depth(r); }
constexpr int gemv_mma_min_blocks(int r, bool wave) { return wave ? kGemvMmaWaveBlocks : gemv_mma_min_blocks(r); }
constexpr int gemv_mma_col_stride(int r) { return (gemv_mma_parts(r) + 7) / 8 * 8; }  // 1 / s per block and column
// Shared memory of one block: the split activations of cps 128-K blocks (16 words x parts x 4
// lanes x 16 bytes each) and their 1 / s, reused for the cross-warp reduction ([8 warps][2 tiles]
// [16 rows][parts] floats); one row: at least each warp's own ring of 2 steps x 2 blocks
// (GemvMmaWarpSplit, which only the INT4 2-block kernel uses: the size is the same for every one-row
// plan, a superset for the NVFP4, one-wave and norm-prologue kernels, so that the kernel's choice
// needs no host twin).
// (kp plans keep cps even, so the zero block a kp split with an odd range appends fits.)
constexpr int gemv_mma_smem(int r, int64_t cps) {
    const int64_t blk  = 256 * gemv_mma_parts(r) + gemv_mma_col_stride(r) * 4;
    const int64_t b    = cps * blk;
    const int64_t red  = int64_t(8) * 2 * 16 * gemv_mma_parts(r) * 4;
    const int64_t ring = r == 1 ? int64_t(8) * 2 * 2 * blk : 0;
    const int64_t m    = b > red ? b : red;
    return int(m > ring ? m : ring);
}

// The residual add and RMS_NORM a decode GEMV computes before its matmul (the fused ADD + RMS_NORM
// + MATMUL launch, fusion.h): its activation rows are (a + b) * w, and each result is multiplied by
// its row's 1 / rms(a + b), which every block sums up itself while it splits its activations (the
// norm's factor is one per row, so it can wait for the epilogue: no block waits for a reduction
// over the row before its matmul). The blocks of row tile 0 write a + b (the ADD node's output);
// the norm itself (the RMS_NORM node) is never written. Rows of ld floats; a == nullptr: none.
struct GemvNorm {
    const float * a   = nullptr;
    const float * b   = nullptr;
    float *       sum = nullptr;
    const float * w   = nullptr;  // the norm's weight (nullptr: none)
    int64_t       lda = 0, ldb = 0, ld_sum = 0;
    float         eps = 0.0f;
    int32_t       zero_centered = 0;  // the weight is 1 + w
};

// The RMS_NORM whose weighted rows a producer wrote (the fused MOE_COMBINE + ADD + RMS_NORM launch,
// ops.h: op_combine_norm_matmul): the activations are x = (a + b) * w, and the producer's blocks
// wrote the sums of squares of a + b in parts[0 .. n_parts) (one row; warp 0 copies them to shared
// memory after its wait, 16 bytes a copy: parts is 16-byte aligned and readable up to a multiple of
// 4 floats; each lane sums its eighth in order, then a butterfly). Each result is multiplied by
// 1 / sqrt(sum(parts) / k + eps) in the epilogue: no block reduces the row itself, and no launch
// sits between the producer and this GEMV. MMA kernel, one activation row; parts == nullptr: none.
constexpr int kGemvMaxScaleParts = 256;
struct GemvRowScale {
    const float * parts   = nullptr;
    int32_t       n_parts = 0;  // <= kGemvMaxScaleParts
    float         eps     = 0.0f;
    int32_t       smem_offset = 0;  // where the parts' copy goes in the dynamic shared memory (set by the launcher)
};
// Where the GEMV's warp 0 gathers the parts: two in each lane's registers (up to 64: the combine's
// parts, with no copy, as measured before the shared form existed) or copied to shared memory (a
// GEMV producer's 96-256 blocks).
enum GemvRowScaleForm : int { kRowScaleNone = 0, kRowScaleLanes = 1, kRowScaleShared = 2 };
constexpr int              kGemvLaneScaleParts = 64;
constexpr GemvRowScaleForm gemv_row_scale_form(int n_parts) { return n_parts <= kGemvLaneScaleParts ? kRowScaleLanes : kRowScaleShared; }
// The dynamic shared memory of a launch of the shared form: the plan's, then room for the parts' copy.
constexpr int gemv_row_scale_offset(int smem) { return (smem + 15) / 16 * 16; }
constexpr int gemv_row_scale_smem(int smem) { return gemv_row_scale_offset(smem) + kGemvMaxScaleParts * 4; }

// The residual ADD after a matmul and the producer's half of the RMS_NORM of that sum (MMA kernel,
// one row of one plain weight, no K split): each result y[n] becomes sum[n] = y[n] + resid[n]
// (the ADD's output), z[n] = sum[n] * w[n] (1 + w[n]: zero_centered; the norm's weighted row, which
// a GEMV with GemvArgs::rs reads) and each block writes the sum of its sums' squares to
// parts[blockIdx.x]; y itself is not written. resid == nullptr: none.
struct GemvNormOut {
    const float * resid = nullptr;
    float *       sum   = nullptr;
    float *       z     = nullptr;
    const float * w     = nullptr;  // (nullptr: no weight)
    int32_t       zero_centered = 0;
    float *       parts = nullptr;
};

struct GemvArgs {
    // Plain MATMUL: the weight(s) (w[1] = the up projection of a fused gate/up + SwiGLU; w[0 ..
    // n_mats) the weights of a multi-weight launch).
    DeviceWeight w[kGemvMaxMats];
    // MATMUL_ID: device expert tables (table[1]: up experts); block z = pair j + k_slots * t reads
    // its expert id on the device. nullptr for a plain matmul.
    const DeviceWeight * table[2] = {nullptr, nullptr};
    Ids ids;
    // Activations. Plain: rows x[0 .. rows) (16-byte aligned; unused slots repeat row 0).
    // MATMUL_ID: row of pair (j, t) = xbase + j * x_sj + t * x_st (elements, 16-byte aligned).
    const float * x[kGemvMaxRows] = {};
    const float * xbase = nullptr;
    int64_t       x_sj = 0, x_st = 0;
    int64_t       n = 0, k = 0;
    int32_t       rows     = 1;  // valid activation rows (plain); 1 for MATMUL_ID
    int32_t       out_rows = 1;  // rows of y: rows (plain) or k_slots * T (MATMUL_ID)
    // Output: y [out_rows][n] (SwiGLU applied when fused). K split across blocks (gridDim.y > 1):
    // partial [ksplit][nw][out_rows][n] and counters [jobs][row tiles] (zeroed before the launch);
    // the last block of each tile sums the partials in split order into y.
    float *    y        = nullptr;
    float *    partial  = nullptr;
    uint32_t * counters = nullptr;
    // Work split: warps per block along K (wk: 1, 2, 4, 8; the others take different rows), lanes
    // per weight row (lpr: 32, 16, 8; a warp covers 32 / lpr row groups of U rows), and the chunks
    // (16 bytes of a weight row) of K each block y-index covers.
    int32_t wk               = 1;
    int32_t lpr              = 32;
    int64_t chunks_per_split = 0;
    // INT4: some weight (any expert) has zero points (selects the decoder with per-group zeros).
    int32_t int4_zeros = 0;
    // Launch with programmatic dependent launch (sm_90+): the kernel requests its first weights
    // before it waits for the previous kernel (pdl.cuh; the dispatch sets it from pdl_enabled()).
    int32_t pdl = 0;
    // MATMUL_ID: the ids were written before the previous launch, which lets this one start only
    // after its own wait (pdl.cuh): read them (ld.cg) and request the experts' first weights before
    // waiting. 0: wait first.
    int32_t ids_early = 0;
    // MATMUL_ID, MMA kernel: the activations were written before a launch that lets the next one
    // start only after its own wait (pdl.cuh): convert them (ld.cg) into the B fragments before
    // waiting (for the ids). 0: after the wait.
    int32_t x_early = 0;
    // MATMUL_ID: the experts' addresses from the id (expert_grid; grid[0].uniform: both sets' grids
    // hold, grid[i] that of table[i]), else from the table.
    ExpertGrid grid[2];
    // MMA kernel, one weight: a warp's two row tiles are one tile at two consecutive 128-K blocks
    // (plan.mma_kpair; rows per block halve).
    int32_t mma_kpair = 0;
    // MMA kernel, fused gate/up at one row: the one-wave variant (plan.mma_wave; selects the
    // instantiation on the host).
    int32_t mma_wave = 0;
    // The residual add + RMS_NORM before the matmul (MMA kernel, plain MATMUL; x is unused then).
    GemvNorm norm;
    // The 1 / rms of a norm whose weighted rows x holds (MMA kernel, one row).
    GemvRowScale rs;
    // The residual ADD and the next norm's half after the matmul (MMA kernel, one row, one weight).
    GemvNormOut produce;
    // The experts' down projection and the MoE combine in one launch (MMA kernel, INT4, a MATMUL_ID's
    // operands; blockIdx.z = token): warp kw of each block computes slot kw's expert over its whole
    // K (wk = k_slots), and the block sums the slots' results times slot_w[kw + k_slots t] in slot
    // order, the MOE_COMBINE's sum without a launch or an arrival counter; y [T][n] is the combined
    // row. nullptr: not this form.
    const float * slot_w = nullptr;
    // Multi-weight launch (n_mats > 1; plain MATMUL, nw = 1, one activation set): weight m = w[m]
    // has mat_n[m] rows, written to mat_y[m] [rows][mat_n[m]], and owns the blocks x in
    // [mat_tile0[m], mat_tile0[m + 1]). n is the sum of mat_n (split-K partials are laid out over the
    // concatenated rows, weight m from mat_row0[m]). n_mats <= 1: one weight, n rows into y.
    int32_t n_mats                      = 1;
    int32_t mat_tile0[kGemvMaxMats + 1] = {};
    int64_t mat_n[kGemvMaxMats]         = {};
    int64_t mat_row0[kGemvMaxMats]      = {};
    float * mat_y[kGemvMaxMats]         = {};
};

// r_tmpl in {1, 2, 3, 4, 8}; grid = plan_gemv(...).grid: (ceil(n / rows_per_block), ksplit, jobs).
void gemv_launch_f32(int r_tmpl, bool glu, const GemvArgs & a, dim3 grid, cudaStream_t s);
void gemv_launch_f16(int r_tmpl, bool glu, const GemvArgs & a, dim3 grid, cudaStream_t s);
void gemv_launch_bf16(int r_tmpl, bool glu, const GemvArgs & a, dim3 grid, cudaStream_t s);
void gemv_launch_nvfp4(int r_tmpl, bool glu, const GemvArgs & a, dim3 grid, cudaStream_t s);
void gemv_launch_int4(int r_tmpl, bool glu, const GemvArgs & a, dim3 grid, cudaStream_t s);
void gemv_launch_fp8(int r_tmpl, bool glu, const GemvArgs & a, dim3 grid, cudaStream_t s);
// The MMA decode GEMV (plan.mma): INT4 (a.int4_zeros selects the zero-point decoder) and NVFP4;
// a.chunks_per_split counts 128-K blocks; smem = plan.smem.
void gemv_mma_launch_int4(int r_tmpl, bool glu, const GemvArgs & a, dim3 grid, int smem, cudaStream_t s);
void gemv_mma_launch_nvfp4(int r_tmpl, bool glu, const GemvArgs & a, dim3 grid, int smem, cudaStream_t s);

// One planned GEMV launch (either kernel; a.wk, a.lpr, a.chunks_per_split, a.mma_kpair from the plan).
inline void gemv_launch_planned(WeightFormat f, const GemvPlan & p, bool glu, GemvArgs a, cudaStream_t s) {
    a.wk               = p.wk;
    a.lpr              = p.lpr;
    a.chunks_per_split = p.cps;
    a.mma_kpair        = p.mma_kpair ? 1 : 0;
    a.mma_wave         = p.mma_wave ? 1 : 0;
    if (p.mma) {
        if (f == WeightFormat::NVFP4)
            gemv_mma_launch_nvfp4(p.r_tmpl, glu, a, p.grid, p.smem, s);
        else
            gemv_mma_launch_int4(p.r_tmpl, glu, a, p.grid, p.smem, s);
        return;
    }
    switch (f) {
        case WeightFormat::F32: gemv_launch_f32(p.r_tmpl, glu, a, p.grid, s); break;
        case WeightFormat::F16: gemv_launch_f16(p.r_tmpl, glu, a, p.grid, s); break;
        case WeightFormat::BF16: gemv_launch_bf16(p.r_tmpl, glu, a, p.grid, s); break;
        case WeightFormat::NVFP4: gemv_launch_nvfp4(p.r_tmpl, glu, a, p.grid, s); break;
        case WeightFormat::INT4: gemv_launch_int4(p.r_tmpl, glu, a, p.grid, s); break;
        case WeightFormat::FP8: gemv_launch_fp8(p.r_tmpl, glu, a, p.grid, s); break;
    }
}

// ---- GEMM (rows > 8): mma.sync m16n8k16 F16 -> F32 ---------------------------------------------
constexpr int kGemmThreads = 256;  // 8 warps: 2 along M x 4 along N
constexpr int kGemmBK      = 32;   // K per pipeline stage; the GEMM needs K % 32 == 0
constexpr int kGemmMaxMats = 4;    // weights of one multi-weight GEMM (op_matmul_multi at prefill)
constexpr int gemm_bm(int mt) { return 2 * 16 * mt; }             // rows of activations per block
constexpr int gemm_bn(bool glu) { return glu ? 64 : 128; }        // output columns per block
// Blocks per SM the kernel is compiled for (__launch_bounds__): 128-row tiles fit 128 registers (2
// blocks, 84 KB of shared memory), 32-row tiles 64 (4 blocks). The split-K planner counts on it.
constexpr int gemm_min_blocks(int mt) { return mt == 1 ? 4 : 2; }
// Floats of one block's split-K partial: its accumulators, [MT x 4 x 4] per thread.
constexpr int gemm_partial_floats(int mt) { return kGemmThreads * mt * 16; }

struct GemmArgs {
    // Activations converted to F16 by x_to_f16_rows (row r scaled by a power of two, and permuted for
    // act-order weights): a[m][k], row stride lda; a_inv_scale[m] undoes row m's scale (multiplies
    // its f32 accumulators in the epilogue).
    const uint16_t * a           = nullptr;
    const float *    a_inv_scale = nullptr;
    int64_t          lda         = 0;
    int64_t          m           = 0;  // dense: rows; grouped: rows of `a` (= pairs)
    int64_t          n = 0, k = 0;
    // w[0] (w[1]: the up projection of a fused gate/up); a multi-weight launch: w[0 .. n_mats).
    DeviceWeight w[kGemmMaxMats];
    // Grouped (MATMUL_ID): block x = tile of the device-built table: tiles[2i] = expert,
    // tiles[2i + 1] = first row; blocks past *n_tiles exit. Rows of expert e end at expert_end[e];
    // out_rows[row] = output row of sorted row `row`.
    const DeviceWeight * table[2]   = {nullptr, nullptr};
    const int32_t *      tiles      = nullptr;
    const int32_t *      n_tiles    = nullptr;
    const int32_t *      expert_end = nullptr;
    const int32_t *      out_rows   = nullptr;
    float *              y          = nullptr;  // [rows][n]
    // Split over K (dense only): block z computes K stages [z, z + 1) x kt_per_split (of 32) of its
    // tile (tile = x + gridDim.x * y). Blocks take arrival tickets (counters[2 tile]); all but the last
    // store their raw accumulators to partial [tile][ksplit][gemm_partial_floats(mt)] and count the
    // store (counters[2 tile + 1]); the last waits for the stores, sums the partials in split order
    // (bit-identical whichever block comes last) and runs the epilogue. Counters zeroed before the launch.
    int32_t    ksplit       = 1;
    int64_t    kt_per_split = 0;
    float *    partial      = nullptr;
    uint32_t * counters     = nullptr;
    // Multi-weight launch (n_mats > 1; dense, no GLU, one activation set): weight i has mat_n[i] rows,
    // written to mat_y[i] [rows][mat_n[i]], and owns the column tiles y in [mat_tile0[i],
    // mat_tile0[i + 1]). n_mats <= 1: one weight, n columns into y.
    int32_t n_mats                      = 1;
    int32_t mat_tile0[kGemmMaxMats + 1] = {};
    int64_t mat_n[kGemmMaxMats]         = {};
    float * mat_y[kGemmMaxMats]         = {};
};

// The GEMM launch of a dense problem: tile height (mt) and K split.
struct GemmPlan {
    int     mt           = 4;
    int     ksplit       = 1;
    int64_t kt_per_split = 0;        // K stages of 32 per split
    dim3    grid{0, 0, 0};           // (row tiles, column tiles, ksplit)
    int64_t tiles() const { return int64_t(grid.x) * grid.y; }
    // Split-K scratch: partial floats and arrival counters (0 without a split).
    int64_t partial_floats() const { return ksplit > 1 ? tiles() * ksplit * gemm_partial_floats(mt) : 0; }
    int64_t counters() const { return ksplit > 1 ? 2 * tiles() : 0; }
};
// rows x K against column tiles of width gemm_bn(glu) (tiles_n in all; a multi-weight launch sums
// its weights' tiles): 32-row tiles up to 64 rows, else 128; K split across blocks when the tiles
// alone leave SMs idle or end in a ragged last wave (a model of waves of resident blocks, plan.cpp).
GemmPlan plan_gemm(int64_t rows, int64_t tiles_n, int64_t K, int sm_count);

// mt in {1, 4} (block rows 32 or 128); grid = (m tiles or max tiles, column tiles, a.ksplit).
void gemm_launch_f32(int mt, bool glu, const GemmArgs & a, dim3 grid, cudaStream_t s);
void gemm_launch_f16(int mt, bool glu, const GemmArgs & a, dim3 grid, cudaStream_t s);
void gemm_launch_bf16(int mt, bool glu, const GemmArgs & a, dim3 grid, cudaStream_t s);
void gemm_launch_nvfp4(int mt, bool glu, const GemmArgs & a, dim3 grid, cudaStream_t s);
void gemm_launch_int4(int mt, bool glu, const GemmArgs & a, dim3 grid, cudaStream_t s);
void gemm_launch_fp8(int mt, bool glu, const GemmArgs & a, dim3 grid, cudaStream_t s);

// ---- small kernels around the matmuls (side_kernels.cu) -------------------------------------------

// Activation rows -> contiguous F32 [rows][k] (GEMV input: alignment, act-order permutation).
// perm: dense mode, one permutation (or nullptr); pair mode: the permutation of each pair's expert
// from `table` (ids), when table is not null.
void x_to_f32_rows(const XRows & x, int64_t rows, int64_t k, const int32_t * perm, const DeviceWeight * table,
                   const Ids & ids, float * out, cudaStream_t s);

// Activation rows -> F16 [rows][k] (GEMM input), each row r multiplied by a power of two s_r with
// max |x_r| * s_r < 2^14 (max over the finite elements; s_r = 1 for an all-zero or all-non-finite
// row; s_r <= 2^126), so no finite value overflows f16 and the scaling is exact; inf and NaN pass
// through unchanged (they propagate to that row's outputs only). inv_scale[r] = 1 / s_r (exact).
// Grouped: row i of the output is pair order[i] (order != nullptr), permuted by that pair's expert
// when table is not null. rows_valid (device, may be nullptr): rows at or past *rows_valid are
// skipped (grouped GEMM: pairs with an invalid expert id are not in `order`).
void x_to_f16_rows(const XRows & x, int64_t rows, int64_t k, const int32_t * perm, const int32_t * order,
                   const int32_t * rows_valid, const DeviceWeight * table, const Ids & ids, uint16_t * out,
                   float * inv_scale, cudaStream_t s);

// MoE routing tables for the grouped GEMM, built on the device by one block:
//   offsets[e] (e = 0 .. n_experts): first sorted row of expert e (offsets[n_experts] = valid pairs);
//   order[row]: the pair (j + k_slots * t) of sorted row `row`;
//   tiles[2 i], tiles[2 i + 1]: expert and first row of tile i (tiles of bm rows per expert);
//   *n_tiles: number of tiles. Pairs with an out-of-range expert id, or routed to an absent expert
//   (Ids::held), are dropped (their output rows are zeroed by zero_invalid_pairs).
// Workspace bytes (ints) needed: see moe_route_ints().
inline int64_t moe_route_ints(int64_t pairs, int32_t n_experts, int64_t max_tiles) {
    return (n_experts + 1) + pairs + 2 * max_tiles + 1;
}
void moe_route(const Ids & ids, int64_t n_tok, int32_t bm, int64_t max_tiles, int32_t * offsets, int32_t * order,
               int32_t * tiles, int32_t * n_tiles, cudaStream_t s);
// y rows of pairs whose expert id is out of range or absent (Ids::held) -> 0 (the GEMV path does
// this in-kernel).
void zero_invalid_pairs(const Ids & ids, int64_t n_tok, int64_t n, float * y, cudaStream_t s);

// out[i] = silu(gate[i]) * up[i] (unfused fallback).
void swiglu_rows(const float * gate, const float * up, int64_t count, float * out, cudaStream_t s);

// Generic fallback for any shape and format: one warp per output element, exact per-element
// decode (weight_at). Plain: rows of x (XRows dense), w[0..nw); MATMUL_ID: pair rows, tables.
struct GenericArgs {
    XRows                x;
    int64_t              rows = 0;
    int64_t              n = 0, k = 0;
    DeviceWeight         w[2];
    const DeviceWeight * table[2] = {nullptr, nullptr};
    Ids                  ids;
    bool                 glu = false;
    float *              y   = nullptr;  // [rows][n]
};
void generic_matmul(const GenericArgs & a, cudaStream_t s);

}  // namespace spark::cuda::mm
