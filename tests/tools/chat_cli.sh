#!/usr/bin/env bash
# spark-chat's command line: --version and --help (with the defaults); llama.cpp's spellings
# (-s/--seed, -f/--file, -sys/--system-prompt, -c/--ctx-size, -t/--threads, -n/--n-predict/--predict,
# --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n) reach the sampler and the context;
# the seed is random unless given and the timings line shows it, so that -s repeats a sampled answer;
# values out of range are refused with a message naming the option and the value (exit code 2) or
# lowered with a message (-c beyond the model's context, -t beyond the hardware threads); -n 0 says
# there is nothing to generate and -n -1 generates until the context is full; installed as
# <prefix>/bin/spark-chat, the default model is <prefix>/share/spark/models/spark-demo-coder-moe.
# Every run uses the 9M-parameter demo model and at most 60 tokens (-c 100 for -n -1).
set -uo pipefail
build=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
chat=$build/examples/chat/spark-chat
models=$root/examples/models
model=$models/spark-demo-coder-moe
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fib='Write a Python function `fibonacci(n)`: Return the n-th Fibonacci number.'
primes='Write a Python function `primes_up_to(n)`: Return all primes up to n.'  # repeats itself until -n

fail() { echo "FAIL $1"; [ -f "$tmp/err" ] && cat "$tmp/err"; fails=$((fails + 1)); }
ok() { echo "ok   $1"; }
run() {  # run NAME ARGS...: spark-chat ARGS > $tmp/NAME.out 2> $tmp/NAME.err (also $tmp/err); exit code in $rc
    local name=$1; shift
    "$chat" "$@" > "$tmp/$name.out" 2> "$tmp/$name.err"
    rc=$?
    cp "$tmp/$name.err" "$tmp/err"
}
timings() { grep '^prompt ' "$tmp/$1.err" | tail -1; }  # the timings line of run NAME
same() { cmp -s "$tmp/$1.out" "$tmp/$2.out"; }

# --version: the library's build description (version and commit).
version=$(sed -n 's/^#define SPARK_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' "$root/include/spark/spark.h" | paste -sd.)
run version --version
if [ $rc -eq 0 ] && grep -q "^spark-chat: spark $version (commit [0-9a-f]" "$tmp/version.out"; then ok "--version: $(cat "$tmp/version.out")"
else fail "--version (rc=$rc, expected 'spark $version (commit ...'): $(cat "$tmp/version.out")"; fi

# --help shows the defaults and llama.cpp's spellings.
run help --help
missing=""
for want in "--temp FLOAT=0.7" "--top-k INT=20" "--top-p FLOAT=0.9" "-s,--seed INT=-1" "-c,--ctx-size INT=0" \
            "-t,--threads INT=0" "--n-predict" "INT=512" "-f,--file" "--system-prompt" "-sys" "--repeat-last-n INT=64" \
            "-m,--model TEXT=$model" "--version"; do
    grep -qF -- "$want" "$tmp/help.out" || missing="$missing '$want'"
done
[ $rc -eq 0 ] && [ -z "$missing" ] && ok "--help shows the defaults and the aliases" || fail "--help (rc=$rc) lacks:$missing"

# Values out of range: exit code 2 before the model loads, a message naming the option and the value,
# nothing on stdout.
refused() {  # refused PATTERN ARGS... (with -p hi unless ARGS begin with -f)
    local pattern=$1; shift
    if [ "$1" = -f ]; then run bad -m "$model" "$@"; else run bad -m "$model" -p hi "$@"; fi
    if [ $rc -eq 2 ] && grep -qF -- "$pattern" "$tmp/bad.err" && [ ! -s "$tmp/bad.out" ]; then ok "$* refused: $(head -1 "$tmp/bad.err")"
    else fail "$* (rc=$rc, expected 2 and '$pattern')"; fi
}
refused "--temp -1:" --temp -1
refused "--top-p 5:" --top-p 5
refused "--min-p 2:" --min-p 2
refused "--top-k -1:" --top-k -1
refused "--repeat-penalty 0:" --repeat-penalty 0
refused "--repeat-last-n -2:" --repeat-last-n -2
refused "-c/--ctx-size -5:" -c -5
refused "-c/--ctx-size -5:" --ctx-size -5
refused "-t/--threads -3:" -t -3
refused "-s/--seed -2:" -s -2
refused "-s/--seed 4294967296:" --seed 4294967296
refused "nothing to generate" -n 0
refused "--predict 0: nothing to generate" --n-predict 0
refused "--predict -2:" -n -2
refused "spark-chat: Could not convert: --temp = abc" --temp abc
refused "spark-chat: --file: File does not exist" -f "$tmp/nonexistent"
: > "$tmp/empty.txt"
refused "-f/--file $tmp/empty.txt: the file is empty" -f "$tmp/empty.txt"
printf '%s\n' "$fib" > "$tmp/prompt.txt"
run bad -m "$model" -p hi -f "$tmp/prompt.txt"
[ $rc -eq 2 ] && grep -q "spark-chat: --prompt excludes --file" "$tmp/bad.err" && ok "-p with -f refused" || fail "-p with -f (rc=$rc)"

