#!/usr/bin/env python3
"""spark-server under load on the loopback (python3 standard library only).

    python3 tests/tools/server_load.py BUILD_DIR [DATA_DIR]

Starts BUILD_DIR/tools/server/spark-server (the bundled demo model) with --parallel 4 --queue 64
-c 8192 on a free port, then:
- reference answers: each of PROMPTS (chat, temperature 0, max_tokens 48..96) is sent alone,
  non-streaming; its content, finish_reason and completion_tokens are kept;
- ROUNDS rounds of CLIENTS concurrent client threads, each sending REQUESTS_PER_CLIENT requests drawn
  from PROMPTS: mostly streaming (the deltas are joined), some non-streaming, and every
  DISCONNECT_EVERY-th a long streaming request whose client reads a few chunks and then resets the
  connection. Every completed answer must equal the reference answer of its prompt exactly (greedy
  decoding does not depend on what else is in the batch: the property under test); what a
  disconnecting client got must agree with the reference as far as both go; at the end of the round
  one more client disconnects mid-answer while it is alone on the server. No HTTP error is
  allowed but 503 overload answers (Retry-After and an OpenAI error object), retried after the
  advised delay;
- after each round: GET /metrics must come back to 0 running and 0 queued requests (the slots of the
  disconnected clients are freed), its counters must match what the clients saw, GET /health is ok,
  and the server's RSS (VmRSS) is read: after the warm-up round (round 1) it must stay within
  +10% or +16 MiB of it (see RSS_GROWTH_*);
- overload: a second server with --parallel 1 --queue 1 gets OVERLOAD_REQUESTS simultaneous long
  requests: at least one is answered 503 with Retry-After and error.code "overloaded", the others
  complete with the same answer, and the server still serves afterwards.
Both servers must stay alive and exit 0 on SIGTERM.

No step waits a fixed time: the "listening on" line, the HTTP answers and /metrics (polled every
POLL s) say when to go on; HANG only guards against a hang (CI machines are loaded 2-core boxes).
Exit code 0: all good; 1: "FAIL ..." lines say what is wrong.
"""
import http.client, json, re, socket, struct, subprocess, sys, threading, time
from pathlib import Path

from serverlib import Server, ServerError

HANG = 300.0        # seconds: a guard against a hang (server start, one HTTP exchange, a round)
# Seconds for running/queued to come back to 0 once every client returned: a gone client is noticed
# within 0.5 s (the server's wait between two writes) and its slot freed at the engine's next loop,
# so this only guards against a slot that is never freed.
IDLE_GUARD = 60.0
POLL = 0.1          # seconds between two looks at /metrics
ROUNDS = 3
CLIENTS = 32
REQUESTS_PER_CLIENT = 3
DISCONNECT_EVERY = 5      # every 5th request of a round is a client that goes away mid-stream
NON_STREAMING_EVERY = 7   # and some (not disconnecting) are non-streaming
DISCONNECT_AFTER = 3      # content chunks a disconnecting client reads before it resets the connection
DISCONNECT_MAX_TOKENS = 1024  # long, so that the client leaves while its answer is still being decoded
OVERLOAD_REQUESTS = 8
OVERLOAD_MAX_TOKENS = 512
# RSS bound after the warm-up round: +10% or +16 MiB, whichever is larger. The first round fills
# what is allocated once (KV cache pages touched, the allocator's arenas of 32+ HTTP threads,
# sampler and detokenizer buffers); later rounds do the same work again, so they may move the RSS
# only by allocator noise (fragmentation, arenas that grow a little): well under 1 MiB per round
# here once warm. A leak grows with the ~100 requests of every round instead: one of ~85 KB or more
# per request (a KV or logits copy, a request's sampler, detokenizer or connection buffers kept)
# passes the bound by round 3; smaller ones need more rounds than a CI run can afford.
RSS_GROWTH_FRACTION = 0.10
RSS_GROWTH_MIN_KB = 16 * 1024

