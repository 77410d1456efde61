#!/usr/bin/env bash
# Issue 21 on a machine with 2 or more GPUs (nvidia-h200-x2; docs/DISTRIBUTED.md). Two device calls:
#   scripts/device/split_gpus.sh test    build with NCCL (the PyTorch wheel's nvidia-nccl-cu13); the
#                                        NCCL collectives, the split ops, split models on 2 GPUs
#                                        against one, and every fixture's GPU golden and model diff
#   scripts/device/split_gpus.sh bench   spark-bench tp128 / pp512 of the Qwen3-30B-A3B and
#                                        Qwen3-Next-80B-A3B INT4 shapes on one GPU, TP=2 and EP=2,
#                                        and TP=2 as two processes joined over TCP (--dist-addr)
# Logs to $OUT (or /tmp/split_gpus).
set -o pipefail
source scripts/device/setup.sh
out=${OUT:-/tmp/split_gpus}
mkdir -p "$out"
nvidia-smi -L | tee "$out/device.txt"
scripts/device/build.sh spark-bench test-cuda > "$out/build.log" 2>&1 || { tail -60 "$out/build.log"; exit 1; }
grep -E "^SPARK_NCCL|NCCL_ROOT" build-dev/CMakeCache.txt | tee -a "$out/device.txt"
bench=build-dev/tools/bench/spark-bench
case "${1:-test}" in
test)
    build-dev/tests/test-cuda -tc="nccl*,split*,matmul_id: experts another rank*,matmul_id: absent experts*" > "$out/split.log" 2>&1
    rc=$?
    grep -E "MESSAGE|ERROR|FAILED" "$out/split.log" | head -80; tail -4 "$out/split.log"
    build-dev/tests/test-cuda -tc="GPU golden*,model diff*,matmul*,attention*,elementwise*,ssm*" > "$out/regress.log" 2>&1
    rc2=$?
    grep -E "ERROR|FAILED" "$out/regress.log" | head -20; tail -4 "$out/regress.log"
    exit $((rc | rc2)) ;;
bench)
    for shape in qwen3-30b-a3b qwen3-next-80b-a3b; do
        for split in "" "--devices 0,1 --split tp" "--devices 0,1 --split ep"; do
            echo "== $shape int4 $split" | tee -a "$out/bench.md"
            $bench --synthetic $shape --format int4 -d 0 -p 512 -n 128 -r 3 $split 2>> "$out/bench.err" | grep -E "^\| " | tee -a "$out/bench.md"
        done
    done
    # TP=2 as two processes, one GPU each, joined through the rendezvous on the loopback.
    echo "== qwen3-30b-a3b int4 tp x2 processes" | tee -a "$out/bench.md"
    CUDA_VISIBLE_DEVICES=1 $bench --synthetic qwen3-30b-a3b --format int4 -d 0 -p 512 -n 128 -r 3 --device cuda \
        --dist-size 2 --dist-rank 1 --dist-addr 127.0.0.1:29517 > "$out/rank1.md" 2> "$out/rank1.err" &
    CUDA_VISIBLE_DEVICES=0 $bench --synthetic qwen3-30b-a3b --format int4 -d 0 -p 512 -n 128 -r 3 --device cuda \
        --dist-size 2 --dist-rank 0 --dist-addr 127.0.0.1:29517 2> "$out/rank0.err" | grep -E "^\| " | tee -a "$out/bench.md"
    wait
    tail -3 "$out/rank0.err" "$out/rank1.err" ;;
esac
