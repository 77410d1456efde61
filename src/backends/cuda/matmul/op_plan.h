// The plan of one matmul op: which path it takes (decode GEMV, FMA or tensor-core; GEMM; generic),
// the parameters of its launches (GemvPlan / GemmPlan: split-K, tiles, row batches) and the
// workspace they take. Pure host code: no kernels, reads no device data (pointers only for their
// alignment). matmul.cpp launches what a plan says and asks the workspace for the plan's
// scratch_bytes(), both from the one plan; kernel_paths() (ops.h) names the paths the plans choose
// on representative weights. The CPU suite tests it without a GPU (tests/matmul_plan/).
#pragma once

#include "backends/cuda/matmul/matmul.h"
#include "backends/cuda/ops.h"

#include <cstddef>
#include <cstdint>

namespace spark::cuda::mm {

// ---- the workspace of one op: one get(), carved into 256-byte aligned pieces ---------------------

size_t scratch_aligned(size_t bytes);

struct Scratch {
    char * base = nullptr;
    size_t used = 0;
    void * take(size_t bytes) {
        void * p = base + used;
        used += scratch_aligned(bytes);
        return p;
    }
};

// What one launch path takes from the workspace, by piece (bytes; 0: not taken), laid out in this
// order. The planner sizes the pieces; bytes() and carve() read the same sizes.
struct ScratchPieces {
    size_t x_f32     = 0;  // activations as contiguous F32 rows (GEMV input: act-order permutation, misaligned rows)
    size_t route     = 0;  // grouped GEMM: moe_route's tables (moe_route_ints)
    size_t x_f16     = 0;  // GEMM input: F16 activations [rows][k]
    size_t inv_scale = 0;  // GEMM input: one f32 inverse row scale per row
    size_t partial   = 0;  // split-K partial sums (f32)
    size_t counters  = 0;  // split-K arrival counters (u32, zeroed on the stream before each launch)
    size_t a4_codes  = 0;  // W4A4 input: the activations as NVFP4 codes [rows][k / 2]
    size_t a4_scales = 0;  //             and their E4M3 block scales [rows][k / 16]
    size_t bytes() const;
};
struct ScratchPtrs {
    float *    x_f32     = nullptr;
    int32_t *  route     = nullptr;
    uint16_t * x_f16     = nullptr;
    float *    inv_scale = nullptr;
    float *    partial   = nullptr;
    uint32_t * counters  = nullptr;
    uint8_t *  a4_codes  = nullptr;
    uint8_t *  a4_scales = nullptr;
};
ScratchPtrs carve(const ScratchPieces & pieces, Scratch & scratch);

// ---- problems --------------------------------------------------------------------------------------

// Byte offset of activation row r from x.base (XRows dense mode).
inline int64_t row_offset(const XRows & x, int64_t r) {
    const int64_t i1 = r % x.ne1, i2 = (r / x.ne1) % x.ne2, i3 = r / (x.ne1 * x.ne2);
    return i1 * x.nb1 + i2 * x.nb2 + i3 * x.nb3;
}

// MATMUL, or a fused gate/up + SwiGLU (nw = 2) over dense weights.
struct Dense {
    const DeviceWeight * w[2] = {nullptr, nullptr};
    int                  nw   = 1;
    XRows                x;
    int64_t              rows = 0;
    float *              y    = nullptr;
    // The output overlaps the activations (a fused SWIGLU whose output the memory plan placed over
    // the matmuls' input, which is dead after the second matmul node): copy them first.
    bool stage_x = false;
    // A prompt step (OpContext::prompt_step): W4A4 may apply.
    bool prompt = false;
    // The residual add + RMS_NORM the GEMV computes first (op_add_norm_matmul; norm.a == nullptr: none).
    // norm_prologue: planned for it (GemvOpts::norm_prologue), also before the addresses exist.
    GemvNorm norm;
    bool     norm_prologue = false;
    // The 1 / rms of the norm whose weighted rows x holds (op_combine_norm_matmul; one MMA launch).
    GemvRowScale rs;
    // The residual ADD and the next norm's half after the matmul (op_matmul_norm_matmul; one MMA launch).
    GemvNormOut produce;
};

// MATMUL_ID, or its fused gate/up + SwiGLU (nw = 2): every (slot, token) pair's expert.
struct Moe {
    const DeviceWeight * table[2] = {nullptr, nullptr};
    DeviceWeight         w0[2];  // host copies of the first held expert (format and shape)
    int                  nw    = 1;
    bool                 fast  = true;   // every expert takes the chunked kernels (chunk_ok)
    bool                 perm  = false;  // some expert has an act-order permutation
    bool                 zeros = false;  // some INT4 expert has zero points
    bool                 mma   = true;   // every expert takes the tensor-core decode GEMV (gemv_mma_ok)
    bool                 absent = false; // some expert is not held here (expert parallelism; ids.held set)
    ExpertGrid           grid[2];        // of each set (expert_grid)
    XRows                x;              // pair mode
    Ids                  ids;
    int64_t              n_tok = 0;
    float *              y     = nullptr;  // [pairs][N]
    // The output overlaps the activations / the ids (see Dense::stage_x): copy them first.
    bool   stage_x   = false;
    size_t ids_bytes = 0;  // > 0: copy the ids (their byte span)
    // The GEMV may read the ids / convert the activations before its wait (OpContext::ids_before_wait,
    // x_before_wait), as long as it is the op's first launch (no staging kernel in between).
    bool ids_early = false;
    bool x_early   = false;
    // The MoE combine in the same launch (GemvArgs::slot_w: INT4, a K-warp per slot,
    // plan_experts_combine): the route weights [n_tok][k_slots], y [n_tok][N] the combined rows;
    // produce (one token): the residual ADD and the next norm's half instead of y.
    const float * slot_w = nullptr;
    GemvNormOut   produce;

