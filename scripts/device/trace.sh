#!/usr/bin/env bash
# Step traces of the synthetic shapes' decode (docs/PERF.md, "Where a step's time goes"): builds
# spark-bench with the step trace (build-trace, sm_90a), decodes 24 steps of each shape and format
# given (SHAPE:FORMAT[:DEPTH]) in its own process, and writes trace-SHAPE-FORMAT-dDEPTH.csv and the
# analysis (tools/bench/step_trace.py, the layer pattern's 10th repetition listed) to $OUT (or
# /tmp/trace).
#   scripts/device/trace.sh qwen3-30b-a3b:int4 qwen3-8b:int4:2048 ...
set -eo pipefail
source scripts/device/setup.sh
out=${OUT:-/tmp/trace}
mkdir -p "$out"
cmake -S . -B build-trace -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARK_CUDA=ON -DSPARK_CUDA_ARCHS=90a -DSPARK_STEP_TRACE=ON \
    -DSPARK_BUILD_TESTS=OFF > /dev/null
ninja -C build-trace -j16 spark-bench > /dev/null
for spec in "$@"; do
    IFS=: read -r shape format depth <<< "$spec"
    depth=${depth:-0}
    f="$out/trace-$shape-$format-d$depth.csv"
    SPARK_STEP_TRACE_OUT="$f" build-trace/tools/bench/spark-bench --synthetic "$shape" --format "$format" -d "$depth" -p 0 -n 24 -r 1 \
        > "$out/bench-$shape-$format-d$depth.txt" 2>&1
    python3 tools/bench/step_trace.py "$f" --layer 10 --top 24 > "${f%.csv}.md"
    echo "## $shape $format depth $depth"
    cat "${f%.csv}.md"
done
