// Host side of the CUDA matmuls: picks a path per node and launches it (never synchronises, never
// allocates except through ctx.workspace, reads no device data).
//
//   MATMUL      rows <= 8                 decode GEMV: tensor-core decode (gemv_mma.cuh) for INT4
//                                         with groups of a multiple of 128 and NVFP4, else the FMA
//                                         decode (gemv.cuh); SPARK_GEMV_MMA=0 keeps the FMA one
//               rows > 8, K % 32 == 0     tensor-core GEMM (gemm.cuh): F16 operands (activations
//                                         row-scaled by powers of two), F32 accumulation, K split
//                                         across blocks where the tiles leave SMs idle (plan_gemm)
//               other chunkable shapes    GEMV over row batches of 8
//   MATMUL_ID   tokens <= 8               one GEMV launch over all (slot, token) pairs, expert ids
//                                         read on the device
//               more tokens               grouped GEMM: device-built grouping (moe_route), F16
//                                         gather, one GEMM launch over the maximum tile count
//   SWIGLU of two MATMUL / MATMUL_ID      the same kernels with gate and up in one launch (an
//                                         input the output overlaps is copied first: the memory
//                                         plan may reuse the matmuls' dead input for the output)
//   several MATMUL of one input           op_matmul_multi: one decode-GEMV launch for all of them, or
//                                         (prefill) one GEMM launch over their column tiles
//   anything else                         generic per-element kernel (exact, slow)
// "Chunkable": K a multiple of the 16-byte chunk (4 f32, 8 f16/bf16, 16 fp8, 32 int4/nvfp4
// elements), INT4 groups of a multiple of 32 (or one group), FP8 k-blocks of a multiple of 16 (or
// one block).
#include "backends/cuda/common/arch.h"
#include "backends/cuda/common/launch.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/matmul/matmul.h"
#include "backends/cuda/matmul/tuning.h"
#include "backends/cuda/ops.h"
#include "graph/error.h"

#include <algorithm>
#include <cstdint>

