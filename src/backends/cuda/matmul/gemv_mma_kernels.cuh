// Decode GEMV on the tensor cores (1..8 activation rows; INT4 with groups of a multiple of 128 or
// one group per row, NVFP4). The FMA kernel (gemv_kernels.cuh) spends ~3.8 instructions per INT4 weight
// (decode to f32, then one FMA per weight and activation row). Here the decode makes f16 MMA operands
// (INT4: 8 nibbles -> four f16x2 with one SHF, four LOP3 and four HSUB2/HFMA2, 1.1 per weight; NVFP4
// 2 per weight with its block scale folded in), an mma.sync m16n8k16 takes 256 weights of a warp,
// and the activation rows are the MMA's columns: 1-2 rows cost the same, 3-8 rows 2-3 MMAs per
// fragment instead of one. sm_90a SASS of the main loop: ~2.3 (INT4) / ~2.9 (NVFP4) instructions per
// weight, all included.
//
// Exactness. The products are the exactly dequantized weights times the f32 activations, summed in
// f32:
//   weights   INT4: q - zero is an integer in [-16, 15], exact in f16 ((1024 + q) - (1024 + zero),
//             all three exact). The group scale multiplies the f32 partial sum of each 128-K block
//             (one rounding, as the FMA kernel does per group).
//             NVFP4: e2m1 * e4m3 has at most 2 + 4 significant bits and lies in [2^-10, 2688]:
//             (e2m1 * 2^-14) * (e4m3 * 2^7) is exact in f16 (at most 21, a multiple of 2^-17 >=
//             2^-24), so the block scale is inside the weight operand; global * 2^7 multiplies the
//             sum at the end (the reference rounds f32(e4m3) * global once per block: the two differ
//             by a relative 2^-24 per weight, a reassociation).
//   x         every 128-K block of every activation row r gets a power of two s (max |x| s in
//             [2^14, 2^15) over the block) and x s is split into two f16: hi = f16(x s) and
//             lo = f16(x s - hi) (the subtraction is exact in f32). hi + lo holds the 22 leading
//             significant bits of x s: |hi + lo - x s| <= 2^-23 |x s| (lo is rounded to nearest at
//             11 bits of a remainder below 2^-11 |x s|), i.e. the activations enter at 22 bits
//             instead of f32's 24, an error of the order of one f32 rounding of the element and
//             far below the f32 rounding of the K-long sums (a third part would give the last two
//             bits exactly but cost a third more B columns: 3 rows would take 2 MMAs per fragment
//             instead of 1, and a verify step of 3-4 rows is where speculative decoding needs this
//             kernel to cost no more than one row). Elements more than 2^15 below their block's
//             maximum also lose their bits below 2^-24 / s (the f16 quantum): |error| <= 2^-25 / s
//             <= 2^-39 max_block |x|, harmless. Non-finite x: hi = x, lo = 0 (inf and NaN propagate
//             as in f32). Each activation row's columns are its own: a row's result does not depend
//             on the other rows of the step.
//   MMA       B has one column per (activation row r, part): 2r, 2r + 1. f16 x f16 products
//             (11 x 11 significant bits) are exact in the tensor core; it adds the 16 products and
//             the accumulator with at least f32 precision (Hopper: aligned to the largest term and
//             truncated, >= 24 fraction bits: <= 2^-23 of the largest term per MMA, biased towards
//             zero). So that the truncation bias cannot accumulate, a chain is only the 8 MMAs of one
//             128-K block: each block's partial (per column) goes into an f32 accumulator with an
//             ordinary rounded FFMA, acc += (1 / s) * (scale * partial). Relative error per block
//             partial <= 8 * 2^-23 of its largest term; the 32 partials of K = 4096 add in f32 as the
//             FMA kernel's groups do. Measured on the emulator with a pessimistic truncation model
//             (dev/kernels/matmul/emu_gemv.cpp): nmse <= 1e-13 against a double reference, as the
//             FMA kernel's (tests allow 1e-10).
//   result    y = sum hi + sum lo (NVFP4: times global * 2^7).
//
// Work mapping. A warp owns T = 2 tiles of 16 weight rows (two row tiles of one weight, the gate and
// up tiles of the same rows, or - kp, one weight - one row tile at two consecutive 128-K blocks: half
// the rows per block, twice the blocks, for the smaller matrices) and walks its K range one step (one
// 128-K block of each tile) at a time. Lane (g = lane / 4, q = lane % 4) loads 16-byte chunk q of the
// block of rows g and g + 8: the chunk's 4 words x 8 nibbles are the A fragments of the block's 8
// MMAs (word i -> MMAs 2i and 2i + 1; an f16x2 holds nibbles j and j + 4, so the MMA's k order is a
// permutation of K, and B is written in the same permutation). Warps split K within a block (wk),
// blocks across the grid (gridDim.y); plan_gemv picks kp, wk and the split.
//
// Activations. At its start a block converts its K range of the R rows into the B fragments in
// shared memory (one pass: half a warp per 128-K block finds the block's maximum by shuffles, scales,
// splits and stores), with 1 / s per block and column after them; the main loop reads B with
// conflict-free LDS.128 (lane (g, q): column g, chunk q). The weight loads of the first steps are
// issued before (and before waiting for the previous kernel under PDL), so the conversion overlaps
// their latency. INT4 at one row on the 2-step ring instead: each warp converts only its own steps'
// blocks, one step at a time inside the main loop (GemvMmaWarpSplit), so that no MMA waits for the
// whole block's split. A MATMUL_ID whose activations are known complete when it starts (the experts'
// gate/up: written before the router GEMV, GemvArgs::x_early) converts them (or loads its warps'
// first steps) before its wait, while the routing still runs; it then waits for its expert ids, reads
// them and requests its weights (the XE instantiations).
//
// Pipeline: a register ring of D steps (T tiles x 2 x 16 bytes of weights + scales per lane per
// step), as the FMA kernel. WAVE (one activation row, GemvPlan::mma_wave): D = 1 and 3
// blocks per SM instead of 2 and 2 (matmul.h, kGemvMmaWaveBlocks): more warps to hide the latency.
//
// Reduction, all in fixed orders (deterministic): each warp writes its accumulators (per row and
// column) to shared memory; one thread per (row, activation row) sums the K-warps in order and the
// parts as hi + lo; K split across blocks: partials and the last block's reduction
// (gemv_splitk_finish), as the FMA kernel.
#pragma once

#include "backends/cuda/common/step_trace.cuh"
#include "backends/cuda/matmul/gemv_kernels.cuh"

