"""What spark-server's end-to-end tests (tests/tools/server_*.py) share: the server on a free port."""
import re
import subprocess
import threading
from pathlib import Path

HANG_S = 300  # only guards against a hang (CI machines are loaded 2-core boxes), never a pacing delay


class ServerError(Exception):
    pass


class Server:
    """spark-server --port 0 ARGS. It prints "spark-server: listening on http://HOST:PORT" once ready;
    its output is kept (log() shows the last lines on a failure)."""

    def __init__(self, build, args):
        self.cmd = [str(Path(build) / 'tools/server/spark-server'), '--port', '0', *args]
        self.lines = []
        self.ready = threading.Event()  # the "listening on" line, or the end of the output
        self.url = None
        self.port = None
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):  # keeps the pipe drained for as long as the server runs
        for raw in self.proc.stdout:
            line = raw.decode('utf-8', 'replace').rstrip('\n')
            self.lines.append(line)
            m = re.search(r'listening on (http://[^:/\s]+:(\d+))', line)
            if m and self.url is None:
                self.url, self.port = m.group(1), int(m.group(2))
                self.ready.set()
        self.ready.set()

    def wait_ready(self):
        """Waits for the "listening on" line; returns the base URL."""
        if not self.ready.wait(HANG_S):
            raise ServerError('spark-server did not say "listening on" in %.0f s: %s' % (HANG_S, ' '.join(self.cmd)))
        if self.url is None:
            raise ServerError('spark-server exited (code %s) before listening: %s\n%s' % (self.proc.wait(), ' '.join(self.cmd), self.log()))
        return self.url

    def check_alive(self, when):
        code = self.proc.poll()
        if code is not None:
            raise ServerError('spark-server died %s (exit code %s)' % (when, code))

    def rss_kb(self):
        """VmRSS of the server process, in kB."""
        with open('/proc/%d/status' % self.proc.pid) as f:
            for line in f:
                if line.startswith('VmRSS:'):
                    return int(line.split()[1])
        raise ServerError('no VmRSS in /proc/%d/status' % self.proc.pid)

    def log(self, n=40):
        return '\n'.join(self.lines[-n:])

    def stop(self):
        """SIGTERM; returns the exit code (documented: 0), None if it had to be killed."""
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.terminate()
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None
