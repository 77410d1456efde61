#!/usr/bin/env bash
# Drives interactive spark-chat in a real terminal (a pseudo-terminal from python3's pty module): two
# turns, /reset, an answer interrupted with Ctrl-C followed by a new turn, /stats, UTF-8 input, and
# Ctrl-C at the prompt: it drops a typed line; at an empty prompt it shows how to leave, and a second
# one leaves (exit code 0); /quit and Ctrl-D leave too.
#
# No step waits a fixed time: each one waits for what the terminal shows (the answer's text, the next
# "> " prompt), and the 300 s limit of each wait only guards against a hang (CI machines are loaded).
# The answers are bounded (-n 400) so that a model that repeats itself ends its turn soon. The
# interruption does not race the answer: once the answer shows, spark-chat is stopped (SIGSTOP), the
# Ctrl-C is typed, and it continues (SIGCONT), so the Ctrl-C lands in the running answer; only when the
# answer had already ended by then (a very loaded machine) is the turn asked again, up to 5 times.
set -uo pipefail
build=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
exec python3 - "$build/examples/chat/spark-chat" "$root/examples/models/spark-demo-coder-moe" <<'PY'
import fcntl, os, pty, re, select, signal, struct, sys, termios, time

exe, model = sys.argv[1], sys.argv[2]
HANG = 300.0  # seconds: a guard against a hang, never a pacing delay
HINT = 'to leave, press Ctrl-C again'
ANSI = re.compile(r'\x1b(\[[0-9;?]*[ -/]*[@-~]|[()][A-Za-z0-9]|[=>])')


class Chat:
    def __init__(self, *args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: its stdin/stdout/stderr are the terminal
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack('HHHH', 50, 200, 0, 0))
            os.environ['TERM'] = 'xterm'
            os.execv(exe, [exe, '-m', model, '--temp', '0', '-n', '400', '-t', '1', *args])
        self.out = bytearray()  # everything the terminal was sent
        self.eof = False

    def text(self, since=0):
        return ANSI.sub('', self.out[since:].decode('utf-8', 'replace')).replace('\r', '')

    def mark(self):
        return len(self.out)

    def pump(self, timeout):  # waits until output arrives (or the timeout), reads what there is
        if self.eof:
            return
        r, _, _ = select.select([self.fd], [], [], timeout)
        if not r:
            return
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: spark-chat exited and closed the terminal
            data = b''
        if data:
            self.out.extend(data)
        else:
            self.eof = True

    def wait(self, what, since, cond):
        deadline = time.monotonic() + HANG
        while not cond(self.text(since)):
            if self.eof:
                self.fail('spark-chat exited while waiting for ' + what)
            if time.monotonic() > deadline:
                self.fail('no %s after %.0f s' % (what, HANG))
            self.pump(deadline - time.monotonic())

    def wait_for(self, pattern, since):  # `pattern` (a regex) in the output after `since`
        self.wait(repr(pattern), since, lambda t: re.search(pattern, t) is not None)

    def wait_prompt(self, since):  # spark-chat waits at a fresh "> " prompt: it ends the output
        self.wait('prompt', since, lambda t: t.endswith('\n> '))
        # libedit shows the prompt, then puts the terminal in raw mode: keys typed before that would be
        # echoed by the terminal and line-buffered. Wait for it.
        self.until(lambda: not termios.tcgetattr(self.fd)[3] & termios.ICANON, 'the prompt taking keys')

    def until(self, cond, what):  # a state of the terminal or the process (no output marks it)
        deadline = time.monotonic() + HANG
        while not cond():
            if time.monotonic() > deadline:
                self.fail('no %s after %.0f s' % (what, HANG))
            time.sleep(0.001)

    def send(self, keys):
        os.write(self.fd, keys.encode())

    def turn(self, line, expect=None):  # a line and its whole answer; returns where it began
        m = self.mark()
        self.send(line + '\r')
        if expect:
            self.wait_for(expect, m)
        self.wait_prompt(m)
        return m

    def status(self):
        with open('/proc/%d/status' % self.pid) as f:
            return dict((k, v.strip()) for k, v in (l.split(':', 1) for l in f if ':' in l))

    def stop(self):  # SIGSTOP, and until the process is stopped (the signal is asynchronous)
        os.kill(self.pid, signal.SIGSTOP)
        self.until(lambda: self.status()['State'].startswith('T'), 'stopped spark-chat')

    def sigint_pending(self):  # until the stopped process has the terminal's SIGINT pending
        bit = 1 << (signal.SIGINT - 1)
        self.until(lambda: (int(self.status()['SigPnd'], 16) | int(self.status()['ShdPnd'], 16)) & bit, 'SIGINT pending')

    def exit_code(self):
        deadline = time.monotonic() + HANG
        while not self.eof and time.monotonic() < deadline:
            self.pump(deadline - time.monotonic())
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)  # the terminal closed; the process is on its way out
        self.fail('spark-chat did not exit')

    def fail(self, why):
        print('FAIL: ' + why + '; the terminal showed:\n' + self.text()[-6000:])
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        sys.exit(1)

    def check(self, ok, why):
        if not ok:
            self.fail(why)


