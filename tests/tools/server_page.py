#!/usr/bin/env python3
"""spark-server's chat page (tools/server/web/index.html) in a real browser: headless Chromium driven
over the DevTools protocol (CDP, a websocket).

    python3 tests/tools/server_page.py BUILD_DIR [DATA_DIR]

Starts BUILD_DIR/tools/server/spark-server on the demo model (--port 0) and Chromium on its page `/`:
- the header shows the model that GET /v1/models names; the title is "spark";
- with temperature 0 and max tokens 64 (set in the settings fields), a coding question sent with the
  Send button streams into an assistant message (data-state "streaming", then "done") whose rendered
  answer is the content of a non-streaming POST /v1/chat/completions with the same messages (greedy
  decoding is deterministic; whitespace is collapsed on both sides, and the markdown the page renders
  (code fences, inline code) is taken out of the expected text); a fenced code block becomes
  <pre><code>; the stats line shows tok/s;
- in a new chat, an answer with max tokens 2000 is stopped with the Stop button as soon as it shows
  text (a MutationObserver in the page clicks it): data-state "stopped", the Send button is back, the
  server answers GET /health, its /metrics (where it has spark_requests_cancelled_total and
  spark_requests_running) count the request cancelled and no slot busy, and a new question (typed,
  sent with Enter) gets its answer;
- no JavaScript exception is thrown on the page.
The screenshot is BUILD_DIR/test-artifacts/server_page.png.

No step waits a fixed time: the server's "listening on" line, Chromium's DevToolsActivePort file and
the page's DOM (polled every 100 ms) and /metrics say when to go on; the HANG limit of each wait only guards
against a hang (CI machines are loaded 2-core boxes). Exit code 0: all good; 1: "FAIL ..." lines say
what is wrong; 77: Chromium or python3-websocket is missing (skipped).
"""
import base64, json, os, re, shutil, signal, subprocess, sys, tempfile, threading, time, urllib.error, urllib.request
from pathlib import Path

from serverlib import Server, ServerError

try:
    import websocket  # websocket-client (Debian: python3-websocket)
except ImportError:
    # A python3 of its own (pyenv, a venv) first on PATH may not see Debian's package: the system one does.
    if os.path.realpath(sys.executable) != os.path.realpath('/usr/bin/python3') and os.path.exists('/usr/bin/python3') \
            and not os.environ.get('SPARK_PAGE_TEST_REEXEC'):
        os.environ['SPARK_PAGE_TEST_REEXEC'] = '1'
        os.execv('/usr/bin/python3', ['/usr/bin/python3', os.path.abspath(__file__)] + sys.argv[1:])
    print('SKIP: the python module websocket (websocket-client, Debian: python3-websocket) is missing')
    sys.exit(77)

HANG = 300.0  # seconds: a guard against a hang, never a pacing delay
POLL = 0.1    # seconds between two looks at the page's DOM
ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / 'examples/models/spark-demo-coder-moe'
QUESTION = 'Write a Python function that returns the sum of a list.'
LONG_QUESTION = 'Write a Python function `primes_up_to(n)`: Return all primes up to n.'  # the demo model repeats itself
AFTER_STOP_QUESTION = 'Write a Python function `add(a, b)`: Return the sum of a and b.'


Fail = ServerError  # a failed check, reported as FAIL


def find_chromium():
    for name in ('chromium', 'chromium-browser', 'google-chrome', 'google-chrome-stable'):
        path = shutil.which(name)
        if path:
            return path
    return None


def until(cond, what, limit=HANG):
    """Waits (polling every POLL s) until cond() returns something true, and returns it."""
    deadline = time.monotonic() + limit
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise Fail('no %s after %.0f s' % (what, limit))
        time.sleep(POLL)