namespace spark::cuda::mm {

// ---- decoders ------------------------------------------------------------------------------------
// Interface (all __device__):
//   kScaled                      the K-block partial is multiplied by factor(cst, h) (INT4 group scale)
//   Wt   prep(w)                 per-weight constants
//   Row  row(w, wt, n0, n1)      scale offsets of rows n0 (g) and n1 (g + 8)
//   Sc   load_scale(w, wt, row, b, c, chunk_ok, block_ok)  raw scale bits of 128-K block b (chunk c
//                                of this lane; chunk_ok: the chunk is inside K, block_ok: the block is
//                                inside the block's range), loaded with the weights
//   Cst  cst(wt, sc)             decoded constants of the block
//   decode(word, cst, h, i, v)   word i of the chunk of row half h -> four f16x2 (nibbles (j, j+4))
//   factor(cst, h)               f32 multiplier of the block partial of row half h (kScaled)
//   final_factor(w)              multiplier of the whole sum (NVFP4: global * 2^7)

template <bool kAsym>
struct MmaInt4 {
    static constexpr WeightFormat kFormat = WeightFormat::INT4;
    static constexpr bool         kScaled = true;
    struct Wt {
        ChunkDiv         grp;  // 128-K block -> group
        bool             bf16;
        const uint16_t * s;
        const uint8_t *  z;  // kAsym: zero points (nullptr: symmetric)
    };
    struct Row {
        uint32_t off[2];  // n * n_groups of rows g and g + 8
    };
    struct Sc {
        uint32_t s;  // scale bits of row g | row g + 8 << 16
        uint32_t z;  // kAsym: zero of row g | row g + 8 << 16
    };
    struct Cst {
        float    s[2];
        uint32_t z1[2], nz2[2];  // kAsym: f16x2 of 1024 + zero and -(64 + zero)
    };
    __device__ __forceinline__ static Wt prep(const DeviceWeight & w) {
        return {ChunkDiv::make(w.group_size, w.k, kMmaK), w.scale_type == ScaleType::BF16, static_cast<const uint16_t *>(w.scales), w.zeros};
    }
    __device__ __forceinline__ static Row row(const DeviceWeight & w, const Wt &, int64_t n0, int64_t n1) {
        return {{uint32_t(n0) * uint32_t(w.n_groups), uint32_t(n1) * uint32_t(w.n_groups)}};  // scales below 8 GB
    }
    __device__ __forceinline__ static Sc load_scale(const DeviceWeight &, const Wt & p, const Row & r, uint32_t b, uint32_t, bool,
                                                    bool block_ok) {
        const uint32_t g = p.grp(b), i0 = r.off[0] + g, i1 = r.off[1] + g;
        Sc             o{0u, 0x00080008u};
        if (!block_ok) return o;  // kp: a block past the range (not used)
        o.s = uint32_t(__ldg(p.s + i0)) | (uint32_t(__ldg(p.s + i1)) << 16);
        if constexpr (kAsym)
            if (p.z) o.z = uint32_t(__ldg(p.z + i0)) | (uint32_t(__ldg(p.z + i1)) << 16);
        return o;
    }
    __device__ __forceinline__ static Cst cst(const Wt & p, const Sc & sc) {
        Cst c{};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t b = (sc.s >> (16 * h)) & 0xFFFFu;
            c.s[h]           = p.bf16 ? __uint_as_float(b << 16) : __half2float(__ushort_as_half(uint16_t(b)));
            if constexpr (kAsym) {
                const uint32_t z = (sc.z >> (16 * h)) & 0xFFu;           // 0 .. 16
                c.z1[h]          = (0x6400u + z) * 0x10001u;              // 1024 + z (units of 1)
                c.nz2[h]         = (0xD400u + 16u * z) * 0x10001u;        // -(64 + z) (units of 1/16)
            }
        }
        return c;
    }
    // Nibble j of w (bits 4j .. 4j + 3, j < 4) and nibble j + 4 (bits 16 + 4j ..): under the f16
    // exponent of 1024 the nibble at bits 0..3 is the units (1024 + q), at bits 4..7 sixteens
    // (1024 + 16 q: times 1/16 in the HFMA2); w >> 8 brings nibbles 2, 3 (6, 7) down.
    __device__ __forceinline__ static void decode(uint32_t w, const Cst & c, int h, int, uint32_t (&v)[4]) {
        const uint32_t z1  = kAsym ? c.z1[h] : 0x64086408u;   // 1032 = 1024 + 8
        const uint32_t nz2 = kAsym ? c.nz2[h] : 0xD480D480u;  // -72 = -(64 + 8)
        const uint32_t w8  = w >> 8;
        v[0]               = ptx::hsub2_bits(ptx::and_or<0x000F000Fu>(w, 0x64006400u), z1);
        v[1]               = ptx::hfma2_bits(ptx::and_or<0x00F000F0u>(w, 0x64006400u), 0x2C002C00u, nz2);  // 0x2C00 = 1/16
        v[2]               = ptx::hsub2_bits(ptx::and_or<0x000F000Fu>(w8, 0x64006400u), z1);
        v[3]               = ptx::hfma2_bits(ptx::and_or<0x00F000F0u>(w8, 0x64006400u), 0x2C002C00u, nz2);
    }
    __device__ __forceinline__ static float factor(const Cst & c, int h) { return c.s[h]; }
    __device__ __forceinline__ static float final_factor(const DeviceWeight &) { return 1.0f; }
};

struct MmaNvfp4 {
    static constexpr WeightFormat kFormat = WeightFormat::NVFP4;
    static constexpr bool         kScaled = false;
    struct Wt {
        const uint16_t * s;  // the scale pairs (one u16 per chunk)
    };
    struct Row {
        uint32_t off[2];  // n * K / 32 of rows g and g + 8
    };
    struct Sc {
        uint32_t s;  // the chunk's two E4M3 codes, row g | row g + 8 << 16
    };
    struct Cst {
        uint32_t sh[2][2];  // [row half][scale block of the chunk]: f16x2 {e4m3 * 2^7, same}
    };
    __device__ __forceinline__ static Wt  prep(const DeviceWeight & w) { return {static_cast<const uint16_t *>(w.scales)}; }
    __device__ __forceinline__ static Row row(const DeviceWeight & w, const Wt &, int64_t n0, int64_t n1) {
        const uint32_t kc = uint32_t(w.k / 32);
        return {{uint32_t(n0) * kc, uint32_t(n1) * kc}};  // scales below 8 GB
    }
    __device__ __forceinline__ static Sc load_scale(const DeviceWeight &, const Wt & p, const Row & r, uint32_t, uint32_t c, bool chunk_ok,
                                                    bool) {
        return {chunk_ok ? uint32_t(__ldg(p.s + (r.off[0] + c))) | (uint32_t(__ldg(p.s + (r.off[1] + c))) << 16) : 0u};
    }
    __device__ __forceinline__ static Cst cst(const Wt &, const Sc & sc) {
        Cst c;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            // Both codes into f16 as e4m3 * 2^-8 (formats.cuh), then * 2^15 (exact: at most 57344).
            const uint32_t t  = __byte_perm(sc.s >> (16 * h), 0u, 0x1404u);
            const uint32_t f  = ptx::hmul2_bits(((t >> 1) & 0x3F803F80u) | (t & 0x80008000u), 0x78007800u);
            c.sh[h][0]        = __byte_perm(f, 0u, 0x1010u);
            c.sh[h][1]        = __byte_perm(f, 0u, 0x3232u);
        }
        return c;
    }
    // Nibble pair (j, j + 4) as FmtNvfp4: e2m1 * 2^-14 in f16 (magnitude bits at 9..11, sign at 15;
    // the subnormal 0.5 included), times the word's scale block (words 0, 1: block 0; 2, 3: block 1).
    // Three shared steps place every nibble's sign 3 bits above its magnitude (w3 = w rotated left by
    // 3; the even nibbles of each byte in pe, the odd ones in po, n7's sign wrapping to bit 2), so a
    // pair is one shift (or rotate) and one mask.
    __device__ __forceinline__ static void decode(uint32_t w, const Cst & c, int h, int i, uint32_t (&v)[4]) {
        const uint32_t s  = c.sh[h][i >> 1];
        const uint32_t w3 = (w << 3) | (w >> 29);
        const uint32_t pe = ptx::and_or_not<0x07070707u>(w, w3);  // (w & m) | (w3 & ~m)
        const uint32_t po = ptx::and_or_not<0x70707070u>(w, w3);
        v[0]              = ptx::hmul2_bits((pe << 9) & 0x8E008E00u, s);                 // n0, n4
        v[1]              = ptx::hmul2_bits((po << 5) & 0x8E008E00u, s);                 // n1, n5
        v[2]              = ptx::hmul2_bits((pe << 1) & 0x8E008E00u, s);                 // n2, n6
        v[3]              = ptx::hmul2_bits(((po >> 3) | (po << 29)) & 0x8E008E00u, s);  // n3, n7
    }
    __device__ __forceinline__ static float factor(const Cst &, int) { return 1.0f; }
    __device__ __forceinline__ static float final_factor(const DeviceWeight & w) { return w.global_scale * 128.0f; }
};

