#include "backends/cuda/step_trace.h"

#include "backends/cuda/common/step_trace.cuh"
#include "common/log.h"

#include <algorithm>
#include <atomic>
#include <cxxabi.h>
#include <cstdlib>
#include <map>
#include <mutex>

namespace spark::cuda {

namespace trace {
namespace {
std::mutex & units_mutex() {
    static std::mutex m;
    return m;
}
std::vector<void (*)(Buffer *)> & units() {
    static std::vector<void (*)(Buffer *)> v;
    return v;
}
void set_all(Buffer * b) {
    std::lock_guard<std::mutex> lock(units_mutex());
    for (auto set : units()) set(b);
}
}  // namespace

void register_unit(void (*set_buffer)(Buffer *)) {
    std::lock_guard<std::mutex> lock(units_mutex());
    units().push_back(set_buffer);
}
}  // namespace trace

namespace {
thread_local StepTracer * t_tracing = nullptr;  // the tracer of the step under way on this thread
constexpr int             kMaxSteps = 16;        // replayed steps written
}  // namespace

void trace_note_launch(const void * kernel, dim3 grid) {
    if (t_tracing) t_tracing->note_launch(kernel, grid);
}

std::unique_ptr<StepTracer> StepTracer::from_env() {
    const char * path = std::getenv("SPARK_STEP_TRACE_OUT");
    if (!path || !*path) return nullptr;
#if !defined(SPARK_STEP_TRACE)
    log(SPARK_LOG_WARN, "SPARK_STEP_TRACE_OUT is set but this build has no step trace (cmake -DSPARK_STEP_TRACE=ON)\n");
    return nullptr;
#else
    static std::atomic<bool> taken{false};  // one tracer per process: the kernels' buffer pointers are global
    if (taken.exchange(true)) {
        log(SPARK_LOG_WARN, "SPARK_STEP_TRACE_OUT: only the first CUDA backend of the process is traced\n");
        return nullptr;
    }
    std::FILE * out = std::fopen(path, "w");
    if (!out) {
        log(SPARK_LOG_WARN, "SPARK_STEP_TRACE_OUT: cannot write %s\n", path);
        return nullptr;
    }
    std::fprintf(out, "step,index,label,kernel,grid,blocks_seen,first_arrive_ns,first_release_ns,last_release_ns,"
                      "split_med_ns,loop_med_ns,end_med_ns,last_end_ns\n");
    constexpr uint64_t capacity = 1u << 20;
    void *             p        = nullptr;
    if (cudaMalloc(&p, sizeof(trace::Buffer) + capacity * sizeof(trace::Record)) != cudaSuccess) {
        std::fclose(out);
        log(SPARK_LOG_WARN, "SPARK_STEP_TRACE_OUT: no device memory for the trace\n");
        return nullptr;
    }
    auto *             b  = static_cast<trace::Buffer *>(p);
    const trace::Buffer head{0, capacity, {}};
    cudaMemcpy(b, &head, sizeof head, cudaMemcpyHostToDevice);
    trace::set_all(b);
    return std::unique_ptr<StepTracer>(new StepTracer(out, b, capacity));
#endif
}

StepTracer::StepTracer(std::FILE * out, trace::Buffer * buffer, uint64_t capacity) : out_(out), buffer_(buffer), capacity_(capacity) {}

StepTracer::~StepTracer() {
    if (t_tracing == this) t_tracing = nullptr;
    trace::set_all(nullptr);
    cudaDeviceSynchronize();
    cudaFree(buffer_);
    std::fclose(out_);
}

void StepTracer::begin_step(cudaStream_t stream) {
    launches_.clear();
    label_.clear();
    t_tracing = this;
    cudaMemsetAsync(&buffer_->count, 0, sizeof buffer_->count, stream);
}

void StepTracer::note_launch(const void * kernel, dim3 grid) {
    const char * name = nullptr;
    if (cudaFuncGetName(&name, kernel) != cudaSuccess || !name) name = "?";
    int          status    = 0;
    char *       demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    launches_.push_back({label_, status == 0 && demangled ? demangled : name, uint64_t(grid.x) * grid.y * grid.z});
    std::free(demangled);
}

void StepTracer::end_step(cudaStream_t stream, uint64_t fingerprint, bool replayed) {
    t_tracing = nullptr;
    if (!replayed) {
        lists_[fingerprint] = std::move(launches_);
        return;
    }
    if (written_ >= kMaxSteps) return;
    const int step = written_++;
    cudaStreamSynchronize(stream);
    unsigned long long count = 0;
    cudaMemcpy(&count, &buffer_->count, sizeof count, cudaMemcpyDeviceToHost);
    const uint64_t             n = std::min<uint64_t>(count, capacity_);
    std::vector<trace::Record> rec(n);
    cudaMemcpy(rec.data(), buffer_->rec, n * sizeof(trace::Record), cudaMemcpyDeviceToHost);
    if (count > capacity_) log(SPARK_LOG_WARN, "step trace: %llu records, %llu kept\n", count, (unsigned long long) capacity_);

    struct Kernel {
        uint64_t first_arrive = UINT64_MAX, first_release = UINT64_MAX, last_release = 0, blocks = 0, last_end = 0;
        std::vector<uint64_t> phase[trace::kPhases];  // the blocks' marks (step_trace.cuh)
    };
    std::map<uint64_t, Kernel> by_grid;
    for (const trace::Record & r : rec) {
        Kernel & k      = by_grid[r.grid];
        k.first_arrive  = std::min(k.first_arrive, r.arrive_ns);
        k.first_release = std::min(k.first_release, r.release_ns);
        k.last_release  = std::max(k.last_release, r.release_ns);
        for (int p = 0; p < trace::kPhases; ++p)
            if (r.phase_ns[p] != 0) k.phase[p].push_back(r.phase_ns[p]);
        if (r.phase_ns[trace::kEnd] != 0) k.last_end = std::max(k.last_end, r.phase_ns[trace::kEnd]);
        ++k.blocks;
    }
    // A phase's median over the blocks that marked it, after the kernel's first release; -1: none.
    auto median_after = [](std::vector<uint64_t> & v, uint64_t from) -> long long {
        if (v.empty()) return -1;
        std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
        return (long long) (v[v.size() / 2] - from);
    };
    std::vector<Kernel> kernels;
    for (auto & [grid, k] : by_grid) kernels.push_back(std::move(k));
    std::sort(kernels.begin(), kernels.end(), [](const Kernel & a, const Kernel & b) { return a.first_release < b.first_release; });
    const auto                  it    = lists_.find(fingerprint);
    const std::vector<Launch> * names = it != lists_.end() && it->second.size() == kernels.size() ? &it->second : nullptr;
    if (!names)
        log(SPARK_LOG_WARN, "step trace: %zu kernels traced, %zu launches known for the step: kernels left unnamed\n", kernels.size(),
            it != lists_.end() ? it->second.size() : size_t(0));
    const uint64_t t0 = kernels.empty() ? 0 : kernels[0].first_release;
    for (size_t i = 0; i < kernels.size(); ++i) {
        Kernel &       k = kernels[i];
        std::string    label  = names ? (*names)[i].label : "?";
        std::string    kernel = names ? (*names)[i].kernel : "?";
        for (std::string * s : {&label, &kernel})
            for (char & c : *s)
                if (c == ',' || c == '"') c = ';';
        std::fprintf(out_, "%d,%zu,%s,%s,%llu,%llu,%lld,%lld,%lld,%lld,%lld,%lld,%lld\n", step, i, label.c_str(), kernel.c_str(),
                     (unsigned long long) (names ? (*names)[i].blocks : 0), (unsigned long long) k.blocks,
                     (long long) (k.first_arrive - t0), (long long) (k.first_release - t0), (long long) (k.last_release - t0),
                     median_after(k.phase[trace::kSplit], k.first_release), median_after(k.phase[trace::kLoop], k.first_release),
                     median_after(k.phase[trace::kEnd], k.first_release), k.last_end ? (long long) (k.last_end - t0) : -1LL);
    }
    std::fflush(out_);
}

}  // namespace spark::cuda
