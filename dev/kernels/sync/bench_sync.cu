// What one dependency between two ops costs on the GPU at batch-1 decode: a kernel boundary (with and
// without programmatic dependent launch, inside a CUDA graph, as spark's decode steps run) against a
// grid-wide barrier inside one persistent kernel (an arrival counter released and acquired through
// L2: what a persistent decode kernel would pay instead) and against flags carried in the data words
// themselves (NCCL's LL protocol: no counter, no fence). Each hop also reads a 2048-float activation
// vector the previous hop wrote (a decode step's hidden state) and one block writes the next one,
// so the numbers include the L2 round trip of the data itself; a chain of empty kernels gives the
// launch boundary alone. Results (H100): docs/PERF.md, "The replayed step on its critical path".
//
// Build and run (repository root; -arch as the GPU):
//   nvcc -O3 -std=c++20 --expt-relaxed-constexpr -arch=sm_90a -Isrc -Iinclude dev/kernels/sync/bench_sync.cu src/backends/cuda/common/launch.cpp src/common/error.cpp -o /tmp/bench_sync && /tmp/bench_sync
//
// Prints microseconds per hop (median of 20 replays of 256 hops) for 1, 32, 132 and 264 blocks of
// 256 threads (264: two blocks per SM on an H100, as the decode GEMVs run).
#include "backends/cuda/common/launch.h"
#include "backends/cuda/common/pdl.cuh"
#include "backends/cuda/cuda_common.h"

#include <cuda/atomic>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

namespace spark::cuda {
void throw_cuda_error(cudaError_t err, const char * call, const char * file, int line) {
    std::fprintf(stderr, "CUDA error %s in %s at %s:%d\n", cudaGetErrorString(err), call, file, line);
    std::exit(1);
}
}  // namespace spark::cuda

namespace sc = spark::cuda;

namespace {

constexpr int kHops = 256, kReplays = 20, kThreads = 256, kVec = 2048;

// Reads the vector `in` (every block: the hidden state every consumer needs), block 0 writes
// `out` = in + 1 (the next op's input).
__device__ void hop(const float * in, float * out) {
    __shared__ float part[kThreads / 32];
    float            s = 0.0f;
    for (int i = threadIdx.x; i < kVec; i += kThreads) s += __ldcg(in + i);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (blockIdx.x == 0)
        for (int i = threadIdx.x; i < kVec; i += kThreads) out[i] = __ldcg(in + i) + (part[0] > 1e30f ? 0.0f : 1.0f);
}

__global__ void hop_kernel(const float * in, float * out, int trigger_first) {
    if (trigger_first) sc::pdl::launch_dependents();
    sc::pdl::wait();
    if (!trigger_first) sc::pdl::launch_dependents();
    hop(in, out);
}

// All hops in one launch: a grid barrier between them (every block must be resident).
__global__ void persistent_kernel(float * a, float * b, unsigned * arrived, int hops) {
    cuda::atomic_ref<unsigned, cuda::thread_scope_device> count(*arrived);
    for (int h = 0; h < hops; ++h) {
        hop(h & 1 ? b : a, h & 1 ? a : b);
        __syncthreads();
        if (threadIdx.x == 0) {
            count.fetch_add(1, cuda::memory_order_release);
            const unsigned target = gridDim.x * unsigned(h + 1);
            while (count.load(cuda::memory_order_acquire) < target) {
            }
        }
        __syncthreads();
    }
}

__global__ void empty_kernel(int trigger_first) {
    if (trigger_first) sc::pdl::launch_dependents();
    sc::pdl::wait();
}

// All hops in one launch with no barrier: the data words carry their hop number (NCCL's LL
// protocol: an 8-byte word = value | hop << 32, stored and loaded whole), so a reader polls the
// words themselves until they are of its hop; no counter, no fence. Block 0 writes the next vector
// once it has read this one. Two vectors alternate, so a word is rewritten two hops later (a block
// two hops behind then reads a newer value: harmless here, the time of block 0's chain is what is
// measured); the hop number, not the buffer, tells a reader the value is fresh enough.
__global__ void persistent_ll_kernel(unsigned long long * a, unsigned long long * b, int hops) {
    __shared__ float part[kThreads / 32];
    for (int h = 0; h < hops; ++h) {
        unsigned long long * in  = h & 1 ? b : a;
        unsigned long long * out = h & 1 ? a : b;
        float                s   = 0.0f;
        float                v[kVec / kThreads];
        for (int j = 0; j < kVec / kThreads; ++j) {
            cuda::atomic_ref<unsigned long long, cuda::thread_scope_device> w(in[threadIdx.x + j * kThreads]);
            unsigned long long                                             x;
            while (((x = w.load(cuda::memory_order_relaxed)) >> 32) < unsigned(h)) {
            }
            v[j] = __uint_as_float(unsigned(x));
            s += v[j];
        }
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
        if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
        __syncthreads();
        if (blockIdx.x == 0)
            for (int j = 0; j < kVec / kThreads; ++j) {
                cuda::atomic_ref<unsigned long long, cuda::thread_scope_device> w(out[threadIdx.x + j * kThreads]);
                const float y = v[j] + (part[0] > 1e30f ? 0.0f : 1.0f);
                w.store((static_cast<unsigned long long>(h + 1) << 32) | __float_as_uint(y), cuda::memory_order_relaxed);
            }
        __syncthreads();
    }
}

float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// us per hop of a graph of kHops kernels (empty: kernels that only wait).
float chain(int blocks, bool pdl, bool trigger_first, float * a, float * b, cudaStream_t s, bool empty = false) {
    cudaGraph_t g;
    SPARK_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int h = 0; h < kHops; ++h) {
        if (empty)
            sc::launch_kernel(empty_kernel, dim3(blocks), dim3(kThreads), 0, s, pdl, trigger_first ? 1 : 0);
        else
            sc::launch_kernel(hop_kernel, dim3(blocks), dim3(kThreads), 0, s, pdl, h & 1 ? b : a, h & 1 ? a : b, trigger_first ? 1 : 0);
    }
    SPARK_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t exec;
    SPARK_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> t;
    for (int r = 0; r < kReplays + 2; ++r) {
        cudaEventRecord(e0, s);
        SPARK_CUDA_CHECK(cudaGraphLaunch(exec, s));
        cudaEventRecord(e1, s);
        SPARK_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (r >= 2) t.push_back(ms * 1000.0f / kHops);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
    return median(t);
}

// us per hop of persistent_ll_kernel; a, b: kVec words each.
float persistent_ll(int blocks, unsigned long long * a, unsigned long long * b, cudaStream_t s) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> t;
    for (int r = 0; r < kReplays + 2; ++r) {
        SPARK_CUDA_CHECK(cudaMemsetAsync(a, 0, kVec * sizeof *a, s));  // hop number 0: hop 0's input
        SPARK_CUDA_CHECK(cudaMemsetAsync(b, 0, kVec * sizeof *b, s));  // hop 1 waits for hop number 1
        cudaEventRecord(e0, s);
        persistent_ll_kernel<<<blocks, kThreads, 0, s>>>(a, b, kHops);
        cudaEventRecord(e1, s);
        SPARK_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (r >= 2) t.push_back(ms * 1000.0f / kHops);
    }
    return median(t);
}

