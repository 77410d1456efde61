#!/usr/bin/env bash
# The command lines of spark-bench, spark-convert, spark-eval, spark-tokenize and
# spark-bench-tokenizer as a llama.cpp user expects them (CPU, tiny models, seconds):
#   --version (the library's build: version and commit) and --help with the defaults;
#   a value that does not parse: exit code 2 and a message naming the option and the value (no abort);
#   spark-bench: --help lists the library's synthetic shapes; exit code 1 when a figure could not run
#   (unknown shape or format, missing model, --device cuda without CUDA); the default device is the
#   CPU without a CUDA device; -o csv and -o json (--json) parse, with one field per header column;
#   spark-convert: --info names the architecture; options that do nothing without --quantize (or
#   --synthetic) are refused; an existing output names -f/--force; plain progress lines when stderr
#   is not a terminal, the bar (drawn in place, then erased) when it is;
#   spark-tokenize: the text as an argument, against the Qwen3 goldens.
set -uo pipefail
build=$1
data=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
bench=$build/tools/bench/spark-bench
convert=$build/tools/convert/spark-convert
eval=$build/tools/eval/spark-eval
tok=$build/tools/tokenize/spark-tokenize
benchtok=$build/tools/bench-tokenizer/spark-bench-tokenizer
small=$data/models/qwen3-bf16
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
ok() { echo "ok   $1"; }
has() {  # has NAME FILE PATTERN: FILE has a line matching the extended regex PATTERN
    if grep -Eq -- "$3" "$2"; then ok "$1"; else fail "$1: no line matches '$3'"; cat "$2"; fi
}

# --- --version: "PROGRAM: spark X.Y.Z (commit ...) backends: ..." on stdout, exit code 0 ---
version=$(sed -n 's/^#define SPARK_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' "$root/include/spark/spark.h" | paste -sd.)
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "the version in spark.h: '$version'"
for prog in "$bench" "$convert" "$eval" "$tok" "$benchtok"; do
    name=$(basename "$prog")
    out=$("$prog" --version 2> "$tmp/err")
    rc=$?
    if [ $rc -eq 0 ] && [[ $out == "$name: spark $version (commit "*") backends: cpu"* ]]; then ok "$name --version: $out"
    else fail "$name --version: rc=$rc, '$out'"; cat "$tmp/err"; fi
done

# --- --help shows the defaults ---
"$bench" --help > "$tmp/help" || fail "spark-bench --help: exit code $?"
has "spark-bench --help: -p default" "$tmp/help" '^ +-p,--n-prompt [A-Z:]+=512$'
has "spark-bench --help: -o default" "$tmp/help" '^ +-o,--output [^ ]+=md$'
has "spark-bench --help: --device default" "$tmp/help" '^ +--device [^ ]+=auto$'
"$convert" --help > "$tmp/help" || fail "spark-convert --help: exit code $?"
has "spark-convert --help: --group-size default" "$tmp/help" '^ +--group-size [^ ]+=128$'
has "spark-convert --help: --shard-size default" "$tmp/help" '^ +--shard-size TEXT=5GB '
"$eval" --help > "$tmp/help" || fail "spark-eval --help: exit code $?"
has "spark-eval --help: --draft-max default" "$tmp/help" '^ +--draft-max .*=3$'
"$benchtok" --help > "$tmp/help" || fail "spark-bench-tokenizer --help: exit code $?"
has "spark-bench-tokenizer --help: --mb default" "$tmp/help" '^ +--mb [^ ]+=8 '

# --- the synthetic shapes: the library's list (its message for an unknown shape) is in --help ---
"$bench" --synthetic no-such-shape --device cpu -p 0 -n 1 -r 1 > "$tmp/out" 2> "$tmp/err"
rc=$?
[ $rc -eq 1 ] && ok "spark-bench: unknown shape: exit code 1" || fail "spark-bench: unknown shape: exit code $rc, not 1"
has "spark-bench: unknown shape: a row says not run" "$tmp/out" '^\| synthetic:no-such-shape:int4 \| .*not run'
shapes=$(sed -n "s/.*unknown synthetic shape 'no-such-shape' (\([^)]*\)).*/\1/p" "$tmp/err")
if [ -z "$shapes" ]; then fail "no list of shapes in the library's message"; cat "$tmp/err"
else
    "$bench" --help | grep -qF -- "$shapes" && ok "spark-bench --help lists the shapes: $shapes" || fail "spark-bench --help does not list '$shapes'"
    "$convert" --help | grep -qF -- "$shapes" && ok "spark-convert --help lists the shapes" || fail "spark-convert --help does not list '$shapes'"
