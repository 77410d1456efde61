// The CUDA matmul planner (src/backends/cuda/matmul/op_plan.h, plan.cpp) without a GPU: the path each
// problem takes, the workspace a plan sizes against what its launch carves from it, and the
// kernel_paths() string derived from the plans. The planner is host code; it is built here against
// dev/emu's stand-in for <cuda_runtime.h> (as the emu-gemv lab builds plan.cpp).
#include "backends/cuda/matmul/op_plan.h"
#include "backends/cuda/matmul/tuning.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mm = spark::cuda::mm;
using spark::WeightFormat;
using spark::cuda::DeviceProps;
using spark::cuda::DeviceWeight;

namespace {

DeviceProps h100() {
    DeviceProps d;
    d.cc                 = 900;
    d.sm_count           = 132;
    d.max_smem_per_block = 227 * 1024;
    d.l2_bytes           = size_t(50) << 20;
    return d;
}

DeviceWeight weight(WeightFormat f, int64_t n, int64_t k, int32_t group = 128) { return mm::weight_shape(f, n, k, group); }

// Activation rows [rows][k] at `base` (only the address matters: plans read no data).
mm::XRows rows_at(uintptr_t base, int64_t rows, int64_t k) {
    mm::XRows x;
    x.base = reinterpret_cast<const char *>(base);
    x.ne1  = rows;
    x.nb1  = k * 4;
    x.nb2 = x.nb3 = rows * k * 4;
    return x;
}

constexpr uintptr_t kAligned = 1 << 20, kMisaligned = kAligned + 4;

mm::Dense dense(const DeviceWeight * w, int64_t rows, int nw = 1, uintptr_t base = kAligned) {
    mm::Dense d;
    d.w[0] = d.w[1] = w;
    d.nw            = nw;
    d.rows          = rows;
    d.x             = rows_at(base, rows, w->k);
    return d;
}

// Qwen3-30B-A3B's experts: 128 of them, top 8; one input row per token shared by its slots.
mm::Moe moe(const DeviceWeight & w, int64_t tokens) {
    mm::Moe m;
    m.w0[0] = m.w0[1] = w;
    m.fast            = mm::chunk_ok(w);
    m.mma             = mm::gemv_mma_ok(w);
    m.ids.k_slots     = 8;
    m.ids.n_experts   = 128;
    m.n_tok           = tokens;
    m.x.base          = reinterpret_cast<const char *>(kAligned);
    m.x.nb2           = w.k * 4;
    m.x.k_slots       = m.ids.k_slots;
    return m;
}

struct OverrideGuard {
    mm::Overrides saved = mm::overrides();
    ~OverrideGuard() { mm::overrides() = saved; }
};

size_t al(size_t b) { return mm::scratch_aligned(b); }

// Carves an op's workspace as the launch does (matmul.cpp: the copies, the up projection's output,
// then each launch's pieces from the same mark) and checks every piece lies inside scratch_bytes(),
// 256-byte aligned, in order, without overlap.
void check_carve(const mm::OpPlan & p) {
    const size_t      bytes = p.scratch_bytes();
    std::vector<char> buf(bytes + 256);
    const uintptr_t   base0 = reinterpret_cast<uintptr_t>(buf.data());
    mm::Scratch       s;
    s.base = buf.data() + (256 - base0 % 256) % 256;
    auto inside = [&](const void * ptr, size_t size) {
        if (!ptr) return;
        const size_t off = size_t(static_cast<const char *>(ptr) - s.base);
        CHECK(off % 256 == 0);
        CHECK(off + size <= bytes);
    };
    inside(s.take(p.ids_copy), p.ids_copy);
    inside(s.take(p.x_copy), p.x_copy);
    inside(s.take(p.up_y), p.up_y);
    const size_t mark = s.used;
    for (int i = 0; i < (p.unfused ? 2 : 1); ++i) {
        s.used                    = mark;
        const mm::ScratchPieces & q = p.launch[i].scratch;
        const mm::ScratchPtrs     c = mm::carve(q, s);
        CHECK(s.used <= bytes);
        const std::pair<const void *, size_t> pieces[] = {{c.x_f32, q.x_f32},         {c.route, q.route},     {c.x_f16, q.x_f16},
                                                          {c.inv_scale, q.inv_scale}, {c.partial, q.partial}, {c.counters, q.counters}};
        const char * end = nullptr;
        for (const auto & [ptr, size] : pieces) {
            CHECK((ptr != nullptr) == (size > 0));
            inside(ptr, size);
            if (!ptr) continue;
            if (end) CHECK(static_cast<const char *>(ptr) >= end);
            end = static_cast<const char *>(ptr) + size;
        }
    }
}

}  // namespace

