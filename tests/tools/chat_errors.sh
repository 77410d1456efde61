#!/usr/bin/env bash
# spark-chat's clear messages for a missing or broken model path, a model without a chat template,
# and an input longer than the context: a message on stderr, exit code 1, never a crash (>= 128).
set -uo pipefail
build=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
chat=$build/examples/chat/spark-chat
model=$root/examples/models/spark-demo-coder-moe
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
expect() {  # expect NAME PATTERN -- command...
    local name=$1 pattern=$2; shift 3
    "$@" > "$tmp/out" 2> "$tmp/err"
    local rc=$?
    if [ $rc -ne 1 ] || ! grep -q "$pattern" "$tmp/err"; then
        echo "FAIL $name: rc=$rc"; cat "$tmp/err"; fails=$((fails + 1))
    else
        echo "ok   $name: $(head -1 "$tmp/err")"
    fi
}
expect "missing model" "cannot load the model" -- "$chat" -m /nonexistent/model -p hi
mkdir "$tmp/broken" && cp "$model"/*.json "$tmp/broken/" && head -c 1000 "$model/model.safetensors" > "$tmp/broken/model.safetensors"
expect "broken model" "truncated" -- "$chat" -m "$tmp/broken" -p hi
mkdir "$tmp/notemplate" && cp "$model"/* "$tmp/notemplate/"
python3 -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); del c['chat_template']; json.dump(c, open(p,'w'))" "$tmp/notemplate/tokenizer_config.json"
expect "no chat template" "no chat template" -- "$chat" -m "$tmp/notemplate" -p hi
expect "no tokenizer" "no tokenizer" -- "$chat" -m "$root/tests/data/models/qwen3-bf16" -p hi
long=$(python3 -c "print('def f(x): return x + 1 ' * 400)")
expect "input longer than the context" "context holds" -- "$chat" -m "$model" -c 256 -p "$long"
[ $fails -eq 0 ] || exit 1