# (system prompt, user text, max_tokens): short coding requests, all different.
PROMPTS = [
    ('You are a helpful Python assistant.', 'Write a Python function that reverses a string.', 64),
    ('You are a concise coding assistant. Answer with code only.', 'Write a Python function `is_prime(n)` that checks whether n is prime.', 80),
    ('You write clean, documented Python.', 'Write a Python function that returns the sum of a list.', 48),
    ('You are an expert Python programmer.', 'Write a Python function `fibonacci(n)`: Return the n-th Fibonacci number.', 96),
    ('You are a helpful assistant.', 'Write a Python class `Stack` with push, pop and is_empty methods.', 72),
    ('You answer programming questions briefly.', 'Write a Python function that counts the vowels in a string.', 56),
    ('You are a senior software engineer.', 'Write a Python function `merge_sorted(a, b)` that merges two sorted lists.', 88),
    ('You are a Python tutor.', 'Write a Python function that reads a file and returns its lines without newlines.', 64),
]
OVERLOAD_PROMPT = ('You are a helpful Python assistant.', 'Write a Python function `primes_up_to(n)`: Return all primes up to n.')


Fail = ServerError  # a failed check, reported as FAIL


# ---- the server ----------------------------------------------------------------------------------

# ---- HTTP ------------------------------------------------------------------------------------------

def http_get(port, path):
    """(status, body text) of a GET."""
    conn = http.client.HTTPConnection('127.0.0.1', port, timeout=HANG)
    try:
        conn.request('GET', path)
        r = conn.getresponse()
        return r.status, r.read().decode('utf-8', 'replace')
    finally:
        conn.close()


def http_post(port, path, body):
    """(status, headers, parsed JSON or text) of a JSON POST."""
    conn = http.client.HTTPConnection('127.0.0.1', port, timeout=HANG)
    try:
        conn.request('POST', path, body=json.dumps(body), headers={'Content-Type': 'application/json'})
        r = conn.getresponse()
        text = r.read().decode('utf-8', 'replace')
        try:
            return r.status, r.headers, json.loads(text)
        except ValueError:
            return r.status, r.headers, text
    finally:
        conn.close()


def metrics(port):
    """GET /metrics as {name: value} (the samples of the Prometheus text)."""
    status, text = http_get(port, '/metrics')
    if status != 200:
        raise Fail('GET /metrics answered %d: %s' % (status, text[:200]))
    out = {}
    for line in text.splitlines():
        if line and not line.startswith('#'):
            name, value = line.rsplit(' ', 1)
            out[name] = float(value)
    for name in ('spark_requests_total', 'spark_requests_failed_total', 'spark_requests_cancelled_total',
                 'spark_requests_rejected_total', 'spark_requests_running', 'spark_requests_queued'):
        if name not in out:
            raise Fail('GET /metrics has no %s:\n%s' % (name, text))
    return out


def check_health(port):
    status, text = http_get(port, '/health')
    try:
        ok = status == 200 and json.loads(text).get('status') == 'ok'
    except ValueError:
        ok = False
    if not ok:
        raise Fail('GET /health answered %d %r' % (status, text[:200]))


def overload_delay(status, headers, body, what):
    """The Retry-After seconds of a 503 overload answer; raises Fail unless it is a well-formed one."""
    if status != 503:
        raise Fail('%s: HTTP %d (only 503 overload answers are allowed): %s' % (what, status, str(body)[:300]))
    retry = headers.get('Retry-After')
    if retry is None or not retry.strip().isdigit():
        raise Fail('%s: 503 without a Retry-After header of seconds (got %r)' % (what, retry))
    err = body.get('error') if isinstance(body, dict) else None
    if not isinstance(err, dict) or err.get('code') != 'overloaded' or not err.get('message') or not err.get('type'):
        raise Fail('%s: 503 without an OpenAI error object with code "overloaded": %s' % (what, str(body)[:300]))
    return int(retry)


def chat_body(prompt_id, stream, max_tokens=None):
    system, user, default_max = PROMPTS[prompt_id] if prompt_id is not None else (OVERLOAD_PROMPT + (None,))
    body = {'messages': [{'role': 'system', 'content': system}, {'role': 'user', 'content': user}],
            'temperature': 0, 'max_tokens': max_tokens or default_max, 'stream': stream}
    if stream:
        body['stream_options'] = {'include_usage': True}
    return body


