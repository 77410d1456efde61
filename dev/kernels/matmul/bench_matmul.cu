// Kernel lab for src/backends/cuda/matmul: validates and times the decode GEMV and the MoE decode
// launches at the shapes of one decode step of Qwen3-8B and Qwen3-30B-A3B (the table of the perf
// brief), in INT4 g128, NVFP4, FP8 (128x128 blocks) and BF16, then the prefill GEMM (TFLOP/s). Every
// launch is planned exactly as the dispatch plans it (plan.cpp; split-K counters zeroed on the stream
// as matmul.cpp does). Weights are random bytes in the device layout, in enough copies (experts: 128
// per projection, 16 routing sets) that every launch streams from DRAM; the reference is a double
// dot product over the formats.h decoders for a sample of output rows.
//
// Per shape and format: the plan (lanes per row / K-warps / K splits, grid), the time per launch
//   graph us  back-to-back launches replayed from a CUDA graph (a decode step's graph; with PDL the
//             next launch requests its first weights while the previous one finishes);
//   event us  one launch between two events, averaged (as SPARK_PROFILE_OPS measures ops, so it
//             includes the ~1.4 us event overhead; compare with the "brief" column: the INT4 / BF16
//             numbers measured in a model step before this kernel);
// the bytes moved (weights + scales), GB/s and % of the measured copy bandwidth (both from graph us),
// ideal us = bytes / copy bandwidth, and the nmse against the reference.
//
// Build and run from the repository root (one line; -arch as the GPU: sm_90a H100, sm_120a RTX 50xx):
//   nvcc -O3 -std=c++20 --expt-relaxed-constexpr -arch=sm_90a -Isrc -Iinclude dev/kernels/matmul/bench_matmul.cu src/backends/cuda/matmul/gemv_*.cu src/backends/cuda/matmul/gemm_*.cu src/backends/cuda/matmul/side_kernels.cu src/backends/cuda/matmul/plan.cpp src/backends/cuda/common/launch.cpp -o /tmp/bench_matmul && /tmp/bench_matmul
// Options: --sweep (every plan of the large 8B INT4 shapes and the 30B-A3B / MiniMax-M2 attention projections, timed), --sweep-rows R (the same at R
// activation rows), --moe-sweep (every MMA plan of the 30B-A3B and MiniMax-M2 expert GEMVs, INT4 and
// NVFP4), --gemm-sweep (the prefill GEMM's K splits), --quick (INT4 only, no GEMM), --no-gemm, --rows (also 2, 4, 8 activation rows), --no-pdl
// (GEMV launches without programmatic dependent launch; the dispatch's default is with, on sm_90+),
// --mma-only / --fma-only (INT4 and NVFP4 through one decode kernel only; default: both, the plan
// column says which: "mma[kp] wk/ks grid" for the tensor-core decode of gemv_mma_kernels.cuh). After the
// per-shape table: q+k+v in one multi-weight launch (op_matmul_multi) against three launches.
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/matmul/matmul.h"
#include "backends/cuda/matmul/op_plan.h"
#include "backends/cuda/matmul/tuning.h"
#include "quant/formats.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace spark::cuda {
void throw_cuda_error(cudaError_t err, const char * call, const char * file, int line) {
    std::fprintf(stderr, "CUDA error %s in %s at %s:%d\n", cudaGetErrorString(err), call, file, line);
    std::exit(1);
}
}  // namespace spark::cuda

using namespace spark;
using namespace spark::cuda;
using namespace spark::cuda::mm;

#define CK(x) SPARK_CUDA_CHECK(x)

