#!/usr/bin/env bash
# spark-chat -p PROMPT --temp 0 prints exactly the decoded greedy continuation of the demo model's
# golden (transformers' greedy answer up to <|im_end|>), and nothing else on stdout.
set -euo pipefail
build=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
model=$root/examples/models/spark-demo-coder-moe
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The golden prompt and greedy ids, as JSON arrays.
python3 - "$model/golden.safetensors" "$tmp" <<'PY'
import json, struct, sys
f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); d = f.read()
for k in ('prompt', 'greedy'):
    o = h[k]['data_offsets']
    ids = list(struct.unpack('<%di' % ((o[1] - o[0]) // 4), d[o[0]:o[1]]))
    json.dump(ids, open(sys.argv[2] + '/' + k + '.json', 'w'))
PY
tok=$build/tools/tokenize/spark-tokenize
"$tok" --tokenizer "$model" --decode --in "$tmp/prompt.json" > "$tmp/prompt.txt"
"$tok" --tokenizer "$model" --decode --skip-special --in "$tmp/greedy.json" > "$tmp/expected.txt"
# The user message is the text between "<|im_start|>user\n" and "<|im_end|>".
user=$(python3 -c "import sys; t=open(sys.argv[1]).read(); print(t.split('<|im_start|>user\n',1)[1].split('<|im_end|>',1)[0], end='')" "$tmp/prompt.txt")
# The rendered prompt must be exactly the golden prompt (the chat template round trip).
"$build/examples/chat/spark-chat" -m "$model" -p "$user" --temp 0 -n 64 > "$tmp/got.txt" 2> "$tmp/stderr.txt"
printf '\n' >> "$tmp/expected.txt"   # spark-chat ends the answer with a newline
if ! cmp -s "$tmp/got.txt" "$tmp/expected.txt"; then
    echo "spark-chat output differs from the golden continuation:"; diff "$tmp/expected.txt" "$tmp/got.txt" || true
    cat "$tmp/stderr.txt"
    exit 1
fi
grep -q "tok/s" "$tmp/stderr.txt" || { echo "no statistics on stderr"; exit 1; }
grep -Eq "; load [0-9]+\.[0-9]+ s$" "$tmp/stderr.txt" || { echo "no load time in the timings line"; cat "$tmp/stderr.txt"; exit 1; }
# Piped stdin: every line is a user turn; both answers stream to stdout.
printf '%s\n%s\n' "$user" "Write a Python function \`add(a, b)\`: Return the sum." \
    | "$build/examples/chat/spark-chat" -m "$model" --temp 0 -n 64 > "$tmp/pipe.txt" 2>/dev/null
head -c "$(wc -c < "$tmp/expected.txt")" "$tmp/pipe.txt" | cmp -s - "$tmp/expected.txt" || { echo "first piped answer differs"; exit 1; }
grep -q "def add" "$tmp/pipe.txt" || { echo "second piped answer missing"; cat "$tmp/pipe.txt"; exit 1; }
echo "spark-chat golden: ok"