def reset_connection(conn, resp):
    """Closes the client's socket abruptly (RST, not FIN), as a client that crashes or is killed does."""
    sock = conn.sock
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))
    resp.close()
    conn.close()


def chat_streaming(port, body, disconnect_after=None):
    """One streaming chat request. Returns (status, headers, error body or None, answer dict).
    answer: content, finish_reason, completion_tokens (from the usage chunk), done ([DONE] seen);
    with disconnect_after, the connection is reset after that many content chunks."""
    conn = http.client.HTTPConnection('127.0.0.1', port, timeout=HANG)
    try:
        conn.request('POST', '/v1/chat/completions', body=json.dumps(body), headers={'Content-Type': 'application/json'})
        resp = conn.getresponse()
        if resp.status != 200:
            text = resp.read().decode('utf-8', 'replace')
            try:
                err = json.loads(text)
            except ValueError:
                err = text
            return resp.status, resp.headers, err, None
        if not resp.headers.get('Content-Type', '').startswith('text/event-stream'):
            raise Fail('a streaming answer of Content-Type %r' % resp.headers.get('Content-Type'))
        answer = {'content': '', 'finish_reason': None, 'completion_tokens': None, 'done': False, 'disconnected': False}
        n_content = 0
        while True:
            line = resp.readline()
            if not line:
                break  # the end of the stream
            line = line.rstrip(b'\r\n')
            if not line:
                continue  # the blank line after each event
            if not line.startswith(b'data: '):
                raise Fail('a server-sent event line that is not "data: ...": %r' % line[:200])
            data = line[6:]
            if data == b'[DONE]':
                answer['done'] = True
                break
            chunk = json.loads(data)
            if 'error' in chunk:
                raise Fail('a streamed error: %s' % json.dumps(chunk)[:300])
            for choice in chunk.get('choices', []):
                delta = choice.get('delta') or {}
                if delta.get('reasoning_content') or delta.get('tool_calls'):
                    raise Fail('a streamed delta that is not content: %s' % json.dumps(delta)[:300])
                if delta.get('content'):
                    answer['content'] += delta['content']
                    n_content += 1
                if choice.get('finish_reason'):
                    answer['finish_reason'] = choice['finish_reason']
            if chunk.get('usage'):
                answer['completion_tokens'] = chunk['usage'].get('completion_tokens')
            if disconnect_after is not None and n_content >= disconnect_after:
                reset_connection(conn, resp)
                answer['disconnected'] = True
                return 200, resp.headers, None, answer
        if answer['done']:
            rest = resp.read()  # the blank line that ends the last event, then the end of the chunked body
            if rest.strip():
                raise Fail('data after "data: [DONE]": %r' % rest[:200])
        return 200, resp.headers, None, answer
    finally:
        conn.close()


def chat_whole(port, body):
    """One non-streaming chat request: (status, headers, error body or None, answer dict)."""
    status, headers, r = http_post(port, '/v1/chat/completions', body)
    if status != 200:
        return status, headers, r, None
    try:
        choice = r['choices'][0]
        msg = choice['message']
        if msg.get('reasoning_content') or msg.get('tool_calls'):
            raise Fail('a message that is not only content: %s' % json.dumps(msg)[:300])
        return status, headers, None, {'content': msg['content'] or '', 'finish_reason': choice['finish_reason'],
                                        'completion_tokens': r['usage']['completion_tokens'], 'done': True,
                                        'disconnected': False}
    except (KeyError, IndexError, TypeError):
        raise Fail('a chat completion without choices[0].message / usage: %s' % str(r)[:300])


# ---- reference answers -------------------------------------------------------------------------

def reference_answers(port):
    """Each prompt alone, non-streaming: the answers batched runs must reproduce."""
    refs = []
    for i in range(len(PROMPTS)):
        status, headers, err, answer = chat_whole(port, chat_body(i, False))
        if status != 200:
            raise Fail('reference answer of prompt %d: HTTP %d %s' % (i, status, str(err)[:300]))
        if not answer['content']:
            raise Fail('reference answer of prompt %d is empty' % i)
        refs.append(answer)
    return refs


