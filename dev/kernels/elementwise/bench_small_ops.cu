// Timing of the small ops of src/backends/cuda/elementwise at batch-1 decode shapes (and a few
// prefill shapes), called through the real launchers (ops.h) on hand-made tensors.
//
// Build and run (repository root, one line; -arch as the GPU):
//   nvcc -O3 -std=c++20 --expt-relaxed-constexpr -arch=sm_90a -Isrc -Iinclude dev/kernels/elementwise/bench_small_ops.cu src/backends/cuda/elementwise/norm.cu src/backends/cuda/elementwise/rope.cu src/backends/cuda/elementwise/moe.cu src/backends/cuda/elementwise/argmax.cu src/backends/cuda/elementwise/binary.cu src/graph/graph.cpp src/graph/dtype.cpp src/common/error.cpp -o /tmp/bench_small_ops && /tmp/bench_small_ops
// Baseline (the kernels before this rewrite, same bench; BENCH_BASELINE drops the fused norm + rope,
// which did not exist):
//   mkdir -p /tmp/spark-base && git archive 9a30143 src include | tar -x -C /tmp/spark-base && nvcc -O3 -std=c++20 --expt-relaxed-constexpr -arch=sm_90a -DBENCH_BASELINE -I/tmp/spark-base/src -I/tmp/spark-base/include dev/kernels/elementwise/bench_small_ops.cu /tmp/spark-base/src/backends/cuda/elementwise/{norm,rope,moe,argmax,binary}.cu /tmp/spark-base/src/graph/{graph,dtype,error}.cpp -o /tmp/bench_small_ops_base && /tmp/bench_small_ops_base
//
// Method: every op is captured N = 200 times back to back into one CUDA graph (a linear chain, as a
// decode step's graph is), the graph is replayed R = 20 times, and the best replay / N is printed as
// "hot" us per op (inputs and weights L2-resident). "cold" interleaves each launch with a kernel
// that streams 96 MB (evicting L2, as a decode step's weight streaming does) and prints
// (T[flush + op] - T[flush + empty]) / N + T[empty]: the op's cost with its weights and inputs coming
// from DRAM. The first line is an empty kernel: the floor every launch in a graph pays. Numbers are
// GPU time between graph-launched kernels; the ~1.4 us of an event pair (SPARK_PROFILE_OPS) is not
// included.
// Options: --quick (fewer replays), --no-cold.
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/ops.h"
#include "graph/graph.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace spark::cuda {
void throw_cuda_error(cudaError_t err, const char * call, const char * file, int line) {
    std::fprintf(stderr, "CUDA error %s in %s at %s:%d\n", cudaGetErrorString(err), call, file, line);
    std::exit(1);
}
}  // namespace spark::cuda

using spark::DType;
using spark::Op;
using spark::Tensor;
namespace sc = spark::cuda;

namespace {

#define CK(x) SPARK_CUDA_CHECK(x)

__global__ void empty_kernel() {}

// Streams `n` float4 (reads and a dependent tiny write), evicting L2.
__global__ void flush_kernel(const float4 * p, size_t n, float * sink) {
    float acc = 0.0f;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        const float4 v = p[i];
        acc += v.x + v.y + v.z + v.w;
    }
    if (acc == 1234.5f) *sink = acc;  // never true for the zero buffer; keeps the loads alive
}

struct Ws final : sc::Workspace {
    void * p = nullptr;
    size_t n = 0;
    void * get(size_t bytes) override {
        if (bytes > n) {
            if (p) CK(cudaFree(p));
            CK(cudaMalloc(&p, bytes));
            n = bytes;
        }
        return p;
    }
};

std::mt19937 rng(7);

float * dev_random(size_t n, float scale = 1.0f, float offset = 0.0f) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float>              h(n);
    for (auto & v : h) v = offset + scale * nd(rng);
    float * d = nullptr;
    CK(cudaMalloc(&d, std::max<size_t>(n, 1) * 4));
    CK(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
    return d;
}

