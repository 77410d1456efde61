#!/usr/bin/env bash
# Drives interactive spark-chat in a real terminal (tmux): two turns, /reset, an answer interrupted
# with Ctrl-C followed by a new turn, /stats, /quit.
set -uo pipefail
build=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
command -v tmux > /dev/null || { echo "tmux is required (scripts/install-deps.sh installs it)"; exit 1; }
sock=spark-chat-test-$$
session=chat
tmux -L "$sock" kill-server 2> /dev/null || true
trap 'tmux -L "$sock" kill-server 2> /dev/null || true' EXIT
# A long answer limit so the interrupted turn is still running when Ctrl-C arrives.
tmux -L "$sock" new-session -d -s $session -x 200 -y 50 \
    "$build/examples/chat/spark-chat -m $root/examples/models/spark-demo-coder-moe --temp 0 -n 4000 -t 1; echo CHAT-EXITED-\$?; sleep 30"

screen() { tmux -L "$sock" capture-pane -p -S -2000 -t $session; }
wait_for() {  # wait_for PATTERN [COUNT]: until PATTERN occurs COUNT times
    local n=${2:-1}
    for _ in $(seq 1 1500); do  # events, not seconds: 300 s only bounds a hang (CI machines are loaded)
        [ "$(screen | grep -c -- "$1")" -ge "$n" ] && return 0
        sleep 0.2
    done
    echo "timeout waiting for '$1' (x$n); screen:"; screen; exit 1
}
send() { tmux -L "$sock" send-keys -t $session -l -- "$1"; tmux -L "$sock" send-keys -t $session Enter; }

wait_for "/help for commands"
send 'Write a Python function `fibonacci(n)`: Return the n-th Fibonacci number.'
wait_for "def fibonacci"
wait_for '^>' 2
send 'Write a Python function `add(a, b)`: Return the sum of a and b.'
wait_for "def add"
wait_for '^>' 3
send '/reset'
wait_for "conversation reset"
# A prompt that makes the demo model repeat itself until -n (4000 tokens, ~8 s on one core of the
# development machine; checked with -p): interrupt it while it runs.
send 'Write a Python function `primes_up_to(n)`: Return all primes up to n.'
wait_for "primes = \[\]" 2
sleep 0.3
tmux -L "$sock" send-keys -t $session C-c
wait_for "\[interrupted\]"
wait_for '^>' 5
send 'Write a Python function `read_json(path)`: Load a JSON file and return its contents.'
# The interrupted answer stays in the history, cut wherever Ctrl-C landed, so what the model says
# next depends on that timing (e.g. just the "```" that closes the cut code block): check that the
# turn runs and answers, not its words (the uninterrupted turns above check those).
wait_for '^>' 6
reply=$(screen | awk '/read_json\(path\)/ { f = 1; next } f && /^>/ { exit } f')
[ -n "$(printf '%s' "$reply" | tr -d '[:space:]')" ] || { echo "no answer after the interrupted turn; screen:"; screen; exit 1; }
send '/stats'
wait_for "tok/s"
send '/quit'
wait_for "CHAT-EXITED-0"
echo "interactive spark-chat: ok"
screen | tail -40
