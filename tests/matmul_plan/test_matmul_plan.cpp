// The CUDA matmul planner (src/backends/cuda/matmul/op_plan.h, plan.cpp) without a GPU: the path each
// problem takes, the workspace a plan sizes against what its launch carves from it, and the
// kernel_paths() string derived from the plans. The planner is host code; it is built here against
// dev/emu's stand-in for <cuda_runtime.h> (as the emu-gemv lab builds plan.cpp).
#include "backends/cuda/matmul/op_plan.h"
#include "backends/cuda/matmul/tuning.h"
#include "backends/cuda/fp4/w4a4.h"
#include "backends/cuda/weight_placement.h"

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

// A GEMV problem of the planner tests: the weight's N and K, jobs (experts' pairs), weights (2: gate/up).
struct PlanShape {
    int64_t n, k, jobs;
    int     nw;
};

// The plans of a shape planned with the model's fitted rates (those of an H100: rates 0) and with
// the rates of `d` are the same.
void check_plans_as_fitted(WeightFormat f, const PlanShape & s, int rows, bool mma, const DeviceProps & d) {
    mm::GemvOpts a, b;
    a.mma = b.mma = mma;
    a.smem_optin = b.smem_optin = d.max_smem_per_block;
    b.bw_per_us                 = d.bw_bytes_per_us;
    b.issue_per_sm_us           = d.issue_per_sm_us;
    const mm::GemvPlan p = mm::plan_gemv(f, s.n, s.k, s.jobs, rows, s.nw, d.sm_count, a);
    const mm::GemvPlan q = mm::plan_gemv(f, s.n, s.k, s.jobs, rows, s.nw, d.sm_count, b);
    const int64_t      n = s.n, k = s.k;
    CAPTURE(n);
    CAPTURE(k);
    CAPTURE(rows);
    CAPTURE(mma);
    CHECK(p.mma == q.mma);
    CHECK(p.mma_wave == q.mma_wave);
    CHECK(p.wk == q.wk);
    CHECK(p.lpr == q.lpr);
    CHECK(p.ksplit == q.ksplit);
    CHECK(p.mma_kpair == q.mma_kpair);
    CHECK(p.grid.x == q.grid.x);
}

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
        const std::pair<const void *, size_t> pieces[] = {{c.x_f32, q.x_f32},         {c.route, q.route},       {c.x_f16, q.x_f16},
                                                          {c.inv_scale, q.inv_scale}, {c.partial, q.partial},   {c.counters, q.counters},
                                                          {c.a4_codes, q.a4_codes},   {c.a4_scales, q.a4_scales}};
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
    CHECK_FALSE(d.launch[0].x_early);  // (not asked for)
    decode.ids_bytes = 32;  // the output overlaps the ids: they are copied first, the GEMV waits
    const mm::OpPlan dc = mm::plan_moe(decode, dev);
    CHECK(dc.ids_copy == 32);
    CHECK_FALSE(dc.launch[0].ids_early);
    check_carve(dc);

    // Early activations (the gate/up after the routing kernel): the MMA kernel without a K split,
    // and never behind a staging launch.
    mm::Moe gate_up = moe(e, 1);
    gate_up.nw      = 2;
    gate_up.x_early = true;
    const mm::OpPlan gx = mm::plan_moe(gate_up, dev);
    REQUIRE(gx.launch[0].path == mm::Path::Gemv);
    REQUIRE(gx.launch[0].gemv[0].mma);
    CHECK(gx.launch[0].x_early == (gx.launch[0].gemv[0].ksplit == 1));
    CHECK(gx.launch[0].x_early);  // (the 30B-A3B's gate/up: no K split)
    CHECK_FALSE(gx.launch[0].ids_early);
    gate_up.stage_x = true;  // the output overlaps the activations: copied first, the GEMV waits
    const mm::OpPlan gs = mm::plan_moe(gate_up, dev);
    CHECK(gs.x_copy > 0);
    CHECK_FALSE(gs.launch[0].x_early);

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