# ---- a round of concurrent clients ----------------------------------------------------------------

class RoundState:
    """What the clients of a round saw (shared by their threads)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.completed = self.streamed = self.whole = self.disconnected = self.overloaded = 0
        self.failures = []    # FAIL lines of errors
        self.mismatches = []  # dicts: an answer that differs from the reference
        self.in_flight = 0
        self.max_in_flight = 0


def request_plan(round_no):
    """(client, prompt id, kind) of every request of a round; kind: 'stream', 'whole', 'disconnect'.
    Deterministic, so that a failure can be run again the same way."""
    plan = []
    for client in range(CLIENTS):
        reqs = []
        for j in range(REQUESTS_PER_CLIENT):
            k = client * REQUESTS_PER_CLIENT + j
            prompt = (k * 5 + client + round_no * 3) % len(PROMPTS)
            if k % DISCONNECT_EVERY == DISCONNECT_EVERY - 1:
                kind = 'disconnect'
            elif k % NON_STREAMING_EVERY == 3:
                kind = 'whole'
            else:
                kind = 'stream'
            reqs.append((prompt, kind))
        plan.append(reqs)
    return plan


def same_answer(ref, got):
    return (got['content'] == ref['content'] and got['finish_reason'] == ref['finish_reason']
            and got['completion_tokens'] == ref['completion_tokens'])


def run_request(port, state, refs, round_no, client, prompt, kind, deadline):
    """One request of a client, retried after 503s; checks its answer against the reference."""
    what = 'round %d client %d prompt %d (%s)' % (round_no, client, prompt, kind)
    while True:
        with state.lock:
            state.in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
            in_flight = state.in_flight
        try:
            if kind == 'whole':
                status, headers, err, answer = chat_whole(port, chat_body(prompt, False))
            elif kind == 'stream':
                status, headers, err, answer = chat_streaming(port, chat_body(prompt, True))
            else:
                status, headers, err, answer = chat_streaming(port, chat_body(prompt, True, DISCONNECT_MAX_TOKENS),
                                                              disconnect_after=DISCONNECT_AFTER)
        finally:
            with state.lock:
                state.in_flight -= 1
        if status == 200:
            break
        delay = overload_delay(status, headers, err, 'the answer')
        with state.lock:
            state.overloaded += 1
        if time.monotonic() + delay > deadline:
            raise Fail('still overloaded after %.0f s' % HANG)
        time.sleep(delay)  # the server's advice, not a pacing guess
    ref = refs[prompt]
    with state.lock:
        if kind == 'disconnect':
            # The first chunks of a longer answer to the same prompt: they agree with the reference
            # as far as both go (the reference may have stopped at its max_tokens earlier).
            if answer['disconnected']:
                state.disconnected += 1
                got, exp = answer['content'], ref['content']
                if not (exp.startswith(got) or got.startswith(exp)):
                    state.mismatches.append({'what': what, 'prompt': prompt, 'in_flight': in_flight, 'prefix': True,
                                             'expected': exp, 'got': got})
            else:  # the answer ended before DISCONNECT_AFTER content chunks: it was a complete answer
                state.completed += 1
                if not answer['done']:
                    state.failures.append('FAIL %s: the stream ended without "data: [DONE]"' % what)
            return
        if not answer['done']:
            state.failures.append('FAIL %s: the stream ended without "data: [DONE]"' % what)
            return
        state.completed += 1
        if kind == 'whole':
            state.whole += 1
        else:
            state.streamed += 1
        if not same_answer(ref, answer):
            state.mismatches.append({'what': what, 'prompt': prompt, 'in_flight': in_flight, 'prefix': False,
                                     'expected': ref['content'], 'got': answer['content'],
                                     'expected_end': (ref['finish_reason'], ref['completion_tokens']),
                                     'got_end': (answer['finish_reason'], answer['completion_tokens'])})


def client_thread(port, state, refs, round_no, client, reqs, deadline):
    for prompt, kind in reqs:
        try:
            run_request(port, state, refs, round_no, client, prompt, kind, deadline)
        except (Fail, OSError, http.client.HTTPException, ValueError) as e:
            with state.lock:
                state.failures.append('FAIL round %d client %d prompt %d (%s): %s%s'
                                      % (round_no, client, prompt, kind, '' if isinstance(e, Fail) else type(e).__name__ + ': ', e))
            return


def run_round(port, refs, round_no):
    state = RoundState()
    deadline = time.monotonic() + HANG
    threads = [threading.Thread(target=client_thread, args=(port, state, refs, round_no, c, reqs, deadline), daemon=True)
               for c, reqs in enumerate(request_plan(round_no))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = sum(t.is_alive() for t in threads)
    if hung:
        raise Fail('round %d: %d client(s) still waiting for the server after %.0f s (a hang)' % (round_no, hung, HANG))
    # The round's last client leaves mid-answer while no other request runs: its slot, the only
    # busy one, must be freed too (not only when a later step of other requests notices it).
    lone = max(range(len(PROMPTS)), key=lambda i: (refs[i]['finish_reason'] == 'length', i))
    client_thread(port, state, refs, round_no, CLIENTS, [(lone, 'disconnect')], deadline)
    return state


def wait_idle(port, round_no):
    """Polls /metrics until no request runs or waits: the disconnected clients' slots were freed."""
    deadline = time.monotonic() + IDLE_GUARD
    while True:
        m = metrics(port)
        if m['spark_requests_running'] == 0 and m['spark_requests_queued'] == 0:
            return m
        if time.monotonic() > deadline:
            # Which it is: a slot really held, or only the gauge left behind (one more request ends
            # with a decode step, which counts the slots again).
            status, _, _, _ = chat_whole(port, chat_body(0, False))
            m2 = metrics(port)
            after = 'after one more request (HTTP %d): %d running, %d queued' % (
                status, m2['spark_requests_running'], m2['spark_requests_queued'])
            raise Fail('round %d: /metrics shows %d request(s) running and %d queued %.0f s after every client returned '
                       '(a slot not freed, or the gauge not updated); %s'
                       % (round_no, m['spark_requests_running'], m['spark_requests_queued'], IDLE_GUARD, after))
        time.sleep(POLL)


