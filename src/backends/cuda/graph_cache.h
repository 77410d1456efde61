// CUDA-graph replay of the steps that repeat (batch-1 decode, small verify batches, draft steps).
//
// A step is keyed by a fingerprint of everything its launches depend on (ops, shapes, strides, data
// pointers, parameters, the weights' device layouts, expert tables, the matmul overrides). The
// first time a fingerprint is seen the step runs eagerly (the workspace may grow); the second time
// it is captured into a CUDA graph and launched; afterwards it is replayed. Everything that changes
// between decode steps (token ids, positions, block tables) is device data uploaded before the
// launch, so the captured kernels see the new step without re-capture.
#pragma once

#include "backends/cuda/cuda_common.h"
#include "graph/graph.h"
#include "quant/qweight.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <list>
#include <unordered_map>
#include <utility>

namespace spark::cuda {

class GraphCache {
public:
    // The device table of an expert set when it is built, else nullptr (ops.h: OpContext::expert_table;
    // tables are built outside capture, by the eager run).
    using ExpertTableLookup = const void * (*)(void * owner, const QWeight * experts, int32_t n);

    // `enabled`: capture at all (off: every step runs eagerly; also with SPARK_CUDA_GRAPHS=0).
    GraphCache(cudaStream_t stream, bool enabled, ExpertTableLookup tables, void * tables_owner);
    ~GraphCache();
    GraphCache(const GraphCache &)             = delete;
    GraphCache & operator=(const GraphCache &) = delete;

    // What run() did: the step's fingerprint, and whether its launches were a replay of a captured
    // graph (else they ran eagerly, or were captured and then launched once).
    struct Ran {
        uint64_t fingerprint;
        bool     replayed;
    };

    // Runs the step `graph` computes: replays its captured graph, or calls launch() to enqueue its
    // kernels on the stream, eagerly or under capture.
    template <class Launch>
    Ran run(const Graph & graph, Launch && launch) {
        Step & step = find(graph);
        if (replay(step)) return {step.fingerprint, true};
        if (!capture_now(step)) {
            launch();
            return {step.fingerprint, false};
        }
        begin_capture();
        try {
            launch();
        } catch (...) {
            abort_capture();
            throw;
        }
        end_capture(step);
        return {step.fingerprint, false};
    }

    // Whether a capture is under way (nothing may allocate or synchronise).
    bool capturing() const { return capturing_; }
    // Drops every captured graph (the workspace they captured moved).
    void invalidate();

private:
    struct Step {
        uint64_t        fingerprint = 0;
        int             seen        = 0;
        cudaGraphExec_t exec        = nullptr;
    };

    Step &   find(const Graph & graph);
    bool     replay(Step & step);
    bool     capture_now(Step & step);
    void     begin_capture();
    void     abort_capture();
    void     end_capture(Step & step);
    uint64_t fingerprint(const Graph & graph);

    static constexpr size_t kMaxSteps = 32;  // decode, verify steps of every draft length, draft steps

    cudaStream_t      stream_;
    bool              enabled_;
    ExpertTableLookup tables_;
    void *            tables_owner_;
    bool              capturing_ = false;
    std::list<Step>   steps_;  // most recently used first
    uint64_t          unbuilt_table_steps_ = 0;
    std::unordered_map<uint64_t, std::pair<uint64_t, uint64_t>> fingerprints_;  // graph uid -> (generation, fingerprint)
};

}  // namespace spark::cuda
