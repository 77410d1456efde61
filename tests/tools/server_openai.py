#!/usr/bin/env python3
"""spark-server through the official openai Python client (PyPI), unmodified.

Runs spark-server on the bundled demo model with an API key and the real Qwen3 chat template (which
renders tools and tool results), and checks: the models list; a wrong key (401); chat completions
streaming and not (the stream's deltas join to the non-streamed answer, greedy); completions streaming
and not; usage and logprobs; seeded sampling repeats; stop strings; a tool-call round trip (tools in
the request, an assistant tool call and the tool's result rendered by the template, /apply-template);
error objects for bad values, unknown fields, too long prompts, malformed JSON and too large bodies;
/tokenize, /detokenize, /health, /metrics.

    python3 tests/tools/server_openai.py BUILD_DIR DATA_DIR

The openai package lives in the checkout's .venv (scripts/install-deps.sh); this script re-runs
itself with that interpreter. Waits for events (the server's "listening" line, responses), never for
a fixed time; the 300 s limits only guard against hangs.
"""
import json
import os
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from serverlib import HANG_S, Server

ROOT = Path(__file__).resolve().parents[2]
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"

try:
    import openai
except ImportError:
    if VENV_PYTHON.exists() and Path(sys.prefix).resolve() != VENV_PYTHON.parents[1].resolve():
        os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), __file__, *sys.argv[1:]])
    print("FAIL the openai package is missing: run scripts/install-deps.sh (it makes .venv)")
    sys.exit(1)

