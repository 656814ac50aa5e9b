"""serve_util.py - shared pieces of the `ckv serve` tests: start a server on a free loopback port
(it writes host:port to a file once listening), wait for /health, read its RSS, send raw HTTP, stop
it with SIGTERM and check that it exits 0. It holds no test cases."""
import http.client
import json
import os
import signal
import subprocess
import sys
import time

SKIP = 77
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOLLM2 = os.environ.get("CKV_SMOLLM2_GGUF", os.path.join(REPO, "models", "smollm2-135m-instruct-q4_1.gguf"))
QWEN_CODER = os.environ.get("CKV_QWEN_CODER_GGUF", os.path.join(REPO, "models", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))


SANITIZED = os.environ.get("CKV_TEST_SANITIZE", "0") not in ("", "0")  # the ASan + UBSan build (slow, more memory)


def ids(n, seed):
    """n token ids of the fixture vocabulary (3..502), a fixed function of seed: distinct prompts."""
    return [(seed * 7919 + i * 104729) % 500 + 3 for i in range(n)]


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(SKIP)


def require_server(ckv):
    """Skips when the ckv binary was built without the server (no libmicrohttpd)."""
    r = subprocess.run([ckv, "serve", "--help"], capture_output=True, text=True)
    if r.returncode != 0:
        skip("ckv was built without `ckv serve` (libmicrohttpd-dev missing at configure time): " + r.stderr.strip())


def require_openai():
    try:
        import openai  # noqa: F401
    except ImportError:
        skip("the `openai` Python package is not installed (tools/test.sh installs it into .venv-test from PyPI)")


def preamble(openai=True):
    """The preamble of every server test: its arguments (CKV_BINARY FIXTURES_DIR TMP_DIR) and the path of
    the fixture model llama_gqa, after skipping when ckv has no server or (openai) the client is missing."""
    if len(sys.argv) < 4:
        print(f"usage: {os.path.basename(sys.argv[0])} CKV_BINARY FIXTURES_DIR TMP_DIR", file=sys.stderr)
        sys.exit(2)
    ckv, fixtures, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
    require_server(ckv)
    if openai:
        require_openai()
    return ckv, fixtures, tmp, os.path.join(fixtures, "models", "llama_gqa")


class Server:
    """One `ckv serve` process."""

    def __init__(self, ckv, model, tmp, *args, name="srv", api_key=None, threads=2, launcher=None):
        """launcher: a command prefix such as [mpirun, -np, 2] (a tensor-parallel server)."""
        self.api_key = api_key
        self.launcher = launcher
        self.port_file = os.path.join(tmp, f"{name}.port")
        self.log_path = os.path.join(tmp, f"{name}.log")
        if os.path.exists(self.port_file):
            os.unlink(self.port_file)
        cmd = [*(launcher or []), ckv, "serve", "-m", model, "--port", "0", "--port-file", self.port_file, "-t", str(threads),
               *args]
        if api_key:
            cmd += ["--api-key", api_key]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        t_end = time.time() + 120
        while not os.path.exists(self.port_file):
            if self.proc.poll() is not None:
                raise RuntimeError(f"ckv serve exited with {self.proc.returncode}: {self.log_text()}")
            if time.time() > t_end:
                self.proc.kill()
                raise RuntimeError("ckv serve did not start within 120 s: " + self.log_text())
            time.sleep(0.05)
        self.endpoint = open(self.port_file).read().strip()
        self.host, port = self.endpoint.rsplit(":", 1)
        self.port = int(port)
        self.base_url = f"http://{self.endpoint}"
        status, _, _ = self.request("GET", "/health")
        if status != 200:
            raise RuntimeError(f"/health answered {status}")

    def log_text(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()[-4000:]

    def log_wait(self, text, seconds=30):
        """The log once it holds text (mpirun forwards a rank's stderr on its own time), or after seconds."""
        t_end = time.time() + seconds
        while text not in self.log_text() and time.time() < t_end:
            time.sleep(0.2)
        return self.log_text()

    def client(self, **kw):
        import openai
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=self.api_key or "none", max_retries=0, timeout=300, **kw)

    def request(self, method, path, body=None, headers=None, raw=None, timeout=300):
        """Returns (status, headers dict, body bytes)."""
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        h.update(headers or {})
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        out = (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        c.close()
        return out

    def metrics(self):
        _, _, body = self.request("GET", "/metrics")
        vals = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                vals[k] = float(v)
        return vals

    def rss(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def rank0_pid(self):
        """The pid of rank 0 under the launcher (the child whose environment says rank 0)."""
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid != self.proc.pid:
                    continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                if b"OMPI_COMM_WORLD_RANK=0" in env or b"PMIX_RANK=0" in env:
                    return int(pid)
            except (OSError, ValueError, IndexError):
                continue
        return None

    def stop(self, timeout=60):
        """SIGTERM (to rank 0 under a launcher: it drains and stops the other ranks); returns the exit code."""
        if self.proc.poll() is None:
            pid = self.rank0_pid() if self.launcher else self.proc.pid
            os.kill(pid or self.proc.pid, signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
            raise RuntimeError(f"ckv serve did not stop within {timeout} s of SIGTERM")
        self.log.close()
        return rc


class Checks:
    """Collects failures; every check prints what it compared."""

    def __init__(self):
        self.failed = []

    def check(self, cond, what, detail=""):
        print(("PASS " if cond else "FAIL ") + what + (f"  [{detail}]" if detail and not cond else ""), flush=True)
        if not cond:
            self.failed.append(what + (f": {detail}" if detail else ""))
        return cond

    def finish(self):
        if self.failed:
            print(f"{len(self.failed)} check(s) failed:")
            for f in self.failed:
                print("  " + f)
            sys.exit(1)
        print("all checks passed")
        sys.exit(0)