fi

# --- a value that does not parse: exit code 2, the option and the value named, no abort ---
bad() {  # bad NAME PATTERN... -- COMMAND...: exit code 2 and every PATTERN (fixed strings) on stderr
    local name=$1 patterns=()
    shift
    while [ "$1" != "--" ]; do patterns+=("$1"); shift; done
    shift
    "$@" > "$tmp/out" 2> "$tmp/err"
    local rc=$? p
    for p in "${patterns[@]}"; do grep -qF -- "$p" "$tmp/err" || { fail "$name: rc=$rc, no '$p' on stderr"; cat "$tmp/err"; return; }; done
    [ $rc -eq 2 ] && ok "$name: $(head -1 "$tmp/err")" || { fail "$name: exit code $rc, not 2"; cat "$tmp/err"; }
}
bad "spark-bench -d abc" "-d/--depth" "'abc'" -- "$bench" --synthetic tiny-qwen3 --device cpu -d abc
bad "spark-bench -d 0,-5" "-d/--depth" "'-5'" -- "$bench" --synthetic tiny-qwen3 --device cpu -d 0,-5
bad "spark-bench -d 99999999999" "-d/--depth" "'99999999999'" -- "$bench" --synthetic tiny-qwen3 --device cpu -d 99999999999
bad "spark-bench -p x" "--n-prompt" " x " -- "$bench" --synthetic tiny-qwen3 --device cpu -p x
bad "spark-bench -n -4" "--n-gen" " -4 " -- "$bench" --synthetic tiny-qwen3 --device cpu -n -4
bad "spark-bench -r 0" "--repetitions" " 0 " -- "$bench" --synthetic tiny-qwen3 --device cpu -r 0
bad "spark-bench -t many" "--threads" " many " -- "$bench" --synthetic tiny-qwen3 --device cpu -t many
bad "spark-bench -o xml" "--output" "xml" -- "$bench" --synthetic tiny-qwen3 --device cpu -o xml
bad "spark-bench --json -o csv" "--json" "-o csv" -- "$bench" --synthetic tiny-qwen3 --device cpu --json -o csv
bad "spark-eval --tokens 1,x" "--tokens" "'x'" -- "$eval" -m "$small" --tokens 1,x --logits-out "$tmp/o.safetensors"
bad "spark-eval --tokens 1,99999999999" "--tokens" "'99999999999'" -- "$eval" -m "$small" --tokens 1,99999999999 --logits-out "$tmp/o.safetensors"
bad "spark-eval --greedy abc" "--greedy" "abc" -- "$eval" -m "$small" --tokens 1,2 --greedy abc --logits-out "$tmp/o.safetensors"
bad "spark-eval -t -1" "--threads" "-1" -- "$eval" -m "$small" --tokens 1,2 -t -1 --logits-out "$tmp/o.safetensors"
bad "spark-eval --draft-max 0" "--draft-max" " 0 " -- "$eval" -m "$small" --tokens 1,2 --spec ngram --draft-max 0 --logits-out "$tmp/o.safetensors"
[ -e "$tmp/o.safetensors" ] && fail "spark-eval wrote an output for bad options"
bad "spark-convert --group-size abc" "--group-size" "'abc'" -- "$convert" "$small" -o "$tmp/x.spark" --quantize int4 --group-size abc
bad "spark-convert --group-size 48" "--group-size" "'48'" -- "$convert" "$small" -o "$tmp/x.spark" --quantize int4 --group-size 48
bad "spark-convert --threads x" "--threads" " x " -- "$convert" --synthetic tiny-qwen3:bf16 -o "$tmp/x" --threads x
bad "spark-convert --shard-size 5XB" "--shard-size" "'5XB'" -- "$convert" --synthetic tiny-qwen3:bf16 -o "$tmp/x" --shard-size 5XB
bad "spark-bench-tokenizer --mb x" "--mb" " x " -- "$benchtok" --mb x
bad "spark-bench-tokenizer --loads 0" "--loads" " 0 " -- "$benchtok" --loads 0
[ -e "$tmp/x.spark" ] || [ -e "$tmp/x" ] && fail "spark-convert wrote an output for bad options"