def describe_mismatch(port, m):
    """FAIL lines for an answer that differs from the reference: where, and the texts around it."""
    exp, got = m['expected'], m['got']
    i = 0
    while i < min(len(exp), len(got)) and exp[i] == got[i]:
        i += 1
    token = '?'
    try:  # which answer token it is, about (the common prefix tokenized again)
        status, _, r = http_post(port, '/tokenize', {'content': exp[:i], 'parse_special': False})
        if status == 200:
            token = str(len(r['tokens']))
    except (OSError, http.client.HTTPException, KeyError, TypeError):
        pass
    kind = 'the disconnected client\'s partial answer' if m['prefix'] else 'the answer'
    lines = ['FAIL %s: %s differs from the solo (reference) answer of prompt %d at character %d (~answer token %s; '
             '%d requests of this test in flight when it was sent)' % (m['what'], kind, m['prompt'], i, token, m['in_flight'])]
    if 'expected_end' in m and m['expected_end'] != m['got_end']:
        lines.append('FAIL   finish_reason/completion_tokens: expected %s, got %s' % (m['expected_end'], m['got_end']))
    lines.append('FAIL   expected: %r' % exp[max(0, i - 60):i + 80])
    lines.append('FAIL   got:      %r' % got[max(0, i - 60):i + 80])
    lines.append('FAIL   (the user text: %r)' % PROMPTS[m['prompt']][1])
    return lines