Tensor tensor(DType type, std::vector<int64_t> ne, void * data) {
    Tensor t;
    t.type = type;
    for (size_t i = 0; i < ne.size(); ++i) t.ne[i] = ne[i];
    t.nb[0] = 4;
    for (int i = 1; i < spark::kMaxDims; ++i) t.nb[i] = t.nb[i - 1] * size_t(t.ne[i - 1]);
    t.data = data;
    return t;
}

struct Bench {
    cudaStream_t    stream{};
    sc::DeviceProps props;
    sc::OpContext   ctx;
    Ws              ws;
    int             n_launch = 200, n_replay = 20;
    bool            cold     = true;
    float4 *        flush_buf = nullptr;
    size_t          flush_n   = 0;
    float *         sink      = nullptr;
    double          empty_hot = 0, pair_empty = 0;

    void init(bool quick, bool with_cold) {
        if (quick) n_replay = 5;
        cold = with_cold;
        CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        cudaDeviceProp p{};
        CK(cudaGetDeviceProperties(&p, 0));
        props.cc                 = p.major * 100 + p.minor * 10;
        props.sm_count           = p.multiProcessorCount;
        props.max_smem_per_block = int(p.sharedMemPerBlockOptin);
        props.l2_bytes           = size_t(p.l2CacheSize);
        ctx.stream               = stream;
        ctx.props                = &props;
        ctx.workspace            = &ws;
        std::printf("device: %s, %d SMs, L2 %zu MB, cc %d\n", p.name, p.multiProcessorCount, props.l2_bytes >> 20, props.cc);
        flush_n = (96u << 20) / 16;
        CK(cudaMalloc(&flush_buf, flush_n * 16));
        CK(cudaMemset(flush_buf, 0, flush_n * 16));
        CK(cudaMalloc(&sink, 4));
    }

    void flush() { flush_kernel<<<props.sm_count * 4, 512, 0, stream>>>(flush_buf, flush_n, sink); }

    // Best replay time (us) of a graph of n_launch x body (with a flush before each when `flush_first`).
    double time_graph(const std::function<void()> & body, bool flush_first) {
        body();  // eager warm-up (workspace growth, lazy module loading)
        CK(cudaStreamSynchronize(stream));
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < n_launch; ++i) {
            if (flush_first) flush();
            body();
        }
        CK(cudaStreamEndCapture(stream, &g));
        cudaGraphExec_t ge;
        CK(cudaGraphInstantiate(&ge, g, 0));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        CK(cudaGraphLaunch(ge, stream));  // warm
        double best = 1e30;
        for (int r = 0; r < n_replay; ++r) {
            CK(cudaEventRecord(e0, stream));
            CK(cudaGraphLaunch(ge, stream));
            CK(cudaEventRecord(e1, stream));
            CK(cudaEventSynchronize(e1));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            best = std::min(best, double(ms) * 1000.0);
        }
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
        return best;
    }

    void baseline() {
        empty_hot = time_graph([&] { empty_kernel<<<1, 32, 0, stream>>>(); }, false) / n_launch;
        std::printf("\n%-52s %9s %9s\n", "op (decode unless noted)", "hot us", "cold us");
        std::printf("%-52s %9.2f", "empty kernel (launch floor)", empty_hot);
        if (cold) {
            pair_empty = time_graph([&] { empty_kernel<<<1, 32, 0, stream>>>(); }, true);
            std::printf(" %9.2f", empty_hot);
        }
        std::printf("\n");
    }

    void run(const std::string & name, const std::function<void()> & body) {
        const double hot = time_graph(body, false) / n_launch;
        std::printf("%-52s %9.2f", name.c_str(), hot);
        if (cold) {
            const double pair = time_graph(body, true);
            std::printf(" %9.2f", (pair - pair_empty) / n_launch + empty_hot);
        }
        std::printf("\n");
        std::fflush(stdout);
    }
};

}  // namespace

