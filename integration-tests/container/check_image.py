"""The container image, run as Vertex AI runs it and as a person runs it, checked from outside.

scripts/container-test builds the image and runs this file with SONDE_IMAGE (the image),
SONDE_PODMAN (podman and its global flags) and SONDE_PODMAN_RUN_ARGS (rlimits) set. The file
name has no test_ prefix, so `pytest integration-tests` (scripts/test) does not collect it:
it needs the image, which only that script builds.
"""

import math
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fake_gcs  # noqa: E402  (integration-tests/, beside this folder)
from sonde_http import assert_loading_then_ready, ok_json, watch_health  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DATA_DIR = Path(os.environ.get("SONDE_DATA_DIR", REPO / "data"))
MODEL = DATA_DIR / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
IMAGE = os.environ.get("SONDE_IMAGE", "")
PODMAN = shlex.split(os.environ.get("SONDE_PODMAN", "podman"))
RUN_ARGS = shlex.split(os.environ.get("SONDE_PODMAN_RUN_ARGS", ""))
START_TIMEOUT_S = 180
PROMPT = "Once upon a time"
VERTEX_PORT = 7080  # not the image's 8080: the router must take AIP_HTTP_PORT
HEALTH_ROUTE = "/v1/endpoints/123/deployedModels/456/health"
PREDICT_ROUTE = "/v1/endpoints/123/deployedModels/456:predict"


def podman(*args, check=True, timeout=120):
    out = subprocess.run([*PODMAN, *map(str, args)], capture_output=True, text=True,
                         timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"podman {shlex.join(map(str, args))} exited {out.returncode}:\n"
                             f"{out.stdout}{out.stderr}")
    return out


@pytest.fixture(scope="session", autouse=True)
def image():
    if not IMAGE:
        pytest.fail("SONDE_IMAGE is not set: run scripts/container-test, which builds the image "
                    "and runs these checks", pytrace=False)
    if podman("image", "exists", IMAGE, check=False).returncode != 0:
        pytest.fail(f"image {IMAGE} does not exist: run scripts/container-test", pytrace=False)
    return IMAGE


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Container:
    """One `podman run -d` of the image; `options` go before the image, `args` after it."""

    def __init__(self, name, options=(), args=(), port=None, health_route="/health"):
        self.name = f"sonde-ct-{name}-{os.getpid()}"
        self.options = [str(o) for o in options]
        self.args = [str(a) for a in args]
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.health_route = health_route

    def start(self):
        podman("rm", "-f", "--ignore", self.name)  # a leftover of an interrupted run
        podman("run", "-d", "--name", self.name, *RUN_ARGS, *self.options, IMAGE, *self.args)
        return self

    def running(self):
        return self.inspect("{{.State.Running}}") == "true"

    def inspect(self, fmt):
        return podman("inspect", "--format", fmt, self.name).stdout.strip()

    def logs(self, tail=80):
        out = podman("logs", "--tail", tail, self.name, check=False)
        return out.stdout + out.stderr

    def wait_healthy(self):
        """Watches the health route until 200 (`sonde_http.watch_health`); returns what it
        saw."""
        return watch_health(self.url + self.health_route, self.running, self.exit_and_logs,
                            START_TIMEOUT_S)

    def exit_and_logs(self):
        return f"exit code {self.inspect('{{.State.ExitCode}}')}, log:\n{self.logs()}"

    def wait_exit(self, timeout):
        out = podman("wait", self.name, timeout=timeout)
        return int(out.stdout.strip().splitlines()[-1])

    def users_and_commands(self):
        """(user, command line) of every process in the container, read from the host."""
        out = podman("top", self.name, "user", "args").stdout.splitlines()
        return [tuple(line.split(None, 1)) for line in out[1:] if line.strip()]

    def remove(self):
        podman("rm", "-f", "--ignore", "-t", "0", self.name, check=False)


@pytest.fixture
def container():
    started = []

    def make(*a, start=True, **kw):
        c = Container(*a, **kw)
        started.append(c)
        return c.start() if start else c

    yield make
    for c in started:
        c.remove()


def assert_logprob(x, what):
    assert isinstance(x, float) and math.isfinite(x) and x <= 0, f"{what}: {x!r}"


# --- as Vertex AI runs it ----------------------------------------------------------------------