# Lowered with a message: -c beyond the model's context length (4096), -t beyond the hardware threads.
run clamp_c -m "$model" -p "$fib" --temp 0 -n 8 -c 100000
if [ $rc -eq 0 ] && grep -q -- "-c/--ctx-size 100000: the model's context length is 4096 tokens; using 4096" "$tmp/clamp_c.err" \
   && timings clamp_c | grep -q "context [0-9]*/4096;"; then ok "-c 100000 lowered to 4096"
else fail "-c 100000 (rc=$rc)"; fi
hw=$(getconf _NPROCESSORS_ONLN)  # as std::thread::hardware_concurrency; a few more, should this break (no thread storm)
run clamp_t -m "$model" -p "$fib" --temp 0 -n 8 -t $((hw + 3))
if [ $rc -eq 0 ] && grep -q -- "-t/--threads $((hw + 3)): this machine has $hw hardware threads; using $hw$" "$tmp/clamp_t.err" \
   && [ -s "$tmp/clamp_t.out" ]; then ok "-t $((hw + 3)) lowered: $(head -1 "$tmp/clamp_t.err")"
else fail "-t $((hw + 3)) (rc=$rc)"; fi

# -n -1: until the answer ends or the context is full (the demo model repeats itself on this prompt).
run unlimited -m "$model" -p "$primes" --temp 0 -n -1 -c 100
if [ $rc -eq 0 ] && grep -q "context full (100 tokens)" "$tmp/unlimited.err" && timings unlimited | grep -q "context 99/100;"; then
    ok "-n -1 runs until the context is full: $(timings unlimited | cut -d';' -f2)"
else fail "-n -1 -c 100 (rc=$rc)"; fi
run limited -m "$model" -p "$primes" --temp 0 --predict 7
timings limited | grep -q "answer 7 tokens" && ok "--predict 7" || fail "--predict 7 (rc=$rc)"

# Seeds: -s N repeats a sampled answer (also as --seed N); another seed gives another answer; the
# timings line shows the seed; greedy runs say greedy.
run s5a -m "$model" -p "$fib" --temp 1 -n 40 -s 5 -t 1
run s5b -m "$model" -p "$fib" --temp 1 -n 40 --seed 5 --threads 1
run s6 -m "$model" -p "$fib" --temp 1 -n 40 -s 6 -t 1
if same s5a s5b && ! same s5a s6 && timings s5a | grep -q "; seed 5; load" && timings s6 | grep -q "; seed 6; load"; then
    ok "-s 5 twice: the same answer, -s 6 another; the timings line shows the seed"
else fail "-s / --seed: $(timings s5a) / $(timings s5b) / $(timings s6)"; fi
# The default seed is random, and the one printed repeats the run.
run r1 -m "$model" -p "$fib" --temp 1 -n 40
run r2 -m "$model" -p "$fib" --temp 1 -n 40
s1=$(timings r1 | sed -n 's/.*; seed \([0-9]*\); load.*/\1/p')
s2=$(timings r2 | sed -n 's/.*; seed \([0-9]*\); load.*/\1/p')
run r1again -m "$model" -p "$fib" --temp 1 -n 40 -s "${s1:-0}"
if [ -n "$s1" ] && [ -n "$s2" ] && [ "$s1" != "$s2" ] && same r1 r1again; then ok "random default seeds $s1, $s2; -s $s1 repeats the first run"
else fail "random default seed: '$s1' '$s2' ($(timings r1))"; fi
run greedy -m "$model" -p "$fib" --temp 0 -n 40
timings greedy | grep -q "; greedy; load" && ok "greedy: the timings line says so" || fail "greedy timings line: $(timings greedy)"