// ---- activations -> B fragments in shared memory ---------------------------------------------------
// Layout: uint4 entry ((b * 4 + i) * P + col) * 4 + q holds, for 128-K block b (local), chunk q, word
// i and column col = 3 r + part, the four f16x2 {x[j], x[j + 4]} (j = 0..3) of the word's 8 elements
// k = 128 b + 32 q + 8 i + (0..7), scaled by s_{r,b} and split into that part. Then the floats
// 1 / s_{r,b} at [b][col] (row stride gemv_mma_col_stride(R)), after the fragments.

// What the split reads: activation rows x, or (GemvArgs::norm) rows x + b times the norm's weight,
// whose sums of squares it adds up on the way (the norm's 1 / rms is a factor of each row's
// results: the epilogue applies it, so no block waits for a whole-row reduction before its
// matmul). sum: where the rows x + b go (the blocks of row tile 0 write their K ranges), or nullptr.
template <int R, bool NORM, bool CG = false>
struct GemvMmaSrc {
    const float * x[R];
    const float * b[R]   = {};  // NORM: the second addend
    float *       sum[R] = {};
    const float * w      = nullptr;
    bool          zc     = false;
    float         ss[R]  = {};  // this thread's sums of squares of x + b

    // Elements k .. k + 3 of row r (as the split's loads: read-only path; CG: through L2 only, read
    // before the PDL wait, GemvArgs::x_early).
    __device__ __forceinline__ float4 load4(int r, size_t k) {
        const float4 * p = reinterpret_cast<const float4 *>(x[r] + k);
        const float4   u = CG ? __ldcg(p) : __ldg(p);
        if constexpr (!NORM) return u;
        const float4 v = __ldg(reinterpret_cast<const float4 *>(b[r] + k));
        float4       y = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
        ss[r] += y.x * y.x + y.y * y.y + y.z * y.z + y.w * y.w;
        if (sum[r] != nullptr) *reinterpret_cast<float4 *>(sum[r] + k) = y;
        if (w != nullptr) {
            float4 g = __ldg(reinterpret_cast<const float4 *>(w + k));
            if (zc) g = make_float4(1.0f + g.x, 1.0f + g.y, 1.0f + g.z, 1.0f + g.w);
            y = make_float4(y.x * g.x, y.y * g.y, y.z * g.z, y.w * g.w);
        }
        return y;
    }
    __device__ __forceinline__ void load8(int r, size_t k0, float (&e)[8]) {
        const float4 u = load4(r, k0), v = load4(r, k0 + 4);
        e[0] = u.x, e[1] = u.y, e[2] = u.z, e[3] = u.w, e[4] = v.x, e[5] = v.y, e[6] = v.z, e[7] = v.w;
    }
};

// The norm's source for the split (after the wait). Rows past a.rows repeat row 0, as the
// activations do; the blocks of row tile 0 (blockIdx.x == 0, job 0) write the sum of their K range.
template <int R>
__device__ __forceinline__ void gemv_norm_source(const GemvArgs & a, GemvMmaSrc<R, true> & src) {
    const GemvNorm & nm        = a.norm;
    const bool       write_sum = blockIdx.x == 0 && blockIdx.z == 0;
    src.w                      = nm.w;
    src.zc                     = nm.zero_centered != 0;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int64_t row = r < a.rows ? r : 0;
        src.x[r]          = nm.a + row * nm.lda;
        src.b[r]          = nm.b + row * nm.ldb;
        src.sum[r]        = write_sum && r < a.rows ? nm.sum + row * nm.ld_sum : nullptr;
    }
}

// After the split: the squares of the row elements outside this block's K range [k0, k1) (a K split
// across blocks), then each row's block total as per-warp partials in scratch[r][warp] (read after
// the barrier that follows the split: gemv_norm_inv).
template <int R>
__device__ __forceinline__ void gemv_norm_partials(const GemvArgs & a, GemvMmaSrc<R, true> & src, int64_t k0, int64_t k1, float (*scratch)[kGemvThreads / 32]) {
    const int64_t K = a.k;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        for (int64_t i = int64_t(threadIdx.x) * 4; i < K; i += int64_t(kGemvThreads) * 4) {
            if (i >= k0 && i < k1) continue;
            const float4 u = __ldg(reinterpret_cast<const float4 *>(src.x[r] + i)), v = __ldg(reinterpret_cast<const float4 *>(src.b[r] + i));
            const float4 y = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
            src.ss[r] += y.x * y.x + y.y * y.y + y.z * y.z + y.w * y.w;
        }
        const float t = warp_sum(src.ss[r]);
        if ((threadIdx.x & 31) == 0) scratch[r][threadIdx.x >> 5] = t;
    }
}

// The per-warp partials of the rows' sums of squares (shared memory of the NORM instantiations only).
template <int R>
__device__ __forceinline__ float (*gemv_norm_scratch())[kGemvThreads / 32] {
    __shared__ float partials[R][kGemvThreads / 32];
    return partials;
}

// Row r's 1 / rms (the mean of the squares and 1 / sqrt as the row norm kernel takes them).
__device__ __forceinline__ float gemv_norm_inv(const GemvArgs & a, const float * partials) {
    float ss = 0.0f;
#pragma unroll
    for (int w = 0; w < kGemvThreads / 32; ++w) ss += partials[w];
    return 1.0f / sqrtf(ss / float(a.k) + a.norm.eps);
}

// GemvArgs::rs: this block's 1 / rms of the producer's sums of squares (written by warp 0 before
// the epilogue's barrier).
__device__ __forceinline__ float & gemv_row_scale_slot() {
    __shared__ float inv;
    return inv;
}
// GemvArgs::produce: the per-warp sums of squares of the block's results (PN instantiations).
__device__ __forceinline__ float * gemv_produce_scratch() {
    __shared__ float ss[kGemvThreads / 32];
    return ss;
}

// Power-of-two scale from the max |x| bits: max * s in [2^14, 2^15); s and 1 / s normal. Returns the
// exponent (s = 2^p); an all-zero block: 0.
__device__ __forceinline__ int gemv_mma_scale_exp(uint32_t m) {
    if (m == 0) return 0;
    const int e = m >= 0x00800000u ? int(m >> 23) - 127 : (31 - __clz(int(m))) - 149;
    return min(14 - e, 126);
}

