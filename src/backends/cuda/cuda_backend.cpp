// The CUDA backend: device memory, weight upload/repack, op dispatch with fusion, and CUDA-graph
// replay of steps that repeat (batch-1 decode, small verify batches).
//
// Graph replay: a step's graph is fingerprinted (ops, shapes, strides, data pointers, parameters).
// The first time a fingerprint is seen the step runs eagerly (workspace may grow); the second time
// it is captured into a CUDA graph and launched; afterwards it is replayed. Everything that changes
// between decode steps (token ids, positions, block tables) is device data uploaded before the
// launch, so the captured kernels see the new step without re-capture.
#include "backends/cuda/cuda_backend.h"

#include "backends/cuda/common/arch.h"
#include "backends/cuda/common/launch.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/matmul/matmul.h"
#include "backends/cuda/matmul/tuning.h"
#include "backends/cuda/ops.h"
#include "backends/cuda/weight_batch.h"
#include "graph/log.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace spark {

namespace cuda {

void throw_cuda_error(cudaError_t err, const char * call, const char * file, int line) {
    const spark_status st = err == cudaErrorMemoryAllocation ? SPARK_ERR_OUT_OF_MEMORY : SPARK_ERR_DEVICE;
    cudaGetLastError();  // clear a sticky launch error where possible
    fail(st, "CUDA error %s (%s) in %s at %s:%d", cudaGetErrorName(err), cudaGetErrorString(err), call, file, line);
}

}  // namespace cuda