namespace {

struct HostWeight {
    WeightFormat         f;
    int64_t              n, k;
    std::vector<uint8_t> data, scales;
    float                global = 1.0f;
    int32_t              gs = 128, groups = 1, bn = 128, bk = 128;
    size_t               bytes() const { return data.size() + scales.size(); }
};

std::mt19937_64 rng(42);
float           uni(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }

HostWeight make_weight(WeightFormat f, int64_t n, int64_t k) {
    HostWeight w{f, n, k, {}, {}};
    std::uniform_int_distribution<int> byte(0, 255);
    switch (f) {
        case WeightFormat::BF16:
        case WeightFormat::F16: {
            w.data.resize(size_t(n * k) * 2);
            auto * h = reinterpret_cast<uint16_t *>(w.data.data());
            for (int64_t i = 0; i < n * k; ++i) h[i] = f == WeightFormat::BF16 ? f32_to_bf16(uni(-0.1f, 0.1f)) : f32_to_f16(uni(-0.1f, 0.1f));
            break;
        }
        case WeightFormat::F32: {
            w.data.resize(size_t(n * k) * 4);
            auto * p = reinterpret_cast<float *>(w.data.data());
            for (int64_t i = 0; i < n * k; ++i) p[i] = uni(-0.1f, 0.1f);
            break;
        }
        case WeightFormat::NVFP4:
            w.data.resize(size_t(n * k / 2));
            for (auto & b : w.data) b = uint8_t(byte(rng));
            w.scales.resize(size_t(n * k / 16));
            for (auto & s : w.scales) s = f32_to_e4m3(uni(0.25f, 4.0f));
            w.global = 0.01f;
            break;
        case WeightFormat::INT4: {
            w.groups = int32_t((k + w.gs - 1) / w.gs);
            w.data.resize(size_t(n * k / 2));  // device layout [N][K/8] words
            for (auto & b : w.data) b = uint8_t(byte(rng));
            w.scales.resize(size_t(n * w.groups) * 2);  // [N][G] f16
            auto * s = reinterpret_cast<uint16_t *>(w.scales.data());
            for (int64_t i = 0; i < n * w.groups; ++i) s[i] = f32_to_f16(uni(0.005f, 0.02f));
            break;
        }
        case WeightFormat::FP8: {
            w.data.resize(size_t(n * k));
            for (auto & b : w.data) {
                b = uint8_t(byte(rng));
                if ((b & 0x7F) == 0x7F) b = 0x7E;  // no NaN
            }
            const int64_t sn = (n + w.bn - 1) / w.bn, sk = (k + w.bk - 1) / w.bk;
            w.scales.resize(size_t(sn * sk) * 4);
            auto * s = reinterpret_cast<float *>(w.scales.data());
            for (int64_t i = 0; i < sn * sk; ++i) s[i] = uni(0.0005f, 0.002f);
            break;
        }
    }
    return w;
}

double ref_weight(const HostWeight & w, int64_t n, int64_t k) {
    switch (w.f) {
        case WeightFormat::F32: return reinterpret_cast<const float *>(w.data.data())[n * w.k + k];
        case WeightFormat::F16: return f16_to_f32(reinterpret_cast<const uint16_t *>(w.data.data())[n * w.k + k]);
        case WeightFormat::BF16: return bf16_to_f32(reinterpret_cast<const uint16_t *>(w.data.data())[n * w.k + k]);
        case WeightFormat::NVFP4: {
            const uint8_t b = w.data[size_t(n * (w.k / 2) + k / 2)];
            return double(e2m1_to_f32(uint8_t(k & 1 ? b >> 4 : b & 15))) * double(e4m3_to_f32(w.scales[size_t(n * (w.k / 16) + k / 16)]) * w.global);
        }
        case WeightFormat::INT4: {
            const uint32_t word = reinterpret_cast<const uint32_t *>(w.data.data())[n * (w.k / 8) + k / 8];
            const double   s    = f16_to_f32(reinterpret_cast<const uint16_t *>(w.scales.data())[n * w.groups + k / w.gs]);
            return s * (double(int4_get(word, int(k % 8))) - 8.0);
        }
        case WeightFormat::FP8: {
            const int64_t sk = (w.k + w.bk - 1) / w.bk;
            return double(e4m3_to_f32(w.data[size_t(n * w.k + k)])) * reinterpret_cast<const float *>(w.scales.data())[(n / w.bn) * sk + k / w.bk];
        }
    }
    return 0;
}

template <class T> T * dev_copy(const std::vector<T> & v) {
    T * p = nullptr;
    CK(cudaMalloc(&p, std::max<size_t>(1, v.size() * sizeof(T))));
    if (!v.empty()) CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}

DeviceWeight upload(const HostWeight & h) {
    DeviceWeight d;
    d.format       = h.f;
    d.n            = h.n;
    d.k            = h.k;
    d.group_size   = h.gs;
    d.n_groups     = h.groups;
    d.block_n      = h.bn;
    d.block_k      = h.bk;
    d.global_scale = h.global;
    d.scale_type   = ScaleType::F16;
    d.data         = dev_copy(h.data);
    d.scales       = h.scales.empty() ? nullptr : dev_copy(h.scales);
    return d;
}
void release(DeviceWeight & d) {
    cudaFree(const_cast<void *>(d.data));
    if (d.scales) cudaFree(const_cast<void *>(d.scales));
}

const char * fname(WeightFormat f) {
    switch (f) {
        case WeightFormat::F32: return "f32";
        case WeightFormat::F16: return "f16";
        case WeightFormat::BF16: return "bf16";
        case WeightFormat::NVFP4: return "nvfp4";
        case WeightFormat::INT4: return "int4-g128";
        case WeightFormat::FP8: return "fp8-b128";
    }
    return "?";
}

void gemm_launch_any(WeightFormat f, int mt, bool glu, const GemmArgs & a, dim3 g) {
    switch (f) {
        case WeightFormat::F32: gemm_launch_f32(mt, glu, a, g, 0); break;
        case WeightFormat::F16: gemm_launch_f16(mt, glu, a, g, 0); break;
        case WeightFormat::BF16: gemm_launch_bf16(mt, glu, a, g, 0); break;
        case WeightFormat::NVFP4: gemm_launch_nvfp4(mt, glu, a, g, 0); break;
        case WeightFormat::INT4: gemm_launch_int4(mt, glu, a, g, 0); break;
        case WeightFormat::FP8: gemm_launch_fp8(mt, glu, a, g, 0); break;
    }
    CK(cudaGetLastError());
}

int    g_sms = 0;
double g_copy_bw = 0;  // (bytes read + written) / s of a device-to-device copy

double measure_copy_bw() {
    const size_t bytes = size_t(1) << 30;
    void *       a = nullptr, *b = nullptr;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    cudaEventRecord(e0);
    for (int i = 0; i < 5; ++i) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * double(bytes) * 5 / (ms * 1e-3);  // read + write, as perf-anchors.md counts it
}

// Relative error of y (device result, rows x n) against the double reference on sampled rows.
double check(const HostWeight & w, const std::vector<float> & x, int rows, const std::vector<float> & y, bool bf16_x) {
    double num = 0, den = 0;
    for (int s = 0; s < 48; ++s) {
        const int64_t n = s < 16 ? s : s < 32 ? w.n - 1 - (s - 16) : int64_t((s * 2654435761ull) % uint64_t(w.n));
        if (n < 0 || n >= w.n) continue;
        for (int r = 0; r < rows; ++r) {
            double ref = 0;
            for (int64_t k = 0; k < w.k; ++k) {
                const float xv = bf16_x ? bf16_to_f32(f32_to_bf16(x[size_t(r * w.k + k)])) : x[size_t(r * w.k + k)];
                ref += ref_weight(w, n, k) * xv;
            }
            const double d = y[size_t(r * w.n + n)] - ref;
            num += d * d;
            den += ref * ref;
        }
    }
    return den > 0 ? num / den : num;
}

// ---- GEMV and MoE decode ------------------------------------------------------------------------

bool g_pdl = false;  // programmatic dependent launch, as the dispatch (sm_90+, unless --no-pdl)

// One planned GEMV launch, as matmul.cpp issues it (split-K: counters zeroed on the stream first).
struct PlannedGemv {
    WeightFormat f{};
    bool         glu = false;
    GemvPlan     p;
    uint32_t *   counters = nullptr;
    void         launch(GemvArgs a, cudaStream_t s) const {
        a.pdl = g_pdl;
        if (p.ksplit > 1) {
            CK(cudaMemsetAsync(counters, 0, size_t(p.counters()) * 4, s));
            a.counters = counters;
        }
        gemv_launch_planned(f, p, glu, a, s);
        CK(cudaGetLastError());
    }
};

int                      g_smem_optin = 48 * 1024;
spark::cuda::DeviceProps g_rates;  // the device's bandwidth and issue rates, as the dispatch derives them
// The dispatch's GEMV options: mma = the tensor-core decode where the format takes it (the lab's INT4
// weights have groups of 128), and the device's rates (op_plan.cpp), so that "(planner)" rows are
// the plans a model step gets on this GPU.
GemvOpts lab_opts(WeightFormat f, bool mma, int n_mats = 1, const int64_t * mat_n = nullptr) {
    GemvOpts o;
    o.mma             = mma && (f == WeightFormat::INT4 || f == WeightFormat::NVFP4);
    o.smem_optin      = g_smem_optin;
    o.bw_per_us       = g_rates.bw_bytes_per_us;
    o.issue_per_sm_us = g_rates.issue_per_sm_us;
    o.n_mats          = n_mats;
    o.mat_n           = mat_n;
    return o;
}

// Split-K scratch for a plan (partial floats for out_rows rows of n, counters).
struct SplitScratch {
    float *    partial  = nullptr;
    uint32_t * counters = nullptr;
    SplitScratch(const GemvPlan & p, int nw, int64_t out_rows, int64_t n) {
        if (p.ksplit <= 1) return;
        CK(cudaMalloc(&partial, size_t(p.ksplit) * nw * size_t(out_rows * n) * 4));
        CK(cudaMalloc(&counters, size_t(p.counters()) * 4));
    }
    ~SplitScratch() {
        cudaFree(partial);
        cudaFree(counters);
    }
};

struct Timing {
    double graph_us = 0, event_us = 0;
};

// launch(i, s) enqueues launch i (rotating over weight copies / routing sets). graph: `per_graph`
// launches captured once, replayed; events: one launch between two events, `n_ev` times.
Timing time_launches(const std::function<void(int, cudaStream_t)> & launch, int per_graph, cudaStream_t s) {
    Timing t;
    for (int i = 0; i < 3; ++i) launch(i, s);
    CK(cudaStreamSynchronize(s));
    cudaGraph_t     graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < per_graph; ++i) launch(i, s);
    CK(cudaStreamEndCapture(s, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int reps = 5;
    CK(cudaEventRecord(e0, s));
    for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(exec, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.graph_us = ms * 1e3 / (reps * per_graph);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    const int                n_ev = std::min(per_graph, 200);
    std::vector<cudaEvent_t> b(static_cast<size_t>(n_ev)), e(static_cast<size_t>(n_ev));
    for (int i = 0; i < n_ev; ++i) {
        CK(cudaEventCreate(&b[size_t(i)]));
        CK(cudaEventCreate(&e[size_t(i)]));
    }
    for (int i = 0; i < n_ev; ++i) {
        CK(cudaEventRecord(b[size_t(i)], s));
        launch(i, s);
        CK(cudaEventRecord(e[size_t(i)], s));
    }
    CK(cudaStreamSynchronize(s));
    double sum = 0;
    for (int i = 0; i < n_ev; ++i) {
        CK(cudaEventElapsedTime(&ms, b[size_t(i)], e[size_t(i)]));
        sum += ms * 1e3;
        cudaEventDestroy(b[size_t(i)]);
        cudaEventDestroy(e[size_t(i)]);
    }
    t.event_us = sum / n_ev;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return t;
}

int per_graph_for(double bytes) {
    const double est_us = bytes / 2.5e6 + 3.0;  // 2.5 TB/s + launch
    return int(std::clamp(4000.0 / est_us, 10.0, 400.0));
}

cudaStream_t g_stream = nullptr;

void print_header() {
    std::printf("\n%-44s %-10s %-22s %9s %9s %9s %9s %8s %7s %6s  %s\n", "shape", "format", "plan lpr/wk/ks|mma wk/ks", "graph us", "event us",
                "brief us", "ideal us", "MB", "GB/s", "%copy", "nmse");
}

void print_row(const std::string & shape, WeightFormat f, const GemvPlan & p, const Timing & t, double brief_us, double bytes, double err) {
    char plan[64], brief[16];
    if (p.grid.x == 0)
        std::snprintf(plan, sizeof plan, "-");
    else if (p.mma)
        std::snprintf(plan, sizeof plan, "mma%s %d/%d %ux%ux%u", p.mma_kpair ? "kp" : "", p.wk, p.ksplit, p.grid.x, p.grid.y, p.grid.z);
    else
        std::snprintf(plan, sizeof plan, "%d/%d/%d %ux%ux%u", p.lpr, p.wk, p.ksplit, p.grid.x, p.grid.y, p.grid.z);
    if (brief_us > 0)
        std::snprintf(brief, sizeof brief, "%9.1f", brief_us);
    else
        std::snprintf(brief, sizeof brief, "%9s", "-");
    const double gbs = bytes / (t.graph_us * 1e-6) / 1e9;
    std::printf("%-44s %-10s %-22s %9.2f %9.2f %s %9.2f %8.2f %7.0f %5.1f%%  %.1e\n", shape.c_str(), fname(f), plan, t.graph_us, t.event_us,
                brief, bytes / g_copy_bw * 1e6, bytes / 1e6, gbs, 100.0 * gbs * 1e9 / g_copy_bw, err);
    std::fflush(stdout);
}

// A dense decode GEMV (nw = 2: fused gate/up + SwiGLU, y = silu(x Wg^T) * (x Wu^T)).
void bench_gemv(const std::string & shape, WeightFormat f, int64_t n, int64_t k, int rows, int nw, double brief_us, bool mma = false) {
    std::vector<HostWeight> hw;
    for (int i = 0; i < nw; ++i) hw.push_back(make_weight(f, n, k));
    double bytes = 0;
    for (auto & h : hw) bytes += double(h.bytes());
    // Enough copies that the rotation is well beyond L2 (weights come from DRAM).
    const int copies = int(std::clamp<int64_t>(int64_t(std::ceil(512e6 / bytes)), 1, 64));
    std::vector<std::vector<DeviceWeight>> ws(static_cast<size_t>(nw));
    for (int i = 0; i < nw; ++i) {
        ws[size_t(i)].push_back(upload(hw[size_t(i)]));
        for (int c = 1; c < copies; ++c) {
            DeviceWeight d = ws[size_t(i)][0];
            void *       p = nullptr;
            CK(cudaMalloc(&p, hw[size_t(i)].data.size()));
            CK(cudaMemcpy(p, ws[size_t(i)][0].data, hw[size_t(i)].data.size(), cudaMemcpyDeviceToDevice));
            d.data = p;
            if (!hw[size_t(i)].scales.empty()) {
                CK(cudaMalloc(&p, hw[size_t(i)].scales.size()));
                CK(cudaMemcpy(p, ws[size_t(i)][0].scales, hw[size_t(i)].scales.size(), cudaMemcpyDeviceToDevice));
                d.scales = p;
            }
            ws[size_t(i)].push_back(d);
        }
    }
    std::vector<float> x(size_t(rows * k));
    for (float & v : x) v = uni(-1.0f, 1.0f);
    float * dx = dev_copy(x);
    float * dy = nullptr;
    CK(cudaMalloc(&dy, size_t(rows * n) * 4));
    PlannedGemv pg;
    pg.f   = f;
    pg.glu = nw == 2;
    pg.p   = plan_gemv(f, n, k, 1, rows, nw, g_sms, lab_opts(f, mma));
    SplitScratch sc(pg.p, nw, rows, n);
    pg.counters = sc.counters;
    auto launch = [&](int i, cudaStream_t s) {
        const int c = i % copies;
        GemvArgs  a;
        a.w[0] = ws[0][size_t(c)];
        a.w[1] = ws[size_t(nw - 1)][size_t(c)];
        for (int r = 0; r < kGemvMaxRows; ++r) a.x[r] = dx + (r < rows ? r : 0) * k;
        a.n = n;
        a.k = k;
        a.rows = a.out_rows = rows;
        a.y                = dy;
        a.partial          = sc.partial;
        pg.launch(a, s);
    };
    launch(0, g_stream);
    CK(cudaStreamSynchronize(g_stream));
    std::vector<float> y(size_t(rows * n));
    CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
    double err = 0;
    if (nw == 1) {
        err = check(hw[0], x, rows, y, false);
    } else {  // silu(gate) * up on sampled rows
        double num = 0, den = 0;
        for (int sidx = 0; sidx < 32; ++sidx) {
            const int64_t j = sidx < 8 ? sidx : sidx < 16 ? n - 1 - (sidx - 8) : int64_t((sidx * 2654435761ull) % uint64_t(n));
            for (int r = 0; r < rows; ++r) {
                double g = 0, u = 0;
                for (int64_t kk = 0; kk < k; ++kk) {
                    g += ref_weight(hw[0], j, kk) * x[size_t(r * k + kk)];
                    u += ref_weight(hw[1], j, kk) * x[size_t(r * k + kk)];
                }
                const double ref = g / (1 + std::exp(-g)) * u, d = y[size_t(r * n + j)] - ref;
                num += d * d;
                den += ref * ref;
            }
        }
        err = den > 0 ? num / den : num;
    }
    const Timing t = time_launches(launch, per_graph_for(bytes), g_stream);
    print_row(shape + (rows > 1 ? " rows=" + std::to_string(rows) : ""), f, pg.p, t, brief_us, bytes, err);
    for (auto & v : ws)
        for (size_t c = 0; c < v.size(); ++c) {
            if (c == 0) {
                release(v[c]);
            } else {
                cudaFree(const_cast<void *>(v[c].data));
                if (v[c].scales) cudaFree(const_cast<void *>(v[c].scales));
            }
        }
    cudaFree(dx);
    cudaFree(dy);
}

// One MoE decode layer: `top` of `E` experts, fused gate/up + SwiGLU (one launch), then down (one
// launch), each timed on its own and as the pair. 16 routing sets rotate.
struct MoeShape {
    const char * name;
    int          E, top, H, F;
};
constexpr MoeShape kMoe30B{"30B-A3B", 128, 8, 2048, 768};
// MiniMax-M2 has 256 experts; 64 distinct ones (600 MB of gate/up) already defeat the L2 across the
// 16 routing sets, and the lab makes them on the host.
constexpr MoeShape kMoeMiniMax{"MiniMax-M2", 64, 8, 3072, 1536};

// sweep: instead of the planner's plans, every plan it can make (K-pair x K-warps x K splits, through
// the tuning overrides) for gate/up and for down, each timed alone (--moe-sweep).
void bench_moe(WeightFormat f, double brief_up_us, double brief_down_us, bool mma = false, const MoeShape & shape = kMoe30B,
               bool sweep = false) {
    const int E = shape.E, top = shape.top, H = shape.H, F = shape.F;
    std::vector<HostWeight> gate, up, down;
    for (int e = 0; e < E; ++e) {
        gate.push_back(make_weight(f, F, H));
        up.push_back(make_weight(f, F, H));
        down.push_back(make_weight(f, H, F));
    }
    std::vector<DeviceWeight> tg, tu, td;
    for (int e = 0; e < E; ++e) {
        tg.push_back(upload(gate[size_t(e)]));
        tu.push_back(upload(up[size_t(e)]));
        td.push_back(upload(down[size_t(e)]));
    }
    DeviceWeight *dg = dev_copy(tg), *du = dev_copy(tu), *dd = dev_copy(td);
    const int     sets = 16;
    std::vector<int32_t> ids(size_t(sets * top));
    for (int s = 0; s < sets; ++s) {
        std::vector<int32_t> all(E);
        for (int e = 0; e < E; ++e) all[size_t(e)] = e;
        std::shuffle(all.begin(), all.end(), rng);
        for (int j = 0; j < top; ++j) ids[size_t(s * top + j)] = all[size_t(j)];
    }
    int32_t *          dids = dev_copy(ids);
    std::vector<float> x(H), act_in(size_t(top * F));
    for (float & v : x) v = uni(-1.0f, 1.0f);
    for (float & v : act_in) v = uni(-1.0f, 1.0f);
    float *dx = dev_copy(x), *dact_in = dev_copy(act_in), *dact = nullptr, *dy = nullptr;
    CK(cudaMalloc(&dact, size_t(top * F) * 4));
    CK(cudaMalloc(&dy, size_t(top * H) * 4));
    // The launch arguments of gate/up (reads x, writes the activations) or down (reads `in`, writes
    // y), routing set i.
    auto moe_args = [&](bool is_up, int i, const float * in, float * partial) {
        GemvArgs a;
        a.w[0] = a.w[1] = is_up ? tg[0] : td[0];
        a.table[0]      = is_up ? dg : dd;
        a.table[1]      = is_up ? du : dd;
        a.ids           = Ids{dids + (i % sets) * top, 1, top, top, E};
        a.xbase         = in;
        a.x_sj          = is_up ? 0 : F;
        a.x_st          = is_up ? H : int64_t(top) * F;
        a.n             = is_up ? F : H;
        a.k             = is_up ? H : F;
        a.out_rows      = top;
        a.y             = is_up ? dact : dy;
        a.partial       = partial;
        return a;
    };
    // nmse of routing set 0 against the double reference on sampled rows, after a launch of that
    // set: the gate/up + SwiGLU output (from x) or the down output (from act_in).
    auto set0_error = [&](bool is_up) {
        std::vector<float> out(size_t(top) * size_t(is_up ? F : H));
        CK(cudaStreamSynchronize(g_stream));
        CK(cudaMemcpy(out.data(), is_up ? dact : dy, out.size() * 4, cudaMemcpyDeviceToHost));
        double num = 0, den = 0;
        for (int j = 0; j < top; ++j) {
            const int e = ids[size_t(j)];
            for (int n = 0; n < (is_up ? F : H); n += is_up ? 37 : 53) {
                double ref = 0;
                if (is_up) {
                    double g = 0, u = 0;
                    for (int k = 0; k < H; ++k) {
                        g += ref_weight(gate[size_t(e)], n, k) * x[size_t(k)];
                        u += ref_weight(up[size_t(e)], n, k) * x[size_t(k)];
                    }
                    ref = g / (1 + std::exp(-g)) * u;
                } else {
                    for (int k = 0; k < F; ++k) ref += ref_weight(down[size_t(e)], n, k) * act_in[size_t(j * F + k)];
                }
                const double d = out[size_t(j) * size_t(is_up ? F : H) + size_t(n)] - ref;
                num += d * d;
                den += ref * ref;
            }
        }
        return den > 0 ? num / den : num;
    };
    const std::string up_name   = std::string(shape.name) + " moe gate+up+swiglu " + std::to_string(top) + "x(" + std::to_string(F) + "+" +
                                std::to_string(F) + ")x" + std::to_string(H);
    const std::string down_name = std::string(shape.name) + " moe down " + std::to_string(top) + "x" + std::to_string(H) + "x" + std::to_string(F);
    if (sweep) {
        const double bytes_up   = double(top) * double(gate[0].bytes() + up[0].bytes());
        const double bytes_down = double(top) * double(down[0].bytes());
        Overrides &  ov         = overrides();
        for (const bool is_up : {true, false}) {
            print_header();
            // Every restriction of the planner's candidates, then none (the planner's own choice).
            std::vector<Overrides> tries;
            for (int kp = 0; kp <= 1; ++kp)
                for (const int wk : {1, 2, 4, 8})
                    for (const int ks : {1, 2, 4, 8}) {
                        Overrides o;
                        o.gemv_kpair  = kp;
                        o.gemv_wk     = wk;
                        o.gemv_ksplit = ks;
                        tries.push_back(o);
                    }
            tries.push_back(Overrides{});
            for (size_t t_i = 0; t_i < tries.size(); ++t_i) {
                const bool planner = t_i + 1 == tries.size();
                const Overrides & o = tries[t_i];
                ov                  = o;
                PlannedGemv g;
                g.f   = f;
                g.glu = is_up;
                g.p   = is_up ? plan_gemv(f, F, H, top, 1, 2, g_sms, lab_opts(f, mma)) : plan_gemv(f, H, F, top, 1, 1, g_sms, lab_opts(f, mma));
                ov    = Overrides{};
                // A restriction the planner could not honour gives another plan: skip it.
                if (g.p.grid.x == 0 || (!planner && (g.p.wk != o.gemv_wk || int(g.p.mma_kpair) != o.gemv_kpair || g.p.ksplit != o.gemv_ksplit))) continue;
                SplitScratch sc(g.p, is_up ? 2 : 1, top, is_up ? F : H);
                g.counters  = sc.counters;
                auto launch = [&](int i, cudaStream_t st) { g.launch(moe_args(is_up, i, is_up ? dx : dact_in, sc.partial), st); };
                launch(0, g_stream);
                const double err   = set0_error(is_up);
                const double bytes = is_up ? bytes_up : bytes_down;
                const Timing t     = time_launches(launch, per_graph_for(bytes), g_stream);
                print_row((is_up ? up_name : down_name) + (planner ? " (planner)" : ""), f, g.p, t, 0.0, bytes, err);
            }
        }
    }
    if (!sweep) {
        PlannedGemv pu, pd;
        pu.f = pd.f = f;
        pu.glu      = true;
        pu.p        = plan_gemv(f, F, H, top, 1, 2, g_sms, lab_opts(f, mma));
        pd.p        = plan_gemv(f, H, F, top, 1, 1, g_sms, lab_opts(f, mma));
        SplitScratch su(pu.p, 2, top, F), sd(pd.p, 1, top, H);
        pu.counters = su.counters;
        pd.counters = sd.counters;
        // Gate/up reads x; down reads a fixed activation buffer (so the two can be timed apart).
        auto launch_up   = [&](int i, cudaStream_t s) { pu.launch(moe_args(true, i, dx, su.partial), s); };
        auto launch_down = [&](int i, cudaStream_t s, const float * in) { pd.launch(moe_args(false, i, in, sd.partial), s); };
        launch_up(0, g_stream);
        launch_down(0, g_stream, dact_in);
        const double err_up = set0_error(true), err_down = set0_error(false);
        const double bytes_up   = double(top) * double(gate[0].bytes() + up[0].bytes());
        const double bytes_down = double(top) * double(down[0].bytes());
        const Timing tu_        = time_launches(launch_up, per_graph_for(bytes_up), g_stream);
        const Timing td_        = time_launches([&](int i, cudaStream_t s) { launch_down(i, s, dact_in); }, per_graph_for(bytes_down), g_stream);
        const Timing tl         = time_launches([&](int i, cudaStream_t s) { launch_up(i, s), launch_down(i, s, dact); },
                                                per_graph_for(bytes_up + bytes_down), g_stream);
        print_row(up_name, f, pu.p, tu_, brief_up_us, bytes_up, err_up);
        print_row(down_name, f, pd.p, td_, brief_down_us, bytes_down, err_down);
        GemvPlan both = pu.p;
        both.grid     = dim3(0, 0, 0);
        print_row(std::string(shape.name) + " moe layer (gate/up, then down)", f, both, tl,
                  brief_up_us > 0 && brief_down_us > 0 ? brief_up_us + brief_down_us : 0.0, bytes_up + bytes_down, 0.0);
    }
    for (auto & d : tg) release(d);
    for (auto & d : tu) release(d);
    for (auto & d : td) release(d);
    cudaFree(dg);
    cudaFree(du);
    cudaFree(dd);
    cudaFree(dids);
    cudaFree(dx);
    cudaFree(dact_in);
    cudaFree(dact);
    cudaFree(dy);
}

// Several weights over the same activation row (q, k and v): one multi-weight launch against one
// launch per weight (each planned on its own), back to back in the graph.
void bench_multi(const std::string & shape, WeightFormat f, const std::vector<int64_t> & ns, int64_t k, bool mma) {
    const int                 count = int(ns.size());
    std::vector<HostWeight>   hw;
    double                    bytes = 0;
    int64_t                   ntot  = 0;
    for (int64_t n : ns) hw.push_back(make_weight(f, n, k)), bytes += double(hw.back().bytes()), ntot += n;
    const int copies = int(std::clamp<int64_t>(int64_t(std::ceil(512e6 / bytes)), 1, 64));
    std::vector<std::vector<DeviceWeight>> ws(static_cast<size_t>(count));
    for (int i = 0; i < count; ++i)
        for (int c = 0; c < copies; ++c) ws[size_t(i)].push_back(upload(hw[size_t(i)]));
    std::vector<float> x(static_cast<size_t>(k));
    for (float & v : x) v = uni(-1.0f, 1.0f);
    float *              dx = dev_copy(x);
    std::vector<float *> dy(static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) CK(cudaMalloc(&dy[size_t(i)], size_t(ns[size_t(i)]) * 4));
    PlannedGemv pm;
    pm.f   = f;
    pm.p   = plan_gemv(f, ntot, k, 1, 1, 1, g_sms, lab_opts(f, mma, count, ns.data()));
    SplitScratch scm(pm.p, 1, 1, ntot);
    pm.counters = scm.counters;
    auto multi = [&](int it, cudaStream_t s) {
        const int c = it % copies;
        GemvArgs  a;
        a.n_mats     = count;
        int64_t row0 = 0;
        int32_t tile = 0;
        for (int i = 0; i < count; ++i) {
            a.w[i]         = ws[size_t(i)][size_t(c)];
            a.mat_n[i]     = ns[size_t(i)];
            a.mat_row0[i]  = row0;
            a.mat_tile0[i] = tile;
            a.mat_y[i]     = dy[size_t(i)];
            row0 += ns[size_t(i)];
            tile += int32_t((ns[size_t(i)] + pm.p.rows_per_block - 1) / pm.p.rows_per_block);
        }
        a.mat_tile0[count] = tile;
        for (int r = 0; r < kGemvMaxRows; ++r) a.x[r] = dx;
        a.n       = ntot;
        a.k       = k;
        a.partial = scm.partial;
        pm.launch(a, s);
    };
    std::vector<PlannedGemv>                   ps(static_cast<size_t>(count));
    std::vector<std::unique_ptr<SplitScratch>> scs;
    for (int i = 0; i < count; ++i) {
        ps[size_t(i)].f = f;
        ps[size_t(i)].p = plan_gemv(f, ns[size_t(i)], k, 1, 1, 1, g_sms, lab_opts(f, mma));
        scs.push_back(std::make_unique<SplitScratch>(ps[size_t(i)].p, 1, 1, ns[size_t(i)]));
        ps[size_t(i)].counters = scs.back()->counters;
    }
    auto separate = [&](int it, cudaStream_t s) {
        const int c = it % copies;
        for (int i = 0; i < count; ++i) {
            GemvArgs a;
            a.w[0] = a.w[1] = ws[size_t(i)][size_t(c)];
            for (int r = 0; r < kGemvMaxRows; ++r) a.x[r] = dx;
            a.n       = ns[size_t(i)];
            a.k       = k;
            a.y       = dy[size_t(i)];
            a.partial = scs[size_t(i)]->partial;
            ps[size_t(i)].launch(a, s);
        }
    };
    multi(0, g_stream);
    CK(cudaStreamSynchronize(g_stream));
    double num = 0, den = 0;
    for (int i = 0; i < count; ++i) {
        std::vector<float> y(static_cast<size_t>(ns[size_t(i)]));
        CK(cudaMemcpy(y.data(), dy[size_t(i)], y.size() * 4, cudaMemcpyDeviceToHost));
        const double e = check(hw[size_t(i)], x, 1, y, false);
        num += e;
        den += 1;
    }
    const Timing tm = time_launches(multi, per_graph_for(bytes), g_stream);
    const Timing tsep = time_launches(separate, per_graph_for(bytes), g_stream);
    print_row(shape + " one launch", f, pm.p, tm, 0.0, bytes, num / den);
    GemvPlan none = pm.p;
    none.grid     = dim3(0, 0, 0);
    print_row(shape + " " + std::to_string(count) + " launches", f, none, tsep, 0.0, bytes, 0.0);
    for (auto & v : ws)
        for (auto & d : v) release(d);
    cudaFree(dx);
    for (float * p : dy) cudaFree(p);
}

// One prefill GEMM (glu: fused gate/up, two weights of n rows), planned as the dispatch plans it
// (plan_gemm; split-K partials and zeroed counters as matmul.cpp sets them up), or with K forced into
// `ksplit` splits. Returns the time per launch (us).
double bench_gemm(WeightFormat f, int64_t m, int64_t n, int64_t k, bool glu = false, int ksplit = 0, const char * label = "") {
    HostWeight   hw = make_weight(f, n, k);
    DeviceWeight dw = upload(hw);
    std::vector<float> x(size_t(m * k));
    for (float & v : x) v = uni(-1.0f, 1.0f);
    float *    dx = dev_copy(x), *dy = nullptr, *part = nullptr;
    uint16_t * xh = nullptr;
    float *    xs = nullptr;
    uint32_t * counters = nullptr;
    CK(cudaMalloc(&dy, size_t(m * n) * 4));
    CK(cudaMalloc(&xh, size_t(m * k) * 2));
    CK(cudaMalloc(&xs, size_t(m) * 4));
    XRows xr;
    xr.base = reinterpret_cast<const char *>(dx);
    xr.ne1  = m;
    xr.nb1  = k * 4;
    xr.nb2 = xr.nb3 = m * k * 4;
    x_to_f16_rows(xr, m, k, nullptr, nullptr, nullptr, nullptr, Ids{}, xh, xs, 0);
    overrides().gemm_ksplit = ksplit;
    const GemmPlan p        = plan_gemm(m, (n + gemm_bn(glu) - 1) / gemm_bn(glu), k, g_sms);
    overrides().gemm_ksplit = 0;
    GemmArgs a;
    a.a            = xh;
    a.a_inv_scale  = xs;
    a.lda          = k;
    a.m            = m;
    a.n            = n;
    a.k            = k;
    a.w[0] = a.w[1] = dw;  // (glu: the same weight as gate and up; only the time matters then)
    a.y            = dy;
    a.ksplit       = p.ksplit;
    a.kt_per_split = p.kt_per_split;
    if (p.ksplit > 1) {
        CK(cudaMalloc(&part, size_t(p.partial_floats()) * 4));
        CK(cudaMalloc(&counters, size_t(p.counters()) * 4));
        a.partial  = part;
        a.counters = counters;
    }
    auto launch = [&] {
        if (counters) CK(cudaMemsetAsync(counters, 0, size_t(p.counters()) * 4, 0));
        gemm_launch_any(f, p.mt, glu, a, p.grid);
    };
    launch();
    CK(cudaDeviceSynchronize());
    double err = 0.0;
    if (!glu) {
        std::vector<float> y(size_t(m * n));
        CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
        // Reference with the f32 activations: the F16 rounding of both operands remains (nmse ~1e-7).
        const int          rows_checked = 4;
        std::vector<float> x_rows(x.begin(), x.begin() + rows_checked * k), ys(y.begin(), y.begin() + rows_checked * n);
        err = check(hw, x_rows, rows_checked, ys, false);
    }
    const int   iters = 20;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0);
    for (int i = 0; i < iters; ++i) launch();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    const double us = ms * 1e3 / iters;
    std::printf("gemm  %-10s M=%-5lld N=%-6lld K=%-6lld %s grid=%ux%ux%u mt=%d  %9.1f us  %6.1f TFLOP/s  nmse %.1e %s\n", fname(f),
                (long long) m, (long long) n * (glu ? 2 : 1), (long long) k, glu ? "glu" : "   ", p.grid.x, p.grid.y, p.grid.z, p.mt,
                us, 2.0 * m * n * (glu ? 2 : 1) * k / (us * 1e-6) / 1e12, err, label);
    release(dw);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(xh);
    cudaFree(xs);
    cudaFree(part);
    cudaFree(counters);
    return us;
}

// --gemm-sweep: the prefill GEMM of the 8B / 30B-A3B projections at 512 rows with K in 1..8 splits
// and as planned, to check plan_gemm's model against the clock.
void gemm_sweep() {
    struct S {
        const char * name;
        int64_t      n, k;
        bool         glu;
    };
    const S shapes[] = {{"8B q/o", 4096, 4096, false},        {"8B q+k+v", 6144, 4096, false},
                        {"8B k/v", 1024, 4096, false},        {"8B down", 4096, 12288, false},
                        {"8B gate/up", 12288, 4096, true},    {"30B q+k+v", 5120, 2048, false},
                        {"30B o", 2048, 4096, false},         {"30B q", 4096, 2048, false}};
    for (const S & s : shapes) {
        for (int ks = 1; ks <= 8; ++ks) bench_gemm(WeightFormat::INT4, 512, s.n, s.k, s.glu, ks, s.name);
        bench_gemm(WeightFormat::INT4, 512, s.n, s.k, s.glu, 0, (std::string(s.name) + " (planner)").c_str());
    }
}

}  // namespace

// --sweep: every decode-GEMV plan the planner can make (kernel x K-pair or lanes per row x K-warps x
// K splits, restricted through the tuning overrides) for the large INT4 shapes of Qwen3-8B and the
// attention projections of Qwen3-30B-A3B and MiniMax-M2 (q + k + v as one weight), to check
// the cost model's choice against the clock. --sweep-rows R: the same with R activation rows (a
// verify step of speculative decoding: R = k + 1).
void sweep(int rows) {
    struct S {
        const char * name;
        int64_t      n, k;
        int          nw;
    };
    const S shapes[] = {{"8B ffn gate+up+swiglu N=12288 K=4096", 12288, 4096, 2},
                        {"8B down N=4096 K=12288", 4096, 12288, 1},
                        {"8B q/o N=4096 K=4096", 4096, 4096, 1},
                        {"30B-A3B q+k+v N=5120 K=2048", 5120, 2048, 1},
                        {"30B-A3B o N=2048 K=4096", 2048, 4096, 1},
                        {"MiniMax-M2 q+k+v N=8192 K=3072", 8192, 3072, 1},
                        {"MiniMax-M2 o N=3072 K=6144", 3072, 6144, 1}};
    Overrides & ov = overrides();
    for (const S & s : shapes) {
        print_header();
        for (const bool mma : {true, false}) {
            for (const int variant : mma ? std::vector<int>{0, 1} : std::vector<int>{32, 16}) {
                for (const int wk : {1, 2, 4, 8}) {
                    for (const int ks : {1, 2, 4}) {
                        ov             = Overrides{};
                        ov.gemv_wk     = wk;
                        ov.gemv_ksplit = ks;
                        if (mma) ov.gemv_kpair = variant;
                        else ov.gemv_lpr = variant;
                        const GemvPlan p = plan_gemv(WeightFormat::INT4, s.n, s.k, 1, rows, s.nw, g_sms, lab_opts(WeightFormat::INT4, mma));
                        if (p.grid.x == 0 || p.mma != mma || p.wk != wk) continue;
                        bench_gemv(s.name, WeightFormat::INT4, s.n, s.k, rows, s.nw, 0.0, mma);
                    }
                }
            }
        }
        ov = Overrides{};
        bench_gemv(std::string(s.name) + " (planner)", WeightFormat::INT4, s.n, s.k, rows, s.nw, 0.0, true);
    }
}

int main(int argc, char ** argv) {
    bool quick = false, gemm = true, more_rows = false, no_pdl = false, fma = true, mma = true, do_sweep = false, gemm_only = false, moe_sweep = false;
    int  sweep_rows = 1;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--quick") quick = true, gemm = false;
        if (a == "--no-gemm") gemm = false;
        if (a == "--rows") more_rows = true;
        if (a == "--no-pdl") no_pdl = true;
        if (a == "--mma-only") fma = false;
        if (a == "--fma-only") mma = false;
        if (a == "--sweep") do_sweep = true;
        if (a == "--sweep-rows" && i + 1 < argc) do_sweep = true, sweep_rows = std::atoi(argv[++i]);
        if (a == "--gemm-sweep") gemm_only = true;
        if (a == "--moe-sweep") moe_sweep = true;
    }
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    g_sms     = prop.multiProcessorCount;
    g_pdl     = !no_pdl && prop.major >= 9;
    g_copy_bw = measure_copy_bw();
    g_smem_optin = int(prop.sharedMemPerBlockOptin);
    int mem_khz = 0, bus_bits = 0, sm_khz = 0;
    CK(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, 0));
    CK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0));
    CK(cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, 0));
    device_rates(g_rates, mem_khz, bus_bits, sm_khz);
    std::printf("%s, %d SMs, copy bandwidth %.0f GB/s (bytes read + written, the perf-anchors.md convention; %%copy = bytes read / graph us / this); "
                "GEMV launches %s programmatic dependent launch\n",
                prop.name, g_sms, g_copy_bw / 1e9, g_pdl ? "with" : "without");
    if (do_sweep) {
        sweep(std::max(1, sweep_rows));
        return 0;
    }
    if (moe_sweep) {
        for (const MoeShape & shape : {kMoe30B, kMoeMiniMax})
            for (const WeightFormat f : {WeightFormat::INT4, WeightFormat::NVFP4}) bench_moe(f, 0.0, 0.0, true, shape, true);
        return 0;
    }
    if (gemm_only) {
        gemm_sweep();
        return 0;
    }

    // The decode-step shapes of the brief; brief us: INT4 (BF16 for lm_head / router) in a model step.
    struct Shape {
        const char * name;
        int64_t      n, k;
        int          nw;
        double       brief_us;
        bool         bf16_only;
    };
    const Shape shapes[] = {
        {"8B ffn gate+up+swiglu N=12288 K=4096", 12288, 4096, 2, 39.1, false},
        {"8B q/o N=4096 K=4096", 4096, 4096, 1, 13.2, false},
        {"8B down N=4096 K=12288", 4096, 12288, 1, 26.0, false},
        {"8B k/v N=1024 K=4096", 1024, 4096, 1, 7.4, false},
        {"8B lm_head N=151936 K=4096", 151936, 4096, 1, 404.0, true},
        {"30B-A3B k/v N=512 K=2048", 512, 2048, 1, 6.8, false},
        {"30B-A3B q N=4096 K=2048", 4096, 2048, 1, 9.3, false},
        {"30B-A3B o N=2048 K=4096", 2048, 4096, 1, 8.9, false},
        {"30B-A3B router N=128 K=2048", 128, 2048, 1, 6.0, true},
    };
    std::vector<WeightFormat> formats = {WeightFormat::INT4, WeightFormat::NVFP4, WeightFormat::FP8, WeightFormat::BF16};
    if (quick) formats = {WeightFormat::INT4};
    // INT4 / NVFP4 run through both decode kernels (fma: gemv_kernels.cuh; mma: gemv_mma_kernels.cuh, the dispatch's
    // default where the weight takes it); FP8 / BF16 have the FMA kernel only.
    auto paths = [&](WeightFormat f) {
        std::vector<bool> v;
        const bool        has_mma = f == WeightFormat::INT4 || f == WeightFormat::NVFP4;
        if (fma || !has_mma) v.push_back(false);
        if (mma && has_mma) v.push_back(true);
        return v;
    };
    print_header();
    for (const Shape & s : shapes) {
        if (s.bf16_only) {
            bench_gemv(s.name, WeightFormat::BF16, s.n, s.k, 1, s.nw, s.brief_us);
            continue;
        }
        for (const WeightFormat f : formats)
            for (const bool m : paths(f)) bench_gemv(s.name, f, s.n, s.k, 1, s.nw, f == WeightFormat::INT4 ? s.brief_us : 0.0, m);
    }
    for (const WeightFormat f : formats)
        for (const bool m : paths(f)) bench_moe(f, f == WeightFormat::INT4 ? 25.5 : 0.0, f == WeightFormat::INT4 ? 12.8 : 0.0, m);
    // Multi-weight launches (op_matmul_multi): q/k/v of one layer in one launch.
    print_header();
    for (const WeightFormat f : formats)
        for (const bool m : paths(f)) {
            bench_multi("8B q+k+v 4096+1024+1024 K=4096", f, {4096, 1024, 1024}, 4096, m);
            bench_multi("30B-A3B q+k+v 4096+512+512 K=2048", f, {4096, 512, 512}, 2048, m);
        }
    if (more_rows) {
        print_header();
        for (const WeightFormat f : formats)
            for (const bool m : paths(f))
                for (const int rows : {2, 4, 8}) {
                    bench_gemv(shapes[0].name, f, shapes[0].n, shapes[0].k, rows, 2, 0.0, m);
                    bench_gemv(shapes[1].name, f, shapes[1].n, shapes[1].k, rows, 1, 0.0, m);
                }
    }
    if (gemm) {
        std::printf("\n");
        for (const WeightFormat f : {WeightFormat::BF16, WeightFormat::INT4, WeightFormat::NVFP4, WeightFormat::FP8})
            for (const int64_t n : {4096, 12288}) bench_gemm(f, 512, n, 4096);
    }
    return 0;
}