# --- spark-bench: a figure that could not run is exit code 1 ---
"$bench" -m "$tmp/nonexistent" --device cpu -p 8 -n 4 -r 1 > "$tmp/out" 2> "$tmp/err"
rc=$?
[ $rc -eq 1 ] && grep -q "not run" "$tmp/out" && ok "spark-bench: missing model: exit code 1" || fail "spark-bench: missing model: exit code $rc"
"$bench" --synthetic tiny-qwen3 --format no-such-format --device cpu -p 8 -n 4 -r 1 > "$tmp/out" 2> "$tmp/err"
rc=$?
[ $rc -eq 1 ] && ok "spark-bench: unknown format: exit code 1" || fail "spark-bench: unknown format: exit code $rc"
# One model that loads and one that does not: the first's rows are there, the exit code is still 1.
"$bench" --synthetic tiny-qwen3,no-such-shape --device cpu -p 8 -n 4 -r 1 -o csv > "$tmp/out" 2> "$tmp/err"
rc=$?
[ $rc -eq 1 ] && grep -q '^cpu,tiny-qwen3,int4,tg4,' "$tmp/out" && ok "spark-bench: one of two models missing: exit code 1, the other's rows" \
    || { fail "spark-bench: one of two models missing: exit code $rc"; cat "$tmp/out"; }
if ! "$bench" --version | grep -q 'backends: .*cuda'; then  # a build without CUDA: no CUDA device
    "$bench" --synthetic tiny-qwen3 --device cuda -p 8 -n 4 -r 1 > "$tmp/out" 2> "$tmp/err"
    rc=$?
    [ $rc -eq 1 ] && grep -q "no CUDA device" "$tmp/err" && ok "spark-bench --device cuda without CUDA: exit code 1" \
        || { fail "spark-bench --device cuda without CUDA: exit code $rc"; cat "$tmp/err"; }
    "$bench" --synthetic tiny-qwen3 -p 8 -n 4 -r 1 -o json > "$tmp/out" 2> "$tmp/err" || fail "spark-bench without --device: exit code $?"
    python3 -c "import json, sys; assert json.load(open(sys.argv[1]))['device'] == 'cpu'" "$tmp/out" \
        && ok "spark-bench without --device and without CUDA: runs on the CPU" || { fail "spark-bench default device"; cat "$tmp/out" "$tmp/err"; }
fi

# --- spark-bench -o csv / -o json / --json ---
"$bench" --synthetic tiny-qwen3 --device cpu -p 8 -n 4 -r 1 -d 0,8 -o csv > "$tmp/out.csv" 2> "$tmp/err" || { fail "-o csv: exit code $?"; cat "$tmp/err"; }
python3 - "$tmp/out.csv" <<'PY' && ok "spark-bench -o csv: header and 4 rows" || { fail "spark-bench -o csv"; cat "$tmp/out.csv"; }
import csv, sys
rows = list(csv.reader(open(sys.argv[1], newline='')))
header = ['device', 'model', 'format', 'test', 'depth', 'tps', 'tps_stdev', 'step_bytes', 'bw_fraction']
assert rows[0] == header, rows[0]
body = rows[1:]
assert [(r[3], r[4]) for r in body] == [('pp8', '0'), ('tg4', '0'), ('pp8', '8'), ('tg4', '8')], body
for r in body:
    assert len(r) == len(header), r
    assert r[0] == 'cpu' and r[1] == 'tiny-qwen3' and r[2] == 'int4', r
    assert float(r[5]) > 0 and float(r[6]) >= 0 and float(r[8]) >= 0, r
    assert (int(r[7]) > 0) == r[3].startswith('tg'), r  # the bytes of a decode step
