// Runs the decode GEMV kernels (src/backends/cuda/matmul/gemv_kernels.cuh, the FMA decode, and gemv_mma_kernels.cuh,
// the tensor-core decode), unchanged, on the CPU warp emulator (dev/emu: threads are fibers, warps
// meet at shuffles and mma.sync, blocks at __syncthreads, random warp orders between them; blocks
// run one after another) against a
// double-precision reference over the bit-exact decoders of quant/formats.h. No GPU needed: checks
// the work mapping (lanes per row, K-warps, K splits with the last-block reduction; MMA: both tile
// modes, odd block ranges; the block-wide activation split and, INT4 at one row on the 2-block
// kernel, each warp's own split inside its loop with its __syncwarp), the register ring, the decoders (INT4 sym / asym, f16 / bf16 scales,
// group sizes that are and are not powers of two, one group; NVFP4; FP8 with 2-D blocks; F32 / F16 /
// BF16), 1..8 activation rows (MMA: 1 to 3 MMAs per fragment; activations over 80 binades), fused
// gate/up + SwiGLU, MATMUL_ID pairs with strided and invalid expert ids and absent experts (expert
// parallelism), multi-weight launches, and
// the plans plan_gemv picks for the model shapes. Weights live in exactly-sized buffers, so the
// address sanitizer catches any load past a weight; shared memory starts as NaN, so any read of an
// unwritten B fragment shows. The tensor cores' f32 sums are modelled pessimistically (every term
// truncated to 2^(e_max - 23), the sum truncated; emu::mma_sum in
// dev/emu/backends/cuda/common/ptx_sm80.cuh): the MMA kernel's worst nmse is printed at the end
// (~1e-13; "exact-mma" as a third argument sums exactly).
//
// Every launch runs under the programmatic dependent launch model
// (dev/emu/backends/cuda/common/pdl.cuh): the activations, expert ids and K-split counters are
// poisoned until the grid's first wait (the weights are read before it), every thread must wait,
// some thread must trigger ("FAIL pdl" lines).
//
// Part of the CPU test suite (ctest: emu-gemv, all cases). Build and run by hand (from the repository
// root; about three minutes on two cores):
//   g++ -std=c++20 -O2 -g -fsanitize=address,undefined -Idev/emu -Isrc -Iinclude \
//       dev/kernels/matmul/emu_gemv.cpp src/backends/cuda/matmul/plan.cpp -o /tmp/emu_gemv && /tmp/emu_gemv
// Options: a case-name filter (substring, e.g. "mma"), then a seed, then "exact-mma"; or --plans
// (the plans of both kernels for the lab's model shapes, no emulation).
#include "backends/cuda/matmul/gemv_kernels.cuh"
#include "backends/cuda/matmul/gemv_mma_kernels.cuh"
#include "backends/cuda/matmul/tuning.h"
#include "backends/cuda/common/pdl.cuh"  // the PDL model (dev/emu)

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace spark::cuda {
void throw_cuda_error(cudaError_t, const char * call, const char * file, int line) {
    std::fprintf(stderr, "emu: CUDA error in %s at %s:%d\n", call, file, line);
    std::abort();
}
}  // namespace spark::cuda

using namespace spark;
using namespace spark::cuda;
using namespace spark::cuda::mm;

