#!/usr/bin/env bash
# The decode attention alone (dev/kernels/attention/bench_decode.cu: one step's check against a CPU
# reference per shape, then us per layer at contexts 64 .. 32K from a graph over enough layers' caches
# to defeat L2) for this tree and, with BASE=DIR (a tree unpacked with git archive, carried along),
# for that tree too, built side by side; the two tables are printed next to each other. Logs to
# $OUT (or /tmp/attn_bench). Arguments go to bench_decode: [shape-substring [ctx,ctx,...]].
#   BASE=.device/base scripts/device/attn_bench.sh
#   BASE=.device/base scripts/device/attn_bench.sh MiniMax 300,2048
set -eo pipefail
out=${OUT:-/tmp/attn_bench}
mkdir -p "$out"
build() {  # tree binary
    (cd "$1" && nvcc -O3 -std=c++20 -arch=sm_90a --expt-relaxed-constexpr -Isrc -Iinclude dev/kernels/attention/bench_decode.cu \
        src/backends/cuda/attention/attention_decode.cu src/backends/cuda/attention/attention_prefill.cu \
        src/backends/cuda/common/launch.cpp -o "$2")
}
build . "$out/bench_decode" &
[ -n "${BASE:-}" ] && build "$BASE" "$out/bench_decode_base" &
wait
"$out/bench_decode" "$@" > "$out/tree.txt"
if [ -n "${BASE:-}" ]; then
    "$out/bench_decode_base" "$@" > "$out/base.txt"
    paste -d'|' <(grep -E "^(shape|Qwen|MiniMax|demo|check)" "$out/tree.txt") <(grep -E "^(shape|Qwen|MiniMax|demo|check)" "$out/base.txt" | cut -c31-)
else
    cat "$out/tree.txt"
fi
