// The ops of a model split over ranks (docs/DISTRIBUTED.md) on the CUDA backend, with one GPU:
//   SUM_SQR and RMS_NORM of split rows (src3: the rows' sums of squares over every rank,
//   Graph::rms_norm_split) against the CPU backend, also where the dispatch's fusion passes would
//   otherwise take the norm (an ADD before it, a ROPE after it);
//   ALL_REDUCE through communicators defined here: a one-rank group (the sum of one rank is its own
//   data: the harness compares the CPU and CUDA graphs, MiniMax-M2's whole-projection norm), and a
//   scripted rank 0 of two, whose all-reduce records what the buffer held when it ran and writes a
//   given sum, both as copies on the stream it was given: the backend must have copied src0 into
//   the output before (stream order), the kernels after it must read the sum, and all of it must
//   hold in a step captured into a CUDA graph and replayed (where the host calls no communicator).
//
// Tolerances: kF32 = 1e-12 as in test_elementwise.cpp (float32 sums of squares on the GPU, the
// CPU's double ones; an indexing or width mistake is nmse >= 1e-3); the scripted all-reduce's
// copies and the ADD / SCALE after it are compared bit for bit.
#include "op_harness.h"

#include "backends/comm.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/fusion.h"
#include "common/error.h"
#include "graph/graph.h"
#include "graph/planner.h"

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace test;
using spark::Graph;

namespace {

constexpr double kF32 = 1e-12;

std::string shape_name(const char * op, int64_t n, int64_t rows) {
    return std::string(op) + " [" + std::to_string(n) + ", " + std::to_string(rows) + "]";
}

// A group of one rank: the sum over the ranks is the rank's own data, on the host (CPU backend) or
// on the device (CUDA: the stream it is given) alike. Records the calls.
class OneRank final : public spark::Communicator {
public:
    int  rank() const override { return 0; }
    int  size() const override { return 1; }
    void set_stream(void * s) override { stream = s; }
    void all_reduce_sum(float *, size_t n) override {
        ++calls;
        last_n = n;
    }
    void all_gather(const float *, float *, size_t) override { spark::fail(SPARK_ERR_INTERNAL, "test: all_gather"); }
    void all_to_all(const float *, float *, size_t) override { spark::fail(SPARK_ERR_INTERNAL, "test: all_to_all"); }
    void abort(const char *) override {}

    int    calls  = 0;
    size_t last_n = 0;
    void * stream = nullptr;
};

std::vector<float> normals(size_t count, float scale, uint64_t seed) {
    std::mt19937_64                 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float>              v(count);
    for (float & x : v) x = d(rng) * scale;
    return v;
}

bool cuda_graphs_enabled() {  // (cuda_backend.cpp: off with SPARK_CUDA_GRAPHS=0 and under the op profiler)
    const char * g = std::getenv("SPARK_CUDA_GRAPHS");
    const char * p = std::getenv("SPARK_PROFILE_OPS");
    return !(g && std::string(g) == "0") && !(p && *p && *p != '0');
}

}  // namespace

TEST_CASE("split: SUM_SQR against the CPU") {
    OpHarness h(41);
    h.set_replay_check(true);
    for (const int64_t rows : {int64_t(1), int64_t(7), int64_t(512)})
        for (const int64_t n : {int64_t(64), int64_t(127), int64_t(1000), int64_t(3072), int64_t(6144), int64_t(20000)}) {
            if (n == 20000 && rows == 512) continue;
            h.check(shape_name("sum_sqr", n, rows), kF32, [&](OpBuilder & b) { return b.graph().sum_sqr(b.input({n, rows}, 2.0f), 1.0f); });
        }
    for (const int64_t rows : {int64_t(1), int64_t(7)}) {
        // A replica rank adds nothing (graph_builders.cpp: whole_norm): scale 0 writes zeros.
        h.check(shape_name("sum_sqr scale 0", 3072, rows), 0.0, [&](OpBuilder & b) { return b.graph().sum_sqr(b.input({3072, rows}), 0.0f); });
        h.check(shape_name("sum_sqr scale 0.5", 1000, rows), kF32, [&](OpBuilder & b) { return b.graph().sum_sqr(b.input({1000, rows}), 0.5f); });
        // Per-head rows of a strided view (q heads of a fused qkv), and misaligned rows.
        h.check(shape_name("sum_sqr q heads of qkv", 128, rows), kF32, [&](OpBuilder & b) {
            Tensor * qkv = b.input({128 * (16 + 2 * 4), rows});
            Graph &  g   = b.graph();
            return g.sum_sqr(g.view(qkv, {128, 16, rows}, {4, 128 * 4, qkv->nb[1]}, 0), 1.0f);
        });
        h.check(shape_name("sum_sqr misaligned", 127, rows), kF32, [&](OpBuilder & b) {
            Tensor * x = b.input({128, 4, rows});
            return b.graph().sum_sqr(b.graph().view(x, {127, 4, rows}, {4, x->nb[1], x->nb[2]}, 4), 1.0f);
        });
    }
}