TEST_CASE("matmul plan: decode rows take the GEMV, prefill rows the GEMM, other K the GEMV in row batches") {
    const DeviceProps  dev = h100();
    const DeviceWeight w   = weight(WeightFormat::INT4, 4096, 4096);

    const mm::OpPlan decode = mm::plan_dense(dense(&w, 1), dev);
    CHECK(decode.launch[0].path == mm::Path::Gemv);
    CHECK(decode.launch[0].gemv[0].mma);  // INT4 g128 at sm_90: the tensor-core decode GEMV
    CHECK(decode.launch[0].batch_rows[0] == 1);
    CHECK(decode.launch[0].batch_rows[1] == 0);
    CHECK(decode.launch[0].scratch.x_f32 == 0);  // aligned rows, no act-order: read in place
    check_carve(decode);

    const mm::OpPlan prefill = mm::plan_dense(dense(&w, 512), dev);
    const mm::LaunchPlan & g = prefill.launch[0];
    REQUIRE(g.path == mm::Path::Gemm);
    CHECK(g.scratch.x_f16 == size_t(512 * 4096 * 2));
    CHECK(g.scratch.inv_scale == size_t(512 * 4));
    CHECK(g.scratch.partial == size_t(g.gemm.partial_floats()) * 4);
    CHECK(prefill.scratch_bytes() == g.scratch.bytes());
    check_carve(prefill);

    // K a multiple of the BF16 chunk (8) but not of the GEMM's 32: the GEMV, 13 rows as 8 + 5.
    const DeviceWeight b  = weight(WeightFormat::BF16, 1000, 4104);
    const mm::OpPlan   bp = mm::plan_dense(dense(&b, 13), dev);
    REQUIRE(bp.launch[0].path == mm::Path::Gemv);
    CHECK(bp.launch[0].batch_rows[0] == 8);
    CHECK(bp.launch[0].batch_rows[1] == 5);
    CHECK(&bp.launch[0].gemv_for(8) == &bp.launch[0].gemv[0]);
    CHECK(&bp.launch[0].gemv_for(5) == &bp.launch[0].gemv[1]);
    CHECK(bp.launch[0].gemv[1].r_tmpl == 8);  // (5 rows take the 8-row kernel)
    check_carve(bp);

    // Not chunkable (K not a multiple of the INT4 chunk of 32): the generic kernel, no workspace.
    const DeviceWeight odd = weight(WeightFormat::INT4, 64, 72, 72);
    const mm::OpPlan   op  = mm::plan_dense(dense(&odd, 1), dev);
    CHECK(op.launch[0].path == mm::Path::Generic);
    CHECK(op.scratch_bytes() == 0);
}

TEST_CASE("matmul plan: split-K partials and counters are sized from the plan that launches") {
    OverrideGuard      guard;
    const DeviceProps  dev = h100();
    const DeviceWeight w   = weight(WeightFormat::INT4, 4096, 4096);

    mm::overrides().gemm_ksplit = 3;
    const mm::OpPlan gp = mm::plan_dense(dense(&w, 512), dev);
    REQUIRE(gp.launch[0].path == mm::Path::Gemm);
    CHECK(gp.launch[0].gemm.ksplit == 3);
    CHECK(gp.launch[0].scratch.partial == size_t(gp.launch[0].gemm.partial_floats()) * 4);
    CHECK(gp.launch[0].scratch.counters == size_t(2 * gp.launch[0].gemm.tiles()) * 4);
    check_carve(gp);

    mm::overrides().gemv_ksplit = 4;
    for (const int nw : {1, 2}) {
        const mm::OpPlan       vp = mm::plan_dense(dense(&w, 3, nw), dev);
        const mm::LaunchPlan & l  = vp.launch[0];
        REQUIRE(l.path == mm::Path::Gemv);
        REQUIRE(l.gemv[0].ksplit > 1);
        CHECK(l.scratch.partial == size_t(l.gemv[0].ksplit) * size_t(nw) * 3 * 4096 * 4);  // [ksplit][nw][rows][n]
        CHECK(l.scratch.counters == size_t(l.gemv[0].counters()) * 4);
        check_carve(vp);
    }
    // Row batches (8 + 5 rows) share one split buffer: the larger of the two batches' needs.
    mm::overrides().path      = mm::ForcePath::Gemv;
    const mm::OpPlan       fp = mm::plan_dense(dense(&w, 13), dev);
    const mm::LaunchPlan & f  = fp.launch[0];
    REQUIRE(f.path == mm::Path::Gemv);
    auto split = [](const mm::GemvPlan & g, size_t rows) { return g.ksplit > 1 ? size_t(g.ksplit) * rows * 4096 * 4 : size_t(0); };
    CHECK(f.scratch.partial == std::max(split(f.gemv[0], 8), split(f.gemv[1], 5)));
    CHECK(f.scratch.partial > 0);
    check_carve(fp);
}

