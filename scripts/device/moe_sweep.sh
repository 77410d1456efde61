#!/usr/bin/env bash
# The expert GEMVs of Qwen3-30B-A3B and MiniMax-M2 under every MMA plan the planner can make, timed
# against its own choice (dev/kernels/matmul/bench_matmul.cu --moe-sweep; docs/PERF.md); with DENSE=1
# first the dense shapes' sweep (--sweep: Qwen3-8B, the 30B-A3B and MiniMax-M2 attention). The objects
# compile in parallel (one nvcc per file). Output to $OUT (or /tmp/moe_sweep).
set -eo pipefail
out=${OUT:-/tmp/moe_sweep}
obj=${BUILD:-/tmp/bench_matmul_obj}
mkdir -p "$out" "$obj"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
flags=(-O3 -std=c++20 --expt-relaxed-constexpr -arch=sm_90a -Isrc -Iinclude)
srcs=(dev/kernels/matmul/bench_matmul.cu src/backends/cuda/matmul/gemv_*.cu src/backends/cuda/matmul/gemm_*.cu
      src/backends/cuda/matmul/side_kernels.cu src/backends/cuda/matmul/plan.cpp src/backends/cuda/common/launch.cpp)
printf '%s\n' "${srcs[@]}" | xargs -P 16 -I{} sh -c 'nvcc '"${flags[*]}"' -c {} -o '"$obj"'/$(echo {} | tr / _).o'
nvcc -arch=sm_90a "$obj"/*.o -o "$obj/bench_matmul"
if [ "${DENSE:-0}" = 1 ]; then "$obj/bench_matmul" --sweep | tee "$out/sweep.txt"; fi
"$obj/bench_matmul" --moe-sweep "$@" | tee "$out/moe_sweep.txt"
