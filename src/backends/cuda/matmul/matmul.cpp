// Host side of the CUDA matmuls: describes each node as a problem, plans it (op_plan.h: the path, the
// launch parameters and the workspace, one object for both) and launches what the plan says (never
// synchronises, never allocates except through ctx.workspace, reads no device data). The paths:
//
//   MATMUL      rows <= 8                 decode GEMV: tensor-core decode (gemv_mma_kernels.cuh) for INT4
//                                         with groups of a multiple of 128 and NVFP4, else the FMA
//                                         decode (gemv_kernels.cuh); SPARK_GEMV_MMA=0 keeps the FMA one
//               rows > 8, K % 32 == 0     tensor-core GEMM (gemm_kernels.cuh): F16 operands (activations
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
#include "backends/cuda/common/kernel_args.h"
#include "backends/cuda/common/launch.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/fp4/w4a4.h"
#include "backends/cuda/matmul/matmul.h"
#include "backends/cuda/matmul/op_plan.h"
#include "backends/cuda/matmul/tuning.h"
#include "backends/cuda/ops.h"
#include "common/error.h"

#include <algorithm>
#include <cstdint>

namespace spark::cuda {

namespace mm {

namespace {

void gemv_launch_fmt(WeightFormat f, const GemvPlan & p, bool glu, const GemvArgs & a, cudaStream_t s) {
    gemv_launch_planned(f, p, glu, a, s);
    SPARK_CUDA_CHECK_LAUNCH();
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

const float * row_ptr(const XRows & x, int64_t r) { return reinterpret_cast<const float *>(x.base + row_offset(x, r)); }

// The workspace of a planned op (one get()).
Scratch workspace_for(const OpPlan & plan, const OpContext & ctx) {
    Scratch      scratch;
    const size_t bytes = plan.scratch_bytes();
    if (bytes > 0) scratch.base = static_cast<char *>(ctx.workspace->get(bytes));
    return scratch;
}

// Stages the activations (F16, row scales) for the GEMM in the plan's pieces and sets its K split in
// a (counters zeroed on the stream).
void gemm_prepare(GemmArgs & a, const GemmPlan & p, const ScratchPtrs & s, const XRows & x, int64_t rows, int64_t k,
                  const int32_t * perm, const OpContext & ctx) {
    if (p.grid.y > 65535) fail(SPARK_ERR_UNSUPPORTED, "matmul: %u column tiles are too many for the GEMM grid", p.grid.y);
    x_to_f16_rows(x, rows, k, perm, nullptr, nullptr, nullptr, Ids{}, s.x_f16, s.inv_scale, ctx.stream);
    a.a            = s.x_f16;
    a.a_inv_scale  = s.inv_scale;
    a.lda          = k;
    a.m            = rows;
    a.k            = k;
    a.ksplit       = p.ksplit;
    a.kt_per_split = p.kt_per_split;
    if (p.ksplit > 1) {
        a.partial  = s.partial;
        a.counters = s.counters;
        SPARK_CUDA_CHECK(cudaMemsetAsync(a.counters, 0, size_t(p.counters()) * 4, ctx.stream));
    }
}

// Split-K buffers of a GEMV launch (shared by launches that follow each other on the stream):
// counters zeroed on the stream before it.
void gemv_split(GemvArgs & a, const GemvPlan & p, const ScratchPtrs & s, const OpContext & ctx) {
    if (p.ksplit <= 1) return;
    a.partial  = s.partial;
    a.counters = s.counters;
    SPARK_CUDA_CHECK(cudaMemsetAsync(a.counters, 0, size_t(p.counters()) * 4, ctx.stream));
}

// A planned op: its one launch, or a gate/up pair that cannot share one in turn (gate -> y, up -> a
// buffer, then y = silu(y) * up in place). run_launch(problem, launch plan, scratch, ctx) launches
// one path; out_rows x n is the output.
template <class Problem, class RunLaunch>
void run_planned(const Problem & pr, const OpPlan & plan, Scratch & scratch, const OpContext & ctx, RunLaunch run_launch,
                 int64_t out_rows, int64_t n) {
    if (!plan.unfused) return run_launch(pr, plan.launch[0], scratch, ctx);
    Problem g = half_of(pr, 0), u = half_of(pr, 1);
    u.y               = static_cast<float *>(scratch.take(plan.up_y));
    const size_t mark = scratch.used;
    run_launch(g, plan.launch[0], scratch, ctx);
    scratch.used = mark;  // the gate's scratch is free again once its kernels are queued
    run_launch(u, plan.launch[1], scratch, ctx);
    swiglu_rows(pr.y, u.y, out_rows * n, pr.y, ctx.stream);
    ctx.last_waits_first = false;
}

// ---- dense (MATMUL, fused gate/up) ---------------------------------------------------------------

void run_gemv(const Dense & d, const LaunchPlan & lp, Scratch & scratch, const OpContext & ctx) {
    const DeviceWeight & w = *d.w[0];
    const int64_t        N = w.n, K = w.k;
    const ScratchPtrs    s = carve(lp.scratch, scratch);
    if (s.x_f32) x_to_f32_rows(d.x, d.rows, K, w.perm, nullptr, Ids{}, s.x_f32, ctx.stream);
    for (int64_t b0 = 0; b0 < d.rows; b0 += kGemvMaxRows) {
        const int        rb = int(std::min<int64_t>(d.rows - b0, kGemvMaxRows));
        const GemvPlan & p  = lp.gemv_for(rb);
        GemvArgs         a;
        for (int i = 0; i < d.nw; ++i) a.w[i] = *d.w[i];
        if (d.nw == 1) a.w[1] = a.w[0];
        for (int r = 0; r < kGemvMaxRows; ++r) {
            const int64_t row = b0 + (r < rb ? r : 0);
            a.x[r]            = s.x_f32 ? s.x_f32 + row * K : row_ptr(d.x, row);
        }
        a.n = N;
        a.k = K;
        a.rows = a.out_rows = rb;
        a.int4_zeros       = int4_zeros(*d.w[0]) || (d.nw == 2 && int4_zeros(*d.w[1]));
        a.pdl              = pdl_enabled();
        a.norm             = d.norm;  // (rows <= 8: one batch)
        a.rs               = d.rs;
        a.produce          = d.produce;
        a.y                = d.y + b0 * N;
        gemv_split(a, p, s, ctx);
        gemv_launch_fmt(w.format, p, d.nw == 2, a, ctx.stream);
        ctx.last_waits_first = !p.mma;  // (the FMA kernel triggers after its main loop)
    }
}

void run_gemm(const Dense & d, const LaunchPlan & lp, Scratch & scratch, const OpContext & ctx) {
    const DeviceWeight & w = *d.w[0];
    GemmArgs             a;
    gemm_prepare(a, lp.gemm, carve(lp.scratch, scratch), d.x, d.rows, w.k, w.perm, ctx);
    a.n = w.n;
    for (int i = 0; i < d.nw; ++i) a.w[i] = *d.w[i];
    if (d.nw == 1) a.w[1] = a.w[0];
    a.y = d.y;
    gemm_launch_fmt(w.format, lp.gemm.mt, d.nw == 2, a, lp.gemm.grid, ctx.stream);
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

// W4A4 (one NVFP4 weight with activation scales, sm_120a / sm_121a): the activations quantized to
// NVFP4 with the checkpoint's activation scale, then the block-scaled FP4 GEMM (fp4/w4a4.h).
void run_w4a4(const Dense & d, const LaunchPlan & lp, Scratch & scratch, const OpContext & ctx) {
    const DeviceWeight & w = *d.w[0];
    const ScratchPtrs    s = carve(lp.scratch, scratch);
    const float *        x = row_ptr(d.x, 0);
    int64_t              stride = d.x.nb1 / 4;  // rows of one stride (op_plan.cpp: else gathered)
    if (s.x_f32) {
        x_to_f32_rows(d.x, d.rows, w.k, nullptr, nullptr, Ids{}, s.x_f32, ctx.stream);
        x      = s.x_f32;
        stride = w.k;
    }
    if (d.rows == 1) stride = w.k;
    quantize_activations_nvfp4(x, d.rows, w.k, stride, w.act_scale, s.a4_codes, s.a4_scales, ctx.stream);
    gemm_nvfp4_w4a4(w, s.a4_codes, s.a4_scales, w.act_scale, d.rows, d.y, w.n, ctx.stream);
}

void run_dense_launch(const Dense & d, const LaunchPlan & lp, Scratch & scratch, const OpContext & ctx) {
    switch (lp.path) {
        case Path::Gemv: return run_gemv(d, lp, scratch, ctx);
        case Path::Gemm: return run_gemm(d, lp, scratch, ctx);
        case Path::Generic: return run_generic_dense(d, ctx);
        case Path::W4A4: return run_w4a4(d, lp, scratch, ctx);
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
    const OpPlan plan    = plan_dense(d, *ctx.props);
    Scratch      scratch = workspace_for(plan, ctx);
    Dense        c       = d;
    if (d.stage_x) {  // every kernel below reads the copy; y may then overwrite the original
        auto * buf = static_cast<float *>(scratch.take(plan.x_copy));
        x_to_f32_rows(d.x, d.rows, d.w[0]->k, nullptr, nullptr, Ids{}, buf, ctx.stream);
        c.x = contiguous_rows(buf, d.rows, d.w[0]->k);
    }
    run_planned(c, plan, scratch, ctx, run_dense_launch, d.rows, d.w[0]->n);
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

void run_moe_gemv(const Moe & m, const LaunchPlan & lp, Scratch & scratch, const OpContext & ctx) {
    const int64_t     pairs = m.pairs(), N = m.w0[0].n, K = m.w0[0].k;
    const ScratchPtrs s     = carve(lp.scratch, scratch);
    GemvArgs          a;
    a.w[0]     = m.w0[0];
    a.w[1]     = m.w0[m.nw - 1];
    a.table[0] = m.table[0];
    a.table[1] = m.table[m.nw - 1];
    a.ids      = m.ids;
    if (s.x_f32) {
        x_to_f32_rows(m.x, pairs, K, nullptr, m.perm ? m.table[0] : nullptr, m.ids, s.x_f32, ctx.stream);
        a.xbase = s.x_f32;
        a.x_sj  = K;
        a.x_st  = K * m.ids.k_slots;
    } else {
        a.xbase = reinterpret_cast<const float *>(m.x.base);
        a.x_sj  = m.x.nb1 / 4;
        a.x_st  = m.x.nb2 / 4;
    }
    a.n = N;
    a.k = K;
    a.rows       = 1;
    a.out_rows   = int32_t(m.slot_w ? m.n_tok : pairs);
    a.int4_zeros = m.zeros;
    a.pdl        = pdl_enabled();
    a.y          = m.y;
    a.slot_w     = m.slot_w;
    a.produce    = m.produce;
    a.ids_early  = lp.ids_early;
    a.x_early    = lp.x_early;
    // The addresses from the id where the experts lie at one stride: INT4, where it was measured to
    // pay (docs/PERF.md, "The experts' addresses from the id"; NVFP4 measured level to slower, the
    // other formats not measured). Overrides::expert_grid = 0: every block reads its table entry first.
    if (overrides().expert_grid != 0 && m.w0[0].format == WeightFormat::INT4 && m.grid[0].uniform && m.grid[m.nw - 1].uniform) {
        a.grid[0] = m.grid[0];
        a.grid[1] = m.grid[m.nw - 1];
    }
    gemv_split(a, lp.gemv[0], s, ctx);
    gemv_launch_fmt(m.w0[0].format, lp.gemv[0], m.nw == 2, a, ctx.stream);
    ctx.last_waits_first = !a.ids_early;  // (its trigger follows its wait for the ids)
}

void run_moe_grouped(const Moe & m, const LaunchPlan & lp, Scratch & scratch, const OpContext & ctx) {
    const int64_t     pairs = m.pairs(), N = m.w0[0].n, K = m.w0[0].k;
    const int64_t     max_tiles = lp.gemm.grid.x;
    const int32_t     E         = m.ids.n_experts;
    const ScratchPtrs s         = carve(lp.scratch, scratch);
    int32_t *         offsets   = s.route;
    int32_t *         order     = offsets + (E + 1);
    int32_t *         tiles     = order + pairs;
    int32_t *         n_tiles   = tiles + 2 * max_tiles;
    moe_route(m.ids, m.n_tok, gemm_bm(lp.gemm.mt), max_tiles, offsets, order, tiles, n_tiles, ctx.stream);
    x_to_f16_rows(m.x, pairs, K, nullptr, order, offsets + E, m.perm ? m.table[0] : nullptr, m.ids, s.x_f16, s.inv_scale,
                  ctx.stream);
    GemmArgs a;
    a.a           = s.x_f16;
    a.a_inv_scale = s.inv_scale;
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
    gemm_launch_fmt(m.w0[0].format, lp.gemm.mt, m.nw == 2, a, lp.gemm.grid, ctx.stream);
    zero_invalid_pairs(m.ids, m.n_tok, N, m.y, ctx.stream);
}

void run_moe_generic(const Moe & m, const OpContext & ctx) {
    GenericArgs a;
    a.x        = m.x;
    a.rows     = m.pairs();
    a.n        = m.w0[0].n;
    a.k        = m.w0[0].k;
    a.w[0]     = m.w0[0];
    a.w[1]     = m.w0[m.nw - 1];
    a.table[0] = m.table[0];
    a.table[1] = m.table[m.nw - 1];
    a.ids      = m.ids;
    a.glu      = m.nw == 2;
    a.y        = m.y;
    generic_matmul(a, ctx.stream);
}

void run_moe_launch(const Moe & m, const LaunchPlan & lp, Scratch & scratch, const OpContext & ctx) {
    switch (lp.path) {
        case Path::Gemv: return run_moe_gemv(m, lp, scratch, ctx);
        case Path::Gemm: return run_moe_grouped(m, lp, scratch, ctx);
        case Path::Generic: return run_moe_generic(m, ctx);
        case Path::W4A4: break;  // (not planned for experts)
    }
}

// Host-side description of a MATMUL_ID node's experts: format checks over all of them that this
// device holds (expert parallelism leaves the others empty: absent entries of the table, whose slots
// the kernels fill with zeros; Ids::held tells the grouping kernels).
void describe_experts(const Tensor & t, int i, Moe & m, const OpContext & ctx) {
    if (t.n_experts <= 0 || !t.experts) fail(SPARK_ERR_INTERNAL, "matmul_id: no experts");
    const QWeight * held = first_held_expert(t.experts, t.n_experts);
    if (!held) fail(SPARK_ERR_INTERNAL, "matmul_id: no expert of the set is held on this device");
    const DeviceWeight & e0 = device_weight(*held);
    m.w0[i]                 = e0;
    m.table[i]              = ctx.expert_table(ctx.backend, t.experts, t.n_experts);
    for (int32_t e = 0; e < t.n_experts; ++e) {
        if (!expert_held(t.experts[e])) {
            m.absent = true;
            continue;
        }
        const DeviceWeight & w = device_weight(t.experts[e]);
        if (w.format != e0.format || w.n != e0.n || w.k != e0.k)
            fail(SPARK_ERR_UNSUPPORTED, "matmul_id: experts differ in format or shape (expert %d)", e);
        m.fast = m.fast && chunk_ok(w);
        m.perm  = m.perm || w.perm != nullptr;
        m.zeros = m.zeros || int4_zeros(w);
        m.mma   = m.mma && gemv_mma_ok(w);
    }
    if (!m.absent) m.grid[i] = expert_grid_by([&](int32_t e) -> const DeviceWeight & { return device_weight(t.experts[e]); }, t.n_experts);
}

Moe moe_problem(const Tensor & mm, const OpContext & ctx) {
    const Tensor & x   = *mm.src[0];
    const Tensor & ids = *mm.src[1];
    if (x.type != DType::F32 || x.nb[0] != 4 || ids.type != DType::I32 || ids.nb[0] != 4)
        fail(SPARK_ERR_INTERNAL, "matmul_id: expects F32 activations and I32 ids with contiguous rows");
    Moe m;
    describe_experts(mm, 0, m, ctx);
    m.ids.held = m.absent ? m.table[0] : nullptr;
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
    const int64_t pairs   = m.pairs(), K = m.w0[0].k;
    const OpPlan  plan    = plan_moe(m, *ctx.props);
    Scratch       scratch = workspace_for(plan, ctx);
    Moe           c       = m;
    if (plan.ids_copy > 0) {
        void * ids = scratch.take(plan.ids_copy);
        SPARK_CUDA_CHECK(cudaMemcpyAsync(ids, m.ids.p, plan.ids_copy, cudaMemcpyDeviceToDevice, ctx.stream));
        c.ids.p = static_cast<const int32_t *>(ids);
    }
    if (m.stage_x) {  // pair rows [pairs][K]
        auto * buf = static_cast<float *>(scratch.take(plan.x_copy));
        x_to_f32_rows(m.x, pairs, K, nullptr, nullptr, Ids{}, buf, ctx.stream);
        c.x.base = reinterpret_cast<const char *>(buf);
        c.x.nb1  = K * 4;
        c.x.nb2  = K * 4 * m.ids.k_slots;
    }
    run_planned(c, plan, scratch, ctx, run_moe_launch, pairs, m.w0[0].n);
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
    d.x      = mm::dense_rows(x);
    d.rows   = x.nrows();
    d.y      = static_cast<float *>(t.data);
    d.prompt = ctx.prompt_step;
    mm::exec_dense(d, ctx);
}

// ---- several MATMUL nodes over the same activations: one GEMV launch --------------------------------
namespace mm {
namespace {

// The reason a set of MATMUL nodes cannot share one launch, or nullptr.
const char * multi_refusal(const Tensor * const * mms, int count, const OpContext & ctx) {
    static_assert(kGemvMaxMats == kGemmMaxMats);
    if (count < 2 || count > kGemvMaxMats) return "count";
    const Tensor * x = mms[0] ? mms[0]->src[0] : nullptr;
    if (!x || x->type != DType::F32 || x->nb[0] != 4) return "activations";
    const int64_t rows = x->nrows();
    if (rows <= 0) return "rows";
    Path path;
    if (!multi_path(rows, path)) return "forced path";
    const bool gemm = path == Path::Gemm;  // prefill: one GEMM launch, else one decode GEMV
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
        if (w4a4_takes(w, rows, ctx.prompt_step, *ctx.props)) return "W4A4 (one weight per GEMM launch)";
        for (int j = 0; j < i; ++j)
            if (overlaps(*t, *mms[j])) return "outputs overlap";
    }
    return nullptr;
}

// Prefill: the weights' column tiles side by side in one GEMM launch over one F16 conversion.
void launch_multi_gemm(const Tensor * const * mms, const Multi & mu, const LaunchPlan & lp, const ScratchPtrs & s, const OpContext & ctx) {
    GemmArgs a;
    a.n_mats      = mu.count;
    int32_t tiles = 0;
    for (int i = 0; i < mu.count; ++i) {
        a.w[i]         = *mu.w[i];
        a.mat_n[i]     = a.w[i].n;
        a.mat_y[i]     = static_cast<float *>(mms[i]->data);
        a.mat_tile0[i] = tiles;
        tiles += int32_t(ceil_div(a.w[i].n, int64_t(gemm_bn(false))));
    }
    a.mat_tile0[mu.count] = tiles;
    a.n                   = a.mat_n[0];
    a.y                   = a.mat_y[0];
    gemm_prepare(a, lp.gemm, s, mu.x, mu.rows, mu.w[0]->k, nullptr, ctx);
    gemm_launch_fmt(a.w[0].format, lp.gemm.mt, false, a, lp.gemm.grid, ctx.stream);
}

// Decode: one GEMV launch whose blocks cover the concatenated output rows.
void launch_multi_gemv(const Tensor * const * mms, const Multi & mu, const LaunchPlan & lp, const ScratchPtrs & s, const OpContext & ctx) {
    const GemvPlan & p = lp.gemv[0];
    const int64_t    K = mu.w[0]->k;
    if (s.x_f32) x_to_f32_rows(mu.x, mu.rows, K, nullptr, nullptr, Ids{}, s.x_f32, ctx.stream);
    GemvArgs a;
    a.n_mats     = mu.count;
    int64_t row0 = 0;
    int32_t tile = 0;
    for (int i = 0; i < mu.count; ++i) {
        a.w[i]         = *mu.w[i];
        a.mat_n[i]     = a.w[i].n;
        a.mat_row0[i]  = row0;
        a.mat_tile0[i] = tile;
        a.mat_y[i]     = static_cast<float *>(mms[i]->data);
        row0 += a.w[i].n;
        tile += int32_t(ceil_div(a.w[i].n, int64_t(p.rows_per_block)));
    }
    a.mat_tile0[mu.count] = tile;
    for (int r = 0; r < kGemvMaxRows; ++r) {
        const int64_t row = r < mu.rows ? r : 0;
        a.x[r]            = s.x_f32 ? s.x_f32 + row * K : row_ptr(mu.x, row);
    }
    a.n = row0;
    a.k = K;
    a.rows = a.out_rows = int32_t(mu.rows);
    for (int i = 0; i < mu.count; ++i) a.int4_zeros = a.int4_zeros || int4_zeros(*mu.w[i]);
    a.pdl  = pdl_enabled();
    a.norm = mu.norm;
    a.rs   = mu.rs;
    gemv_split(a, p, s, ctx);
    if (unsigned(tile) != p.grid.x) fail(SPARK_ERR_INTERNAL, "matmul_multi: %d row tiles, grid of %u", tile, p.grid.x);
    gemv_launch_fmt(a.w[0].format, p, false, a, ctx.stream);
    ctx.last_waits_first = !p.mma;  // (the FMA kernel triggers after its main loop)
}

void exec_multi(const Tensor * const * mms, int count, const OpContext & ctx) {
    Multi mu;
    for (int i = 0; i < count; ++i) mu.w[i] = &device_weight(*mms[i]->weight);
    mu.count             = count;
    mu.x                 = dense_rows(*mms[0]->src[0]);
    mu.rows              = mms[0]->src[0]->nrows();
    const LaunchPlan lp  = plan_multi(mu, *ctx.props);
    Scratch          scratch;
    if (lp.scratch.bytes() > 0) scratch.base = static_cast<char *>(ctx.workspace->get(lp.scratch.bytes()));
    const ScratchPtrs s = carve(lp.scratch, scratch);
    if (lp.path == Path::Gemm) return launch_multi_gemm(mms, mu, lp, s, ctx);
    launch_multi_gemv(mms, mu, lp, s, ctx);
}

}  // namespace
}  // namespace mm

bool matmul_multi_supported(const Tensor * const * matmuls, int count, const OpContext & ctx) {
    return mm::multi_refusal(matmuls, count, ctx) == nullptr;
}

void op_matmul_multi(const Tensor * const * matmuls, int count, const OpContext & ctx) {
    if (mm::multi_refusal(matmuls, count, ctx) != nullptr) {
        for (int i = 0; i < count; ++i) op_matmul(*matmuls[i], ctx);
        return;
    }
    mm::exec_multi(matmuls, count, ctx);
}

// ---- ADD + RMS_NORM + the matmuls over the norm: one GEMV launch -----------------------------------
namespace mm {
namespace {

// The op's plan is one tensor-core GEMV launch over the row as it is (no staged copy, no
// conversion, no second launch): what the norm prologue rides on, planned with
// Dense/Multi::norm_prologue (blocks of kGemvNormMinRows rows or more, no K split, not the one-wave
// variant: every block reads the two addends and the norm's weight, so fewer, taller blocks; where
// no such plan exists, the separate launches measured faster: matmul.h).
bool one_mma_launch(const LaunchPlan & lp, int64_t rows) {
    if (lp.path != Path::Gemv || rows > kGemvMaxRows || lp.scratch.x_f32 != 0) return false;
    const GemvPlan & p = lp.gemv_for(int(rows));
    return p.mma && !p.mma_wave;
}

bool aligned16(const void * p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The norm's side of the fused launches below: its weight (f32 [K] or none) and `mms`, 1..4 MATMULs
// of one decode row of the norm with weights of one format and no act-order, run as one tensor-core
// GEMV launch over the row as it is (with the norm prologue's plan: norm_prologue); the reason not,
// or nullptr. Fills d (one MATMUL) or mu (several). bound: as below.
const char * norm_matmuls_refusal(const Tensor & norm, const Tensor * const * mms, int count, int64_t K, const OpContext & ctx, bool bound,
                                  bool norm_prologue, Dense & d, Multi & mu) {
    const Tensor * nw = norm.src[1];
    if (nw && (!f32_rows(*nw) || nw->ne[0] != K || nw->nrows() != 1)) return "norm weight";
    XRows x = dense_rows(norm);
    if (!bound) x.base = nullptr;  // (alignment only: the plan does not depend on where the memory goes)
    for (int i = 0; i < count; ++i) {
        const Tensor * t = mms[i];
        if (!t || t->op != Op::MATMUL || t->src[0] != &norm || !t->weight) return "not a MATMUL of the norm";
        const DeviceWeight & w = device_weight(*t->weight);
        if (w.k != K || w.format != device_weight(*mms[0]->weight).format || w.perm) return "weights";
        if (t->type != DType::F32 || !t->is_contiguous() || t->ne[0] != w.n || t->nrows() != 1) return "output";
    }
    if (count == 1) {
        d.w[0]          = &device_weight(*mms[0]->weight);
        d.x             = x;
        d.rows          = 1;
        d.prompt        = ctx.prompt_step;
        d.norm_prologue = norm_prologue;
        const OpPlan plan = plan_dense(d, *ctx.props);
        if (plan.unfused || plan.x_copy || plan.ids_copy || !one_mma_launch(plan.launch[0], 1)) return "not one tensor-core GEMV";
    } else {
        for (int i = 0; i < count; ++i) {
            mu.w[i] = &device_weight(*mms[i]->weight);
            if (!chunk_ok(*mu.w[i]) || w4a4_takes(*mu.w[i], 1, ctx.prompt_step, *ctx.props)) return "layout";
        }
        mu.count         = count;
        mu.x             = x;
        mu.rows          = 1;
        mu.norm_prologue = norm_prologue;
        if (!one_mma_launch(plan_multi(mu, *ctx.props), 1)) return "not one tensor-core GEMV";
    }
    if (bound && nw && !aligned16(nw->data)) return "alignment";
    return nullptr;
}

// The GEMV launch of the matmuls of a fused norm as the refusal above planned it (d: one MATMUL,
// mu: several; op_add_norm_matmul, op_combine_norm_matmul).
void run_norm_matmuls(Dense & d, const Multi & mu, const Tensor * const * mms, int count, const OpContext & ctx) {
    if (count == 1) {
        d.y = static_cast<float *>(mms[0]->data);
        return exec_dense(d, ctx);
    }
    const LaunchPlan lp = plan_multi(mu, *ctx.props);
    Scratch          scratch;
    if (lp.scratch.bytes() > 0) scratch.base = static_cast<char *>(ctx.workspace->get(lp.scratch.bytes()));
    launch_multi_gemv(mms, mu, lp, carve(lp.scratch, scratch), ctx);
}

// The reason ADD + RMS_NORM + `mms` cannot be one GEMV launch with the norm prologue, or nullptr.
// mms: 1..4 MATMULs over the norm. bound: the tensors have their memory (the
// dispatch), which adds the checks of addresses (alignment, outputs over inputs or each other);
// without it (the memory planner's question, fusion.h) only the nodes' structure counts. `d` / `mu`:
// the problem to run (Dense for one MATMUL, Multi for several).
const char * add_norm_refusal(const Tensor & add, const Tensor & norm, const Tensor * const * mms, int count, const OpContext & ctx, bool bound,
                              Dense & d, Multi & mu) {
    if (overrides().norm_matmul == 0) return "SPARK_NORM_MATMUL=0";
    if (add.op != Op::ADD || norm.op != Op::RMS_NORM || norm.src[0] != &add || norm.src[2] || norm.src[3]) return "nodes";
    if (norm.flags & TENSOR_OUTPUT) return "the norm is an output (the fused launch never writes it)";
    if (count < 1 || count > kGemvMaxMats || !ctx.props) return "count";
    const Tensor & a = *add.src[0];
    const Tensor & b = *add.src[1];
    const int64_t  K = add.ne[0];
    // One decode row (the kernel's NORM instantiation; verify steps of several rows keep the separate launches).
    for (const Tensor * t : {&a, &b, &add, &norm})
        if (!f32_rows(*t) || t->ne[0] != K || t->nrows() != 1) return "one row";
    // (the norm prologue's plan: blocks of 64 rows or more, one per SM at least, no K split)
    if (const char * why = norm_matmuls_refusal(norm, mms, count, K, ctx, bound, true, d, mu)) return why;
    if (!bound) return nullptr;
    // Every block reads a and b; the blocks of row tile 0 write the sum, every block its outputs' rows.
    for (const Tensor * t : {&a, &b, &add})
        if (!aligned16(t->data) || t->nb[1] % 16 != 0) return "alignment";
    const Tensor * nw = norm.src[1];
    const Tensor * outs[1 + kGemvMaxMats] = {&add};
    int            n_out                  = 1;
    for (int i = 0; i < count; ++i) outs[n_out++] = mms[i];
    for (int i = 0; i < n_out; ++i) {
        if (overlaps(*outs[i], a) || overlaps(*outs[i], b)) return "an output overlaps the addends";
        for (int j = 0; j < i; ++j)
            if (overlaps(*outs[i], *outs[j])) return "outputs overlap";
    }
    GemvNorm & g = count == 1 ? d.norm : mu.norm;
    g.a             = static_cast<const float *>(a.data);
    g.b             = static_cast<const float *>(b.data);
    g.sum           = static_cast<float *>(add.data);
    g.w             = nw ? static_cast<const float *>(nw->data) : nullptr;
    g.lda           = int64_t(a.nb[1] / 4);
    g.ldb           = int64_t(b.nb[1] / 4);
    g.ld_sum        = int64_t(add.nb[1] / 4);
    g.eps           = norm.fp[0];
    g.zero_centered = norm.ip[0] != 0;
    return nullptr;
}

}  // namespace
}  // namespace mm

bool add_norm_matmul_supported(const Tensor & add, const Tensor & norm, const Tensor * const * mms, int count, const OpContext & ctx,
                               bool with_addresses) {
    mm::Dense d;
    mm::Multi mu;
    return mm::add_norm_refusal(add, norm, mms, count, ctx, with_addresses, d, mu) == nullptr;
}

void op_add_norm_matmul(const Tensor & add, const Tensor & norm, const Tensor * const * mms, int count, const OpContext & ctx) {
    mm::Dense d;
    mm::Multi mu;
    if (mm::add_norm_refusal(add, norm, mms, count, ctx, true, d, mu) != nullptr) {  // the nodes' own launches
        op_add_rms_norm(add, norm, ctx);
        if (count == 1) return op_matmul(*mms[0], ctx);
        return op_matmul_multi(mms, count, ctx);
    }
    mm::run_norm_matmuls(d, mu, mms, count, ctx);
}

// ---- MOE_COMBINE + ADD + RMS_NORM, then the matmuls over the norm: the combine writes the norm's half -------
namespace mm {
namespace {

// The reason the combine `comb`, the ADD `add` of its output, the RMS_NORM `norm` of that sum and
// `mms` cannot run as op_combine_norm_matmul's two launches, or nullptr (bound: as add_norm_refusal).
// The fusion pass has checked that the combine and the norm have no other readers.
const char * combine_norm_refusal(const Tensor & comb, const Tensor & add, const Tensor & norm, const Tensor * const * mms, int count,
                                  const OpContext & ctx, bool bound, Dense & d, Multi & mu) {
    if (overrides().combine_norm == 0) return "SPARK_COMBINE_NORM=0";
    if (comb.op != Op::MOE_COMBINE || add.op != Op::ADD || norm.op != Op::RMS_NORM || norm.src[0] != &add || norm.src[2] || norm.src[3])
        return "nodes";
    if ((add.src[0] == &comb) == (add.src[1] == &comb)) return "the ADD does not add the combine to another row";
    if ((comb.flags | norm.flags) & TENSOR_OUTPUT) return "the combine or the norm is an output (neither is written)";
    if (count < 1 || count > kGemvMaxMats || !ctx.props) return "count";
    const Tensor & r = add.src[0] == &comb ? *add.src[1] : *add.src[0];
    const int64_t  K = add.ne[0];
    for (const Tensor * t : {&comb, &r, &add, &norm})
        if (!f32_rows(*t) || t->ne[0] != K || t->nrows() != 1) return "one row";
    const int64_t parts = combine_norm_parts(comb, add, norm);  // (without addresses: the strides alone)
    if (parts == 0) return "rows not 16-byte aligned";
    if (parts > kGemvMaxScaleParts) return "row width";
    // (the matmuls' plan as they would run anyway)
    if (const char * why = norm_matmuls_refusal(norm, mms, count, K, ctx, bound, false, d, mu)) return why;
    if (!bound) return nullptr;
    const Tensor * nw = norm.src[1];
    // The combine reads y, its weights (the shared expert and its gate) and r; it writes the sum,
    // the weighted row and, over its own output, the sums of squares; the GEMV then writes mms.
    const Tensor * ins[5] = {comb.src[0], comb.src[1], comb.src[2], comb.src[3], &r};
    const Tensor * outs[3 + kGemvMaxMats] = {&comb, &add, &norm};
    int            n_out                  = 3;
    for (int i = 0; i < count; ++i) outs[n_out++] = mms[i];
    for (int i = 0; i < n_out; ++i) {
        for (const Tensor * in : ins)
            if (in && overlaps(*outs[i], *in)) return "an output overlaps an input";
        if (nw && overlaps(*outs[i], *nw)) return "an output overlaps the norm's weight";
        for (int j = 0; j < i; ++j)
            if (overlaps(*outs[i], *outs[j])) return "outputs overlap";
    }
    GemvRowScale & rs = count == 1 ? d.rs : mu.rs;
    rs.parts          = static_cast<const float *>(comb.data);
    rs.n_parts        = int32_t(parts);
    rs.eps            = norm.fp[0];
    return nullptr;
}

}  // namespace
}  // namespace mm

bool combine_norm_matmul_supported(const Tensor & comb, const Tensor & add, const Tensor & norm, const Tensor * const * mms, int count,
                                   const OpContext & ctx, bool with_addresses) {
    mm::Dense d;
    mm::Multi mu;
    return mm::combine_norm_refusal(comb, add, norm, mms, count, ctx, with_addresses, d, mu) == nullptr;
}

namespace mm {
namespace {

// The addresses of a GEMV producer of the norm's half (op_matmul_norm_matmul, op_experts_norm_matmul)
// and of its consumer: the producer writes the sum (add), the weighted row (norm) and, over `parts_over`
// (an output nothing reads, 16-byte aligned and readable in 16-byte copies: K >= 4 x ceil(blocks / 4)
// floats), a part per block; it reads `ins`, the residual r and the norm's weight; the consumer
// writes mms. The reason they cannot, or nullptr with produce, y and the consumer's rs set.
const char * bind_norm_half(const Tensor & parts_over, const Tensor * const * ins, int n_ins, const Tensor & r, const Tensor & add,
                            const Tensor & norm, const Tensor * const * mms, int count, unsigned blocks, int64_t K, GemvNormOut & produce,
                            float *& y, Dense & d, Multi & mu) {
    const Tensor * nw = norm.src[1];
    if (!aligned16(parts_over.data) || int64_t(blocks + 3) / 4 * 4 > K) return "alignment";
    const Tensor * outs[3 + kGemvMaxMats] = {&parts_over, &add, &norm};
    int            n_out                  = 3;
    for (int i = 0; i < count; ++i) outs[n_out++] = mms[i];
    for (int i = 0; i < n_out; ++i) {
        for (int j = 0; j < n_ins; ++j)
            if (ins[j] && overlaps(*outs[i], *ins[j])) return "an output overlaps an input";
        if (overlaps(*outs[i], r) || (nw && overlaps(*outs[i], *nw))) return "an output overlaps an input";
        for (int j = 0; j < i; ++j)
            if (overlaps(*outs[i], *outs[j])) return "outputs overlap";
    }
    produce.resid         = static_cast<const float *>(r.data);
    produce.sum           = static_cast<float *>(add.data);
    produce.z             = static_cast<float *>(norm.data);
    produce.w             = nw ? static_cast<const float *>(nw->data) : nullptr;
    produce.zero_centered = norm.ip[0];
    produce.parts         = static_cast<float *>(parts_over.data);
    y                     = static_cast<float *>(parts_over.data);
    GemvRowScale & rs     = count == 1 ? d.rs : mu.rs;
    rs.parts              = static_cast<const float *>(parts_over.data);
    rs.n_parts            = int32_t(blocks);
    rs.eps                = norm.fp[0];
    return nullptr;
}

// The reason the MATMUL `mm`, the ADD of its output, the RMS_NORM `norm` of that sum and `mms` cannot
// run as op_matmul_norm_matmul's two launches, or nullptr (bound: as add_norm_refusal). The fusion
// pass has checked that mm's output and the norm have no other readers. prod: the producer.
const char * matmul_norm_refusal(const Tensor & mm, const Tensor & add, const Tensor & norm, const Tensor * const * mms, int count,
                                 const OpContext & ctx, bool bound, Dense & prod, Dense & d, Multi & mu) {
    if (overrides().combine_norm == 0) return "SPARK_COMBINE_NORM=0";
    if (mm.op != Op::MATMUL || !mm.weight || add.op != Op::ADD || norm.op != Op::RMS_NORM || norm.src[0] != &add || norm.src[2] ||
        norm.src[3])
        return "nodes";
    if ((add.src[0] == &mm) == (add.src[1] == &mm)) return "the ADD does not add the matmul to another row";
    if ((mm.flags | norm.flags) & TENSOR_OUTPUT) return "the matmul or the norm is an output (neither is written)";
    if (count < 1 || count > kGemvMaxMats || !ctx.props) return "count";
    const Tensor & r = add.src[0] == &mm ? *add.src[1] : *add.src[0];
    const Tensor & x = *mm.src[0];
    const int64_t  K = add.ne[0];
    for (const Tensor * t : {&mm, &r, &add, &norm, &x})
        if (!f32_rows(*t) || t->nrows() != 1) return "one row";
    for (const Tensor * t : {&mm, &r, &add, &norm})
        if (t->ne[0] != K || !t->is_contiguous()) return "row width";
    const DeviceWeight & w = device_weight(*mm.weight);
    if (w.n != K || w.perm) return "weight";
    // The producer: one tensor-core GEMV launch of whole K per block, at most kGemvMaxScaleParts blocks.
    prod.w[0]   = &w;
    prod.x      = dense_rows(x);
    prod.rows   = 1;
    prod.prompt = ctx.prompt_step;
    if (!bound) prod.x.base = nullptr;
    const OpPlan pp = plan_dense(prod, *ctx.props);
    if (pp.unfused || pp.x_copy || pp.ids_copy || !one_mma_launch(pp.launch[0], 1)) return "the producer is not one tensor-core GEMV";
    const GemvPlan & gp = pp.launch[0].gemv_for(1);
    if (gp.ksplit != 1 || gp.grid.x > unsigned(kGemvMaxScaleParts) || int64_t(gp.grid.x) > K) return "the producer's plan (K split, blocks)";
    if (const char * why = norm_matmuls_refusal(norm, mms, count, K, ctx, bound, false, d, mu)) return why;
    if (!bound) return nullptr;
    // The producer reads x and r and writes the sum, the weighted row and, over its own output, the parts.
    const Tensor * ins[1] = {&x};
    return bind_norm_half(mm, ins, 1, r, add, norm, mms, count, gp.grid.x, K, prod.produce, prod.y, d, mu);
}

}  // namespace
}  // namespace mm

void op_combine_norm_matmul(const Tensor & comb, const Tensor & add, const Tensor & norm, const Tensor * const * mms, int count,
                            const OpContext & ctx) {
    mm::Dense d;
    mm::Multi mu;
    if (mm::combine_norm_refusal(comb, add, norm, mms, count, ctx, true, d, mu) != nullptr) {  // the nodes' own launches
        op_moe_combine(comb, ctx);
        return op_add_norm_matmul(add, norm, mms, count, ctx);
    }
    // The sums of squares go over the combine's output, which nothing else reads: the memory plan
    // keeps it apart from the launch's outputs until its last matmul (launch_last_nodes).
    launch_combine_norm(comb, add, norm, static_cast<float *>(comb.data), ctx);
    mm::run_norm_matmuls(d, mu, mms, count, ctx);
}

bool matmul_norm_matmul_supported(const Tensor & mm, const Tensor & add, const Tensor & norm, const Tensor * const * mms, int count,
                                  const OpContext & ctx, bool with_addresses) {
    mm::Dense prod, d;
    mm::Multi mu;
    return mm::matmul_norm_refusal(mm, add, norm, mms, count, ctx, with_addresses, prod, d, mu) == nullptr;
}

void op_matmul_norm_matmul(const Tensor & mm, const Tensor & add, const Tensor & norm, const Tensor * const * mms, int count,
                           const OpContext & ctx) {
    mm::Dense prod, d;
    mm::Multi mu;
    if (mm::matmul_norm_refusal(mm, add, norm, mms, count, ctx, true, prod, d, mu) != nullptr) {  // the nodes' own launches
        op_matmul(mm, ctx);
        return op_add_norm_matmul(add, norm, mms, count, ctx);
    }
    // The parts go over the matmul's own output, which nothing else reads (as the combine's above).
    mm::exec_dense(prod, ctx);
    mm::run_norm_matmuls(d, mu, mms, count, ctx);
}

// ---- MATMUL_ID (the experts' down) + MOE_COMBINE + ADD + RMS_NORM, then the matmuls over the norm ------
namespace mm {
namespace {

// The reason the experts' down projection `down`, the combine `comb` of its output, the ADD, the
// RMS_NORM and `mms` cannot run as op_experts_norm_matmul's two launches, or nullptr (bound: as
// add_norm_refusal). The fusion pass has checked that down's and the combine's outputs and the norm
// have no other readers. prod: the producer (the experts with the combine and the norm's half).
const char * experts_norm_refusal(const Tensor & down, const Tensor & comb, const Tensor & add, const Tensor & norm, const Tensor * const * mms,
                                  int count, const OpContext & ctx, bool bound, Moe & prod, Dense & d, Multi & mu) {
    if (overrides().experts_combine == 0 || overrides().combine_norm == 0) return "SPARK_EXPERTS_COMBINE=0 or SPARK_COMBINE_NORM=0";
    if (down.op != Op::MATMUL_ID || comb.op != Op::MOE_COMBINE || comb.src[0] != &down || comb.src[2] || comb.src[3])
        return "nodes (a combine of the down projection without a shared expert)";
    if (add.op != Op::ADD || norm.op != Op::RMS_NORM || norm.src[0] != &add || norm.src[2] || norm.src[3]) return "nodes";
    if ((add.src[0] == &comb) == (add.src[1] == &comb)) return "the ADD does not add the combine to another row";
    if ((down.flags | comb.flags | norm.flags) & TENSOR_OUTPUT) return "an inner node is an output (it is not written)";
    if (count < 1 || count > kGemvMaxMats || !ctx.props) return "count";
    const Tensor & r  = add.src[0] == &comb ? *add.src[1] : *add.src[0];
    const Tensor & rw = *comb.src[1];  // route weights [k_slots, T]
    const int64_t  K  = add.ne[0];
    for (const Tensor * t : {&comb, &r, &add, &norm})
        if (!f32_rows(*t) || t->ne[0] != K || t->nrows() != 1 || !t->is_contiguous()) return "one row";
    prod = moe_problem(down, ctx);
    if (prod.w0[0].format != WeightFormat::INT4 || !prod.mma || prod.perm || prod.w0[0].n != K) return "experts (INT4, tensor-core GEMV)";
    if (prod.n_tok != 1 || prod.ids.k_slots * 32 != kGemvThreads) return "one token, a slot per warp";
    if (rw.type != DType::F32 || !rw.is_contiguous() || rw.ne[0] != prod.ids.k_slots || rw.nrows() != 1) return "route weights";
    prod.slot_w = static_cast<const float *>(rw.data);
    if (!bound) prod.x.base = nullptr;
    const OpPlan pp = plan_moe(prod, *ctx.props);
    if (pp.unfused || pp.x_copy || pp.ids_copy || pp.launch[0].path != Path::Gemv || pp.launch[0].scratch.bytes() != 0) return "the producer's plan";
    const GemvPlan & gp = pp.launch[0].gemv[0];
    if (gp.grid.x == 0 || gp.grid.x > unsigned(kGemvMaxScaleParts)) return "the producer's blocks";
    if (const char * why = norm_matmuls_refusal(norm, mms, count, K, ctx, bound, false, d, mu)) return why;
    if (!bound) return nullptr;
    // The parts go over the combine's output, which nothing reads: no launch writes it.
    prod.ids_early        = ctx.ids_before_wait;
    const Tensor * ins[3] = {down.src[0], down.src[1], &rw};
    return bind_norm_half(comb, ins, 3, r, add, norm, mms, count, gp.grid.x, K, prod.produce, prod.y, d, mu);
}

}  // namespace
}  // namespace mm

bool experts_norm_matmul_supported(const Tensor & down, const Tensor & comb, const Tensor & add, const Tensor & norm, const Tensor * const * mms,
                                   int count, const OpContext & ctx, bool with_addresses) {
    mm::Moe   prod;
    mm::Dense d;
    mm::Multi mu;
    return mm::experts_norm_refusal(down, comb, add, norm, mms, count, ctx, with_addresses, prod, d, mu) == nullptr;
}

void op_experts_norm_matmul(const Tensor & down, const Tensor & comb, const Tensor & add, const Tensor & norm, const Tensor * const * mms,
                            int count, const OpContext & ctx) {
    mm::Moe   prod;
    mm::Dense d;
    mm::Multi mu;
    if (mm::experts_norm_refusal(down, comb, add, norm, mms, count, ctx, true, prod, d, mu) != nullptr) {  // the nodes' own launches
        op_matmul_id(down, ctx);
        return op_combine_norm_matmul(comb, add, norm, mms, count, ctx);
    }
    mm::exec_moe(prod, ctx);
    mm::run_norm_matmuls(d, mu, mms, count, ctx);
}

void op_matmul_id(const Tensor & t, const OpContext & ctx) {
    mm::Moe m = mm::moe_problem(t, ctx);
    mm::check_output(t, m.w0[0].n);
    m.y         = static_cast<float *>(t.data);
    m.ids_early = ctx.ids_before_wait;
    m.x_early   = ctx.x_before_wait;
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
        d.stage_x = overlaps(swiglu, x);
        d.prompt  = ctx.prompt_step;
        mm::exec_dense(d, ctx);
        return;
    }
    if (g->op != Op::MATMUL_ID || g->src[1] != u->src[1]) fail(SPARK_ERR_INTERNAL, "matmul_swiglu: unexpected sources");
    for (int32_t e = 0; e < g->n_experts; ++e)  // (fusion.cpp fuses only such pairs)
        if (e >= u->n_experts || expert_held(g->experts[e]) != expert_held(u->experts[e]))
            fail(SPARK_ERR_INTERNAL, "matmul_swiglu: gate and up experts are not held alike (expert %d)", e);
    mm::Moe m = mm::moe_problem(*g, ctx);
    mm::describe_experts(*u, 1, m, ctx);
    if (m.w0[1].format != m.w0[0].format || m.w0[1].n != m.w0[0].n || m.w0[1].k != m.w0[0].k) {
        m.fast = false;  // the generic kernel takes any pair of formats
        if (m.w0[1].n != m.w0[0].n || m.w0[1].k != m.w0[0].k) fail(SPARK_ERR_SHAPE_MISMATCH, "matmul_swiglu: gate and up experts differ in shape");
    }
    m.nw        = 2;
    m.ids_early = ctx.ids_before_wait;
    m.x_early   = ctx.x_before_wait;
    mm::check_output(swiglu, m.w0[0].n);
    m.y         = static_cast<float *>(swiglu.data);
    m.stage_x   = overlaps(swiglu, *g->src[0]);
    m.ids_bytes = overlaps(swiglu, *g->src[1]) ? g->src[1]->nbytes() : 0;
    mm::exec_moe(m, ctx);
}

}  // namespace spark::cuda