def http(url, body=None, timeout=HANG):
    """(status, parsed JSON or text) of a GET (body None) or a JSON POST."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={'Content-Type': 'application/json'} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode('utf-8', 'replace')
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode('utf-8', 'replace')
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


class Browser:
    """Headless Chromium with one page, driven over CDP."""

    def __init__(self, exe, profile, log):
        self.profile = profile
        self.proc = subprocess.Popen(
            [exe, '--headless=new', '--no-sandbox', '--remote-debugging-port=0', '--user-data-dir=' + profile,
             '--window-size=1100,1000', '--no-first-run', '--no-default-browser-check', '--disable-gpu',
             '--disable-dev-shm-usage', '--disable-extensions', '--disable-background-networking', '--disable-sync',
             '--mute-audio', '--hide-scrollbars', 'about:blank'],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        self.ws = None
        self.next_id = 0
        self.events = []

    def connect(self):
        port_file = os.path.join(self.profile, 'DevToolsActivePort')

        def port():
            if self.proc.poll() is not None:
                raise Fail('chromium exited (code %s) before it opened the DevTools port' % self.proc.returncode)
            try:
                with open(port_file) as f:
                    lines = f.read().split('\n')
                return int(lines[0]) if len(lines) >= 2 and lines[0].strip() else None
            except (OSError, ValueError):
                return None
        self.port = until(port, "chromium's DevToolsActivePort")

        def page_target():
            status, targets = http('http://127.0.0.1:%d/json/list' % self.port, timeout=30)
            pages = [t for t in targets if t.get('type') == 'page'] if status == 200 and isinstance(targets, list) else []
            return pages[0]['webSocketDebuggerUrl'] if pages else None
        url = until(page_target, 'page in chromium')
        self.ws = websocket.create_connection(url, timeout=HANG, suppress_origin=True)

    def call(self, method, **params):
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({'id': mid, 'method': method, 'params': params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get('id') == mid:
                if 'error' in msg:
                    raise Fail('CDP %s: %s' % (method, msg['error']))
                return msg.get('result', {})
            if 'method' in msg:
                self.events.append(msg)

    def wait_event(self, method):
        deadline = time.monotonic() + HANG
        while True:
            for i, e in enumerate(self.events):
                if e['method'] == method:
                    return self.events.pop(i)
            if time.monotonic() > deadline:
                raise Fail('no CDP event %s after %.0f s' % (method, HANG))
            msg = json.loads(self.ws.recv())
            if 'method' in msg:
                self.events.append(msg)

    def js(self, expr):
        """The value of a JavaScript expression in the page."""
        r = self.call('Runtime.evaluate', expression=expr, returnByValue=True, awaitPromise=True)
        if 'exceptionDetails' in r:
            d = r['exceptionDetails']
            raise Fail('JavaScript %r threw: %s' % (expr[:80], d.get('exception', {}).get('description', d.get('text'))))
        return r.get('result', {}).get('value')

    def exceptions(self):
        """The page's uncaught JavaScript exceptions (Runtime.exceptionThrown) seen so far."""
        self.call('Runtime.evaluate', expression='0')  # collects the events sent before it
        return [e['params']['exceptionDetails'] for e in self.events if e['method'] == 'Runtime.exceptionThrown']

    def screenshot(self, path):
        data = self.call('Page.captureScreenshot', format='png')['data']
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def close(self):
        if self.ws:
            try:
                self.ws.close()
            except Exception:
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # chromium and its helpers: the session it leads
                self.proc.wait(20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # helpers that outlived it
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait()


def plain_text(md):
    """The text the page shows for the markdown `md`: without the code fences' lines and the backquotes
    of inline code (tools/server/web/index.html, markdown())."""
    out, code = [], False
    for line in md.split('\n'):
        if not code:
            if re.match(r'\s*```', line):
                code = True
                out.append('')
            else:
                out.append(re.sub(r'`([^`\n]+)`', r'\1', line))
        elif re.match(r'\s*```\s*$', line):
            code = False
            out.append('')
        else:
            out.append(line)
    return '\n'.join(out)


def collapse(s):
    return ' '.join(s.split())


LAST = "[...document.querySelectorAll('.msg.assistant')].pop()"
STATE_JS = "(() => { const m = %s; return m ? m.dataset.state : null; })()" % LAST


def set_field(b, id_, value):
    b.js("(() => { const e = document.getElementById(%s); e.value = %s; e.dispatchEvent(new Event('input', {bubbles: true}));"
         " e.dispatchEvent(new Event('change', {bubbles: true})); })()" % (json.dumps(id_), json.dumps(value)))


def send_with_button(b, text):
    """Types `text` into #prompt and clicks #send. Returns the new message's data-state and whether #stop
    shows, right after the click: the page adds the message and shows #stop before its request goes
    out (a short answer may be over by the next look)."""
    set_field(b, 'prompt', text)
    n = b.js("document.querySelectorAll('.msg.assistant').length")
    state, stop_shown = b.js("""(() => { document.getElementById('send').click(); const m = %s;
        return [m ? m.dataset.state : null, getComputedStyle(document.getElementById('stop')).display !== 'none']; })()""" % LAST)
    if b.js("document.querySelectorAll('.msg.assistant').length") != n + 1:
        raise Fail('clicking #send added no assistant message')
    return state, stop_shown


def send_with_enter(b, text):
    b.js("document.getElementById('prompt').focus()")
    b.call('Input.insertText', text=text)
    n = b.js("document.querySelectorAll('.msg.assistant').length")
    for kind in ('keyDown', 'keyUp'):
        b.call('Input.dispatchKeyEvent', type=kind, key='Enter', code='Enter', windowsVirtualKeyCode=13,
               nativeVirtualKeyCode=13, **({'text': '\r'} if kind == 'keyDown' else {}))
    until(lambda: b.js("document.querySelectorAll('.msg.assistant').length") == n + 1, 'assistant message after Enter')


def wait_finished(b):
    return until(lambda: (lambda s: s if s not in (None, 'streaming') else None)(b.js(STATE_JS)), 'end of the answer')


def last_message(b):
    return b.js("""(() => { const m = %s; if (!m) return null;
        const q = (s) => m.querySelector(s);
        return {state: m.dataset.state, answer: q('.answer') ? q('.answer').innerText : null,
                stats: q('.stats') ? q('.stats').innerText : null, error: q('.error') ? q('.error').innerText : null,
                codeBlocks: m.querySelectorAll('.answer pre code').length}; })()""" % LAST)


def run(build, b, server, failures):
    def check(ok, why):
        if not ok:
            failures.append(why)
            print('FAIL ' + why)
        return ok

    def ok(line, since):  # a step's "ok" line, when none of its checks failed
        if len(failures) == since:
            print('ok   ' + line)

    base = server.url
    status, health = http(base + '/health')
    check(status == 200, 'GET /health before the page: HTTP %s %s' % (status, health))
    status, models = http(base + '/v1/models')
    if status != 200 or not isinstance(models, dict) or not models.get('data'):
        raise Fail('GET /v1/models: HTTP %s %r' % (status, models))
    model_id = models['data'][0]['id']

    b.call('Page.enable')
    b.call('Runtime.enable')
    b.call('Page.navigate', url=base + '/')
    b.wait_event('Page.loadEventFired')
    check(b.js('document.title') == 'spark', 'the page title is %r, expected "spark"' % b.js('document.title'))
    for id_ in ('prompt', 'send', 'stop', 'temperature', 'max-tokens'):
        if not b.js('!!document.getElementById(%s)' % json.dumps(id_)):
            raise Fail('the page has no #%s' % id_)
    shown = until(lambda: b.js("(document.getElementById('model') || document.querySelector('header')).innerText"),
                  'model name in the header')
    check(model_id in shown, 'the header shows %r, not the model %r' % (shown, model_id))
    check(b.js("getComputedStyle(document.getElementById('stop')).display") == 'none', '#stop is shown before any answer')
    ok('the page loads: title "spark", model %s in the header' % model_id, 0)

    # 1. a greedy answer, bounded, streamed and rendered; the same as the non-streaming API's
    step = len(failures)
    if b.js("!!document.getElementById('settings-toggle')"):
        b.js("document.getElementById('settings-toggle').click()")
    set_field(b, 'temperature', '0')
    set_field(b, 'max-tokens', '64')
    if b.js("!!document.getElementById('settings-toggle')"):
        b.js("document.getElementById('settings-toggle').click()")  # closed again: the screenshot shows the talk
    state, stop_shown = send_with_button(b, QUESTION)
    check(state == 'streaming', 'right after Send the assistant message is %r, not "streaming"' % state)
    check(stop_shown, '#stop is not shown while the answer streams')
    wait_finished(b)
    m = last_message(b)
    if m['state'] != 'done':
        raise Fail('the answer ended in state %r (error: %r)' % (m['state'], m['error']))
    status, ref = http(base + '/v1/chat/completions', {
        'messages': [{'role': 'user', 'content': QUESTION}], 'temperature': 0, 'max_tokens': 64, 'stream': False})
    if status != 200:
        raise Fail('the non-streaming request: HTTP %s %r' % (status, ref))
    content = ref['choices'][0]['message']['content'] or ''
    check(collapse(m['answer']) != '', 'the answer on the page is empty')
    check(collapse(m['answer']) == collapse(plain_text(content)),
          'the answer on the page differs from the API\'s:\n--- page (stats: %s):\n%s\n--- API (content, %s):\n%s'
          % (m['stats'], m['answer'], ref.get('usage'), content))
    if re.search(r'^\s*```', content, re.M):
        check(m['codeBlocks'] >= 1, 'the answer has a code fence but the page shows no <pre><code>')
    check(bool(m['stats']) and re.search(r'\d+(\.\d+)? tok/s', m['stats']) is not None,
          'the stats line %r shows no tok/s' % m['stats'])
    check(b.js("getComputedStyle(document.getElementById('stop')).display") == 'none', '#stop still shown after the answer')
    ok('streamed answer (%d characters, %d code block(s)) = the API\'s; stats: %s'
       % (len(content), m['codeBlocks'], m['stats']), step)

    # 2. Stop: a long answer (a new chat: the question alone makes the demo model repeat itself until
    # max tokens), stopped as soon as it shows text
    step = len(failures)
    set_field(b, 'max-tokens', '2000')
    for attempt in range(1, 4):
        b.js("document.getElementById('new-chat').click()")
        # Clicks Stop from inside the page, at the first change of the DOM that shows answer text: no
        # polling delay lets a fast machine finish the answer first.
        b.js("""(() => { window.__stop = null; const obs = new MutationObserver(() => {
            const m = %s;
            if (!m) return;
            if (m.dataset.state !== 'streaming') { window.__stop = m.dataset.state; obs.disconnect(); return; }
            if (!m.querySelector('.answer').textContent.trim()) return;
            obs.disconnect(); document.getElementById('stop').click(); window.__stop = 'clicked'; });
            obs.observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true, attributes: true}); })()"""
             % LAST)
        state, _ = send_with_button(b, LONG_QUESTION)
        check(state == 'streaming', 'right after Send the long answer is %r, not "streaming"' % state)
        clicked = until(lambda: b.js('window.__stop'), 'text in the long answer')
        if clicked == 'clicked':
            break
        print('note the long answer ended (%s) before Stop was clicked (attempt %d); again' % (clicked, attempt))
    else:
        raise Fail('no answer could be stopped in 3 attempts')
    state = wait_finished(b)
    m = last_message(b)
    check(state == 'stopped', 'after Stop the answer is %r, not "stopped"' % state)
    check(m['answer'].strip() != '', 'the stopped answer lost its text')
    check(b.js("getComputedStyle(document.getElementById('send')).display") != 'none', '#send not back after Stop')
    status, health = http(base + '/health', timeout=HANG)
    check(status == 200, 'GET /health after Stop: HTTP %s %s' % (status, health))
    # The server's Prometheus counters, where it has them: the stopped request was cancelled (the
    # client went away), and its slot is free again.
    def metrics():
        status, text = http(base + '/metrics')
        if status != 200 or not isinstance(text, str):
            return None
        return dict((k, float(v)) for k, v in re.findall(r'^(spark_\w+) (\S+)$', text, re.M))
    mx = metrics()
    if mx and 'spark_requests_cancelled_total' in mx and 'spark_requests_running' in mx:
        seen = [mx]

        def freed():
            seen[0] = metrics() or seen[0]
            return seen[0]['spark_requests_cancelled_total'] >= 1 and seen[0]['spark_requests_running'] == 0
        try:
            until(freed, 'cancelled request with its slot freed in /metrics')
        except Fail as e:
            raise Fail('%s; the last /metrics: %s' % (e, {k: v for k, v in seen[0].items() if 'requests' in k or 'generated' in k}))
        mx = seen[0]
        print('ok   /metrics: %d request(s) cancelled, none running' % mx['spark_requests_cancelled_total'])
    else:
        print('note no spark_requests_cancelled_total / spark_requests_running in GET /metrics: not checked')
    ok('Stop: the answer is "stopped" after %d characters; the server answers /health' % len(m['answer']), step)

    # 3. a new question after the stopped one, typed and sent with Enter
    step = len(failures)
    set_field(b, 'max-tokens', '64')
    send_with_enter(b, AFTER_STOP_QUESTION)
    state = wait_finished(b)
    m = last_message(b)
    check(state == 'done', 'the answer after Stop ended in state %r (error: %r)' % (state, m['error']))
    check(m['answer'].strip() != '', 'the answer after Stop is empty')
    check(b.js("document.getElementById('prompt').value") == '', 'the prompt was not cleared after Enter')
    ok('a question sent with Enter after Stop gets its answer (%d characters)' % len(m['answer']), step)

    errors = b.exceptions()
    check(not errors, 'JavaScript exceptions on the page: %s'
          % '; '.join(e.get('exception', {}).get('description', e.get('text', '?')) for e in errors))


def main(argv):
    if len(argv) < 2:
        print('usage: server_page.py BUILD_DIR [DATA_DIR]')
        return 2
    build = Path(argv[1]).resolve()
    exe = find_chromium()
    if not exe:
        print('SKIP: no chromium on PATH')
        return 77
    shot = build / 'test-artifacts' / 'server_page.png'
    failures = []
    server = b = None
    profile = tempfile.mkdtemp(prefix='spark-page-chromium-')
    chromium_log = open(os.path.join(profile, 'chromium.log'), 'w+b')  # the profile dir goes, so does it
    try:
        server = Server(build, ['-m', str(MODEL)])
        server.wait_ready()
        print('ok   spark-server listens on %s' % server.url)
        b = Browser(exe, profile, chromium_log)
        b.connect()
        run(build, b, server, failures)
    except (Fail, OSError, websocket.WebSocketException) as e:
        failures.append(str(e))
        print('FAIL %s' % e)
    finally:
        if b and b.proc.poll() is None:
            try:
                b.screenshot(shot)
                print('screenshot: %s' % shot)
            except Exception as e:  # the screenshot is for people; its failure says nothing of the page
                print('note no screenshot: %s' % e)
        if b:
            b.close()
        if server:
            server.stop()
        if failures and server:
            print('spark-server said (last lines):\n' + server.log())
        if failures and b:
            chromium_log.seek(0)
            tail = [l for l in chromium_log.read().decode('utf-8', 'replace').strip().split('\n') if 'dbus' not in l][-15:]
            print('chromium said (last lines):\n' + '\n'.join(tail))
        chromium_log.close()
        shutil.rmtree(profile, ignore_errors=True)
    if failures:
        return 1
    print('server page: ok')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