PY
"$bench" --synthetic tiny-qwen3 --device cpu -p 0 -n 8 -r 1 --spec ngram --spec-sim-accept 0.8,0.5 -o csv > "$tmp/out.csv" 2> "$tmp/err" \
    || { fail "-o csv --spec: exit code $?"; cat "$tmp/err"; }
python3 - "$tmp/out.csv" <<'PY' && ok "spark-bench -o csv --spec: the speculative columns (a quoted test name)" || { fail "spark-bench -o csv --spec"; cat "$tmp/out.csv"; }
import csv, sys
rows = list(csv.reader(open(sys.argv[1], newline='')))
assert rows[0][9:] == ['spec', 'n_draft_max', 'simulated', 'speedup', 'tokens_per_step', 'verify_cost_ratio', 'acceptance'], rows[0]
assert all(len(r) == 16 for r in rows), rows
tg, spec = rows[1], rows[2]
assert tg[3] == 'tg8' and tg[9:] == [''] * 7, tg
assert spec[3] == 'spec tg8 (ngram, k=2, simulated acceptance)' and spec[9:12] == ['ngram', '2', 'true'], spec
assert float(spec[5]) > 0 and float(spec[12]) > 0 and len(spec[15].split()) == 2, spec
PY
for flag in "-o json" "--json"; do
    "$bench" --synthetic tiny-qwen3 --device cpu -p 8 -n 4 -r 1 $flag > "$tmp/out.json" 2> "$tmp/err" || { fail "$flag: exit code $?"; cat "$tmp/err"; }
    python3 -m json.tool "$tmp/out.json" > /dev/null && python3 - "$tmp/out.json" <<'PY' && ok "spark-bench $flag" || { fail "spark-bench $flag"; cat "$tmp/out.json"; }
import json, sys
j = json.load(open(sys.argv[1]))
assert j['device'] == 'cpu' and j['copy_bandwidth_gbs'] >= 0, j
assert [r['test'] for r in j['results']] == ['pp8', 'tg4'], j
assert all(r['model'] == 'tiny-qwen3' and r['format'] == 'int4' and r['tps'] > 0 for r in j['results']), j
PY
done
"$bench" -m "$small" --device cpu --load -r 2 -o csv > "$tmp/out.csv" 2> "$tmp/err" || { fail "--load -o csv: exit code $?"; cat "$tmp/err"; }
python3 - "$tmp/out.csv" "$(stat -c %s "$small/model.safetensors")" <<'PY' && ok "spark-bench --load -o csv" || { fail "spark-bench --load -o csv"; cat "$tmp/out.csv"; }
import csv, sys
rows = list(csv.reader(open(sys.argv[1], newline='')))
assert rows[0] == ['device', 'model', 'run', 'cache', 'ok', 'cached_fraction', 'load_s', 'first_token_s', 'file_bytes', 'gbs', 'peak_rss_bytes'], rows[0]
assert [r[2] for r in rows[1:]] == ['1', '2'], rows
for r in rows[1:]:
    assert len(r) == 11 and r[3] == 'warm' and r[4] == 'true' and int(r[8]) == int(sys.argv[2]), r
    assert float(r[6]) > 0 and float(r[7]) >= float(r[6]) and int(r[10]) > 0, r
PY

# --- spark-convert: options that do nothing, -f/--force, progress ---
bad "spark-convert --group-size without --quantize" "--group-size" "without --quantize" -- "$convert" "$small" -o "$tmp/x.spark" --group-size 64
bad "spark-convert --asym without --quantize" "--asym" "without --quantize" -- "$convert" "$small" -o "$tmp/x.spark" --asym
bad "spark-convert --fp8-per-channel without --quantize" "--fp8-per-channel" "without --quantize" -- "$convert" "$small" -o "$tmp/x.spark" --fp8-per-channel
bad "spark-convert --quantize-lm-head without --quantize" "--quantize-lm-head" "without --quantize" -- "$convert" "$small" -o "$tmp/x.spark" --quantize-lm-head
bad "spark-convert --asym with --quantize fp8" "--asym" "--quantize int4" -- "$convert" "$small" -o "$tmp/x.spark" --quantize fp8 --asym
bad "spark-convert --shard-size without --synthetic" "--shard-size" "--synthetic" -- "$convert" "$small" -o "$tmp/x.spark" --shard-size 1GB
[ -e "$tmp/x.spark" ] && fail "spark-convert wrote an output for refused options"

