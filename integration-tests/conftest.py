"""Starts real Sonde processes (one shard + the router on the real model) for the e2e tests.

Binaries come from $SONDE_BIN_DIR (default <repo>/target/debug), data from $SONDE_DATA_DIR
(default <repo>/data); SONDE_E2E_KEEP_LOGS=1 keeps each server's temp dir and logs. Nothing is skipped: a missing binary or model fails loudly, so a
green run always means the tests ran.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[1]
BIN_DIR = Path(os.environ.get("SONDE_BIN_DIR", REPO / "target" / "debug"))
DATA_DIR = Path(os.environ.get("SONDE_DATA_DIR", REPO / "data"))
MODEL = DATA_DIR / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
FORWARD_JSON = DATA_DIR / "reference" / "forward.json"
# SONDE_E2E_DEVICE=cuda serves the tests' models on that device (scripts/gpu-check does).
DEVICE = os.environ.get("SONDE_E2E_DEVICE")
DEVICE_ARGS = ["--device", DEVICE] if DEVICE else []
START_TIMEOUT_S = 120
STOP_GRACE_S = 10
LOG_TAIL_LINES = 40

# Servers alive right now, so a failing test can show what the router and shard logged.
_LIVE = []

# Servers started through the launcher (launched.py) keep their logs and model copies here
# until the run ends: tests read a launcher's log after stopping it. Removed at the end of
# the run, so repeated runs do not fill the disk.
RUN_DIR = Path(tempfile.mkdtemp(prefix="sonde-e2e-"))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path, n=LOG_TAIL_LINES):
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError as e:
        return f"<no log: {e}>"
    return "\n".join(lines[-n:])


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text):
    """Prometheus text -> {'name{k="v",...}': value}, labels sorted so keys are stable."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise ValueError(f"unparsable metrics line: {line!r}")
        name, labels, value = m.groups()
        if labels:
            pairs = sorted(_LABEL.findall(labels))
            name += "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"
        out[name] = float(value)
    return out


class Scraped:
    """What a running server's /metrics says; for any class with `url`."""

    def metrics(self):
        r = requests.get(self.url + "/metrics", timeout=30)
        assert r.status_code == 200, r.text[:500]
        return parse_prometheus(r.text)

    def gauge(self, name, m=None):
        m = self.metrics() if m is None else m
        # A gauge appears once the scheduler first reports; before that it is 0.
        return sum(v for k, v in m.items() if k == name or k.startswith(name + "{"))

    def wait_gauge(self, name, at_least, within_s=60):
        deadline = time.monotonic() + within_s
        while self.gauge(name) < at_least:
            assert time.monotonic() < deadline, f"{name} never reached {at_least}"
            time.sleep(0.05)