    int64_t pairs() const { return int64_t(ids.k_slots) * n_tok; }
};

// Several MATMULs over the same activations (op_matmul_multi): one launch over all weights.
struct Multi {
    const DeviceWeight * w[kGemvMaxMats] = {};
    int                  count = 0;
    XRows                x;
    int64_t              rows = 0;
    GemvNorm             norm;  // (as Dense::norm, norm_prologue)
    bool                 norm_prologue = false;
    GemvRowScale         rs;  // (as Dense::rs)
};

// ---- plans ---------------------------------------------------------------------------------------

enum class Path {
    Gemv,     // the decode GEMV (GemvPlan::mma: tensor-core or FMA kernel); MATMUL: batches of 8 rows
              // beyond 8; MATMUL_ID: one launch over all pairs, expert ids read on the device
    Gemm,     // the tensor-core GEMM; MATMUL_ID: grouped by expert (device-built routing)
    Generic,  // the per-element fallback (exact, slow)
    W4A4,     // NVFP4 with activation scales on sm_120a / sm_121a: the activations quantized to NVFP4,
              // then the block-scaled FP4 GEMM (fp4/w4a4.h); one weight per launch
};

// The device rates of the GEMV cost model (DeviceProps::bw_bytes_per_us, issue_per_sm_us) from the
// device's attributes: DRAM peak = 2 x memory clock x bus width, of which a streaming kernel reaches
// kAchievableBw; issue = 4 schedulers x 32 lanes x the SM clock x kSustainedClock. Both factors were
// fitted on an H100 SXM (2619 MHz x 5120 bits, 1980 MHz) so that its rates are the 3.0e6 B/us and
// 128 x 1750 lanes/us the model was fitted with: its plans do not change. A zero attribute (an
// integrated GPU may report no memory clock) leaves the rate 0 (then the caller measures).
constexpr double kAchievableBw = 0.8949, kSustainedClock = 0.8838;
inline void device_rates(DeviceProps & d, int mem_clock_khz, int bus_bits, int sm_clock_khz) {
    d.bw_bytes_per_us = mem_clock_khz > 0 && bus_bits > 0 ? 2.0 * double(mem_clock_khz) * 1e3 * double(bus_bits) / 8.0 * kAchievableBw / 1e6 : 0.0;
    d.issue_per_sm_us = sm_clock_khz > 0 ? 128.0 * double(sm_clock_khz) / 1e3 * kSustainedClock : 0.0;
}

// Whether an NVFP4 weight takes the W4A4 path for `rows` activation rows on `dev` (docs/SM120.md,
// "When W4A4 runs"): the checkpoint calibrated its activations (act_scale), the device runs the
// kernels, K is a multiple of the FP4 MMA's 64, and the step is a prompt step (Graph::prompt_step)
// with more rows than the decode GEMV takes: decode and speculative-verify steps keep W4A16, so that
// a verify step computes what one-row decode does. SPARK_W4A4 (Overrides::w4a4): 0 never, 1 any
// step and row count (A/B runs).
bool w4a4_takes(const DeviceWeight & w, int64_t rows, bool prompt_step, const DeviceProps & dev);

// One launch path and everything it needs.
struct LaunchPlan {
    Path          path = Path::Generic;
    ScratchPieces scratch;
    // Gemv. MATMUL: row batches of batch_rows[0] rows, the last one of batch_rows[1] (rows % 8
    // beyond 8 rows; 0: none), planned gemv[0] / gemv[1]. MATMUL_ID: gemv[0] over all pairs.
    GemvPlan gemv[2];
    int      batch_rows[2] = {0, 0};
    // Gemm: tile height, K split and grid. MATMUL_ID: grid.x = the tile count the routing may
    // produce (blocks past the built count exit), no K split.
    GemmPlan gemm;
    // MATMUL_ID GEMV: reads its expert ids / converts its activations before its wait
    // (GemvArgs::ids_early, x_early).
    bool ids_early = false;
    bool x_early   = false;

