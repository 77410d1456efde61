// Kernel lab for src/backends/cuda/matmul: validates and times the decode GEMV (GB/s of weight bytes
// streamed, against the measured device copy bandwidth), the MoE decode launches (Qwen3-30B-A3B: 8 of
// 128 experts, fused gate/up + SwiGLU, then down) and the prefill GEMM (TFLOP/s), launched exactly as
// the dispatch plans them (plan.cpp). Weights are random bytes in the device layout; the reference is
// a double-precision dot product over the formats.h decoders for a sample of output rows.
//
// Build and run from the repository root (one line; -arch as the GPU: sm_90a H100, sm_120a RTX 50xx):
//   nvcc -O3 -std=c++20 --expt-relaxed-constexpr -arch=sm_90a -Isrc -Iinclude dev/kernels/matmul/bench_matmul.cu src/backends/cuda/matmul/gemv_*.cu src/backends/cuda/matmul/gemm_*.cu src/backends/cuda/matmul/aux.cu src/backends/cuda/matmul/plan.cpp -o /tmp/bench_matmul && /tmp/bench_matmul
// Options: --quick (fewer shapes).
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/matmul/launch.h"
#include "quant/formats.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

void gemv_launch_any(WeightFormat f, int r, bool glu, const GemvArgs & a, dim3 g) {
    switch (f) {
        case WeightFormat::F32: gemv_launch_f32(r, glu, a, g, 0); break;
        case WeightFormat::F16: gemv_launch_f16(r, glu, a, g, 0); break;
        case WeightFormat::BF16: gemv_launch_bf16(r, glu, a, g, 0); break;
        case WeightFormat::NVFP4: gemv_launch_nvfp4(r, glu, a, g, 0); break;
        case WeightFormat::INT4: gemv_launch_int4(r, glu, a, g, 0); break;
        case WeightFormat::FP8: gemv_launch_fp8(r, glu, a, g, 0); break;
    }
    CK(cudaGetLastError());
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

void bench_gemv(WeightFormat f, int64_t n, int64_t k, int rows) {
    HostWeight hw = make_weight(f, n, k);
    // Enough copies that the rotation is well beyond L2 (weights must come from DRAM).
    const int                 copies = int(std::clamp<int64_t>(int64_t((size_t(512) << 20) / hw.bytes()), 1, 64));
    std::vector<DeviceWeight> ws;
    ws.push_back(upload(hw));
    for (int c = 1; c < copies; ++c) {
        DeviceWeight d = ws[0];
        void *       p = nullptr;
        CK(cudaMalloc(&p, hw.data.size()));
        CK(cudaMemcpy(p, ws[0].data, hw.data.size(), cudaMemcpyDeviceToDevice));
        d.data = p;
        if (!hw.scales.empty()) {
            CK(cudaMalloc(&p, hw.scales.size()));
            CK(cudaMemcpy(p, ws[0].scales, hw.scales.size(), cudaMemcpyDeviceToDevice));
            d.scales = p;
        }
        ws.push_back(d);
    }
    std::vector<float> x(size_t(rows * k));
    for (float & v : x) v = uni(-1.0f, 1.0f);
    float * dx = dev_copy(x);
    float * dy = nullptr;
    CK(cudaMalloc(&dy, size_t(rows * n) * 4));
    const GemvPlan p = plan_gemv(f, n, k, 1, rows, 1, g_sms);
    float *        partial = nullptr;
    if (p.ksplit > 1) CK(cudaMalloc(&partial, size_t(p.ksplit) * rows * n * 4));
    auto launch = [&](int c) {
        GemvArgs a;
        a.w[0] = a.w[1] = ws[size_t(c)];
        for (int r = 0; r < kGemvMaxRows; ++r) a.x[r] = dx + (r < rows ? r : 0) * k;
        a.n = n;
        a.k = k;
        a.rows = a.out_rows = rows;
        a.wk               = p.wk;
        a.chunks_per_split = p.cps;
        if (p.ksplit > 1)
            a.partial = partial;
        else
            a.y = dy;
        gemv_launch_any(f, p.r_tmpl, false, a, p.grid);
        if (p.ksplit > 1) gemv_splitk_reduce(partial, p.ksplit, 1, rows, n, dy, 0);
    };
    launch(0);
    CK(cudaDeviceSynchronize());
    std::vector<float> y(size_t(rows * n));
    CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
    const double err = check(hw, x, rows, y, false);
    const int    iters = std::max(20, std::min(2000, int(4e9 / double(hw.bytes()))));
    for (int i = 0; i < 5; ++i) launch(i % copies);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0);
    for (int i = 0; i < iters; ++i) launch(i % copies);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    const double us = ms * 1e3 / iters, gbs = hw.bytes() / (us * 1e-6) / 1e9;
    std::printf("gemv  %-10s N=%-6lld K=%-6lld rows=%d  wk=%d ksplit=%d grid=%ux%u  %9.2f us  %7.0f GB/s  %5.1f%% of copy  nmse %.1e\n",
                fname(f), (long long) n, (long long) k, rows, p.wk, p.ksplit, p.grid.x, p.grid.y, us, gbs, 100.0 * gbs * 1e9 / g_copy_bw,
                err);
    for (auto & d : ws) release(d);
    cudaFree(dx);
    cudaFree(dy);
    if (partial) cudaFree(partial);
}

