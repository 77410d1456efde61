// The interface every backend implements: memory, weight preparation, and graph execution.
// The runtime owns a Backend per model; contexts share it. Backends report errors by throwing
// spark::Error (SPARK_ERR_OUT_OF_MEMORY, SPARK_ERR_DEVICE, ...).
#pragma once

#include "graph/graph.h"
#include "quant/qweight.h"

#include <cstddef>
#include <memory>
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

struct BackendCaps {
    bool  host_memory = true;         // buffers are host-addressable
    DType kv_type     = DType::F32;   // element type of the KV cache
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;
    virtual BackendCaps caps() const = 0;

    // Zero-initialised memory. Throws SPARK_ERR_OUT_OF_MEMORY.
    virtual std::unique_ptr<Buffer> alloc(size_t bytes) = 0;
    virtual void upload(void * dst, const void * src, size_t bytes) = 0;    // host -> backend
    virtual void download(void * dst, const void * src, size_t bytes) = 0;  // backend -> host (synchronous)
    virtual void copy(void * dst, const void * src, size_t bytes) = 0;      // backend -> backend
    virtual void fill_zero(void * dst, size_t bytes) = 0;

    // Makes a weight usable by this backend's kernels. `host` points into host memory (the mapped
    // checkpoint or converted buffers) that stays valid for the model's lifetime. The CPU backend
    // uses it as is; the CUDA backend uploads and repacks it into `storage` it allocates.
    virtual QWeight prepare_weight(const QWeight & host, std::vector<std::unique_ptr<Buffer>> & storage) = 0;

    // Executes every node of the graph in order. Inputs are already uploaded.
    virtual void compute(Graph & graph) = 0;
    virtual void synchronize() {}

    // Thread count for CPU work (the CPU backend's compute; others may ignore it).
    virtual void set_n_threads(int n) {}
};

std::unique_ptr<Backend> make_cpu_backend(int n_threads);

}  // namespace spark
