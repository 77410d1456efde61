#!/usr/bin/env bash
# The tensor-core GEMV with one step in flight per lane and 3 blocks per SM (80 registers, 24 warps)
# against the default 2 steps and 2 blocks (121 registers, 16 warps): bench_matmul's plan sweeps of
# both builds (docs/PERF.md), then, if asked (BENCH="SHAPE ..."), spark-bench tg128 of the variant.
# Output to $OUT (or /tmp/gemv_occ).
set -o pipefail
source scripts/device/setup.sh
out=${OUT:-/tmp/gemv_occ}
mkdir -p "$out"
flags=(-O3 -std=c++20 --expt-relaxed-constexpr -arch=sm_90a -Isrc -Iinclude)
srcs=(dev/kernels/matmul/bench_matmul.cu src/backends/cuda/matmul/gemv_*.cu src/backends/cuda/matmul/gemm_*.cu
      src/backends/cuda/matmul/side_kernels.cu src/backends/cuda/matmul/plan.cpp src/backends/cuda/common/launch.cpp)
for v in d2b2:2:2 d1b3:1:3; do
    IFS=: read -r name depth blocks <<< "$v"
    obj=/tmp/bm_$name; mkdir -p $obj
    printf '%s\n' "${srcs[@]}" | xargs -P 8 -I{} sh -c 'nvcc '"${flags[*]}"' -DSPARK_GEMV_MMA_DEPTH='"$depth"' -DSPARK_GEMV_MMA_BLOCKS='"$blocks"' -c {} -o '"$obj"'/$(echo {} | tr / _).o' &
done
wait
for name in d2b2 d1b3; do nvcc -arch=sm_90a /tmp/bm_$name/*.o -o /tmp/bm_$name/bench_matmul & done
wait
for name in d2b2 d1b3; do
    /tmp/bm_$name/bench_matmul --sweep > "$out/sweep_$name.txt" 2>&1
    /tmp/bm_$name/bench_matmul --moe-sweep > "$out/moe_$name.txt" 2>&1
    echo "$name swept $(date +%T)"
done
[ -n "${BENCH:-}" ] || exit 0
cmake -S . -B build-occ -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARK_CUDA=ON -DSPARK_CUDA_ARCHS=90a -DSPARK_BUILD_TESTS=OFF \
    "-DCMAKE_CUDA_FLAGS=-DSPARK_GEMV_MMA_DEPTH=1 -DSPARK_GEMV_MMA_BLOCKS=3" "-DCMAKE_CXX_FLAGS=-DSPARK_GEMV_MMA_DEPTH=1 -DSPARK_GEMV_MMA_BLOCKS=3" > /dev/null
ninja -C build-occ -j16 spark-bench > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
for spec in $BENCH; do
    shape=${spec%%:*} formats=${spec#*:}
    build-occ/tools/bench/spark-bench --synthetic "$shape" --format "$formats" -d 0 -p 0 -n 128 -r 3 2>&1 | tee -a "$out/bench_d1b3.md" | grep tg128
done