namespace spark::cuda {

namespace mm {

namespace {

void gemv_launch_fmt(WeightFormat f, const GemvPlan & p, bool glu, const GemvArgs & a, cudaStream_t s) {
    gemv_launch_planned(f, p, glu, a, s);
    SPARK_CUDA_CHECK_LAUNCH();
}

// The GEMV options of a set of weights (all of one format and K): the tensor-core decode where every
// weight takes it.
GemvOpts gemv_opts(const DeviceWeight * const * w, int count, const OpContext & ctx) {
    GemvOpts o;
    o.mma = gemv_mma_enabled(ctx.props->cc);
    for (int i = 0; i < count; ++i) o.mma = o.mma && gemv_mma_ok(*w[i]);
    if (ctx.props->max_smem_per_block > 0) o.smem_optin = ctx.props->max_smem_per_block;
    return o;
}

void gemm_launch_fmt(WeightFormat f, int mt, bool glu, const GemmArgs & a, dim3 grid, cudaStream_t s) {
    switch (f) {
        case WeightFormat::F32: gemm_launch_f32(mt, glu, a, grid, s); break;
        case WeightFormat::F16: gemm_launch_f16(mt, glu, a, grid, s); break;
        case WeightFormat::BF16: gemm_launch_bf16(mt, glu, a, grid, s); break;
        case WeightFormat::NVFP4: gemm_launch_nvfp4(mt, glu, a, grid, s); break;
        case WeightFormat::INT4: gemm_launch_int4(mt, glu, a, grid, s); break;
        case WeightFormat::FP8: gemm_launch_fp8(mt, glu, a, grid, s); break;
    }
    SPARK_CUDA_CHECK_LAUNCH();
}

// ---- scratch: one workspace get() per op, carved into 256-byte aligned pieces --------------------

struct Scratch {
    char * base = nullptr;
    size_t used = 0;
    void * take(size_t bytes) {
        void * p = base + used;
        used += (bytes + 255) & ~size_t(255);
        return p;
    }
};
size_t aligned(size_t b) { return (b + 255) & ~size_t(255); }

// GEMM input staging: F16 activations [rows][k] and one f32 inverse row scale per row; the split-K
// partials and arrival counters of plan p.
size_t gemm_scratch(int64_t rows, int64_t k, const GemmPlan & p) {
    size_t b = aligned(size_t(rows * k) * 2) + aligned(size_t(rows) * 4);
    if (p.ksplit > 1) b += aligned(size_t(p.partial_floats()) * 4) + aligned(size_t(p.counters()) * 4);
    return b;
}

// Stages the activations (F16, row scales) for the GEMM and sets the plan's K split in a (scratch for
// its partials, counters zeroed on the stream).
void gemm_prepare(GemmArgs & a, const GemmPlan & p, const XRows & x, int64_t rows, int64_t k, const int32_t * perm,
                  Scratch & scratch, const OpContext & ctx) {
    if (p.grid.y > 65535) fail(SPARK_ERR_UNSUPPORTED, "matmul: %u column tiles are too many for the GEMM grid", p.grid.y);
    auto * xh = static_cast<uint16_t *>(scratch.take(size_t(rows * k) * 2));
    auto * xs = static_cast<float *>(scratch.take(size_t(rows) * 4));
    x_to_f16_rows(x, rows, k, perm, nullptr, nullptr, nullptr, Ids{}, xh, xs, ctx.stream);
    a.a            = xh;
    a.a_inv_scale  = xs;
    a.lda          = k;
    a.m            = rows;
    a.k            = k;
    a.ksplit       = p.ksplit;
    a.kt_per_split = p.kt_per_split;
    if (p.ksplit > 1) {
        a.partial  = static_cast<float *>(scratch.take(size_t(p.partial_floats()) * 4));
        a.counters = static_cast<uint32_t *>(scratch.take(size_t(p.counters()) * 4));
        SPARK_CUDA_CHECK(cudaMemsetAsync(a.counters, 0, size_t(p.counters()) * 4, ctx.stream));
    }
}

// ---- dense (MATMUL, fused gate/up) ---------------------------------------------------------------

struct Dense {
    const DeviceWeight * w[2] = {nullptr, nullptr};
    int                  nw   = 1;
    XRows                x;
    int64_t              rows = 0;
    float *              y    = nullptr;
    // The output overlaps the activations (a fused SWIGLU whose output the memory plan placed over
    // the matmuls' input, which is dead after the second matmul node): copy them first.
    bool stage_x = false;
};

enum class Path { Gemv, Gemm, Generic, Unfused };

const float * row_ptr(const XRows & x, int64_t r) {
    const int64_t i1 = r % x.ne1, i2 = (r / x.ne1) % x.ne2, i3 = r / (x.ne1 * x.ne2);
    return reinterpret_cast<const float *>(x.base + i1 * x.nb1 + i2 * x.nb2 + i3 * x.nb3);
}

Path choose(const Dense & d) {
    const DeviceWeight & w0   = *d.w[0];
    const bool           fast = chunk_ok(w0) && (d.nw == 1 || (chunk_ok(*d.w[1]) && d.w[1]->format == w0.format &&
                                                               d.w[1]->n == w0.n && d.w[1]->k == w0.k));
    const bool perm = w0.perm || (d.nw == 2 && d.w[1]->perm);
    const ForcePath force = overrides().path;
    if (!fast || force == ForcePath::Generic) return Path::Generic;  // the generic kernel fuses too
    if (d.nw == 2 && perm) return Path::Unfused;                     // gate and up need different x orders
    if (force == ForcePath::Gemv) return Path::Gemv;
    if (force == ForcePath::Gemm && w0.k % kGemmBK == 0) return Path::Gemm;
    if (d.rows <= kGemvMaxRows) return Path::Gemv;
    return w0.k % kGemmBK == 0 ? Path::Gemm : Path::Gemv;
}

bool rows_aligned(const Dense & d) {
    for (int64_t r = 0; r < d.rows; ++r)
        if (reinterpret_cast<uintptr_t>(row_ptr(d.x, r)) % 16 != 0) return false;
    return true;
}

size_t scratch_bytes(const Dense & d, const OpContext & ctx);

GemmPlan dense_gemm_plan(const Dense & d, const OpContext & ctx) {
    const DeviceWeight & w = *d.w[0];
    return plan_gemm(d.rows, ceil_div(w.n, int64_t(gemm_bn(d.nw == 2))), w.k, ctx.props->sm_count);
}

// Split-K scratch of the GEMV row batches of d (0 floats: no batch splits K): partial floats and
// arrival counters. Batches run one after the other on the stream and share the buffers.
struct GemvSplitScratch {
    size_t floats = 0, counters = 0;
};
GemvSplitScratch gemv_split_scratch(const Dense & d, const OpContext & ctx) {
    const DeviceWeight & w = *d.w[0];
    GemvSplitScratch     g;
    const GemvOpts       o = gemv_opts(d.w, d.nw, ctx);
    for (const int64_t rb : {std::min<int64_t>(d.rows, kGemvMaxRows), d.rows % kGemvMaxRows}) {
        if (rb <= 0) continue;
        const GemvPlan p = plan_gemv(w.format, w.n, w.k, 1, int(rb), d.nw, ctx.props->sm_count, o);
        if (p.ksplit <= 1) continue;
        g.floats   = std::max(g.floats, size_t(p.ksplit) * d.nw * size_t(rb) * size_t(w.n));
        g.counters = std::max(g.counters, size_t(p.counters()));
    }
    return g;
}

size_t gemv_scratch(const Dense & d, const OpContext & ctx) {
    const DeviceWeight &   w = *d.w[0];
    const GemvSplitScratch g = gemv_split_scratch(d, ctx);
    size_t                 b = 0;
    if (w.perm || !rows_aligned(d)) b += aligned(size_t(d.rows * w.k) * 4);
    if (g.floats > 0) b += aligned(g.floats * 4) + aligned(g.counters * 4);
    return b;
}

size_t scratch_bytes(const Dense & d, const OpContext & ctx) {
    switch (choose(d)) {
        case Path::Gemv: return gemv_scratch(d, ctx);
        case Path::Gemm: return gemm_scratch(d.rows, d.w[0]->k, dense_gemm_plan(d, ctx));
        case Path::Generic: return 0;
        case Path::Unfused: {
            Dense g = d, u = d;
            g.nw = u.nw = 1;
            u.w[0]      = d.w[1];
            return aligned(size_t(d.rows * d.w[0]->n) * 4) + std::max(scratch_bytes(g, ctx), scratch_bytes(u, ctx));
        }
    }
    return 0;
}

// INT4 weights with zero points take the decoder that reads them.
int32_t int4_zeros(const DeviceWeight & w) { return w.format == WeightFormat::INT4 && w.zeros != nullptr; }

void run_gemv(const Dense & d, Scratch & scratch, const OpContext & ctx) {
    const DeviceWeight & w = *d.w[0];
    const int64_t        N = w.n, K = w.k;
    const float *        staged = nullptr;
    if (w.perm || !rows_aligned(d)) {
        auto * buf = static_cast<float *>(scratch.take(size_t(d.rows * K) * 4));
        x_to_f32_rows(d.x, d.rows, K, w.perm, nullptr, Ids{}, buf, ctx.stream);
        staged = buf;
    }
    float *        partial  = nullptr;
    uint32_t *     counters = nullptr;
    const GemvOpts o        = gemv_opts(d.w, d.nw, ctx);
    for (int64_t b0 = 0; b0 < d.rows; b0 += kGemvMaxRows) {
        const int      rb = int(std::min<int64_t>(d.rows - b0, kGemvMaxRows));
        const GemvPlan p  = plan_gemv(w.format, N, K, 1, rb, d.nw, ctx.props->sm_count, o);
        GemvArgs       a;
        for (int i = 0; i < d.nw; ++i) a.w[i] = *d.w[i];
        if (d.nw == 1) a.w[1] = a.w[0];
        for (int r = 0; r < kGemvMaxRows; ++r) {
            const int64_t row = b0 + (r < rb ? r : 0);
            a.x[r]            = staged ? staged + row * K : row_ptr(d.x, row);
        }
        a.n = N;
        a.k = K;
        a.rows = a.out_rows = rb;
        a.int4_zeros       = int4_zeros(*d.w[0]) || (d.nw == 2 && int4_zeros(*d.w[1]));
        a.pdl              = pdl_enabled();
        a.y                = d.y + b0 * N;
        if (p.ksplit > 1) {
            if (!partial) {
                const GemvSplitScratch g = gemv_split_scratch(d, ctx);
                partial                  = static_cast<float *>(scratch.take(g.floats * 4));
                counters                 = static_cast<uint32_t *>(scratch.take(g.counters * 4));
            }
            SPARK_CUDA_CHECK(cudaMemsetAsync(counters, 0, size_t(p.counters()) * 4, ctx.stream));
            a.partial  = partial;
            a.counters = counters;
        }
        gemv_launch_fmt(w.format, p, d.nw == 2, a, ctx.stream);
    }
}

void run_gemm(const Dense & d, Scratch & scratch, const OpContext & ctx) {
    const DeviceWeight & w = *d.w[0];
    const GemmPlan       p = dense_gemm_plan(d, ctx);
    GemmArgs             a;
    gemm_prepare(a, p, d.x, d.rows, w.k, w.perm, scratch, ctx);
    a.n = w.n;
    for (int i = 0; i < d.nw; ++i) a.w[i] = *d.w[i];
    if (d.nw == 1) a.w[1] = a.w[0];
    a.y = d.y;
    gemm_launch_fmt(w.format, p.mt, d.nw == 2, a, p.grid, ctx.stream);
}

void run_generic_dense(const Dense & d, const OpContext & ctx) {
    GenericArgs a;
    a.x    = d.x;
    a.rows = d.rows;
    a.n    = d.w[0]->n;
    a.k    = d.w[0]->k;
    for (int i = 0; i < d.nw; ++i) a.w[i] = *d.w[i];
    a.glu = d.nw == 2;
    a.y   = d.y;
    generic_matmul(a, ctx.stream);
}

void run_dense(const Dense & d, Scratch & scratch, const OpContext & ctx) {
    switch (choose(d)) {
        case Path::Gemv: return run_gemv(d, scratch, ctx);
        case Path::Gemm: return run_gemm(d, scratch, ctx);
        case Path::Generic: return run_generic_dense(d, ctx);
        case Path::Unfused: {
            // gate -> y, up -> a buffer, then y = silu(y) * up in place.
            Dense g = d, u = d;
            g.nw = u.nw = 1;
            u.w[0]      = d.w[1];
            u.y         = static_cast<float *>(scratch.take(size_t(d.rows * d.w[0]->n) * 4));
            const size_t mark = scratch.used;
            run_dense(g, scratch, ctx);
            scratch.used = mark;  // the gate's scratch is free again once its kernels are queued
            run_dense(u, scratch, ctx);
            swiglu_rows(d.y, u.y, d.rows * d.w[0]->n, d.y, ctx.stream);
            return;
        }
    }
}

// Contiguous activation rows [rows][k] at `buf` as XRows.
XRows contiguous_rows(const float * buf, int64_t rows, int64_t k) {
    XRows r;
    r.base = reinterpret_cast<const char *>(buf);
    r.ne1  = rows;
    r.ne2  = 1;
    r.nb1  = k * 4;
    r.nb2 = r.nb3 = rows * k * 4;
    return r;
}

void exec_dense(const Dense & d, const OpContext & ctx) {
    if (d.rows <= 0 || d.w[0]->n <= 0) return;
    const size_t stage = d.stage_x ? aligned(size_t(d.rows * d.w[0]->k) * 4) : 0;
    const size_t bytes = stage + scratch_bytes(d, ctx);
    Scratch      scratch;
    if (bytes > 0) scratch.base = static_cast<char *>(ctx.workspace->get(bytes));
    if (!d.stage_x) return run_dense(d, scratch, ctx);
    // Every kernel below reads the copy; y may then overwrite the original.
    Dense  c   = d;
    auto * buf = static_cast<float *>(scratch.take(size_t(d.rows * d.w[0]->k) * 4));
    x_to_f32_rows(d.x, d.rows, d.w[0]->k, nullptr, nullptr, Ids{}, buf, ctx.stream);
    c.x       = contiguous_rows(buf, d.rows, d.w[0]->k);
    c.stage_x = false;
    run_dense(c, scratch, ctx);
}

XRows dense_rows(const Tensor & x) {
    XRows r;
    r.base = static_cast<const char *>(x.data);
    r.ne1  = x.ne[1];
    r.ne2  = x.ne[2];
    r.nb1  = int64_t(x.nb[1]);
    r.nb2  = int64_t(x.nb[2]);
    r.nb3  = int64_t(x.nb[3]);
    return r;
}

// ---- MATMUL_ID -------------------------------------------------------------------------------------

struct Moe {
    const DeviceWeight * table[2] = {nullptr, nullptr};
    DeviceWeight         w0[2];  // host copies of expert 0 (format and shape)
    int                  nw   = 1;
    bool                 fast = true;
    bool                 perm  = false;
    bool                 zeros = false;  // some INT4 expert has zero points
    bool                 mma   = true;   // every expert takes the tensor-core decode GEMV (gemv_mma_ok)
    XRows                x;  // pair mode
    Ids                  ids;
    int64_t              n_tok = 0;
    float *              y     = nullptr;  // [pairs][N]
    // The output overlaps the activations / the ids (see Dense::stage_x): copy them first.
    bool   stage_x   = false;
    size_t ids_bytes = 0;  // > 0: copy the ids (their byte span)
    // The GEMV may read the ids before its wait (OpContext::ids_before_wait), as long as it is the
    // op's first launch (no staging kernel in between).
    bool ids_early = false;
};

enum class MoePath { Gemv, Grouped, Generic, Unfused };

MoePath choose(const Moe & m) {
    const ForcePath force = overrides().path;
    if (!m.fast || force == ForcePath::Generic) return MoePath::Generic;
    if (m.nw == 2 && m.perm) return MoePath::Unfused;
    const int64_t pairs = int64_t(m.ids.k_slots) * m.n_tok;
    const bool    gemm_ok = m.w0[0].k % kGemmBK == 0;
    if (force == ForcePath::Gemm && gemm_ok) return MoePath::Grouped;
    if (force == ForcePath::Gemv && pairs <= 65535) return MoePath::Gemv;
    if (m.n_tok <= kGemvMaxRows && pairs <= 65535) return MoePath::Gemv;
    if (gemm_ok) return MoePath::Grouped;
    return pairs <= 65535 ? MoePath::Gemv : MoePath::Generic;
}

GemvOpts moe_gemv_opts(const Moe & m, const OpContext & ctx) {
    const DeviceWeight * w[1] = {&m.w0[0]};
    GemvOpts             o    = gemv_opts(w, 1, ctx);
    o.mma                     = o.mma && m.mma;
    return o;
}

bool moe_x_aligned(const Moe & m) {
    return reinterpret_cast<uintptr_t>(m.x.base) % 16 == 0 && m.x.nb1 % 16 == 0 && m.x.nb2 % 16 == 0;
}

struct GroupedLayout {
    int     mt = 4, bm = 128;
    int64_t max_tiles = 0;
};

GroupedLayout grouped_layout(const Moe & m) {
    GroupedLayout g;
    const int64_t pairs  = int64_t(m.ids.k_slots) * m.n_tok;
    const int64_t active = std::min<int64_t>(pairs, m.ids.n_experts);
    g.mt                 = pairs / std::max<int64_t>(1, active) >= 64 ? 4 : 1;  // rows per expert on average
    g.bm                 = gemm_bm(g.mt);
    g.max_tiles          = pairs / g.bm + active + 1;
    return g;
}

size_t scratch_bytes(const Moe & m, const OpContext & ctx) {
    const int64_t pairs = int64_t(m.ids.k_slots) * m.n_tok;
    const int64_t N = m.w0[0].n, K = m.w0[0].k;
    switch (choose(m)) {
        case MoePath::Gemv: {
            size_t b = 0;
            if (m.perm || !moe_x_aligned(m)) b += aligned(size_t(pairs * K) * 4);
            const GemvPlan p = plan_gemv(m.w0[0].format, N, K, pairs, 1, m.nw, ctx.props->sm_count, moe_gemv_opts(m, ctx));
            if (p.ksplit > 1) b += aligned(size_t(p.ksplit) * m.nw * size_t(pairs * N) * 4) + aligned(size_t(p.counters()) * 4);
            return b;
        }
        case MoePath::Grouped: {
            const GroupedLayout g = grouped_layout(m);
            return aligned(size_t(moe_route_ints(pairs, m.ids.n_experts, g.max_tiles)) * 4) + gemm_scratch(pairs, K, GemmPlan{});  // (no K split)
        }
        case MoePath::Generic: return 0;
        case MoePath::Unfused: {
            Moe g = m, u = m;
            g.nw = u.nw = 1;
            u.table[0]  = m.table[1];
            u.w0[0]     = m.w0[1];
            return aligned(size_t(pairs * N) * 4) + std::max(scratch_bytes(g, ctx), scratch_bytes(u, ctx));
        }
    }
    return 0;
}

void run_moe(const Moe & m, Scratch & scratch, const OpContext & ctx) {
    const int64_t pairs = int64_t(m.ids.k_slots) * m.n_tok;
    const int64_t N = m.w0[0].n, K = m.w0[0].k;
    switch (choose(m)) {
        case MoePath::Gemv: {
            GemvArgs a;
            a.w[0] = m.w0[0];
            a.w[1] = m.w0[m.nw - 1];
            a.table[0] = m.table[0];
            a.table[1] = m.table[m.nw - 1];
            a.ids      = m.ids;
            if (m.perm || !moe_x_aligned(m)) {
                auto * buf = static_cast<float *>(scratch.take(size_t(pairs * K) * 4));
                x_to_f32_rows(m.x, pairs, K, nullptr, m.perm ? m.table[0] : nullptr, m.ids, buf, ctx.stream);
                a.xbase = buf;
                a.x_sj  = K;
                a.x_st  = K * m.ids.k_slots;
            } else {
                a.xbase = reinterpret_cast<const float *>(m.x.base);
                a.x_sj  = m.x.nb1 / 4;
                a.x_st  = m.x.nb2 / 4;
            }
            a.n = N;
            a.k = K;
            a.rows     = 1;
            a.out_rows = int32_t(pairs);
            const GemvPlan p = plan_gemv(m.w0[0].format, N, K, pairs, 1, m.nw, ctx.props->sm_count, moe_gemv_opts(m, ctx));
            a.int4_zeros       = m.zeros;
            a.pdl              = pdl_enabled();
            a.y                = m.y;
            // Staging kernels (or a split's memset) would come between: then wait as usual. The FMA
            // kernel keeps waiting first: the gate/up FMA GEMV before it lets it start only after its
            // own main loop, too late for the early loads to pay (H100, 30B-A3B fp8: 347.9 against
            // 350.2 t/s).
            a.ids_early        = m.ids_early && !(m.perm || !moe_x_aligned(m)) && p.ksplit == 1 && p.mma;
            if (p.ksplit > 1) {
                a.partial  = static_cast<float *>(scratch.take(size_t(p.ksplit) * m.nw * size_t(pairs * N) * 4));
                a.counters = static_cast<uint32_t *>(scratch.take(size_t(p.counters()) * 4));
                SPARK_CUDA_CHECK(cudaMemsetAsync(a.counters, 0, size_t(p.counters()) * 4, ctx.stream));
            }
            gemv_launch_fmt(m.w0[0].format, p, m.nw == 2, a, ctx.stream);
            ctx.last_waits_first = !a.ids_early;  // (its trigger follows its wait for the ids)
            return;
        }
        case MoePath::Grouped: {
            const GroupedLayout g    = grouped_layout(m);
            const int32_t       E    = m.ids.n_experts;
            auto *              ints = static_cast<int32_t *>(scratch.take(size_t(moe_route_ints(pairs, E, g.max_tiles)) * 4));
            int32_t *           offsets = ints;
            int32_t *           order   = offsets + (E + 1);
            int32_t *           tiles   = order + pairs;
            int32_t *           n_tiles = tiles + 2 * g.max_tiles;
            auto *              xh      = static_cast<uint16_t *>(scratch.take(size_t(pairs * K) * 2));
            auto *              xs      = static_cast<float *>(scratch.take(size_t(pairs) * 4));
            moe_route(m.ids, m.n_tok, g.bm, g.max_tiles, offsets, order, tiles, n_tiles, ctx.stream);
            x_to_f16_rows(m.x, pairs, K, nullptr, order, offsets + E, m.perm ? m.table[0] : nullptr, m.ids, xh, xs,
                          ctx.stream);
            GemmArgs a;
            a.a           = xh;
            a.a_inv_scale = xs;
            a.lda         = K;
            a.m           = pairs;
            a.n           = N;
            a.k           = K;
            a.w[0]        = m.w0[0];
            a.w[1]        = m.w0[m.nw - 1];
            a.table[0]    = m.table[0];
            a.table[1]    = m.table[m.nw - 1];
            a.tiles       = tiles;
            a.n_tiles     = n_tiles;
            a.expert_end  = offsets + 1;
            a.out_rows    = order;
            a.y           = m.y;
            const dim3 grid(unsigned(g.max_tiles), unsigned(ceil_div(N, gemm_bn(m.nw == 2))));
            gemm_launch_fmt(m.w0[0].format, g.mt, m.nw == 2, a, grid, ctx.stream);
            zero_invalid_pairs(m.ids, m.n_tok, N, m.y, ctx.stream);
            return;
        }
        case MoePath::Generic: {
            GenericArgs a;
            a.x        = m.x;
            a.rows     = pairs;
            a.n        = N;
            a.k        = K;
            a.w[0]     = m.w0[0];
            a.w[1]     = m.w0[m.nw - 1];
            a.table[0] = m.table[0];
            a.table[1] = m.table[m.nw - 1];
            a.ids      = m.ids;
            a.glu      = m.nw == 2;
            a.y        = m.y;
            generic_matmul(a, ctx.stream);
            return;
        }
        case MoePath::Unfused: {
            Moe g = m, u = m;
            g.nw = u.nw = 1;
            u.table[0]  = m.table[1];
            u.w0[0]     = m.w0[1];
            u.y         = static_cast<float *>(scratch.take(size_t(pairs * N) * 4));
            u.ids_early = false;  // (its launch follows g's)
            const size_t mark = scratch.used;
            run_moe(g, scratch, ctx);
            scratch.used = mark;
            run_moe(u, scratch, ctx);
            swiglu_rows(m.y, u.y, pairs * N, m.y, ctx.stream);
            ctx.last_waits_first = false;
            return;
        }
    }
}

// Host-side description of a MATMUL_ID node's experts: format checks over all of them.
void describe_experts(const Tensor & t, int i, Moe & m, const OpContext & ctx) {
    if (t.n_experts <= 0 || !t.experts) fail(SPARK_ERR_INTERNAL, "matmul_id: no experts");
    const DeviceWeight & e0 = device_weight(t.experts[0]);
    m.w0[i]                 = e0;
    m.table[i]              = ctx.expert_table(ctx.backend, t.experts, t.n_experts);
    for (int32_t e = 0; e < t.n_experts; ++e) {
        const DeviceWeight & w = device_weight(t.experts[e]);
        if (w.format != e0.format || w.n != e0.n || w.k != e0.k)
            fail(SPARK_ERR_UNSUPPORTED, "matmul_id: experts differ in format or shape (expert %d)", e);
        m.fast = m.fast && chunk_ok(w);
        m.perm  = m.perm || w.perm != nullptr;
        m.zeros = m.zeros || int4_zeros(w);
        m.mma   = m.mma && gemv_mma_ok(w);
    }
}

Moe moe_problem(const Tensor & mm, const OpContext & ctx) {
    const Tensor & x   = *mm.src[0];
    const Tensor & ids = *mm.src[1];
    if (x.type != DType::F32 || x.nb[0] != 4 || ids.type != DType::I32 || ids.nb[0] != 4)
        fail(SPARK_ERR_INTERNAL, "matmul_id: expects F32 activations and I32 ids with contiguous rows");
    Moe m;
    describe_experts(mm, 0, m, ctx);
    if (x.ne[0] != m.w0[0].k) fail(SPARK_ERR_SHAPE_MISMATCH, "matmul_id: input has %lld columns, experts expect %lld", (long long) x.ne[0], (long long) m.w0[0].k);
    m.ids.p         = static_cast<const int32_t *>(ids.data);
    m.ids.s0        = int64_t(ids.nb[0] / 4);
    m.ids.s1        = int64_t(ids.nb[1] / 4);
    m.ids.k_slots   = int32_t(ids.ne[0]);
    m.ids.n_experts = mm.n_experts;
    m.n_tok         = ids.ne[1];
    m.x.base        = static_cast<const char *>(x.data);
    m.x.nb1         = x.ne[1] == 1 ? 0 : int64_t(x.nb[1]);
    m.x.nb2         = int64_t(x.nb[2]);
    m.x.k_slots     = m.ids.k_slots;
    return m;
}

void exec_moe(const Moe & m, const OpContext & ctx) {
    if (m.n_tok <= 0 || m.ids.k_slots <= 0 || m.w0[0].n <= 0) return;
    const int64_t pairs = int64_t(m.ids.k_slots) * m.n_tok, K = m.w0[0].k;
    const size_t  stage = (m.stage_x ? aligned(size_t(pairs * K) * 4) : 0) + aligned(m.ids_bytes);
    const size_t  bytes = stage + scratch_bytes(m, ctx);
    Scratch       scratch;
    if (bytes > 0) scratch.base = static_cast<char *>(ctx.workspace->get(bytes));
    if (!m.stage_x && m.ids_bytes == 0) return run_moe(m, scratch, ctx);
    Moe c       = m;
    c.ids_early = false;  // a staging launch comes first
    if (m.ids_bytes > 0) {
        void * ids = scratch.take(m.ids_bytes);
        SPARK_CUDA_CHECK(cudaMemcpyAsync(ids, m.ids.p, m.ids_bytes, cudaMemcpyDeviceToDevice, ctx.stream));
        c.ids.p = static_cast<const int32_t *>(ids);
    }
    if (m.stage_x) {  // pair rows [pairs][K]
        auto * buf = static_cast<float *>(scratch.take(size_t(pairs * K) * 4));
        x_to_f32_rows(m.x, pairs, K, nullptr, nullptr, Ids{}, buf, ctx.stream);
        c.x.base = reinterpret_cast<const char *>(buf);
        c.x.nb1  = K * 4;
        c.x.nb2  = K * 4 * m.ids.k_slots;
    }
    c.stage_x   = false;
    c.ids_bytes = 0;
    run_moe(c, scratch, ctx);
}

// Whether the byte spans of two tensors overlap.
bool overlaps(const Tensor & a, const Tensor & b) {
    const auto * pa = static_cast<const char *>(a.data);
    const auto * pb = static_cast<const char *>(b.data);
    return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

void check_output(const Tensor & t, int64_t n) {
    if (t.type != DType::F32 || !t.is_contiguous() || t.ne[0] != n)
        fail(SPARK_ERR_INTERNAL, "matmul: output must be contiguous F32 with %lld columns", (long long) n);
}

}  // namespace
}  // namespace mm

void op_matmul(const Tensor & t, const OpContext & ctx) {
    const Tensor & x = *t.src[0];
    if (x.type != DType::F32 || x.nb[0] != 4) fail(SPARK_ERR_INTERNAL, "matmul: activations must be F32 with contiguous rows");
    mm::Dense d;
    d.w[0] = &device_weight(*t.weight);
    if (x.ne[0] != d.w[0]->k)
        fail(SPARK_ERR_SHAPE_MISMATCH, "matmul: input has %lld columns, weight expects %lld", (long long) x.ne[0], (long long) d.w[0]->k);
    mm::check_output(t, d.w[0]->n);
    d.x    = mm::dense_rows(x);
    d.rows = x.nrows();
    d.y    = static_cast<float *>(t.data);
    mm::exec_dense(d, ctx);
}

// ---- several MATMUL nodes over the same activations: one GEMV launch --------------------------------
namespace mm {
namespace {

// The reason a set of MATMUL nodes cannot share one launch, or nullptr.
const char * multi_refusal(const Tensor * const * mms, int count) {
    static_assert(kGemvMaxMats == kGemmMaxMats);
    if (count < 2 || count > kGemvMaxMats) return "count";
    const Tensor * x = mms[0] ? mms[0]->src[0] : nullptr;
    if (!x || x->type != DType::F32 || x->nb[0] != 4) return "activations";
    const int64_t rows = x->nrows();
    if (rows <= 0) return "rows";
    const bool      gemm  = rows > kGemvMaxRows;  // prefill: one GEMM launch, else one decode GEMV
    const ForcePath force = overrides().path;
    if (force != ForcePath::Auto && force != (gemm ? ForcePath::Gemm : ForcePath::Gemv)) return "forced path";
    const DeviceWeight * w0 = nullptr;
    for (int i = 0; i < count; ++i) {
        const Tensor * t = mms[i];
        if (!t || t->op != Op::MATMUL || t->src[0] != x || !t->weight) return "not a MATMUL of the same input";
        const DeviceWeight & w = device_weight(*t->weight);
        if (!w0) w0 = &w;
        if (w.format != w0->format || w.k != w0->k || w.k != x->ne[0]) return "format or K";
        if (gemm && w.k % kGemmBK != 0) return "K (GEMM)";
        if (!chunk_ok(w) || w.perm) return "layout";  // act-order weights read x in their own orders
        if (t->type != DType::F32 || !t->is_contiguous() || t->ne[0] != w.n || t->nrows() != rows) return "output";
        if (overlaps(*t, *x)) return "output overlaps the input";
        for (int j = 0; j < i; ++j)
            if (overlaps(*t, *mms[j])) return "outputs overlap";
    }
    return nullptr;
}

// Prefill: the weights' column tiles side by side in one GEMM launch over one F16 conversion.
void exec_multi_gemm(const Tensor * const * mms, int count, const OpContext & ctx) {
    const Tensor & x    = *mms[0]->src[0];
    const int64_t  rows = x.nrows(), K = device_weight(*mms[0]->weight).k;
    GemmArgs       a;
    a.n_mats           = count;
    int32_t tiles      = 0;
    for (int i = 0; i < count; ++i) {
        a.w[i]         = device_weight(*mms[i]->weight);
        a.mat_n[i]     = a.w[i].n;
        a.mat_y[i]     = static_cast<float *>(mms[i]->data);
        a.mat_tile0[i] = tiles;
        tiles += int32_t(ceil_div(a.w[i].n, int64_t(gemm_bn(false))));
    }
    a.mat_tile0[count] = tiles;
    a.n                = a.mat_n[0];
    a.y                = a.mat_y[0];
    const GemmPlan p   = plan_gemm(rows, tiles, K, ctx.props->sm_count);
    Scratch        scratch;
    scratch.base = static_cast<char *>(ctx.workspace->get(gemm_scratch(rows, K, p)));
    gemm_prepare(a, p, dense_rows(x), rows, K, nullptr, scratch, ctx);
    gemm_launch_fmt(a.w[0].format, p.mt, false, a, p.grid, ctx.stream);
}

void exec_multi(const Tensor * const * mms, int count, const OpContext & ctx) {
    const Tensor &       x  = *mms[0]->src[0];
    if (x.nrows() > kGemvMaxRows) return exec_multi_gemm(mms, count, ctx);
    const DeviceWeight * ws[kGemvMaxMats] = {};
    int64_t              ns[kGemvMaxMats] = {};
    int64_t              ntot = 0;
    for (int i = 0; i < count; ++i) {
        ws[i] = &device_weight(*mms[i]->weight);
        ns[i] = ws[i]->n;
        ntot += ns[i];
    }
    const DeviceWeight & w0   = *ws[0];
    const int64_t        rows = x.nrows(), K = w0.k;
    GemvOpts             o    = gemv_opts(ws, count, ctx);
    o.n_mats                  = count;
    o.mat_n                   = ns;
    const GemvPlan p          = plan_gemv(w0.format, ntot, K, 1, int(rows), 1, ctx.props->sm_count, o);
    Dense          d;  // for the row addressing helpers
    d.x    = dense_rows(x);
    d.rows = rows;
    const bool stage = !rows_aligned(d);
    size_t     bytes = stage ? aligned(size_t(rows * K) * 4) : 0;
    if (p.ksplit > 1) bytes += aligned(size_t(p.ksplit) * size_t(rows * ntot) * 4) + aligned(size_t(p.counters()) * 4);
    Scratch scratch;
    if (bytes > 0) scratch.base = static_cast<char *>(ctx.workspace->get(bytes));
    const float * staged = nullptr;
    if (stage) {
        auto * buf = static_cast<float *>(scratch.take(size_t(rows * K) * 4));
        x_to_f32_rows(d.x, rows, K, nullptr, nullptr, Ids{}, buf, ctx.stream);
        staged = buf;
    }
    GemvArgs a;
    a.n_mats    = count;
    int64_t row0 = 0;
    int32_t tile = 0;
    for (int i = 0; i < count; ++i) {
        a.w[i]         = *ws[i];
        a.mat_n[i]     = ns[i];
        a.mat_row0[i]  = row0;
        a.mat_tile0[i] = tile;
        a.mat_y[i]     = static_cast<float *>(mms[i]->data);
        row0 += ns[i];
        tile += int32_t(ceil_div(ns[i], int64_t(p.rows_per_block)));
    }
    a.mat_tile0[count] = tile;
    for (int r = 0; r < kGemvMaxRows; ++r) {
        const int64_t row = r < rows ? r : 0;
        a.x[r]            = staged ? staged + row * K : row_ptr(d.x, row);
    }
    a.n = ntot;
    a.k = K;
    a.rows = a.out_rows = int32_t(rows);
    for (int i = 0; i < count; ++i) a.int4_zeros = a.int4_zeros || int4_zeros(*ws[i]);
    a.pdl = pdl_enabled();
    if (p.ksplit > 1) {
        a.partial  = static_cast<float *>(scratch.take(size_t(p.ksplit) * size_t(rows * ntot) * 4));
        a.counters = static_cast<uint32_t *>(scratch.take(size_t(p.counters()) * 4));
        SPARK_CUDA_CHECK(cudaMemsetAsync(a.counters, 0, size_t(p.counters()) * 4, ctx.stream));
    }
    if (unsigned(tile) != p.grid.x) fail(SPARK_ERR_INTERNAL, "matmul_multi: %d row tiles, grid of %u", tile, p.grid.x);
    gemv_launch_fmt(w0.format, p, false, a, ctx.stream);
}

}  // namespace
}  // namespace mm

bool matmul_multi_supported(const Tensor * const * matmuls, int count, const OpContext &) {
    return mm::multi_refusal(matmuls, count) == nullptr;
}

void op_matmul_multi(const Tensor * const * matmuls, int count, const OpContext & ctx) {
    if (mm::multi_refusal(matmuls, count) != nullptr) {
        for (int i = 0; i < count; ++i) op_matmul(*matmuls[i], ctx);
        return;
    }
    mm::exec_multi(matmuls, count, ctx);
}

void op_matmul_id(const Tensor & t, const OpContext & ctx) {
    mm::Moe m = mm::moe_problem(t, ctx);
    mm::check_output(t, m.w0[0].n);
    m.y         = static_cast<float *>(t.data);
    m.ids_early = ctx.ids_before_wait;
    mm::exec_moe(m, ctx);
}

void op_matmul_swiglu(const Tensor & swiglu, const OpContext & ctx) {
    const Tensor * g = swiglu.src[0];
    const Tensor * u = swiglu.src[1];
    if (!g || !u || g->op != u->op || g->src[0] != u->src[0])
        fail(SPARK_ERR_INTERNAL, "matmul_swiglu: SWIGLU sources must be two matmuls over the same input");
    if (g->op == Op::MATMUL) {
        const Tensor & x = *g->src[0];
        if (x.type != DType::F32 || x.nb[0] != 4) fail(SPARK_ERR_INTERNAL, "matmul: activations must be F32 with contiguous rows");
        mm::Dense d;
        d.w[0] = &device_weight(*g->weight);
        d.w[1] = &device_weight(*u->weight);
        d.nw   = 2;
        if (x.ne[0] != d.w[0]->k || d.w[1]->k != d.w[0]->k || d.w[1]->n != d.w[0]->n)
            fail(SPARK_ERR_SHAPE_MISMATCH, "matmul_swiglu: gate [%lld, %lld] and up [%lld, %lld] do not match the input (%lld)",
                 (long long) d.w[0]->n, (long long) d.w[0]->k, (long long) d.w[1]->n, (long long) d.w[1]->k, (long long) x.ne[0]);
        mm::check_output(swiglu, d.w[0]->n);
        d.x       = mm::dense_rows(x);
        d.rows    = x.nrows();
        d.y       = static_cast<float *>(swiglu.data);
        d.stage_x = mm::overlaps(swiglu, x);
        mm::exec_dense(d, ctx);
        return;
    }
    if (g->op != Op::MATMUL_ID || g->src[1] != u->src[1]) fail(SPARK_ERR_INTERNAL, "matmul_swiglu: unexpected sources");
    mm::Moe m = mm::moe_problem(*g, ctx);
    mm::describe_experts(*u, 1, m, ctx);
    if (m.w0[1].format != m.w0[0].format || m.w0[1].n != m.w0[0].n || m.w0[1].k != m.w0[0].k) {
        m.fast = false;  // the generic kernel takes any pair of formats
        if (m.w0[1].n != m.w0[0].n || m.w0[1].k != m.w0[0].k) fail(SPARK_ERR_SHAPE_MISMATCH, "matmul_swiglu: gate and up experts differ in shape");
    }
    m.nw        = 2;
    m.ids_early = ctx.ids_before_wait;
    mm::check_output(swiglu, m.w0[0].n);
    m.y         = static_cast<float *>(swiglu.data);
    m.stage_x   = mm::overlaps(swiglu, *g->src[0]);
    m.ids_bytes = mm::overlaps(swiglu, *g->src[1]) ? g->src[1]->nbytes() : 0;
    mm::exec_moe(m, ctx);
}

const char * kernel_paths(int cc) {
    if (!cc_supported(cc)) return "unsupported (compute capability below 8.0)";
    const bool mma = mm::gemv_mma_enabled(cc);
    return mma ? "f32=gemv-fma/gemm-f16-mma f16=gemv-fma/gemm-f16-mma(cp.async) bf16=gemv-fma/gemm-f16-mma "
                 "nvfp4=gemv-f16-mma(x split hi/mid/lo)/gemm-dequant-f16-mma int4=gemv-f16-mma(g%128; else lop3-magic)/gemm-dequant-f16-mma "
                 "fp8=gemv-f16bits/gemm-dequant-f16-mma moe=gemv-ids(1 launch)/grouped-gemm(device routing) "
                 "swiglu=fused-gate-up multi=one-gemv/gemm-launch"
               : "f32=gemv-fma/gemm-f16-mma f16=gemv-fma/gemm-f16-mma(cp.async) bf16=gemv-fma/gemm-f16-mma "
                 "nvfp4=gemv-f16bits/gemm-dequant-f16-mma int4=gemv-lop3-magic/gemm-dequant-f16-mma "
                 "fp8=gemv-f16bits/gemm-dequant-f16-mma moe=gemv-ids(1 launch)/grouped-gemm(device routing) "
                 "swiglu=fused-gate-up multi=one-gemv/gemm-launch";
}

}  // namespace spark::cuda
