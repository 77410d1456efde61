// The step trace, host half: where a replayed decode step's time goes, kernel by kernel. Built with
// -DSPARK_STEP_TRACE=ON (a measurement build: every kernel's pdl::wait stamps its blocks,
// common/step_trace.cuh) and written when SPARK_STEP_TRACE_OUT names a file (docs/ENVIRONMENT.md).
//
// For each replayed step (the first 16) it writes one CSV row per kernel, in launch order: the op
// that launched it (the profiler's key), the kernel, its grid, the blocks seen, and in nanoseconds
// from the step's first release: when its first block arrived at its wait, when the first and the
// last block's wait returned. Kernels of a stream are released in launch order (each waits for the
// one before), so a kernel's share of the step is its first release to the next one's.
// dev/tools/step_trace.py sums that per op.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace spark::cuda {

namespace trace {
struct Buffer;
}

class StepTracer {
public:
    // A tracer when this build has the trace and SPARK_STEP_TRACE_OUT is set, else nullptr.
    static std::unique_ptr<StepTracer> from_env();
    ~StepTracer();
    StepTracer(const StepTracer &)             = delete;
    StepTracer & operator=(const StepTracer &) = delete;

    // Around one step's launches (not inside a capture): the records start empty; the launches
    // made on this thread until end_step are the step's list, named by the last set_label.
    void begin_step(cudaStream_t stream);
    void set_label(std::string label) { label_ = std::move(label); }
    // A replayed step's records are written under the launch list of the eager or captured run of
    // the same fingerprint.
    void end_step(cudaStream_t stream, uint64_t fingerprint, bool replayed);

    struct Launch {
        std::string label;
        std::string kernel;
        uint64_t    blocks;
    };
    void note_launch(const void * kernel, dim3 grid);

private:
    StepTracer(std::FILE * out, trace::Buffer * buffer, uint64_t capacity);

    std::FILE *                                        out_;
    trace::Buffer *                                    buffer_;    // device
    uint64_t                                           capacity_;  // records
    std::string                                        label_;
    std::vector<Launch>                                launches_;  // of the step under way
    std::unordered_map<uint64_t, std::vector<Launch>>  lists_;     // fingerprint -> its launches
    int                                                written_ = 0;
};

// launch_kernel's note in trace builds (launch.h): the launch joins the list of the step under way
// on this thread, if any.
void trace_note_launch(const void * kernel, dim3 grid);

}  // namespace spark::cuda
