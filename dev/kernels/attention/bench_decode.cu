// Decode-attention benchmark on a GPU: the production decode step (launch_attention: one fused
// launch that appends this step's k / v and merges the splits in-kernel) for real model shapes at
// contexts 64 .. 32K, replayed from a CUDA graph over enough layers' caches that L2 cannot hold
// them, with effective KV bandwidth; plus a check of one step against a CPU reference (double
// precision, f16 cache) and of the appended cache rows (bit-exact f16 of this step's k / v).
//
// Build and run (repository root; -arch for the GPU at hand):
//   nvcc -O3 -std=c++20 -arch=sm_90a --expt-relaxed-constexpr -Isrc -Iinclude dev/kernels/attention/bench_decode.cu \
//        src/backends/cuda/attention/attention_decode.cu src/backends/cuda/attention/attention_prefill.cu src/backends/cuda/common/launch.cpp -o /tmp/bench_decode \
//     && /tmp/bench_decode
// A/B switches (environment): SPARK_PDL=0 (no programmatic dependent launch),
// SPARK_ATTN_COMBINE=0 (splits merged by the separate combine kernel: two launches per step).
#include "backends/cuda/attention/attention.h"
#include "backends/cuda/cuda_common.h"
#include "quant/formats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <string>
#include <vector>

namespace spark::cuda {
void throw_cuda_error(cudaError_t err, const char * call, const char * file, int line) {
    std::fprintf(stderr, "CUDA error %s in %s at %s:%d\n", cudaGetErrorString(err), call, file, line);
    std::exit(1);
}
}  // namespace spark::cuda

using namespace spark::cuda;

