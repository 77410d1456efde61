// The CUDA backend's op profiler (SPARK_PROFILE_OPS=1, docs/ENVIRONMENT.md): every launch of a step
// timed with CUDA events, summed per op and shape, and the table printed through the log callback
// when the backend is destroyed. For finding where a step's time goes; CUDA graphs are off while it
// is on (a captured step cannot be timed per launch).
#pragma once

#include "graph/graph.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace spark::cuda {

class OpProfiler {
public:
    // A profiler when SPARK_PROFILE_OPS is set, else nullptr.
    static std::unique_ptr<OpProfiler> from_env();
    ~OpProfiler();  // prints the table

    // One timed launch: its events are read at the next collect().
    void add(std::string key, cudaEvent_t begin, cudaEvent_t end) { pending_.push_back({std::move(key), begin, end}); }
    // Waits for the stream and adds the step's pending times to the totals.
    void collect(cudaStream_t stream);

private:
    struct Pending {
        std::string key;
        cudaEvent_t begin, end;
    };
    std::vector<Pending>                              pending_;
    std::map<std::string, std::pair<double, int64_t>> totals_;  // key -> (microseconds, launches)
};

// The name of a launch in the profiles: its op (or `label`, the name of a fused launch), the shape
// of its first node and its weight's format and shape.
std::string launch_key(const Tensor & node, const char * label);

// Times the launches enqueued during its lifetime as one entry keyed by the op (or `label`, the
// name of a fused launch), its shape and its weight. Does nothing without a profiler.
class OpTimer {
public:
    OpTimer(OpProfiler * profiler, cudaStream_t stream, const Tensor & node, const char * label = nullptr);
    ~OpTimer();
    OpTimer(const OpTimer &)             = delete;
    OpTimer & operator=(const OpTimer &) = delete;

private:
    OpProfiler *   prof_;
    cudaStream_t   stream_;
    const Tensor & node_;
    const char *   label_;
    cudaEvent_t    begin_ = nullptr;
};

}  // namespace spark::cuda