class SondeServer(Scraped):
    """One shard and one router in a temp dir; logs go to shard.log and router.log there."""

    def __init__(self, router_args=(), env=None, name="sonde", shard_args=()):
        self.router_args = [str(a) for a in router_args]
        self.shard_args = [str(a) for a in shard_args]
        self.extra_env = dict(env or {})
        self.name = name
        self.dir = None
        self.port = None
        self.url = None
        self.procs = {}

    def _binary(self, name):
        path = BIN_DIR / name
        if not os.access(path, os.X_OK):
            pytest.fail(
                f"{path} is missing or not executable: build it (cargo build --workspace) "
                f"or point SONDE_BIN_DIR at the folder holding sonde-shard and sonde-router",
                pytrace=False,
            )
        return str(path)

    def _spawn(self, name, cmd, env):
        log = open(self.dir / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        log.close()

    def _fail(self, why):
        logs = self.log_tails()
        self.stop()
        pytest.fail(f"{why}\n{logs}", pytrace=False)

    def _check_alive(self):
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                self._fail(f"sonde-{name} exited with status {proc.returncode} during startup")

    def start(self):
        if not MODEL.is_file():
            pytest.fail(f"model {MODEL} is missing: run scripts/fetch-data model", pytrace=False)
        shard_bin, router_bin = self._binary("sonde-shard"), self._binary("sonde-router")
        self.dir = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
        # An outer AIP_* (e.g. on a Vertex host) must not move our port or routes.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIP_")}
        env.setdefault("RUST_BACKTRACE", "1")
        env.setdefault("NO_COLOR", "1")  # plain log files
        prefix = self.dir / "shard"
        uds = Path(f"{prefix}-0")
        self._shard_cmd = [shard_bin, "--model", str(MODEL), "--uds-path", str(uds),
                           *DEVICE_ARGS, *self.shard_args]
        self._shard_env = env
        self._shard_uds = uds
        self._spawn("shard", self._shard_cmd, env)
        # The launcher's job in production: start the router once the shard's socket exists.
        deadline = time.monotonic() + START_TIMEOUT_S
        while not uds.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                self._fail(f"shard socket {uds} did not appear in {START_TIMEOUT_S} s")
            time.sleep(0.05)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [router_bin, "--model", str(MODEL), "--shard-uds-path", str(prefix),
               "--num-shard", "1", "--port", str(self.port), "--hostname", "127.0.0.1",
               *self.router_args]
        self._spawn("router", cmd, {**env, **self.extra_env})
        _LIVE.append(self)
        self._wait_healthy(deadline)
        if DEVICE and (served := self.info()["model_device_type"]) != DEVICE:
            self._fail(f"the model is served on {served}, not on SONDE_E2E_DEVICE={DEVICE}")
        return self

    def _wait_healthy(self, deadline):
        last = "no answer yet"
        while True:
            self._check_alive()
            try:
                r = requests.get(self.url + "/health", timeout=5)
                if r.status_code == 200:
                    return
                last = f"{r.status_code} {r.text[:200]}"
            except requests.RequestException as e:
                last = repr(e)
            if time.monotonic() > deadline:
                self._fail(f"{self.url}/health not 200 after {START_TIMEOUT_S} s (last: {last})")
            time.sleep(0.2)

    def kill_shard(self):
        """SIGKILL, as the OOM killer or a crash would."""
        proc = self.procs["shard"]
        proc.kill()
        proc.wait()

    def restart_shard(self, model=None):
        """What the launcher does after a shard died: the same command on the same socket
        (or, to test the router's handshake, the command with another model)."""
        self._shard_uds.unlink(missing_ok=True)
        cmd = list(self._shard_cmd)
        if model is not None:
            cmd[cmd.index("--model") + 1] = str(model)
        self._spawn("shard", cmd, self._shard_env)

    def router_log(self):
        return (self.dir / "router.log").read_text(errors="replace")

    def log_tails(self):
        return "\n".join(f"--- {self.dir / name}.log ---\n{_tail(self.dir / (name + '.log'))}"
                         for name in self.procs)

    def info(self):
        r = requests.get(self.url + "/info", timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    def stop(self):
        # Router first, so it is not left answering for a dead shard.
        for name in ("router", "shard"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self in _LIVE:
            _LIVE.remove(self)
        # Failing tests already carry the log tails in their report; keep the files on ask.
        if self.dir and not os.environ.get("SONDE_E2E_KEEP_LOGS"):
            shutil.rmtree(self.dir, ignore_errors=True)


def start_server(router_args=(), env=None, name="sonde", shard_args=()):
    return SondeServer(router_args, env, name, shard_args).start()


@pytest.fixture(scope="session")
def server():
    s = start_server(["--enable-prefill-logprobs"], name="sonde-main")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def plain_server():
    s = start_server([], name="sonde-plain")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def auth_server():
    s = start_server(["--api-key", "test-secret"], name="sonde-auth")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def launch():
    """Starts extra servers with their own flags/env; all are stopped when the module ends."""
    started = []

    def _launch(router_args=(), env=None, name="sonde-extra", shard_args=()):
        s = start_server(router_args, env, name, shard_args)
        started.append(s)
        return s

    yield _launch
    for s in started:
        s.stop()


@pytest.fixture(scope="session")
def reference():
    if not FORWARD_JSON.is_file():
        pytest.fail(f"{FORWARD_JSON} is missing: run scripts/test once to compute it",
                    pytrace=False)
    return json.loads(FORWARD_JSON.read_text())


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("SONDE_E2E_KEEP_LOGS"):
        print(f"\nsonde logs kept in {RUN_DIR}")
    else:
        shutil.rmtree(RUN_DIR, ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed and _LIVE:
        for s in _LIVE:
            report.sections.append((f"sonde logs (SONDE_E2E_KEEP_LOGS=1 keeps {s.dir})",
                                    s.log_tails()))
    return report