// a0, a1 (already scaled) -> hi = f16x2(a0, a1) and lo = f16x2 of the remainders (exact in f32).
// Non-finite: everything in hi (x - hi would be NaN for an infinity).
__device__ __forceinline__ void gemv_mma_split_pair(float a0, float a1, uint32_t & hi, uint32_t & lo) {
    hi              = ptx::pack_f16x2(a0, a1);
    const float2 h  = ptx::unpack_f16x2(hi);
    const float  r0 = (__float_as_uint(a0) & 0x7FFFFFFFu) < 0x7F800000u ? a0 - h.x : 0.0f;
    const float  r1 = (__float_as_uint(a1) & 0x7FFFFFFFu) < 0x7F800000u ? a1 - h.y : 0.0f;
    lo              = ptx::pack_f16x2(r0, r1);
}

// The block's K range [cb, cb + nblk) of the R rows, written as nblk_pad >= nblk blocks (zeros past
// nblk): half a warp per 128-K block (thread wi: block wi / 16, chunk wi % 4, word wi / 4 % 4), one
// pass (the block's max over its 16 lanes by shuffles).
template <int R, bool NORM, bool CG>
__device__ __forceinline__ void gemv_mma_split(GemvMmaSrc<R, NORM, CG> & src, uint32_t cb, uint32_t nblk, uint32_t nblk_pad, uint32_t KC,
                                               uint4 * smem) {
    constexpr int  P     = gemv_mma_parts(R);
    float *        inv_s = reinterpret_cast<float *>(smem + size_t(nblk_pad) * 16 * P);
    const uint32_t words = nblk_pad * 16;
    for (uint32_t base = 0; base < words; base += kGemvThreads) {  // uniform trip count: shuffles below
        const uint32_t wi = base + threadIdx.x, b = wi >> 4, q = wi & 3, i = (wi >> 2) & 3, c = (cb + b) * 4 + q;
        const bool     active = wi < words, in = active && b < nblk && c < KC;
        const size_t   k0     = size_t(c) * 32 + 8 * i;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float e[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (in) src.load8(r, k0, e);
            // Max |x| bits; inf / NaN count as the largest finite value (the result is non-finite
            // anyway; the finite elements of the block then lose their low bits, harmlessly).
            uint32_t m = 0;
#pragma unroll
            for (int t = 0; t < 8; ++t) m = max(m, __float_as_uint(e[t]) & 0x7FFFFFFFu);
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) m = max(m, uint32_t(__shfl_xor_sync(0xFFFFFFFFu, int(m), o)));  // the block's 16 lanes
            const int   pw = gemv_mma_scale_exp(min(m, 0x7F7FFFFFu));
            const float sc = __int_as_float((127 + pw) << 23);
            if (!active) continue;
            static_assert(kGemvMmaSplit == 2, "the split below makes hi and lo");
            uint32_t hi[4], lo[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) gemv_mma_split_pair(e[j] * sc, e[j + 4] * sc, hi[j], lo[j]);
            uint4 * dst = smem + ((size_t(b) * 4 + i) * P + 2 * r) * 4 + q;
            dst[0]      = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            dst[4]      = make_uint4(lo[0], lo[1], lo[2], lo[3]);
            if ((wi & 15) == 0) {
                const float inv = __int_as_float((127 - pw) << 23);
                float *     d   = inv_s + size_t(b) * gemv_mma_col_stride(R) + 2 * r;
                d[0] = d[1] = inv;
            }
        }
    }
}

// One activation row, split by each warp for its own steps (GemvMmaWarpSplit): the warp converts the
// 128-K block(s) of its step into a ring of two slots of its own in shared memory just before their
// MMAs, from elements it loaded a step earlier with its weights. Nothing waits for the whole block's
// split (the block-wide split above stands before every block's first MMA: ~1-4 us after the PDL
// release, docs/PERF.md), and no barrier but the warp's own. Same layout per block as above (one
// row: columns 0 and 1), its 1 / s right after the block's fragments; the same maximum, scale and
// parts as gemv_mma_split, so the same bits.
struct GemvMmaWarpSplit {
    static constexpr int kBlockU4 = 16 * gemv_mma_parts(1) + gemv_mma_col_stride(1) / 4;  // one 128-K block
    static constexpr int kWarpU4  = 2 * 2 * kBlockU4;                                      // 2 slots x 2 blocks (kp)

    // Lane l holds elements 2h, 2h + 1, 2h + 4, 2h + 5 of word i of chunk q (q = l / 8, i = l / 2 % 4,
    // h = l % 2): its two f16x2 words of the fragment entry are {x[2h], x[2h + 4]} and {x[2h + 1], x[2h + 5]}.
    __device__ __forceinline__ static size_t elem(int lane) { return size_t(32 * (lane >> 3) + 8 * ((lane >> 1) & 3) + 2 * (lane & 1)); }

    // Elements of local block bl (zeros past the block's range or past K); CG: through L2 only.
    template <bool CG>
    __device__ __forceinline__ static float4 load(const float * x, uint32_t cb, uint32_t bl, uint32_t nblk, uint32_t KC, int lane) {
        if (bl >= nblk || (cb + bl) * 4 + uint32_t(lane >> 3) >= KC) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float2 * p = reinterpret_cast<const float2 *>(x + size_t(cb + bl) * kMmaK + elem(lane));
        const float2   u = CG ? __ldcg(p) : __ldg(p), v = CG ? __ldcg(p + 2) : __ldg(p + 2);
        return make_float4(u.x, u.y, v.x, v.y);
    }

    // The warp's 128 elements -> the block's fragments and 1 / s at blk (every lane of the warp).
    __device__ __forceinline__ static void store(float4 v, uint4 * blk, int lane) {
        constexpr int P = gemv_mma_parts(1);
        uint32_t      m = max(max(__float_as_uint(v.x) & 0x7FFFFFFFu, __float_as_uint(v.y) & 0x7FFFFFFFu),
                              max(__float_as_uint(v.z) & 0x7FFFFFFFu, __float_as_uint(v.w) & 0x7FFFFFFFu));
        m               = __reduce_max_sync(0xFFFFFFFFu, m);
        const int   pw  = gemv_mma_scale_exp(min(m, 0x7F7FFFFFu));
        const float sc  = __int_as_float((127 + pw) << 23);
        uint32_t    hi[2], lo[2];
        gemv_mma_split_pair(v.x * sc, v.z * sc, hi[0], lo[0]);
        gemv_mma_split_pair(v.y * sc, v.w * sc, hi[1], lo[1]);
        const int q = lane >> 3, i = (lane >> 1) & 3, h = lane & 1;
        reinterpret_cast<uint2 *>(blk + (i * P + 0) * 4 + q)[h] = make_uint2(hi[0], hi[1]);
        reinterpret_cast<uint2 *>(blk + (i * P + 1) * 4 + q)[h] = make_uint2(lo[0], lo[1]);
        if (lane == 0) {
            float * d = reinterpret_cast<float *>(blk + 16 * P);
            d[0] = d[1] = __int_as_float((127 - pw) << 23);
        }
    }
};

// ---- the kernel -------------------------------------------------------------------------------------

