// The interface every backend implements: memory, weight preparation, and graph execution.
// The runtime owns a Backend per model; contexts share it. Backends report errors by throwing
// spark::Error (SPARK_ERR_OUT_OF_MEMORY, SPARK_ERR_DEVICE, ...).
#pragma once

#include "graph/graph.h"
#include "quant/qweight.h"

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace spark {

// Memory owned by a backend, freed on destruction.
class Buffer {
public:
    virtual ~Buffer() = default;
    void * data() const { return data_; }
    size_t size() const { return size_; }

protected:
    void * data_ = nullptr;
    size_t size_ = 0;
};

// A random weight of real shape for benchmarks (spark-bench's synthetic models): values of a plausible
// magnitude, generated where the weight lives (on the GPU for CUDA: no host memory, no upload).
struct RandomWeightSpec {
    WeightFormat format     = WeightFormat::BF16;
    int64_t      n          = 0;
    int64_t      k          = 0;
    int32_t      group_size = 128;  // INT4
    int32_t      block_n    = 128;  // FP8
    int32_t      block_k    = 128;  // FP8
    uint64_t     seed       = 1;
    float        scale      = 0.02f;  // standard deviation of the represented values (about)
};

struct BackendCaps {
    bool  host_memory = true;         // buffers are host-addressable
    DType kv_type     = DType::F32;   // element type of the KV cache
};

// What one context needs to run steps next to the other contexts of the same model: on the CPU its
// own thread pool (the model's weights are shared and read-only). Made by Backend::make_executor.
class Executor {
public:
    virtual ~Executor() = default;
    // Asked between the ops of a step by backends that can stop there (the CPU): true stops the
    // step with SPARK_ERR_ABORTED.
    std::function<bool()> should_abort;
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;
    virtual BackendCaps caps() const = 0;

    // Zero-initialised memory. Throws SPARK_ERR_OUT_OF_MEMORY.
    virtual std::unique_ptr<Buffer> alloc(size_t bytes) = 0;
    // The most memory this backend can ever hold (the host's physical memory, the GPU's); 0 when
    // unknown. Contexts check their caches against it before allocating, so that a request that
    // cannot fit fails at once instead of exhausting the machine.
    virtual uint64_t memory_capacity() const { return 0; }
    virtual void upload(void * dst, const void * src, size_t bytes) = 0;    // host -> backend
    virtual void download(void * dst, const void * src, size_t bytes) = 0;  // backend -> host (synchronous)
    virtual void copy(void * dst, const void * src, size_t bytes) = 0;      // backend -> backend
    virtual void fill_zero(void * dst, size_t bytes) = 0;

    // Makes a weight usable by this backend's kernels. `host` points into host memory (the mapped
    // checkpoint or converted buffers) that stays valid for the model's lifetime. The CPU backend
    // uses it as is; the CUDA backend uploads and repacks it into `storage` it allocates.
    virtual QWeight prepare_weight(const QWeight & host, std::vector<std::unique_ptr<Buffer>> & storage) = 0;

    // A random weight in this backend's layout (see RandomWeightSpec); memory goes to `storage`.
    virtual QWeight random_weight(const RandomWeightSpec & spec, std::vector<std::unique_ptr<Buffer>> & storage) = 0;

    // Measured device-to-device copy bandwidth in bytes/s (bytes read + written), for roofline
    // reports; 0 when not meaningful.
    virtual double copy_bandwidth() { return 0.0; }

    // Executes every node of the graph in order. Inputs are already uploaded. A backend may cache
    // work per graph (the CUDA backend captures and replays a step): computing the same graph again
    // (same uid and generation) promises that its nodes, shapes, memory binding and weights are
    // unchanged — only the contents of inputs and state differ. Re-binding memory bumps the
    // generation; whoever changes a weight or a node of a graph in place must call
    // graph.bump_generation().
    // `ex` (from make_executor) carries the calling context's execution resources; null: the
    // backend's own (tests and tools that run a graph directly).
    virtual void compute(Graph & graph, Executor * ex) = 0;
    void         compute(Graph & graph) { compute(graph, nullptr); }
    virtual void synchronize() {}

    // Execution resources of one context (n_threads: CPU threads, <= 0 all); null when the
    // backend has none per context.
    virtual std::unique_ptr<Executor> make_executor(int n_threads) { return nullptr; }
    // A lock every context of the model takes around its use of the backend when the backend's
    // resources are shared by all of them (the CUDA backend: one stream, one set of captured graphs,
    // one workspace and staging ring); null when contexts may run at once (the CPU backend: each
    // has its own thread pool).
    virtual std::mutex * exclusive() { return nullptr; }
};

std::unique_ptr<Backend> make_cpu_backend(int n_threads);

}  // namespace spark