c = Chat()
c.wait_for('/help for commands', 0)
c.wait_prompt(0)
c.turn('Write a Python function `fibonacci(n)`: Return the n-th Fibonacci number.', 'def fibonacci')
print('ok   first turn')
c.turn('Write a Python function `add(a, b)`: Return the sum of a and b.', 'def add')
print('ok   second turn')
c.turn('/reset', 'conversation reset')

# A prompt that makes the demo model repeat itself until -n: interrupt it while it runs.
for attempt in range(1, 6):
    m = c.mark()
    c.send('Write a Python function `primes_up_to(n)`: Return all primes up to n.\r')
    c.wait_for('def primes', m)
    c.stop()
    c.send('\x03')  # the terminal turns it into SIGINT, delivered when spark-chat continues
    c.sigint_pending()
    os.kill(c.pid, signal.SIGCONT)
    c.wait_prompt(m)
    if '[interrupted]' in c.text(m):
        break
    # The answer had ended before spark-chat stopped: the Ctrl-C met the prompt (or the moment
    # between the turn and the prompt). Ask again.
    print('note the answer had ended before the Ctrl-C (attempt %d); again' % attempt)
    c.turn('/reset', 'conversation reset')
else:
    c.fail('no answer was interrupted in 5 attempts')
print('ok   Ctrl-C stopped the answer')
# The interrupted answer stays in the history, cut wherever Ctrl-C landed, so what the model says
# next depends on where that was (e.g. just the "```" that closes the cut code block): check that the
# turn runs and answers, not its words (the uninterrupted turns above check those).
line = 'Write a Python function `read_json(path)`: Load a JSON file and return its contents.'
m = c.turn(line)
reply = c.text(m).split(line, 1)[1].rsplit('\n> ', 1)[0]
c.check(reply.strip() != '', 'no answer after the interrupted turn')
print('ok   a turn after the interrupted one')
m = c.turn('/stats', 'tok/s')
c.check('greedy' in c.text(m), '/stats does not say greedy')
m = c.turn('/h\u00e9llo', 'unknown command')
c.check('unknown command /h\u00e9llo;' in c.text(m), 'the UTF-8 input did not come through')
print('ok   /stats, UTF-8 input')

# Ctrl-C at the prompt: a typed line is dropped (no hint, no answer, a fresh prompt).
m = c.mark()
c.send('forget this')
c.wait_for('forget this', m)  # libedit has read the keys
c.send('\x03')
c.wait_prompt(m)
c.check(HINT not in c.text(m) and '```' not in c.text(m), 'Ctrl-C after typing did not just drop the line')
# At an empty prompt: the hint, and spark-chat stays; a line in between disarms the second Ctrl-C.
m = c.mark()
c.send('\x03')
c.wait_for(re.escape(HINT) + r'.*\n> $', m)
c.turn('/help', 'commands:')
m = c.mark()
c.send('\x03')
c.wait_for(re.escape(HINT) + r'.*\n> $', m)
print('ok   Ctrl-C at the prompt: a typed line is dropped; at an empty prompt the hint')
c.send('\x03')  # the second one in a row leaves
rc = c.exit_code()
c.check(rc == 0, 'Ctrl-C twice at an empty prompt: exit code %d, expected 0' % rc)
print('ok   Ctrl-C twice at an empty prompt leaves (exit code 0)')

for keys, name in (('/quit\r', '/quit'), ('\x04', 'Ctrl-D')):
    c = Chat()
    c.wait_prompt(0)
    c.send(keys)
    rc = c.exit_code()
    c.check(rc == 0, '%s: exit code %d, expected 0' % (name, rc))
    print('ok   %s leaves (exit code 0)' % name)
print('interactive spark-chat: ok')
PY