// NORM: the residual add + RMS_NORM before the matmul (GemvArgs::norm; one row of one plain weight or
// a multi-weight launch, never the one-wave variant: its own instantiation, so that the others
// compile as they would without it). XE: a MATMUL_ID whose activations are converted before the
// PDL wait (GemvArgs::x_early; its own instantiations likewise). RS: the 1 / rms of a producer's norm
// applied in the epilogue (GemvArgs::rs, a GemvRowScaleForm: the parts in warp 0's registers or
// through shared memory; one row of plain weights; its own instantiations: a
// runtime switch in the plain kernels measured 3% slower on MiniMax-M2 and Qwen3-30B-A3B). PN: the residual
// ADD and the next norm's half in the epilogue (GemvArgs::produce; one row of one plain weight, no K
// split; its own instantiation likewise). KS: the experts' down projection and the combine, a slot
// per K-warp (GemvArgs::slot_w; INT4's warp split, one token a block z; its own instantiations).
template <class F, int R, bool GLU, bool WAVE = false, bool NORM = false, bool XE = false, int RS = kRowScaleNone, bool PN = false,
          bool KS = false>
__global__ void __launch_bounds__(kGemvThreads, gemv_mma_min_blocks(R, WAVE)) gemv_mma_kernel(const GemvArgs a) {
    static_assert(!WAVE || R == 1, "the one-wave variant is for one activation row");
    static_assert(!NORM || (R == 1 && !GLU && !WAVE), "the norm prologue is for one row of plain weights");
    static_assert(!XE || (R == 1 && !NORM), "early activations are a MATMUL_ID's (one row, no norm)");
    static_assert(RS == kRowScaleNone || (R == 1 && !GLU && !WAVE && !NORM && !XE), "the producer's 1 / rms is for one row of plain weights");
    static_assert(!PN || (R == 1 && !GLU && !WAVE && !NORM && !XE && RS == kRowScaleNone), "the norm's producer is one row of one plain weight");
    static_assert(!KS || (R == 1 && !GLU && !WAVE && !NORM && !XE && RS == kRowScaleNone && F::kFormat == WeightFormat::INT4),
                  "the experts' combine is one token of INT4 experts (the warp split)");
    constexpr int NW     = GLU ? 2 : 1;
    constexpr int U      = gemv_mma_tiles(NW);  // row tiles per weight
    constexpr int T      = U * NW;              // tiles per step (index t = i * U + u)
    constexpr int P      = gemv_mma_parts(R);
    constexpr int NB     = (P + 7) / 8;  // MMAs per A fragment (n = 8 columns each)
    constexpr int CS     = gemv_mma_col_stride(R);
    constexpr int D      = gemv_mma_depth(R, WAVE);
    constexpr int kWarps = kGemvThreads / 32;
    // Each warp splits its own steps (GemvMmaWarpSplit): INT4 at one row on the 2-step ring. Measured
    // (docs/PERF.md, "The activation split one step at a time"): the one-wave variant (one step in
    // flight, 80 registers) would wait for each step's elements and lost 1-3%, and NVFP4, whose
    // decode already costs ~2.9 instructions per weight, lost up to 1.8% with the split's
    // instructions inside its loop; both keep the block-wide split.
    constexpr bool WS = R == 1 && !NORM && !WAVE && F::kFormat == WeightFormat::INT4;
    using WSplit      = GemvMmaWarpSplit;
    SPARK_DYNAMIC_SMEM(uint4, gemv_mma_smem_buf);

    const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int wk = a.wk, wk_shift = __ffs(wk) - 1;
    const int kw = warp & (wk - 1), wr = warp >> wk_shift;
    // kp = 1 (one weight only): a warp's two tiles are one row tile at two consecutive 128-K blocks
    // (half the rows per block: twice the blocks for the same work, without splitting K).
    const int kp             = NW == 1 ? (a.mma_kpair ? 1 : 0) : 0;
    const int UR             = kp ? 1 : U;  // row tiles per warp
    const int rows_per_block = (kWarps / wk) * UR * 16;

    const GemvMat  mt      = gemv_mat(a);
    const int64_t  N       = mt.n;
    const uint32_t KC      = uint32_t(a.k / 32);
    const uint32_t KB      = (KC + 3) / 4;
    const int64_t  tile_n0 = int64_t(mt.bx) * rows_per_block;
    const int64_t  n_warp  = tile_n0 + int64_t(wr) * UR * 16;

    DeviceWeight  w[NW];
    const float * xr[R];
    int64_t       out_row0 = 0;
    bool          valid    = true;
    if constexpr (XE) {
        gemv_expert_rows(a, xr, out_row0);  // (the weights after the split, below)
    } else if constexpr (KS) {  // this warp's slot of the block's token
        const int pair = kw + a.ids.k_slots * int(blockIdx.z);
        gemv_expert_weights(a, w, valid, pair);
        gemv_expert_rows(a, xr, out_row0, pair);
        out_row0 = blockIdx.z;
    } else {
        gemv_block_operands(a, mt, w, xr, out_row0, valid);
    }
    // KS: each warp its own slot's range, in order (kws, wks: the interleave of the K-warps otherwise).
    const int kws = KS ? 0 : kw, wks = KS ? 0 : wk_shift;

    // This block's 128-K blocks [cb, ce) (local bl = b - cb < nblk; XE: the range before the expert
    // is known to be valid); step j of warp kw covers local blocks ((kw + j wk) << kp) + (kp ? t : 0)
    // of its tiles t (KS: (j << kp) + (kp ? t : 0) of its slot's range; j < J; none for an invalid expert).
    const uint32_t cps     = uint32_t(a.chunks_per_split);
    const uint32_t cb      = blockIdx.y * cps;
    const uint32_t ce      = XE || valid ? min(KB, cb + cps) : cb;
    const uint32_t nblk    = ce > cb ? ce - cb : 0;
    const uint32_t nstep   = (nblk + uint32_t(kp)) >> kp;  // step positions in the range
    const int      J_range = nstep > uint32_t(kws) ? int((nstep - uint32_t(kws) + (1u << wks) - 1) >> wks) : 0;

    // The activations into the B fragments (block-wide), or (WS) the first steps' elements of each
    // warp into registers: after the wait, or (XE) before it, through L2 (pdl.cuh: complete before
    // this kernel started; L1 is not coherent).
    float4     xs[D][2];  // (WS) the elements of the steps in the ring
    auto       split_x = [&] {
        if constexpr (WS) {
#pragma unroll
            for (int s = 0; s < D; ++s) {
                if (s >= J_range) continue;
                const uint32_t bl0 = uint32_t(kws + (s << wks)) << kp;
#pragma unroll
                for (int t = 0; t < 2; ++t)
                    if (t <= kp) xs[s][t] = WSplit::template load<XE>(xr[0], cb, bl0 + uint32_t(t), nblk, KC, lane);
            }
        } else {
            GemvMmaSrc<R, NORM, XE> src;
#pragma unroll
            for (int r = 0; r < R; ++r) src.x[r] = xr[r];
            if constexpr (NORM) gemv_norm_source<R>(a, src);
            gemv_mma_split<R>(src, cb, nblk, nblk + (nblk & uint32_t(kp)), KC, gemv_mma_smem_buf);
            if constexpr (NORM) gemv_norm_partials<R>(a, src, int64_t(cb) * kMmaK, int64_t(cb + nblk) * kMmaK, gemv_norm_scratch<R>());
            __syncthreads();
        }
    };
    if constexpr (XE) {
        split_x();
        gemv_expert_weights(a, w, valid);  // (without ids_early: waits here for the ids)
    }
    const int J = XE && !valid ? 0 : J_range;  // (otherwise an invalid expert's range is empty)

    // 4-bit tile-major (device_weight.h; a GLU's two weights have one shape, so one order): a row's
    // next 128-K block is 64 chunks on instead of 4, and each load instruction of the warp reads
    // 512 contiguous bytes.
    const bool      tiled        = w4_format(F::kFormat) && w[0].tiled;
    const uint32_t  block_chunks = uint32_t(w4_chunk_index(tiled, 0, 4, KC));  // one 128-K block on
    typename F::Wt  wt[NW];
    typename F::Row rr[T];
    const uint4 *   wp[T][2];  // rows g and g + 8 of each tile, at the chunk of the next step
#pragma unroll
    for (int i = 0; i < NW; ++i) wt[i] = F::prep(w[i]);
#pragma unroll
    for (int i = 0; i < NW; ++i)
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int     t  = i * U + u;
            const int64_t r0 = n_warp + (kp ? 0 : u * 16) + g;
            const int64_t n0 = min(r0, N - 1), n1 = min(r0 + 8, N - 1);  // past N: row N - 1, not stored
            wp[t][0]         = static_cast<const uint4 *>(w[i].data) + w4_chunk_index(tiled, n0, 0, KC);
            wp[t][1]         = static_cast<const uint4 *>(w[i].data) + w4_chunk_index(tiled, n1, 0, KC);
            rr[t]            = F::row(w[i], wt[i], n0, n1);
        }

    float acc[T][NB][4];
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[t][nb][e] = 0.0f;

    const uint4 * bp0 = gemv_mma_smem_buf + g * 4 + q;  // column g, chunk q of the B fragments
    // 1 / s of this lane's accumulator columns 2q, 2q + 1 (+ 8 nb) per block (columns >= P: unused).
    const uint32_t nblk_pad = nblk + (nblk & uint32_t(kp));  // kp: an even number of blocks (a zero block appended)
    const float *  inv0     = reinterpret_cast<const float *>(gemv_mma_smem_buf + size_t(nblk_pad) * 16 * P) + 2 * q;
    uint4          raw[D][T][2];
    typename F::Sc sc[D][T];
