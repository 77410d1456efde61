// Checks the CPU warp emulator's thread-block clusters (dev/emu/emu_runtime.h, LaunchOptions::cluster;
// ptx_sm90.cuh's barrier.cluster and mapa shadows) on a small kernel: each block of a cluster sums its
// slice of a row into its own shared memory, the cluster barrier publishes the sums, rank 0 reads them
// all through map_cluster_shared and writes the row's total. The kernel with the barrier must give the
// right totals under every schedule; without it (or with the arrive after the reads) some schedule
// must expose the race, as a read of the NaN fill or of another block's value. Part of the CPU test
// suite (ctest: emu-cluster).
#include "backends/cuda/common/ptx_sm80.cuh"  // the emulator's (SPARK_DYNAMIC_SMEM)
#include "backends/cuda/common/ptx_sm90.cuh"  // the emulator's

#include <cmath>
#include <cstdio>
#include <vector>

using namespace spark::cuda;

namespace {

constexpr int kThreads = 64;

enum class Sync { Barrier, None, LateArrive };

// grid (cluster size, rows): the cluster of row blockIdx.y; x[row][n], out[row].
void cluster_sum(const float * x, int n, float * out, Sync sync) {
    SPARK_DYNAMIC_SMEM(float, smem);  // [0, 64): the threads' sums; [64]: the block's
    const uint32_t rank = ptx::cluster_ctarank();
    const int      cs   = int(gridDim.x);
    const float *  row  = x + int64_t(blockIdx.y) * n;
    const int      per  = (n + cs - 1) / cs;
    const int      beg  = int(rank) * per, end = beg + per < n ? beg + per : n;
    float          acc  = 0.0f;
    for (int i = beg + int(threadIdx.x); i < end; i += kThreads) acc += row[i];
    smem[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float b = 0.0f;
        for (int t = 0; t < kThreads; ++t) b += smem[t];
        smem[kThreads] = b;
    }
    if (sync == Sync::Barrier) {
        ptx::barrier_cluster_arrive_release();
        ptx::barrier_cluster_wait();
    }
    if (sync == Sync::LateArrive) ptx::barrier_cluster_arrive_release();
    if (rank == 0 && threadIdx.x == 0) {
        float total = 0.0f;
        for (int r = 0; r < cs; ++r) total += *ptx::map_cluster_shared(&smem[kThreads], uint32_t(r));
        out[blockIdx.y] = total;
    }
    // The others' shared memory must outlive rank 0's reads: a second barrier (a block that exits
    // releases its shared memory on the GPU; the emulator keeps it, so only the first one is checked).
    if (sync == Sync::Barrier) {
        ptx::barrier_cluster_arrive_relaxed();
        ptx::barrier_cluster_wait();
    }
    if (sync == Sync::LateArrive) ptx::barrier_cluster_wait();
}

int failures = 0;

// Runs the kernel over `seeds` schedules; returns how many gave a wrong total.
int run(Sync sync, int cs, int rows, int n, int seeds) {
    std::vector<float> x(size_t(rows) * n), ref(size_t(rows), 0.0f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 7) - 3);
    for (int r = 0; r < rows; ++r)
        for (int i = 0; i < n; ++i) ref[size_t(r)] += x[size_t(r) * n + i];
    int wrong = 0;
    for (int seed = 1; seed <= seeds; ++seed) {
        std::vector<float> out(size_t(rows), NAN);
        emu::LaunchOptions o;
        o.smem_bytes  = (kThreads + 4) * sizeof(float);
        o.cluster     = dim3(unsigned(cs), 1, 1);
        o.stack_bytes = 64 * 1024;
        emu::launch(dim3(unsigned(cs), unsigned(rows)), dim3(kThreads), o, [&] { cluster_sum(x.data(), n, out.data(), sync); }, uint64_t(seed));
        for (int r = 0; r < rows; ++r)
            if (!(out[size_t(r)] == ref[size_t(r)])) {
                ++wrong;
                break;
            }
    }
    return wrong;
}

void expect(bool ok, const char * what) {
    std::printf("%-4s %s\n", ok ? "ok" : "FAIL", what);
    if (!ok) ++failures;
}

}  // namespace

int main() {
    expect(run(Sync::Barrier, 4, 3, 1000, 20) == 0, "cluster of 4, barrier: right totals under 20 schedules");
    expect(run(Sync::Barrier, 8, 2, 333, 10) == 0, "cluster of 8, barrier: right totals under 10 schedules");
    expect(run(Sync::Barrier, 1, 2, 100, 5) == 0, "cluster of 1 (no peers): right totals");
    expect(run(Sync::None, 4, 3, 1000, 20) > 0, "no barrier: some schedule reads a peer's sum before it is written");
    expect(run(Sync::LateArrive, 4, 3, 1000, 20) > 0, "arrive after the reads: some schedule reads too early");
    std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}