def load_phase(build, summary):
    """The main server: references, ROUNDS rounds of concurrent clients, the checks after each."""
    server = Server(build, ['--parallel', '4', '--queue', '64', '-c', '8192'])
    try:
        server.wait_ready()
        port = server.port
        refs = reference_answers(port)
        summary['reference'] = ', '.join('%d:%s/%d' % (i, r['finish_reason'], r['completion_tokens']) for i, r in enumerate(refs))
        before = metrics(port)
        summary['rss_kb'] = [('after references', server.rss_kb())]
        cancelled_total = 0
        for round_no in range(1, ROUNDS + 1):
            t0 = time.monotonic()
            state = run_round(port, refs, round_no)
            seconds = time.monotonic() - t0
            server.check_alive('during round %d' % round_no)
            if state.failures or state.mismatches:
                for line in state.failures[:10]:
                    print(line)
                if len(state.failures) > 10:
                    print('FAIL ... and %d more errors' % (len(state.failures) - 10))
                if state.mismatches:
                    for line in describe_mismatch(port, state.mismatches[0]):
                        print(line)
                    others = sorted({(m['prompt'], m['in_flight']) for m in state.mismatches[1:]})
                    print('FAIL %d answer(s) differ from the reference in round %d; (prompt, in flight) of the others: %s'
                          % (len(state.mismatches), round_no, others))
                raise Fail('round %d: %d error(s), %d answer(s) unlike the reference' % (round_no, len(state.failures), len(state.mismatches)))
            after = wait_idle(port, round_no)
            check_health(port)
            rss = server.rss_kb()
            summary['rss_kb'].append(('round %d' % round_no, rss))
            # The server's counters against what the clients saw.
            accepted = state.completed + state.disconnected
            d = {k: int(after[k] - before[k]) for k in after if k.endswith('_total')}
            if d['spark_requests_total'] != accepted:
                raise Fail('round %d: spark_requests_total grew by %d, the clients had %d requests accepted'
                           % (round_no, d['spark_requests_total'], accepted))
            if d['spark_requests_failed_total'] != 0:
                raise Fail('round %d: spark_requests_failed_total grew by %d' % (round_no, d['spark_requests_failed_total']))
            if d['spark_requests_rejected_total'] != state.overloaded:
                raise Fail('round %d: spark_requests_rejected_total grew by %d, the clients got %d 503s'
                           % (round_no, d['spark_requests_rejected_total'], state.overloaded))
            if d['spark_requests_cancelled_total'] > state.disconnected:
                raise Fail('round %d: %d requests cancelled, only %d clients disconnected'
                           % (round_no, d['spark_requests_cancelled_total'], state.disconnected))
            cancelled_total += d['spark_requests_cancelled_total']
            before = after
            print('round %d: %d requests done (%d streamed, %d whole), %d disconnected (%d cancelled by the server), '
                  '%d 503s, at most %d in flight, %.1f s, RSS %.1f MiB'
                  % (round_no, state.completed, state.streamed, state.whole, state.disconnected,
                     d['spark_requests_cancelled_total'], state.overloaded, state.max_in_flight, seconds, rss / 1024.0))
            sys.stdout.flush()
            for k in ('completed', 'disconnected', 'overloaded'):
                summary[k] = summary.get(k, 0) + getattr(state, k)
            if round_no > 1:
                warm = summary['rss_kb'][1][1]  # after round 1, the warm-up
                bound = warm + max(int(warm * RSS_GROWTH_FRACTION), RSS_GROWTH_MIN_KB)
                if rss > bound:
                    raise Fail('round %d: RSS %.1f MiB, beyond the bound %.1f MiB (warm-up round: %.1f MiB): a leak per request?'
                               % (round_no, rss / 1024.0, bound / 1024.0, warm / 1024.0))
        summary['cancelled'] = cancelled_total
        # The clients that left mid-answer must have been noticed by the server at least once (their
        # answers run up to DISCONNECT_MAX_TOKENS tokens): else the disconnect path went untested.
        if summary['disconnected'] and cancelled_total == 0:
            raise Fail('%d clients disconnected mid-stream, but spark_requests_cancelled_total did not grow' % summary['disconnected'])
        code = server.stop()
        if code != 0:
            raise Fail('spark-server exited with code %s on SIGTERM (expected 0)' % code)
    except Fail:
        print(server.log())
        raise
    finally:
        server.stop()
    return refs


# ---- overload ------------------------------------------------------------------------------------