#pragma unroll
    for (int s = 0; s < D; ++s)
#pragma unroll
        for (int t = 0; t < T; ++t) raw[s][t][0] = raw[s][t][1] = make_uint4(0, 0, 0, 0);
    const uint64_t policy = ptx::l2_evict_first_policy();
    // WS: the warp's two slots of converted steps.
    uint4 * wring = gemv_mma_smem_buf + size_t(warp) * WSplit::kWarpU4;

    // Steps are issued in order, j = 0, 1, ...: running local block and weight pointers.
    uint32_t bl_next = uint32_t(kws) << kp;
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) wp[t][h] += (cb + bl_next + uint32_t(kp * t)) * block_chunks + uint32_t(q);
    const uint32_t bl_step = (1u << wks) << kp;
    auto issue = [&](const int slot, const int j) {
        if (j < J) {
#pragma unroll
            for (int t = 0; t < T; ++t) {
                // Past K (chunks of the last block beyond K) or past the range (kp): the slot keeps
                // older weights, which are finite and meet zeros in B, or are not used.
                const uint32_t bl = bl_next + uint32_t(kp * t), c = (cb + bl) * 4 + uint32_t(q);
                const bool     block_ok = bl < nblk, ok = block_ok && c < KC;
                if (ok) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) raw[slot][t][h] = ptx::ld_stream_v4(wp[t][h], policy);
                }
                sc[slot][t] = F::load_scale(w[t / U], wt[t / U], rr[t], cb + bl, c, ok, block_ok);
#pragma unroll
                for (int h = 0; h < 2; ++h) wp[t][h] += bl_step * block_chunks;
            }
            bl_next += bl_step;
        }
    };
    // WS: the elements of step j (every lane, j < J) for ring slot `slot` (after the wait).
    auto issue_x = [&](const int slot, const int j) {
        if (!WS || j >= J) return;
        const uint32_t bl0 = uint32_t(kws + (j << wks)) << kp;
#pragma unroll
        for (int t = 0; t < 2; ++t)
            if (t <= kp) xs[slot][t] = WSplit::template load<false>(xr[0], cb, bl0 + uint32_t(t), nblk, KC, lane);
    };
    auto consume = [&](const int slot, const int j) {
        if (j >= J) return;
        const uint32_t bl0 = uint32_t(kws + (j << wks)) << kp;
        typename F::Cst cs[T];
#pragma unroll
        for (int t = 0; t < T; ++t) cs[t] = F::cst(wt[t / U], sc[slot][t]);
        float d[T][NB][4];
#pragma unroll
        for (int t = 0; t < T; ++t)
#pragma unroll
            for (int nb = 0; nb < NB; ++nb)
#pragma unroll
                for (int e = 0; e < 4; ++e) d[t][nb][e] = 0.0f;
        // B of tile t: local block bl0 + kp t (kp with an odd range: the last step's second block is
        // the zero block the split appended).
        const uint4 * bpt[2] = {bp0 + bl0 * (16 * P), bp0 + (bl0 + uint32_t(kp)) * (16 * P)};
        const float * ivt[2] = {inv0 + bl0 * CS, inv0 + (bl0 + uint32_t(kp)) * CS};
        if constexpr (WS) {  // this step's blocks into slot j % 2 (step j - 2's reads of it came before step j - 1's __syncwarp)
            uint4 * blk = wring + (j & 1) * 2 * WSplit::kBlockU4;
#pragma unroll
            for (int t = 0; t < 2; ++t)
                if (t <= kp) WSplit::store(xs[slot][t], blk + t * WSplit::kBlockU4, lane);
            __syncwarp();
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const uint4 * b = blk + (t & kp) * WSplit::kBlockU4;
                bpt[t]          = b + g * 4 + q;
                ivt[t]          = reinterpret_cast<const float *>(b + 16 * P) + 2 * q;
            }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            // Lanes of columns >= P read column P - 1 (their D columns are never stored).
            uint4 bv[T][NB];
#pragma unroll
            for (int t = 0; t < T; ++t)
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) bv[t][nb] = bpt[t & 1][(i * P + (8 * nb + g < P ? 8 * nb : P - 1 - g)) * 4];
#pragma unroll
            for (int t = 0; t < T; ++t) {
                uint32_t v0[4], v1[4];
                F::decode(word_of(raw[slot][t][0], i), cs[t], 0, i, v0);
                F::decode(word_of(raw[slot][t][1], i), cs[t], 1, i, v1);
                const uint32_t fa[4] = {v0[0], v1[0], v0[1], v1[1]}, fb[4] = {v0[2], v1[2], v0[3], v1[3]};
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) {
                    ptx::mma_m16n8k16<__half>(d[t][nb], fa, bv[t][nb].x, bv[t][nb].y);
                    ptx::mma_m16n8k16<__half>(d[t][nb], fb, bv[t][nb].z, bv[t][nb].w);
                }
            }
        }
        // acc += 1 / s_{r,b} * (factor * partial): the power of two last, so nothing under- or
        // overflows that the true partial would not.
