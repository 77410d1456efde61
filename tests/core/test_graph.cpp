// The tensor core: graph building, views, the memory planner (reuse without clobbering live
// values), CPU op semantics on hand-checked cases, and the arch capability table.
#include "backends/backend.h"
#include "backends/cuda/common/arch.h"
#include "common/error.h"
#include "graph/graph.h"
#include "graph/planner.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

using namespace spark;

namespace {

// Runs a graph on the CPU backend with the given input values; returns the named output.
struct CpuRun {
    std::unique_ptr<Backend> be = make_cpu_backend(2);
    std::unique_ptr<Buffer>  arena;
    MemoryPlan               plan;
    void run(Graph & g, const std::vector<std::pair<Tensor *, std::vector<float>>> & inputs) {
        plan  = plan_memory(g);
        arena = be->alloc(plan.arena_bytes + 64);
        bind_memory(g, plan, arena->data());
        for (auto & [t, v] : inputs) std::memcpy(t->data, v.data(), v.size() * 4);
        be->compute(g);
    }
};

std::vector<float> values(const Tensor * t) {
    std::vector<float> v(static_cast<size_t>(t->nelements()));
    REQUIRE(t->is_contiguous());
    std::memcpy(v.data(), t->data, v.size() * 4);
    return v;
}

}  // namespace

TEST_CASE("planner: intermediates share memory once dead, live values are never overwritten") {
    Graph    g;
    Tensor * x   = g.input(DType::F32, {1024, 4}, "x");
    Tensor * cur = x;
    // A chain of 20 ops: only two or three values are live at a time.
    for (int i = 0; i < 20; ++i) cur = g.scale(cur, 1.0f + float(i) * 0.01f);
    Tensor * keep = g.add(cur, x);  // x must survive the whole chain
    g.mark_output(keep);
    MemoryPlan plan = plan_memory(g);
    CHECK(plan.arena_bytes < plan.naive_bytes / 4);

    CpuRun r;
    std::vector<float> in(4096);
    std::iota(in.begin(), in.end(), 0.0f);
    r.run(g, {{x, in}});
    auto  out    = values(keep);
    float factor = 1.0f;
    for (int i = 0; i < 20; ++i) factor *= 1.0f + float(i) * 0.01f;
    for (size_t i = 0; i < in.size(); i += 97) CHECK(out[i] == doctest::Approx(in[i] * factor + in[i]).epsilon(1e-5));
}

TEST_CASE("planner: the same graph always gets the same plan (CUDA-graph replay relies on it)") {
    auto build = [](Graph & g) {
        Tensor * a = g.input(DType::F32, {64, 8}, "a");
        Tensor * b = g.input(DType::F32, {64, 8}, "b");
        Tensor * c = g.swiglu(a, b);
        Tensor * d = g.rms_norm(g.add(c, a), nullptr, 1e-6f);
        g.mark_output(g.mul(d, b));
    };
    Graph g1, g2;
    build(g1);
    build(g2);
    MemoryPlan p1 = plan_memory(g1), p2 = plan_memory(g2);
    CHECK(p1.arena_bytes == p2.arena_bytes);
    CHECK(p1.offsets == p2.offsets);
}

TEST_CASE("planner: a launch of several nodes keeps every input of its nodes apart from its outputs") {
    // ADD, the RMS_NORM of its sum and a SCALE of the norm, as one backend launch would compute them
    // (the CUDA backend's ADD + RMS_NORM + matmuls: every block reads the addends while block 0
    // writes the sum and the norm). Alone, the norm's output reuses an addend's buffer (both die at
    // the ADD) and the scale's the other; as one launch, no output may meet an addend.
    Graph    g;
    Tensor * a   = g.input(DType::F32, {256, 1}, "a");
    Tensor * x   = g.scale(a, 2.0f);
    Tensor * y   = g.scale(a, 3.0f);
    Tensor * sum = g.add(x, y);
    Tensor * nrm = g.rms_norm(sum, nullptr, 1e-6f);
    Tensor * out = g.scale(nrm, 0.5f);
    g.mark_output(g.add(out, sum));
    auto span = [](const MemoryPlan & p, const Tensor * t) { return std::pair<size_t, size_t>{p.offsets[t->id], p.offsets[t->id] + t->nbytes()}; };
    auto meet = [&](const MemoryPlan & p, const Tensor * s, const Tensor * t) {
        const auto u = span(p, s), v = span(p, t);
        return u.first < v.second && v.first < u.second;
    };
    const MemoryPlan alone = plan_memory(g);
    CHECK((meet(alone, nrm, x) || meet(alone, nrm, y) || meet(alone, out, x) || meet(alone, out, y)));  // (what the hint prevents)
    std::vector<int> last(g.nodes().size(), -1);
    size_t           first = 0;
    while (g.nodes()[first] != sum) ++first;
    for (size_t i = first; i < first + 3; ++i) last[i] = int(first + 2);  // ADD, RMS_NORM, SCALE: one launch
    const MemoryPlan joined = plan_memory(g, 256, last);
    for (const Tensor * o : {sum, nrm, out})
        for (const Tensor * in : {x, y}) CHECK_FALSE(meet(joined, o, in));
    CHECK_FALSE(meet(joined, out, nrm));
    CHECK_FALSE(meet(joined, out, sum));
}