namespace {

using cuda::DeviceWeight;

class DeviceBuffer final : public Buffer {
public:
    // Zeroed on `stream` (the backend's non-blocking stream): a cudaMemset on the legacy default
    // stream would not be ordered with the uploads and kernels that follow on ours.
    DeviceBuffer(size_t bytes, int device, cudaStream_t stream) : device_(device) {
        size_ = bytes;
        if (bytes == 0) return;
        cudaError_t err = cudaMalloc(&data_, bytes);
        if (err != cudaSuccess) {
            cudaGetLastError();
            size_t free_b = 0, total_b = 0;
            cudaMemGetInfo(&free_b, &total_b);
            fail(SPARK_ERR_OUT_OF_MEMORY, "out of GPU memory: cannot allocate %.1f MiB (%.1f MiB free of %.1f MiB)",
                 double(bytes) / 1048576.0, double(free_b) / 1048576.0, double(total_b) / 1048576.0);
        }
        SPARK_CUDA_CHECK(cudaMemsetAsync(data_, 0, bytes, stream));
    }
    ~DeviceBuffer() override {
        if (data_) cudaFree(data_);
    }

private:
    int device_;
};

class CudaBackend;

class GrowingWorkspace final : public cuda::Workspace {
public:
    explicit GrowingWorkspace(CudaBackend & be) : be_(be) {}
    void * get(size_t bytes) override;
    bool   grew = false;     // set when get() reallocated (invalidates captured graphs)
    bool   frozen = false;   // true while capturing
    std::unique_ptr<Buffer> buf;

private:
    CudaBackend & be_;
};

struct CapturedStep {
    uint64_t        fingerprint = 0;
    int             seen        = 0;
    cudaGraphExec_t exec        = nullptr;
};

// SPARK_PROFILE_OPS=1: CUDA graphs off, every dispatched node timed with events; the per-op table
// (by op and shape) is printed when the backend is destroyed. For finding where a step's time goes.
class OpProfiler {
public:
    struct Pending {
        std::string key;
        cudaEvent_t begin, end;
    };
    void add(std::string key, cudaEvent_t b, cudaEvent_t e) { pending_.push_back({std::move(key), b, e}); }
    void collect(cudaStream_t stream) {
        cudaStreamSynchronize(stream);
        for (auto & p : pending_) {
            float ms = 0;
            cudaEventElapsedTime(&ms, p.begin, p.end);
            auto & e = totals_[p.key];
            e.first += double(ms) * 1000.0;
            e.second += 1;
            cudaEventDestroy(p.begin);
            cudaEventDestroy(p.end);
        }
        pending_.clear();
    }
    ~OpProfiler() {
        std::vector<std::pair<std::string, std::pair<double, int64_t>>> rows(totals_.begin(), totals_.end());
        std::sort(rows.begin(), rows.end(), [](auto & a, auto & b) { return a.second.first > b.second.first; });
        double total = 0;
        for (auto & r : rows) total += r.second.first;
        log(SPARK_LOG_INFO, "spark op profile (GPU time, us): total %.0f\n", total);
        for (size_t i = 0; i < rows.size() && i < 40; ++i)
            log(SPARK_LOG_INFO, "  %10.0f us %5.1f%% %8lld calls %8.2f us/call  %s\n", rows[i].second.first, 100.0 * rows[i].second.first / total,
                         (long long) rows[i].second.second, rows[i].second.first / double(rows[i].second.second), rows[i].first.c_str());
    }

private:
    std::vector<Pending>                                       pending_;
    std::map<std::string, std::pair<double, int64_t>>          totals_;
};

struct OpTimer {
    OpProfiler *   prof;
    cudaStream_t   stream;
    const Tensor & node;
    cudaEvent_t    begin = nullptr;
    const char *   label = nullptr;
    OpTimer(OpProfiler * p, cudaStream_t s, const Tensor & n) : prof(p), stream(s), node(n) {
        if (!prof) return;
        cudaEventCreate(&begin);
        cudaEventRecord(begin, stream);
    }
    ~OpTimer() {
        if (!prof) return;
        cudaEvent_t end;
        cudaEventCreate(&end);
        cudaEventRecord(end, stream);
        std::string key = label ? label : op_name(node.op);
        key += " [" + std::to_string(node.ne[0]) + "," + std::to_string(node.ne[1]) + "," + std::to_string(node.ne[2]) + "]";
        const QWeight * w = node.weight ? node.weight : node.experts;
        if (!w && label && node.src[0] && node.src[0]->weight) w = node.src[0]->weight;
        if (!w && label && node.src[0] && node.src[0]->experts) w = node.src[0]->experts;
        if (w) key += std::string(" ") + weight_format_name(w->format) + " " + std::to_string(w->n) + "x" + std::to_string(w->k);
        prof->add(key, begin, end);
    }
};

class CudaBackend final : public Backend {
public:
    explicit CudaBackend(int device) : device_(device), workspace_(*this) {
        int count = 0;
        if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
            cudaGetLastError();
            fail(SPARK_ERR_UNSUPPORTED, "no CUDA device is available (driver missing or no GPU)");
        }
        if (device < 0 || device >= count) fail(SPARK_ERR_UNSUPPORTED, "CUDA device %d does not exist (%d devices)", device, count);
        cudaDeviceProp prop{};
        SPARK_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
        props_.cc = prop.major * 100 + prop.minor * 10;
        if (!cuda::cc_supported(props_.cc))
            fail(SPARK_ERR_UNSUPPORTED, "GPU '%s' has compute capability %d.%d; spark needs 8.0 or newer (Ampere, Ada, Hopper, Blackwell)",
                 prop.name, prop.major, prop.minor);
        props_.sm_count           = prop.multiProcessorCount;
        props_.max_smem_per_block = int(prop.sharedMemPerBlockOptin);
        props_.l2_bytes           = size_t(prop.l2CacheSize);
        total_memory_             = uint64_t(prop.totalGlobalMem);
        name_                     = prop.name;
        SPARK_CUDA_CHECK(cudaSetDevice(device));
        SPARK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        ctx_.stream       = stream_;
        ctx_.workspace    = &workspace_;
        ctx_.props        = &props_;
        ctx_.backend      = this;
        ctx_.expert_table = &CudaBackend::expert_table_thunk;
        if (const char * p = std::getenv("SPARK_PROFILE_OPS"); p && *p && *p != '0') profiler_ = std::make_unique<OpProfiler>();
    }

    ~CudaBackend() override {
        cudaSetDevice(device_);
        if (stream_) cudaStreamSynchronize(stream_);
        for (auto & s : steps_)
            if (s.exec) cudaGraphExecDestroy(s.exec);
        if (stream_) cudaStreamDestroy(stream_);
        if (staging_) cudaFreeHost(staging_);
    }

    std::string name() const override { return "cuda:" + std::to_string(device_) + " (" + name_ + ")"; }
    BackendCaps caps() const override { return {false, DType::F16}; }

