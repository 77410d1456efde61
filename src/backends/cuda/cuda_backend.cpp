// The CUDA backend: device memory (buffers, the growing workspace, the pinned staging ring for
// small uploads), weights (upload / repack, the device layouts, MoE expert tables) and the dispatch
// of a step's nodes to the op launchers (ops.h). What it delegates:
//   graph_cache.h  CUDA-graph capture and replay of the steps that repeat
//   fusion.h       which nodes one launch covers (peephole fusion)
//   profiler.h     SPARK_PROFILE_OPS: per-op GPU times
//   step_trace.h   SPARK_STEP_TRACE builds: when each kernel of a replayed step was released
// The collectives of a model split over ranks (ALL_REDUCE) it orders on its stream itself, through
// the graph's communicator (backends/comm.h).
#include "backends/cuda/cuda_backend.h"

#include "backends/comm.h"

#include "backends/cuda/common/arch.h"
#include "backends/cuda/common/kernel_args.h"
#include "backends/cuda/common/launch.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/fp4/w4a4.h"
#include "backends/cuda/fusion.h"
#include "backends/cuda/graph_cache.h"
#include "backends/cuda/matmul/matmul.h"
#include "backends/cuda/matmul/op_plan.h"
#include "backends/cuda/ops.h"
#include "backends/cuda/profiler.h"
#include "backends/cuda/step_trace.h"
#include "backends/cuda/weight_arena.h"
#include "backends/cuda/weight_batch.h"
#include "backends/cuda/weight_placement.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
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

cuda::DeviceProps device_props(const cudaDeviceProp & p, int device) {
    cuda::DeviceProps d;
    d.cc                 = p.major * 100 + p.minor * 10;
    d.sm_count           = p.multiProcessorCount;
    d.max_smem_per_block = int(p.sharedMemPerBlockOptin);
    d.l2_bytes           = size_t(p.l2CacheSize);
    // The planner's device rates (matmul/op_plan.h, device_rates): from the attributes, not a
    // measurement, so that a device always gets the same plans (and the same rounding).
    int mem_khz = 0, bus_bits = 0, sm_khz = 0;
    if (cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess) mem_khz = 0;
    if (cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) bus_bits = 0;
    if (cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, device) != cudaSuccess) sm_khz = 0;
    cudaGetLastError();
    cuda::mm::device_rates(d, mem_khz, bus_bits, sm_khz);
    return d;
}

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