# The sampler options reach the sampler: top-k 1, top-p 0 and min-p 1 each leave the best token
# only, so sampling at temperature 1 gives the greedy answer; a repetition penalty changes the greedy
# answer to this prompt unless --repeat-last-n 0 turns it off.
for opt in "--top-k 1" "--top-p 0" "--min-p 1"; do
    run narrow -m "$model" -p "$fib" --temp 1 -n 40 -s 3 $opt
    same narrow greedy && ok "$opt at --temp 1 gives the greedy answer" || fail "$opt at --temp 1 (rc=$rc) differs from greedy"
done
run plain -m "$model" -p "$primes" --temp 0 -n 60
run penalty -m "$model" -p "$primes" --temp 0 -n 60 --repeat-penalty 1.5
run penalty_off -m "$model" -p "$primes" --temp 0 -n 60 --repeat-penalty 1.5 --repeat-last-n 0
if ! same plain penalty && same plain penalty_off; then ok "--repeat-penalty 1.5 changes the answer, --repeat-last-n 0 turns it off"
else fail "--repeat-penalty / --repeat-last-n"; fi

# -sys / --system-prompt / --system: the same system prompt (more prompt tokens, the same answer
# whichever spelling); -f FILE: the same answer as -p with the file's text; -c / --ctx-size.
sys="You are a careful Python programmer."
run sys1 -m "$model" -p "$fib" --temp 0 -n 40 -sys "$sys"
run sys2 -m "$model" -p "$fib" --temp 0 -n 40 --system-prompt "$sys"
run sys3 -m "$model" -p "$fib" --temp 0 -n 40 --system "$sys"
n_plain=$(timings greedy | awk '{ print $2 }')
n_sys=$(timings sys1 | awk '{ print $2 }')
if [ $rc -eq 0 ] && same sys1 sys2 && same sys1 sys3 && [ "${n_sys:-0}" -gt "${n_plain:-0}" ]; then
    ok "-sys, --system-prompt, --system: the same system prompt ($n_sys prompt tokens, $n_plain without)"
else fail "-sys / --system-prompt / --system ($n_sys vs $n_plain prompt tokens)"; fi
run file -m "$model" -f "$tmp/prompt.txt" --temp 0 -n 40
[ $rc -eq 0 ] && same file greedy && ok "-f FILE answers as -p" || fail "-f FILE (rc=$rc)"
run ctx -m "$model" -p "$fib" --temp 0 -n 8 --ctx-size 64
timings ctx | grep -q "context [0-9]*/64;" && ok "--ctx-size 64" || fail "--ctx-size 64: $(timings ctx)"

# Installed: <prefix>/bin/spark-chat takes <prefix>/share/spark/models/spark-demo-coder-moe when it
# exists (here the Qwen3-Next demo model, to tell them apart), else the source tree's demo model.
prefix=$(cd -P "$tmp" && pwd)/prefix
mkdir -p "$prefix/bin" && cp "$chat" "$prefix/bin/spark-chat"
"$prefix/bin/spark-chat" --help > "$tmp/help_a.out" 2>&1
"$prefix/bin/spark-chat" -p "$fib" --temp 0 -n 40 > "$tmp/inst_a.out" 2> "$tmp/err"
if grep -qF -- "TEXT=$model" "$tmp/help_a.out" && same inst_a greedy; then ok "installed without demo models: the source tree's default"
else fail "installed without demo models: $(grep -A1 -- --model "$tmp/help_a.out")"; fi
mkdir -p "$prefix/share/spark/models" && ln -s "$models/spark-demo-coder-next" "$prefix/share/spark/models/spark-demo-coder-moe"
"$prefix/bin/spark-chat" --help > "$tmp/help_b.out" 2>&1
"$prefix/bin/spark-chat" -p "$fib" --temp 0 -n 40 > "$tmp/inst_b.out" 2> "$tmp/err"
run next -m "$models/spark-demo-coder-next" -p "$fib" --temp 0 -n 40
if grep -qF -- "TEXT=$prefix/share/spark/models/spark-demo-coder-moe" "$tmp/help_b.out" && same inst_b next && ! same inst_b greedy; then
    ok "installed with demo models: <prefix>/share/spark/models/spark-demo-coder-moe"
else fail "installed with demo models: $(grep -A1 -- --model "$tmp/help_b.out")"; fi

[ $fails -eq 0 ] || { echo "$fails failed"; exit 1; }
echo "spark-chat command line: ok"