# Not a terminal: plain lines (no carriage return, no escape sequence), the last one complete.
"$convert" "$small" -o "$tmp/a.spark" > /dev/null 2> "$tmp/err" || { fail "spark-convert: exit code $?"; cat "$tmp/err"; }
has "spark-convert: a plain progress line, complete" "$tmp/err" '^converting  \[#{24}\]  ([0-9.]+) / \1 MB'
has "spark-convert: the summary line" "$tmp/err" "^spark-convert: wrote $tmp/a.spark: "
grep -q $'[\r\e]' "$tmp/err" && { fail "spark-convert: terminal control characters into a file"; cat -A "$tmp/err"; } || ok "spark-convert: no bar into a file"
"$convert" "$small" -o "$tmp/q.spark" --quantize int4 --group-size 64 > /dev/null 2> "$tmp/err" || { fail "spark-convert --quantize int4: exit code $?"; cat "$tmp/err"; }
has "spark-convert --quantize: per-tensor report" "$tmp/err" '^model\.layers\.0\.mlp\.down_proj\.weight +relative error [0-9.]+$'
has "spark-convert --quantize: progress line" "$tmp/err" '^converting  \[#{24}\]  ([0-9.]+) / \1 MB'
grep -q $'[\r\e]' "$tmp/err" && { fail "spark-convert --quantize: terminal control characters into a file"; cat -A "$tmp/err"; }
"$convert" "$small" -o "$tmp/q.spark" --quantize int4 -q -f > /dev/null 2> "$tmp/err" || { fail "spark-convert -q -f: exit code $?"; cat "$tmp/err"; }
grep -q "relative error" "$tmp/err" && fail "spark-convert -q: a per-tensor report" || ok "spark-convert -q: no per-tensor report"

# An existing output: refused, naming -f/--force; replaced with -f.
"$convert" "$small" -o "$tmp/a.spark" > /dev/null 2> "$tmp/err"
rc=$?
[ $rc -eq 1 ] && grep -qF "'$tmp/a.spark' already exists (pass -f/--force to replace it)" "$tmp/err" && ok "spark-convert: existing output: $(cat "$tmp/err")" \
    || { fail "spark-convert: existing output: exit code $rc"; cat "$tmp/err"; }
"$convert" "$small" -o "$tmp/a.spark" -f > /dev/null 2> "$tmp/err" && ok "spark-convert -f replaces it" || { fail "spark-convert -f: exit code $?"; cat "$tmp/err"; }
"$convert" --synthetic tiny-qwen3:bf16 -o "$tmp/syn" > /dev/null 2> "$tmp/err" || { fail "spark-convert --synthetic: exit code $?"; cat "$tmp/err"; }
has "spark-convert --synthetic: a plain progress line" "$tmp/err" '^writing  \[#{24}\]  ([0-9.]+) / \1 MB'
"$convert" --synthetic tiny-qwen3:bf16 -o "$tmp/syn" > /dev/null 2> "$tmp/err"
rc=$?
[ $rc -eq 1 ] && grep -qF "(pass -f/--force to replace it)" "$tmp/err" && ok "spark-convert --synthetic: existing directory names -f/--force" \
    || { fail "spark-convert --synthetic: existing directory: exit code $rc"; cat "$tmp/err"; }

# --info: the architecture (llama.cpp's name) of each family's spark file.
for pair in "qwen3_moe-bf16 qwen3moe" "qwen3_next-bf16 qwen3next" "minimax_m2-int4-autoround minimax-m2"; do
    set -- $pair
    "$convert" "$data/models/$1" -o "$tmp/$1.spark" > /dev/null 2> "$tmp/err" || { fail "spark-convert $1: exit code $?"; cat "$tmp/err"; }
    "$convert" --info "$tmp/$1.spark" > "$tmp/info" 2> "$tmp/err" || { fail "spark-convert --info $1: exit code $?"; cat "$tmp/err"; }
    has "spark-convert --info $1: general.architecture $2" "$tmp/info" "^ +general\.architecture +\"$2\"$"