namespace {

std::mt19937_64 rng(7);
float           uni(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }
uint32_t        bits32() { return uint32_t(rng()); }

// Exactly `bytes` long, 16-byte aligned (the allocator aligns new[] of uint4 to 16 at least); the
// sanitizer sees the exact size because the buffer is a plain new[] of the rounded-up uint4 count
// and nothing reads past `bytes` unless the kernel reads past the weight.
struct Buf {
    std::unique_ptr<uint4[]> p;
    size_t                   bytes = 0;
    explicit Buf(size_t b = 0) : p(new uint4[(b + 15) / 16]()), bytes(b) {}
    uint8_t * data() { return reinterpret_cast<uint8_t *>(p.get()); }
};

struct Spec {
    WeightFormat f;
    int32_t      group = 128;  // INT4
    bool         zeros = false, bf16_scales = false;
    int32_t      bn = 128, bk = 128;  // FP8
    std::string  name;
};

struct HostWeight {
    Spec                 s;
    int64_t              n = 0, k = 0;
    std::shared_ptr<Buf> data, scales, zeros;
    DeviceWeight         dw;
};

HostWeight make_weight(const Spec & s, int64_t n, int64_t k) {
    HostWeight h;
    h.s = s;
    h.n = n;
    h.k = k;
    DeviceWeight & d = h.dw;
    d.format         = s.f;
    d.n              = n;
    d.k              = k;
    auto fill        = [](Buf & b) {
        for (size_t i = 0; i < b.bytes; ++i) b.data()[i] = uint8_t(bits32());
    };
    switch (s.f) {
        case WeightFormat::F32: {
            h.data = std::make_shared<Buf>(size_t(n * k) * 4);
            auto * p = reinterpret_cast<float *>(h.data->data());
            for (int64_t i = 0; i < n * k; ++i) p[i] = uni(-1.0f, 1.0f);
            break;
        }
        case WeightFormat::F16:
        case WeightFormat::BF16: {
            h.data = std::make_shared<Buf>(size_t(n * k) * 2);
            auto * p = reinterpret_cast<uint16_t *>(h.data->data());
            for (int64_t i = 0; i < n * k; ++i) p[i] = s.f == WeightFormat::BF16 ? f32_to_bf16(uni(-1.0f, 1.0f)) : f32_to_f16(uni(-1.0f, 1.0f));
            break;
        }
        case WeightFormat::NVFP4: {
            h.data   = std::make_shared<Buf>(size_t(n * k / 2));
            h.scales = std::make_shared<Buf>(size_t(n * k / 16));
            fill(*h.data);
            for (size_t i = 0; i < h.scales->bytes; ++i) h.scales->data()[i] = f32_to_e4m3(uni(0.25f, 4.0f));
            d.global_scale = 0.37f;
            d.tiled        = w4_tiled_layout(n, k);  // as the upload stores it
            break;
        }
        case WeightFormat::INT4: {
            d.group_size = s.group > 0 ? s.group : int32_t(k);
            d.n_groups   = int32_t((k + d.group_size - 1) / d.group_size);
            d.scale_type = s.bf16_scales ? ScaleType::BF16 : ScaleType::F16;
            d.tiled      = w4_tiled_layout(n, k);  // as the upload stores it (random words: only the order matters)
            h.data       = std::make_shared<Buf>(size_t(n * k / 2));
            h.scales     = std::make_shared<Buf>(size_t(n * d.n_groups) * 2);
            fill(*h.data);
            auto * sc = reinterpret_cast<uint16_t *>(h.scales->data());
            for (int64_t i = 0; i < n * d.n_groups; ++i) sc[i] = s.bf16_scales ? f32_to_bf16(uni(0.01f, 0.1f)) : f32_to_f16(uni(0.01f, 0.1f));
            if (s.zeros) {
                h.zeros = std::make_shared<Buf>(size_t(n * d.n_groups));
                for (size_t i = 0; i < h.zeros->bytes; ++i) h.zeros->data()[i] = uint8_t(bits32() % 17);  // 0..16 (GPTQ offset)
            }
            break;
        }
        case WeightFormat::FP8: {
            d.block_n   = s.bn;
            d.block_k   = s.bk;
            h.data      = std::make_shared<Buf>(size_t(n * k));
            for (size_t i = 0; i < h.data->bytes; ++i) {
                uint8_t b = uint8_t(bits32());
                if ((b & 0x7F) == 0x7F) b = 0x7E;  // no NaN codes
                h.data->data()[i] = b;
            }
            const int64_t sn = (n + s.bn - 1) / s.bn, sk = (k + s.bk - 1) / s.bk;
            h.scales         = std::make_shared<Buf>(size_t(sn * sk) * 4);
            auto * sc        = reinterpret_cast<float *>(h.scales->data());
            for (int64_t i = 0; i < sn * sk; ++i) sc[i] = uni(0.001f, 0.01f);
            break;
        }
    }
    d.data   = h.data->data();
    d.scales = h.scales ? h.scales->data() : nullptr;
    d.zeros  = h.zeros ? h.zeros->data() : nullptr;
    return h;
}

double ref_weight(const HostWeight & h, int64_t n, int64_t k) {
    const DeviceWeight & w = h.dw;
    switch (w.format) {
        case WeightFormat::F32: return reinterpret_cast<const float *>(w.data)[n * w.k + k];
        case WeightFormat::F16: return f16_to_f32(reinterpret_cast<const uint16_t *>(w.data)[n * w.k + k]);
        case WeightFormat::BF16: return bf16_to_f32(reinterpret_cast<const uint16_t *>(w.data)[n * w.k + k]);
        case WeightFormat::NVFP4: {
            const uint8_t b = static_cast<const uint8_t *>(w.data)[w4_byte_index(w.tiled, n, k / 2, w.k / 2)];
            const float   s = e4m3_to_f32(static_cast<const uint8_t *>(w.scales)[n * (w.k / 16) + k / 16]) * w.global_scale;
            return double(e2m1_to_f32(uint8_t(k & 1 ? b >> 4 : b & 15))) * double(s);
        }
        case WeightFormat::INT4: {
            const uint32_t word = reinterpret_cast<const uint32_t *>(w.data)[w4_word_index(w.tiled, n, k / 8, w.k / 8)];
            const int64_t  idx  = n * w.n_groups + k / w.group_size;
            const uint16_t sb   = static_cast<const uint16_t *>(w.scales)[idx];
            const double   s    = w.scale_type == ScaleType::BF16 ? bf16_to_f32(sb) : f16_to_f32(sb);
            const double   z    = w.zeros ? double(w.zeros[idx]) : 8.0;
            return s * (double(int4_get(word, int(k % 8))) - z);
        }
        case WeightFormat::FP8: {
            const int64_t sk = (w.k + w.block_k - 1) / w.block_k;
            return double(e4m3_to_f32(static_cast<const uint8_t *>(w.data)[n * w.k + k])) *
                   double(static_cast<const float *>(w.scales)[(n / w.block_n) * sk + k / w.block_k]);
        }
    }
    return 0;
}

// The instantiation the GPU's launcher would take (gemv_select), on the emulator.
template <class F>
void run_kernel(int r_tmpl, bool glu, const GemvArgs & a, dim3 grid) {
    const char * why = gemv_select<F>(r_tmpl, glu, [&](auto kernel) { emu::launch(grid, dim3(kGemvThreads), 0, [&] { kernel(a); }, rng()); });
    if (why != nullptr) {
        std::fprintf(stderr, "%s\n", why);
        std::abort();
    }
}

void run_any(WeightFormat f, bool int4_zeros, int r_tmpl, bool glu, const GemvArgs & a, dim3 grid) {
    switch (f) {
        case WeightFormat::F32: run_kernel<GvPlain<FmtF32>>(r_tmpl, glu, a, grid); break;
        case WeightFormat::F16: run_kernel<GvPlain<FmtF16>>(r_tmpl, glu, a, grid); break;
        case WeightFormat::BF16: run_kernel<GvPlain<FmtBF16>>(r_tmpl, glu, a, grid); break;
        case WeightFormat::NVFP4: run_kernel<GvNvfp4>(r_tmpl, glu, a, grid); break;
        case WeightFormat::INT4:
            if (int4_zeros)
                run_kernel<GvInt4<true>>(r_tmpl, glu, a, grid);
            else
                run_kernel<GvInt4<false>>(r_tmpl, glu, a, grid);
            break;
        case WeightFormat::FP8: run_kernel<GvFp8>(r_tmpl, glu, a, grid); break;
    }
}

template <class F, int R, bool GLU, bool WAVE, bool NORM, bool XE, int RS, bool PN, bool KS>
void run_mma_variant(GemvMmaVariant<R, GLU, WAVE, NORM, XE, RS, PN, KS>, const GemvArgs & a, dim3 grid, int smem) {
    emu::launch(grid, dim3(kGemvThreads), size_t(smem), [&] { gemv_mma_kernel<F, R, GLU, WAVE, NORM, XE, RS, PN, KS>(a); }, rng());
}

// The instantiation the GPU's launcher would take (gemv_mma_select), on the emulator.
template <class F>
void run_mma_kernel(int r_tmpl, bool glu, const GemvArgs & a, dim3 grid, int smem) {
    const char * why =
        gemv_mma_select<F>(r_tmpl, glu, a, grid, smem, [&](auto variant, const GemvArgs & args, int bytes) { run_mma_variant<F>(variant, args, grid, bytes); });
    if (why != nullptr) {
        std::fprintf(stderr, "%s\n", why);
        std::abort();
    }
}

// Either kernel, as the plan says.
void run_plan(WeightFormat f, bool int4_zeros, const GemvPlan & p, bool glu, const GemvArgs & a) {
    if (!p.mma) return run_any(f, int4_zeros, p.r_tmpl, glu, a, p.grid);
    if (f == WeightFormat::NVFP4)
        run_mma_kernel<MmaNvfp4>(p.r_tmpl, glu, a, p.grid, p.smem);
    else if (int4_zeros)
        run_mma_kernel<MmaInt4<true>>(p.r_tmpl, glu, a, p.grid, p.smem);
    else
        run_mma_kernel<MmaInt4<false>>(p.r_tmpl, glu, a, p.grid, p.smem);
}

// run_plan under the PDL model: `regions` are the launch's dependent inputs (activations, expert ids,
// the K-split arrival counters) and outputs; the weights are read before the wait and not armed.
void run_plan_pdl(const std::string & name, WeightFormat f, bool int4_zeros, const GemvPlan & p, bool glu, const GemvArgs & a,
                  const std::vector<pdl::model::Region> & regions) {
    pdl::model::Guard g(regions);
    run_plan(f, int4_zeros, p, glu, a);
    g.check(std::string(p.mma ? "gemv_mma_kernel " : "gemv_kernel ") + name);
}

// The plan's work split into the launch's arguments (and the K split's partials and counters).
void set_plan(GemvArgs & a, const GemvPlan & p, const Spec & s, Buf & pb, Buf & cb) {
    a.wk               = p.wk;
    a.lpr              = p.lpr;
    a.chunks_per_split = p.cps;
    a.int4_zeros       = s.zeros;
    a.mma_kpair        = p.mma_kpair;
    a.mma_wave         = p.mma_wave;
    if (p.ksplit > 1) {
        a.partial  = reinterpret_cast<float *>(pb.data());
        a.counters = reinterpret_cast<uint32_t *>(cb.data());
    }
}

// A work split: the plan's, or forced (lanes per row, K-warps, K splits; MMA kernel: lpr unused,
// any non-zero value forces).
struct Split {
    int lpr = 0, wk = 0, ks = 0;  // 0: plan_gemv's choice
    int kp  = 0;                  // MMA: one row tile at two K blocks per step (nw = 1)
    int wave = 0;                 // MMA: the one-wave variant (one activation row)
};

bool mma_spec(const Spec & s, int64_t k) {
    DeviceWeight d;
    d.format     = s.f;
    d.k          = k;
    d.group_size = s.group > 0 ? s.group : int32_t(k);
    return gemv_mma_ok(d);
}

GemvPlan make_plan(const Spec & s, int64_t n, int64_t k, int64_t jobs, int rows, int nw, Split sp, bool mma = false,
                   const int64_t * mat_n = nullptr, int n_mats = 1) {
    GemvOpts o;
    o.mma        = mma && mma_spec(s, k);
    o.smem_optin = 227 * 1024;
    o.n_mats     = n_mats;
    o.mat_n      = mat_n;
    if (sp.lpr == 0) return plan_gemv(s.f, n, k, jobs, rows, nw, 132, o);
    if (o.mma) {
        GemvPlan p;
        p.mma            = true;
        p.r_tmpl         = rows <= 1 ? 1 : rows <= 2 ? 2 : rows <= 4 ? 4 : 8;
        const int64_t KB = (k / 32 + 3) / 4;
        p.wk             = sp.wk;
        p.cps            = (KB + sp.ks - 1) / sp.ks;  // not rounded to the K-warps: partial steps everywhere
        if (sp.kp && nw == 1) p.cps += p.cps & 1;     // kp: even (room for the zero block of an odd range)
        p.ksplit         = int((KB + p.cps - 1) / p.cps);
        p.mma_kpair      = sp.kp && nw == 1;
        p.mma_wave       = sp.wave && rows == 1 && !(sp.kp && nw == 1);
        p.rows_per_block = (kGemvThreads / 32 / sp.wk) * (p.mma_kpair ? 1 : gemv_mma_tiles(nw)) * 16;
        p.smem           = gemv_mma_smem(p.r_tmpl, std::min<int64_t>(p.cps, KB + 1));
        int64_t tiles    = 0;
        for (int m = 0; m < n_mats; ++m) tiles += ((mat_n ? mat_n[m] : n) + p.rows_per_block - 1) / p.rows_per_block;
        p.grid = dim3(unsigned(tiles), unsigned(p.ksplit), unsigned(jobs));
        return p;
    }
    GemvPlan      p;
    p.r_tmpl         = rows <= 1 ? 1 : rows <= 2 ? 2 : rows <= 4 ? 4 : 8;
    const int     e  = elems_per_chunk(s.f);
    const int     U  = gemv_rows_per_warp(p.r_tmpl, nw, e);
    const int64_t KC = k / e;
    const int64_t rb = int64_t(kGemvThreads / 32 / sp.wk) * (32 / sp.lpr) * U;
    p.lpr            = sp.lpr;
    p.wk             = sp.wk;
    p.cps            = (KC + sp.ks - 1) / sp.ks;  // not rounded to the lane stride: partial steps everywhere
    p.ksplit         = int((KC + p.cps - 1) / p.cps);
    p.rows_per_block = int(rb);
    int64_t tiles    = 0;
    for (int m = 0; m < n_mats; ++m) tiles += ((mat_n ? mat_n[m] : n) + rb - 1) / rb;
    p.grid = dim3(unsigned(tiles), unsigned(p.ksplit), unsigned(jobs));
    return p;
}

double nmse(const std::vector<float> & got, const std::vector<double> & ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

double silu_d(double g) { return g / (1.0 + std::exp(-g)); }

int  g_fail = 0, g_cases = 0;
double g_worst_mma = 0.0;
void   report(const std::string & name, double e, const GemvPlan & p) {
    ++g_cases;
    const bool ok = e <= 1e-10;
    if (!ok) ++g_fail;
    if (p.mma) g_worst_mma = std::max(g_worst_mma, e);
    if (p.mma)
        std::printf("%s %-74s mma wk=%d ks=%d cps=%lld smem=%d grid=%ux%ux%u  nmse %.1e\n", ok ? "ok  " : "FAIL", name.c_str(), p.wk, p.ksplit,
                    (long long) p.cps, p.smem, p.grid.x, p.grid.y, p.grid.z, e);
    else
        std::printf("%s %-74s lpr=%2d wk=%d ks=%d grid=%ux%ux%u  nmse %.1e\n", ok ? "ok  " : "FAIL", name.c_str(), p.lpr, p.wk, p.ksplit,
                    p.grid.x, p.grid.y, p.grid.z, e);
}

// Activation values: uniform in [-1, 1], or (wide) times 2^e with e uniform in [-40, 40] (per-block
// scaling of the MMA kernel), with a few exact zeros.
bool g_wide_x = false;
float x_value() {
    if (!g_wide_x) return uni(-1.0f, 1.0f);
    if (bits32() % 31 == 0) return 0.0f;
    return std::ldexp(uni(-1.0f, 1.0f), int(bits32() % 81) - 40);
}

// The name part of a forced split ("" for the plan's).
std::string forced_label(const Split & sp, bool mma) {
    if (!sp.lpr) return "";
    const std::string kind = mma ? std::string(sp.kp ? "kp/" : sp.wave ? "wave/" : "") : std::to_string(sp.lpr) + "/";
    return " forced " + kind + std::to_string(sp.wk) + "/" + std::to_string(sp.ks);
}

// Plain MATMUL (nw = 1) or fused gate/up + SwiGLU (nw = 2) over `rows` activation rows.
void check_dense(const Spec & s, int64_t n, int64_t k, int rows, int nw, Split sp, const std::string & filter, bool mma = false) {
    if (mma && !mma_spec(s, k)) return;
    const std::string name = std::string(mma ? "mma " : "") + s.name + " N=" + std::to_string(n) + " K=" + std::to_string(k) +
                             " rows=" + std::to_string(rows) + (nw == 2 ? " glu" : "") + (g_wide_x ? " wide-x" : "") +
                             forced_label(sp, mma);
    if (name.find(filter) == std::string::npos) return;
    std::vector<HostWeight> w;
    for (int i = 0; i < nw; ++i) w.push_back(make_weight(s, n, k));
    Buf      xb(size_t(rows * k) * 4);
    float *  x = reinterpret_cast<float *>(xb.data());
    for (int64_t i = 0; i < rows * k; ++i) x[i] = x_value();
    const GemvPlan p = make_plan(s, n, k, 1, rows, nw, sp, mma);
    Buf            yb(size_t(rows * n) * 4), pb(size_t(p.ksplit) * nw * rows * n * 4), cb(size_t(p.grid.x) * 4);
    float *        y = reinterpret_cast<float *>(yb.data());
    std::fill(y, y + rows * n, NAN);
    GemvArgs a;
    a.w[0] = w[0].dw;
    a.w[1] = w[nw - 1].dw;
    for (int r = 0; r < kGemvMaxRows; ++r) a.x[r] = x + (r < rows ? r : 0) * k;
    a.n = n;
    a.k = k;
    a.rows = a.out_rows = rows;
    set_plan(a, p, s, pb, cb);
    a.y                = y;
    run_plan_pdl(name, s.f, s.zeros, p, nw == 2, a,
                 {pdl::model::in(xb.data(), xb.bytes), pdl::model::in(cb.data(), p.ksplit > 1 ? cb.bytes : 0),
                  pdl::model::out(yb.data(), yb.bytes), pdl::model::out(pb.data(), p.ksplit > 1 ? pb.bytes : 0)});
    std::vector<float>  got(y, y + rows * n);
    std::vector<double> ref(size_t(rows * n));
    for (int r = 0; r < rows; ++r)
        for (int64_t j = 0; j < n; ++j) {
            double d[2] = {0, 0};
            for (int i = 0; i < nw; ++i)
                for (int64_t kk = 0; kk < k; ++kk) d[i] += ref_weight(w[size_t(i)], j, kk) * x[r * k + kk];
            ref[size_t(r * n + j)] = nw == 2 ? silu_d(d[0]) * d[1] : d[0];
        }
    report(name, nmse(got, ref), p);
}

// The experts of a set copied into one buffer at one stride (expert_grid: a GEMV block computes its
// expert's addresses from the id). g_packed: check_moe packs its experts so (the buffers stay alive
// in g_packs).
bool                              g_packed = false;
std::vector<std::shared_ptr<Buf>> g_packs;
void pack_experts(std::vector<HostWeight> & ws) {
    auto         room = [](const std::shared_ptr<Buf> & b) { return b ? (b->bytes + 255) / 256 * 256 : size_t(0); };
    const size_t sd = room(ws[0].data), ss = room(ws[0].scales), sz = room(ws[0].zeros), stride = sd + ss + sz;
    auto         pack = std::make_shared<Buf>(stride * ws.size());
    for (size_t e = 0; e < ws.size(); ++e) {
        HostWeight & h    = ws[e];
        uint8_t *    base = pack->data() + e * stride;
        std::memcpy(base, h.data->data(), h.data->bytes);
        h.dw.data = base;
        if (h.scales) std::memcpy(base + sd, h.scales->data(), h.scales->bytes), h.dw.scales = base + sd;
        if (h.zeros) std::memcpy(base + sd + ss, h.zeros->data(), h.zeros->bytes), h.dw.zeros = base + sd + ss;
    }
    g_packs.push_back(pack);
}

// Experts a rank of an expert-parallel split does not hold (device_weight.h, absent_expert): none,
// the first half (expert 0 among them, as every rank but the first sees it), every odd one.
enum class Absent { none, first_half, odd };
bool absent_expert_at(Absent a, int e, int experts) {
    return a == Absent::first_half ? e < experts / 2 : a == Absent::odd ? e % 2 == 1 : false;
}

// MATMUL_ID over `experts` experts, k_slots x T pairs, ids with strides (s0, s1) and some invalid
// ids (-1, n_experts) whose rows must come out 0; shared_x: the k_slots share one input row.
// early: the ids (Early::ids, GemvArgs::ids_early) or the activations (Early::x, GemvArgs::x_early,
// MMA kernel) were written two launches back: the PDL model leaves them readable before the wait and
// checks that the other input still waits for it. absent: experts whose
// table entries are absent_expert()s (null pointers: a load from one crashes), whose rows must come
// out 0 too; a.w is then the first held expert, as run_moe_gemv sets it.
enum class Early { none, ids, x };
void check_moe(const Spec & s, int64_t n, int64_t k, int experts, int k_slots, int T, int nw, bool shared_x, Split sp,
               const std::string & filter, bool mma = false, Early early = Early::none, Absent absent = Absent::none) {
    if (mma && !mma_spec(s, k)) return;
    const std::string name = std::string(mma ? "mma " : "") + "moe " + s.name + " N=" + std::to_string(n) + " K=" + std::to_string(k) + " " +
                             std::to_string(k_slots) + "x" + std::to_string(T) + (nw == 2 ? " glu" : "") + (shared_x ? " shared-x" : "") +
                             (early == Early::ids ? " ids-early" : early == Early::x ? " x-early" : "") +
                             (absent == Absent::first_half ? " absent-first-half" : absent == Absent::odd ? " absent-odd" : "") +
                             (g_packed ? " packed" : "") + forced_label(sp, mma);
    if (name.find(filter) == std::string::npos) return;
    std::vector<HostWeight> w[2];
    std::vector<DeviceWeight> table[2];
    int first_held = -1;
    for (int i = 0; i < nw; ++i) {
        for (int e = 0; e < experts; ++e) w[i].push_back(make_weight(s, n, k));
        if (g_packed) pack_experts(w[i]);
        for (int e = 0; e < experts; ++e) {
            const bool held = !absent_expert_at(absent, e, experts);
            table[i].push_back(held ? w[i][size_t(e)].dw : absent_expert(w[i][size_t(e)].dw));
            if (held && first_held < 0) first_held = e;
        }
    }
    const int64_t        pairs = int64_t(k_slots) * T;
    const int64_t        s0 = 1, s1 = k_slots + 3;  // ids [T][k_slots + 3]: strided rows
    std::vector<int32_t> ids(size_t(T * s1), 12345);
    for (int t = 0; t < T; ++t)
        for (int j = 0; j < k_slots; ++j) {
            const uint32_t r = bits32() % 23;
            ids[size_t(j * s0 + t * s1)] = r == 0 ? -1 : r == 1 ? experts : int32_t(bits32() % uint32_t(experts));
        }
    const int64_t x_sj = shared_x ? 0 : k + 4, x_st = shared_x ? k + 4 : (k + 4) * k_slots;  // padded rows (16-byte aligned)
    Buf           xb(size_t((T - 1) * x_st + (k_slots - 1) * x_sj + k) * 4);
    float *       x = reinterpret_cast<float *>(xb.data());
    for (size_t i = 0; i < xb.bytes / 4; ++i) x[i] = uni(-1.0f, 1.0f);
    const GemvPlan p = make_plan(s, n, k, pairs, 1, nw, sp, mma);
    Buf            yb(size_t(pairs * n) * 4), pb(size_t(p.ksplit) * nw * pairs * n * 4), cb(size_t(p.grid.x * p.grid.z) * 4);
    float *        y = reinterpret_cast<float *>(yb.data());
    std::fill(y, y + pairs * n, NAN);
    GemvArgs a;
    a.w[0]          = table[0][size_t(first_held)];
    a.w[1]          = table[nw - 1][size_t(first_held)];
    a.table[0]      = table[0].data();
    a.table[1]      = table[nw - 1].data();
    a.ids           = Ids{ids.data(), s0, s1, k_slots, experts};
    a.xbase         = x;
    a.x_sj          = x_sj;
    a.x_st          = x_st;
    a.n             = n;
    a.k             = k;
    a.rows          = 1;
    a.out_rows      = int32_t(pairs);
    set_plan(a, p, s, pb, cb);
    a.y                = y;
    a.ids_early = early == Early::ids;
    a.x_early   = early == Early::x;
    // The experts' addresses from the id where they lie at one stride (as run_moe_gemv decides).
    const ExpertGrid g0 = expert_grid(table[0].data(), experts), g1 = expert_grid(table[nw - 1].data(), experts);
    if (g0.uniform && g1.uniform) a.grid[0] = g0, a.grid[1] = g1;
    if (g_packed != (a.grid[0].uniform != 0)) {  // (packed: every expert held, so the grid must hold)
        std::printf("FAIL %s: expert_grid %s\n", name.c_str(), a.grid[0].uniform ? "holds for separate buffers" : "does not hold for packed experts");
        ++g_fail;
    }
    // The expert ids come from the router (poison: -1, an invalid id, whose rows come out 0), the
    // activations from the kernel before; either (early) from a launch whose writes are complete
    // before this one starts.
    run_plan_pdl(name, s.f, s.zeros, p, nw == 2, a,
                 {pdl::model::in(xb.data(), early == Early::x ? 0 : xb.bytes), pdl::model::in(ids.data(), early == Early::ids ? 0 : ids.size() * 4),
                  pdl::model::in(cb.data(), p.ksplit > 1 ? cb.bytes : 0),
                  pdl::model::out(yb.data(), yb.bytes), pdl::model::out(pb.data(), p.ksplit > 1 ? pb.bytes : 0)});
    std::vector<float>  got(y, y + pairs * n);
    std::vector<double> ref(size_t(pairs * n), 0.0);
    for (int t = 0; t < T; ++t)
        for (int j = 0; j < k_slots; ++j) {
            const int32_t e = ids[size_t(j * s0 + t * s1)];
            const int64_t pr = j + int64_t(k_slots) * t;
            if (e < 0 || e >= experts || absent_expert_at(absent, e, experts)) continue;
            const float * xr = x + j * x_sj + t * x_st;
            for (int64_t r = 0; r < n; ++r) {
                double d[2] = {0, 0};
                for (int i = 0; i < nw; ++i)
                    for (int64_t kk = 0; kk < k; ++kk) d[i] += ref_weight(w[i][size_t(e)], r, kk) * xr[kk];
                ref[size_t(pr * n + r)] = nw == 2 ? silu_d(d[0]) * d[1] : d[0];
            }
        }
    // Invalid and absent pairs must be exactly 0.
    for (int64_t i = 0; i < pairs * n; ++i)
        if (ref[size_t(i)] == 0.0 && got[size_t(i)] != 0.0f) got[size_t(i)] = NAN;
    report(name, nmse(got, ref), p);
}

// A GemvArgs::produce launch's other outputs: the weighted row z = sum x w bit for bit (wkind 0: no
// weight, 1: w, 2: 1 + w), y untouched, each block's part within 1e-5 of its rows' squares.
bool produced_ok(const float * sum, const float * z, const float * y, const float * parts, const float * nw, int wkind, int64_t n,
                 const GemvPlan & p) {
    bool ok = true;
    for (int64_t j = 0; j < n; ++j) {
        const float wv = wkind == 0 ? 1.0f : wkind == 1 ? nw[j] : 1.0f + nw[j];
        const float zj = sum[j] * wv;
        ok = ok && std::memcmp(&zj, &z[j], 4) == 0 && std::isnan(y[j]);
    }
    for (unsigned b = 0; b < p.grid.x; ++b) {
        double ss = 0;
        for (int64_t j = int64_t(b) * p.rows_per_block; j < std::min<int64_t>(n, int64_t(b + 1) * p.rows_per_block); ++j) ss += double(sum[j]) * sum[j];
        ok = ok && std::fabs(parts[b] - ss) <= 1e-5 * ss;
    }
    return ok;
}

// The experts' down projection and the MoE combine in one launch (GemvArgs::slot_w): warp kw of
// each block computes slot kw's expert, the block sums the slots' results times the route weights in
// slot order. y [T][n] = sum_j w_j W_e(j) x_j (an invalid or absent expert adds nothing); kp: a pair
// of K blocks per step; ids_early as check_moe's; packed: the addresses from the id. produce (one
// token): the residual ADD and the next norm's half in the epilogue instead of y (GemvArgs::produce,
// checked as check_produce's).
void check_experts_combine(const Spec & s, int64_t n, int64_t k, int experts, int T, bool kp, const std::string & filter, Early early = Early::none,
                           Absent absent = Absent::none, bool produce = false) {
    constexpr int k_slots = kGemvThreads / 32;  // (a K-warp per slot)
    if (s.f != WeightFormat::INT4 || !mma_spec(s, k)) return;
    const std::string name = "experts+combine " + s.name + " N=" + std::to_string(n) + " K=" + std::to_string(k) + " x" + std::to_string(T) +
                             (kp ? " kp" : "") + (early == Early::ids ? " ids-early" : "") +
                             (absent == Absent::odd ? " absent-odd" : "") + (g_packed ? " packed" : "") + (produce ? " produce" : "");
    if (name.find(filter) == std::string::npos) return;
    if (produce && T != 1) std::abort();
    std::vector<HostWeight>   w;
    std::vector<DeviceWeight> table;
    int                       first_held = -1;
    for (int e = 0; e < experts; ++e) w.push_back(make_weight(s, n, k));
    if (g_packed) pack_experts(w);
    for (int e = 0; e < experts; ++e) {
        const bool held = !absent_expert_at(absent, e, experts);
        table.push_back(held ? w[size_t(e)].dw : absent_expert(w[size_t(e)].dw));
        if (held && first_held < 0) first_held = e;
    }
    const int64_t        s1 = k_slots + 3;  // ids [T][k_slots + 3]
    std::vector<int32_t> ids(size_t(T * s1), 12345);
    std::vector<float>   sw(size_t(T * k_slots));  // route weights [T][k_slots]
    for (int t = 0; t < T; ++t)
        for (int j = 0; j < k_slots; ++j) {
            const uint32_t r = bits32() % 23;
            ids[size_t(j + t * s1)] = r == 0 ? -1 : r == 1 ? experts : int32_t(bits32() % uint32_t(experts));
            sw[size_t(j + t * k_slots)] = uni(0.01f, 0.5f);
        }
    const int64_t x_sj = k + 4, x_st = (k + 4) * k_slots;  // the gate/up's rows [T][k_slots][k] (padded)
    Buf           xb(size_t((T - 1) * x_st + (k_slots - 1) * x_sj + k) * 4);
    float *       x = reinterpret_cast<float *>(xb.data());
    for (size_t i = 0; i < xb.bytes / 4; ++i) x[i] = x_value();
    // kp: the planner's form (plan_experts_combine); else the kernel's other row form (one K block a
    // step, gemv_mma_tiles row tiles a block), which no plan takes but the kernel keeps.
    GemvPlan p = plan_experts_combine(n, k, k_slots, T, 132);
    if (kp && p.grid.x == 0) std::abort();
    if (!kp) {
        const int64_t KB = (k / 32 + 3) / 4;
        p.cps            = KB;
        p.mma_kpair      = false;
        p.rows_per_block = gemv_mma_tiles(1) * 16;
        p.smem           = gemv_mma_smem(1, std::min<int64_t>(p.cps, KB + 1));
        p.grid           = dim3(unsigned((n + p.rows_per_block - 1) / p.rows_per_block), 1, unsigned(T));
    }
    Buf     yb(size_t(T * n) * 4), pb(4), cb(4);
    float * y = reinterpret_cast<float *>(yb.data());
    std::fill(y, y + T * n, NAN);
    GemvArgs a;
    a.w[0]     = table[size_t(first_held)];
    a.table[0] = table.data();
    a.ids      = Ids{ids.data(), 1, s1, k_slots, experts};
    a.xbase    = x;
    a.x_sj     = x_sj;
    a.x_st     = x_st;
    a.n        = n;
    a.k        = k;
    a.rows     = 1;
    a.out_rows = T;
    set_plan(a, p, s, pb, cb);
    a.y         = y;
    a.slot_w    = sw.data();
    a.ids_early = early == Early::ids;
    const ExpertGrid g0 = expert_grid(table.data(), experts);
    if (g0.uniform) a.grid[0] = a.grid[1] = g0;
    const size_t       nn = static_cast<size_t>(n);
    std::vector<float> resid(nn), nw(nn), sum(nn, NAN), z(nn, NAN), parts(size_t(p.grid.x + 3) / 4 * 4, NAN);
    for (int64_t i = 0; i < n; ++i) resid[size_t(i)] = uni(-2, 2), nw[size_t(i)] = uni(-1.5f, 1.5f);
    if (produce) {
        a.produce.resid = resid.data();
        a.produce.sum   = sum.data();
        a.produce.z     = z.data();
        a.produce.w     = nw.data();
        a.produce.parts = parts.data();
    }
    // The activations come from the gate/up launch before, the ids and route weights from the
    // routing kernel (ids_early: two launches back, readable before the wait; the route weights are
    // read after it either way).
    run_plan_pdl(name, s.f, s.zeros, p, false, a,
                 {pdl::model::in(xb.data(), xb.bytes), pdl::model::in(ids.data(), early == Early::ids ? 0 : ids.size() * 4),
                  pdl::model::in(sw.data(), sw.size() * 4), pdl::model::in(resid.data(), produce ? resid.size() * 4 : 0),
                  pdl::model::out(yb.data(), yb.bytes), pdl::model::out(sum.data(), produce ? sum.size() * 4 : 0),
                  pdl::model::out(z.data(), produce ? z.size() * 4 : 0), pdl::model::out(parts.data(), produce ? parts.size() * 4 : 0)});
    std::vector<float>  got = produce ? sum : std::vector<float>(y, y + T * n);
    std::vector<double> ref(size_t(T * n), 0.0);
    for (int t = 0; t < T; ++t)
        for (int j = 0; j < k_slots; ++j) {
            const int32_t e = ids[size_t(j + t * s1)];
            if (e < 0 || e >= experts || absent_expert_at(absent, e, experts)) continue;
            const float * xr = x + j * x_sj + t * x_st;
            for (int64_t r = 0; r < n; ++r) {
                double d = 0;
                for (int64_t kk = 0; kk < k; ++kk) d += ref_weight(w[size_t(e)], r, kk) * xr[kk];
                ref[size_t(t * n + r)] += double(sw[size_t(j + t * k_slots)]) * d;
            }
        }
    if (produce) {
        for (int64_t r = 0; r < n; ++r) ref[size_t(r)] += resid[size_t(r)];
        if (!produced_ok(sum.data(), z.data(), y, parts.data(), nw.data(), 1, n, p)) return report(name + " [weighted row, parts or y wrong]", INFINITY, p);
    }
    report(name, nmse(got, ref), p);
}

// A multi-weight launch: weights of ns[m] rows (same format and K) over the same activation rows,
// one launch, each into its own output.
void check_multi(const Spec & s, const std::vector<int64_t> & ns, int64_t k, int rows, Split sp, const std::string & filter, bool mma) {
    if (mma && !mma_spec(s, k)) return;
    std::string name = std::string(mma ? "mma " : "") + "multi " + s.name + " N=";
    for (size_t m = 0; m < ns.size(); ++m) name += (m ? "+" : "") + std::to_string(ns[m]);
    name += " K=" + std::to_string(k) + " rows=" + std::to_string(rows) +
            forced_label(sp, mma);
    if (name.find(filter) == std::string::npos) return;
    const int               count = int(ns.size());
    std::vector<HostWeight> w;
    int64_t                 ntot = 0;
    for (int64_t n : ns) w.push_back(make_weight(s, n, k)), ntot += n;
    Buf     xb(size_t(rows * k) * 4);
    float * x = reinterpret_cast<float *>(xb.data());
    for (int64_t i = 0; i < rows * k; ++i) x[i] = x_value();
    const GemvPlan p = make_plan(s, ntot, k, 1, rows, 1, sp, mma, ns.data(), count);
    std::vector<std::unique_ptr<Buf>> yb;
    Buf pb(size_t(p.ksplit) * rows * ntot * 4), cb(size_t(p.grid.x) * 4);
    GemvArgs a;
    a.n_mats = count;
    int64_t row0 = 0;
    int32_t tile = 0;
    for (int m = 0; m < count; ++m) {
        a.w[m]         = w[size_t(m)].dw;
        a.mat_n[m]     = ns[size_t(m)];
        a.mat_row0[m]  = row0;
        a.mat_tile0[m] = tile;
        yb.push_back(std::make_unique<Buf>(size_t(rows * ns[size_t(m)]) * 4));
        a.mat_y[m] = reinterpret_cast<float *>(yb.back()->data());
        std::fill(a.mat_y[m], a.mat_y[m] + rows * ns[size_t(m)], NAN);
        row0 += ns[size_t(m)];
        tile += int32_t((ns[size_t(m)] + p.rows_per_block - 1) / p.rows_per_block);
    }
    a.mat_tile0[count] = tile;
    if (unsigned(tile) != p.grid.x) std::abort();
    for (int r = 0; r < kGemvMaxRows; ++r) a.x[r] = x + (r < rows ? r : 0) * k;
    a.n    = ntot;
    a.k    = k;
    a.rows = a.out_rows = rows;
    set_plan(a, p, s, pb, cb);
    std::vector<pdl::model::Region> regions = {pdl::model::in(xb.data(), xb.bytes), pdl::model::in(cb.data(), p.ksplit > 1 ? cb.bytes : 0),
                                               pdl::model::out(pb.data(), p.ksplit > 1 ? pb.bytes : 0)};
    for (auto & b : yb) regions.push_back(pdl::model::out(b->data(), b->bytes));
    run_plan_pdl(name, s.f, s.zeros, p, false, a, regions);
    std::vector<float>  got;
    std::vector<double> ref;
    for (int m = 0; m < count; ++m)
        for (int r = 0; r < rows; ++r)
            for (int64_t j = 0; j < ns[size_t(m)]; ++j) {
                double d = 0;
                for (int64_t kk = 0; kk < k; ++kk) d += ref_weight(w[size_t(m)], j, kk) * x[r * k + kk];
                ref.push_back(d);
                got.push_back(a.mat_y[m][r * ns[size_t(m)] + j]);
            }
    report(name, nmse(got, ref), p);
}

// The outputs of a launch over weights of ns rows (nw per weight: a fused gate/up) for `rows`
// activation rows, NaN-filled, bound into a: one weight (y) or several (mat_*, tiled as the plan).
std::vector<std::unique_ptr<Buf>> bind_outputs(GemvArgs & a, const std::vector<int64_t> & ns, const std::vector<HostWeight> & w, int nw,
                                               int rows, const GemvPlan & p) {
    const int                         count = int(ns.size());
    std::vector<std::unique_ptr<Buf>> yb;
    a.n_mats     = count;
    int64_t row0 = 0;
    int32_t tile = 0;
    for (int m = 0; m < count; ++m) {
        yb.push_back(std::make_unique<Buf>(size_t(rows * ns[size_t(m)]) * 4));
        float * y = reinterpret_cast<float *>(yb.back()->data());
        std::fill(y, y + rows * ns[size_t(m)], NAN);
        if (count > 1) {
            a.w[m]         = w[size_t(m)].dw;
            a.mat_n[m]     = ns[size_t(m)];
            a.mat_row0[m]  = row0;
            a.mat_tile0[m] = tile;
            a.mat_y[m]     = y;
        }
        row0 += ns[size_t(m)];
        tile += int32_t((ns[size_t(m)] + p.rows_per_block - 1) / p.rows_per_block);
    }
    if (count > 1) {
        a.mat_tile0[count] = tile;
    } else {
        a.w[0] = w[0].dw;
        a.w[1] = w[size_t(nw - 1)].dw;
        a.y    = reinterpret_cast<float *>(yb[0]->data());
    }
    return yb;
}

// The residual add + RMS_NORM before the matmul (GemvArgs::norm, MMA kernel): rows of a and b
// `ld` floats apart (ld > k: the gaps must stay untouched), a norm weight or none, plain or
// zero-centred; one weight, a fused gate/up (nw = 2) or several weights (ns.size() > 1). Checks the
// matmul against the double reference over the norm as the CPU backend computes it (float sum,
// mean of squares, 1 / sqrt, (s * inv) * w; the kernel scales each result by inv instead, a
// reassociation of one rounding per element, far inside the nmse bound) and the sum the blocks of
// row tile 0 write, bit for bit.
void check_norm(const Spec & s, const std::vector<int64_t> & ns, int64_t k, int rows, int nw, bool weighted, bool zc, Split sp,
                const std::string & filter) {
    if (!mma_spec(s, k)) return;
    std::string name = std::string("mma norm ") + s.name + " N=";
    for (size_t m = 0; m < ns.size(); ++m) name += (m ? "+" : "") + std::to_string(ns[m]);
    name += " K=" + std::to_string(k) + " rows=" + std::to_string(rows) + (nw == 2 ? " glu" : "") + (weighted ? zc ? " w+1" : " w" : "") +
            forced_label(sp, true);
    if (name.find(filter) == std::string::npos) return;
    const int     count = int(ns.size());
    const int64_t ld    = k + 8;
    int64_t       ntot  = 0;
    for (int64_t n : ns) ntot += n;
    std::vector<HostWeight> w;
    for (int m = 0; m < count; ++m)
        for (int i = 0; i < nw; ++i) w.push_back(make_weight(s, ns[size_t(m)], k));
    Buf     ab(size_t(rows * ld) * 4), bb(size_t(rows * ld) * 4), sb(size_t(rows * ld) * 4), wb(size_t(k) * 4);
    float * xa  = reinterpret_cast<float *>(ab.data());
    float * xb  = reinterpret_cast<float *>(bb.data());
    float * sum = reinterpret_cast<float *>(sb.data());
    float * nw_ = reinterpret_cast<float *>(wb.data());
    for (int64_t i = 0; i < rows * ld; ++i) xa[i] = uni(-2, 2), xb[i] = uni(-1, 1), sum[i] = NAN;
    for (int64_t i = 0; i < k; ++i) nw_[i] = uni(-1.5f, 1.5f);
    const float eps = 1e-6f;
    // The host's norm (the CPU backend's expressions).
    std::vector<float> hs(size_t(rows * k)), hn(size_t(rows * k));
    for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int64_t i = 0; i < k; ++i) {
            const float v = xa[r * ld + i] + xb[r * ld + i];
            hs[size_t(r * k + i)] = v;
            ss += double(v) * v;
        }
        const float inv = 1.0f / std::sqrt(float(ss) / float(k) + eps);
        for (int64_t i = 0; i < k; ++i) {
            float v = hs[size_t(r * k + i)] * inv;
            if (weighted) v *= zc ? 1.0f + nw_[i] : nw_[i];
            hn[size_t(r * k + i)] = v;
        }
    }
    const GemvPlan p = make_plan(s, ntot, k, 1, rows, nw, sp, true, count > 1 ? ns.data() : nullptr, count);
    Buf      pb(size_t(p.ksplit) * nw * rows * ntot * 4), cb(size_t(p.grid.x) * 4);
    GemvArgs a;
    const std::vector<std::unique_ptr<Buf>> yb = bind_outputs(a, ns, w, nw, rows, p);
    a.norm.a = xa, a.norm.b = xb, a.norm.sum = sum;
    a.norm.lda = a.norm.ldb = a.norm.ld_sum = ld;
    a.norm.w             = weighted ? nw_ : nullptr;
    a.norm.eps           = eps;
    a.norm.zero_centered = zc;
    a.n    = ntot;
    a.k    = k;
    a.rows = a.out_rows = rows;
    set_plan(a, p, s, pb, cb);
    std::vector<pdl::model::Region> regions = {pdl::model::in(ab.data(), ab.bytes), pdl::model::in(bb.data(), bb.bytes),
                                               pdl::model::out(sb.data(), sb.bytes),
                                               pdl::model::in(cb.data(), p.ksplit > 1 ? cb.bytes : 0),
                                               pdl::model::out(pb.data(), p.ksplit > 1 ? pb.bytes : 0)};
    for (auto & b : yb) regions.push_back(pdl::model::out(b->data(), b->bytes));
    run_plan_pdl(name, s.f, s.zeros, p, nw == 2, a, regions);
    // The sum exactly, the gaps untouched.
    bool rows_ok = true;
    for (int r = 0; r < rows; ++r)
        for (int64_t i = 0; i < ld; ++i) {
            const float gs = sum[r * ld + i];
            rows_ok        = rows_ok && (i >= k ? std::isnan(gs) : gs == hs[size_t(r * k + i)]);
        }
    std::vector<float>  got;
    std::vector<double> ref;
    for (int m = 0; m < count; ++m) {
        const float * y = reinterpret_cast<const float *>(yb[size_t(m)]->data());
        for (int r = 0; r < rows; ++r)
            for (int64_t j = 0; j < ns[size_t(m)]; ++j) {
                double d[2] = {0, 0};
                for (int i = 0; i < nw; ++i)
                    for (int64_t kk = 0; kk < k; ++kk) d[i] += ref_weight(w[size_t(m * nw + i)], j, kk) * hn[size_t(r * k + kk)];
                ref.push_back(nw == 2 ? silu_d(d[0]) * d[1] : d[0]);
                got.push_back(y[r * ns[size_t(m)] + j]);
            }
    }
    report(name + (rows_ok ? "" : " [sum rows wrong]"), rows_ok ? nmse(got, ref) : INFINITY, p);
}

