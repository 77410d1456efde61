#!/usr/bin/env bash
# Where the decode GEMVs lose their bandwidth (docs/PERF.md): the access-pattern probe
# (dev/kernels/matmul/stream_probe.cu), then Nsight Compute on one decode step's MMA GEMVs of
# Qwen3-8B and Qwen3-30B-A3B int4 (each kernel replayed alone: DRAM throughput, occupancy, issue and
# warp stall reasons). Output to $OUT (or /tmp/gemv_probe).
set -eo pipefail
out=${OUT:-/tmp/gemv_probe}
mkdir -p "$out"
nvcc -O3 -std=c++20 -arch=sm_90a dev/kernels/matmul/stream_probe.cu -o /tmp/stream_probe
/tmp/stream_probe | tee "$out/stream_probe.md"
[ "${NCU:-1}" = 1 ] || exit 0
scripts/device/build.sh spark-bench > /dev/null
for shape in qwen3-8b qwen3-30b-a3b; do
    SPARK_CUDA_GRAPHS=0 ncu --clock-control none -k regex:gemv_mma --launch-skip 600 --launch-count 8 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
        --section LaunchStats --section SchedulerStats \
        build-dev/tools/bench/spark-bench --synthetic $shape --format int4 -d 0 -p 0 -n 8 -r 1 > "$out/ncu-$shape.txt" 2>&1 || true
    grep -E "gemv_mma_kernel|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|No Eligible|Stall|Block Size|Grid Size|L2 Hit|Theoretical Occ|Waves" "$out/ncu-$shape.txt" | head -200
done
