#!/usr/bin/env bash
# Lab A/B of the ADD + RMS_NORM inside the q/k/v GEMV (branch wip-norm-prologue; docs/PERF.md, "The
# residual add + RMS_NORM inside the GEMV"): tg128 at depth 0 of each shape with the fusion off, on
# as planned, and on with the fused form's plan at fewer K-warps (SPARK_NORM_MATMUL_WK: fewer,
# taller blocks re-reading the addends), the sides interleaved, each run its own process.
#   scripts/device/norm_ab.sh qwen3-30b-a3b:int4 minimax-m2:int4 qwen3-next-80b-a3b:int4 qwen3-8b:int4
set -o pipefail
source scripts/device/setup.sh
out=${OUT:-/tmp/norm_ab}
mkdir -p "$out"
scripts/device/build.sh spark-bench > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
echo "built $(date +%T)"
sides=("SPARK_NORM_MATMUL=0" "SPARK_NORM_MATMUL=1" "SPARK_NORM_MATMUL_WK=4" "SPARK_NORM_MATMUL_WK=2")
for spec in "$@"; do
    shape=${spec%%:*} formats=${spec#*:}
    for rep in $(seq "${REPS:-2}"); do
        for side in "${sides[@]}"; do
            env "$side" build-dev/tools/bench/spark-bench --synthetic "$shape" --format "$formats" -d 0 -p 0 -n 128 -r "${RUNS:-2}" 2>&1 |
                tee -a "$out/bench.md" | grep -E "tg128" | sed "s/^/$shape $side /"
        done
    done
done