// The residual ADD and the next norm's half after the matmul (GemvArgs::produce, MMA kernel, one row
// of one weight, no K split): the sums against the double reference of W x + resid (nmse), the
// weighted row bit for bit from the kernel's own sums, each block's part within 1e-5 of the squares
// of its rows' sums (a float sum in another order), y untouched.
void check_produce(const Spec & s, int64_t n, int64_t k, int wkind, Split sp, const std::string & filter) {
    if (!mma_spec(s, k)) return;
    const std::string name = std::string("mma produce ") + s.name + " N=" + std::to_string(n) + " K=" + std::to_string(k) +
                             (wkind == 0 ? "" : wkind == 1 ? " w" : " w+1") + forced_label(sp, true);
    if (name.find(filter) == std::string::npos) return;
    const HostWeight w = make_weight(s, n, k);
    Buf              xb(size_t(k) * 4), rb(size_t(n) * 4), nb(size_t(n) * 4), sb(size_t(n) * 4), zb(size_t(n) * 4), yb(size_t(n) * 4);
    float *          x = reinterpret_cast<float *>(xb.data()), * resid = reinterpret_cast<float *>(rb.data());
    float *          nw = reinterpret_cast<float *>(nb.data()), * sum = reinterpret_cast<float *>(sb.data());
    float *          z = reinterpret_cast<float *>(zb.data()), * y = reinterpret_cast<float *>(yb.data());
    for (int64_t i = 0; i < k; ++i) x[i] = x_value();
    for (int64_t i = 0; i < n; ++i) resid[i] = uni(-2, 2), nw[i] = uni(-1.5f, 1.5f), sum[i] = z[i] = y[i] = NAN;
    const GemvPlan p = make_plan(s, n, k, 1, 1, 1, sp, true);
    if (p.ksplit != 1) std::abort();  // (the cases below keep K whole)
    Buf      qb(size_t(p.grid.x) * 4), pb(4), cb(4);
    float *  parts = reinterpret_cast<float *>(qb.data());
    std::fill(parts, parts + p.grid.x, NAN);
    GemvArgs a;
    a.w[0] = a.w[1] = w.dw;
    for (int r = 0; r < kGemvMaxRows; ++r) a.x[r] = x;
    a.n = n;
    a.k = k;
    a.rows = a.out_rows = 1;
    set_plan(a, p, s, pb, cb);
    a.y                     = y;
    a.produce.resid         = resid;
    a.produce.sum           = sum;
    a.produce.z             = z;
    a.produce.w             = wkind ? nw : nullptr;
    a.produce.zero_centered = wkind == 2;
    a.produce.parts         = parts;
    run_plan_pdl(name, s.f, s.zeros, p, false, a,
                 {pdl::model::in(xb.data(), xb.bytes), pdl::model::in(rb.data(), rb.bytes), pdl::model::out(sb.data(), sb.bytes),
                  pdl::model::out(zb.data(), zb.bytes), pdl::model::out(qb.data(), qb.bytes)});
    std::vector<float>  got(sum, sum + n);
    std::vector<double> want(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
        double d = 0;
        for (int64_t kk = 0; kk < k; ++kk) d += ref_weight(w, j, kk) * x[kk];
        want[size_t(j)] = d + resid[j];
    }
    const bool ok = produced_ok(sum, z, y, parts, nw, wkind, n, p);
    report(name + (ok ? "" : " [weighted row, parts or y wrong]"), ok ? nmse(got, want) : INFINITY, p);
}