def test_as_vertex_runs_it(container):
    port = free_port()
    c = container("vertex", port=port, health_route=HEALTH_ROUTE, options=[
        "-p", f"127.0.0.1:{port}:{VERTEX_PORT}",
        "-e", f"AIP_HTTP_PORT={VERTEX_PORT}",
        "-e", f"AIP_HEALTH_ROUTE={HEALTH_ROUTE}",
        "-e", f"AIP_PREDICT_ROUTE={PREDICT_ROUTE}",
        # A launcher flag by its TGI variable, as `gcloud ai models upload
        # --container-env-vars` sets it (the README's example).
        "-e", "ENABLE_PREFILL_LOGPROBS=true",
    ])
    assert_loading_then_ready(c.wait_healthy(), c.logs)
    # Plain log lines for Cloud Logging and `docker logs`, not terminal colour codes.
    assert "\x1b[" not in c.logs(), c.logs()

    # Vertex predict with token, top-N and prompt scores.
    params = {"max_new_tokens": 4, "details": True, "top_n_tokens": 3,
              "decoder_input_details": True}
    body = {"instances": [{"inputs": PROMPT, "parameters": params}]}
    [pred] = ok_json(requests.post(c.url + PREDICT_ROUTE, json=body, timeout=120))["predictions"]
    details = pred["details"]
    assert details["generated_tokens"] == len(details["tokens"]) == 4, details
    for i, tok in enumerate(details["tokens"]):
        assert_logprob(tok["logprob"], f"tokens[{i}]")
    assert all(len(top) == 3 for top in details["top_tokens"]), details["top_tokens"]
    prefill = details["prefill"]
    assert len(prefill) >= 4 and prefill[0]["logprob"] is None, prefill
    for i, tok in enumerate(prefill[1:], 1):
        assert_logprob(tok["logprob"], f"prefill[{i}]")

    # OpenAI chat with logprobs, through OpenAI's own client.
    client = OpenAI(base_url=c.url + "/v1", api_key="unused", timeout=120, max_retries=0)
    chat = client.chat.completions.create(
        model="sonde", messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=5, temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens > 0, chat
    for i, entry in enumerate(content):
        assert_logprob(entry.logprob, f"content[{i}]")
        assert len(entry.top_logprobs) == 2, entry
        # Greedy: the chosen token is the most likely one.
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-6), entry

    # Every process runs as the image's non-root user.
    procs = c.users_and_commands()
    assert {user for user, _ in procs} == {"sonde"}, procs
    for binary in ("sonde-launcher", "sonde-router", "sonde-shard"):
        assert any(binary in cmd for _, cmd in procs), f"no {binary} in {procs}"
    assert c.inspect("{{.Config.User}}") == "sonde"


# --- as a person runs it -----------------------------------------------------------------------

def test_as_a_person_runs_it_arguments_reach_the_launcher(container):
    port = free_port()
    c = container("person", port=port, options=["-p", f"127.0.0.1:{port}:8080"],
                  args=["--enable-prefill-logprobs", "--max-top-n-tokens", "10"])
    assert_loading_then_ready(c.wait_healthy(), c.logs)

    # --enable-prefill-logprobs: prompt logprobs come back (off by default: a 422).
    params = {"max_new_tokens": 2, "details": True, "decoder_input_details": True,
              "top_n_tokens": 10}
    out = ok_json(requests.post(c.url + "/generate", json={"inputs": PROMPT, "parameters": params},
                                timeout=120))
    prefill = out["details"]["prefill"]
    assert len(prefill) >= 4 and prefill[0]["logprob"] is None, prefill
    for i, tok in enumerate(prefill[1:], 1):
        assert_logprob(tok["logprob"], f"prefill[{i}]")
    # --max-top-n-tokens 10: ten alternatives allowed (the default allows 5), eleven not.
    assert all(len(top) == 10 for top in out["details"]["top_tokens"]), out["details"]
    params["top_n_tokens"] = 11
    r = requests.post(c.url + "/generate", json={"inputs": PROMPT, "parameters": params},
                      timeout=120)
    assert r.status_code == 422 and "10" in r.json()["error"], r.text


