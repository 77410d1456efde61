// Host-side planning shared by the dispatch (matmul.cpp) and the kernel lab (dev/kernels/matmul):
// which weights the chunked kernels take, and how the GEMV splits its work.
#include "backends/cuda/common/arch.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/matmul/matmul.h"
#include "backends/cuda/matmul/tuning.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace spark::cuda::mm {

Overrides & overrides() {
    static Overrides o = [] {
        Overrides   d;
        const char * e = std::getenv("SPARK_MATMUL_PATH");  // A/B runs: force one path (docs/ENVIRONMENT.md)
        const std::string v = e ? e : "";
        d.path = v == "gemv" ? ForcePath::Gemv : v == "gemm" ? ForcePath::Gemm : v == "generic" ? ForcePath::Generic : ForcePath::Auto;
        const char * w = std::getenv("SPARK_W4A4");  // A/B runs on Blackwell GeForce / DGX Spark (docs/SM120.md)
        if (w && *w) d.w4a4 = std::string(w) == "0" ? 0 : 1;
        const char * c = std::getenv("SPARK_GEMV_BW_CAP");  // A/B runs of the GEMV planner on fast devices
        if (c && std::string(c) == "0") d.gemv_bw_cap = 0;
        const char * wv = std::getenv("SPARK_GEMV_WAVE");  // A/B runs of the one-wave variant
        if (wv && std::string(wv) == "0") d.gemv_wave = 0;
        if (wv && std::string(wv) == "2") d.gemv_wave = 2;  // the fused gate/up only
        const char * nm = std::getenv("SPARK_NORM_MATMUL");  // A/B runs of the norm prologue
        if (nm && (std::string(nm) == "0" || std::string(nm) == "2")) d.norm_matmul = nm[0] - '0';
        const char * eg = std::getenv("SPARK_EXPERT_GRID");  // A/B runs of the experts' addresses from the id
        if (eg && std::string(eg) == "0") d.expert_grid = 0;
        const char * cn = std::getenv("SPARK_COMBINE_NORM");  // A/B runs of the combine + norm producer
        if (cn && std::string(cn) == "0") d.combine_norm = 0;
        const char * ec = std::getenv("SPARK_EXPERTS_COMBINE");  // A/B runs of the experts' down + combine
        if (ec && std::string(ec) == "0") d.experts_combine = 0;
        return d;
    }();
    return o;
}

bool gemv_mma_enabled(int cc) {
    static const bool env_on = [] {
        const char * e = std::getenv("SPARK_GEMV_MMA");
        return !(e && std::string(e) == "0");
    }();
    const int forced = overrides().gemv_mma;
    if (forced >= 0) return forced > 0 && cc >= kCcAmpere;
    return env_on && cc >= kCcAmpere;
}

bool gemv_mma_ok(const DeviceWeight & w) {
    if (w.k % 32 != 0) return false;
    if (w.format == WeightFormat::NVFP4) return true;
    if (w.format == WeightFormat::INT4) return w.group_size % kMmaK == 0 || w.group_size >= w.k;
    return false;
}

int elems_per_chunk(WeightFormat f) {
    switch (f) {
        case WeightFormat::F32: return 4;
        case WeightFormat::F16:
        case WeightFormat::BF16: return 8;
        case WeightFormat::FP8: return 16;
        case WeightFormat::NVFP4:
        case WeightFormat::INT4: return 32;
    }
    return 0;
}

bool chunk_ok(const DeviceWeight & w) {
    const int e = elems_per_chunk(w.format);
    if (e == 0 || w.k % e != 0) return false;
    if (w.format == WeightFormat::INT4) return w.group_size % 32 == 0 || w.group_size >= w.k;
    if (w.format == WeightFormat::FP8) return w.block_k % 16 == 0 || w.block_k >= w.k;
    return true;
}