// The 1 / rms of a norm whose weighted row a producer wrote (GemvArgs::rs, MMA kernel, one row): the
// activations are z = s * w, the producer's sums of squares of s in n_parts parts (read by the GEMV
// after its wait: a PDL input); one weight or several, the plan's split and forced ones. Checks against the double reference of W (z * inv), inv from the float sum of the
// parts (the kernel sums them in another order and scales the results: a reassociation far inside
// the nmse bound; a GEMV that skipped the scale would be off by inv, here 0.3-0.5).
void check_row_scale(const Spec & s, const std::vector<int64_t> & ns, int64_t k, int nw, int n_parts, Split sp, const std::string & filter) {
    if (!mma_spec(s, k)) return;
    std::string name = std::string("mma row scale ") + s.name + " N=";
    for (size_t m = 0; m < ns.size(); ++m) name += (m ? "+" : "") + std::to_string(ns[m]);
    name += " K=" + std::to_string(k) + (nw == 2 ? " glu" : "") + " parts=" + std::to_string(n_parts) + forced_label(sp, true);
    if (name.find(filter) == std::string::npos) return;
    const int count = int(ns.size());
    int64_t   ntot  = 0;
    for (int64_t n : ns) ntot += n;
    std::vector<HostWeight> w;
    for (int m = 0; m < count; ++m)
        for (int i = 0; i < nw; ++i) w.push_back(make_weight(s, ns[size_t(m)], k));
    Buf     zb(size_t(k) * 4), qb(size_t((n_parts + 3) / 4 * 4) * 4);  // (read in 16-byte copies)
    float * z     = reinterpret_cast<float *>(zb.data());
    float * parts = reinterpret_cast<float *>(qb.data());
    std::fill(parts, parts + n_parts, 0.0f);
    for (int64_t i = 0; i < k; ++i) {
        const float sv = uni(-2, 2), wv = uni(-1.5f, 1.5f);
        z[i] = sv * wv;
        parts[i * n_parts / k] += sv * sv;
    }
    const float eps = 1e-6f;
    float       ss  = 0.0f;
    for (int i = 0; i < n_parts; ++i) ss += parts[i];
    const double   inv = 1.0 / std::sqrt(double(ss) / double(k) + eps);
    const GemvPlan p   = make_plan(s, ntot, k, 1, 1, nw, sp, true, count > 1 ? ns.data() : nullptr, count);
    Buf      pb(size_t(p.ksplit) * nw * ntot * 4), cb(size_t(p.grid.x) * 4);
    GemvArgs a;
    const std::vector<std::unique_ptr<Buf>> yb = bind_outputs(a, ns, w, nw, 1, p);
    for (int r = 0; r < kGemvMaxRows; ++r) a.x[r] = z;
    a.rs.parts   = parts;
    a.rs.n_parts = n_parts;
    a.rs.eps     = eps;
    a.n          = ntot;
    a.k          = k;
    a.rows = a.out_rows = 1;
    set_plan(a, p, s, pb, cb);
    std::vector<pdl::model::Region> regions = {pdl::model::in(zb.data(), zb.bytes), pdl::model::in(qb.data(), qb.bytes),
                                               pdl::model::in(cb.data(), p.ksplit > 1 ? cb.bytes : 0),
                                               pdl::model::out(pb.data(), p.ksplit > 1 ? pb.bytes : 0)};
    for (auto & b : yb) regions.push_back(pdl::model::out(b->data(), b->bytes));
    run_plan_pdl(name, s.f, s.zeros, p, nw == 2, a, regions);
    std::vector<float>  got;
    std::vector<double> ref;
    for (int m = 0; m < count; ++m) {
        const float * y = reinterpret_cast<const float *>(yb[size_t(m)]->data());
        for (int64_t j = 0; j < ns[size_t(m)]; ++j) {
            double d[2] = {0, 0};
            for (int i = 0; i < nw; ++i)
                for (int64_t kk = 0; kk < k; ++kk) d[i] += ref_weight(w[size_t(m * nw + i)], j, kk) * (double(z[kk]) * inv);
            ref.push_back(nw == 2 ? silu_d(d[0]) * d[1] : d[0]);
            got.push_back(y[j]);
        }
    }
    report(name, nmse(got, ref), p);
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc > 1 && std::string(argv[1]) == "--plans") {
        // The plans for the model shapes of the lab (132 SMs, 227 KB of shared memory per block).
        struct Sh {
            const char * name;
            int64_t      n, k, jobs;
            int          nw;
        };
        const Sh shapes[] = {{"8B gate+up N=12288 K=4096", 12288, 4096, 1, 2}, {"8B q/o N=4096 K=4096", 4096, 4096, 1, 1},
                             {"8B down N=4096 K=12288", 4096, 12288, 1, 1},   {"8B k/v N=1024 K=4096", 1024, 4096, 1, 1},
                             {"30B k/v N=512 K=2048", 512, 2048, 1, 1},       {"30B q N=4096 K=2048", 4096, 2048, 1, 1},
                             {"30B o N=2048 K=4096", 2048, 4096, 1, 1},       {"30B moe gate+up 8x768 K=2048", 768, 2048, 8, 2},
                             {"30B moe down 8x2048 K=768", 2048, 768, 8, 1}};
        for (const WeightFormat f : {WeightFormat::INT4, WeightFormat::NVFP4})
            for (const int rows : {1, 2, 4, 8})
                for (const Sh & sh : shapes) {
                    if (rows > 1 && sh.jobs > 1) continue;
                    for (const bool mma : {false, true}) {
                        GemvOpts o;
                        o.mma        = mma;
                        o.smem_optin = 227 * 1024;
                        const GemvPlan p = plan_gemv(f, sh.n, sh.k, sh.jobs, rows, sh.nw, 132, o);
                        std::printf("%-6s rows=%d %-30s %s%s wk=%d lpr=%2d ks=%2d cps=%4lld rows/block=%3d smem=%6d grid=%ux%ux%u\n",
                                    f == WeightFormat::INT4 ? "int4" : "nvfp4", rows, sh.name, mma ? "mma" : "fma", p.mma_kpair ? "-kp" : p.mma_wave ? "-wv" : "   ", p.wk, p.lpr, p.ksplit,
                                    (long long) p.cps, p.rows_per_block, p.smem, p.grid.x, p.grid.y, p.grid.z);
                    }
                }
        const int64_t qkv[3] = {4096, 1024, 1024};
        for (const bool mma : {false, true}) {
            GemvOpts o;
            o.mma        = mma;
            o.smem_optin = 227 * 1024;
            o.n_mats     = 3;
            o.mat_n      = qkv;
            const GemvPlan p = plan_gemv(WeightFormat::INT4, 6144, 4096, 1, 1, 1, 132, o);
            std::printf("int4   rows=1 8B q+k+v multi (4096+1024+1024) %s%s wk=%d lpr=%2d ks=%2d cps=%4lld rows/block=%3d smem=%6d grid=%ux%ux%u\n",
                        mma ? "mma" : "fma", p.mma_kpair ? "-kp" : "   ", p.wk, p.lpr, p.ksplit, (long long) p.cps, p.rows_per_block, p.smem, p.grid.x, p.grid.y, p.grid.z);
        }
        return 0;
    }
    const std::string filter = argc > 1 ? argv[1] : "";
    if (argc > 2) rng.seed(std::stoull(argv[2]));
    if (argc > 3 && std::string(argv[3]) == "exact-mma") emu::mma_sum() = emu::MmaSum::Exact;
    const Spec specs[] = {
        {WeightFormat::INT4, 128, false, false, 0, 0, "int4-sym-g128"},
        {WeightFormat::INT4, 128, true, true, 0, 0, "int4-asym-g128-bf16s"},
        {WeightFormat::INT4, 32, true, false, 0, 0, "int4-asym-g32"},
        {WeightFormat::INT4, 96, false, true, 0, 0, "int4-sym-g96"},
        {WeightFormat::INT4, -1, true, false, 0, 0, "int4-asym-channel"},
        {WeightFormat::NVFP4, 0, false, false, 0, 0, "nvfp4"},
        {WeightFormat::FP8, 0, false, false, 128, 128, "fp8-b128"},
        {WeightFormat::FP8, 0, false, false, 3, 48, "fp8-b3x48"},
        {WeightFormat::FP8, 0, false, false, 1, 1 << 20, "fp8-channel"},
        {WeightFormat::BF16, 0, false, false, 0, 0, "bf16"},
        {WeightFormat::F16, 0, false, false, 0, 0, "f16"},
        {WeightFormat::F32, 0, false, false, 0, 0, "f32"},
    };
    // Every format, rows 1..8, plain and fused, the plan's split; K = 576 (INT4: 18 chunks, not a
    // multiple of any lane count; g96: 6 groups), N = 45 (partial row tiles).
    for (const Spec & s : specs)
        for (const int rows : {1, 2, 3, 5, 8})
            for (const int nw : {1, 2}) check_dense(s, 45, s.group == 96 ? 576 : 576, rows, nw, {}, filter);
    // Every work split on a few formats (lanes per row x K-warps x K splits, partial steps).
    for (const Spec & s : {specs[0], specs[1], specs[5], specs[7], specs[9]})
        for (const int lpr : {32, 16, 8})
            for (const int wk : {1, 2, 4, 8})
                for (const int ks : {1, 3})
                    for (const int nw : {1, 2}) check_dense(s, 32, 1280, nw == 1 ? 1 : 2, nw, {lpr, wk, ks}, filter);
    // Model-like shapes at the plan's split (K as the models; N cut to keep the emulation short).
    // INT4 of N % 16 == 0 and K % 128 == 0 is tile-major (device_weight.h), other shapes row-major:
    // the cases here and below have both.
    check_dense(specs[0], 80, 4096, 1, 2, {}, filter);
    check_dense(specs[0], 70, 12288, 1, 1, {}, filter);
    check_dense(specs[0], 3, 2048, 1, 1, {}, filter);   // N < rows per group
    check_dense(specs[5], 70, 4096, 2, 2, {}, filter);
    check_dense(specs[6], 70, 4096, 1, 1, {}, filter);
    check_dense(specs[9], 128, 2048, 1, 1, {}, filter);  // router
    {
        Overrides & o = overrides();
        o.gemv_ksplit = 4;  // the forced split the tests use
        check_dense(specs[0], 100, 2048, 5, 1, {}, filter);
        check_dense(specs[9], 100, 2048, 2, 2, {}, filter);
        o.gemv_ksplit = 0;
    }
    // MATMUL_ID: Qwen3-30B-A3B gate/up (K 2048, expert width 768 cut to 40 rows) and down (K 768),
    // several tokens, strided ids with invalid entries, shared and per-slot inputs.
    for (const Spec & s : {specs[0], specs[1], specs[5], specs[6], specs[9]}) {
        check_moe(s, 48, 2048, 16, 8, 1, 2, true, {}, filter);
        check_moe(s, 40, 768, 16, 8, 2, 1, false, {}, filter);
        check_moe(s, 33, 768, 16, 4, 3, 2, false, {8, 1, 2}, filter);
        check_moe(s, 33, 1024, 16, 4, 2, 1, true, {32, 2, 3}, filter);
    }
    // The down projection's expert GEMV reading its ids before its wait (both kernels; 8 slots x 1
    // token and 4 x 3, the plan's split and a forced K split).
    for (const Spec & s : {specs[0], specs[5], specs[6], specs[9]})
        for (const bool mma : {false, true}) {
            check_moe(s, 40, 768, 16, 8, 1, 1, false, {}, filter, mma, Early::ids);
            check_moe(s, 33, 1024, 16, 4, 3, 1, true, {mma ? 1 : 32, 2, 3}, filter, mma, Early::ids);
        }
    // Expert parallelism: pairs routed to experts this rank does not hold (absent table entries) come
    // out 0 without a weight read; both kernels, fused gate/up, a K split, ids read early.
    for (const Spec & s : {specs[0], specs[5], specs[6], specs[9]})
        for (const bool mma : {false, true}) {
            check_moe(s, 40, 2048, 16, 8, 1, 2, true, {}, filter, mma, Early::none, Absent::first_half);
            check_moe(s, 40, 768, 16, 8, 2, 1, false, {}, filter, mma, Early::ids, Absent::odd);
            check_moe(s, 33, 1024, 16, 4, 3, 1, true, {mma ? 1 : 32, 2, 3}, filter, mma, Early::none, Absent::first_half);
        }
    // Multi-weight launches (q/k/v-like: rows of several weights in one grid), both kernels.
    for (const bool mma : {false, true}) {
        for (const Spec & s : {specs[0], specs[1], specs[5], specs[9]}) {
            check_multi(s, {70, 20, 20}, 1280, 1, {}, filter, mma);
            check_multi(s, {45, 3}, 576, 3, {}, filter, mma);
            check_multi(s, {48, 20}, 1280, 1, {}, filter, mma);  // INT4: one tile-major weight, one row-major
        }
        check_multi(specs[0], {40, 17, 9, 33}, 1280, 2, {8, 2, 3}, filter, mma);
        check_multi(specs[5], {40, 17}, 1280, 1, {8, 1, 4}, filter, mma);
        if (mma) check_multi(specs[1], {40, 17, 20}, 1152, 1, {1, 2, 2, 1}, filter, mma);
    }

    // The tensor-core decode (gemv_mma_kernels.cuh): INT4 (groups of 128 and 256, one group, zero points, bf16
    // scales) and NVFP4; rows 1..8, plain and fused; K = 1280 (10 blocks of 128) and K = 576 (a half
    // last block); every work split; activations of a wide range (per-block scaling).
    const Spec mma_specs[] = {specs[0], specs[1], specs[4], specs[5], {WeightFormat::INT4, 256, false, false, 0, 0, "int4-sym-g256"}};
    for (const Spec & s : mma_specs)
        for (const int rows : {1, 2, 3, 5, 8})
            for (const int nw : {1, 2}) {
                check_dense(s, 45, 1280, rows, nw, {}, filter, true);
                if (rows <= 2) check_dense(s, 45, 576, rows, nw, {}, filter, true);
            }
    for (const Spec & s : {specs[0], specs[1], specs[5]})
        for (const int wk : {1, 2, 4, 8})
            for (const int ks : {1, 3})
                for (const int nw : {1, 2}) {
                    const int64_t n = wk == 1 ? 21 : 32;  // INT4 row-major, tile-major
                    check_dense(s, n, 1280, nw == 1 ? 1 : 2, nw, {1, wk, ks}, filter, true);
                    if (nw == 1) check_dense(s, n, nw == 1 && ks == 3 ? 1152 : 1280, 1, 1, {1, wk, ks, 1}, filter, true);  // kp; 9 blocks: odd ranges
                }
    // The one-wave variant (one step in flight, 3 blocks per SM) of the gate/up and of a single
    // weight at every K-warp count, K of whole and half last blocks, with and without a K split (the
    // planner never splits it; the kernel may).
    for (const Spec & s : {specs[0], specs[1], specs[5], specs[4]})
        for (const int wk : {1, 2, 4, 8}) {
            check_dense(s, 32, 1280, 1, 2, {1, wk, 1, 0, 1}, filter, true);
            check_dense(s, 37, 576, 1, 2, {1, wk, wk == 2 ? 2 : 1, 0, 1}, filter, true);
            check_dense(s, 32, 1280, 1, 1, {1, wk, 1, 0, 1}, filter, true);  // a single weight (the experts' down)
            check_dense(s, 37, 576, 1, 1, {1, wk, wk == 2 ? 2 : 1, 0, 1}, filter, true);
        }
    check_dense(specs[0], 80, 4096, 1, 2, {}, filter, true);
    check_dense(specs[0], 70, 12288, 1, 1, {}, filter, true);
    check_dense(specs[0], 3, 2048, 1, 1, {}, filter, true);
    check_dense(specs[5], 70, 4096, 2, 2, {}, filter, true);
    check_dense(specs[1], 40, 4096, 8, 1, {}, filter, true);
    g_wide_x = true;
    for (const Spec & s : {specs[0], specs[5]})
        for (const int rows : {1, 4}) check_dense(s, 40, 1280, rows, 1, {}, filter, true);
    check_dense(specs[0], 40, 1280, 1, 1, {}, filter, false);
    g_wide_x = false;
    for (const Spec & s : {specs[0], specs[1], specs[5]}) {
        check_moe(s, 48, 2048, 16, 8, 1, 2, true, {}, filter, true);
        check_moe(s, 48, 768, 16, 8, 2, 1, false, {}, filter, true);
        check_moe(s, 33, 768, 16, 4, 3, 2, false, {1, 1, 2}, filter, true);
        check_moe(s, 33, 1024, 16, 4, 2, 1, true, {1, 2, 3}, filter, true);
        check_moe(s, 33, 1152, 16, 4, 2, 1, true, {1, 2, 2, 1}, filter, true);
        check_moe(s, 48, 768, 16, 8, 1, 1, false, {1, 4, 1, 0, 1}, filter, true);  // the experts' down, one wave
    }
    // The experts' gate/up converting its activations before its wait (GemvArgs::x_early: written
    // before the router GEMV, which triggers after its wait): the plan's kernel (INT4: each warp's split), the
    // one-wave variant, kp, a K split the planner would not take with it, invalid and absent experts.
    for (const Spec & s : {specs[0], specs[1], specs[5]}) {
        check_moe(s, 48, 2048, 16, 8, 1, 2, true, {}, filter, true, Early::x);
        check_moe(s, 33, 1024, 16, 4, 3, 2, true, {1, 2, 1}, filter, true, Early::x);
        check_moe(s, 32, 1280, 16, 8, 1, 2, true, {1, 2, 1, 0, 1}, filter, true, Early::x);  // one wave
        check_moe(s, 40, 1152, 16, 4, 2, 1, false, {1, 2, 2, 1}, filter, true, Early::x);   // kp, odd block ranges, K split
        check_moe(s, 40, 2048, 16, 8, 1, 2, true, {}, filter, true, Early::x, Absent::odd);
    }
    // The experts' down projection with the combine (a K-warp per slot): INT4 with and without zero
    // points, the plan's two row forms (kp: an odd block range too), two tokens, invalid and absent
    // experts, ids before the wait, wide activations.
    for (const Spec & s : {specs[0], specs[1]}) {
        check_experts_combine(s, 48, 768, 16, 1, false, filter);
        check_experts_combine(s, 40, 768, 16, 2, true, filter);
        check_experts_combine(s, 33, 640, 16, 1, true, filter, Early::ids);
        check_experts_combine(s, 64, 1536, 16, 1, false, filter, Early::none, Absent::odd);
        check_experts_combine(s, 48, 768, 16, 1, true, filter, Early::ids, Absent::none, true);
        check_experts_combine(s, 72, 1536, 16, 1, false, filter, Early::none, Absent::odd, true);
        g_wide_x = true;
        check_experts_combine(s, 32, 1024, 16, 1, true, filter);
        g_wide_x = false;
    }
    // Experts at one stride (expert_grid): the addresses from the id; the FMA and MMA kernels, ids
    // read after and before the wait, activations early, invalid ids.
    g_packed = true;
    for (const Spec & s : {specs[0], specs[1], specs[5]}) {
        check_moe(s, 48, 2048, 16, 8, 1, 2, true, {}, filter, true);
        check_moe(s, 33, 768, 16, 4, 3, 1, false, {}, filter, true, Early::ids);
        check_moe(s, 32, 1280, 16, 8, 1, 2, true, {1, 2, 1, 0, 1}, filter, true, Early::x);  // one wave
        check_moe(s, 33, 1024, 16, 4, 2, 1, true, {}, filter, false);  // the FMA kernel
        check_experts_combine(s, 48, 768, 16, 2, true, filter, Early::ids);
    }
    for (const Spec & s : {specs[6], specs[9]}) check_moe(s, 40, 1024, 16, 4, 2, 2, false, {}, filter);
    g_packed = false;
    g_packs.clear();
    // The residual add + RMS_NORM prologue (one row of plain weights): the plan's split and forced ones
    // (K-warps, K splits, kp with odd block ranges), with and without a weight, plain and zero-centred,
    // one weight and several, INT4 with and without zero points, NVFP4.
    for (const Spec & s : {specs[0], specs[1], specs[5]}) {
        check_norm(s, {45}, 1280, 1, 1, true, false, {}, filter);
        check_norm(s, {40, 17, 9}, 1280, 1, 1, true, true, {}, filter);
        check_norm(s, {40, 17}, 2048, 1, 1, false, false, {}, filter);
        check_norm(s, {32}, 1280, 1, 1, true, true, {1, 4, 3}, filter);
        check_norm(s, {32, 16}, 1280, 1, 1, true, false, {1, 8, 2}, filter);
        check_norm(s, {32}, 1152, 1, 1, true, false, {1, 2, 3, 1}, filter);  // kp, odd block ranges
    }
    // The 1 / rms of a producer's norm (op_combine_norm_matmul): several weights (q/k/v) as planned and
    // with K-warps, K splits and kp forced; one weight.
    for (const Spec & s : {specs[0], specs[1], specs[5]}) {
        check_row_scale(s, {64, 32, 32}, 2048, 1, 4, {}, filter);
        check_row_scale(s, {40, 17}, 1280, 1, 3, {1, 4, 3}, filter);
        check_row_scale(s, {45}, 1152, 1, 6, {1, 2, 3, 1}, filter);  // kp, odd block ranges
        check_row_scale(s, {48}, 3072, 1, 64, {}, filter);
        check_row_scale(s, {40, 24}, 2048, 1, 203, {}, filter);  // the parts of a GEMV producer's blocks, not a multiple of 4
    }
    // The residual ADD + the next norm's half in a GEMV's epilogue (an o / down projection before a
    // norm): as planned and with K-warps and kp forced, with and without the norm's weight.
    for (const Spec & s : {specs[0], specs[1], specs[5]}) {
        check_produce(s, 300, 2048, 1, {}, filter);
        check_produce(s, 130, 1280, 2, {1, 4, 1}, filter);
        check_produce(s, 72, 1152, 0, {1, 2, 1, 1}, filter);  // kp
    }
    std::printf("worst MMA nmse %.1e (tensor-core sums modelled %s)\n", g_worst_mma,
                emu::mma_sum() == emu::MmaSum::Truncating ? "with truncation to 2^(e_max - 23)" : "exactly");
    std::printf("%d of %d cases failed; %d PDL launch checks, %d failed\n", g_fail, g_cases, pdl::model::checks(), pdl::model::failures());
    return g_fail || pdl::model::failures() ? 1 : 0;
}