    std::unique_ptr<Buffer> alloc(size_t bytes) override {
        activate();
        return std::make_unique<DeviceBuffer>(bytes, device_, stream_);
    }
    uint64_t memory_capacity() const override { return total_memory_; }
    // Small uploads (a step's inputs) go through a pinned ring buffer so the copy is truly
    // asynchronous (a pageable copy stalls the host while it stages); the ring is reused after the
    // stream synchronises. Large uploads (weights at load time) copy directly.
    void upload(void * dst, const void * src, size_t n) override {
        activate();
        if (n > kStagingBytes / 4) {
            SPARK_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream_));
            return;
        }
        if (!staging_) {
            SPARK_CUDA_CHECK(cudaMallocHost(&staging_, kStagingBytes));
        }
        if (staging_used_ + n > kStagingBytes) {
            SPARK_CUDA_CHECK(cudaStreamSynchronize(stream_));
            staging_used_ = 0;
        }
        char * p = static_cast<char *>(staging_) + staging_used_;
        std::memcpy(p, src, n);
        staging_used_ += (n + 255) & ~size_t(255);
        SPARK_CUDA_CHECK(cudaMemcpyAsync(dst, p, n, cudaMemcpyHostToDevice, stream_));
    }
    void download(void * dst, const void * src, size_t n) override {
        activate();
        SPARK_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_));
        SPARK_CUDA_CHECK(cudaStreamSynchronize(stream_));
        staging_used_ = 0;
    }
    void copy(void * dst, const void * src, size_t n) override {
        activate();
        SPARK_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream_));
    }
    void fill_zero(void * dst, size_t n) override {
        activate();
        SPARK_CUDA_CHECK(cudaMemsetAsync(dst, 0, n, stream_));
    }
    void synchronize() override {
        activate();
        SPARK_CUDA_CHECK(cudaStreamSynchronize(stream_));
        staging_used_ = 0;
    }

    QWeight prepare_weight(const QWeight & host, std::vector<std::unique_ptr<Buffer>> & storage) override {
        activate();
        Owner owner{this, &storage};
        return remember(host, cuda::upload_weight(host, &Owner::alloc, &owner, stream_));
    }

    std::unique_ptr<WeightBatch> begin_weights(std::vector<std::unique_ptr<Buffer>> & storage, int n_threads) override {
        activate();
        return cuda::make_weight_batch(device_, size_t(total_memory_), n_threads, storage,
                                       [this](const QWeight & host, const DeviceWeight & dw) { return remember(host, dw); });
    }

    QWeight random_weight(const RandomWeightSpec & spec, std::vector<std::unique_ptr<Buffer>> & storage) override {
        activate();
        Owner   owner{this, &storage};
        QWeight logical;
        logical.format = spec.format;
        logical.n      = spec.n;
        logical.k      = spec.k;
        return remember(logical, cuda::random_device_weight(spec, &Owner::alloc, &owner, stream_));
    }

    double copy_bandwidth() override {
        if (copy_bandwidth_ > 0) return copy_bandwidth_;
        activate();
        const size_t bytes = size_t(512) << 20;
        auto         a = alloc(bytes), b = alloc(bytes);
        cudaEvent_t  t0, t1;
        SPARK_CUDA_CHECK(cudaEventCreate(&t0));
        SPARK_CUDA_CHECK(cudaEventCreate(&t1));
        SPARK_CUDA_CHECK(cudaMemcpyAsync(b->data(), a->data(), bytes, cudaMemcpyDeviceToDevice, stream_));  // warm-up
        SPARK_CUDA_CHECK(cudaEventRecord(t0, stream_));
        const int reps = 10;
        for (int i = 0; i < reps; ++i)
            SPARK_CUDA_CHECK(cudaMemcpyAsync(i % 2 ? a->data() : b->data(), i % 2 ? b->data() : a->data(), bytes, cudaMemcpyDeviceToDevice, stream_));
        SPARK_CUDA_CHECK(cudaEventRecord(t1, stream_));
        SPARK_CUDA_CHECK(cudaEventSynchronize(t1));
        float ms = 0;
        SPARK_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
        cudaEventDestroy(t0);
        cudaEventDestroy(t1);
        copy_bandwidth_ = 2.0 * double(bytes) * reps / (double(ms) * 1e-3);  // bytes read + written
        return copy_bandwidth_;
    }

    std::mutex * exclusive() override { return &exclusive_; }

    void compute(Graph & graph, Executor *) override {
        activate();
        // A graph computed again unchanged (the context reuses decode-step graphs) keeps its
        // fingerprint; several graphs alternate (a target's verify step and its draft's steps).
        auto known = fingerprints_.find(graph.uid());
        if (known == fingerprints_.end() || known->second.first != graph.generation()) {
            if (fingerprints_.size() >= 64) fingerprints_.clear();
            known = fingerprints_.insert_or_assign(graph.uid(), std::make_pair(graph.generation(), fingerprint(graph))).first;
        }
        const uint64_t fp   = known->second.second;
        CapturedStep & step = lookup(fp);
        if (step.exec && !workspace_.grew) {
            SPARK_CUDA_CHECK(cudaGraphLaunch(step.exec, stream_));
            return;
        }
        if (workspace_.grew) invalidate_graphs();
        if (++step.seen < 2 || !graphs_enabled()) {
            run_nodes(graph);  // eager: sizes the workspace for this shape
            return;
        }
        // Capture this step, then launch it.
        workspace_.frozen = true;
        cudaGraph_t g     = nullptr;
        SPARK_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        try {
            run_nodes(graph);
        } catch (...) {
            cudaStreamEndCapture(stream_, &g);
            if (g) cudaGraphDestroy(g);
            workspace_.frozen = false;
            throw;
        }
        SPARK_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
        workspace_.frozen = false;
        cudaGraphExec_t exec = nullptr;
        cudaError_t     err  = cudaGraphInstantiate(&exec, g, 0);
        cudaGraphDestroy(g);
        SPARK_CUDA_CHECK(err);
        step.exec = exec;
        SPARK_CUDA_CHECK(cudaGraphLaunch(step.exec, stream_));
    }

    void activate() const { cudaSetDevice(device_); }
    const cuda::DeviceProps & props() const { return props_; }

