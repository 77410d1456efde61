// The PTX of the Hopper generation and newer (sm_90+) that kernels use beyond the sm_80 baseline
// (ptx_sm80.cuh): the thread-block-cluster barrier and the cluster's shared memory. Its other sm_90 instruction, griddepcontrol,
// lives in pdl.cuh with the rules of programmatic dependent launch. Callers compile their sm_90
// paths only where common/arch.h's SPARK_ARCH_HOPPER_PLUS is 1; a pass for an older target traps.
#pragma once

#include "backends/cuda/common/arch.h"

#include <cstdint>

// The instruction of a wrapper, in device passes that have it (sm_90+); a trap in the others.
#if SPARK_ARCH_HOPPER_PLUS
#define SPARK_PTX_SM90(...) __VA_ARGS__
#else
#define SPARK_PTX_SM90(...) __trap()
#endif

namespace spark::cuda::ptx {

// ---- barrier.cluster: every thread of every CTA of the cluster arrives, then waits for all; split
// in two so that work can go between the arrive and the wait. .aligned: the whole warp executes it.

// barrier.cluster.arrive.relaxed.aligned: arrive without ordering memory (e.g. the "all CTAs of the
// cluster have started" barrier required before touching another CTA's shared memory).
__device__ __forceinline__ void barrier_cluster_arrive_relaxed() {
    SPARK_PTX_SM90(asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory"));
}
// barrier.cluster.arrive.release.aligned: this thread's earlier writes (also to other CTAs' shared
// memory) are visible to the threads whose wait completes this barrier phase.
__device__ __forceinline__ void barrier_cluster_arrive_release() {
    SPARK_PTX_SM90(asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory"));
}
// barrier.cluster.wait.aligned: waits until every thread of the cluster has arrived, with acquire
// semantics (the wait's default): what the arriving threads released is visible after it.
__device__ __forceinline__ void barrier_cluster_wait() {
    SPARK_PTX_SM90(asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"));
}

// ---- the cluster's shared memory (distributed shared memory). The CPU warp emulator models these
// (dev/emu/backends/cuda/common/ptx_sm90.cuh, its cluster launches).

// %cluster_ctarank: this CTA's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_ctarank() {
    uint32_t r = 0;
    SPARK_PTX_SM90(asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r)));
    return r;
}
// mapa.u64 (generic addresses): the address of the same location of this CTA's shared memory `p` in
// CTA `rank` of the cluster; plain loads and stores through it reach that CTA's shared memory
// (ordered with its threads by the cluster barrier's release / acquire).
template <class T> __device__ __forceinline__ T * map_cluster_shared(T * p, uint32_t rank) {
    uint64_t a = 0;
    SPARK_PTX_SM90(asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(a) : "l"(reinterpret_cast<uint64_t>(p)), "r"(rank)));
    return reinterpret_cast<T *>(a);
}

}  // namespace spark::cuda::ptx