TEST_CASE("views: column slices and strided rows feed row ops; reshape requires contiguity") {
    Graph    g;
    Tensor * x    = g.input(DType::F32, {6, 2}, "x");  // two rows of [q0 q1 q2 | g0 g1 g2]
    Tensor * q    = g.view(x, {3, 2}, {4, 24}, 0);
    Tensor * gate = g.view(x, {3, 2}, {4, 24}, 12);
    Tensor * out  = g.mul_sigmoid(q, gate);
    g.mark_output(out);
    CHECK(!q->is_contiguous());
    CHECK_THROWS_AS(g.reshape(q, {6}), Error);
    CpuRun r;
    r.run(g, {{x, {1, 2, 3, 0, 100, -100, 4, 5, 6, 0, 0, 0}}});
    auto v = values(out);
    CHECK(v[0] == doctest::Approx(0.5f));
    CHECK(v[1] == doctest::Approx(2.0f));
    CHECK(v[2] == doctest::Approx(0.0f).epsilon(1e-6));
    CHECK(v[3] == doctest::Approx(2.0f));
}

TEST_CASE("cpu ops: rms_norm (plain and zero-centred), rope, moe_route, argmax by hand") {
    Graph    g;
    Tensor * x  = g.input(DType::F32, {4, 1}, "x");
    Tensor * w  = g.input(DType::F32, {4}, "w");
    Tensor * n1 = g.rms_norm(x, w, 0.0f, false);
    Tensor * n2 = g.rms_norm(x, w, 0.0f, true);
    Tensor * lg = g.input(DType::F32, {4, 1}, "logits");
    Tensor * rt = g.moe_route(lg, 2, true);
    Tensor * am = g.argmax(lg);
    for (Tensor * t : {n1, n2, rt, am}) g.mark_output(t);
    CpuRun r;
    r.run(g, {{x, {1, -1, 1, -1}}, {w, {1, 2, 3, 4}}, {lg, {0.0f, 2.0f, 1.0f, 2.0f}}});
    CHECK(values(n1) == std::vector<float>{1, -2, 3, -4});  // rms of +-1 is 1
    CHECK(values(n2) == std::vector<float>{2, -3, 4, -5});
    const float * route = static_cast<const float *>(rt->data);
    int32_t ids[2];
    std::memcpy(ids, route + 2, 8);
    CHECK(ids[0] == 1);  // tie between experts 1 and 3: the lower id first
    CHECK(ids[1] == 3);
    CHECK(route[0] == doctest::Approx(0.5f));
    CHECK(route[1] == doctest::Approx(0.5f));
    CHECK(*static_cast<const int32_t *>(am->data) == 1);  // first index of the maximum
}

TEST_CASE("cpu ops: rope rotates pairs (i, i + n_rot/2) by pos * theta^(-2i/n_rot)") {
    Graph    g;
    Tensor * x   = g.input(DType::F32, {4, 1, 1}, "x");
    Tensor * pos = g.input(DType::I32, {1}, "pos");
    Tensor * y   = g.rope(x, pos, 4, 100.0f);
    g.mark_output(y);
    CpuRun r;
    int32_t p = 3;
    std::vector<float> pv(1);
    std::memcpy(pv.data(), &p, 4);
    r.run(g, {{x, {1, 0, 0, 1}}, {pos, pv}});
    auto v = values(y);
    // pair (0, 2): angle 3; pair (1, 3): angle 3 / 10
    CHECK(v[0] == doctest::Approx(std::cos(3.0f)));
    CHECK(v[2] == doctest::Approx(std::sin(3.0f)));
    CHECK(v[1] == doctest::Approx(-std::sin(0.3f)));
    CHECK(v[3] == doctest::Approx(std::cos(0.3f)));
}

TEST_CASE("arch capabilities are ranges: sm_121 takes the sm_120 paths, below 8.0 is refused") {
    using namespace spark::cuda;
    CHECK(!cc_supported(750));
    CHECK(cc_supported(800));
    CHECK(cc_supported(1210));
    CHECK(!cc_has_fp8_mma(860));
    CHECK(cc_has_fp8_mma(890));
    CHECK(cc_is_hopper(900));
    CHECK(!cc_is_hopper(1200));
    CHECK(cc_has_fp4_mma_sync(1200));
    CHECK(cc_has_fp4_mma_sync(1210));  // DGX Spark
    CHECK(!cc_has_fp4_mma_sync(1000));
    CHECK(!cc_has_fp4_mma_sync(1300));
}