TEST_CASE("split: RMS_NORM of rows split over ranks (given sums of squares) against the CPU") {
    // A whole row X [3n] of which this rank holds columns [n, 2n) (a strided view); the sums over
    // every rank are SUM_SQR of X (what the all-reduce of the ranks' parts gives). n = 127: rows at
    // an odd offset (the scalar kernels); 6144 and 20000: one row per block, the streaming kernel.
    OpHarness h(42);
    h.set_replay_check(true);
    for (const int64_t rows : {int64_t(1), int64_t(7), int64_t(512)})
        for (const int64_t n : {int64_t(128), int64_t(127), int64_t(1000), int64_t(3072), int64_t(6144), int64_t(20000)})
            for (const bool zc : {false, true}) {
                if (n >= 6144 && rows == 512) continue;
                h.check(shape_name(zc ? "rms_norm_split zero-centred" : "rms_norm_split", n, rows), kF32, [&](OpBuilder & b) {
                    Graph &  g    = b.graph();
                    Tensor * X    = b.input({3 * n, rows}, 2.0f);
                    Tensor * x    = g.view(X, {n, rows}, {4, X->nb[1]}, size_t(n) * 4);
                    Tensor * sums = g.sum_sqr(X, 1.0f);
                    return g.rms_norm_split(x, b.param({n}, 0.1f, zc ? 0.0f : 1.0f), sums, 3 * n, 1e-6f, zc);
                });
            }
    // No weight; the sums as a strided view (every other float of a [2, rows] tensor).
    for (const int64_t rows : {int64_t(1), int64_t(7)})
        h.check(shape_name("rms_norm_split no weight, strided sums", 1024, rows), kF32, [&](OpBuilder & b) {
            Graph &  g    = b.graph();
            Tensor * s2   = b.param({2, rows}, 100.0f, 4096.0f);  // ~N(4096, 100^2): positive
            Tensor * sums = g.view(s2, {1, rows}, {4, s2->nb[1]}, 4);
            return g.rms_norm_split(b.input({1024, rows}), nullptr, sums, 4096, 1e-6f, false);
        });
}

TEST_CASE("split: a split RMS_NORM is not fused with the ADD before it or the ROPE after it") {
    // The dispatch fuses ADD + RMS_NORM of its sum and a per-head RMS_NORM + its ROPE (fusion.h);
    // their kernels sum the rows themselves, which a split norm must not: the pass leaves such norms
    // alone (and the fused launchers fall back). Either way the CPU's unfused ops are the reference.
    OpHarness h(43);
    h.set_replay_check(true);
    for (const int64_t rows : {int64_t(1), int64_t(7), int64_t(512)}) {
        h.check_multi(shape_name("add -> rms_norm_split", 2048, rows), kF32, [&](OpBuilder & b) {
            // (The sums first: the ADD node directly before the norm, as the fusion pass pairs them.)
            Graph &  g    = b.graph();
            Tensor * sums = g.sum_sqr(b.input({4096, rows}), 1.0f);  // (another part of the row: not s's)
            Tensor * s    = g.add(b.input({2048, rows}), b.input({2048, rows}));
            return std::vector<Tensor *>{s, g.rms_norm_split(s, b.param({2048}, 0.1f, 1.0f), sums, 4096, 1e-6f, false)};
        });
        std::vector<int32_t> pos(static_cast<size_t>(rows));
        for (int64_t i = 0; i < rows; ++i) pos[size_t(i)] = int32_t(rows == 1 ? 31999 : i * 61 % 40000);
        for (const bool pair : {false, true})  // one norm + rope, or the q / k pair (one launch when fused)
            h.check_multi(shape_name(pair ? "rms_norm_split -> rope, q and k" : "rms_norm_split -> rope", 128, rows), kF32,
                          [&](OpBuilder & b) {
                              Graph &                g = b.graph();
                              std::vector<Tensor *>  out;
                              Tensor *               p = b.input_i32({rows}, pos);
                              for (int i = 0; i < (pair ? 2 : 1); ++i) {
                                  const int64_t nh   = i == 0 ? 8 : 2;
                                  Tensor *      sums = b.param({1, nh * rows}, 20.0f, 512.0f);  // over 2 x 128 elements, positive
                                  Tensor *      nrm  = g.rms_norm_split(b.input({128, nh, rows}, 2.0f), b.param({128}, 0.1f, 1.0f), sums,
                                                                        256, 1e-6f, false);
                                  out.push_back(g.rope(nrm, p, 128, 1e6f));
                              }
                              return out;
                          });
    }
}