// Qwen3-30B-A3B MoE decode step of one layer: 8 of 128 experts, fused gate/up + SwiGLU (one launch)
// then down (one launch). Several routing sets rotate so experts come from DRAM.
void bench_moe(WeightFormat f) {
    const int E = 128, top = 8, H = 2048, F = 768;
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
    std::vector<float> x(H);
    for (float & v : x) v = uni(-1.0f, 1.0f);
    float *dx = dev_copy(x), *dact = nullptr, *dy = nullptr;
    CK(cudaMalloc(&dact, size_t(top * F) * 4));
    CK(cudaMalloc(&dy, size_t(top * H) * 4));
    const GemvPlan pg = plan_gemv(f, F, H, top, 1, 2, g_sms);
    const GemvPlan pd = plan_gemv(f, H, F, top, 1, 1, g_sms);
    auto           launch = [&](int s) {
        GemvArgs a;
        a.w[0] = a.w[1] = tg[0];
        a.table[0]      = dg;
        a.table[1]      = du;
        a.ids           = Ids{dids + s * top, 1, top, top, E};
        a.xbase         = dx;
        a.x_sj          = 0;
        a.x_st          = H;
        a.n             = F;
        a.k             = H;
        a.out_rows      = top;
        a.wk            = pg.wk;
        a.chunks_per_split = pg.cps;
        a.y             = dact;
        gemv_launch_any(f, 1, true, a, pg.grid);
        GemvArgs b;
        b.w[0] = b.w[1] = td[0];
        b.table[0] = b.table[1] = dd;
        b.ids              = a.ids;
        b.xbase            = dact;
        b.x_sj             = F;
        b.x_st             = int64_t(top) * F;
        b.n                = H;
        b.k                = F;
        b.out_rows         = top;
        b.wk               = pd.wk;
        b.chunks_per_split = pd.cps;
        b.y                = dy;
        gemv_launch_any(f, 1, false, b, pd.grid);
    };
    launch(0);
    CK(cudaDeviceSynchronize());
    // Check the gate/up + SwiGLU output of the first set.
    std::vector<float> act(size_t(top * F));
    CK(cudaMemcpy(act.data(), dact, act.size() * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (int j = 0; j < top; ++j)
        for (int n = 0; n < F; n += 37) {
            const int e = ids[size_t(j)];
            double    g = 0, u = 0;
            for (int k = 0; k < H; ++k) {
                g += ref_weight(gate[size_t(e)], n, k) * x[size_t(k)];
                u += ref_weight(up[size_t(e)], n, k) * x[size_t(k)];
            }
            const double ref = g / (1 + std::exp(-g)) * u, d = act[size_t(j * F + n)] - ref;
            num += d * d;
            den += ref * ref;
        }
    const int iters = 500;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0);
    for (int i = 0; i < iters; ++i) launch(i % sets);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    const double us    = ms * 1e3 / iters;
    const double bytes = double(top) * double(gate[0].bytes() + up[0].bytes() + down[0].bytes());
    std::printf("moe   %-10s 8/128 experts gate+up+swiglu (grid %ux%ux%u) + down (grid %ux%ux%u): %7.2f us/layer  %6.0f GB/s  %5.1f%% of copy  nmse %.1e\n",
                fname(f), pg.grid.x, pg.grid.y, pg.grid.z, pd.grid.x, pd.grid.y, pd.grid.z, us, bytes / (us * 1e-6) / 1e9,
                100.0 * bytes / (us * 1e-6) / g_copy_bw, den > 0 ? num / den : num);
    for (auto & d : tg) release(d);
    for (auto & d : tu) release(d);
    for (auto & d : td) release(d);
    cudaFree(dg);
    cudaFree(du);
    cudaFree(dd);
    cudaFree(dids);
    cudaFree(dx);
    cudaFree(dact);
    cudaFree(dy);
}

void bench_gemm(WeightFormat f, int64_t m, int64_t n, int64_t k) {
    HostWeight   hw = make_weight(f, n, k);
    DeviceWeight dw = upload(hw);
    std::vector<float> x(size_t(m * k));
    for (float & v : x) v = uni(-1.0f, 1.0f);
    float *    dx = dev_copy(x), *dy = nullptr;
    uint16_t * xh = nullptr;
    float *    xs = nullptr;
    CK(cudaMalloc(&dy, size_t(m * n) * 4));
    CK(cudaMalloc(&xh, size_t(m * k) * 2));
    CK(cudaMalloc(&xs, size_t(m) * 4));
    XRows xr;
    xr.base = reinterpret_cast<const char *>(dx);
    xr.ne1  = m;
    xr.nb1  = k * 4;
    xr.nb2 = xr.nb3 = m * k * 4;
    x_to_f16_rows(xr, m, k, nullptr, nullptr, nullptr, nullptr, Ids{}, xh, xs, 0);
    GemmArgs a;
    a.a           = xh;
    a.a_inv_scale = xs;
    a.lda         = k;
    a.m           = m;
    a.n           = n;
    a.k           = k;
    a.w[0] = a.w[1] = dw;
    a.y             = dy;
    const int  mt   = m <= 64 ? 1 : 4;
    const dim3 grid(unsigned((m + gemm_bm(mt) - 1) / gemm_bm(mt)), unsigned((n + gemm_bn(false) - 1) / gemm_bn(false)));
    gemm_launch_any(f, mt, false, a, grid);
    CK(cudaDeviceSynchronize());
    std::vector<float> y(size_t(m * n));
    CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
    // Reference with the f32 activations: the F16 rounding of both operands remains (nmse ~1e-7).
    const int    rows_checked = 4;
    std::vector<float> x_rows(x.begin(), x.begin() + rows_checked * k), ys(size_t(rows_checked * n));
    for (int r = 0; r < rows_checked; ++r)
        for (int64_t j = 0; j < n; ++j) ys[size_t(r * n + j)] = y[size_t(r * n + j)];
    const double err = check(hw, x_rows, rows_checked, ys, false);
    const int   iters = 20;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0);
    for (int i = 0; i < iters; ++i) gemm_launch_any(f, mt, false, a, grid);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    const double us = ms * 1e3 / iters;
    std::printf("gemm  %-10s M=%-5lld N=%-6lld K=%-6lld  grid=%ux%u  %9.1f us  %6.1f TFLOP/s  nmse %.1e (f16 operands)\n", fname(f),
                (long long) m, (long long) n, (long long) k, grid.x, grid.y, us, 2.0 * m * n * k / (us * 1e-6) / 1e12, err);
    release(dw);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(xh);
    cudaFree(xs);
}

}  // namespace