int main(int argc, char ** argv) {
    bool quick = false, with_cold = true;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--quick")) quick = true;
        if (!std::strcmp(argv[i], "--no-cold")) with_cold = false;
    }
    Bench B;
    B.init(quick, with_cold);
    B.baseline();

    // ---- ADD + RMS_NORM over the hidden size (residual add feeding the next norm)
    for (int64_t H : {2048, 4096})
        for (int64_t T : {1, 512}) {
            float * a = dev_random(size_t(H * T)), * b = dev_random(size_t(H * T)), * w = dev_random(size_t(H), 0.1f, 1.0f);
            float * s = dev_random(size_t(H * T)), * o = dev_random(size_t(H * T));
            Tensor  ta = tensor(DType::F32, {H, T}, a), tb = tensor(DType::F32, {H, T}, b), tw = tensor(DType::F32, {H}, w);
            Tensor  ts = tensor(DType::F32, {H, T}, s), to = tensor(DType::F32, {H, T}, o);
            ts.op = Op::ADD, ts.src[0] = &ta, ts.src[1] = &tb;
            to.op = Op::RMS_NORM, to.src[0] = &ts, to.src[1] = &tw, to.fp[0] = 1e-6f;
            B.run("ADD+RMS_NORM [" + std::to_string(H) + ", " + std::to_string(T) + "]" + (T > 1 ? " prefill" : ""),
                  [&] { sc::op_add_rms_norm(ts, to, B.ctx); });
            if (T == 1) B.run("RMS_NORM [" + std::to_string(H) + ", 1] (final norm)", [&] { sc::op_rms_norm(to, B.ctx); });
        }

    // ---- per-head norms, RoPE, and the fused pair
    struct Heads {
        int64_t hd, nh;
        int     n_rot;
        float   theta;
        bool    zc;
        const char * what;
    };
    const Heads heads[] = {
        {128, 32, 128, 1e6f, false, "Qwen3 q"}, {128, 8, 128, 1e6f, false, "Qwen3 k"},
        {128, 4, 128, 1e6f, false, "Qwen3-30B-A3B k"}, {256, 16, 64, 1e7f, true, "Qwen3-Next q (zc, rot 64)"},
        {256, 2, 64, 1e7f, true, "Qwen3-Next k"},
    };
    for (const Heads & h : heads)
        for (int64_t T : {1, 512}) {
            if (T > 1 && h.nh < 32 && h.hd == 128) continue;
            float * x = dev_random(size_t(h.hd * h.nh * T), 2.0f), * w = dev_random(size_t(h.hd), 0.1f, h.zc ? 0.0f : 1.0f);
            float * n = dev_random(size_t(h.hd * h.nh * T)), * r = dev_random(size_t(h.hd * h.nh * T));
            std::vector<int32_t> pos(static_cast<size_t>(T));
            for (int64_t i = 0; i < T; ++i) pos[size_t(i)] = int32_t(T == 1 ? 4000 : i);
            int32_t * dpos = nullptr;
            CK(cudaMalloc(&dpos, size_t(T) * 4));
            CK(cudaMemcpy(dpos, pos.data(), size_t(T) * 4, cudaMemcpyHostToDevice));
            Tensor tx = tensor(DType::F32, {h.hd, h.nh, T}, x), tw = tensor(DType::F32, {h.hd}, w);
            Tensor tn = tensor(DType::F32, {h.hd, h.nh, T}, n), tr = tensor(DType::F32, {h.hd, h.nh, T}, r);
            Tensor tp = tensor(DType::I32, {T}, dpos);
            tn.op = Op::RMS_NORM, tn.src[0] = &tx, tn.src[1] = &tw, tn.fp[0] = 1e-6f, tn.ip[0] = h.zc ? 1 : 0;
            tr.op = Op::ROPE, tr.src[0] = &tn, tr.src[1] = &tp, tr.ip[0] = h.n_rot, tr.fp[0] = h.theta;
            const std::string shp = " [" + std::to_string(h.hd) + ", " + std::to_string(h.nh) + ", " + std::to_string(T) + "] " + h.what +
                                    (T > 1 ? " prefill" : "");
            B.run("RMS_NORM per head" + shp, [&] { sc::op_rms_norm(tn, B.ctx); });
            B.run("ROPE" + shp, [&] { sc::op_rope(tr, B.ctx); });
#ifndef BENCH_BASELINE
            B.run("RMS_NORM+ROPE fused" + shp, [&] { sc::op_rms_norm_rope(tn, tr, B.ctx); });
            if (T == 1) {  // fused vs the two ops (ulp-level: different sum-of-squares order)
                sc::op_rms_norm(tn, B.ctx);
                sc::op_rope(tr, B.ctx);
                std::vector<float> a(size_t(h.hd * h.nh)), b(a.size());
                CK(cudaStreamSynchronize(B.stream));
                CK(cudaMemcpy(a.data(), r, a.size() * 4, cudaMemcpyDeviceToHost));
                sc::op_rms_norm_rope(tn, tr, B.ctx);
                CK(cudaStreamSynchronize(B.stream));
                CK(cudaMemcpy(b.data(), r, b.size() * 4, cudaMemcpyDeviceToHost));
                double md = 0;
                for (size_t i = 0; i < a.size(); ++i) md = std::max(md, double(std::fabs(a[i] - b[i])) / (std::fabs(a[i]) + 1e-3));
                std::printf("    check: fused vs two ops, max rel diff %.2e\n", md);
            }
#endif
        }

    // ---- MoE routing and combine
    struct Route {
        int64_t E;
        int     k;
        bool    norm;
    };
    for (Route rc : {Route{128, 8, true}, Route{512, 10, true}, Route{64, 8, false}})
        for (int64_t T : {1, 512}) {
            if (T > 1 && rc.E != 128) continue;
            float * lg = dev_random(size_t(rc.E * T), 2.0f), * out = dev_random(size_t(2 * rc.k * T));
            Tensor  tl = tensor(DType::F32, {rc.E, T}, lg), to = tensor(DType::F32, {2 * rc.k, T}, out);
            to.op = Op::MOE_ROUTE, to.src[0] = &tl, to.ip[0] = rc.k, to.ip[1] = rc.norm ? 1 : 0;
            B.run("MOE_ROUTE E=" + std::to_string(rc.E) + " k=" + std::to_string(rc.k) + " T=" + std::to_string(T),
                  [&] { sc::op_moe_route(to, B.ctx); });
        }
    for (int k : {8, 10})
        for (int64_t T : {1, 512}) {
            if (T > 1 && k != 8) continue;
            const int64_t H = 2048;
            float *       y = dev_random(size_t(H * k * T)), * w = dev_random(size_t(2 * k * T)), * o = dev_random(size_t(H * T));
            Tensor        ty = tensor(DType::F32, {H, k, T}, y), to = tensor(DType::F32, {H, T}, o);
            Tensor        tw = tensor(DType::F32, {k, T}, w);
            tw.nb[1] = size_t(2 * k) * 4, tw.nb[2] = tw.nb[3] = tw.nb[1] * size_t(T);  // weights: a view of the route rows
            to.op = Op::MOE_COMBINE, to.src[0] = &ty, to.src[1] = &tw;
            B.run("MOE_COMBINE [2048, " + std::to_string(k) + ", " + std::to_string(T) + "]", [&] { sc::op_moe_combine(to, B.ctx); });
        }

    // ---- ARGMAX over the vocabulary
    for (int64_t T : {1, 4}) {
        const int64_t V = 151936;
        float *       x = dev_random(size_t(V * T));
        int32_t *     o = nullptr;
        CK(cudaMalloc(&o, size_t(T) * 4));
        Tensor tx = tensor(DType::F32, {V, T}, x), to = tensor(DType::I32, {T}, o);
        to.op = Op::ARGMAX, to.src[0] = &tx;
        B.run("ARGMAX [151936, " + std::to_string(T) + "]", [&] { sc::op_argmax(to, B.ctx); });
        std::vector<float> h(static_cast<size_t>(V));
        CK(cudaMemcpy(h.data(), x, size_t(V) * 4, cudaMemcpyDeviceToHost));
        int32_t got = -1;
        sc::op_argmax(to, B.ctx);
        CK(cudaStreamSynchronize(B.stream));
        CK(cudaMemcpy(&got, o, 4, cudaMemcpyDeviceToHost));
        const int32_t want = int32_t(std::max_element(h.begin(), h.end()) - h.begin());
        std::printf("    check: argmax %d, host %d %s\n", got, want, got == want ? "ok" : "MISMATCH");
    }
    return 0;
}