// Scratch for the ops (ops.h: Workspace): one buffer, reallocated larger when an eager run asks for
// more (never during capture: every captured step ran eagerly with its shapes first).
class GrowingWorkspace final : public cuda::Workspace {
public:
    explicit GrowingWorkspace(CudaBackend & be) : be_(be) {}
    void * get(size_t bytes) override;

private:
    CudaBackend &           be_;
    std::unique_ptr<Buffer> buf_;
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
        props_ = device_props(prop, device);
        if (!cuda::cc_supported(props_.cc))
            fail(SPARK_ERR_UNSUPPORTED, "GPU '%s' has compute capability %d.%d; spark needs 8.0 or newer (Ampere, Ada, Hopper, Blackwell)",
                 prop.name, prop.major, prop.minor);
        total_memory_ = uint64_t(prop.totalGlobalMem);
        name_                     = prop.name;
        SPARK_CUDA_CHECK(cudaSetDevice(device));
        props_.w4a4 = cuda::w4a4_runs_here(props_.cc);  // (asks the current device for its cubin)
        SPARK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        ctx_.stream       = stream_;
        ctx_.workspace    = &workspace_;
        ctx_.props        = &props_;
        ctx_.backend      = this;
        ctx_.expert_table = &CudaBackend::expert_table_thunk;
        profiler_         = cuda::OpProfiler::from_env();
        tracer_           = cuda::StepTracer::from_env();
        graphs_ = std::make_unique<cuda::GraphCache>(stream_, /*enabled=*/!profiler_, &CudaBackend::expert_table_if_built, this);
        // A device without a memory clock attribute (an integrated GPU may report none): the planner
        // takes the copy bandwidth measured now, to two significant digits (the same plans run to run
        // unless the machine changes).
        if (props_.bw_bytes_per_us <= 0.0) {
            const double bw = copy_bandwidth() / 1e6, unit = std::pow(10.0, std::floor(std::log10(bw)) - 1.0);
            props_.bw_bytes_per_us = bw > 0.0 ? std::round(bw / unit) * unit : 0.0;
        }
    }

    ~CudaBackend() override {
        cudaSetDevice(device_);
        if (stream_) cudaStreamSynchronize(stream_);
        graphs_.reset();
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

    std::unique_ptr<WeightBatch> begin_weights(std::vector<std::unique_ptr<Buffer>> & storage, int n_threads,
                                               const HostReader * source) override {
        activate();
        const cuda::WeightPlacement place = cuda::choose_weight_placement(cuda::memory_facts(device_), cuda::weights_in_place_override());
        return cuda::make_weight_batch(device_, size_t(total_memory_), n_threads, storage,
                                       [this](const QWeight & host, const DeviceWeight & dw) { return remember(host, dw); },
                                       place == cuda::WeightPlacement::InPlace ? source : nullptr);
    }

    QWeight random_weight(const RandomWeightSpec & spec, std::vector<std::unique_ptr<Buffer>> & storage) override {
        activate();
        // The model's random weights share one arena, the first buffer of its storage: a cudaMalloc
        // each rounds every weight up to the driver's 2 MiB pages (MiniMax-M2's 2.25 MiB experts
        // would take 4 MiB: 186 GiB for 112 GiB of INT4 weights).
        auto * arena = storage.empty() ? nullptr : dynamic_cast<cuda::WeightArena *>(storage.front().get());
        if (!arena) {
            auto fresh = std::make_unique<cuda::WeightArena>(device_, size_t(total_memory_));
            arena      = fresh.get();
            storage.insert(storage.begin(), std::move(fresh));
        }
        auto take = [](void * a, size_t bytes) { return static_cast<cuda::WeightArena *>(a)->take_usable(bytes); };
        return remember(random_weight_layout(spec), cuda::random_device_weight(spec, take, arena, stream_));
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

    std::vector<int> launch_last_nodes(const Graph & graph) override {
        cuda::OpContext ctx = ctx_;  // (as run_nodes will see it)
        ctx.prompt_step     = graph.prompt_step();
        return cuda::launch_last_nodes(graph, ctx);
    }

    void compute(Graph & graph, Executor *) override {
        activate();
        if (tracer_) tracer_->begin_step(stream_);
        const cuda::GraphCache::Ran ran = graphs_->run(graph, [&] { run_nodes(graph); });
        if (tracer_) tracer_->end_step(stream_, ran.fingerprint, ran.replayed);
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

    // The weight as the rest of spark sees it: the canonical QWeight as given (format, shape,
    // groups, blocks, scales; its pointers are the host buffers it was read from, which the kernels
    // never touch), with device_layout pointing at the DeviceWeight the kernels read. Nothing of the
    // device layout is copied back into it.
    QWeight remember(const QWeight & logical, const DeviceWeight & dw) {
        std::lock_guard<std::mutex> lock(weights_mutex_);
        weights_.push_back(dw);
        QWeight out       = logical;
        out.device_layout = &weights_.back();
        return out;
    }

    // A/B switches read once: on unless the variable is "0".
    static bool switch_on(const char * name) {
        const char * e = std::getenv(name);
        return !(e && std::string(e) == "0");
    }
    // SPARK_EARLY_IDS=0: every expert GEMV waits before reading its ids (A/B timing).
    static bool early_ids_enabled() {
        static const bool on = switch_on("SPARK_EARLY_IDS");
        return on;
    }
    // SPARK_EARLY_X=0: every expert GEMV converts its activations after its wait (A/B timing).
    static bool early_x_enabled() {
        static const bool on = switch_on("SPARK_EARLY_X");
        return on;
    }

    // A decode or verify step: every matmul has at most the GEMV's row count (prefill steps have
    // more and launch without PDL, common/launch.h).
    static bool decode_sized(const std::vector<Tensor *> & nodes) {
        for (const Tensor * n : nodes) {
            if (n->op != Op::MATMUL && n->op != Op::MATMUL_ID) continue;
            const Tensor & x    = *n->src[0];
            const int64_t  rows = n->op == Op::MATMUL ? x.nrows() : x.ne[2] * x.ne[3];
            if (rows > cuda::mm::kGemvMaxRows) return false;
        }
        return true;
    }

    void run_nodes(const Graph & graph) {
        const cuda::PdlStep pdl_step(decode_sized(graph.nodes()));
        ctx_.prompt_step = graph.prompt_step();
        cuda::FusionPass    fusion(graph, ctx_);
        bool after_collective = false;
        for (cuda::FusedLaunch l; fusion.next(l);) {
            // Early expert ids and activations (ops.h: OpContext::ids_before_wait): written before
            // the latest launch whose op said (ctx_.last_waits_first) that it triggers only after
            // its wait.
            ctx_.ids_before_wait  = early_ids_enabled() && fusion.ids_written_before_barrier(l);
            ctx_.x_before_wait    = early_x_enabled() && fusion.x_written_before_barrier(l);
            ctx_.last_waits_first = false;
            const cuda::OpTimer timer(profiler_.get(), stream_, *l.nodes[0], l.label);
            if (tracer_) tracer_->set_label(cuda::launch_key(*l.nodes[0], l.label));
            if (l.kind == cuda::FusedLaunch::Kind::Node && l.nodes[0]->op == Op::ALL_REDUCE) {
                all_reduce(graph, *l.nodes[0]);
                fusion.launched(false);  // (the barrier before it still holds: the launch after it waits in stream order)
                after_collective = true;
                continue;
            }
            // The launch after a collective goes without PDL (pdl.cuh): an early start pairs a kernel
            // with the kernel before it, and a collective is no kernel of ours (a copy and the
            // communicator's own work, e.g. NCCL's kernels, which never trigger dependents): nothing
            // to overlap with, and nothing this launch reads early (weights aside) may be assumed
            // complete before it. Its kernels wait in plain stream order; the launches after it use
            // PDL again (their waits are then no-ops to this one's, pdl.cuh).
            std::optional<cuda::PdlStep> no_pdl;
            if (after_collective) no_pdl.emplace(false);
            after_collective = false;
            launch(l);
            fusion.launched(ctx_.last_waits_first);
        }
        ctx_.ids_before_wait = ctx_.x_before_wait = ctx_.last_waits_first = false;  // (nothing outside a step reads them)
        if (profiler_) profiler_->collect(stream_);
    }

    void launch(const cuda::FusedLaunch & l) {
        using Kind = cuda::FusedLaunch::Kind;
        switch (l.kind) {
            case Kind::Node: return dispatch(*l.nodes[0]);
            case Kind::MatmulSwiglu: return cuda::op_matmul_swiglu(*l.nodes[0], ctx_);
            case Kind::MatmulMulti: return cuda::op_matmul_multi(l.nodes, l.count, ctx_);
            case Kind::AddNormMatmul: return cuda::op_add_norm_matmul(*l.nodes[0], *l.nodes[1], l.nodes + 2, l.count - 2, ctx_);
            case Kind::CombineNormMatmul:
                return cuda::op_combine_norm_matmul(*l.nodes[0], *l.nodes[1], *l.nodes[2], l.nodes + 3, l.count - 3, ctx_);
            case Kind::MatmulNormMatmul:
                return cuda::op_matmul_norm_matmul(*l.nodes[0], *l.nodes[1], *l.nodes[2], l.nodes + 3, l.count - 3, ctx_);
            case Kind::ExpertsNormMatmul:
                return cuda::op_experts_norm_matmul(*l.nodes[0], *l.nodes[1], *l.nodes[2], *l.nodes[3], l.nodes + 4, l.count - 4, ctx_);
            case Kind::AddRmsNorm: return cuda::op_add_rms_norm(*l.nodes[0], *l.nodes[1], ctx_);
            case Kind::RmsNormRope: return cuda::op_rms_norm_rope(*l.nodes[0], *l.nodes[1], ctx_);
            case Kind::RmsNormRopePair: return cuda::op_rms_norm_rope_pair(*l.nodes[0], *l.nodes[1], *l.nodes[2], *l.nodes[3], ctx_);
            case Kind::WholeNormRope:
                return cuda::op_whole_norm_rope_pair(*l.nodes[0], *l.nodes[1], l.count == 4 ? l.nodes[2] : nullptr,
                                                     l.count == 4 ? l.nodes[3] : nullptr, ctx_);
            case Kind::AttentionNormRope:
                return cuda::op_attention_norm_rope(*l.nodes[0], *l.nodes[1], *l.nodes[2], *l.nodes[3], *l.nodes[4], ctx_);
        }
    }

    // ALL_REDUCE (in place over the graph's communicator): src0 copied into the output, then the
    // communicator's sum, both on the stream (the communicator orders its work on the stream it is
    // given: NCCL's collectives are captured into the step's CUDA graph like the copy).
    void all_reduce(const Graph & graph, const Tensor & t) {
        Communicator * comm = graph.comm();
        if (!comm) fail(SPARK_ERR_INTERNAL, "cuda backend: ALL_REDUCE in a graph without a communicator");
        const Tensor & x = *t.src[0];
        if (t.type != DType::F32 || x.type != DType::F32 || !t.is_contiguous() || !x.is_contiguous() || t.nelements() != x.nelements())
            fail(SPARK_ERR_INTERNAL, "cuda backend: ALL_REDUCE takes contiguous F32 tensors of one size");
        if (t.nelements() == 0) return;
        if (t.data != x.data) {
            if (cuda::overlaps(t, x)) fail(SPARK_ERR_INTERNAL, "cuda backend: ALL_REDUCE output partly overlaps its input");
            SPARK_CUDA_CHECK(cudaMemcpyAsync(t.data, x.data, t.nbytes(), cudaMemcpyDeviceToDevice, stream_));
        }
        comm->set_stream(stream_);
        comm->all_reduce_sum(static_cast<float *>(t.data), size_t(t.nelements()));
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
            case Op::SUM_SQR: return cuda::op_sum_sqr(t, ctx_);
            case Op::ALL_REDUCE:  // (run_nodes: all_reduce, with the graph's communicator)
            case Op::COUNT: break;
        }
        fail(SPARK_ERR_INTERNAL, "cuda backend: unknown op %d", int(t.op));
    }

    static const DeviceWeight * expert_table_thunk(void * be, const QWeight * experts, int32_t n) {
        return static_cast<CudaBackend *>(be)->expert_table(experts, n);
    }
    static const void * expert_table_if_built(void * be, const QWeight * experts, int32_t n) {
        return static_cast<CudaBackend *>(be)->expert_table_cached(experts, n);
    }

    // The device array of an expert set, built once (outside capture: the first run is eager). The
    // cache is keyed by the experts' device pointers, so a different expert set at a reused host
    // address gets its own table.
    struct ExpertTable {
        std::vector<DeviceWeight> host;
        std::vector<const void *> layouts;  // experts[e].device_layout when the table was built
        std::unique_ptr<Buffer>   device;
    };
    // Experts another rank holds (expert parallelism: empty QWeights) get absent entries
    // (device_weight.h, absent_expert), whose slots the kernels fill with zeros.
    static std::vector<DeviceWeight> expert_weights(const QWeight * experts, int32_t n) {
        const QWeight * held = cuda::first_held_expert(experts, n);
        if (!held) fail(SPARK_ERR_INTERNAL, "matmul_id: no expert of the set is held on this device");
        const DeviceWeight        absent = cuda::absent_expert(cuda::device_weight(*held));
        std::vector<DeviceWeight> host(static_cast<size_t>(n));
        for (int32_t e = 0; e < n; ++e) host[size_t(e)] = cuda::expert_held(experts[e]) ? cuda::device_weight(experts[e]) : absent;
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
        if (graphs_->capturing()) fail(SPARK_ERR_INTERNAL, "expert table built during graph capture");
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

    int                      device_;
    std::string              name_;
    uint64_t                 total_memory_ = 0;
    cuda::DeviceProps        props_;
    cudaStream_t             stream_ = nullptr;
    GrowingWorkspace         workspace_;
    cuda::OpContext          ctx_;
    std::mutex               weights_mutex_;
    std::deque<DeviceWeight> weights_;
    std::unordered_map<const QWeight *, ExpertTable> expert_tables_;
    double                   copy_bandwidth_ = 0.0;
    static constexpr size_t  kStagingBytes   = size_t(4) << 20;
    void *                   staging_        = nullptr;
    size_t                   staging_used_   = 0;
    std::unique_ptr<cuda::OpProfiler> profiler_;
    std::unique_ptr<cuda::StepTracer> tracer_;  // SPARK_STEP_TRACE builds with SPARK_STEP_TRACE_OUT set
    std::unique_ptr<cuda::GraphCache> graphs_;
    std::mutex                        exclusive_;  // contexts of the model take it around their steps (exclusive())
};

void * GrowingWorkspace::get(size_t bytes) {
    if (buf_ && buf_->size() >= bytes) return buf_->data();
    if (be_.graphs_->capturing()) fail(SPARK_ERR_INTERNAL, "CUDA workspace would grow during graph capture (%zu bytes)", bytes);
    be_.synchronize();  // kernels still queued may use the old buffer
    buf_.reset();
    buf_ = be_.alloc(bytes + bytes / 4);
    be_.graphs_->invalidate();  // the captured steps hold the old buffer's address
    return buf_->data();
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
    cuda::DeviceProps dev = device_props(p, index);
    out          = spark_device_info{};
    std::snprintf(out.name, sizeof out.name, "%.*s", int(sizeof out.name - 1), p.name);  // a longer name is cut, on purpose
    out.compute_capability = p.major * 10 + p.minor;
    out.multiprocessors    = p.multiProcessorCount;
    out.total_memory       = p.totalGlobalMem;
    size_t free_b = 0, total_b = 0;
    int    prev   = 0;
    cudaGetDevice(&prev);
    if (cudaSetDevice(index) == cudaSuccess) {
        if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) out.free_memory = free_b;
        dev.w4a4 = cuda::cc_supported(dev.cc) && cuda::w4a4_runs_here(dev.cc);
    }
    cudaGetLastError();
    cudaSetDevice(prev);
    std::snprintf(out.kernel_paths, sizeof out.kernel_paths, "%s", cuda::kernel_paths(dev).c_str());
    if (!cuda::cc_supported(dev.cc))
        fail(SPARK_ERR_UNSUPPORTED, "GPU '%s' has compute capability %d.%d; spark needs 8.0 or newer", p.name, p.major, p.minor);
}

std::unique_ptr<Backend> make_cuda_backend(int device_index) { return std::make_unique<CudaBackend>(device_index); }

}  // namespace spark