private:
    friend class GrowingWorkspace;

    struct Owner {
        CudaBackend *                          be;
        std::vector<std::unique_ptr<Buffer>> * storage;
        static void * alloc(void * o, size_t bytes) {
            auto * ow = static_cast<Owner *>(o);
            ow->storage->push_back(ow->be->alloc(bytes));
            return ow->storage->back()->data();
        }
    };

    // Keeps the DeviceWeight (kernels read it through QWeight::device_layout).
    QWeight remember(const QWeight & logical, const DeviceWeight & dw) {
        std::lock_guard<std::mutex> lock(weights_mutex_);
        weights_.push_back(dw);
        QWeight out       = logical;
        out.data          = dw.data;
        out.scales        = dw.scales;
        out.zeros         = dw.zeros;
        out.g_idx         = dw.perm;
        out.group_size    = dw.group_size;
        out.n_groups      = dw.n_groups;
        out.global_scale  = dw.global_scale;
        out.block_n       = dw.block_n;
        out.block_k       = dw.block_k;
        out.device_layout = &weights_.back();
        return out;
    }

    bool graphs_enabled() const {
        static const bool enabled = [] {
            const char * e = std::getenv("SPARK_CUDA_GRAPHS");
            return !(e && std::string(e) == "0");
        }();
        return enabled && !profiler_;
    }

    // Which nodes a fused kernel covers: a SWIGLU of two matmuls over the same input.
    static bool fusable_swiglu(const Tensor & sw, const std::vector<int> & uses) {
        const Tensor * g = sw.src[0];
        const Tensor * u = sw.src[1];
        if (sw.op != Op::SWIGLU || !g || !u || g->op != u->op) return false;
        if (g->op != Op::MATMUL && g->op != Op::MATMUL_ID) return false;
        if (g->src[0] != u->src[0] || g->src[1] != u->src[1]) return false;
        if (uses[size_t(g->id)] != 1 || uses[size_t(u->id)] != 1) return false;
        if (g->flags & TENSOR_OUTPUT || u->flags & TENSOR_OUTPUT) return false;
        const QWeight & wg = g->op == Op::MATMUL ? *g->weight : g->experts[0];
        const QWeight & wu = u->op == Op::MATMUL ? *u->weight : u->experts[0];
        return wg.format == wu.format && wg.n == wu.n && wg.k == wu.k;
    }

    // nodes[i] is an RMS_NORM whose only reader is the ROPE at nodes[i + 1].
    template <class Nodes>
    static bool norm_rope_at(const Nodes & nodes, size_t i, const std::vector<int> & uses) {
        if (i + 1 >= nodes.size()) return false;
        const Tensor * n = nodes[i];
        return n->op == Op::RMS_NORM && nodes[i + 1]->op == Op::ROPE && nodes[i + 1]->src[0] == n && uses[size_t(n->id)] == 1 &&
               !(n->flags & TENSOR_OUTPUT);
    }

    // SPARK_EARLY_IDS=0: every expert GEMV waits before reading its ids (A/B timing).
    static bool early_ids_enabled() {
        static const bool on = [] {
            const char * e = std::getenv("SPARK_EARLY_IDS");
            return !(e && std::string(e) == "0");
        }();
        return on;
    }

    // Whether node n is a MATMUL_ID (or the SWIGLU of two) whose expert ids were computed by a launch
    // before the one of node `prev` (the first node the previous launch covered; a fused launch
    // covers nodes after its first one, and skipped nodes are computed by a later launch). pos: the
    // nodes' positions by tensor id.
    static bool ids_written_before(const Tensor * n, const Tensor * prev, const std::vector<int> & pos, const std::vector<bool> & skip) {
        const Tensor * mm = n->op == Op::SWIGLU ? n->src[0] : n;
        if (!mm || mm->op != Op::MATMUL_ID || !prev) return false;
        const Tensor * ids = mm->src[1];
        while (ids && ids->op == Op::VIEW) ids = ids->src[0];
        if (!ids || pos[size_t(ids->id)] < 0 || skip[size_t(ids->id)]) return false;  // (an input of the graph: no launch)
        return pos[size_t(ids->id)] < pos[size_t(prev->id)];
    }

    static constexpr int kMaxMatmulGroup = 4;

    // The MATMUL at nodes[first] and the following MATMULs on the same input, up to the first node
    // that is neither such a matmul nor a view (views launch nothing and allocate nothing, so every
    // output already exists and the input is still live when the group runs at `first`).
    template <class Nodes>
    static int matmul_group(const Nodes & nodes, size_t first, const std::vector<bool> & skip, const Tensor ** group) {
        const Tensor * x     = nodes[first]->src[0];
        int            count = 0;
        for (size_t j = first; j < nodes.size() && count < kMaxMatmulGroup; ++j) {
            const Tensor * n = nodes[j];
            if (n->op == Op::VIEW || n->op == Op::NONE) continue;
            if (n->op != Op::MATMUL || n->src[0] != x || skip[size_t(n->id)]) break;
            group[count++] = n;
        }
        return count;
    }

    // A decode or verify step: every matmul has at most the GEMV's row count (prefill steps have
    // more and launch without PDL, cuda_common.h).
    static bool decode_sized(const std::vector<Tensor *> & nodes) {
        for (const Tensor * n : nodes) {
            if (n->op != Op::MATMUL && n->op != Op::MATMUL_ID) continue;
            const Tensor & x    = *n->src[0];
            const int64_t  rows = n->op == Op::MATMUL ? x.nrows() : x.ne[2] * x.ne[3];
            if (rows > cuda::mm::kGemvMaxRows) return false;
        }
        return true;
    }

    void run_nodes(Graph & graph) {
        const auto &     nodes = graph.nodes();
        const cuda::PdlStep pdl_step(decode_sized(nodes));
        std::vector<int> uses(graph.tensors().size(), 0);
        for (const Tensor * n : nodes)
            for (const Tensor * s : n->src)
                if (s) ++uses[size_t(s->id)];
        std::vector<bool> skip(graph.tensors().size(), false);
        // Mark the matmuls a fused SWIGLU computes itself.
        for (const Tensor * n : nodes)
            if (n->op == Op::SWIGLU && fusable_swiglu(*n, uses)) skip[size_t(n->src[0]->id)] = skip[size_t(n->src[1]->id)] = true;
        // Early expert ids (ops.h: OpContext::ids_before_wait): the node whose launch came last; what
        // its op left in ctx_.last_waits_first says whether that launch triggers only after its wait.
        const Tensor *   prev_launch = nullptr;
        std::vector<int> pos(graph.tensors().size(), -1);
        for (size_t i = 0; i < nodes.size(); ++i) pos[size_t(nodes[i]->id)] = int(i);
        ctx_.last_waits_first = false;
        for (size_t i = 0; i < nodes.size(); ++i) {
            const Tensor * n = nodes[i];
            if (skip[size_t(n->id)]) continue;
            if (n->op == Op::VIEW || n->op == Op::NONE) continue;  // (launch nothing)
            ctx_.ids_before_wait  = early_ids_enabled() && ctx_.last_waits_first && ids_written_before(n, prev_launch, pos, skip);
            ctx_.last_waits_first = false;
            prev_launch           = n;
            OpTimer timer(profiler_.get(), stream_, *n);
            if (n->op == Op::SWIGLU && fusable_swiglu(*n, uses)) {
                timer.label = "MATMUL+SWIGLU";
                cuda::op_matmul_swiglu(*n, ctx_);
                continue;
            }
            // MATMULs over the same activations with only views between them (q/k/v; in_proj_qkvz
            // + in_proj_ba): one multi-weight GEMV launch where the matmul layer supports it.
            if (n->op == Op::MATMUL) {
                const Tensor * group[kMaxMatmulGroup];
                const int      count = matmul_group(nodes, i, skip, group);
                if (count > 1 && cuda::matmul_multi_supported(group, count, ctx_)) {
                    static const char * const kLabels[] = {"", "", "MATMUL x2", "MATMUL x3", "MATMUL x4"};
                    timer.label = kLabels[count];
                    cuda::op_matmul_multi(group, count, ctx_);
                    for (int j = 1; j < count; ++j) skip[size_t(group[j]->id)] = true;
                    continue;
                }
            }
            // Residual add followed by the next layer's norm of that sum: one kernel.
            if (n->op == Op::ADD && i + 1 < nodes.size() && nodes[i + 1]->op == Op::RMS_NORM && nodes[i + 1]->src[0] == n) {
                timer.label = "ADD+RMS_NORM";
                cuda::op_add_rms_norm(*n, *nodes[i + 1], ctx_);
                ++i;
                continue;
            }
            // Per-head q/k RMSNorm directly followed by its RoPE: one kernel (the norm's output is
            // read by nothing else, so it never needs to exist); the q pair directly followed by the
            // k pair: one launch for both.
            if (norm_rope_at(nodes, i, uses)) {
                if (norm_rope_at(nodes, i + 2, uses)) {
                    timer.label = "RMS_NORM+ROPE x2";
                    cuda::op_rms_norm_rope_pair(*n, *nodes[i + 1], *nodes[i + 2], *nodes[i + 3], ctx_);
                    i += 3;
                    continue;
                }
                timer.label = "RMS_NORM+ROPE";
                cuda::op_rms_norm_rope(*n, *nodes[i + 1], ctx_);
                ++i;
                continue;
            }
            dispatch(*n);
        }
        ctx_.ids_before_wait = ctx_.last_waits_first = false;  // (nothing outside a step reads them)
        if (profiler_) profiler_->collect(stream_);
    }

    void dispatch(const Tensor & t) {
        switch (t.op) {
            case Op::NONE:
            case Op::VIEW: return;
            case Op::CONT: return cuda::op_cont(t, ctx_);
            case Op::CONCAT: return cuda::op_concat(t, ctx_);
            case Op::GET_ROWS: return cuda::op_get_rows(t, ctx_);
            case Op::MATMUL: return cuda::op_matmul(t, ctx_);
            case Op::MATMUL_ID: return cuda::op_matmul_id(t, ctx_);
            case Op::ADD:
            case Op::MUL:
            case Op::SWIGLU:
            case Op::MUL_SIGMOID: return cuda::op_binary(t, ctx_);
            case Op::SCALE: return cuda::op_scale(t, ctx_);
            case Op::RMS_NORM: return cuda::op_rms_norm(t, ctx_);
            case Op::L2_NORM: return cuda::op_l2_norm(t, ctx_);
            case Op::ROPE: return cuda::op_rope(t, ctx_);
            case Op::ATTENTION: return cuda::op_attention(t, ctx_);
            case Op::MOE_ROUTE: return cuda::op_moe_route(t, ctx_);
            case Op::MOE_COMBINE: return cuda::op_moe_combine(t, ctx_);
            case Op::CONV1D_SSM: return cuda::op_conv1d_ssm(t, ctx_);
            case Op::GATED_DELTA: return cuda::op_gated_delta(t, ctx_);
            case Op::ARGMAX: return cuda::op_argmax(t, ctx_);
            case Op::COUNT: break;
        }
        fail(SPARK_ERR_INTERNAL, "cuda backend: unknown op %d", int(t.op));
    }

    // FNV-1a over everything a captured launch depends on.
    uint64_t fingerprint(const Graph & graph) {
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
                const void * table = expert_table_cached(t.experts, t.n_experts);
                mix(&table, sizeof table);
                // No table yet: the step must run eagerly (tables are built outside capture). A
                // fresh value keeps it from matching an earlier step whose expert set was also
                // unbuilt at this point (e.g. another set at the same host address since).
                if (!table) {
                    const uint64_t fresh = ++unbuilt_table_steps_;
                    mix(&fresh, sizeof fresh);
                }
                mix(t.experts[0].device_layout, sizeof(DeviceWeight));
            }
            for (const Tensor * s : t.src) {
                const int32_t id = s ? s->id : -1;
                mix(&id, sizeof id);
            }
        }
        // The matmul test / lab knobs choose kernels too (a test that forces another path on the
        // same graph must not replay the launches captured before).
        mix(&cuda::mm::overrides(), sizeof(cuda::mm::Overrides));
        return h;
    }

    CapturedStep & lookup(uint64_t fp) {
        for (auto it = steps_.begin(); it != steps_.end(); ++it)
            if (it->fingerprint == fp) {
                steps_.splice(steps_.begin(), steps_, it);  // most recent first
                return steps_.front();
            }
        steps_.push_front(CapturedStep{fp, 0, nullptr});
        while (steps_.size() > kMaxSteps) {
            if (steps_.back().exec) cudaGraphExecDestroy(steps_.back().exec);
            steps_.pop_back();
        }
        return steps_.front();
    }

    void invalidate_graphs() {
        for (auto & s : steps_)
            if (s.exec) {
                cudaGraphExecDestroy(s.exec);
                s.exec = nullptr;
            }
        workspace_.grew = false;
    }

    static const DeviceWeight * expert_table_thunk(void * be, const QWeight * experts, int32_t n) {
        return static_cast<CudaBackend *>(be)->expert_table(experts, n);
    }

    // The device array of an expert set, built once (outside capture: the first run is eager). The
    // cache is keyed by the experts' device pointers, so a different expert set at a reused host
    // address gets its own table.
    struct ExpertTable {
        std::vector<DeviceWeight> host;
        std::vector<const void *> layouts;  // experts[e].device_layout when the table was built
        std::unique_ptr<Buffer>   device;
    };
    static std::vector<DeviceWeight> expert_weights(const QWeight * experts, int32_t n) {
        std::vector<DeviceWeight> host(static_cast<size_t>(n));
        for (int32_t e = 0; e < n; ++e) host[size_t(e)] = cuda::device_weight(experts[e]);
        return host;
    }
    // Valid only while every expert is still the prepared weight the table was built from: device
    // layouts live in weights_, which never reuses an address, so comparing the layout pointers is
    // exact (device buffer pointers are not: an expert set reallocated with the same sizes gets the
    // same buffers with other arguments, e.g. NVFP4 global scales). n compares per step.
    const void * expert_table_cached(const QWeight * experts, int32_t n) {
        auto it = expert_tables_.find(experts);
        if (it == expert_tables_.end() || it->second.layouts.size() != size_t(n)) return nullptr;
        for (int32_t e = 0; e < n; ++e)
            if (it->second.layouts[size_t(e)] != experts[e].device_layout) return nullptr;
        return it->second.device->data();
    }
    const DeviceWeight * expert_table(const QWeight * experts, int32_t n) {
        if (const void * p = expert_table_cached(experts, n)) return static_cast<const DeviceWeight *>(p);
        if (workspace_.frozen) fail(SPARK_ERR_INTERNAL, "expert table built during graph capture");
        ExpertTable t;
        t.host   = expert_weights(experts, n);
        for (int32_t e = 0; e < n; ++e) t.layouts.push_back(experts[e].device_layout);
        t.device = alloc(t.host.size() * sizeof(DeviceWeight));
        SPARK_CUDA_CHECK(cudaMemcpyAsync(t.device->data(), t.host.data(), t.host.size() * sizeof(DeviceWeight), cudaMemcpyHostToDevice, stream_));
        SPARK_CUDA_CHECK(cudaStreamSynchronize(stream_));  // t.host is read asynchronously
        const DeviceWeight * p  = static_cast<const DeviceWeight *>(t.device->data());
        expert_tables_[experts] = std::move(t);
        return p;
    }

    static constexpr size_t kMaxSteps = 32;  // decode, verify steps of every draft length, draft steps

    int                     device_;
    std::string             name_;
    uint64_t                total_memory_ = 0;
    cuda::DeviceProps       props_;
    cudaStream_t            stream_ = nullptr;
    GrowingWorkspace        workspace_;
    cuda::OpContext         ctx_;
    std::list<CapturedStep> steps_;
    std::mutex              weights_mutex_;
    std::deque<DeviceWeight> weights_;
    std::unordered_map<const QWeight *, ExpertTable> expert_tables_;
    uint64_t                unbuilt_table_steps_ = 0;
    double                  copy_bandwidth_ = 0.0;
    static constexpr size_t kStagingBytes = size_t(4) << 20;
    void *                  staging_      = nullptr;
    size_t                  staging_used_ = 0;
    std::unique_ptr<OpProfiler> profiler_;
    std::mutex                  exclusive_;  // contexts of the model take it around their steps (exclusive())
    std::unordered_map<uint64_t, std::pair<uint64_t, uint64_t>> fingerprints_;  // graph uid -> (generation, fingerprint)
};

