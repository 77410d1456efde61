#!/usr/bin/env bash
# spark-chat --spec: with --temp 0 the answer is exactly the one without --spec, for every draft
# source on the demo models (draft model, EAGLE3 head, n-gram on the MoE model; MTP head and n-gram
# on Qwen3-Next), for several draft lengths, when -n or a full context cuts the answer inside a
# speculative step, and over a piped conversation (the loop keeps the earlier turns); the timings
# line reports the drafts' acceptance.
set -euo pipefail
build=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
chat=$build/examples/chat/spark-chat
models=$root/examples/models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
prompt='Write a Python function `fibonacci(n)`: Return the n-th Fibonacci number.'

same() {  # same NAME MODEL SPEC [ARGS...]: the answer with --spec SPEC equals the one without
    local name=$1 model=$models/$2 spec=$3; shift 3
    "$chat" -m "$model" -p "$prompt" --temp 0 -t 1 "$@" > "$tmp/plain.txt" 2> "$tmp/plain.err"
    if ! "$chat" -m "$model" -p "$prompt" --temp 0 -t 1 --spec "$spec" "$@" > "$tmp/spec.txt" 2> "$tmp/spec.err"; then
        echo "FAIL $name: exit code $?"; cat "$tmp/spec.err"; fails=$((fails + 1)); return
    fi
    if ! cmp -s "$tmp/plain.txt" "$tmp/spec.txt"; then
        echo "FAIL $name: the answer differs from the one without --spec"; diff "$tmp/plain.txt" "$tmp/spec.txt" || true
        fails=$((fails + 1)); return
    fi
    if ! grep -q "acceptance by draft position" "$tmp/spec.err" || ! grep -q "tok/s" "$tmp/spec.err"; then
        echo "FAIL $name: no acceptance statistics on stderr"; cat "$tmp/spec.err"; fails=$((fails + 1)); return
    fi
    echo "ok   $name: $(grep acceptance "$tmp/spec.err")"
}

same "moe + draft model"        spark-demo-coder-moe  "draft:$models/spark-demo-coder-draft"
same "moe + draft model, k=1"   spark-demo-coder-moe  "draft:$models/spark-demo-coder-draft" --draft-max 1
same "moe + draft, k=6, p-min"  spark-demo-coder-moe  "draft:$models/spark-demo-coder-draft" --draft-max 6 --draft-p-min 0.2
same "moe + eagle3"             spark-demo-coder-moe  "eagle3:$models/spark-demo-coder-eagle3"
same "moe + ngram"              spark-demo-coder-moe  ngram
same "next + mtp"               spark-demo-coder-next mtp -n 200
same "next + mtp, k=5, -n 37"   spark-demo-coder-next mtp --draft-max 5 -n 37
same "next + ngram, draft-min"  spark-demo-coder-next ngram --draft-min 2 -n 100
# A context that fills inside a step (the 32-token prompt leaves 13 positions).
same "next + mtp, full context" spark-demo-coder-next mtp --draft-max 4 -c 45
same "moe + draft, full context" spark-demo-coder-moe "draft:$models/spark-demo-coder-draft" -c 50
grep -q "context full" "$tmp/spec.err" || { echo "FAIL: -c 50 did not fill the context"; fails=$((fails + 1)); }

# A piped conversation of three turns: each turn begins with the whole conversation, and only
# what the loop does not hold yet is decoded (/stats: "prompt N tokens (M new)", M < N).
printf '%s\n/stats\n%s\n/stats\n%s\n/stats\n' "$prompt" 'Write a Python function `add(a, b)`: Return the sum.' \
    'Write a Python function `merge_dicts(a, b)`: Merge two dictionaries.' > "$tmp/turns.txt"
for run in "spark-demo-coder-moe draft:$models/spark-demo-coder-draft" "spark-demo-coder-moe eagle3:$models/spark-demo-coder-eagle3" \
           "spark-demo-coder-next mtp"; do
    set -- $run
    "$chat" -m "$models/$1" --temp 0 -t 1 -n 80 < "$tmp/turns.txt" > "$tmp/plain.txt" 2> /dev/null
    "$chat" -m "$models/$1" --temp 0 -t 1 -n 80 --spec "$2" < "$tmp/turns.txt" > "$tmp/spec.txt" 2> "$tmp/spec.err" \
        || { echo "FAIL conversation $1 --spec $2: exit code $?"; cat "$tmp/spec.err"; fails=$((fails + 1)); continue; }
    if ! cmp -s "$tmp/plain.txt" "$tmp/spec.txt"; then
        echo "FAIL conversation $1 --spec $2 differs"; diff "$tmp/plain.txt" "$tmp/spec.txt" || true; fails=$((fails + 1)); continue
    fi
    if [ "$(grep -c acceptance "$tmp/spec.err")" -ne 3 ] || \
       ! grep '^prompt' "$tmp/spec.err" | tail -2 | awk '{ n = $2; m = substr($4, 2); if (m + 0 >= n + 0) exit 1 }'; then
        echo "FAIL conversation $1 --spec $2: the later turns re-decoded the conversation or no statistics"; cat "$tmp/spec.err"
        fails=$((fails + 1)); continue
    fi
    echo "ok   conversation $1 --spec ${2%%:*}: $(grep '^prompt' "$tmp/spec.err" | tail -1 | cut -d';' -f1)"
done

# Sampling: the loop samples with the chat's chain (rejection sampling); it runs and answers.
"$chat" -m "$models/spark-demo-coder-moe" -p "$prompt" --seed 7 -n 64 --spec "draft:$models/spark-demo-coder-draft" > "$tmp/sampled.txt" 2> "$tmp/sampled.err" \
    && [ -s "$tmp/sampled.txt" ] && grep -q acceptance "$tmp/sampled.err" \
    && echo "ok   sampling with --spec" || { echo "FAIL sampling with --spec"; cat "$tmp/sampled.err"; fails=$((fails + 1)); }
[ $fails -eq 0 ] || exit 1
echo "spark-chat --spec: ok"
