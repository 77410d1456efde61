#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang, ASan + UBSan, CPU only) and runs each for SECONDS.
#   scripts/fuzz.sh [-p PARALLEL] [-j JOBS] SECONDS [NAME ...]     NAME: jinja, config, ... (default: all)
# -p runs that many harnesses at once; -j gives each that many libFuzzer worker processes.
# Each harness starts from its seed corpus tests/fuzz/corpus/NAME and keeps what it learns in
# BUILD/corpus/NAME; a crash, leak, timeout or out-of-memory input is written to BUILD/findings/NAME/
# and the script fails. BUILD is $SPARK_FUZZ_BUILD (default build-fuzz). docs/RELIABILITY.md records
# the long runs.
set -euo pipefail
cd "$(dirname "$0")/.."
parallel=1 jobs=1
while [ $# -gt 0 ]; do
    case "$1" in
    -p) parallel=$2; shift 2 ;;
    -j) jobs=$2; shift 2 ;;
    *) break ;;
    esac
done
seconds=${1:?usage: scripts/fuzz.sh [-p PARALLEL] [-j JOBS] SECONDS [NAME ...]}
shift
build=${SPARK_FUZZ_BUILD:-build-fuzz}
if [ ! -f "$build/build.ninja" ]; then
    CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-gline-tables-only \
        -DCMAKE_C_FLAGS=-gline-tables-only -DSPARK_CUDA=OFF \
        -DSPARK_FUZZ=ON -DSPARK_SANITIZE=address,undefined -DSPARK_BUILD_TESTS=OFF -DSPARK_BUILD_EXAMPLES=OFF >/dev/null
fi
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for f in tests/fuzz/fuzz_*.cpp; do n=$(basename "$f" .cpp); names+=("${n#fuzz_}"); done
fi
ninja -C "$build" $(printf 'fuzz_%s ' "${names[@]}")
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# One harness, run from its findings folder (libFuzzer workers write their logs to the current
# folder): its log in BUILD/fuzz_NAME.log.
root=$(pwd)
run_one() {
    local n=$1 findings=$root/$build/findings/$1
    mkdir -p "$root/$build/corpus/$n" "$findings"
    local args=("$root/$build/corpus/$n")
    [ -d tests/fuzz/corpus/$n ] && args+=("$root/tests/fuzz/corpus/$n")
    [ -f tests/fuzz/$n.dict ] && args+=(-dict="$root/tests/fuzz/$n.dict")
    [ "$jobs" -gt 1 ] && args+=(-jobs="$jobs" -workers="$jobs")
    # 2 GiB and 10 s per input are far above what any valid input needs: reaching either is a
    # finding (a runaway allocation or a hang).
    (cd "$findings" && "$root/$build/fuzz/fuzz_$n" "${args[@]}" -max_total_time="$seconds" -rss_limit_mb=2048 \
        -malloc_limit_mb=2048 -timeout=10 -artifact_prefix="$findings/" -print_final_stats=1) >"$root/$build/fuzz_$n.log" 2>&1
}

status=0
pids=() running=()
for n in "${names[@]}"; do
    echo "== fuzz_$n: ${seconds}s x $jobs ($(date +%T))"
    run_one "$n" &
    pids+=($!) running+=("$n")
    if [ ${#pids[@]} -ge "$parallel" ]; then
        wait "${pids[0]}" || { status=1; echo "fuzz_${running[0]}: FAILED, see $build/fuzz_${running[0]}.log and $build/findings/${running[0]}/"; }
        pids=("${pids[@]:1}") running=("${running[@]:1}")
    fi
done
for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { status=1; echo "fuzz_${running[$i]}: FAILED, see $build/fuzz_${running[$i]}.log and $build/findings/${running[$i]}/"; }
done
for n in "${names[@]}"; do
    log=$build/fuzz_$n.log
    # With -jobs the workers write fuzz-K.log next to the findings.
    cat "$build/findings/$n"/fuzz-*.log >>"$log" 2>/dev/null && rm -f "$build/findings/$n"/fuzz-*.log
    echo "fuzz_$n: $(grep -E '^#[0-9]+' "$log" | tail -1)"
    grep -E "stat::number_of_executed_units" "$log" | awk -v n="$n" '{s += $2} END {if (NR) print "fuzz_" n ": " s " executions"}'
    if grep -qE "^==[0-9]+==ERROR|SUMMARY: (Address|UndefinedBehavior|Leak)Sanitizer|ERROR: libFuzzer" "$log"; then
        status=1
        grep -m5 -E "ERROR|SUMMARY" "$log"
    fi
done
exit $status