void * GrowingWorkspace::get(size_t bytes) {
    if (buf && buf->size() >= bytes) return buf->data();
    if (frozen) fail(SPARK_ERR_INTERNAL, "CUDA workspace would grow during graph capture (%zu bytes)", bytes);
    be_.synchronize();  // kernels still queued may use the old buffer
    buf.reset();
    buf  = be_.alloc(bytes + bytes / 4);
    grew = true;
    return buf->data();
}

}  // namespace

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

bool cuda_device_usable(int index) {
    if (index < 0 || index >= cuda_device_count()) return false;
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, index) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return cuda::cc_supported(p.major * 100 + p.minor * 10);
}

void cuda_device_describe(int index, spark_device_info & out) {
    const int n = cuda_device_count();
    if (n == 0) fail(SPARK_ERR_UNSUPPORTED, "no CUDA device is available");
    if (index < 0 || index >= n) fail(SPARK_ERR_INVALID_ARGUMENT, "CUDA device %d does not exist (%d devices)", index, n);
    cudaDeviceProp p{};
    SPARK_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
    const int cc = p.major * 100 + p.minor * 10;
    out          = spark_device_info{};
    std::snprintf(out.name, sizeof out.name, "%.*s", int(sizeof out.name - 1), p.name);  // a longer name is cut, on purpose
    out.compute_capability = p.major * 10 + p.minor;
    out.multiprocessors    = p.multiProcessorCount;
    out.total_memory       = p.totalGlobalMem;
    size_t free_b = 0, total_b = 0;
    int    prev   = 0;
    cudaGetDevice(&prev);
    if (cudaSetDevice(index) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) out.free_memory = free_b;
    cudaGetLastError();
    cudaSetDevice(prev);
    std::snprintf(out.kernel_paths, sizeof out.kernel_paths, "%s", cuda::kernel_paths(cc));
    if (!cuda::cc_supported(cc))
        fail(SPARK_ERR_UNSUPPORTED, "GPU '%s' has compute capability %d.%d; spark needs 8.0 or newer", p.name, p.major, p.minor);
}

std::unique_ptr<Backend> make_cuda_backend(int device_index) { return std::make_unique<CudaBackend>(device_index); }

}  // namespace spark
