// The PTX of the Hopper generation and newer (sm_90+) that kernels use beyond the sm_80 baseline
// (ptx_sm80.cuh): the thread-block-cluster barrier. Its other sm_90 instruction, griddepcontrol,
// lives in pdl.cuh with the rules of programmatic dependent launch. Callers compile their sm_90
// paths only where common/arch.h's SPARK_ARCH_HOPPER_PLUS is 1; a pass for an older target traps.
#pragma once

#include "backends/cuda/common/arch.h"

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

}  // namespace spark::cuda::ptx
