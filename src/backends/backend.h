// The interface every backend implements: memory, weight preparation, and graph execution.
// The runtime owns a Backend per model; contexts share it. Backends report errors by throwing
// spark::Error (SPARK_ERR_OUT_OF_MEMORY, SPARK_ERR_DEVICE, ...).
#pragma once

#include "common/error.h"
#include "graph/graph.h"
#include "quant/qweight.h"
#include "quant/random_weights.h"

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

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

// The canonical description of the weight a spec makes, without data: format, shape, INT4 groups
// (one per row when group_size <= 0; f16 scales, symmetric), FP8 blocks, the NVFP4 global scale.
inline QWeight random_weight_layout(const RandomWeightSpec & spec) {
    QWeight w;
    w.format = spec.format;
    w.n      = spec.n;
    w.k      = spec.k;
    switch (spec.format) {
        case WeightFormat::F32:
        case WeightFormat::F16:
        case WeightFormat::BF16: break;
        case WeightFormat::NVFP4: w.global_scale = random_weights::nvfp4_global_scale(spec.scale); break;
        case WeightFormat::INT4:
            w.group_size = spec.group_size > 0 ? spec.group_size : int32_t(spec.k);
            w.n_groups   = int32_t((spec.k + w.group_size - 1) / w.group_size);
            w.scale_type = ScaleType::F16;
            break;
        case WeightFormat::FP8:
            w.block_n = spec.block_n;
            w.block_k = spec.block_k;
            break;
    }
    return w;
}

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

// Reads the host bytes behind a pointer the loader handed out (QWeight pointers: inside a mapped
// checkpoint file, or in host buffers). A backend that copies weights elsewhere reads through it
// rather than touching the mapping: large reads from several threads are what let a cold start
// run at the disk's speed, and they add nothing to the process's resident memory. Thread-safe.
class HostReader {
public:
    virtual ~HostReader() = default;
    // Copies [src, src + bytes) into dst. Throws SPARK_ERR_IO.
    virtual void read(void * dst, const void * src, size_t bytes) const = 0;
    // A hint that [src, src + bytes) will be read soon: a file starts reading it in the background.
    virtual void prefetch(const void * src, size_t bytes) const { (void) src, (void) bytes; }
    // The whole read-only file mapping [base, base + bytes) that holds [src, src + size), which lives
    // as long as the model (a backend may use weights in place there: cuda/weight_placement.h);
    // {nullptr, 0} when the range is in no mapping.
    struct Mapping {
        const void * base  = nullptr;
        size_t       bytes = 0;
    };
    virtual Mapping mapping(const void * src, size_t size) const { return (void) src, (void) size, Mapping{}; }
};

// Reports bytes moved so far out of the total; returning false cancels (SPARK_ERR_ABORTED).
using WeightProgress = std::function<bool(uint64_t done, uint64_t total)>;

// The weights of one load, prepared together. add() returns each weight as the kernels will see it
// (its memory is reserved, so pointers are final); commit() moves every byte, which lets a backend
// size its memory once and stream the data with parallel reads. Until commit() returns the weights
// hold no data. Destroying an uncommitted batch is allowed (a failed load).
class WeightBatch {
public:
    virtual ~WeightBatch() = default;
    // A weight (see Backend::prepare_weight); `host` must stay valid until commit() returns.
    virtual QWeight add(const QWeight & host) = 0;
    // Backend memory holding a copy of `bytes` host bytes (small parameters); the bytes are copied
    // at once, so `host` may go away.
    virtual void *  add_copy(const void * host, size_t bytes) = 0;
    // Throws SPARK_ERR_OUT_OF_MEMORY, SPARK_ERR_IO, SPARK_ERR_ABORTED (progress said stop), and the
    // format errors a weight's preparation can raise.
    virtual void    commit(const HostReader & reader, const WeightProgress & progress) = 0;
    // Bytes commit() moves in all (the progress total).
    virtual uint64_t bytes() const = 0;
    // Weight bytes used in place from the checkpoint's mapping instead (cuda/weight_placement.h).
    virtual uint64_t bytes_in_place() const { return 0; }
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

    // A batch for the weights of one load, whose memory goes to `storage`; commit() may use up to
    // `n_threads` threads (<= 0: the machine's). `source` (or nullptr) is the reader commit() will
    // get, asked at add() whether a weight lies in a file mapping it may use in place. The default
    // prepares each weight at once (prepare_weight) and has nothing left to move at commit.
    virtual std::unique_ptr<WeightBatch> begin_weights(std::vector<std::unique_ptr<Buffer>> & storage, int n_threads,
                                                       const HostReader * source = nullptr);

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
    // For the memory planner (plan_memory's launch_last): where one launch of this backend computes
    // several nodes of `graph`, the position of its last node for each of them; empty: one launch
    // per node. Asked before the graph has memory.
    virtual std::vector<int> launch_last_nodes(const Graph & graph) { return (void) graph, std::vector<int>{}; }
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

// The default batch: each weight is prepared when it is added; commit() only reports.
class ImmediateWeightBatch final : public WeightBatch {
public:
    ImmediateWeightBatch(Backend & backend, std::vector<std::unique_ptr<Buffer>> & storage) : backend_(backend), storage_(storage) {}
    QWeight add(const QWeight & host) override {
        bytes_ += qweight_bytes(host).total();
        return backend_.prepare_weight(host, storage_);
    }
    void * add_copy(const void * host, size_t bytes) override {
        storage_.push_back(backend_.alloc(bytes));
        backend_.upload(storage_.back()->data(), host, bytes);
        bytes_ += bytes;
        return storage_.back()->data();
    }
    void commit(const HostReader &, const WeightProgress & progress) override {
        backend_.synchronize();
        if (progress && !progress(bytes_, bytes_)) fail(SPARK_ERR_ABORTED, "model loading was cancelled by the progress callback");
    }
    uint64_t bytes() const override { return bytes_; }

private:
    Backend &                              backend_;
    std::vector<std::unique_ptr<Buffer>> & storage_;
    uint64_t                               bytes_ = 0;
};

inline std::unique_ptr<WeightBatch> Backend::begin_weights(std::vector<std::unique_ptr<Buffer>> & storage, int, const HostReader *) {
    return std::make_unique<ImmediateWeightBatch>(*this, storage);
}

std::unique_ptr<Backend> make_cpu_backend(int n_threads);

}  // namespace spark