def test_sigterm_lets_requests_in_flight_finish_and_exits_0(container):
    port = free_port()
    c = container("stop", port=port, options=["-p", f"127.0.0.1:{port}:8080"])
    c.wait_healthy()
    n = 4
    results = [None] * n

    def run(i):
        body = {"inputs": f"Story {i}: once upon a time",
                "parameters": {"max_new_tokens": 48, "details": True}}
        results[i] = requests.post(c.url + "/generate", json=body, timeout=300)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while running_requests(c) < n:
        assert time.monotonic() < deadline, f"the requests never all ran:\n{c.logs()}"
        time.sleep(0.05)
    # `podman stop` sends SIGTERM to the container's first process (the entrypoint execs the
    # launcher); its grace here outlasts the drain, so a SIGKILL would mean a stuck drain.
    stopped = time.monotonic()
    podman("stop", "-t", "120", c.name, timeout=180)
    took = time.monotonic() - stopped
    for t in threads:
        t.join(120)
    for i, r in enumerate(results):
        assert r is not None, f"request {i} never answered"
        details = ok_json(r)["details"]
        assert details["finish_reason"] in ("length", "eos_token"), details
        assert details["generated_tokens"] == len(details["tokens"]) > 0, details
    code = int(c.inspect("{{.State.ExitCode}}"))
    assert code == 0, f"exit code {code} after SIGTERM ({took:.1f} s):\n{c.logs()}"
    assert took < 100, f"stop took {took:.1f} s: killed, not drained?\n{c.logs()}"


