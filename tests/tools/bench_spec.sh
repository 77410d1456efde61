#!/usr/bin/env bash
# spark-bench --spec smoke runs (small: CI has 2 cores): a real draft model on the demo MoE model,
# and simulated acceptance (--spec-sim-accept) with n-gram drafts on a synthetic model, in the table
# and in --json; a source the model lacks (MTP) skips only the speculative row; without --spec the
# table keeps its columns; bad options exit 2 with a message.
set -uo pipefail
build=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
bench=$build/tools/bench/spark-bench
models=$root/examples/models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
check() {  # check NAME FILE PATTERN: FILE has a line matching the extended regex PATTERN
    if grep -Eq -- "$3" "$2"; then echo "ok   $1"; else echo "FAIL $1: no line matches '$3'"; cat "$2" "$tmp/err"; fails=$((fails + 1)); fi
}
num='[0-9]+\.[0-9]+'

"$bench" --device cpu -m "$models/spark-demo-coder-moe" --spec "draft:$models/spark-demo-coder-draft" -n 16 -p 0 -r 1 > "$tmp/out" 2> "$tmp/err" \
    || { echo "FAIL draft model run: exit code $?"; cat "$tmp/err"; fails=$((fails + 1)); }
check "draft: tg row" "$tmp/out" "^\| .*spark-demo-coder-moe \| bf16 \| tg16 \| 0 \| $num"
# speculative t/s, speedup, tokens/step (>= 1), verify cost ratio, acceptance at positions 1..3
check "draft: spec row" "$tmp/out" "^\| .* \| spec tg16 \(draft, k=3\) \| 0 \| $num ± $num \| \| \| ${num}x \| [1-4]\.[0-9]+ \| $num \| ($num|-) ($num|-) ($num|-) \|$"
check "draft: acceptance on stderr" "$tmp/err" "speculative \(draft, k=3\): .*acceptance by draft position"

"$bench" --device cpu --synthetic tiny-qwen3 --spec ngram --spec-sim-accept 0.8,0.5 > "$tmp/out" 2> "$tmp/err" \
    || { echo "FAIL simulated run: exit code $?"; cat "$tmp/err"; fails=$((fails + 1)); }
check "simulated: spec row, k = number of rates" "$tmp/out" "^\| tiny-qwen3 \| int4 \| spec tg128 \(ngram, k=2, simulated acceptance\) \| 0 \| $num ± $num \| \| \| ${num}x \| $num \| $num \| $num $num \|$"
check "simulated: labelled" "$tmp/out" "^SIMULATED acceptance \(--spec-sim-accept 0.8,0.5\)"

"$bench" --device cpu --synthetic tiny-qwen3-moe --spec ngram --spec-sim-accept 0.9,0.6,0.3 --draft-max 2 -n 24 -p 0 -r 1 -d 0,32 --json > "$tmp/out" 2> "$tmp/err" \
    || { echo "FAIL json run: exit code $?"; cat "$tmp/err"; fails=$((fails + 1)); }
python3 - "$tmp/out" <<'PY' && echo "ok   json" || { echo "FAIL json"; cat "$tmp/out"; fails=$((fails + 1)); }
import json, sys
r = json.load(open(sys.argv[1]))['results']
spec = [x for x in r if x['test'].startswith('spec')]
assert [x['depth'] for x in spec] == [0, 32], r
for x in spec:
    assert x['simulated'] is True and x['spec'] == 'ngram' and x['n_draft_max'] == 2, x
    assert len(x['acceptance']) == 2 and x['sim_accept'] == [0.9, 0.6], x
    assert x['tps'] > 0 and x['speedup'] > 0 and x['tokens_per_step'] >= 1 and x['verify_cost_ratio'] > 0, x
assert all('spec' not in x for x in r if not x['test'].startswith('spec')), r
PY

# A source the model cannot use: the plain rows still run, the speculative one says why not, and
# the exit code says that something asked for did not run.
"$bench" --device cpu --synthetic tiny-qwen3 --spec mtp -n 8 -p 0 -r 1 > "$tmp/out" 2> "$tmp/err"
rc=$?
[ $rc -eq 1 ] && echo "ok   mtp without a head: exit code 1" || { echo "FAIL mtp without a head: exit code $rc, not 1"; fails=$((fails + 1)); }
check "mtp without a head: not run" "$tmp/out" "^\| tiny-qwen3 \| int4 \| spec \(mtp, k=3\) \| - \| not run"
check "mtp without a head: tg still runs" "$tmp/out" "^\| tiny-qwen3 \| int4 \| tg8 \| 0 \| $num"
check "mtp without a head: message" "$tmp/err" "no speculative decoding \(--spec mtp\): .*MTP"

# Without --spec: the table has its seven columns.
"$bench" --device cpu --synthetic tiny-qwen3 -n 8 -p 8 -r 1 > "$tmp/out" 2> "$tmp/err"
check "no --spec: unchanged header" "$tmp/out" "^\| model \| format \| test \| depth \| t/s \| step MB \| % of copy BW \|$"
grep -q "spec" "$tmp/out" && { echo "FAIL no --spec: speculative rows"; fails=$((fails + 1)); }

for bad in "--spec medusa" "--spec-sim-accept 0.5" "--spec ngram --spec-sim-accept 0.5,x" "--spec ngram --spec-sim-accept 0.5 --draft-max 2"; do
    "$bench" --device cpu --synthetic tiny-qwen3 -n 8 -p 0 -r 1 $bad > /dev/null 2> "$tmp/err"
    rc=$?
    if [ $rc -ne 2 ] || [ ! -s "$tmp/err" ]; then echo "FAIL '$bad': rc=$rc"; fails=$((fails + 1)); else echo "ok   '$bad': $(head -1 "$tmp/err")"; fi
done
[ $fails -eq 0 ] || exit 1
echo "spark-bench --spec: ok"
