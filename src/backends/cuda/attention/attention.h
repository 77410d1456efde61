// Paged-KV causal GQA attention on CUDA: parameters, tile configurations and launch planning (plain
// host C++; the kernels are in attention_kernels.cuh). op_attention (attention_op.cpp) validates a
// graph node, fills AttnParams and calls launch_attention; the kernel lab in dev/kernels/attention
// drives the same entry points directly.
//
// Kernels of one step:
//   decode (T <= kDecodeMaxTokens): ONE launch, the fused decode kernel, which also appends this
//      step's k, v to the cache (below); with more than one split its blocks combine their partial
//      softmax states themselves (the last block of each (row group, KV head) column). A second
//      launch, the combine kernel, only when no arrival counters are available (launch_decode:
//      graph capture on a stream that never ran an eager decode step, or more columns than the
//      counter buffer holds) or with SPARK_ATTN_COMBINE=0.
//   prefill (larger T): the append kernel, then the prefill kernel.
// Decode steps of a Qwen3 layer also fold the q / k RMSNorm + RoPE before the attention into the
// decode kernel (NormRope below): q and k then arrive as the norms' inputs.
// The append rounds this step's k, v (f32) to f16 (IEEE half, round to nearest even, saturating at
// +-65504) and writes them at (seq[t], pos[t]) of the cache; the decode kernel does the same
// conversion, so the cache and the outputs are bit-identical between the two ways.
// Launches use programmatic dependent launch on sm_90+ (pdl.cuh; SPARK_PDL=0 turns it off): a
// kernel waits for the previous one before its first global memory access; the combine, append and
// prefill kernels let the next kernel launch at once, the decode kernel once its first K/V tiles
// are requested (below).
//
// The cache is FP16, not BF16: 3 more mantissa bits (unit roundoff 2^-11 instead of 2^-8, so the
// rounding of K and V is 8x smaller), which the whole-model golden checks need. K is RMS-normed and
// V a projection output, so f16's range (65504) is not a concern; the append saturates anyway.
//
// Decode (flash-decoding, split-KV, GQA-grouped, tensor cores): grid (row groups, n_splits, n_kv).
// A "row" is a (token, query head) pair of one KV head: row R = t * group + j is query head
// kv * group + j of token t, so one block holds 16 rows = all query heads that share the KV head
// (group <= 16) for as many tokens as fit; every K/V element a block loads serves all its rows.
// Tokens of one block may belong to different sequences: the block walks the runs of equal seq[t]
// (tokens of a sequence are contiguous in a step) and masks the rows of other runs. For each run,
// the KV range 0 .. L-1 (L = the run's largest position + 1, read on the device) is cut into
// n_splits chunks (a multiple of the tile, at least kMinChunk positions); block y takes chunk y and
// exits at once when the chunk starts past L. n_splits depends only on shapes (max_pages, T,
// head counts) and the SM count, never on device data, so a decode step can be captured into a CUDA
// graph and replayed with new positions.
//   This step's k, v (the fused append): positions of this step's tokens are not read from the
// cache (its block may not have written them yet); every working block converts this step's k and
// v rows of its KV head to the cache's f16 in its prologue and the tile loader copies them into the
// tile instead (the tokens of the run's sequence anywhere in the step, not only the block's own, so
// token t sees tokens < t of the same sequence), and exactly one block per
// (token, KV head) stores them to the cache: the block of the token's first row (row group
// t * group / 16) whose chunk holds the position. Positions whose page is invalid are neither
// stored nor substituted (read as zeros, as before with the separate append).
//   Results: when only split 0 has positions (L <= chunk: short contexts, or n_splits = 1) it
// writes the final output and the other splits exit at once. Otherwise splits 0 .. n_active-1
// write partial (m, l, O) to the workspace, fence, and count themselves on the column's arrival
// counter; the last one reads every split's partial in split order (deterministic whichever block
// is last), writes the output and resets the counter to 0 for the next launch. The counters live
// in a zeroed per-(device, stream) buffer (decode_counters) that is always 0 between launches.
// That block reads the splits' (m, l) pairs (a warp's rows all at once, 64 splits a request) and
// n_active x (its valid rows) x D partial floats (float4, 8 loads in flight per thread): ~4 KB per
// split for Qwen3-30B-A3B at T = 1.
//   The prologue is short because every round trip of it is on the step's critical path: split 0
// (which always has work) requests its q rows and this step's k / v rows before the token metadata,
// and the first tile's page is requested before the rows' arithmetic. The next kernel (a GEMV,
// whose weight loads start as soon as it launches) may launch only once the first tiles are
// requested: streaming beside this chain of round trips, it slowed each of them.
//   Short contexts (AttnPlan::short_ctx: one token, one row group): a step whose KV length L is at
// most 256 positions (192 at head_dim 256) takes the short path, chosen on the device from L so that
// one captured graph serves every context. Block (0, y, kvh) with y < group takes query head kvh *
// group + y alone (the plan gives the column at least `group` blocks; the others exit). It walks L
// in chunks of 128 positions (64 at head_dim 256: what the K/V stages hold): thread i requests
// position i's K and V rows with one cp.async each 16 bytes (one round trip for the chunk, where the
// long path walks 64-position tiles and a 16-row block scores and weights with two barriers per
// tile), scores its position in f32 from q in shared memory; a barrier gives the chunk's maximum, a
// second the sum, and thread d adds P V for its dims (an online softmax across chunks). Block 0 of
// the column stores this step's k and v. `group` blocks read the same K/V rows (L2 serves all but
// the first); a chunk costs ~35 ns a position (measured; as if the block's one SM read its 512 bytes
// a position at ~15 GB/s), so past two chunks the long path's splits are faster. At 16 positions the kernel takes half the long
// path's time (docs/PERF.md, "The short decode path"). SPARK_ATTN_SHORT=0 turns it off (=N: up to
// N chunks, for measurements).
//   Inside a block, 4 warps share a cp.async pipeline of K/V tiles (one tile never crosses a
// page); for each tile each warp scores kN/4 positions for all 16 rows (mma m16n8k16 f16), the
// block agrees on the running row maxima through shared memory, then each warp accumulates O for
// its D/4 output dims over all kN positions. Q and P enter the tensor cores as f16 hi + lo pairs
// (x = hi + lo, two mma each), so the products are accurate to ~2^-22 and the only f16 rounding of
// consequence is that of the cache itself. Decode is memory-bound; the extra mma cost nothing
// measurable.
//
// f16 range of the operands (both kernels). f16 overflows at 65520 and goes subnormal below 2^-14,
// where a value (or the lo half of a pair) loses its bits. So:
//   Q: each row x = q * scale_log2 is multiplied by a power of two s chosen from its largest
//      magnitude (q_row_scale: max |x * s| in [2^14, 2^15)), whatever |q| is (30, 1e6, 1e-4);
//      the scores come out of the mma times s and are multiplied by 1/s (exact) before the softmax.
//   P: exp2(S - m) is in [0, 1]; it is computed times kPScale = 2^14 (P in [0, 2^14]: hi + lo
//      keep ~22 bits down to P = 2^-17, absolute error 2^-39 below). The row sums l carry the same
//      factor, so O / l (and the combine of the splits, which weighs O and l alike) is unchanged.
// Products of these with K, V (|k|, |v| <= 65504) and their sums stay far inside f32's range
// (scores < 2^40, O < 2^30 * positions).
//
// Prefill (flash-attention 2 style): grid (ceil(T * group / 64), n_kv), 4 warps x 16 rows each,
// KV tiles of kN positions through single K and V buffers (the V load overlaps the scores, the next
// K load overlaps P V). Q and P are single f16 (as flash-attention; scaled as above), accumulation
// and softmax in f32. A warp skips the tiles past its rows' positions (causal).
#pragma once