KEY = "test-key-123"
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def http(url, body=None, key=KEY, raw=None, method=None):
    """(status, parsed JSON or text) of one request, without the openai client."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"))
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=HANG_S) as r:
            text = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        status = e.code
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def is_error_object(body, status):
    return isinstance(body, dict) and isinstance(body.get("error"), dict) and isinstance(body["error"].get("message"), str) \
        and body["error"]["message"] != "" and status >= 400


def main():
    build = sys.argv[1]
    template = json.loads((ROOT / "tests/data/tokenizers/qwen3/tokenizer_config.json").read_text())["chat_template"]
    with tempfile.TemporaryDirectory() as tmp:
        template_file = Path(tmp) / "qwen3.jinja"
        template_file.write_text(template)
        server = Server(build, ["--api-key", KEY, "--chat-template-file", str(template_file), "--parallel", "2",
                                "-c", "2048", "--max-body-mb", "1", "--alias", "demo"])
        try:
            run(server.wait_ready())
        finally:
            rc = server.stop()
            check(rc == 0, f"SIGTERM stops the server with exit code 0 (got {rc})")
            if failures:
                print("spark-server said (last lines):\n" + server.log())


def run(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=HANG_S)
    messages = [{"role": "system", "content": "You write Python."},
                {"role": "user", "content": "Write a function that returns the largest of three numbers."}]

    # --- models, authentication ---
    models = client.models.list()
    check([m.id for m in models.data] == ["demo"], f"models list: {[m.id for m in models.data]}")
    try:
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
        check(False, "a wrong API key is refused")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, "a wrong API key: 401 AuthenticationError")
    status, _ = http(url + "/health", key=None)
    check(status == 200, "/health needs no key")

    # --- chat: non-streaming and streaming give the same greedy answer ---
    r = client.chat.completions.create(model="demo", messages=messages, temperature=0, max_tokens=48)
    answer = r.choices[0].message.content
    check(isinstance(answer, str) and len(answer) > 0, f"chat completion: {answer[:60]!r}")
    check(r.choices[0].finish_reason in ("stop", "length") and r.object == "chat.completion", f"finish_reason {r.choices[0].finish_reason}")
    check(r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 48 and
          r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, f"usage {r.usage}")
    chunks = list(client.chat.completions.create(model="demo", messages=messages, temperature=0, max_tokens=48, stream=True,
                                                 stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(streamed == answer, "chat stream: the deltas join to the non-streamed answer")
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    check(finishes == [r.choices[0].finish_reason], f"chat stream: one finish_reason {finishes}")
    check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == r.usage.completion_tokens,
          "chat stream: include_usage sends the usage last")
    check(r.usage.prompt_tokens_details is not None, "usage has prompt_tokens_details")

    # --- completions ---
    c1 = client.completions.create(model="demo", prompt="def add(a, b):", max_tokens=24, temperature=0)
    text = c1.choices[0].text
    check(len(text) > 0 and c1.usage.completion_tokens <= 24, f"completion: {text[:50]!r}")
    s = "".join(c.choices[0].text for c in client.completions.create(model="demo", prompt="def add(a, b):", max_tokens=24,
                                                                      temperature=0, stream=True) if c.choices)
    check(s == text, "completion stream equals the non-streamed text")
    c2 = client.completions.create(model="demo", prompt="def add(a, b):", max_tokens=8, temperature=0, logprobs=3)
    lp = c2.choices[0].logprobs
    check(lp is not None and len(lp.tokens) == c2.usage.completion_tokens and all(len(t) == 3 for t in lp.top_logprobs),
          "completion logprobs: one entry per token, 3 alternatives each")
    check("".join(lp.tokens) == c2.choices[0].text, "completion logprobs: the tokens spell the text")

    # --- logprobs (chat): greedy picks the most likely token ---
    r = client.chat.completions.create(model="demo", messages=messages, temperature=0, max_tokens=12, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    check(len(content) == r.usage.completion_tokens, f"chat logprobs: {len(content)} entries for {r.usage.completion_tokens} tokens")
    check(all(len(t.top_logprobs) == 2 and abs(t.logprob - t.top_logprobs[0].logprob) < 1e-6 and t.logprob <= 0 for t in content),
          "chat logprobs: the greedy token is the top alternative, log-probabilities <= 0")

    # --- sampling: a seed repeats; penalties and logit_bias are accepted and act ---
    kw = dict(model="demo", messages=messages, temperature=0.9, max_tokens=24, seed=1234)
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    check(a == b, "the same seed gives the same sampled answer")
    first = client.completions.create(model="demo", prompt="def add(a, b):", max_tokens=1, temperature=0, logprobs=1)
    top_token = first.choices[0].logprobs.tokens[0]
    status, tok = http(url + "/tokenize", {"content": top_token, "parse_special": False})
    banned = client.completions.create(model="demo", prompt="def add(a, b):", max_tokens=1, temperature=0, logprobs=1,
                                       logit_bias={str(tok["tokens"][0]): -100})
    check(len(tok["tokens"]) == 1 and banned.choices[0].logprobs.tokens[0] != top_token,
          f"logit_bias -100 bans the greedy token {top_token!r}")
    r = client.chat.completions.create(model="demo", messages=messages, temperature=0, max_tokens=24, presence_penalty=1.5,
                                       frequency_penalty=0.5)
    check(r.choices[0].message.content is not None, "presence and frequency penalties are accepted")

    # --- stop strings ---
    r = client.completions.create(model="demo", prompt="def add(a, b):", max_tokens=40, temperature=0, stop=["\n"])
    check("\n" not in r.choices[0].text and r.choices[0].finish_reason == "stop" and text.startswith(r.choices[0].text),
          f"stop at the first newline: {r.choices[0].text!r}")

    # --- tools: the request's tools, an assistant tool call and the tool's answer go through the template ---
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                              "required": ["city"]}}}]
    turn1 = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model="demo", messages=turn1, tools=tools, temperature=0, max_tokens=32)
    check(r.choices[0].message.content is not None or r.choices[0].message.tool_calls, "a request with tools is answered")
    call = {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
    turn2 = turn1 + [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_abc", "content": "{\"temperature_c\": 18}"}]
    r = client.chat.completions.create(model="demo", messages=turn2, tools=tools, temperature=0, max_tokens=32)
    check(r.choices[0].message.content is not None and r.usage.prompt_tokens > 0, "the tool round trip is answered")
    status, rendered = http(url + "/apply-template", {"messages": turn2, "tools": tools})
    prompt = rendered.get("prompt", "") if isinstance(rendered, dict) else ""
    check(status == 200 and '"name": "get_weather"' in prompt and '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
          and "<tool_response>\n{\"temperature_c\": 18}\n</tool_response>" in prompt and prompt.endswith("<|im_start|>assistant\n"),
          "/apply-template: the tools, the call and the tool's answer are rendered as Qwen3's template does")

    # --- errors: OpenAI error objects ---
    for kwargs, what in [(dict(temperature=3.0), "temperature 3.0"), (dict(top_p=-1), "top_p -1"),
                         (dict(extra_body={"bogus_field": 1}), "an unknown field"),
                         (dict(max_tokens=0), "max_tokens 0"), (dict(tool_choice="required", tools=tools), "tool_choice required")]:
        try:
            client.chat.completions.create(model="demo", messages=messages, **kwargs)
            check(False, f"{what} is refused")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and isinstance(e.body, dict) and e.body.get("message"), f"{what}: 400, {e.body.get('message')!r}")
    try:
        client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "x " * 3000}])
        check(False, "a prompt longer than the slot is refused")
    except openai.BadRequestError as e:
        check(e.body.get("code") == "context_length_exceeded", f"a prompt longer than the slot: {e.body.get('message')!r}")
    status, body = http(url + "/v1/chat/completions", raw=b"{not json")
    check(status == 400 and is_error_object(body, status), "malformed JSON: 400 with an error object")
    status, body = http(url + "/v1/chat/completions", {"messages": "hello"})
    check(status == 400 and is_error_object(body, status), "messages of the wrong type: 400")
    status, body = http(url + "/v1/chat/completions", raw=b"{\"messages\": [" + b" " * (2 << 20) + b"]}")
    check(status == 413 and is_error_object(body, status), f"a 2 MB body with --max-body-mb 1: {status}")
    status, body = http(url + "/v1/nothing", {"a": 1})
    check(status == 404 and is_error_object(body, status), "an unknown path: 404 with an error object")

    # --- hostile bodies: each one refused with a 4xx error object, the server unharmed ---
    msg = '[{"role": "user", "content": "hi"}]'
    hostile = [
        b"", b"null", b"[]", b"42", b'"text"', b"{", b"{}" + b" " * 10, b'{"messages": null}',
        b'{"messages": [' + b"[" * 5000 + b"]" * 5000 + b"]}",                       # nesting
        b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',                  # escapes that are fine JSON
        b'{"messages": [{"role": "user", "content": "' + bytes([0xff, 0xfe, 0xc3]) + b'"}]}',  # invalid UTF-8
        b'{"messages": [{"role": 7, "content": "x"}]}', b'{"messages": [{"role": "wizard", "content": "x"}]}',
        b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}',
        b'{"messages": [{"role": "user", "content": {"a": 1}}]}', b'{"messages": [{"content": "x"}]}',
        b'{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"function": {"arguments": "{"}}]}]}',
        b'{"messages": [{"role": "assistant", "content": null, "tool_calls": "x"}]}',
        b'{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": "'  # nesting inside a string
        + b"[" * 100000 + b"]" * 100000 + b'"}}]}]}',
        b'{"messages": ' + msg.encode() + b', "temperature": "hot"}', b'{"messages": ' + msg.encode() + b', "temperature": 1e400}',
        b'{"messages": ' + msg.encode() + b', "max_tokens": 1.5}', b'{"messages": ' + msg.encode() + b', "max_tokens": -1}',
        b'{"messages": ' + msg.encode() + b', "max_tokens": 99999999999999999999}', b'{"messages": ' + msg.encode() + b', "seed": "x"}',
        b'{"messages": ' + msg.encode() + b', "stop": [1, 2]}', b'{"messages": ' + msg.encode() + b', "stop": ["' + b"x" * 2000 + b'"]}',
        b'{"messages": ' + msg.encode() + b', "stop": ' + json.dumps(["a"] * 17).encode() + b'}',
        b'{"messages": ' + msg.encode() + b', "logit_bias": {"abc": 1}}', b'{"messages": ' + msg.encode() + b', "logit_bias": {"5": 1000}}',
        b'{"messages": ' + msg.encode() + b', "logit_bias": {"99999999": 1}}', b'{"messages": ' + msg.encode() + b', "logit_bias": []}',
        b'{"messages": ' + msg.encode() + b', "top_logprobs": 3}', b'{"messages": ' + msg.encode() + b', "logprobs": true, "top_logprobs": 50}',
        b'{"messages": ' + msg.encode() + b', "tools": {"x": 1}}', b'{"messages": ' + msg.encode() + b', "tools": [{"type": 1}]}',
        b'{"messages": ' + msg.encode() + b', "tools": [{"type": "function", "function": {"name": 3}}]}',
        b'{"messages": ' + msg.encode() + b', "tool_choice": 5}', b'{"messages": ' + msg.encode() + b', "response_format": {"type": 5}}',
        b'{"messages": ' + msg.encode() + b', "chat_template_kwargs": []}', b'{"messages": ' + msg.encode() + b', "stream_options": {"include_usage": "y"}}',
        b'{"messages": ' + msg.encode() + b', "stream_options": {"other": true}}', b'{"messages": ' + msg.encode() + b', "n": 2}',
        b'{"messages": ' + msg.encode() + b', "stream": "yes"}', b'{"messages": ' + msg.encode() + b', "model": 5}',
    ]
    statuses = []
    for body in hostile:
        status, reply = http(url + "/v1/chat/completions", raw=body)
        statuses.append(status)
        if not (400 <= status < 500 and is_error_object(reply, status)):
            check(False, f"hostile chat body {body[:60]!r}: {status} {str(reply)[:120]}")
    for path, body in [("/v1/completions", b'{"prompt": [1, -5]}'), ("/v1/completions", b'{"prompt": [[1], [2]]}'),
                       ("/v1/completions", b'{"prompt": {"a": 1}}'), ("/v1/completions", b'{"prompt": "x", "echo": true}'),
                       ("/v1/completions", b'{"prompt": "x", "logprobs": 21}'), ("/tokenize", b'{"content": 5}'),
                       ("/detokenize", b'{"tokens": [1, 99999999]}'), ("/detokenize", b'{"tokens": "x"}'), ("/apply-template", b'{"messages": 1}')]:
        status, reply = http(url + path, raw=body)
        statuses.append(status)
        if not (400 <= status < 500 and is_error_object(reply, status)):
            check(False, f"hostile {path} body {body[:60]!r}: {status} {str(reply)[:120]}")
    check(all(400 <= s < 500 for s in statuses), f"{len(statuses)} hostile bodies: each refused with a 4xx error object")
    status, _ = http(url + "/health", key=None)
    r = client.chat.completions.create(model="demo", messages=messages, temperature=0, max_tokens=48)
    check(status == 200 and r.choices[0].message.content == answer, "after them the server answers as before")

    # --- tokenize, detokenize, metrics ---
    status, t = http(url + "/tokenize", {"content": "def add(a, b):\n    return a + b"})
    status2, d = http(url + "/detokenize", {"tokens": t.get("tokens", [])})
    check(status == 200 and status2 == 200 and d.get("content") == "def add(a, b):\n    return a + b", "tokenize / detokenize round trip")
    status, metrics = http(url + "/metrics")
    check(status == 200 and "spark_requests_total" in metrics and "spark_generated_tokens_total" in metrics, "/metrics (Prometheus text)")
    status, _ = http(url + "/metrics", key=None)
    check(status == 401, "/metrics needs the key")


if __name__ == "__main__":
    main()
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("spark-server through the openai client: ok")