namespace {

#define CK(x) SPARK_CUDA_CHECK(x)

using spark::f16_to_f32;
using spark::f32_to_f16;

struct Shape {
    const char * name;
    int          hd, n_head, n_kv;
};

struct Setup {
    int                     hd, n_head, n_kv, T, max_pages, n_pages, n_layers;
    std::vector<uint16_t *> kc, vc;
    float *                 q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr, *ws = nullptr;
    int32_t *               pos = nullptr, *seq = nullptr, *bt = nullptr;
    std::vector<int32_t>    h_bt, h_pos;
    std::vector<float>      h_k, h_v;
    attn::AttnPlan          plan;
    std::vector<attn::AttnParams> params;
};

void fill_random_f16(uint16_t * d, size_t n, uint32_t seed) {
    std::vector<uint16_t> h(n);
    std::mt19937          rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto & x : h) x = f32_to_f16(nd(rng));
    CK(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
}

Setup make(const Shape & s, int ctx, int T, int capacity, size_t l2_bytes, int sm_count) {
    Setup st;
    st.hd = s.hd;
    st.n_head = s.n_head;
    st.n_kv = s.n_kv;
    st.T = T;
    st.max_pages = capacity / 64;
    st.n_pages = (ctx + T + 63) / 64 + 1;
    const size_t cache_bytes = size_t(st.n_pages) * 64 * s.n_kv * s.hd * 2;
    st.n_layers = int(std::max<size_t>(2, (4 * l2_bytes) / (2 * cache_bytes) + 1));
    st.n_layers = std::min(st.n_layers, 48);
    for (int l = 0; l < st.n_layers; ++l) {
        uint16_t *a, *b;
        CK(cudaMalloc(&a, cache_bytes));
        CK(cudaMalloc(&b, cache_bytes));
        fill_random_f16(a, cache_bytes / 2, 11 + l);
        fill_random_f16(b, cache_bytes / 2, 1011 + l);
        st.kc.push_back(a);
        st.vc.push_back(b);
    }
    std::vector<float> h(size_t(T) * s.n_head * s.hd);
    std::mt19937       rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto & x : h) x = nd(rng);
    CK(cudaMalloc(&st.q, h.size() * 4));
    CK(cudaMemcpy(st.q, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    std::vector<float> hk(size_t(T) * s.n_kv * s.hd);
    for (auto & x : hk) x = nd(rng);
    CK(cudaMalloc(&st.k, hk.size() * 4));
    CK(cudaMemcpy(st.k, hk.data(), hk.size() * 4, cudaMemcpyHostToDevice));
    st.h_k = hk;
    for (auto & x : hk) x = nd(rng);
    CK(cudaMalloc(&st.v, hk.size() * 4));
    CK(cudaMemcpy(st.v, hk.data(), hk.size() * 4, cudaMemcpyHostToDevice));
    st.h_v = hk;
    CK(cudaMalloc(&st.out, h.size() * 4));
    std::vector<int32_t> hp(static_cast<size_t>(T)), hs(static_cast<size_t>(T), 0);
    for (int t = 0; t < T; ++t) hp[size_t(t)] = ctx - T + t;  // the last token sits at ctx - 1
    st.h_pos = hp;
    CK(cudaMalloc(&st.pos, T * 4));
    CK(cudaMalloc(&st.seq, T * 4));
    CK(cudaMemcpy(st.pos, hp.data(), T * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(st.seq, hs.data(), T * 4, cudaMemcpyHostToDevice));
    std::vector<int32_t> pages(static_cast<size_t>(st.n_pages));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    st.h_bt.assign(size_t(st.max_pages), -1);
    for (int p = 0; p < (ctx + 63) / 64; ++p) st.h_bt[size_t(p)] = pages[size_t(p)];
    if (T > ctx) std::fprintf(stderr, "bench: T=%d > ctx=%d\n", T, ctx), std::exit(1);
    CK(cudaMalloc(&st.bt, st.h_bt.size() * 4));
    CK(cudaMemcpy(st.bt, st.h_bt.data(), st.h_bt.size() * 4, cudaMemcpyHostToDevice));

    st.plan = attn::plan_attention(s.hd, T, s.n_head, s.n_kv, st.max_pages, 64, sm_count, attn::decode_blocks_per_sm(s.hd));
    if (st.plan.workspace_bytes) CK(cudaMalloc(&st.ws, st.plan.workspace_bytes));
    for (int l = 0; l < st.n_layers; ++l) {
        attn::AttnParams p;
        p.q = reinterpret_cast<const char *>(st.q);
        p.q_nb1 = int64_t(s.hd) * 4;
        p.q_nb2 = int64_t(s.n_head) * s.hd * 4;
        p.k = reinterpret_cast<const char *>(st.k);
        p.k_nb1 = int64_t(s.hd) * 4;
        p.k_nb2 = int64_t(s.n_kv) * s.hd * 4;
        p.v = reinterpret_cast<const char *>(st.v);
        p.v_nb1 = p.k_nb1;
        p.v_nb2 = p.k_nb2;
        p.k_cache = st.kc[size_t(l)];
        p.v_cache = st.vc[size_t(l)];
        p.pos = st.pos;
        p.seq = st.seq;
        p.block_table = st.bt;
        p.out = st.out;
        p.out_nb1 = int64_t(s.n_head) * s.hd * 4;
        p.n_tok = T;
        p.n_head = s.n_head;
        p.n_kv = s.n_kv;
        p.group = s.n_head / s.n_kv;
        p.head_dim = s.hd;
        p.page_size = 64;
        p.n_pages = st.n_pages;
        p.max_pages = st.max_pages;
        p.n_slots = 1;
        p.n_splits = st.plan.n_splits;
        p.scale_log2 = 1.4426950408889634f / std::sqrt(float(s.hd));
        p.part_o = st.ws;
        p.part_ml = st.ws ? st.ws + size_t(st.plan.n_splits) * T * s.n_head * s.hd : nullptr;
        st.params.push_back(p);
    }
    return st;
}

void destroy(Setup & st) {
    for (auto * p : st.kc) cudaFree(p);
    for (auto * p : st.vc) cudaFree(p);
    cudaFree(st.q);
    cudaFree(st.k);
    cudaFree(st.v);
    cudaFree(st.out);
    cudaFree(st.ws);
    cudaFree(st.pos);
    cudaFree(st.seq);
    cudaFree(st.bt);
}

// Checks layer 0's output of one step against a double-precision reference over the f16 cache.
double check(Setup & st, cudaStream_t stream) {
    const attn::AttnParams & p = st.params[0];
    attn::launch_attention(p, st.plan, stream);
    CK(cudaStreamSynchronize(stream));
    const int            hd = st.hd, H = st.n_head, KV = st.n_kv, T = st.T;
    const size_t         n_cache = size_t(st.n_pages) * 64 * KV * hd;
    std::vector<uint16_t> kc(n_cache), vc(n_cache);
    CK(cudaMemcpy(kc.data(), p.k_cache, n_cache * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(vc.data(), p.v_cache, n_cache * 2, cudaMemcpyDeviceToHost));
    std::vector<float> q(size_t(T) * H * hd), out(q.size());
    std::vector<int32_t> pos(static_cast<size_t>(T));
    CK(cudaMemcpy(q.data(), st.q, q.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(out.data(), st.out, out.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(pos.data(), st.pos, T * 4, cudaMemcpyDeviceToHost));
    // The appended rows: f16 (saturating, RNE) of this step's k / v, bit for bit.
    size_t bad = 0;
    for (int t = 0; t < T; ++t) {
        const int    ps = st.h_pos[size_t(t)];
        const size_t r  = (size_t(st.h_bt[size_t(ps / 64)]) * 64 + ps % 64) * KV * hd;
        for (int i = 0; i < KV * hd; ++i) {
            auto f16 = [](float x) { return f32_to_f16(std::fabs(x) > 65504.0f ? std::copysign(65504.0f, x) : x); };
            bad += kc[r + i] != f16(st.h_k[size_t(t) * KV * hd + i]);
            bad += vc[r + i] != f16(st.h_v[size_t(t) * KV * hd + i]);
        }
    }
    if (bad) std::printf("  CACHE MISMATCH: %zu appended values differ\n", bad);
    double num = 0, den = 0;
    const double scale = 1.0 / std::sqrt(double(hd));
    std::vector<double> sc;
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < H; ++h) {
            const int g = h / (H / KV), n = pos[size_t(t)] + 1;
            sc.assign(size_t(n), 0.0);
            double m = -INFINITY;
            for (int j = 0; j < n; ++j) {
                const size_t r = (size_t(st.h_bt[size_t(j / 64)]) * 64 + j % 64) * KV * hd + size_t(g) * hd;
                double       s = 0;
                for (int d = 0; d < hd; ++d) s += double(q[(size_t(t) * H + h) * hd + d]) * f16_to_f32(kc[r + d]);
                sc[size_t(j)] = s * scale;
                m             = std::max(m, sc[size_t(j)]);
            }
            double sum = 0;
            for (auto & s : sc) sum += (s = std::exp(s - m));
            for (int d = 0; d < hd; ++d) {
                double acc = 0;
                for (int j = 0; j < n; ++j)
                    acc += sc[size_t(j)] * f16_to_f32(vc[(size_t(st.h_bt[size_t(j / 64)]) * 64 + j % 64) * KV * hd + size_t(g) * hd + d]);
                const double ref = acc / sum, got = out[(size_t(t) * H + h) * hd + d];
                num += (got - ref) * (got - ref);
                den += ref * ref;
            }
        }
    return num / den;
}

}  // namespace

int main(int argc, char ** argv) {
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("%s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    // bench_decode [shape-substring [ctx,ctx,...]]: only the shapes whose name contains the string
    // (checks and timings), at those contexts.
    const std::string only = argc > 1 ? argv[1] : "";
    std::vector<int>  ctxs = {64, 128, 300, 1024, 2048, 8192, 16384, 32768};
    if (argc > 2) {
        ctxs.clear();
        for (const char * c = argv[2]; *c;) {
            ctxs.push_back(std::atoi(c));
            while (*c && *c != ',') ++c;
            if (*c == ',') ++c;
        }
    }

    const Shape shapes[] = {
        {"Qwen3-30B-A3B (hd128, 32/4)", 128, 32, 4},
        {"Qwen3-Next-80B (hd256, 16/2)", 256, 16, 2},
        {"Qwen3-8B (hd128, 32/8)", 128, 32, 8},
        {"MiniMax-M2 (hd128, 48/8)", 128, 48, 8},
        {"demo (hd64, 8/8)", 64, 8, 8},
    };
    // Correctness of one step per shape (contexts 8 (one split), 300 and 1000, T = 1 and 4).
    for (const Shape & s : shapes)
        for (int T : {1, 4})
            for (int ctx : {8, 300, 1000}) {
                if (std::string(s.name).find(only) == std::string::npos) continue;
                Setup st = make(s, ctx, T, ctx == 8 ? 128 : 32768, 0, prop.multiProcessorCount);
                std::printf("check %-30s T=%d ctx %4d: nmse %.2e (splits %d)\n", s.name, T, ctx, check(st, stream), st.plan.n_splits);
                destroy(st);
            }

    // BENCH_NR=1: the timings with the fused q / k norm + RoPE (a Qwen3 layer's decode kernel).
    const bool nr = std::getenv("BENCH_NR") && std::string(std::getenv("BENCH_NR")) == "1";
    std::printf("\n%-30s %3s %6s %6s %6s %9s %9s\n", "shape", "T", "ctx", "cap", "splits", "us/layer", "KV GB/s");
    for (const Shape & s : shapes)
        for (int T : {1, 4})
            for (int ctx : ctxs) {
                if (std::string(s.name).find(only) == std::string::npos) continue;
                const int capacity = 32768 + 64 * 8;
                Setup     st       = make(s, ctx, T, capacity, size_t(prop.l2CacheSize), prop.multiProcessorCount);
                const RopeFreqs freqs = rope_freqs(1e6f, s.hd);
                // One graph: every layer's step once, replayed.
                cudaGraph_t     g;
                cudaGraphExec_t ge;
                CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
                for (attn::AttnParams p : st.params) {
                    if (nr) p.norm_rope = {true, nullptr, nullptr, 1e-6f, false};  // (unweighted norms)
                    attn::launch_attention(p, st.plan, stream, nr ? &freqs : nullptr);
                }
                CK(cudaStreamEndCapture(stream, &g));
                CK(cudaGraphInstantiate(&ge, g, 0));
                for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, stream));
                cudaEvent_t e0, e1;
                CK(cudaEventCreate(&e0));
                CK(cudaEventCreate(&e1));
                const int reps = 20;
                CK(cudaEventRecord(e0, stream));
                for (int i = 0; i < reps; ++i) CK(cudaGraphLaunch(ge, stream));
                CK(cudaEventRecord(e1, stream));
                CK(cudaEventSynchronize(e1));
                float ms = 0;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                const double us    = 1000.0 * ms / (reps * st.n_layers);
                const double bytes = 2.0 * ctx * s.n_kv * s.hd * 2.0;  // K and V, f16
                std::printf("%-30s %3d %6d %6d %6d %9.2f %9.1f\n", s.name, T, ctx, capacity, st.plan.n_splits, us, bytes / us * 1e-3);
                CK(cudaGraphExecDestroy(ge));
                CK(cudaGraphDestroy(g));
                CK(cudaEventDestroy(e0));
                CK(cudaEventDestroy(e1));
                destroy(st);
            }
    return 0;
}
