#!/usr/bin/env bash
# A/B of a GEMV planning switch (AB: SPARK_GEMV_BW_CAP, the default, "The GEMV planner on the H200";
# SPARK_GEMV_WAVE, "The one-wave gate/up"; docs/PERF.md): test-cuda's suites (SUITES, default the
# matmul and golden ones) with the switch on, then tg128 at depth 0 of each shape with it on (1) and
# off (0), interleaved, each run its own process (REPS: pairs, default 2). Logs to $OUT (or /tmp/plan_ab).
#   AB=SPARK_GEMV_WAVE scripts/device/plan_ab.sh qwen3-8b:int4 minimax-m2:int4,nvfp4
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
    for cap in $(for i in $(seq "${REPS:-2}"); do echo 1 0; done); do
        env "${AB:-SPARK_GEMV_BW_CAP}=$cap" build-dev/tools/bench/spark-bench --synthetic "$shape" --format "$formats" -d 0 -p 0 -n 128 -r "${RUNS:-3}" 2>&1 |
            tee -a "$out/bench.md" | grep -E "tg128" | sed "s/^/$shape ${AB:-SPARK_GEMV_BW_CAP}=$cap /"
    done
done
exit $rc
