#!/usr/bin/env python3
"""spark-server with speculative decoding and prefix reuse, against the same server without --spec.

For the demo MoE model with its draft model, and the demo Qwen3-Next model with its MTP head, the
same conversation is sent to a plain server and to one started with --spec (temperature 0):
  1. conversation A (a ~450-token system prompt and a question),
  2. conversation A continued (A's answer and a follow-up: the prompt extends turn 1's),
  3. conversation B (the same system prompt, another question),
  4. conversation A again (the server has two slots: A's is still there).
Every answer must be the same with and without --spec (speculation never changes greedy output),
and each server must reuse what it holds: turn 2 at least turn 1's prompt but one token, turn 3 at
least the system prompt's whole 256-token blocks (Qwen3-Next's recurrent state goes back only to a
snapshot: the server keeps them at a prompt's last block boundary and near its end). Without --spec,
the attention-only model starts B from a KV copy of A's slot, so turn 4 reuses all of turn 2.

    python3 tests/tools/server_spec.py BUILD_DIR DATA_DIR
"""
import json
import sys
import urllib.request
from pathlib import Path

from serverlib import HANG_S, Server

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "examples" / "models"
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def chat(url, messages, max_tokens=40):
    body = json.dumps({"messages": messages, "temperature": 0, "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=HANG_S) as r:
        out = json.load(r)
    return out["choices"][0]["message"]["content"], out["usage"]


def conversation(url):
    """The three turns; returns [(answer, prompt_tokens, cached_tokens)]."""
    system = {"role": "system", "content": "You are a careful Python programmer who writes short, typed functions. " * 30}
    a1 = [system, {"role": "user", "content": "Write a function that sorts a list of numbers."}]
    results = []
    answer, usage = chat(url, a1)
    results.append((answer, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]))
    a2 = a1 + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Now add a docstring."}]
    answer, usage = chat(url, a2)
    results.append((answer, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]))
    b1 = [system, {"role": "user", "content": "Write a function that reverses a string."}]
    answer, usage = chat(url, b1)
    results.append((answer, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]))
    a3 = a2 + [{"role": "assistant", "content": results[1][0]}, {"role": "user", "content": "Now add a test."}]
    answer, usage = chat(url, a3)
    results.append((answer, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]))
    return results


def main():
    build = sys.argv[1]
    for model, spec in [("spark-demo-coder-moe", "draft:" + str(MODELS / "spark-demo-coder-draft")), ("spark-demo-coder-next", "mtp")]:
        runs = {}
        for args in ([], ["--spec", spec]):
            label = model + (" --spec " + spec.split(":")[0] if args else " plain")
            server = Server(build, ["--parallel", "2", "-m", str(MODELS / model), *args])
            try:
                runs[bool(args)] = conversation(server.wait_ready())
            finally:
                check(server.stop() == 0, f"{label}: the server stops with exit code 0")
            turns = runs[bool(args)]
            check(turns[1][2] >= turns[0][1] - 1, f"{label}: turn 2 reuses turn 1's prompt ({turns[1][2]} of {turns[1][1]} tokens cached; turn 1 had {turns[0][1]})")
            check(turns[2][2] >= 256, f"{label}: another conversation with the same system prompt reuses its blocks ({turns[2][2]} cached)")
            if model.endswith("moe") and not args:
                # Attention only, no --spec: conversation B started from a copy of A's slot, so A's
                # slot still holds A for its next turn.
                check(turns[3][2] >= turns[1][1] - 1, f"{label}: conversation A goes on from its own slot after B copied the system prompt "
                                                      f"({turns[3][2]} of {turns[3][1]} cached; turn 2 had {turns[1][1]})")
        for i in range(4):
            check(runs[True][i][0] == runs[False][i][0], f"{model}, turn {i + 1}: --spec {spec.split(':')[0]} answers as the plain server "
                                                         f"({runs[False][i][0][:40]!r})")


if __name__ == "__main__":
    main()
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("speculative serving with prefix reuse: ok")
