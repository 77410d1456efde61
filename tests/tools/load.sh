#!/usr/bin/env bash
# Loading as the tools show it (CPU, small models; no timing assertions):
#   spark-bench --load: the table's columns, one row per run, the bytes of the model's files (one
#   safetensors file, a sharded directory, a spark file), --cold (the share of pages still cached
#   is printed, whatever it is), --json, and the refusals (synthetic models, options that do not
#   apply) with exit code 2, a model that does not load with exit code 1;
#   spark-chat: the timings line ends with the load time; the load's progress bar is drawn on a
#   terminal only (never into a pipe or a file), and erased.
set -uo pipefail
build=$1
data=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
bench=$build/tools/bench/spark-bench
chat=$build/examples/chat/spark-chat
convert=$build/tools/convert/spark-convert
demo=$root/examples/models/spark-demo-coder-moe
small=$data/models/qwen3-bf16
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL $1"; [ -f "$tmp/err" ] && cat "$tmp/err"; fails=$((fails + 1)); }
check() {  # check NAME FILE PATTERN: FILE has a line matching the extended regex PATTERN
    if grep -Eq -- "$3" "$2"; then echo "ok   $1"; else fail "$1: no line matches '$3'"; cat "$2"; fi
}
num='[0-9]+\.[0-9]+'
row() {  # row MODEL RUN CACHE: the regex of one --load row
    echo "^\| $1 \| $2 \| $3 \| [0-9]+ \| $num \| $num \| $num \| $num \| $num \|$"
}
json_check() {  # json_check NAME FILE RUNS BYTES COLD: the --json output of a --load run
    python3 - "$2" "$3" "$4" "$5" <<'PY' && echo "ok   $1" || { fail "$1"; cat "$2"; }
import json, sys
out, runs, size, cold = json.load(open(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == 'cold'
r = out['load']
assert [x['run'] for x in r] == list(range(1, runs + 1)), r
for x in r:
    assert x['ok'] is True and x['cold'] is cold, x
    assert x['file_bytes'] == size, (x['file_bytes'], size)
    assert x['load_s'] > 0 and x['first_token_s'] >= x['load_s'] and x['gbs'] > 0, x
    assert x['peak_rss_bytes'] > 0 and (x['cached_fraction'] is None or 0 <= x['cached_fraction'] <= 1), x
PY
}
size_of() { stat -c %s "$@" | awk '{ s += $1 } END { print s }'; }

# --- spark-bench --load ---
"$bench" --device cpu -m "$small" --load -r 2 > "$tmp/out" 2> "$tmp/err" || fail "--load: exit code $?"
check "--load: header" "$tmp/out" '^\| model \| run \| cache \| cached % \| load s \| first token s \| GB read \| GB/s \| peak RSS GB \|$'
check "--load: run 1" "$tmp/out" "$(row ".*qwen3-bf16" 1 warm)"
check "--load: run 2" "$tmp/out" "$(row ".*qwen3-bf16" 2 warm)"
[ "$(grep -c '^| .*qwen3-bf16 |' "$tmp/out")" -eq 2 ] && echo "ok   --load: -r 2 gives 2 rows" || fail "--load: -r 2 did not give 2 rows"
check "--load: peak RSS explained" "$tmp/out" "^peak RSS GB: the process's resident-memory high-water mark"

"$bench" --device cpu -m "$demo" --load --cold -r 2 > "$tmp/out" 2> "$tmp/err" || fail "--cold: exit code $?"
check "--cold: rows" "$tmp/out" "$(row ".*spark-demo-coder-moe" 2 cold)"
check "--cold: residency after eviction" "$tmp/err" "run 1: --cold: [0-9]+% of the files' pages in the page cache after eviction"
check "--cold: drop_caches documented" "$tmp/out" "echo 3 > /proc/sys/vm/drop_caches"

"$bench" --device cpu -m "$small" --load -r 2 --json > "$tmp/out" 2> "$tmp/err" || fail "--json: exit code $?"
json_check "--load --json: one safetensors file" "$tmp/out" 2 "$(size_of "$small/model.safetensors")" warm

# A sharded copy of the small model (two shards and an index): the bytes are the shards'.
python3 - "$small" "$tmp/sharded" <<'PY'
import json, os, shutil, struct, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst)
shutil.copy(os.path.join(src, 'config.json'), dst)
f = open(os.path.join(src, 'model.safetensors'), 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); d = f.read()
names = sorted(k for k in h if k != '__metadata__')
weight_map = {}
for i, part in enumerate((names[0::2], names[1::2])):
    shard, header, blob = 'model-%05d-of-00002.safetensors' % (i + 1), {}, b''
    for k in part:
        o = h[k]['data_offsets']
        header[k] = {'dtype': h[k]['dtype'], 'shape': h[k]['shape'], 'data_offsets': [len(blob), len(blob) + o[1] - o[0]]}
        blob += d[o[0]:o[1]]
        weight_map[k] = shard
    text = json.dumps(header).encode()
    open(os.path.join(dst, shard), 'wb').write(struct.pack('<Q', len(text)) + text + blob)
json.dump({'metadata': {}, 'weight_map': weight_map}, open(os.path.join(dst, 'model.safetensors.index.json'), 'w'))
PY
"$bench" --device cpu -m "$tmp/sharded" --load --cold -r 1 --json > "$tmp/out" 2> "$tmp/err" || fail "sharded: exit code $?"
json_check "--load --cold --json: sharded directory" "$tmp/out" 1 "$(size_of "$tmp"/sharded/model-*.safetensors)" cold

if [ -x "$convert" ]; then
    "$convert" "$small" -o "$tmp/small.spark" > /dev/null 2> "$tmp/err" || fail "spark-convert"
    "$bench" --device cpu -m "$tmp/small.spark" --load -r 1 --json > "$tmp/out" 2> "$tmp/err" || fail "spark file: exit code $?"
    json_check "--load --json: spark file" "$tmp/out" 1 "$(size_of "$tmp/small.spark")" warm
fi

refuse() {  # refuse NAME PATTERN -- ARGS...: exit code 2 with PATTERN on stderr
    local name=$1 pattern=$2; shift 3
    "$bench" --device cpu "$@" > /dev/null 2> "$tmp/err"
    local rc=$?
    if [ $rc -ne 2 ] || ! grep -q -- "$pattern" "$tmp/err"; then fail "$name: rc=$rc"; else echo "ok   $name: $(head -1 "$tmp/err")"; fi
}
refuse "--load of a synthetic model" "a synthetic model has none" -- --synthetic tiny-qwen3 --load
refuse "--load of synthetic:PATH" "a synthetic model has none" -- -m synthetic:tiny-qwen3:int4 --load
refuse "--load with -n" "does not apply to --load" -- -m "$small" --load -n 8
refuse "--load with --spec" "does not apply to --load" -- -m "$small" --load --spec ngram
refuse "--cold without --load" "--cold goes with --load" -- -m "$small" --cold
"$bench" --device cpu -m "$tmp/nonexistent" --load -r 1 > "$tmp/out" 2> "$tmp/err"
rc=$?
[ $rc -eq 1 ] && grep -q "not run" "$tmp/out" && echo "ok   --load of a missing model: exit code 1" || fail "--load of a missing model: rc=$rc"
"$bench" --device cpu -m "$tmp/nonexistent" -n 4 -p 0 -r 1 > "$tmp/out" 2> "$tmp/err"
rc=$?
[ $rc -eq 1 ] && echo "ok   a model that does not load: exit code 1" || fail "a model that does not load: rc=$rc"

# --- spark-chat ---
prompt='Write a Python function `add(a, b)`: Return the sum.'
"$chat" -m "$demo" -p "$prompt" --temp 0 -n 16 -t 1 > "$tmp/out" 2> "$tmp/err" || fail "chat: exit code $?"
check "chat: timings line with the load time" "$tmp/err" \
    "^prompt [0-9]+ tokens \([0-9]+ new\) in $num s = $num tok/s; answer [0-9]+ tokens in $num s = $num tok/s; context [0-9]+/[0-9]+; (greedy|seed [0-9]+); load $num s$"
if grep -q 'loading  \[' "$tmp/err" || grep -q $'\r' "$tmp/err"; then fail "chat: a progress bar on a non-terminal"; else echo "ok   chat: no progress bar into a file"; fi
printf '%s\n/stats\n' "$prompt" | "$chat" -m "$demo" --temp 0 -n 16 -t 1 2>&1 > /dev/null | cat > "$tmp/err"
check "chat: /stats has the load time (piped)" "$tmp/err" "; load $num s$"
grep -q 'loading  \[' "$tmp/err" && fail "chat: a progress bar into a pipe"

# On a terminal (script gives the program a pty): the bar is drawn, reaches the total, is erased.
if command -v script > /dev/null; then
    for prog in "$chat -m $demo -p hi --temp 0 -n 4 -t 1" "$bench --device cpu -m $demo --load -r 1"; do
        name=$(basename "${prog%% *}")
        script -qec "$prog" /dev/null > "$tmp/tty" 2>&1 < /dev/null || fail "$name on a terminal: exit code $?"
        if grep -aq $'\rloading  \[#\{24\}\]  18\.4 / 18\.4 MB' "$tmp/tty" \
            && grep -aq $'MB[^\r]*\e\[K\r\e\[K' "$tmp/tty"; then
            echo "ok   $name: progress bar on a terminal, erased"
        else
            fail "$name: no progress bar on a terminal"; cat -A "$tmp/tty" | head -20
        fi
    done
fi
[ $fails -eq 0 ] || exit 1
echo "loading (spark-bench --load, spark-chat): ok"
