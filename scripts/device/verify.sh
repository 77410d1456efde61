#!/usr/bin/env bash
# The GPU checks that changes made without a device still owe (one device call, ~10 minutes):
# test-cuda's suites that cover them, then the synthetic shapes' decode and prefill. Logs go to $OUT
# (or /tmp/verify); the exit code is test-cuda's.
#   scripts/device/verify.sh                   # H100: every test, the Qwen shapes
#   BENCH="minimax-m2" scripts/device/verify.sh  # on the H200 (MiniMax-M2 INT4/NVFP4 need > 80 GB)
#   FULL=1 scripts/device/verify.sh            # every test-cuda case instead of the suites below
#   SUITES="GPU: synthetic*"                     # these test-cuda cases instead
#   TESTS=0 / BENCH=none                         # skip the tests / the benches (two calls on a warm machine)
#   FORMATS=int4,nvfp4,fp8                       # the weight formats benched (default int4,nvfp4)
set -o pipefail
source scripts/device/setup.sh
out=${OUT:-/tmp/verify}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
scripts/device/build.sh spark-bench test-cuda > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
# The suites of what changed last without a device: the golden fixtures of every architecture
# (MiniMax-M2 included), the CPU-vs-GPU node diff, the MoE routing kernel (sigmoid scores), the
# matmul dispatch (W4A4: skips before 12.x) and weights used in place.
rc=0
suites=${SUITES:-'GPU golden*,model diff*,cuda elementwise: MOE_ROUTE*,matmul: NVFP4 with activation scales*,GPU: weights used in place*'}
[ "${FULL:-0}" = 1 ] && suites='*'
echo "built $(date +%T)"
if [ "${TESTS:-1}" = 1 ]; then
    build-dev/tests/test-cuda --duration=true -tc="$suites" > "$out/test_cuda.log" 2>&1
    rc=$?
    echo "test-cuda rc $rc $(date +%T)"
    tail -4 "$out/test_cuda.log"
fi
bench=${BENCH:-qwen3-30b-a3b qwen3-next-80b-a3b qwen3-8b}
[ "$bench" = none ] && bench=
for shape in $bench; do
    build-dev/tools/bench/spark-bench --synthetic "$shape" --format "${FORMATS:-int4,nvfp4}" -d 0,2048 -p 512 -n 128 -r 3 2>&1 | tee -a "$out/bench.md"
    echo "$shape benched $(date +%T)"
done
exit $rc