int main(int argc, char ** argv) {
    const bool     quick = argc > 1 && std::string(argv[1]) == "--quick";
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    g_sms     = prop.multiProcessorCount;
    g_copy_bw = measure_copy_bw();
    std::printf("%s, %d SMs, copy bandwidth %.0f GB/s (bytes read + written, the perf-anchors.md convention; %% of copy = GEMV bytes read / this)\n",
                prop.name, g_sms, g_copy_bw / 1e9);
    const WeightFormat formats[] = {WeightFormat::BF16, WeightFormat::INT4, WeightFormat::NVFP4, WeightFormat::FP8};
    struct Shape {
        int64_t n, k;
    };
    const Shape shapes[] = {{4096, 4096}, {12288, 4096}, {4096, 12288}, {1024, 4096}, {512, 2048}, {128, 2048}};
    bench_gemv(WeightFormat::BF16, 151936, 2048, 1);  // Qwen3 lm_head
    for (const WeightFormat f : formats)
        for (const Shape & s : shapes) {
            bench_gemv(f, s.n, s.k, 1);
            if (quick) break;
        }
    for (const WeightFormat f : formats)
        for (const int rows : {2, 4, 8}) bench_gemv(f, 12288, 4096, rows);
    for (const WeightFormat f : formats) bench_moe(f);
    for (const WeightFormat f : formats)
        for (const int64_t n : {4096, 12288}) bench_gemm(f, 512, n, 4096);
    return 0;
}