// GEMV work split: a cost model of one launch, minimised over lanes per row (lpr), K-warps per
// block (wk) and K splits across blocks (ksplit). Per SM (the busiest one, blocks spread evenly):
//   bytes      = blocks on it x weight bytes per block (idle lanes load nothing, rows past N do)
//   memory     = bytes / min(DRAM share, bytes in flight / latency); in flight = resident blocks x 256
//                lanes x min(J, depth) steps x U nw loads x 16 B (J: steps per lane)
//   compute    = bytes x elements per byte x instructions per element / issue rate, derated below 16
//                resident warps and by idle lanes
//   time       = latency + max(memory, compute) + a block start when blocks exceed one wave
//                + the K-warp smem reduction + the split-K partial round trip
// The device's bandwidth and issue rate come from GemvOpts (the device's attributes, op_plan.h
// device_rates); the latencies and per-launch costs are an H100's (~1 us loaded DRAM latency, block
// starts, split-K round trips), fitted there. Only the ranking of the candidates matters.
namespace {

struct GemvCost {
    double elem_per_byte;  // weight elements per streamed byte (scales included)
    double ipe;            // instructions per weight element (decode + R FMAs + overhead)
};

GemvCost gemv_cost(WeightFormat f, int r) {
    switch (f) {
        case WeightFormat::F32: return {0.25, 0.3 + r};
        case WeightFormat::F16: return {0.5, 1.2 + r};
        case WeightFormat::BF16: return {0.5, 1.2 + r};
        case WeightFormat::FP8: return {1.0, 2.6 + r};
        case WeightFormat::NVFP4: return {1.78, 2.8 + r};
        case WeightFormat::INT4: return {1.94, 2.7 + r};
    }
    return {1.0, 1.0 + r};
}

// MMA GEMV blocks of `smem` dynamic shared memory bytes that one SM holds: the static shared memory
// needs 1 KB more per block, the driver reserves 1 KB per block (smem_optin + 1 KB per SM) and 512
// bytes more is left for alignment; 0 where one block does not fit.
int64_t gemv_mma_smem_blocks(int smem, int smem_optin) {
    if (smem + 1024 > smem_optin) return 0;
    return (int64_t(smem_optin) + 1024) / (smem + 1024 + 512);
}

// The MMA kernel (gemv_mma_kernels.cuh): the same model over K-warps and K splits, with its own costs: 2 x 16
// rows x 128 K per warp step, ~2 (INT4) / ~2.9 (NVFP4) instructions per weight for any row count up to
// 2 (+0.15 per further 8 B columns), a prologue that splits the block's K range of the activations
// into shared memory (~12 instructions per element and ~0.3 us of latency, partly behind the first
// weight loads; INT4 at one row converts each warp's steps inside its loop instead, GemvMmaWarpSplit:
// the model was not refitted for it), and shared memory that may limit the blocks per SM.
// min_rows > 0 (the norm prologue, GemvOpts): blocks of at least that many rows and no K split only.
GemvPlan plan_gemv_mma(WeightFormat f, const int64_t * mat_n, int n_mats, int64_t K, int64_t jobs, int rows, int nw, int sm_count,
                       int smem_optin, double kBw, double kIssueSm, int min_rows) {
    GemvPlan p;
    p.mma             = true;
    p.lpr             = 0;
    // 3 rows (a verify step of 2 drafts) have a kernel of their own: the 4-row one would convert a
    // fourth, unused activation row in every block.
    p.r_tmpl          = rows <= 1 ? 1 : rows <= 2 ? 2 : rows == 3 ? 3 : rows <= 4 ? 4 : 8;
    const int     R   = p.r_tmpl;
    const int     U   = gemv_mma_tiles(nw);
    const int     T   = U * nw;
    const int     D   = gemv_mma_depth(R);
    const int     NB  = (gemv_mma_parts(R) + 7) / 8;
    const int64_t KB  = std::max<int64_t>(1, ceil_div(K, int64_t(kMmaK)));
    const int64_t sms = std::max(1, sm_count);
    const int     warps = kGemvThreads / 32;
    const double  ipe   = (f == WeightFormat::NVFP4 ? 2.9 : 2.0) + 0.15 * (NB - 1);
    const double  epb   = f == WeightFormat::NVFP4 ? 1.78 : 1.94;  // weights per streamed byte

    // kLatLoaded: DRAM latency under load, fitted to the 8B gate/up plans measured with
    // bench_matmul --sweep on an H100 (one block alone streams ~16 KB/us).
    constexpr double kLat = 1.0, kLatLoaded = 2.0, kBlockStart = 0.5, kPro = 0.3;
    constexpr double kSplitCost = 0.8, kLowOcc = 0.5;

    const int forced = overrides().gemv_ksplit;
    double    best   = 1e300;
    for (const int kp : {0, 1}) {  // kp: one row tile at two K blocks per warp step (nw = 1)
    if (kp && nw != 1) continue;
    if (overrides().gemv_kpair >= 0 && kp != overrides().gemv_kpair) continue;
    for (const int wk : {1, 2, 4, 8}) {
        if (overrides().gemv_wk > 0 && wk != overrides().gemv_wk) continue;
        const int64_t rb = int64_t(warps / wk) * (kp ? 1 : U) * 16;  // rows per block
        if (rb < min_rows) continue;
        int64_t       tiles = 0;
        for (int m = 0; m < n_mats; ++m) tiles += ceil_div(mat_n[m], rb);
        const int64_t per_step = int64_t(wk) << kp;  // K blocks of one step of the block's warps
        const int64_t max_ks   = std::min<int64_t>(64, ceil_div(KB, per_step));
        for (int64_t ks_try = 1; ks_try <= max_ks; ks_try = ks_try < 4 ? ks_try + 1 : ks_try * 2) {
            if (forced > 0 && ks_try != std::min<int64_t>(forced, max_ks)) continue;
            const int64_t cps = ceil_div(ceil_div(KB, ks_try), per_step) * per_step;
            const int64_t ks  = ceil_div(KB, cps);
            if (forced > 0 ? (ks > 1) != (forced > 1 && KB > 1) : ks != ks_try) continue;
            if (min_rows > 0 && ks > 1) continue;
            const int smem = gemv_mma_smem(R, std::min(cps, KB + kp));  // kp: room for the appended zero block
            const int64_t bps = std::min<int64_t>(gemv_mma_min_blocks(R) == 1 ? 1 : 2, gemv_mma_smem_blocks(smem, smem_optin));
            if (bps < 1) continue;
            const int64_t J        = cps / per_step;
            const int64_t blocks   = tiles * ks * jobs;
            const double  lane_eff = double(KB) / double(ks * cps);
            const double  bytes_b  = double(rb) * nw * (double(K) / ks) / epb;  // per block
            const int64_t per_sm   = ceil_div(blocks, sms);
            const int64_t resident = std::min<int64_t>(per_sm, bps);
            const double  bytes    = double(per_sm) * bytes_b;
            // Memory: rounds of the whole GPU's resident slots (sms x bps blocks); a round streams at
            // the device bandwidth or at what its blocks keep in flight, whichever is less - so a
            // last round that fills few slots (a wave tail: 384 blocks over 264 slots) is slow.
            const double  blk_inflight = kGemvThreads * lane_eff * double(std::min<int64_t>(J, D)) * T * 32.0;
            const int64_t slots        = sms * bps;
            const int64_t rounds       = ceil_div(blocks, slots);
            auto          round_us     = [&](int64_t nb) { return double(nb) * bytes_b / std::min(kBw, double(nb) * blk_inflight / kLatLoaded); };
            const double  t_mem        = double(blocks / slots) * round_us(slots) + (blocks % slots ? round_us(blocks % slots) : 0.0);
            const double  issue    = kIssueSm * std::min(1.0, double(resident * warps) / 16.0) * lane_eff;
            const double  t_cmp    = bytes * epb * ipe / issue + double(per_sm) * double(cps * kMmaK * R) * 12.0 / kIssueSm;
            double        t        = kLat + kPro + std::max(t_mem, t_cmp);
            t += kBlockStart * double(rounds - 1);
            if (ks > 1) t += kSplitCost + 0.02 * double(ks);
            t += kLowOcc * (1.0 - std::min(1.0, double(resident * warps) / 16.0));  // MMA chains and loads hide behind other warps
            if (t < best * 0.98) {  // candidates in preference order: fewer splits, fewer K-warps
                best             = t;
                p.wk             = wk;
                p.ksplit         = int(ks);
                p.cps            = cps;
                p.smem           = smem;
                p.mma_kpair      = kp != 0;
                p.rows_per_block = int(rb);
                p.grid           = dim3(unsigned(tiles), unsigned(ks), unsigned(jobs));
            }
        }
    }
    }
    return p;
}

// The one-wave variant at one activation row (matmul.h): no cost model, the rule the H200's sweeps
// gave (docs/PERF.md, "The one-wave gate/up"): the most K-warps (the most, smallest blocks) whose
// grid fits one wave of 3 blocks per SM, each warp at least two steps of K; no K split. A single
// weight takes it only where that grid fills more than two blocks per SM (the sweeps: MiniMax-M2's
// experts' down gained, smaller grids of single weights lost). No plan (grid.x = 0) where no grid
// fits or the shared memory holds fewer than 3 blocks: the cost model's plans of the 2-block kernel.
GemvPlan plan_gemv_mma_wave(int64_t N, int64_t K, int64_t jobs, int nw, int sm_count, int smem_optin) {
    GemvPlan      p;
    const int64_t KB    = std::max<int64_t>(1, ceil_div(K, int64_t(kMmaK)));
    const int64_t slots = int64_t(std::max(1, sm_count)) * kGemvMmaWaveBlocks;
    const int     smem  = gemv_mma_smem(1, KB);
    if (gemv_mma_smem_blocks(smem, smem_optin) < kGemvMmaWaveBlocks) return p;
    for (const int wk : {8, 4, 2, 1}) {
        if (KB < 2 * wk) continue;
        const int     rb     = (kGemvThreads / 32 / wk) * gemv_mma_tiles(nw) * 16;
        const int64_t tiles  = ceil_div(N, int64_t(rb));
        if (tiles * jobs > slots) continue;
        if (nw == 1 && tiles * jobs <= int64_t(std::max(1, sm_count)) * 2) return p;
        p.mma            = true;
        p.mma_wave       = true;
        p.r_tmpl         = 1;
        p.wk             = wk;
        p.ksplit         = 1;
        p.cps            = KB;
        p.smem           = smem;
        p.rows_per_block = rb;
        p.grid           = dim3(unsigned(tiles), 1u, unsigned(jobs));
        return p;
    }
    return p;
}

}  // namespace