def overload_phase(build, refs, summary):
    """--parallel 1 --queue 1: of OVERLOAD_REQUESTS simultaneous long requests, the ones beyond the
    slot and the queue are refused with 503; the others complete; the server goes on serving."""
    server = Server(build, ['--parallel', '1', '--queue', '1', '-c', '2048'])
    try:
        server.wait_ready()
        port = server.port
        results = [None] * OVERLOAD_REQUESTS
        start = threading.Barrier(OVERLOAD_REQUESTS)

        def one(i):
            try:
                start.wait(HANG)
                results[i] = chat_whole(port, chat_body(None, False, OVERLOAD_MAX_TOKENS))
            except Exception as e:  # reported below as this request's failure
                results[i] = e
        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(OVERLOAD_REQUESTS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + HANG
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads):
            raise Fail('overload: requests still unanswered after %.0f s (a hang)' % HANG)
        server.check_alive('during the overload')
        answers, refused = [], 0
        for i, r in enumerate(results):
            if isinstance(r, Exception):
                raise Fail('overload request %d: %s: %s' % (i, type(r).__name__, r))
            status, headers, err, answer = r
            if status == 200:
                answers.append(answer)
            else:
                overload_delay(status, headers, err, 'overload request %d' % i)  # a well-formed 503, else Fail
                refused += 1
        if refused == 0:
            raise Fail('overload: none of %d simultaneous requests to --parallel 1 --queue 1 was refused with 503' % OVERLOAD_REQUESTS)
        if not answers:
            raise Fail('overload: every request was refused; the slot and the queue should have taken two')
        for a in answers[1:]:
            if a['content'] != answers[0]['content'] or a['completion_tokens'] != answers[0]['completion_tokens']:
                raise Fail('overload: two greedy answers to the same prompt differ:\n  %r\n  %r' % (answers[0]['content'][:200], a['content'][:200]))
        m = wait_idle(port, 0)
        if int(m['spark_requests_rejected_total']) != refused or int(m['spark_requests_total']) != len(answers):
            raise Fail('overload: /metrics says %d accepted and %d rejected, the clients saw %d and %d'
                       % (m['spark_requests_total'], m['spark_requests_rejected_total'], len(answers), refused))
        # Still serving, and with the same greedy answers as the other server.
        check_health(port)
        status, headers, err, answer = chat_whole(port, chat_body(0, False))
        if status != 200:
            raise Fail('after the overload: HTTP %d %s' % (status, str(err)[:300]))
        if not same_answer(refs[0], answer):
            raise Fail('after the overload, prompt 0 answers %r, the reference is %r' % (answer['content'][:200], refs[0]['content'][:200]))
        summary['overload'] = '%d simultaneous: %d completed (%d tokens each), %d refused with 503' % (
            OVERLOAD_REQUESTS, len(answers), answers[0]['completion_tokens'], refused)
        code = server.stop()
        if code != 0:
            raise Fail('spark-server (--parallel 1) exited with code %s on SIGTERM (expected 0)' % code)
    except Fail:
        print(server.log())
        raise
    finally:
        server.stop()


def main():
    if len(sys.argv) < 2:
        print('usage: server_load.py BUILD_DIR [DATA_DIR]')
        return 2
    build = sys.argv[1]
    t0 = time.monotonic()
    summary = {}
    try:
        refs = load_phase(build, summary)
        overload_phase(build, refs, summary)
    except Fail as e:
        print('FAIL %s' % e)
        return 1
    print('summary: %d requests done, %d disconnected mid-stream (%d cancelled by the server), %d 503s retried, '
          'in %d rounds of %d clients x %d requests'
          % (summary['completed'], summary['disconnected'], summary['cancelled'], summary['overloaded'], ROUNDS, CLIENTS,
             REQUESTS_PER_CLIENT))
    print('reference answers (prompt:finish/tokens): %s' % summary['reference'])
    print('RSS: %s' % ', '.join('%s %.1f MiB' % (k, v / 1024.0) for k, v in summary['rss_kb']))
    print('overload (--parallel 1 --queue 1): %s' % summary['overload'])
    print('wall time: %.1f s' % (time.monotonic() - t0))
    print('ok')
    return 0


if __name__ == '__main__':
    sys.exit(main())