#include "backends/cuda/common/rope_freqs.h"

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace spark::cuda::attn {

// Decode only: q and k are the inputs of the per-head RMS_NORM + ROPE the graph applies to them (a
// Qwen3 layer's q / k norms; fusion.cpp, op_attention_norm_rope), and the decode kernel normalises
// and rotates each q row and this step's k rows itself, with the rope kernel's arithmetic
// (common/rope.cuh), so those ops cost no launch of their own (each launch is a dependency: ~2.2 us
// of a decode step's critical path on an H100 / H200, docs/PERF.md). Every head_dim dim rotates
// (n_rot = head_dim); the frequency table is the kernel's second parameter (launch_attention).
struct NormRope {
    bool          on  = false;
    const float * q_w = nullptr;  // the norms' weights [head_dim] (nullptr: none)
    const float * k_w = nullptr;
    float         eps = 0.0f;
    bool          zc  = false;  // zero-centred weights: times (1 + w)
};

struct AttnParams {
    // q [D, n_head, T], k, v [D, n_kv, T]: f32, contiguous along D, byte strides for heads / tokens.
    const char * q = nullptr;
    int64_t      q_nb1 = 0, q_nb2 = 0;
    const char * k = nullptr;
    int64_t      k_nb1 = 0, k_nb2 = 0;
    const char * v = nullptr;
    int64_t      v_nb1 = 0, v_nb2 = 0;
    // f16 bits, [n_pages][page_size][n_kv * D] each.
    uint16_t * k_cache = nullptr;
    uint16_t * v_cache = nullptr;
    const int32_t * pos = nullptr;          // [T]
    const int32_t * seq = nullptr;          // [T]
    const int32_t * block_table = nullptr;  // [n_slots][max_pages]
    float *         out = nullptr;          // [D * n_head, T], row stride out_nb1 bytes
    int64_t         out_nb1 = 0;
    float *         part_o  = nullptr;  // decode workspace: [n_splits][T * n_head][D]
    float *         part_ml = nullptr;  //                   [n_splits][T * n_head][2] (max, sum * kPScale)
    // Decode arrival counters, [n_kv][row groups], 0 before and after every launch (n_splits > 1).
    // nullptr: the partials are merged by the separate combine kernel instead.
    uint32_t *      counters = nullptr;
    int   n_tok = 0, n_head = 0, n_kv = 0, group = 0, head_dim = 0;
    int   page_size = 0, n_pages = 0, max_pages = 0, n_slots = 0;
    int   n_splits = 1;
    // The short decode path (AttnPlan::short_ctx; 0: off): a step of one token whose KV length L is at
    // most this takes it (decided on the device, from L).
    int   short_ctx = 0;
    float scale_log2 = 0.0f;  // softmax scale * log2(e): scores are kept in the log2 domain
    NormRope norm_rope;       // decode only (above)
};

constexpr int kDecodeMaxTokens = 8;   // T above this takes the prefill kernel
constexpr int kMinChunk        = 128;  // smallest KV chunk of one decode split (positions)
constexpr int kThreads         = 128;  // every attention kernel: 4 warps
constexpr float kPScale        = 16384.0f;  // 2^14: P = exp2(S - m) enters the tensor cores times this
constexpr int   kQScaleExp     = 15;        // Q rows are scaled to max |x| in [2^(kQScaleExp-1), 2^kQScaleExp)

// Tile configuration of the decode kernel for head_dim D (shared-memory offsets in bytes).
template <int D> struct DecodeCfg {
    static constexpr int kN      = D <= 128 ? 64 : 32;  // KV positions per tile
    static constexpr int kStages = D <= 64 ? 4 : 2;     // cp.async pipeline depth
    static constexpr int kRows   = 16;                  // (token, head) rows per block
    static constexpr int kStr    = D + 8;   // smem row stride of Q, K, V (f16 elements; 16 B pad: no bank conflicts)
    static constexpr int kPStr   = kN + 8;  // smem row stride of P
    static constexpr int kPW     = kN / 4;  // positions per warp in the score phase
    static constexpr int kDW     = D / 4;   // output dims per warp in the P V phase
    static constexpr int kQBytes    = kRows * kStr * 2;
    static constexpr int kTileBytes = kN * kStr * 2;
    static constexpr int kPBytes    = kRows * kPStr * 2;
    static constexpr int kOffQhi = 0;
    static constexpr int kOffQlo = kOffQhi + kQBytes;
    static constexpr int kOffKV  = kOffQlo + kQBytes;  // stage s: K at s * 2 tiles, V right after
    static constexpr int kOffPhi = kOffKV + kStages * 2 * kTileBytes;
    static constexpr int kOffPlo = kOffPhi + kPBytes;
    static constexpr int kOffRed = kOffPlo + kPBytes;           // f32 red_max[4][16], red_sum[4][16]
    static constexpr int kOffTok = kOffRed + 2 * 4 * kRows * 4;  // i32 pos[16], seq[16]
    static constexpr int kOffQInv = kOffTok + 2 * kRows * 4;     // f32 q_inv[16] (1 / the rows' Q scales)
    static constexpr int kOffFlag = kOffQInv + kRows * 4;        // i32 flag[4] (last block of the column)
    static constexpr int kFStr    = D + 8;                        // this step's k rows and v rows as
    static constexpr int kOffFresh = kOffFlag + 16;               // f16 [kDecodeMaxTokens][kFStr] each
    static constexpr int kOffFreshV = kOffFresh + kDecodeMaxTokens * kFStr * 2;
    static constexpr int kSmem    = kOffFreshV + kDecodeMaxTokens * kFStr * 2;
    static_assert(D % 64 == 0 && kPW % 8 == 0 && kDW % 16 == 0 && kN % 16 == 0, "decode tile shape");
    // The in-kernel combine keeps its split weights [16 rows][n_splits <= 1024] f32 in the K/V stages.
    static_assert(kStages * 2 * kTileBytes >= kRows * 1024 * 4, "combine weights fit the K/V stages");
    static_assert(kDecodeMaxTokens <= kRows, "all of a step's tokens fit the token arrays");
    static_assert(kQBytes % 16 == 0 && kTileBytes % 16 == 0 && kPBytes % 16 == 0, "16-byte aligned smem");
    // The short path (attention.h, "Short contexts"): every position's K and V row at once in the
    // K/V stages (thread i scores position i), q as f32 in Q's place, P as f32 in P's.
    static constexpr int kShort = kStages * kN < kThreads ? kStages * kN : kThreads;
    static_assert(2 * kShort * kStr * 2 <= kStages * 2 * kTileBytes && D * 4 <= kQBytes && kShort * 4 <= kPBytes,
                  "the short path fits the decode kernel's shared memory");
};

// Tile configuration of the prefill kernel.
template <int D> struct PrefillCfg {
    static constexpr int kN    = D <= 128 ? 64 : 32;
    static constexpr int kRows = 64;  // 4 warps x 16 rows
    static constexpr int kStr  = D + 8;
    static constexpr int kQBytes    = kRows * kStr * 2;
    static constexpr int kTileBytes = kN * kStr * 2;
    static constexpr int kOffQ   = 0;
    static constexpr int kOffK   = kOffQ + kQBytes;
    static constexpr int kOffV   = kOffK + kTileBytes;
    static constexpr int kOffTok  = kOffV + kTileBytes;        // i32 pos[64], seq[64]
    static constexpr int kOffQInv = kOffTok + 2 * kRows * 4;  // f32 q_inv[64]
    static constexpr int kSmem    = kOffQInv + kRows * 4;
    static_assert(D % 64 == 0 && kN % 16 == 0, "prefill tile shape");
};

enum class AttnPath { Decode, Prefill };

struct AttnPlan {
    AttnPath path     = AttnPath::Decode;
    int      n_splits = 1;
    int      grid_x = 1, grid_y = 1, grid_z = 1;  // of the decode / prefill kernel
    int      smem     = 0;                        // dynamic shared memory of that kernel
    size_t   workspace_bytes = 0;                 // decode partials (n_splits > 1)
    int      short_ctx = 0;                       // decode: AttnParams::short_ctx (0: no short path)
};

inline bool head_dim_supported(int d) { return d == 64 || d == 128 || d == 256; }

// Shared memory of the decode / prefill kernel for head_dim d (0: unsupported).
inline int decode_smem(int d) {
    return d == 64 ? DecodeCfg<64>::kSmem : d == 128 ? DecodeCfg<128>::kSmem : d == 256 ? DecodeCfg<256>::kSmem : 0;
}
inline int prefill_smem(int d) {
    return d == 64 ? PrefillCfg<64>::kSmem : d == 128 ? PrefillCfg<128>::kSmem : d == 256 ? PrefillCfg<256>::kSmem : 0;
}
inline int decode_tile(int d) { return d <= 128 ? 64 : 32; }
// The short path's chunk (positions) and the longest context it takes (attention.h, "Short
// contexts"): 2 chunks of 128 positions, 3 of 64 at head_dim 256, where the H200 measured the long
// path level (docs/PERF.md, "The short decode path").
inline int decode_short_chunk(int d) {
    return d == 64 ? DecodeCfg<64>::kShort : d == 128 ? DecodeCfg<128>::kShort : d == 256 ? DecodeCfg<256>::kShort : 0;
}
inline int decode_short_ctx(int d) { return (d == 256 ? 3 : 2) * decode_short_chunk(d); }
// AttnParams::short_ctx of a launch of `plan` (short_ctx: the plan's, or a measurement's override):
// none where the separate combine kernel merges the splits (no arrival counters), since it reads
// the partials of every split, which the short path does not write.
inline int decode_short_ctx_with(const AttnPlan & plan, bool counters, int short_ctx) {
    return plan.n_splits > 1 && !counters ? 0 : short_ctx;
}
inline int prefill_tile(int d) { return d <= 128 ? 64 : 32; }

// The launch configuration from shapes only (graph-capture safe). The split count aims at one wave
// of resident decode blocks (sm_count x blocks_per_sm) when the sequence is long enough to fill it.
inline AttnPlan plan_attention(int head_dim, int n_tok, int n_head, int n_kv, int max_pages, int page_size, int sm_count,
                               int blocks_per_sm = 2) {
    AttnPlan    p;
    const int   group  = n_head / n_kv;
    const int64_t rows = int64_t(n_tok) * group;  // rows per KV head
    if (n_tok <= kDecodeMaxTokens) {
        p.path                   = AttnPath::Decode;
        const int64_t n_rg       = (rows + 15) / 16;
        const int64_t per_split  = n_rg * n_kv;
        const int64_t target     = int64_t(blocks_per_sm > 0 ? blocks_per_sm : 1) * (sm_count > 0 ? sm_count : 1);
        const int64_t max_ctx    = int64_t(max_pages) * page_size;
        const int64_t max_useful = (max_ctx + kMinChunk - 1) / kMinChunk;
        int64_t       n_splits   = (target + per_split - 1) / per_split;
        if (n_splits > max_useful) n_splits = max_useful;
        if (n_splits < 1) n_splits = 1;
        if (n_splits > 1024) n_splits = 1024;
        p.n_splits = int(n_splits);
        p.grid_x   = int(n_rg);
        p.grid_y   = p.n_splits;
        // One token, one row group: the short path's block y takes query head y of its KV head, so
        // the column has at least `group` blocks (those past n_splits exit on the long path).
        if (n_tok == 1 && group <= 16) {
            p.short_ctx = decode_short_ctx(head_dim);
            if (p.grid_y < group) p.grid_y = group;
        }
        p.grid_z   = n_kv;
        p.smem     = decode_smem(head_dim);
        if (p.n_splits > 1)
            p.workspace_bytes = size_t(p.n_splits) * size_t(n_tok) * size_t(n_head) * (size_t(head_dim) + 2) * sizeof(float);
    } else {
        p.path   = AttnPath::Prefill;
        p.grid_x = int((rows + 63) / 64);
        p.grid_y = n_kv;
        p.grid_z = 1;
        p.smem   = prefill_smem(head_dim);
    }
    return p;
}

// The decode split chunk for a run of KV length L (positions; a multiple of the tile kN, at least
// kMinChunk) and how many splits have positions in it (split y covers [y * chunk, (y+1) * chunk)
// clipped to L; split 0 counts even when L = 0: it writes the zero output).
constexpr int decode_chunk(int L, int n_splits, int kN) {
    int chunk = (L + n_splits - 1) / n_splits;
    chunk     = (chunk + kN - 1) / kN * kN;
    return chunk > kMinChunk ? chunk : kMinChunk;
}
constexpr int decode_active_splits(int L, int chunk) { return L > 0 ? (L + chunk - 1) / chunk : 1; }

// Enqueues the step on `stream`: the fused decode kernel (plus the combine kernel only without
// arrival counters), or append + prefill. `p` must have head_dim supported and, for decode with
// plan.n_splits > 1, part_o / part_ml pointing into plan.workspace_bytes of scratch (part_ml right
// after the n_splits * T * n_head * D floats of part_o); p.counters is filled in by launch_decode.
// With p.norm_rope.on (decode only) `freqs` is the rotation's table (rope_freqs(theta, head_dim)).
// Throws spark::Error.
void launch_attention(const AttnParams & p, const AttnPlan & plan, cudaStream_t stream, const RopeFreqs * freqs = nullptr);

// Resident decode blocks per SM on the current device for head_dim d (occupancy query, cached per
// device; at least 1).
int decode_blocks_per_sm(int head_dim);

// The decode arrival counters of `stream` on the current device: a zeroed buffer of at least
// `count` u32, allocated (cudaMalloc + cudaMemsetAsync on the stream) on first use and kept for the
// process; nullptr when count exceeds its size or when it would have to be allocated during graph
// capture (the caller then falls back to the combine kernel).
uint32_t * decode_counters(cudaStream_t stream, int64_t count);

// The pieces (attention_decode.cu / attention_prefill.cu). launch_decode fills p.counters (and
// launches the combine kernel when it has none); the decode kernel appends this step's k, v itself.
void launch_append(const AttnParams & p, cudaStream_t stream);
void launch_decode(const AttnParams & p, const AttnPlan & plan, cudaStream_t stream, const RopeFreqs * freqs = nullptr);
void launch_prefill(const AttnParams & p, const AttnPlan & plan, cudaStream_t stream);

}  // namespace spark::cuda::attn