TEST_CASE("MATMUL_ID: the experts at one stride (expert_grid)") {
    // Host copies only: the addresses are compared, never read.
    const uintptr_t base = uintptr_t(1) << 40;
    auto            at   = [](uintptr_t a) { return reinterpret_cast<const void *>(a); };
    std::vector<DeviceWeight> ex(16, weight(WeightFormat::INT4, 768, 2048));
    for (size_t e = 0; e < ex.size(); ++e) {
        ex[e].data   = at(base + e * 0x140000);
        ex[e].scales = at(base + e * 0x140000 + 0x100000);
        ex[e].zeros  = static_cast<const uint8_t *>(at(base + e * 0x140000 + 0x130000));
    }
    mm::ExpertGrid g = mm::expert_grid(ex.data(), 16);
    CHECK(g.uniform);
    CHECK(g.data == 0x140000);
    CHECK(g.scales == 0x140000);
    CHECK(g.zeros == 0x140000);
    CHECK(mm::expert_grid(ex.data(), 1).uniform);  // (one expert: no stride needed)
    auto broken = [&](auto edit) {
        std::vector<DeviceWeight> b = ex;
        edit(b[11]);
        return mm::expert_grid(b.data(), 16).uniform != 0;
    };
    CHECK_FALSE(broken([&](DeviceWeight & w) { w.data = at(base + 11 * 0x140000 + 256); }));                 // off the stride
    CHECK_FALSE(broken([&](DeviceWeight & w) { w.scales = at(base + 12 * 0x140000 + 0x100000); }));          // scales off
    CHECK_FALSE(broken([&](DeviceWeight & w) { w.zeros = nullptr; }));                                       // no zeros here
    CHECK_FALSE(broken([&](DeviceWeight & w) { w.data = nullptr; }));                                        // absent (EP)
    CHECK_FALSE(broken([&](DeviceWeight & w) { w.perm = static_cast<const int32_t *>(at(base)); }));         // act-order
    CHECK_FALSE(broken([&](DeviceWeight & w) { w.group_size = 64; }));                                       // another field
    CHECK_FALSE(broken([&](DeviceWeight & w) { w.global_scale = 2.0f; }));
    // NVFP4: one global scale for all, or the table (a checkpoint's experts have their own).
    std::vector<DeviceWeight> fp4(8, weight(WeightFormat::NVFP4, 768, 2048));
    for (size_t e = 0; e < fp4.size(); ++e) {
        fp4[e].data         = at(base + e * 0x100000);
        fp4[e].scales       = at(base + e * 0x100000 + 0xC0000);
        fp4[e].global_scale = 0.5f;
    }
    CHECK(mm::expert_grid(fp4.data(), 8).uniform);
    fp4[3].global_scale = 0.25f;
    CHECK_FALSE(mm::expert_grid(fp4.data(), 8).uniform);
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

// The W4A4 dispatch (docs/SM120.md, "When W4A4 runs") on injected devices: which kernel each NVFP4
// matmul takes on Ampere (8.0), Ada (8.9), Hopper (9.0), RTX PRO 6000 / RTX 50xx (12.0) and DGX Spark
// (12.1), with and without the arch-specific cubins of the build (fp4/w4a4.h: w4a4_device), for a
// checkpoint with activation scales (a W4A4 ModelOpt / compressed-tensors export) and one without
// (W4A16, or NVFP4 made by spark-convert), at decode / verify row counts and prefill row counts.
TEST_CASE("W4A4 dispatch: the kernel each NVFP4 matmul takes, by device, build and checkpoint") {
    OverrideGuard guard;
    struct Device {
        const char * name;
        int          cc, sms;
        bool         cubin;  // the build has a cubin for the device's exact sm_12Xa target
        bool         w4a4;   // expected: the device runs W4A4
    };
    const Device devices[] = {
        {"A100 (8.0)", 800, 108, false, false},
        {"L40S (8.9)", 890, 142, false, false},
        {"H100 (9.0)", 900, 132, false, false},
        {"RTX PRO 6000 (12.0), sm_120a built", 1200, 188, true, true},
        {"RTX PRO 6000 (12.0), no sm_120a cubin (a plain sm_120 or a 121a-only build)", 1200, 188, false, false},
        {"DGX Spark GB10 (12.1), sm_121a built", 1210, 48, true, true},
        {"DGX Spark GB10 (12.1), only sm_120a built", 1210, 48, false, false},
    };
    DeviceWeight scaled = weight(WeightFormat::NVFP4, 4096, 4096), w4a16 = scaled;
    scaled.act_scale    = 0.0021f;
    for (const Device & d : devices) {
        DeviceProps dev        = h100();
        dev.cc                 = d.cc;
        dev.sm_count           = d.sms;
        dev.w4a4               = spark::cuda::w4a4_device(d.cc, d.cubin);
        CAPTURE(d.name);
        CHECK(dev.w4a4 == d.w4a4);
        for (const int64_t rows : {int64_t(1), int64_t(3), int64_t(8), int64_t(9), int64_t(64), int64_t(512)}) {
            CAPTURE(rows);
            const bool gemm = rows > mm::kGemvMaxRows;
            // With activation scales: W4A4 for the prompt steps' GEMMs where the device runs it.
            mm::Dense prompt = dense(&scaled, rows);
            prompt.prompt    = true;
            const mm::OpPlan a = mm::plan_dense(prompt, dev);
            CHECK(std::string(mm::path_name(a.launch[0])) == (gemm ? (d.w4a4 ? "w4a4" : "gemm-f16") : "gemv-mma"));
            CHECK(mm::w4a4_takes(scaled, rows, true, dev) == (d.w4a4 && gemm));
            // A verify step of as many rows (every row's logits read): W4A16, as one-row decode.
            const mm::OpPlan v = mm::plan_dense(dense(&scaled, rows), dev);
            CHECK(std::string(mm::path_name(v.launch[0])) == (gemm ? "gemm-f16" : "gemv-mma"));
            CHECK_FALSE(mm::w4a4_takes(scaled, rows, false, dev));
            // Without activation scales: W4A16 everywhere.
            mm::Dense plain = dense(&w4a16, rows);
            plain.prompt    = true;
            const mm::OpPlan b = mm::plan_dense(plain, dev);
            CHECK(std::string(mm::path_name(b.launch[0])) == (gemm ? "gemm-f16" : "gemv-mma"));
            CHECK_FALSE(mm::w4a4_takes(w4a16, rows, true, dev));
            // A gate/up pair: W4A4 runs them one after the other (one weight per FP4 GEMM launch).
            mm::Dense pair = dense(&scaled, rows, 2);
            pair.prompt    = true;
            const mm::OpPlan g = mm::plan_dense(pair, dev);
            CHECK(g.unfused == (d.w4a4 && gemm));
            if (g.unfused) {
                CHECK(std::string(mm::path_name(g.launch[0])) == "w4a4");
                CHECK(std::string(mm::path_name(g.launch[1])) == "w4a4");
                CHECK(g.up_y == size_t(rows * 4096) * 4);
            }
            check_carve(a);
            check_carve(g);
            if (a.launch[0].path == mm::Path::W4A4) {
                CHECK(a.launch[0].scratch.a4_codes == size_t(rows * 4096 / 2));
                CHECK(a.launch[0].scratch.a4_scales == size_t(rows * 4096 / 16));
                CHECK(a.launch[0].scratch.x_f32 == 0);  // one row stride: quantized in place
            }
        }
        // kernel_paths names the choice for both kinds of checkpoint.
        const std::string p = spark::cuda::kernel_paths(dev);
        CHECK(p.find(d.w4a4 ? "nvfp4=gemv-mma/gemm-f16(w4a16),w4a4(act-scaled)" : "nvfp4=gemv-mma/gemm-f16 ") != std::string::npos);
    }

    DeviceProps spark_gb10 = h100();
    spark_gb10.cc          = 1210;
    spark_gb10.sm_count    = 48;
    spark_gb10.w4a4        = true;
    // K not a multiple of the FP4 MMA's 64: W4A16.
    DeviceWeight odd_k = weight(WeightFormat::NVFP4, 512, 4128);
    odd_k.act_scale    = 0.5f;
    mm::Dense odd = dense(&odd_k, 64);
    odd.prompt    = true;
    CHECK(std::string(mm::path_name(mm::plan_dense(odd, spark_gb10).launch[0])) == "gemm-f16");
    // Rows of two strides (a [K, 8, 8] view with a gap after every 8 rows): gathered first.
    mm::Dense strided = dense(&scaled, 64);
    strided.prompt    = true;
    strided.x.ne1     = 8;
    strided.x.ne2     = 8;
    strided.x.nb2     = strided.x.nb1 * 9;
    const mm::OpPlan sp = mm::plan_dense(strided, spark_gb10);
    REQUIRE(sp.launch[0].path == mm::Path::W4A4);
    CHECK(sp.launch[0].scratch.x_f32 == size_t(64 * 4096) * 4);
    check_carve(sp);
    // Other weight formats never take it.
    DeviceWeight int4 = weight(WeightFormat::INT4, 4096, 4096);
    int4.act_scale    = 1.0f;
    CHECK_FALSE(mm::w4a4_takes(int4, 512, true, spark_gb10));

    // SPARK_W4A4=0: never; =1: decode and verify steps too (A/B runs); a forced path wins over it.
    mm::Dense prompt512 = dense(&scaled, 512);
    prompt512.prompt    = true;
    mm::overrides().w4a4 = 0;
    CHECK(std::string(mm::path_name(mm::plan_dense(prompt512, spark_gb10).launch[0])) == "gemm-f16");
    mm::overrides().w4a4 = 1;
    CHECK(std::string(mm::path_name(mm::plan_dense(dense(&scaled, 1), spark_gb10).launch[0])) == "w4a4");
    CHECK_FALSE(mm::w4a4_takes(w4a16, 1, false, spark_gb10));
    mm::overrides().path = mm::ForcePath::Gemm;
    CHECK(std::string(mm::path_name(mm::plan_dense(prompt512, spark_gb10).launch[0])) == "gemm-f16");
}

// The decode GEMV planner takes the device's bandwidth and issue rate from its attributes
// (op_plan.h, device_rates). On the H100 they reproduce the rates the cost model was fitted with, so
// its plans are the plans of before (the constants of an H100 SXM: 2619 MHz HBM3 on a 5120-bit bus,
// 1980 MHz SM clock); on other devices the plans follow their own rates.
TEST_CASE("GEMV planner: device rates from the attributes; the H100's plans unchanged") {
    OverrideGuard guard;
    DeviceProps   h = h100();  // against rates 0: the model's fitted H100 values (check_plans_as_fitted)
    mm::device_rates(h, 2619000, 5120, 1980000);
    MESSAGE("H100 rates: " << h.bw_bytes_per_us << " B/us, " << h.issue_per_sm_us << " lanes/us per SM");
    CHECK(std::abs(h.bw_bytes_per_us / 3.0e6 - 1.0) < 2e-4);
    CHECK(std::abs(h.issue_per_sm_us / (128 * 1750.0) - 1.0) < 2e-4);
    // Qwen3-8B, Qwen3-30B-A3B and Qwen3-Next-80B-A3B projections (experts as jobs of 8 / 10 pairs).
    const PlanShape shapes[] = {{6144, 4096, 1, 1}, {4096, 4096, 1, 1}, {12288, 4096, 1, 2}, {4096, 12288, 1, 1}, {5120, 2048, 1, 1},
                                {2048, 4096, 1, 1}, {128, 2048, 1, 1},  {768, 2048, 8, 2},   {2048, 768, 8, 1},   {512, 2048, 10, 2},
                                {2048, 512, 10, 1}, {12288, 2048, 1, 1}, {151936, 2048, 1, 1}};
    int compared = 0;
    for (const WeightFormat f : {WeightFormat::INT4, WeightFormat::NVFP4, WeightFormat::FP8, WeightFormat::BF16})
        for (const PlanShape & s : shapes)
            for (const int rows : {1, 2, 3, 4, 8})
                for (const bool mma : {false, true}) {
                    if (mma && !mm::gemv_mma_ok(weight(f, s.n, s.k))) continue;
                    check_plans_as_fitted(f, s, rows, mma, h);
                    ++compared;
                }
    MESSAGE(compared << " H100 plans compared");

    // RTX PRO 6000 (GDDR7 at 1.79 TB/s over 188 SMs) and DGX Spark GB10 (LPDDR5X at 273 GB/s over 48
    // SMs), from the rates their specifications give: plans exist and differ from the H100's where
    // the bandwidth per SM does.
    DeviceProps pro6000 = h100(), gb10 = h100();
    pro6000.cc = 1200, pro6000.sm_count = 188;
    gb10.cc = 1210, gb10.sm_count = 48;
    mm::device_rates(pro6000, 14000000, 512, 2617000);  // 28 Gb/s per pin (clock x 2) on a 512-bit bus
    gb10.bw_bytes_per_us = 273e3 * mm::kAchievableBw;  // (as a copy measured at load would give it)
    MESSAGE("RTX PRO 6000 rates: " << pro6000.bw_bytes_per_us << " B/us; GB10: " << gb10.bw_bytes_per_us << " B/us");
    for (const DeviceProps & d : {pro6000, gb10}) {
        const DeviceWeight w = weight(WeightFormat::INT4, 768, 2048);
        const mm::OpPlan   p = mm::plan_moe(moe(w, 1), d);
        CHECK(p.launch[0].path == mm::Path::Gemv);
        CHECK(p.launch[0].gemv[0].grid.x > 0);
        MESSAGE("30B-A3B experts' gate/up on " << d.sm_count << " SMs: wk " << p.launch[0].gemv[0].wk << ", ksplit "
                << p.launch[0].gemv[0].ksplit << ", grid " << p.launch[0].gemv[0].grid.x << " x " << p.launch[0].gemv[0].grid.y << " x "
                << p.launch[0].gemv[0].grid.z);
    }
}

// A device with more bandwidth than the H100 (the H200: HBM3e at 3201 MHz on 6144 bits, the H100's
// SMs and clock) gets the H100's MMA plans: with its own bandwidth the model asked for more, smaller
// blocks, which measured slower there (bench_matmul --sweep / --moe-sweep on an H200, docs/PERF.md
// "The GEMV planner on the H200": the MiniMax-M2 experts' gate/up 23.3 us with 8 K-warps x 768
// blocks, 20.0 us with the H100's 2 x 192).
TEST_CASE("GEMV planner: a device faster than the H100 gets the H100's MMA plans") {
    OverrideGuard guard;
    mm::overrides().gemv_wave = 0;  // the cost model's plans (the one-wave gate/up has no bandwidth term: below)
    DeviceProps   h200 = h100(), fitted = h100();
    mm::device_rates(h200, 3201000, 6144, 1980000);
    REQUIRE(h200.bw_bytes_per_us > 4.3e6);
    const PlanShape shapes[] = {{12288, 4096, 1, 2}, {4096, 12288, 1, 1}, {768, 2048, 8, 2},  {2048, 768, 8, 1},  {512, 2048, 10, 2},
                                {2048, 512, 10, 1},  {8192, 3072, 1, 1}, {3072, 6144, 1, 1}, {1536, 3072, 8, 2}, {3072, 1536, 8, 1}};
    for (const WeightFormat f : {WeightFormat::INT4, WeightFormat::NVFP4})
        for (const PlanShape & s : shapes)
            for (const int rows : {1, 2, 3, 4, 8}) check_plans_as_fitted(f, s, rows, true, h200);
    // The plan measured best on the H200 for MiniMax-M2's experts' gate/up (8 of 256, 1536 x 3072).
    mm::GemvOpts o;
    o.mma             = true;
    o.smem_optin      = fitted.max_smem_per_block;
    o.bw_per_us       = h200.bw_bytes_per_us;
    o.issue_per_sm_us = h200.issue_per_sm_us;
    const mm::GemvPlan up = mm::plan_gemv(WeightFormat::INT4, 1536, 3072, 8, 1, 2, 132, o);
    CHECK(up.wk == 2);
    CHECK(up.ksplit == 1);
    CHECK(up.grid.x == 24);
}

// The fused gate/up at one row runs as one wave of the 3-block variant (matmul.h, plan.cpp): the plans
// measured best on the H200 for the three gate/up shapes swept (docs/PERF.md, "The one-wave
// gate/up"), on any bandwidth; the 2-block kernel's plans where it does not apply.
TEST_CASE("GEMV planner: the one-wave gate/up") {
    OverrideGuard guard;
    struct Case {
        int64_t n, k, jobs;
        int     wk;
        unsigned grid_x;
    };
    const Case cases[] = {
        {12288, 4096, 1, 4, 384},  // Qwen3-8B: 384 blocks
        {768, 2048, 8, 8, 48},    // Qwen3-30B-A3B experts: 48 x 8
        {1536, 3072, 8, 4, 48},   // MiniMax-M2 experts: 48 x 8
    };
    for (const double bw : {3.0e6, 4.4e6, 0.244e6})
        for (const WeightFormat f : {WeightFormat::INT4, WeightFormat::NVFP4})
            for (const Case & c : cases) {
                mm::GemvOpts o;
                o.mma        = true;
                o.smem_optin = 227 * 1024;
                o.bw_per_us  = bw;
                const int64_t n = c.n;
                CAPTURE(n);
                CAPTURE(bw);
                const mm::GemvPlan p = mm::plan_gemv(f, c.n, c.k, c.jobs, 1, 2, 132, o);
                CHECK(p.mma_wave);
                CHECK(p.wk == c.wk);
                CHECK(p.ksplit == 1);
                CHECK(p.grid.x == c.grid_x);
                CHECK(int64_t(p.grid.x) * p.grid.z <= 132 * mm::kGemvMmaWaveBlocks);
                // Not for verify rows, SPARK_GEMV_WAVE=0, the lab's restrictions.
                CHECK_FALSE(mm::plan_gemv(f, c.n, c.k, c.jobs, 3, 2, 132, o).mma_wave);
                mm::overrides().gemv_wave = 0;
                CHECK_FALSE(mm::plan_gemv(f, c.n, c.k, c.jobs, 1, 2, 132, o).mma_wave);
                mm::overrides()         = mm::Overrides{};
                mm::overrides().gemv_wk = 2;
                CHECK_FALSE(mm::plan_gemv(f, c.n, c.k, c.jobs, 1, 2, 132, o).mma_wave);
                mm::overrides() = mm::Overrides{};
            }
    // A K of one 128-K block leaves no K-warp two steps: the 2-block kernel.
    mm::GemvOpts o;
    o.mma        = true;
    o.smem_optin = 227 * 1024;
    CHECK_FALSE(mm::plan_gemv(WeightFormat::INT4, 256, 128, 1, 1, 2, 132, o).mma_wave);
    // A gate/up too wide for one wave at one K-warp: the 2-block kernel.
    CHECK_FALSE(mm::plan_gemv(WeightFormat::INT4, 128 * 400, 4096, 1, 1, 2, 132, o).mma_wave);
    // A single weight only where one wave fills more than two blocks per SM: MiniMax-M2's experts'
    // down (48 x 8 blocks of 4 K-warps), not the 30B-A3B's (16 x 8 at most) nor the dense and attention
    // projections swept (a sweep's best 3-block plan was slower for each of them).
    for (const WeightFormat f : {WeightFormat::INT4, WeightFormat::NVFP4}) {
        const mm::GemvPlan d = mm::plan_gemv(f, 3072, 1536, 8, 1, 1, 132, o);
        CHECK(d.mma_wave);
        CHECK(d.wk == 4);
        CHECK(d.grid.x == 48);
        CHECK(d.ksplit == 1);
        CHECK_FALSE(mm::plan_gemv(f, 3072, 1536, 8, 2, 1, 132, o).mma_wave);
        CHECK_FALSE(mm::plan_gemv(f, 2048, 768, 8, 1, 1, 132, o).mma_wave);   // 30B-A3B experts' down
        CHECK_FALSE(mm::plan_gemv(f, 4096, 12288, 1, 1, 1, 132, o).mma_wave);  // Qwen3-8B down
        CHECK_FALSE(mm::plan_gemv(f, 4096, 4096, 1, 1, 1, 132, o).mma_wave);   // Qwen3-8B o
        CHECK_FALSE(mm::plan_gemv(f, 3072, 6144, 1, 1, 1, 132, o).mma_wave);   // MiniMax-M2 o
        CHECK_FALSE(mm::plan_gemv(f, 8192, 3072, 1, 1, 1, 132, o).mma_wave);   // MiniMax-M2 q + k + v as one weight
        CHECK_FALSE(mm::plan_gemv(f, 2048, 4096, 1, 1, 1, 132, o).mma_wave);   // 30B-A3B o
        mm::overrides().gemv_wave = 2;  // SPARK_GEMV_WAVE=2: the fused gate/up only
        CHECK_FALSE(mm::plan_gemv(f, 3072, 1536, 8, 1, 1, 132, o).mma_wave);
        CHECK(mm::plan_gemv(f, 1536, 3072, 8, 1, 2, 132, o).mma_wave);
        mm::overrides() = mm::Overrides{};
    }
    // Fewer SMs, fewer K-warps (GB10's 48: the 30B-A3B experts in one wave of 144 blocks).
    const mm::GemvPlan g = mm::plan_gemv(WeightFormat::INT4, 768, 2048, 8, 1, 2, 48, o);
    CHECK(g.mma_wave);
    CHECK(int64_t(g.grid.x) * g.grid.z <= 48 * mm::kGemvMmaWaveBlocks);
}

// Where the weights go (weight_placement.h), on injected device and host properties.
TEST_CASE("weight placement: in place from the mapped file only where the GPU's memory is the host's") {
    using spark::cuda::MemoryFacts;
    using spark::cuda::WeightPlacement;
    using spark::cuda::choose_weight_placement;
    constexpr uint64_t GB = uint64_t(1) << 30;
    struct Case {
        const char * name;
        MemoryFacts  facts;
        WeightPlacement expect;
    };
    const Case cases[] = {
        {"H100 SXM in an x86 server (discrete, HMM off)", {false, false, 80 * GB, 2048 * GB}, WeightPlacement::Device},
        {"RTX PRO 6000 in a workstation (discrete; HMM may let it reach pageable memory, over PCIe)", {false, false, 96 * GB, 256 * GB},
         WeightPlacement::Device},
        {"DGX Spark GB10 (the host's LPDDR5X through its page tables, all of it the GPU's)", {false, true, 119 * GB, 128 * GB},
         WeightPlacement::InPlace},
        {"DGX Spark GB10 reporting itself integrated", {true, true, 119 * GB, 128 * GB}, WeightPlacement::InPlace},
        {"Jetson AGX Orin (integrated)", {true, false, 61 * GB, 64 * GB}, WeightPlacement::InPlace},
        {"GH200 (ATS, but 96 GB of its own HBM beside 480 GB of LPDDR5X)", {false, true, 96 * GB, 480 * GB}, WeightPlacement::Device},
        {"host memory unknown", {false, true, 119 * GB, 0}, WeightPlacement::Device},
    };
    for (const Case & c : cases) {
        CAPTURE(c.name);
        CHECK(choose_weight_placement(c.facts, -1) == c.expect);
        CHECK(choose_weight_placement(c.facts, 0) == WeightPlacement::Device);   // SPARK_WEIGHTS_IN_PLACE=0
        CHECK(choose_weight_placement(c.facts, 1) == WeightPlacement::InPlace);  // =1 (tests of the path on discrete GPUs)
    }
}

// The residual add + RMS_NORM inside the decode GEMV (op_add_norm_matmul) is planned only as the
// 2-block MMA kernel with blocks of kGemvNormMinRows rows or more and no K split (matmul.h: each
// block reads the addends and the norm's weight; below 64 rows that measured slower than the
// separate launches). The q/k/v (and in_proj) launches of the four shapes on an H100 and an H200:
// Qwen3-Next's fuse, the 32-row blocks of Qwen3-8B, 30B-A3B and MiniMax-M2 do not; the plain
// launches' plans are unchanged by the option.
TEST_CASE("GEMV planner: the norm prologue takes blocks of 64 rows or more, no K split") {
    OverrideGuard guard;
    DeviceProps   h200 = h100();
    mm::device_rates(h200, 3201000, 6144, 1980000);
    struct Case {
        const char *         name;
        std::vector<int64_t> ns;
        int64_t              k;
        bool                 fused;
    };
    const Case cases[] = {{"Qwen3-Next in_proj_qkvz + in_proj_ba", {12288, 64}, 2048, true},
                          {"Qwen3-Next q (+ gate) / k / v", {8192, 512, 512}, 2048, true},
                          {"Qwen3-8B q / k / v", {4096, 1024, 1024}, 4096, false},
                          {"Qwen3-30B-A3B q / k / v", {4096, 512, 512}, 2048, false},
                          {"MiniMax-M2 q / k / v", {6144, 1024, 1024}, 3072, false}};
    for (const DeviceProps & d : {h100(), h200})
        for (const WeightFormat f : {WeightFormat::INT4, WeightFormat::NVFP4})
            for (const Case & c : cases) {
                CAPTURE(c.name);
                CAPTURE(int(f));
                std::vector<DeviceWeight> ws;
                for (const int64_t n : c.ns) ws.push_back(weight(f, n, c.k));
                mm::Multi mu;
                for (size_t i = 0; i < ws.size(); ++i) mu.w[i] = &ws[i];
                mu.count = int(ws.size());
                mu.x     = rows_at(kAligned, 1, c.k);
                mu.rows  = 1;
                const mm::GemvPlan plain = mm::plan_multi(mu, d).gemv_for(1);
                mu.norm_prologue         = true;
                const mm::GemvPlan p     = mm::plan_multi(mu, d).gemv_for(1);
                CHECK(p.mma == c.fused);
                if (p.mma) {
                    CHECK(!p.mma_wave);
                    CHECK(p.rows_per_block >= mm::kGemvNormMinRows);
                    CHECK(p.ksplit == 1);
                }
                // In place: the plain plan of the launch (the option changes nothing without it).
                mu.norm_prologue          = false;
                const mm::GemvPlan again = mm::plan_multi(mu, d).gemv_for(1);
                CHECK(again.wk == plain.wk);
                CHECK(again.grid.x == plain.grid.x);
                CHECK(again.ksplit == plain.ksplit);
            }
}

// The experts' down projection with the combine (plan_experts_combine): one block of 16 rows per SM
// at most. Qwen3-30B-A3B's down (2048 rows: 128 blocks) takes it on the H100's / H200's 132 SMs;
// MiniMax-M2's (3072 rows: 192 blocks) does not (measured 2.5% slower there), nor 30B-A3B's on a
// GB10's 48 SMs; a block's 8 warps are the 8 slots (another top-k has no plan).
TEST_CASE("GEMV planner: the experts' combine in the down projection, one block per SM at most") {
    DeviceProps gb10 = h100();
    gb10.sm_count    = 48;
    const mm::GemvPlan p30 = mm::plan_experts_combine(2048, 768, 8, 1, h100().sm_count);
    CHECK(p30.grid.x == 128);
    CHECK(p30.grid.z == 1);
    CHECK(p30.wk == 8);
    CHECK(p30.ksplit == 1);
    CHECK(p30.rows_per_block == 16);
    CHECK(mm::plan_experts_combine(3072, 1536, 8, 1, h100().sm_count).grid.x == 0);  // MiniMax-M2
    CHECK(mm::plan_experts_combine(2048, 768, 8, 1, gb10.sm_count).grid.x == 0);
    CHECK(mm::plan_experts_combine(2048, 768, 10, 1, h100().sm_count).grid.x == 0);  // top-10
    CHECK(mm::plan_experts_combine(2048, 768, 8, 2, h100().sm_count).grid.x == 0);   // 256 blocks
}
