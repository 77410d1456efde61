#!/usr/bin/env bash
# spark-chat's clear messages for a missing or broken model path, a model without a chat template,
# an input longer than the context, and --spec errors (a bad value, a draft model of another
# vocabulary, an EAGLE3 head for another model, MTP on a model without an MTP head, a bad draft
# length): a message on stderr, exit code 1, never a crash (>= 128).
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
expect "bad --spec value" "expected draft:PATH, eagle3:PATH, mtp or ngram" -- "$chat" -m "$model" -p hi --spec medusa
expect "--spec draft without a path" "needs a path" -- "$chat" -m "$model" -p hi --spec draft
expect "--spec ngram with a path" "takes no path" -- "$chat" -m "$model" -p hi --spec ngram:x
expect "draft of another vocabulary" "vocabulary of 512 tokens" -- "$chat" -m "$model" -p hi --spec "draft:$root/tests/data/models/qwen3-bf16"
expect "missing draft model" "does not exist" -- "$chat" -m "$model" -p hi --spec draft:/nonexistent/draft
expect "EAGLE3 head of another model" "EAGLE3 head" -- "$chat" -m "$model" -p hi --spec "eagle3:$root/tests/data/models/qwen3-eagle3-draft"
expect "mtp without an MTP head" "MTP heads exist for qwen3_next" -- "$chat" -m "$model" -p hi --spec mtp
expect "--draft-max out of range" "n_draft_max 17 is outside" -- "$chat" -m "$model" -p hi --spec ngram --draft-max 17
[ $fails -eq 0 ] || exit 1