TEST_CASE("split: the fusion pass launches split norms and collectives alone") {
    // (Host code: the launches the dispatch would make, without running them.)
    using Kind = spark::cuda::FusedLaunch::Kind;
    const int64_t T = 3;
    Graph         g;
    Tensor *      x     = g.input(DType::F32, {256, T}, "x");
    Tensor *      r     = g.input(DType::F32, {256, T}, "r");
    Tensor *      sums  = g.input(DType::F32, {1, T}, "sums");
    Tensor *      q     = g.input(DType::F32, {128, 4, T}, "q");
    Tensor *      qsums = g.input(DType::F32, {1, 4 * T}, "q sums");
    Tensor *      pos   = g.input(DType::I32, {T}, "pos");
    Tensor *      n1    = g.rms_norm_split(g.add(x, r), nullptr, sums, 512, 1e-6f, false);  // ADD, split norm: two launches
    Tensor *      a     = g.all_reduce(n1);                                                  // alone
    Tensor *      n2    = g.rms_norm(g.add(a, r), nullptr, 1e-6f);                           // ADD + RMS_NORM after it: fused
    Tensor *      rq    = g.rope(g.rms_norm_split(q, nullptr, qsums, 256, 1e-6f, false), pos, 128, 1e6f);  // two launches
    Tensor *      rk    = g.rope(g.rms_norm(q, nullptr, 1e-6f), pos, 128, 1e6f);                          // fused
    for (Tensor * t : {n2, rq, rk}) g.mark_output(t);
    spark::cuda::OpContext   ctx;
    spark::cuda::FusionPass  pass(g, ctx);
    std::vector<std::string> got;
    for (spark::cuda::FusedLaunch l; pass.next(l);) {
        std::string s = l.kind == Kind::Node ? spark::op_name(l.nodes[0]->op) : l.label ? l.label : "?";
        got.push_back(s);
    }
    const std::vector<std::string> want = {"ADD", "RMS_NORM", "ALL_REDUCE", "ADD+RMS_NORM", "RMS_NORM", "ROPE", "RMS_NORM+ROPE"};
    CHECK(got == want);
}

TEST_CASE("split: ALL_REDUCE of a one-rank group in the graph (MiniMax-M2 whole-projection q norm)") {
    // graph_builders.cpp's whole_norm: the rank's part of each row, its sums of squares all-reduced,
    // the norm of the split rows; then the o projection's partial sum all-reduced and the residual
    // added (the ADD after the collective: the launch that must not overlap it). One rank: the CPU
    // and CUDA graphs compute the same; each communicator call sees the whole tensor.
    OneRank comm;
    OpHarness h(44);
    h.set_replay_check(true);
    for (const int64_t rows : {int64_t(1), int64_t(7), int64_t(512)}) {
        comm.calls = 0;
        h.check_multi(shape_name("sum_sqr -> all_reduce -> rms_norm_split; all_reduce -> add", 3072, rows), kF32, [&](OpBuilder & b) {
            Graph & g = b.graph();
            g.set_comm(&comm);
            Tensor * q    = b.input({3072, rows}, 2.0f);
            Tensor * sums = g.all_reduce(g.sum_sqr(q, 1.0f));
            Tensor * qn   = g.rms_norm_split(q, b.param({3072}, 0.1f, 1.0f), sums, 6144, 1e-6f, false);
            Tensor * o    = g.all_reduce(g.scale(qn, 0.5f));
            return std::vector<Tensor *>{sums, qn, g.add(o, b.input({3072, rows}))};
        });
        // Two calls per run: the CPU graph's, the CUDA graph's first (eager) run and its capture (the
        // replay calls nothing), each of [1, rows] and [3072, rows].
        CHECK(comm.calls == 2 * (cuda_graphs_enabled() ? 3 : 4));
        CHECK(comm.stream != nullptr);
    }
}

