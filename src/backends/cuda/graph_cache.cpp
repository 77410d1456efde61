#include "backends/cuda/graph_cache.h"

#include "backends/cuda/device_weight.h"
#include "backends/cuda/matmul/tuning.h"

#include <cstdlib>
#include <string>

namespace spark::cuda {

namespace {

// SPARK_CUDA_GRAPHS=0: every step runs as plain launches (docs/ENVIRONMENT.md).
bool graphs_env_enabled() {
    static const bool enabled = [] {
        const char * e = std::getenv("SPARK_CUDA_GRAPHS");
        return !(e && std::string(e) == "0");
    }();
    return enabled;
}

}  // namespace

GraphCache::GraphCache(cudaStream_t stream, bool enabled, ExpertTableLookup tables, void * tables_owner)
    : stream_(stream), enabled_(enabled && graphs_env_enabled()), tables_(tables), tables_owner_(tables_owner) {}

GraphCache::~GraphCache() {
    for (auto & s : steps_)
        if (s.exec) cudaGraphExecDestroy(s.exec);
}

void GraphCache::invalidate() {
    for (auto & s : steps_)
        if (s.exec) {
            cudaGraphExecDestroy(s.exec);
            s.exec = nullptr;
        }
}

GraphCache::Step & GraphCache::find(const Graph & graph) {
    // A graph computed again unchanged (the context reuses decode-step graphs) keeps its
    // fingerprint; several graphs alternate (a target's verify step and its draft's steps).
    auto known = fingerprints_.find(graph.uid());
    if (known == fingerprints_.end() || known->second.first != graph.generation()) {
        if (fingerprints_.size() >= 64) fingerprints_.clear();
        known = fingerprints_.insert_or_assign(graph.uid(), std::make_pair(graph.generation(), fingerprint(graph))).first;
    }
    const uint64_t fp = known->second.second;
    for (auto it = steps_.begin(); it != steps_.end(); ++it)
        if (it->fingerprint == fp) {
            steps_.splice(steps_.begin(), steps_, it);  // most recent first
            return steps_.front();
        }
    steps_.push_front(Step{fp, 0, nullptr});
    while (steps_.size() > kMaxSteps) {
        if (steps_.back().exec) cudaGraphExecDestroy(steps_.back().exec);
        steps_.pop_back();
    }
    return steps_.front();
}

bool GraphCache::replay(Step & step) {
    if (!step.exec) return false;
    SPARK_CUDA_CHECK(cudaGraphLaunch(step.exec, stream_));
    return true;
}

// The first run of a step is eager: it sizes the workspace (and builds expert tables) for its shapes.
bool GraphCache::capture_now(Step & step) { return ++step.seen >= 2 && enabled_; }

void GraphCache::begin_capture() {
    capturing_ = true;
    const cudaError_t err = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
    if (err != cudaSuccess) capturing_ = false;
    SPARK_CUDA_CHECK(err);
}

void GraphCache::abort_capture() {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream_, &g);
    if (g) cudaGraphDestroy(g);
    capturing_ = false;
}

void GraphCache::end_capture(Step & step) {
    cudaGraph_t       g   = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &g);
    capturing_            = false;
    SPARK_CUDA_CHECK(end);
    cudaGraphExec_t exec = nullptr;
    cudaError_t     err  = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    SPARK_CUDA_CHECK(err);
    step.exec = exec;
    SPARK_CUDA_CHECK(cudaGraphLaunch(step.exec, stream_));
}

// FNV-1a over everything a captured launch depends on.
uint64_t GraphCache::fingerprint(const Graph & graph) {
    uint64_t h   = 1469598103934665603ull;
    auto     mix = [&](const void * p, size_t n) {
        const auto * b = static_cast<const unsigned char *>(p);
        for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    };
    for (const Tensor & t : graph.tensors()) {
        mix(&t.op, sizeof t.op);
        mix(&t.type, sizeof t.type);
        mix(t.ne, sizeof t.ne);
        mix(t.nb, sizeof t.nb);
        mix(&t.data, sizeof t.data);
        mix(t.ip, sizeof t.ip);
        mix(t.fp, sizeof t.fp);
        // Weights by their device pointers, not by the address of the host struct (which a later,
        // different weight may reuse).
        // The whole DeviceWeight: format, shape and layout choose the kernels a step captures.
        if (t.weight) mix(t.weight->device_layout, sizeof(DeviceWeight));
        if (t.experts) {
            const void * table = tables_(tables_owner_, t.experts, t.n_experts);
            mix(&table, sizeof table);
            // No table yet: the step must run eagerly (tables are built outside capture). A
            // fresh value keeps it from matching an earlier step whose expert set was also
            // unbuilt at this point (e.g. another set at the same host address since).
            if (!table) {
                const uint64_t fresh = ++unbuilt_table_steps_;
                mix(&fresh, sizeof fresh);
            }
            // (The first expert this device holds: expert parallelism leaves the others empty.)
            if (const QWeight * held = first_held_expert(t.experts, t.n_experts)) mix(held->device_layout, sizeof(DeviceWeight));
        }
        for (const Tensor * s : t.src) {
            const int32_t id = s ? s->id : -1;
            mix(&id, sizeof id);
        }
    }
    // A captured collective (ALL_REDUCE) is the communicator's, with its arguments (NCCL's graph nodes).
    const void * comm = graph.comm();
    mix(&comm, sizeof comm);
    // The matmul test / lab knobs choose kernels too (a test that forces another path on the
    // same graph must not replay the launches captured before).
    mix(&mm::overrides(), sizeof(mm::Overrides));
    const bool prompt = graph.prompt_step();  // (chooses kernels: W4A4)
    mix(&prompt, sizeof prompt);
    return h;
}

}  // namespace spark::cuda
