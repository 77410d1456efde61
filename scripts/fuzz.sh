#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang, ASan + UBSan, CPU only) and runs each for SECONDS.
#   scripts/fuzz.sh [-j JOBS] SECONDS [NAME ...]      NAME: jinja, config, ... (default: all)
# Each harness starts from its seed corpus tests/fuzz/corpus/NAME and keeps what it learns in
# build-fuzz/corpus/NAME; a crash, leak, timeout or out-of-memory input is written to
# build-fuzz/findings/NAME/ and the script fails. docs/RELIABILITY.md records the long runs.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=1
if [ "${1:-}" = "-j" ]; then jobs=$2; shift 2; fi
seconds=${1:?usage: scripts/fuzz.sh [-j JOBS] SECONDS [NAME ...]}
shift
build=${SPARK_FUZZ_BUILD:-build-fuzz}
if [ ! -f "$build/build.ninja" ]; then
    CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPARK_CUDA=OFF \
        -DSPARK_FUZZ=ON -DSPARK_SANITIZE=address,undefined -DSPARK_BUILD_TESTS=OFF -DSPARK_BUILD_EXAMPLES=OFF >/dev/null
fi
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for f in tests/fuzz/fuzz_*.cpp; do n=$(basename "$f" .cpp); names+=("${n#fuzz_}"); done
fi
ninja -C "$build" $(printf 'fuzz_%s ' "${names[@]}")
status=0
for n in "${names[@]}"; do
    corpus=$build/corpus/$n findings=$build/findings/$n
    mkdir -p "$corpus" "$findings"
    seeds=tests/fuzz/corpus/$n
    [ -d "$seeds" ] || seeds=
    dict=tests/fuzz/$n.dict
    [ -f "$dict" ] && dict_arg=(-dict="$dict") || dict_arg=()
    echo "== fuzz_$n: ${seconds}s x $jobs"
    # Limits: 2 GiB of memory and 10 s per input are far above what any valid input needs, so
    # hitting either is a finding (a runaway allocation or a hang).
    if ! "$build/fuzz/fuzz_$n" "$corpus" $seeds "${dict_arg[@]}" -max_total_time="$seconds" -rss_limit_mb=2048 \
            -malloc_limit_mb=2048 -timeout=10 -artifact_prefix="$findings/" -print_final_stats=1 \
            -jobs="$jobs" -workers="$jobs" 2>"$build/fuzz_$n.log"; then
        status=1
        echo "fuzz_$n: FAILED (input in $findings/)"; grep -m5 -E "ERROR|SUMMARY" "$build/fuzz_$n.log" || true
    fi
    [ "$jobs" -gt 1 ] && cat fuzz-*.log >>"$build/fuzz_$n.log" 2>/dev/null && rm -f fuzz-*.log
    grep -E "^#[0-9]+.*(DONE|pulse)|stat::number_of_executed_units|cov:" "$build/fuzz_$n.log" | tail -2
done
exit $status