namespace {

// Rank 0 of a group of two whose other rank is scripted. all_reduce_sum(data, n), on the stream it
// is given, copies data to seen[call] (what the collective found: the output holding src0) and then
// sum[call] (the test's x + the other rank's part) over data. Calls count per step modulo
// `per_step`. Device buffers; the stream is the backend's (it must be set before each call).
class ScriptedRank final : public spark::Communicator {
public:
    ScriptedRank(int per_step, size_t max_n) : per_step_(per_step), max_n_(max_n) {
        for (int i = 0; i < per_step; ++i) {
            float * p = nullptr;
            REQUIRE(cudaMalloc(&p, 2 * max_n * 4) == cudaSuccess);
            bufs_.push_back(p);
        }
    }
    ~ScriptedRank() override {
        for (float * p : bufs_) cudaFree(p);
    }
    int  rank() const override { return 0; }
    int  size() const override { return 2; }
    void set_stream(void * s) override { stream_ = static_cast<cudaStream_t>(s); }
    void all_reduce_sum(float * data, size_t n) override {
        const int i = calls % per_step_;
        ++calls;
        ns.push_back(n);
        streams.push_back(stream_);
        cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        if (stream_) cudaStreamIsCapturing(stream_, &st);
        captured.push_back(st == cudaStreamCaptureStatusActive);
        if (!stream_ || n > max_n_) spark::fail(SPARK_ERR_INTERNAL, "test: all_reduce_sum without a stream or too large");
        // (Errors throw: the backend's capture is then aborted, and the test fails on the call below.)
        if (cudaMemcpyAsync(seen(i), data, n * 4, cudaMemcpyDeviceToDevice, stream_) != cudaSuccess ||
            cudaMemcpyAsync(data, sum(i), n * 4, cudaMemcpyDeviceToDevice, stream_) != cudaSuccess)
            spark::fail(SPARK_ERR_DEVICE, "test: scripted all_reduce_sum: %s", cudaGetErrorString(cudaGetLastError()));
    }
    void all_gather(const float *, float *, size_t) override { spark::fail(SPARK_ERR_INTERNAL, "test: all_gather"); }
    void all_to_all(const float *, float *, size_t) override { spark::fail(SPARK_ERR_INTERNAL, "test: all_to_all"); }
    void abort(const char *) override {}

    float * seen(int i) { return bufs_[size_t(i)]; }
    float * sum(int i) { return bufs_[size_t(i)] + max_n_; }

    int                  calls = 0;
    std::vector<size_t>  ns;
    std::vector<void *>  streams;
    std::vector<bool>    captured;  // the stream was capturing a CUDA graph during the call

private:
    int                  per_step_;
    size_t               max_n_;
    cudaStream_t         stream_ = nullptr;
    std::vector<float *> bufs_;
};

}  // namespace