TEST_CASE("matmul plan: act-order gate/up pairs run unfused; staged and misaligned activations") {
    const DeviceProps    dev     = h100();
    static const int32_t perm[1] = {0};  // (only its presence matters)
    DeviceWeight         gate = weight(WeightFormat::INT4, 768, 2048), up = gate;
    gate.perm                 = perm;

    mm::Dense d = dense(&gate, 2, 2);
    d.w[1]      = &up;
    const mm::OpPlan p = mm::plan_dense(d, dev);
    REQUIRE(p.unfused);
    CHECK(p.up_y == size_t(2 * 768 * 4));
    CHECK(p.launch[0].scratch.x_f32 == size_t(2 * 2048 * 4));  // the gate's act-order order
    CHECK(p.launch[1].scratch.x_f32 == 0);
    CHECK(p.scratch_bytes() == al(p.up_y) + std::max(p.launch[0].scratch.bytes(), p.launch[1].scratch.bytes()));
    check_carve(p);

    // Misaligned rows are copied for the GEMV; with the activations staged first (a fused output over
    // its input) the launch reads the aligned copy instead.
    const DeviceWeight w   = weight(WeightFormat::BF16, 4096, 4096);
    const mm::OpPlan   mis = mm::plan_dense(dense(&w, 3, 2, kMisaligned), dev);
    CHECK(mis.launch[0].scratch.x_f32 == size_t(3 * 4096 * 4));
    mm::Dense staged = dense(&w, 3, 2, kMisaligned);
    staged.stage_x   = true;
    const mm::OpPlan sp = mm::plan_dense(staged, dev);
    CHECK(sp.x_copy == size_t(3 * 4096 * 4));
    CHECK(sp.launch[0].scratch.x_f32 == 0);
    check_carve(sp);
}

TEST_CASE("matmul plan: MATMUL_ID decode GEMV with early ids, prefill grouped GEMM") {
    const DeviceProps  dev = h100();
    const DeviceWeight e   = weight(WeightFormat::INT4, 768, 2048);

    mm::Moe decode   = moe(e, 1);
    decode.ids_early = true;
    const mm::OpPlan d = mm::plan_moe(decode, dev);
    REQUIRE(d.launch[0].path == mm::Path::Gemv);
    CHECK(d.launch[0].gemv[0].grid.z == 8);  // one job per (slot, token) pair
    CHECK(d.launch[0].ids_early == (d.launch[0].gemv[0].mma && d.launch[0].gemv[0].ksplit == 1));
    check_carve(d);
    decode.ids_bytes = 32;  // the output overlaps the ids: they are copied first, the GEMV waits
    const mm::OpPlan dc = mm::plan_moe(decode, dev);
    CHECK(dc.ids_copy == 32);
    CHECK_FALSE(dc.launch[0].ids_early);
    check_carve(dc);

    const mm::OpPlan       p = mm::plan_moe(moe(e, 512), dev);
    const mm::LaunchPlan & g = p.launch[0];
    REQUIRE(g.path == mm::Path::Gemm);
    const int64_t pairs = 8 * 512, max_tiles = g.gemm.grid.x;
    CHECK(g.gemm.mt == 1);  // 4096 pairs over 128 experts: 32 rows each on average, the 32-row tiles
    CHECK(g.scratch.route == size_t(mm::moe_route_ints(pairs, 128, max_tiles)) * 4);
    CHECK(g.scratch.x_f16 == size_t(pairs * 2048 * 2));
    CHECK(g.scratch.partial == 0);
    check_carve(p);
}

TEST_CASE("kernel_paths: derived from the plans") {
    OverrideGuard     guard;
    const std::string p = spark::cuda::kernel_paths(h100());
    MESSAGE(p);
    CHECK(p.size() < 512);  // (spark_device_info::kernel_paths)
    for (const char * f : {"f32=", "f16=", "bf16=", "nvfp4=", "int4=", "fp8=", "moe:int4=", "swiglu:int4=", "multi:int4="})
        CHECK(p.find(f) != std::string::npos);
    CHECK(p.find("int4=gemv-mma(g128),gemv-fma(g32)/gemm-f16") != std::string::npos);
    CHECK(p.find("nvfp4=gemv-mma/gemm-f16") != std::string::npos);
    CHECK(p.find("bf16=gemv-fma/gemm-f16") != std::string::npos);
    CHECK(p.find("moe:int4=gemv-mma/grouped-gemm-f16") != std::string::npos);

    mm::overrides().gemv_mma = 0;  // SPARK_GEMV_MMA=0
    const std::string fma = spark::cuda::kernel_paths(h100());
    CHECK(fma.find("int4=gemv-fma/gemm-f16") != std::string::npos);
    CHECK(fma.find("nvfp4=gemv-fma/gemm-f16") != std::string::npos);
    CHECK(fma.find("mma/") == std::string::npos);

    mm::overrides().path    = mm::ForcePath::Generic;  // SPARK_MATMUL_PATH=generic
    const std::string generic = spark::cuda::kernel_paths(h100());
    CHECK(generic.find("fp8=generic/generic") != std::string::npos);
    CHECK(generic.find("multi:int4=separate/separate") != std::string::npos);  // (each node on its own)

    DeviceProps turing = h100();
    turing.cc          = 750;
    CHECK(spark::cuda::kernel_paths(turing).find("unsupported") != std::string::npos);
}