GemvPlan plan_experts_combine(int64_t N, int64_t K, int k_slots, int64_t tokens, int sm_count) {
    GemvPlan      p;
    const int64_t KB = std::max<int64_t>(1, ceil_div(K, int64_t(kMmaK)));
    if (k_slots * 32 != kGemvThreads || ceil_div(N, int64_t(16)) * tokens > sm_count) return p;  // (grid.x = 0: no plan)
    p.mma            = true;
    p.lpr            = 0;
    p.r_tmpl         = 1;
    p.wk             = k_slots;
    p.mma_kpair      = true;
    p.cps            = KB + (KB & 1);  // (an even range: room for the zero block of an odd one)
    p.ksplit         = 1;
    p.rows_per_block = 16;
    p.smem           = gemv_mma_smem(1, std::min(p.cps, KB + 1));
    p.grid           = dim3(unsigned(ceil_div(N, int64_t(16))), 1u, unsigned(tokens));
    return p;
}

GemvPlan plan_gemv(WeightFormat f, int64_t N, int64_t K, int64_t jobs, int rows, int nw, int sm_count, const GemvOpts & o) {
    const int64_t   one_n[1] = {N};
    const int64_t * mat_n    = o.n_mats > 1 ? o.mat_n : one_n;
    const int       n_mats   = o.n_mats > 1 ? o.n_mats : 1;
    constexpr double kFittedBw = 3.0e6;  // an H100's, where the latencies and costs were fitted
    const double bw    = o.bw_per_us > 0.0 ? o.bw_per_us : kFittedBw;
    const double issue = o.issue_per_sm_us > 0.0 ? o.issue_per_sm_us : 128 * 1750.0;
    const Overrides & ov = overrides();
    if (o.mma && rows == 1 && n_mats == 1 && !o.norm_prologue && ov.gemv_wave && (nw == 2 || ov.gemv_wave == 1) && ov.gemv_wk == 0 &&
        ov.gemv_ksplit == 0 && ov.gemv_kpair < 0) {
        const GemvPlan w = plan_gemv_mma_wave(N, K, jobs, nw, sm_count, o.smem_optin);
        if (w.grid.x > 0) return w;
    }
    if (o.mma) {
        // The MMA model plans a device faster than the H100 as if it were one. Its memory term asks
        // for the bytes in flight that the bandwidth needs at a fixed loaded latency, so a faster
        // device gets more, smaller blocks (H200: 768 instead of 192 for the 8B gate/up, 4 times
        // the MiniMax-M2 experts' blocks, split K for Qwen3-Next's); but these kernels are held by
        // their own issue and latency (Nsight Compute on the H200: ~46% of the issue slots, ~40%
        // of DRAM), not by bytes in flight, and the extra blocks each re-split the activations. On
        // the H200 the H100's plans measured as fast or faster on every shape swept (docs/PERF.md,
        // "The GEMV planner on the H200": MiniMax-M2 experts gate/up 20.0 against 23.3 us).
        const double bw_mma = ov.gemv_bw_cap ? std::min(bw, kFittedBw) : bw;
        const GemvPlan m =
            plan_gemv_mma(f, mat_n, n_mats, K, jobs, rows, nw, sm_count, o.smem_optin, bw_mma, issue, o.norm_prologue ? kGemvNormMinRows : 0);
        // The norm prologue's taller blocks must still give every SM one (matmul.h, kGemvNormMinRows).
        const bool idle_sms = o.norm_prologue && ov.norm_matmul != 2 && int64_t(m.grid.x) * m.grid.y * m.grid.z < sm_count;
        if (m.grid.x > 0 && !idle_sms) return m;  // else: no split fits the shared memory (or that); the FMA kernel
    }
    GemvPlan p;
    p.r_tmpl          = rows <= 1 ? 1 : rows <= 2 ? 2 : rows == 3 ? 3 : rows <= 4 ? 4 : 8;  // 3: verify steps of 2 drafts
    const int     e   = elems_per_chunk(f);
    const int     U   = gemv_rows_per_warp(p.r_tmpl, nw, e);
    const int     D   = gemv_depth(p.r_tmpl, nw, e);
    const int     bps = gemv_min_blocks(p.r_tmpl, f);
    const int64_t KC  = std::max<int64_t>(1, K / e);
    const int64_t sms = std::max(1, sm_count);
    const int     warps = kGemvThreads / 32;
    const GemvCost cost = gemv_cost(f, p.r_tmpl);

    constexpr double kLat = 1.0, kBlockStart = 0.5;
    const double     kBwSm = bw / double(sms), kIssueSm = issue;
    constexpr double kSplitCost = 0.8, kWkCost = 0.05;

    const int forced = overrides().gemv_ksplit;
    double    best   = 1e300;
    for (const int lpr : {32, 16, 8}) {
        if (overrides().gemv_lpr > 0 && lpr != overrides().gemv_lpr) continue;
        for (const int wk : {1, 2, 4, 8}) {
            if (overrides().gemv_wk > 0 && wk != overrides().gemv_wk) continue;
            const int64_t rb = int64_t(warps / wk) * (32 / lpr) * U;  // rows per block
            int64_t       tiles = 0;
            for (int m = 0; m < n_mats; ++m) tiles += ceil_div(mat_n[m], rb);
            const int64_t stride = int64_t(lpr) * wk;
            const int64_t max_ks = std::min<int64_t>(64, ceil_div(KC, stride));
            for (int64_t ks_try = 1; ks_try <= max_ks; ks_try = ks_try < 4 ? ks_try + 1 : ks_try * 2) {
                if (forced > 0 && ks_try != std::min<int64_t>(forced, max_ks)) continue;
                const int64_t cps = ceil_div(ceil_div(KC, ks_try), stride) * stride;
                const int64_t ks  = ceil_div(KC, cps);
                if (forced > 0 ? (ks > 1) != (forced > 1 && KC > 8) : ks != ks_try) continue;  // forced: split iff asked (as far as K allows)
                const int64_t J        = cps / stride;
                const int64_t blocks   = tiles * ks * jobs;
                const double  lane_eff = double(KC) / double(ks * cps);
                const double  bytes_b  = double(rb) * nw * (double(KC) / ks) * 16.0;  // per block
                const int64_t per_sm   = ceil_div(blocks, sms);
                const int64_t resident = std::min<int64_t>(per_sm, bps);
                const double  bytes    = double(per_sm) * bytes_b;
                const double  inflight = double(resident) * kGemvThreads * lane_eff * double(std::min<int64_t>(J, D)) * U * nw * 16.0;
                const double  t_mem    = bytes / std::min(kBwSm, inflight / kLat);
                const double  issue    = kIssueSm * std::min(1.0, double(resident * warps) / 16.0) * lane_eff;
                const double  t_cmp    = bytes * cost.elem_per_byte * cost.ipe / issue;
                double        t        = kLat + std::max(t_mem, t_cmp);
                if (blocks > sms * bps) t += kBlockStart;
                if (wk > 1) t += kWkCost;
                if (ks > 1) t += kSplitCost + 0.02 * double(ks);
                if (t < best * 0.98) {  // candidates in preference order: fewer splits, fewer K-warps, wider rows
                    best     = t;
                    p.wk     = wk;
                    p.lpr    = lpr;
                    p.ksplit = int(ks);
                    p.cps    = cps;
                    p.rows_per_block = int(rb);
                    p.grid   = dim3(unsigned(tiles), unsigned(ks), unsigned(jobs));
                }
            }
        }
    }
    // Unrestricted, ks = 1 always fits; only the lab's plan restrictions can leave nothing.
    if (p.grid.x == 0 && overrides().gemv_wk == 0 && overrides().gemv_lpr == 0)
        fail(SPARK_ERR_INTERNAL, "matmul: no decode GEMV plan for N %lld, K %lld", (long long) N, (long long) K);
    return p;
}