#pragma unroll
        for (int t = 0; t < T; ++t) {
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
                const float2 iv = *reinterpret_cast<const float2 *>(ivt[t & 1] + 8 * nb);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float f = F::kScaled ? F::factor(cs[t], e >> 1) * d[t][nb][e] : d[t][nb][e];
                    acc[t][nb][e] = fmaf(e & 1 ? iv.y : iv.x, f, acc[t][nb][e]);
                }
            }
        }
    };

    // The weights do not depend on the previous kernel: the first D steps are requested before
    // waiting for it (a plain MATMUL, or a MATMUL_ID with ids_early; other MATMUL_IDs waited for
    // their ids above) and before the activation split.
#pragma unroll
    for (int s = 0; s < D; ++s) issue(s, s);
    pdl::launch_dependents();  // the next kernel may launch and request its own weights
    if constexpr (NORM)  // the norm's weight is no output of an earlier kernel: to L2 before the wait
        if (a.norm.w != nullptr)
            for (int64_t i = int64_t(threadIdx.x) * 32; i < a.k; i += int64_t(kGemvThreads) * 32) ptx::prefetch_l2(a.norm.w + i);
    if (a.table[0] == nullptr || a.ids_early) pdl::wait();
    // (GemvArgs::rs) the producer's sums of squares, requested now through L2 by warp 0 (written by
    // the previous kernel), summed only before the epilogue.
    float rs_part[2] = {0.0f, 0.0f};
    if constexpr (RS == kRowScaleLanes)
        if (warp == 0)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                if (lane + 32 * h < a.rs.n_parts) rs_part[h] = __ldcg(a.rs.parts + lane + 32 * h);
    if constexpr (RS == kRowScaleShared)
        if (warp == 0) {  // (cp.async: through L2, into shared memory; no registers held by the main loop)
            uint4 * copy = reinterpret_cast<uint4 *>(reinterpret_cast<char *>(gemv_mma_smem_buf) + a.rs.smem_offset);
            for (int c = lane; 4 * c < a.rs.n_parts; c += 32) ptx::cp_async_16(copy + c, a.rs.parts + 4 * c, true);
            ptx::cp_async_commit();
        }
    // (PN) this thread's row of the epilogue (rows_per_block <= the block's threads): its residual and
    // norm weight requested now, not after the main loop.
    float pn_r = 0.0f, pn_w = 1.0f;
    if constexpr (PN)
        if (int(threadIdx.x) < rows_per_block && tile_n0 + int64_t(threadIdx.x) < N) {
            const int64_t n = tile_n0 + int64_t(threadIdx.x);
            pn_r            = __ldcg(a.produce.resid + n);
            if (a.produce.w) pn_w = a.produce.zero_centered ? 1.0f + a.produce.w[n] : a.produce.w[n];
        }
    if constexpr (!XE) split_x();
    // (step trace builds, step_trace.cuh: after the wait, which the mark needs; WS: the first steps'
    // elements requested; XE: converted before the wait, marked here)
    trace::mark(trace::kSplit);
    for (int j0 = 0; j0 < J; j0 += D) {
#pragma unroll
        for (int s = 0; s < D; ++s) {
            if (j0 + s > 0) {  // step D - 1 came with the prologue
                issue((s + D - 1) % D, j0 + s + D - 1);
                issue_x((s + D - 1) % D, j0 + s + D - 1);
            }
            consume(s, j0 + s);
        }
    }
    if (kp) {  // both tiles are the same rows: one sum, in a fixed order
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[0][nb][e] += acc[T - 1][nb][e];
    }

    // Accumulators -> shared memory red[warp][t][row 0..15][column] (the B fragments are dead); KS:
    // times the slot's route weight and its expert's final factor (the epilogue's sum over the
    // K-warps is then the combine's, in slot order).
    const float slot_c = KS ? __ldcg(a.slot_w + kw + a.ids.k_slots * int(blockIdx.z)) * F::final_factor(w[0]) : 1.0f;
    __syncthreads();
    float * red = reinterpret_cast<float *>(gemv_mma_smem_buf);
#pragma unroll
    for (int t = 0; t < T; ++t) {
        if (t > 0 && kp) continue;
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = 8 * nb + 2 * q + (e & 1), row = g + 8 * (e >> 1);
                if (col < P) red[((warp * T + t) * 16 + row) * P + col] = KS ? acc[t][nb][e] * slot_c : acc[t][nb][e];
            }
    }
    if constexpr (RS != kRowScaleNone)
        if (warp == 0) {  // (each lane its parts in order, then a butterfly: every block gets the same bits, either form)
            float part = rs_part[0] + rs_part[1];
            if constexpr (RS == kRowScaleShared) {
                ptx::cp_async_wait<0>();
                __syncwarp();
                const float * parts = reinterpret_cast<const float *>(reinterpret_cast<const char *>(gemv_mma_smem_buf) + a.rs.smem_offset);
                for (int i = lane; i < a.rs.n_parts; i += 32) part += parts[i];
            }
            const float ss = warp_sum(part);
            if (lane == 0) gemv_row_scale_slot() = 1.0f / sqrtf(ss / float(a.k) + a.rs.eps);
        }
    __syncthreads();
    trace::mark(trace::kLoop);  // every warp's main loop done

    // One thread per (output row of the block, activation row): K-warps in order, hi + lo.
    const int   rows    = a.table[0] != nullptr ? 1 : a.rows;
    const float ffac[2] = {KS ? 1.0f : F::final_factor(w[0]), KS ? 1.0f : F::final_factor(w[NW - 1])};  // (KS: in red already)
    float       pn_ss   = 0.0f;  // (PN) this thread's sums' squares
    for (int idx = int(threadIdx.x); idx < rows_per_block * rows; idx += kGemvThreads) {
        const int     nl = idx % rows_per_block, r = idx / rows_per_block;
        const int64_t n  = tile_n0 + nl;
        if (n >= N) continue;
        const int wrr = nl / (UR * 16), u = (nl / 16) % UR, rw = nl % 16;
        float     v[NW];
#pragma unroll
        for (int i = 0; i < NW; ++i) {
            float hi = 0.0f, lo = 0.0f;
            for (int k = 0; k < wk; ++k) {
                const float * p = red + ((((wrr << wk_shift) + k) * T + i * U + u) * 16 + rw) * P + 2 * r;
                hi += p[0];
                lo += p[1];
            }
            v[i] = (hi + lo) * ffac[i];
        }
        if constexpr (NORM) {  // (the norm's factor of the row: every result of it, before the K split's sum)
            const float inv = gemv_norm_inv(a, gemv_norm_scratch<R>()[r]);
#pragma unroll
            for (int i = 0; i < NW; ++i) v[i] *= inv;
        }
        if constexpr (RS != kRowScaleNone) {  // (before the K split's sum, as the norm's factor above)
            const float inv = gemv_row_scale_slot();
#pragma unroll
            for (int i = 0; i < NW; ++i) v[i] *= inv;
        }
        const int64_t row = out_row0 + r;
        if constexpr (PN) {  // the ADD's sum and the norm's weighted row instead of y (one row, no K split)
            const GemvNormOut & po = a.produce;  // (idx == threadIdx.x: one row a thread, pn_r / pn_w its row's)
            const float         s  = __fadd_rn(v[0], pn_r);  // (not contracted: the separate ADD's bits)
            po.sum[n]              = s;
            po.z[n]                = s * pn_w;
            pn_ss                  = fmaf(s, s, pn_ss);
        } else if (a.partial == nullptr) {
            if constexpr (GLU)
                mt.y[row * N + n] = silu(v[0]) * v[1];
            else
                mt.y[row * N + n] = v[0];
        } else {
#pragma unroll
            for (int i = 0; i < NW; ++i) a.partial[((int64_t(blockIdx.y) * NW + i) * a.out_rows + row) * a.n + mt.row_off + n] = v[i];
        }
    }
    if constexpr (PN) {  // the block's part: the warps' butterflies, then the warps in order
        const float t = warp_sum(pn_ss);
        if (lane == 0) gemv_produce_scratch()[warp] = t;
        __syncthreads();
        if (threadIdx.x == 0) {
            float ss = 0.0f;
#pragma unroll
            for (int i = 0; i < kWarps; ++i) ss += gemv_produce_scratch()[i];
            a.produce.parts[blockIdx.x] = ss;
        }
        return trace::mark(trace::kEnd);
    }
    if (a.partial == nullptr) return trace::mark(trace::kEnd);
    gemv_splitk_finish<GLU>(a, tile_n0, rows_per_block, rows, out_row0, mt);
    trace::mark(trace::kEnd);
}

