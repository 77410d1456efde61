// The step trace's device half (a build with -DSPARK_STEP_TRACE=ON only; docs/PERF.md, "Where a
// step's time goes"): pdl::wait() stamps, for thread 0 of every block, when the block arrived at its
// wait (its prologue done: the weight loads issued) and when the wait returned (every earlier kernel
// of the stream complete). A kernel's first release is when its critical path starts, so the time
// from one kernel's first release to the next one's is that kernel's share of the step, measured
// inside a replayed CUDA graph, where no host profiler can look (there is no Nsight Systems on the
// machines spark is measured on). The host half (step_trace.h) gives each translation unit's copy of
// the buffer pointer its address, collects the records and names the kernels.
//
// A kernel may also stamp phases of its work after the wait (mark(): the decode GEMV's activation
// split, its main loop, its last store; the attention decode's prologue, its tile loop, its results
// or merge), so that a kernel's share splits into its own work after
// the release and the hop to the next kernel's release (its completion, the memory flush, the next
// wait). Every path of such a kernel must have called pdl::wait() before its first mark().
#pragma once

#include <cstdint>

namespace spark::cuda::trace {

enum Phase : int { kSplit = 0, kLoop = 1, kEnd = 2, kPhases = 3 };

struct Record {
    uint64_t grid;              // %gridid: one value per launched grid
    uint64_t arrive_ns;         // %globaltimer at the block's wait
    uint64_t release_ns;        // ... when the wait returned
    uint64_t phase_ns[kPhases]; // ... at the kernel's marks (0: not marked)
    uint32_t block;             // linear block index
    uint32_t sm;                // %smid
};

struct Buffer {
    unsigned long long count;     // records written (may exceed capacity: the rest were dropped)
    unsigned long long capacity;  // records that fit in rec[]
    Record             rec[1];    // capacity records (the allocation is larger)
};

// Host half (step_trace.cpp): every translation unit with kernels hands over how to set its copy.
void register_unit(void (*set_buffer)(Buffer *));

#if defined(__CUDACC__) && defined(SPARK_STEP_TRACE)
namespace {
// One per translation unit (device symbols are per module without relocatable device code); the
// host half sets every unit's copy through the registrar below. nullptr: not tracing.
__device__ Buffer * g_buffer = nullptr;

void set_buffer(Buffer * b) { cudaMemcpyToSymbol(g_buffer, &b, sizeof b); }
struct Registrar {
    Registrar() { register_unit(&set_buffer); }
};
const Registrar g_registrar;
}  // namespace

__device__ __forceinline__ uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The block's record (thread 0's, set at its wait; ~0: none), for mark().
__device__ __forceinline__ unsigned long long & record_slot() {
    __shared__ unsigned long long slot;
    return slot;
}

__device__ __forceinline__ void record_wait(uint64_t arrive_ns) {
    if ((threadIdx.x | threadIdx.y | threadIdx.z) != 0) return;
    record_slot() = ~0ull;
    Buffer * b = g_buffer;
    if (b == nullptr) return;
    const uint64_t           release_ns = now_ns();
    const unsigned long long i          = atomicAdd(&b->count, 1ull);
    if (i >= b->capacity) return;
    uint64_t grid;
    uint32_t sm;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    b->rec[i]     = {grid, arrive_ns, release_ns, {0, 0, 0}, blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), sm};
    record_slot() = i;
}

// Thread 0 stamps phase p of its block (after the block's pdl::wait()).
__device__ __forceinline__ void mark(Phase p) {
    if ((threadIdx.x | threadIdx.y | threadIdx.z) != 0) return;
    const unsigned long long i = record_slot();
    Buffer *                 b = g_buffer;
    if (b == nullptr || i >= b->capacity) return;
    b->rec[i].phase_ns[p] = now_ns();
}
#elif defined(__CUDACC__)
__device__ __forceinline__ void mark(Phase) {}  // (builds without the trace)
#else
inline void mark(Phase) {}  // (host code, the CPU warp emulator)
#endif

}  // namespace spark::cuda::trace