    const GemvPlan & gemv_for(int rows) const { return rows == batch_rows[0] ? gemv[0] : gemv[1]; }
};

// A whole op: the inputs its output overlaps are copied first (ids, then activations), then one
// launch path; or, for a gate/up pair that cannot share a launch (act-order weights read the
// activations in different orders), the gate into y and the up projection into a buffer (up_y)
// one after the other, sharing the rest of the workspace, then y = silu(y) * up.
struct OpPlan {
    size_t     ids_copy = 0;  // bytes
    size_t     x_copy   = 0;
    bool       unfused  = false;
    size_t     up_y     = 0;
    LaunchPlan launch[2];  // [0]: the op's launch (unfused: the gate's); [1]: unfused: the up projection's

    size_t scratch_bytes() const;
};

OpPlan     plan_dense(const Dense & d, const DeviceProps & dev);
OpPlan     plan_moe(const Moe & m, const DeviceProps & dev);
LaunchPlan plan_multi(const Multi & m, const DeviceProps & dev);

// The path of a multi-weight launch over `rows` activation rows: one GEMM over the weights' column
// tiles for prefill rows, else one decode GEMV over their concatenated rows. False when a forced path
// (tuning.h) is neither: then the nodes run one by one.
bool multi_path(int64_t rows, Path & path);

// A weight's format and shape without data, for planning alone (kernel_paths, tests): INT4 in
// groups of `group` (symmetric), FP8 in 128 x 128 blocks.
DeviceWeight weight_shape(WeightFormat f, int64_t n, int64_t k, int32_t group = 128);

// The gate (i = 0) or up (i = 1) projection of a fused pair alone.
Dense half_of(const Dense & d, int i);
Moe   half_of(const Moe & m, int i);

// The name of a planned launch path ("gemv-mma", "gemv-fma", "gemm-f16", "w4a4", "generic"), as
// kernel_paths() reports it.
const char * path_name(const LaunchPlan & p);

// INT4 weights with zero points take the decoder that reads them.
inline int32_t int4_zeros(const DeviceWeight & w) { return w.format == WeightFormat::INT4 && w.zeros != nullptr; }

}  // namespace spark::cuda::mm
