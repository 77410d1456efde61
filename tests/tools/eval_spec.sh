#!/usr/bin/env bash
# spark-eval --spec: the greedy continuation from the speculative loop equals the plain one (ids,
# also past the end-of-generation token, which stops neither), the logits are the plain prompt
# decode's, and the acceptance figures go to stderr. Demo models: draft model, EAGLE3 and n-gram on
# the MoE model, MTP on Qwen3-Next; a fixture with a draft of the same vocabulary. Bad --spec: exit 1.
set -uo pipefail
build=$1
data=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
eval=$build/tools/eval/spark-eval
models=$root/examples/models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

golden_ids() {  # golden_ids FILE KEY: a tensor of a golden.safetensors as comma-separated ids
    python3 -c "
import json, struct, sys
f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); d = f.read()
o = h[sys.argv[2]]['data_offsets']
print(','.join(map(str, struct.unpack('<%di' % ((o[1] - o[0]) // 4), d[o[0]:o[1]]))))" "$1" "$2"
}
ids=$(golden_ids "$models/spark-demo-coder-moe/golden.safetensors" prompt)  # the demo's chat prompt

same() {  # same NAME MODEL SPEC [ARGS...]
    local name=$1 model=$2 spec=$3; shift 3
    "$eval" -m "$model" --tokens "$ids" --greedy 96 -t 1 --logits-out "$tmp/plain.safetensors" "$@" 2> "$tmp/plain.err" \
        || { echo "FAIL $name: plain run"; cat "$tmp/plain.err"; fails=$((fails + 1)); return; }
    "$eval" -m "$model" --tokens "$ids" --greedy 96 -t 1 --logits-out "$tmp/spec.safetensors" --spec "$spec" "$@" 2> "$tmp/spec.err" \
        || { echo "FAIL $name: exit code $?"; cat "$tmp/spec.err"; fails=$((fails + 1)); return; }
    # Same header, logits and greedy ids: the files are byte for byte equal.
    cmp -s "$tmp/plain.safetensors" "$tmp/spec.safetensors" \
        || { echo "FAIL $name: the output differs from the run without --spec"; fails=$((fails + 1)); return; }
    grep -q "acceptance by draft position" "$tmp/spec.err" || { echo "FAIL $name: no acceptance on stderr"; cat "$tmp/spec.err"; fails=$((fails + 1)); return; }
    echo "ok   $name: $(grep acceptance "$tmp/spec.err")"
}

same "moe + draft model"     "$models/spark-demo-coder-moe"  "draft:$models/spark-demo-coder-draft"
same "moe + draft, k=5"      "$models/spark-demo-coder-moe"  "draft:$models/spark-demo-coder-draft" --draft-max 5
same "moe + eagle3"          "$models/spark-demo-coder-moe"  "eagle3:$models/spark-demo-coder-eagle3"
same "moe + ngram"           "$models/spark-demo-coder-moe"  ngram
same "next + mtp"            "$models/spark-demo-coder-next" mtp
same "next + mtp, k=2"       "$models/spark-demo-coder-next" mtp --draft-max 2
# The golden answers end with <|im_end|> well before 96 tokens: the runs above went past it.
for m in spark-demo-coder-moe spark-demo-coder-next; do
    n=$(golden_ids "$models/$m/golden.safetensors" greedy | tr ',' '\n' | wc -l)
    [ "$n" -lt 96 ] || { echo "FAIL: the golden answer of $m is not shorter than 96 tokens"; fails=$((fails + 1)); }
done
# A hybrid (Gated DeltaNet) target with a dense draft of the same vocabulary (test fixtures).
ids=$(golden_ids "$data/models/qwen3_next-bf16/golden.safetensors" prompt)
same "qwen3_next fixture + draft fixture" "$data/models/qwen3_next-bf16" "draft:$data/models/qwen3-bf16"

"$eval" -m "$models/spark-demo-coder-moe" --tokens "$ids" --greedy 4 --logits-out "$tmp/x.safetensors" --spec medusa 2> "$tmp/err"
rc=$?
if [ $rc -ne 1 ] || ! grep -q "expected draft:PATH" "$tmp/err"; then echo "FAIL bad --spec: rc=$rc"; cat "$tmp/err"; fails=$((fails + 1)); else echo "ok   bad --spec: $(cat "$tmp/err")"; fi
"$eval" -m "$models/spark-demo-coder-moe" --tokens "$ids" --greedy 4 --logits-out "$tmp/x.safetensors" --spec mtp 2> "$tmp/err"
rc=$?
if [ $rc -ne 1 ] || ! grep -q "MTP" "$tmp/err"; then echo "FAIL mtp without a head: rc=$rc"; cat "$tmp/err"; fails=$((fails + 1)); else echo "ok   mtp without a head: $(cat "$tmp/err")"; fi
[ $fails -eq 0 ] || exit 1
echo "spark-eval --spec: ok"