// GEMM K split. The tiles of a prefill projection often leave SMs idle or end in a ragged last wave:
// Qwen3-8B's q, o and down projections at 512 rows are 128 tiles of 128 x 128 on 132 SMs that hold 2
// blocks each, so every SM runs one block, alone. Splitting K multiplies the blocks. Model, in K
// stages at the full rate of an SM: each SM gets ceil(units / SMs) units of kt_per_split stages, run
// bps at a time at the full rate, a remainder of r < bps at rate(r); a split unit adds its partial's
// round trip and the tile's reduction (kSplitUnit). Fitted to bench_matmul --gemm-sweep on an H100
// (INT4, 128-row tiles): a stage takes 1.29 us for each of two co-resident blocks and 0.90 us for a
// block alone (rate(1) = 0.72), a split unit ~6 us (~9 stages of the full-rate SM). Ties go to fewer
// splits.
GemmPlan plan_gemm(int64_t rows, int64_t tiles_n, int64_t K, int sm_count) {
    GemmPlan p;
    p.mt                    = rows <= 64 ? 1 : 4;
    const int64_t tiles_m   = ceil_div(rows, int64_t(gemm_bm(p.mt)));
    const int64_t KT        = std::max<int64_t>(1, K / kGemmBK);
    const int64_t tiles     = tiles_m * tiles_n;
    const int64_t sms       = std::max(1, sm_count);
    const int     bps       = gemm_min_blocks(p.mt);
    auto          rate      = [&](int64_t k) { return k >= bps ? 1.0 : 0.72 + 0.28 * double(k - 1) / double(bps - 1); };
    constexpr double  kSplitUnit     = 9.0;
    constexpr int64_t kMinStages     = 8;                      // K of 256 per split at least: the pipeline fills
    constexpr int64_t kMaxSplit      = 8;
    constexpr double  kMaxPartialMiB = 64.0;                   // workspace bound of the partials
    const int         forced         = overrides().gemm_ksplit;
    double            best           = 1e300;
    p.kt_per_split                   = KT;  // (a forced split K does not allow stays 1)
    for (int64_t s_try = 1; s_try <= kMaxSplit; ++s_try) {
        const int64_t per = ceil_div(KT, s_try);
        const int64_t s   = ceil_div(KT, per);
        if (s != s_try) continue;  // (that split count leaves an empty split; a smaller one covers it)
        if (forced > 0) {
            if (s != std::min<int64_t>(forced, KT)) continue;
        } else if (s > 1 && (per < kMinStages ||
                             double(tiles * s * gemm_partial_floats(p.mt)) * 4.0 > kMaxPartialMiB * 1048576.0)) {
            continue;
        }
        const int64_t units  = tiles * s;
        const int64_t per_sm = ceil_div(units, sms);
        const int64_t full = per_sm / bps, rem = per_sm % bps;
        double        t    = double(full * bps * per) / rate(bps) + (rem ? double(rem * per) / rate(rem) : 0.0);
        if (s > 1) t += kSplitUnit * double(per_sm);
        if (t < best * 0.97) {
            best           = t;
            p.ksplit       = int(s);
            p.kt_per_split = per;
        }
    }
    p.grid = dim3(unsigned(tiles_m), unsigned(tiles_n), unsigned(p.ksplit));
    return p;
}

}  // namespace spark::cuda::mm
