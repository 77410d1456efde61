#!/usr/bin/env bash
# The consolidated decode table of docs/PERF.md ("Where decode stands now"): every test-cuda case
# (TESTS=0 skips them), then tg128 of each shape at depths 0 and 2048 in int4 and nvfp4, and fp8 at
# depth 0 (MiniMax-M2's fp8 does not fit one GPU), each shape its own process. Logs to $OUT (or
# /tmp/tg_table). One call of the lent H200 takes ~7.5 minutes with the tests.
#   scripts/device/tg_table.sh
#   TESTS=0 SHAPES="qwen3-30b-a3b qwen3-8b" scripts/device/tg_table.sh
set -o pipefail
source scripts/device/setup.sh
out=${OUT:-/tmp/tg_table}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
targets="spark-bench"
[ "${TESTS:-1}" = 1 ] && targets="spark-bench test-cuda"
scripts/device/build.sh $targets > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
echo "built $(date +%T)"
rc=0
if [ "${TESTS:-1}" = 1 ]; then
    build-dev/tests/test-cuda > "$out/test_cuda.log" 2>&1
    rc=$?
    echo "test-cuda rc $rc $(date +%T)"; tail -3 "$out/test_cuda.log"
fi
bench=build-dev/tools/bench/spark-bench
for shape in ${SHAPES:-minimax-m2 qwen3-30b-a3b qwen3-8b qwen3-next-80b-a3b}; do
    $bench --synthetic "$shape" --format int4,nvfp4 -d 0,2048 -p 0 -n 128 -r 2 2>&1 | tee -a "$out/bench.md" | grep -E "tg128|copy"
    [ "$shape" != minimax-m2 ] && $bench --synthetic "$shape" --format fp8 -d 0 -p 0 -n 128 -r 2 2>&1 | tee -a "$out/bench.md" | grep -E "tg128"
done
exit $rc
