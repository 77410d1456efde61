#!/usr/bin/env bash
# The GEMV planner on a device faster than the H100 (docs/PERF.md, "The GEMV planner on the H200"):
# test-cuda's matmul and golden suites with the default plans, then tg128 at depth 0 of each shape
# with the H100's MMA plans (default) and with the device's own bandwidth (SPARK_GEMV_BW_CAP=0),
# interleaved, each run its own process. Logs to $OUT (or /tmp/plan_ab).
#   scripts/device/plan_ab.sh minimax-m2:int4,nvfp4 qwen3-next-80b-a3b:int4
set -o pipefail
source scripts/device/setup.sh
out=${OUT:-/tmp/plan_ab}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
scripts/device/build.sh spark-bench test-cuda > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
build-dev/tests/test-cuda -tc="${SUITES:-matmul*,GPU golden*}" > "$out/test_cuda.log" 2>&1
rc=$?
echo "test-cuda rc $rc"; tail -3 "$out/test_cuda.log"
for spec in "$@"; do
    shape=${spec%%:*} formats=${spec#*:}
    for cap in 1 0 1 0; do
        SPARK_GEMV_BW_CAP=$cap build-dev/tools/bench/spark-bench --synthetic "$shape" --format "$formats" -d 0 -p 0 -n 128 -r 3 2>&1 |
            tee -a "$out/bench.md" | grep -E "tg128" | sed "s/^/$shape cap=$cap /"
    done
done
exit $rc
