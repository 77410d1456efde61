#!/usr/bin/env bash
# A/B of a decode change on the device: test-cuda's suites (SUITES, default the matmul and golden
# ones) on this tree, then tg128 at depth 0 of each shape, the two sides interleaved, each run its
# own process (REPS: pairs, default 2; RUNS: spark-bench -r). The two sides are either
#   AB=VAR      an environment switch of this tree at AB_ON (default 1; "-": unset) and AB_OFF (default
#               0) (SPARK_ATTN_SHORT with AB_ON=-: "The short decode path"; SPARK_GEMV_BW_CAP, the
#               default: "The GEMV planner on the H200"; SPARK_GEMV_WAVE: "The one-wave gate/up",
#               AB_OFF=2 for the single weights' part alone; docs/PERF.md), or
#   BASE=DIR    this tree against another one, unpacked into a git-ignored folder carried along:
#               git archive REV | tar -x -C .device/base   (run with carry [".deps", ".device"];
#               rm -rf .device/base/{examples/models,tests/data,docs}: the carry holds 64 MiB)
# SUITES=none skips the tests (and building test-cuda): for lab trees whose results are wrong on purpose.
# Logs to $OUT (or /tmp/plan_ab).
#   AB=SPARK_GEMV_WAVE scripts/device/plan_ab.sh qwen3-8b:int4 minimax-m2:int4,nvfp4
#   BASE=.device/base scripts/device/plan_ab.sh minimax-m2:int4
set -o pipefail
source scripts/device/setup.sh
out=${OUT:-/tmp/plan_ab}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
targets="spark-bench test-cuda"
[ "${SUITES:-}" = none ] && targets=spark-bench
scripts/device/build.sh $targets > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
if [ -n "${BASE:-}" ]; then
    (cd "$BASE" && cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARK_CUDA=ON -DSPARK_CUDA_ARCHS=90a \
        -DSPARK_BUILD_TESTS=OFF > /dev/null && ninja -C build-dev -j16 spark-bench) > "$out/build_base.log" 2>&1 ||
        { tail -40 "$out/build_base.log"; exit 1; }
fi
echo "built $(date +%T)"
rc=0
if [ "${SUITES:-}" != none ]; then
    build-dev/tests/test-cuda -tc="${SUITES:-matmul*,GPU golden*}" > "$out/test_cuda.log" 2>&1
    rc=$?
    echo "test-cuda rc $rc $(date +%T)"; tail -3 "$out/test_cuda.log"
fi
# side 1: this tree (with AB=1); side 0: the base tree, or this tree with AB=AB_OFF
side_value() { [ "$1" = 1 ] && echo "${AB_ON:-1}" || echo "${AB_OFF:-0}"; }
bench_side() {
    if [ -n "${BASE:-}" ]; then
        [ "$1" = 1 ] && echo build-dev/tools/bench/spark-bench || echo "$BASE/build-dev/tools/bench/spark-bench"
    elif [ "$(side_value "$1")" = - ]; then
        echo "env -u ${AB:-SPARK_GEMV_BW_CAP} build-dev/tools/bench/spark-bench"
    else
        echo "env ${AB:-SPARK_GEMV_BW_CAP}=$(side_value "$1") build-dev/tools/bench/spark-bench"
    fi
}
label=${AB:-SPARK_GEMV_BW_CAP}
[ -n "${BASE:-}" ] && label=tree
for spec in "$@"; do
    shape=${spec%%:*} formats=${spec#*:}
    for side in $(for i in $(seq "${REPS:-2}"); do echo 1 0; done); do
        $(bench_side "$side") --synthetic "$shape" --format "$formats" -d "${DEPTH:-0}" -p 0 -n 128 -r "${RUNS:-3}" 2>&1 |
            tee -a "$out/bench.md" | grep -E "tg128" | sed "s/^/$shape $label=$([ -n "${BASE:-}" ] && echo "$side" || side_value "$side") /"
    done
done
exit $rc
