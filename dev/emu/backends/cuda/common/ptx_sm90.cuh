// Emulator stand-in for src/backends/cuda/common/ptx_sm90.cuh (found first on the include path of
// every kernel lab in dev/kernels): the thread-block-cluster barrier and the cluster's shared memory
// on the emulator's cluster launches (emu_runtime.h, LaunchOptions::cluster: the blocks of a cluster
// run together). The barrier completes a phase when every live thread of the cluster has arrived; a
// wait returns once the phase its thread arrived in has completed; arriving twice without a wait, or
// waiting without an arrival, is reported. release / acquire are not modelled apart from that
// (writes are visible at once): a missing barrier shows as a read of the NaN fill or a stale value.
#pragma once

#include <cuda_runtime.h>  // the emulator's

#include <cstdint>

namespace spark::cuda::ptx {

namespace emu_cluster {
inline void arrive() {
    emu::Sched &          s = emu::S();
    emu::ClusterBarrier & c = s.cluster_bar;
    emu::Fiber &          f = s.fibers[size_t(s.cur)];
    if (c.expected == 0) emu::die("barrier.cluster outside a launch");
    if (f.cluster_phase >= 0) emu::die("barrier.cluster.arrive twice without a wait");
    f.cluster_phase = c.phase;
    if (++c.arrived >= c.expected) {
        c.arrived = 0;
        ++c.phase;
        for (int w : c.waiters) s.fibers[size_t(w)].waiting = false;
        c.waiters.clear();
    }
}
}  // namespace emu_cluster

inline void barrier_cluster_arrive_relaxed() { emu_cluster::arrive(); }
inline void barrier_cluster_arrive_release() { emu_cluster::arrive(); }
inline void barrier_cluster_wait() {
    emu::Sched &          s = emu::S();
    emu::ClusterBarrier & c = s.cluster_bar;
    const int             me = s.cur;
    if (s.fibers[size_t(me)].cluster_phase < 0) emu::die("barrier.cluster.wait without an arrive");
    while (c.phase == s.fibers[size_t(me)].cluster_phase) {
        c.waiters.push_back(me);
        s.fibers[size_t(me)].waiting = true;
        emu::yield();
    }
    s.fibers[size_t(me)].cluster_phase = -1;
}

// %cluster_ctarank: this block's rank in its cluster (x fastest).
inline uint32_t cluster_ctarank() { return uint32_t(emu::S().fibers[size_t(emu::S().cur)].slot); }

// mapa: the address of the same shared-memory location in block `rank` of the cluster.
template <class T> inline T * map_cluster_shared(T * p, uint32_t rank) {
    return static_cast<T *>(emu::cluster_smem(p, rank));
}

}  // namespace spark::cuda::ptx
