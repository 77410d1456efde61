#!/usr/bin/env bash
# The checked builds CI runs after the main test command (docs/RELIABILITY.md):
#   1. the CPU test suite built with ASan + UBSan (clang; any report fails the test), with the CPU
#      warp emulators of the elementwise and W4A4 kernels, and spark-server through the openai
#      client with its hostile bodies. Left to the unsanitized main suite, to keep CI within its
#      time: emu-attention and emu-gemv (5 and 6 min under ASan), test-models' end-to-end sampling
#      statistics (tests/CMakeLists.txt) and spark-server's load, --spec and browser tests;
#   2. the threads test, the rank group's (test-dist) and split models' (test-split) built with
#      ThreadSanitizer;
#   3. each libFuzzer harness for FUZZ_SECONDS (default 60) from its seed corpus.
# Run from anywhere: scripts/check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
fuzz_seconds=${FUZZ_SECONDS:-60}
export CC=clang CXX=clang++
# Leaks fail the run; allocation failures are reported as errors instead of aborting, which is how
# the library sees them on a real machine.
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

section() { echo; echo "== $* ($(date +%T))"; }

section "ASan + UBSan: CPU test suite"
if [ ! -f build-check-asan/build.ninja ]; then
    cmake -S . -B build-check-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPARK_CUDA=OFF \
        -DSPARK_SANITIZE=address,undefined >/dev/null
fi
cmake --build build-check-asan
ctest --test-dir build-check-asan -LE cuda -E 'emu-(attention|gemv)|tool-server_(load|spec|page)' -j2 --output-on-failure

section "ThreadSanitizer: contexts decoding on several threads"
if [ ! -f build-check-tsan/build.ninja ]; then
    cmake -S . -B build-check-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPARK_CUDA=OFF \
        -DSPARK_SANITIZE=thread >/dev/null
fi
cmake --build build-check-tsan --target test-models test-dist test-split
build-check-tsan/tests/test-models -tc="*threads*" --no-intro=true
build-check-tsan/tests/test-dist --no-intro=true  # the in-process rank group: ranks are threads
build-check-tsan/tests/test-split --no-intro=true  # split models: a context per rank, on its thread

section "fuzzers, ${fuzz_seconds}s each"
scripts/fuzz.sh -p 2 "$fuzz_seconds"
section "checked builds: all clean"
