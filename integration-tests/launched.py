"""Runs the real launcher (or the README's command, or entrypoint.sh) as a user would.

Unlike conftest's SondeServer, which starts the shard and the router by hand, this starts one
command and lets Sonde's own supervisor do the rest.
"""

import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import requests

from conftest import BIN_DIR, DATA_DIR, DEVICE_ARGS, REPO, RUN_DIR, Scraped, _free_port, _tail

START_TIMEOUT_S = 180


class Launched(Scraped):
    def __init__(self, cmd, env=None, port=None, name="launcher", health_route="/health"):
        self.dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=RUN_DIR))
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.health_route = health_route
        base = {k: v for k, v in os.environ.items() if not k.startswith("AIP_")}
        base.update({"SONDE_DATA_DIR": str(DATA_DIR), "NO_COLOR": "1", "SONDE_CACHE_DIR": str(self.dir / "cache")})
        base.update(env or {})
        self.env = base
        self.cmd = [str(c) for c in cmd]
        self.log_path = self.dir / "launcher.log"
        self.proc = None

    @property
    def uds_prefix(self):
        return self.dir / "shard"

    def start(self, wait=True):
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self.env)
        log.close()
        if wait:
            self.wait_healthy()
        return self

    def wait_healthy(self, timeout=START_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"launcher exited {self.proc.returncode} during startup:\n{self.logs()}")
            try:
                r = requests.get(self.url + self.health_route, timeout=5)
                if r.status_code == 200:
                    return
                last = f"{r.status_code} {r.text[:200]}"
            except requests.RequestException as e:
                last = repr(e)
            time.sleep(0.2)
        raise AssertionError(f"health not 200 after {timeout} s (last: {last}):\n{self.logs()}")

    def wait_healthy_again(self, since, within_s, what):
        """Waits for health 200 after a fault at `since` (monotonic), for at most
        `within_s` from it; returns the seconds it took."""
        deadline = since + within_s
        while requests.get(self.url + "/health", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, f"not healthy {within_s} s after {what}:\n{self.logs()}"
            time.sleep(0.1)
        return time.monotonic() - since

    def shard_pid(self):
        out = subprocess.run(["pgrep", "-f", f"sonde-shard .*{self.uds_prefix}-0"],
                             capture_output=True, text=True, check=False)
        pids = [int(p) for p in out.stdout.split()]
        assert len(pids) == 1, f"want one shard process, found {pids}"
        return pids[0]

    def wait_exit(self, timeout):
        return self.proc.wait(timeout)

    def logs(self, n=60):
        return _tail(self.log_path, n)

    def signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # The launcher stops its children; a test that killed the launcher itself must not
        # leave them behind.
        subprocess.run(["pkill", "-9", "-f", str(self.uds_prefix)], check=False)


def generating(server, n, run, within_s=60):
    """Starts `run(i)` for i < n, each in a thread, and returns the threads once the batch
    holds all n (generating, not queued): the moment a test of a fault or a signal means.
    `server` is a `conftest.Scraped` (Launched, SondeServer)."""
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    server.wait_gauge("sonde_batch_current_size", n, within_s)
    return threads


def launcher_cmd(port, uds_prefix, *args):
    return [BIN_DIR / "sonde-launcher", "--port", port, "--hostname", "127.0.0.1",
            "--shard-uds-path", uds_prefix, *DEVICE_ARGS, *args]


def serve_cmd(port, uds_prefix, *args):
    """The README's command."""
    return [REPO / "scripts" / "serve", "--port", port, "--hostname", "127.0.0.1",
            "--shard-uds-path", uds_prefix, *args]