done

# On a terminal (script gives the program a pty): the bar is drawn in place and erased before the summary.
if command -v script > /dev/null; then
    script -qec "$convert $small -o $tmp/t.spark" /dev/null > "$tmp/tty" 2>&1 < /dev/null || fail "spark-convert on a terminal: exit code $?"
    if grep -aq $'\rconverting  \[#\{24\}\]  \([0-9.]*\) / \\1 MB' "$tmp/tty" && grep -aq $'\e\[K\r\e\[Kspark-convert: wrote' "$tmp/tty"; then
        ok "spark-convert: progress bar on a terminal, erased"
    else
        fail "spark-convert: no progress bar on a terminal"; cat -A "$tmp/tty" | head -20
    fi
fi

# --- spark-tokenize: the text as an argument ---
python3 - "$data/tokenizers/qwen3_extra_golden.jsonl" "$tmp/golden" <<'PY'
import json, sys
cases = [json.loads(l) for l in open(sys.argv[1])]
# Some with special tokens, some with newlines and non-ASCII text; none that starts with '-' or holds NUL.
picked = [c for c in cases if c['text'] and '\0' not in c['text'] and not c['text'].startswith('-')]
picked = [c for c in picked if '<|' in c['text']][:2] + [c for c in picked if '\n' in c['text'] or any(ord(ch) > 127 for ch in c['text'])][:4]
assert len(picked) >= 4, len(picked)
for i, c in enumerate(picked):
    open('%s.%d.text' % (sys.argv[2], i), 'wb').write(c['text'].encode())
    open('%s.%d.ids' % (sys.argv[2], i), 'w').write(json.dumps(c['ids']))
    open('%s.%d.special' % (sys.argv[2], i), 'w').write('' if c['parse_special'] else '--no-special')
    open('%s.%d.decoded' % (sys.argv[2], i), 'wb').write(c['decoded'].encode())
PY
for t in "$tmp"/golden.*.text; do
    base=${t%.text}
    text=$(cat "$t"; printf x)  # keeps trailing newlines
    text=${text%x}
    special=$(cat "$base.special")
    "$tok" --tokenizer "$data/tokenizers/qwen3" $special "$text" > "$tmp/ids" 2> "$tmp/err" || { fail "spark-tokenize TEXT: exit code $?"; cat "$tmp/err"; continue; }
    python3 -c "import json, sys; assert json.load(open(sys.argv[1])) == json.load(open(sys.argv[2]))" "$tmp/ids" "$base.ids" \
        || { fail "spark-tokenize TEXT ${special:-(special tokens)}: $(head -c 200 "$tmp/ids") is not $(head -c 200 "$base.ids")"; continue; }
    "$tok" --tokenizer "$data/tokenizers/qwen3" $special --in "$t" | cmp -s - "$tmp/ids" || { fail "spark-tokenize: TEXT and --in FILE differ"; continue; }
    "$tok" --tokenizer "$data/tokenizers/qwen3" --decode "$(cat "$base.ids")" > "$tmp/text" 2> "$tmp/err" || { fail "spark-tokenize --decode IDS: exit code $?"; cat "$tmp/err"; continue; }
    cmp -s "$tmp/text" "$base.decoded" || { fail "spark-tokenize --decode IDS: not the golden text"; continue; }
    ok "spark-tokenize TEXT ${special:-(special tokens)} and --decode IDS: $(head -c 60 "$base.ids")"
done
ls "$tmp"/golden.*.text > /dev/null 2>&1 || fail "no golden cases for spark-tokenize"
bad "spark-tokenize TEXT and --in" "--in" -- "$tok" --tokenizer "$data/tokenizers/qwen3" --in "$tmp/golden.0.text" "text"
bad "spark-tokenize without input" "TEXT" "--in" -- "$tok" --tokenizer "$data/tokenizers/qwen3"
bad "spark-tokenize --skip-special without --decode" "--skip-special" -- "$tok" --tokenizer "$data/tokenizers/qwen3" --skip-special "hi"

[ $fails -eq 0 ] || { echo "$fails failed"; exit 1; }
echo "tool command lines: ok"