@pytest.fixture
def silent_hub():
    """A Hugging Face Hub that accepts connections and never answers: a model download that
    lasts as long as the test wants."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held = []
    stop = threading.Event()

    def hold():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


def test_sigterm_while_the_model_downloads_stops_at_once(container, silent_hub):
    port = free_port()
    c = container("stop-loading", port=port, options=[
        "--network", "host", "-e", f"HF_ENDPOINT={silent_hub}", "-e", f"AIP_HTTP_PORT={port}",
        "-e", "MODEL_ID=HuggingFaceTB/SmolLM2-135M-Instruct",
    ])
    deadline = time.monotonic() + 60
    while True:  # loading: the port answers 503 (once the launcher is up)
        try:
            status = requests.get(c.url + "/health", timeout=5).status_code
            break
        except requests.ConnectionError:
            assert time.monotonic() < deadline and c.running(), c.logs()
            time.sleep(0.05)
    assert status == 503, status
    stopped = time.monotonic()
    podman("stop", "-t", "30", c.name, timeout=60)
    took = time.monotonic() - stopped
    code = int(c.inspect("{{.State.ExitCode}}"))
    # 137 would be SIGKILL at the end of the grace: the SIGTERM was lost.
    assert took < 10 and code in (0, 143), f"stop took {took:.1f} s, exit {code}:\n{c.logs()}"


def running_requests(c):
    for line in requests.get(c.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("sonde_batch_current_size"):
            return float(line.split()[-1])
    return 0


# --- a model from gs://, as Vertex hands it over ------------------------------------------------

BUCKET, FOLDER = "models", "smollm2"


@pytest.fixture
def gcs(tmp_path):
    """The tests' stand-in for GCS (integration-tests/fake_gcs.py) on the host's loopback,
    serving the default model; the container reaches it through host networking."""
    if not MODEL.is_file():
        pytest.fail(f"model {MODEL} is missing: run scripts/fetch-data model", pytrace=False)
    with fake_gcs.serving(tmp_path, MODEL, f"{BUCKET}/{FOLDER}/{MODEL.name}") as served:
        os.chmod(served.credentials, 0o644)  # read inside the container by the non-root user
        yield served


def test_model_from_gcs_downloads_into_the_users_cache(container, gcs):
    port = free_port()
    uri = f"gs://{BUCKET}/{FOLDER}"
    c = container("gcs", port=port, health_route="/ping", start=False, options=[
        "--network", "host",
        "-v", f"{gcs.credentials}:/run/sonde/service-account.json:ro",
        "-e", "GOOGLE_SERVICE_ACCOUNT=/run/sonde/service-account.json",
        "-e", f"AIP_HTTP_PORT={port}",
        "-e", "AIP_HEALTH_ROUTE=/ping",
        "-e", f"AIP_STORAGE_URI={uri}",
    ])
    # Held mid-download (the stand-in cuts every transfer of the model after 10 MB, the
    # launcher retries): health must already answer, with 503, as it does for a model of
    # gigabytes on Vertex for minutes; a refused connection reads as a dead container.
    gcs.control(f"fail?object={BUCKET}/{FOLDER}/{MODEL.name}&after=10000000")
    c.start()
    # The launcher's retries of a cut transfer are over in seconds: poll the stand-in
    # alone (podman is slow to ask), then probe and lift the cut at once.
    deadline = time.monotonic() + 60
    while gcs.gets() < 2:
        assert time.monotonic() < deadline, f"the download never started:\n{c.logs()}"
        time.sleep(0.02)
    try:
        status = requests.get(c.url + "/ping", timeout=10).status_code
    except requests.ConnectionError as e:
        status = f"refused ({e.__class__.__name__})"
    assert status == 503, f"health while the model downloads: {status}\n{c.logs()}"
    gcs.control("fail")  # the next retry gets the rest
    c.wait_healthy()
    assert gcs.gets() >= 3, f"the model was not fetched from the stand-in:\n{c.logs()}"
    assert ok_json(requests.get(c.url + "/info", timeout=10))["model_id"] == uri

    # The copy lies in the non-root user's cache, owned by it, byte for byte the model.
    found = podman("exec", c.name, "find", "/home/sonde/.cache/sonde", "-name", "*.gguf",
                   "-printf", "%u %s %p\\n").stdout.split("\n")
    found = [line.split(" ", 2) for line in found if line]
    assert len(found) == 1, found
    owner, size, path = found[0]
    assert owner == "sonde" and int(size) == MODEL.stat().st_size, found
    digest = podman("exec", c.name, "sha256sum", path).stdout.split()[0]
    want = subprocess.run(["sha256sum", str(MODEL)], capture_output=True, text=True,
                          check=True).stdout.split()[0]
    assert digest == want

    body = {"instances": [{"inputs": PROMPT, "parameters": {"max_new_tokens": 3, "details": True}}]}
    [pred] = ok_json(requests.post(c.url + "/predict", json=body, timeout=120))["predictions"]
    assert pred["details"]["generated_tokens"] == 3


# --- bad input: exit non-zero with one clear line ----------------------------------------------

def exits_with(c, timeout=120):
    """Waits for the container to exit; returns (exit code, its log)."""
    code = c.wait_exit(timeout)
    return code, c.logs(200)


def test_missing_model_exits_non_zero_naming_it(container):
    c = container("nomodel", options=["-e", "MODEL_ID=/models/nowhere.gguf"], port=0)
    code, logs = exits_with(c)
    assert code != 0, logs
    assert [line for line in logs.splitlines()
            if "/models/nowhere.gguf" in line and "does not exist" in line], logs


def test_unreachable_storage_uri_exits_non_zero_naming_it(container, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    creds = tmp_path / "service-account.json"
    creds.write_text(f'{{"gcs_base_url": "http://127.0.0.1:{closed}", "disable_oauth": true, '
                     '"client_email": "", "private_key": "", "private_key_id": ""}')
    creds.chmod(0o644)
    c = container("nogcs", port=0, options=[
        "--network", "host",
        "-v", f"{creds}:/run/sonde/service-account.json:ro",
        "-e", "GOOGLE_SERVICE_ACCOUNT=/run/sonde/service-account.json",
        "-e", f"AIP_HTTP_PORT={free_port()}",
        "-e", "AIP_STORAGE_URI=gs://models/smollm2",
    ])
    code, logs = exits_with(c, timeout=300)
    assert code != 0, logs
    assert [line for line in logs.splitlines() if "gs://models/smollm2" in line
            and ("reach" in line or "connect" in line)], logs


def test_unwritable_cache_exits_non_zero_naming_it(container, gcs):
    # The cache pointed at a folder the non-root user cannot create.
    c = container("rocache", port=0, options=[
        "--network", "host",
        "-v", f"{gcs.credentials}:/run/sonde/service-account.json:ro",
        "-e", "GOOGLE_SERVICE_ACCOUNT=/run/sonde/service-account.json",
        "-e", f"AIP_HTTP_PORT={free_port()}",
        "-e", "AIP_STORAGE_URI=gs://models/smollm2",
        "-e", "SONDE_CACHE_DIR=/opt/sonde/cache",
    ])
    code, logs = exits_with(c)
    assert code != 0, logs
    assert [line for line in logs.splitlines() if "/opt/sonde/cache" in line], logs