TEST_CASE("split: ALL_REDUCE copies src0, then calls the communicator on the backend's stream (eager, captured, replayed)") {
    // A step with two collectives: the attention output's partial sum (then the residual ADD and the
    // next norm: the fused ADD + RMS_NORM launch right after the collective, without PDL) and the
    // norm's output (then a SCALE). Each run has new inputs and new scripted sums.
    const int64_t n = 2048, rows = 3;
    const size_t  count = size_t(n * rows);
    auto          be    = spark::make_cuda_backend(0);
    ScriptedRank  comm(2, count);
    Graph         g;
    g.set_comm(&comm);
    Tensor * x  = g.input(DType::F32, {n, rows}, "x");  // this rank's partial o projection
    Tensor * r  = g.input(DType::F32, {n, rows}, "residual");
    Tensor * w  = g.input(DType::F32, {n}, "norm weight");
    Tensor * a  = g.all_reduce(x);
    Tensor * s  = g.add(a, r);
    Tensor * y  = g.rms_norm(s, w, 1e-6f);
    Tensor * z  = g.scale(g.all_reduce(y), 2.0f);
    for (Tensor * t : {a, s, y, z}) g.mark_output(t);
    const spark::MemoryPlan plan  = spark::plan_memory(g);
    auto                    arena = be->alloc(std::max<size_t>(plan.arena_bytes, 256));
    spark::bind_memory(g, plan, arena->data());
    std::vector<float> wh = normals(size_t(n), 0.1f, 5);
    for (float & v : wh) v += 1.0f;

    const bool graphs = cuda_graphs_enabled();
    auto       down   = [&](const void * p, size_t cnt) {
        std::vector<float> v(cnt);
        be->download(v.data(), p, cnt * 4);
        return v;
    };
    for (int run = 0; run < 3; ++run) {
        INFO("run " << run << (run == 0 ? " (eager)" : run == 1 ? " (captured)" : " (replayed)"));
        const std::vector<float> xh = normals(count, 1.0f, 10 + uint64_t(run)), rh = normals(count, 1.0f, 20 + uint64_t(run));
        const std::vector<float> peer = normals(count, 1.0f, 30 + uint64_t(run)), sum1 = normals(count, 3.0f, 40 + uint64_t(run));
        std::vector<float>       sum0(count);
        for (size_t i = 0; i < count; ++i) sum0[i] = xh[i] + peer[i];
        be->upload(x->data, xh.data(), count * 4);
        be->upload(r->data, rh.data(), count * 4);
        be->upload(w->data, wh.data(), size_t(n) * 4);
        be->upload(comm.sum(0), sum0.data(), count * 4);
        be->upload(comm.sum(1), sum1.data(), count * 4);
        const int calls_before = comm.calls;
        be->compute(g);
        be->synchronize();

        // The host calls the communicator in the eager run and while capturing; a replay calls nothing.
        const bool calls_expected = !graphs || run < 2;
        CHECK(comm.calls - calls_before == (calls_expected ? 2 : 0));
        for (int c = calls_before; c < comm.calls; ++c) {
            CHECK(comm.ns[size_t(c)] == count);
            REQUIRE(comm.streams[size_t(c)] != nullptr);
            unsigned flags = 0;
            CHECK(cudaStreamGetFlags(static_cast<cudaStream_t>(comm.streams[size_t(c)]), &flags) == cudaSuccess);
            CHECK((flags & cudaStreamNonBlocking) != 0);  // the backend's stream, not the legacy default stream
            CHECK(comm.captured[size_t(c)] == (graphs && run == 1));
            CHECK(comm.streams[size_t(c)] == comm.streams[0]);
        }
        // The collective found src0 in the output (copied before it, in stream order) ...
        CHECK(down(comm.seen(0), count) == xh);
        // ... and what comes after it reads the sum: the ALL_REDUCE output, the ADD (bit for bit) ...
        CHECK(down(a->data, count) == sum0);
        const std::vector<float> sh = down(s->data, count);
        std::vector<float>       s_ref(count);
        for (size_t i = 0; i < count; ++i) s_ref[i] = sum0[i] + rh[i];
        CHECK(sh == s_ref);
        // ... the norm of the sum (the CPU backend's expression, double sum of squares) ...
        const std::vector<float> yh = down(y->data, count);
        double                   num = 0.0, den = 0.0;
        for (int64_t row = 0; row < rows; ++row) {
            double ss = 0.0;
            for (int64_t i = 0; i < n; ++i) ss += double(s_ref[size_t(row * n + i)]) * s_ref[size_t(row * n + i)];
            const float inv = 1.0f / std::sqrt(float(ss / double(n)) + 1e-6f);
            for (int64_t i = 0; i < n; ++i) {
                const float  ref = s_ref[size_t(row * n + i)] * inv * wh[size_t(i)];
                const double d   = double(yh[size_t(row * n + i)]) - ref;
                num += d * d;
                den += double(ref) * ref;
            }
        }
        INFO("norm nmse " << num / den);
        CHECK(num / den <= kF32);
        // ... and the second collective found the norm's output, and the SCALE after it its sum.
        CHECK(down(comm.seen(1), count) == yh);
        const std::vector<float> zh = down(z->data, count);
        std::vector<float>       z_ref(count);
        for (size_t i = 0; i < count; ++i) z_ref[i] = sum1[i] * 2.0f;
        CHECK(zh == z_ref);
    }
}

TEST_CASE("split: ALL_REDUCE without a communicator is an error") {
    auto  be = spark::make_cuda_backend(0);
    Graph g;
    Tensor * x = g.input(DType::F32, {64, 2}, "x");
    g.mark_output(g.all_reduce(x));
    const spark::MemoryPlan plan  = spark::plan_memory(g);
    auto                    arena = be->alloc(std::max<size_t>(plan.arena_bytes, 256));
    spark::bind_memory(g, plan, arena->data());
    CHECK_THROWS_AS(be->compute(g), spark::Error);
}