float persistent(int blocks, float * a, float * b, unsigned * arrived, cudaStream_t s) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> t;
    for (int r = 0; r < kReplays + 2; ++r) {
        SPARK_CUDA_CHECK(cudaMemsetAsync(arrived, 0, sizeof(unsigned), s));
        cudaEventRecord(e0, s);
        persistent_kernel<<<blocks, kThreads, 0, s>>>(a, b, arrived, kHops);
        cudaEventRecord(e1, s);
        SPARK_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (r >= 2) t.push_back(ms * 1000.0f / kHops);
    }
    return median(t);
}

}  // namespace

int main() {
    cudaDeviceProp p{};
    SPARK_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    int per_sm = 0;
    SPARK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, kThreads, 0));
    std::printf("%s, %d SMs; us per hop (median of %d replays of %d hops; hop = read 2048 floats, one block writes them)\n", p.name,
                p.multiProcessorCount, kReplays, kHops);
    float *    a = nullptr, *b = nullptr;
    unsigned * arrived = nullptr;
    SPARK_CUDA_CHECK(cudaMalloc(&a, kVec * sizeof(float)));
    SPARK_CUDA_CHECK(cudaMalloc(&b, kVec * sizeof(float)));
    SPARK_CUDA_CHECK(cudaMalloc(&arrived, sizeof(unsigned)));
    SPARK_CUDA_CHECK(cudaMemset(a, 0, kVec * sizeof(float)));
    cudaStream_t s;
    SPARK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned long long *la = nullptr, *lb = nullptr;
    SPARK_CUDA_CHECK(cudaMalloc(&la, kVec * sizeof *la));
    SPARK_CUDA_CHECK(cudaMalloc(&lb, kVec * sizeof *lb));
    int per_sm_ll = 0;
    SPARK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_ll, persistent_ll_kernel, kThreads, 0));
    std::printf("| blocks | empty kernels, PDL at start | kernels, no PDL | kernels, PDL, trigger after wait | kernels, PDL, trigger at start "
                "| one persistent kernel, grid barrier | one persistent kernel, flags in the data words |\n");
    std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int blocks : {1, 32, p.multiProcessorCount, 2 * p.multiProcessorCount}) {
        const float empty = chain(blocks, true, true, a, b, s, true);
        const float plain = chain(blocks, false, false, a, b, s);
        const float late  = chain(blocks, true, false, a, b, s);
        const float early = chain(blocks, true, true, a, b, s);
        char        pers[32], ll[32];
        if (blocks <= per_sm * p.multiProcessorCount)
            std::snprintf(pers, sizeof pers, "%.2f", persistent(blocks, a, b, arrived, s));
        else
            std::snprintf(pers, sizeof pers, "(not resident)");
        if (blocks <= per_sm_ll * p.multiProcessorCount)
            std::snprintf(ll, sizeof ll, "%.2f", persistent_ll(blocks, la, lb, s));
        else
            std::snprintf(ll, sizeof ll, "(not resident)");
        std::printf("| %d | %.2f | %.2f | %.2f | %.2f | %s | %s |\n", blocks, empty, plain, late, early, pers, ll);
    }
    return 0;
}