// One instantiation of gemv_mma_kernel, as a tag (gemv_mma_select).
template <int R, bool GLU, bool WAVE = false, bool NORM = false, bool XE = false, int RS = kRowScaleNone, bool PN = false, bool KS = false>
struct GemvMmaVariant {};

// The instantiation a launch of `a` takes, with the arguments and dynamic shared memory it runs with:
// go(GemvMmaVariant<...>{}, args, smem_bytes). The one choice of the GPU's launcher and the CPU
// emulator's (dev/kernels/matmul), so that the emulator runs what the GPU runs. Returns the reason
// no instantiation fits (the plan asked for a form the kernel has not), or nullptr.
template <class F, class Go>
const char * gemv_mma_select(int r_tmpl, bool glu, const GemvArgs & a, dim3 grid, int smem, Go && go) {
    if (a.slot_w != nullptr) {  // (the experts' combine: a MATMUL_ID's operands, a slot per K-warp)
        if constexpr (F::kFormat != WeightFormat::INT4) {
            return "gemv: the experts' combine takes INT4 experts";
        } else {
            if (r_tmpl != 1 || glu || a.mma_wave || a.x_early || a.table[0] == nullptr || grid.y != 1 || a.wk != a.ids.k_slots ||
                a.wk * 32 != kGemvThreads)
                return "gemv: the experts' combine takes one token a block and a K-warp per slot";
            if (a.produce.resid != nullptr) {  // (and the norm's producer: one token)
                if (grid.z != 1) return "gemv: the experts' combine writes the norm's half of one token";
                return go(GemvMmaVariant<1, false, false, false, false, kRowScaleNone, true, true>{}, a, smem), nullptr;
            }
            return go(GemvMmaVariant<1, false, false, false, false, kRowScaleNone, false, true>{}, a, smem), nullptr;
        }
    }
    if (a.norm.a != nullptr) {  // (op_add_norm_matmul plans only this form)
        if (r_tmpl != 1 || glu || a.mma_wave) return "gemv: the norm prologue takes one row of plain weights";
        return go(GemvMmaVariant<1, false, false, true>{}, a, smem), nullptr;
    }
    if (a.rs.parts != nullptr) {  // (op_combine_norm_matmul, op_matmul_norm_matmul plan only this form)
        if (r_tmpl != 1 || glu || a.mma_wave || a.table[0] != nullptr) return "gemv: the producer's 1 / rms takes one row of plain weights";
        if (gemv_row_scale_form(a.rs.n_parts) == kRowScaleLanes)
            return go(GemvMmaVariant<1, false, false, false, false, kRowScaleLanes>{}, a, smem), nullptr;
        GemvArgs b       = a;
        b.rs.smem_offset = gemv_row_scale_offset(smem);
        return go(GemvMmaVariant<1, false, false, false, false, kRowScaleShared>{}, b, gemv_row_scale_smem(smem)), nullptr;
    }
    if (a.produce.resid != nullptr) {  // (one row of one plain weight, no K split)
        if (r_tmpl != 1 || glu || a.mma_wave || a.table[0] != nullptr || a.n_mats > 1 || grid.y != 1 || grid.z != 1)
            return "gemv: the norm's producer is one row of one plain weight, no K split";
        return go(GemvMmaVariant<1, false, false, false, false, kRowScaleNone, true>{}, a, smem), nullptr;
    }
    if (a.x_early) {  // (plan_moe_launch sets it only for MATMUL_IDs, whose launches take one row)
        if (r_tmpl != 1 || a.table[0] == nullptr) return "gemv: early activations are a MATMUL_ID's, one row";
        if (a.mma_wave)
            return glu ? go(GemvMmaVariant<1, true, true, false, true>{}, a, smem) : go(GemvMmaVariant<1, false, true, false, true>{}, a, smem),
                   nullptr;
        return glu ? go(GemvMmaVariant<1, true, false, false, true>{}, a, smem) : go(GemvMmaVariant<1, false, false, false, true>{}, a, smem),
               nullptr;
    }
    if (a.mma_wave && r_tmpl == 1)
        return glu ? go(GemvMmaVariant<1, true, true>{}, a, smem) : go(GemvMmaVariant<1, false, true>{}, a, smem), nullptr;
    switch (r_tmpl) {
        case 1: return glu ? go(GemvMmaVariant<1, true>{}, a, smem) : go(GemvMmaVariant<1, false>{}, a, smem), nullptr;
        case 2: return glu ? go(GemvMmaVariant<2, true>{}, a, smem) : go(GemvMmaVariant<2, false>{}, a, smem), nullptr;
        case 3: return glu ? go(GemvMmaVariant<3, true>{}, a, smem) : go(GemvMmaVariant<3, false>{}, a, smem), nullptr;
        case 4: return glu ? go(GemvMmaVariant<4, true>{}, a, smem) : go(GemvMmaVariant<4, false>{}, a, smem), nullptr;
        case 8: return glu ? go(GemvMmaVariant<8, true>{}, a, smem) : go(GemvMmaVariant<8, false>{}, a, smem), nullptr;
        default: return "gemv: no tensor-core instantiation for this row count";
    }
}

#ifdef __CUDACC__
template <class F, int R, bool GLU, bool WAVE, bool NORM, bool XE, int RS, bool PN, bool KS>
void gemv_mma_launch_one(GemvMmaVariant<R, GLU, WAVE, NORM, XE, RS, PN, KS>, const GemvArgs & a, dim3 grid, int smem, cudaStream_t s) {
    auto             kernel = gemv_mma_kernel<F, R, GLU, WAVE, NORM, XE, RS, PN, KS>;
    static SmemLimit limit;  // (plan_gemv stays under the device's opt-in maximum)
    raise_smem_limit(reinterpret_cast<const void *>(kernel), smem, limit);
    launch_kernel(kernel, grid, dim3(kGemvThreads), size_t(smem), s, a.pdl != 0, a);
}

template <class F>
void gemv_mma_launch(int r_tmpl, bool glu, const GemvArgs & a, dim3 grid, int smem, cudaStream_t s) {
    const char * why = gemv_mma_select<F>(r_tmpl, glu, a, grid, smem, [&](auto variant, const GemvArgs & args, int bytes) {
        gemv_mma_launch_one<F>(variant, args, grid, bytes, s);
    });
    if (why != nullptr) fail(SPARK_ERR_INTERNAL, why);
}
#endif

}  // namespace spark::cuda::mm
