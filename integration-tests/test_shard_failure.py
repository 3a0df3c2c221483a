"""A shard that dies mid-generation: its requests fail fast with 424 (never hang), health
turns 503, and serving resumes when a shard answers on the socket again."""

import json
import subprocess
import threading
import time

import requests

from conftest import DATA_DIR
from sonde_http import generate, post

FAIL_WITHIN_S = 5
RECOVER_WITHIN_S = 30


def _stream_events(server, out):
    body = {"inputs": "Once upon a time", "parameters": {"max_new_tokens": 400}}
    with requests.post(server.url + "/generate_stream", json=body, stream=True, timeout=120) as r:
        out["status"] = r.status_code
        for line in r.iter_lines():
            if line.startswith(b"data:"):
                out.setdefault("events", []).append(json.loads(line[5:]))
    out["ended_at"] = time.monotonic()


def _generate(server, out):
    r = post(server, "/generate", {"inputs": "Once upon a time", "parameters": {"max_new_tokens": 400}},
             timeout=120)
    out["status"], out["body"], out["ended_at"] = r.status_code, r.json(), time.monotonic()


def test_killed_shard_fails_requests_fast_and_recovers(launch):
    server = launch(name="sonde-shard-failure")
    streamed, plain = {}, {}
    threads = [threading.Thread(target=_stream_events, args=(server, streamed)),
               threading.Thread(target=_generate, args=(server, plain))]
    for t in threads:
        t.start()
    # Kill only once both requests are generating, so the failure hits a running batch.
    deadline = time.monotonic() + 60
    while len(streamed.get("events", [])) < 3:
        assert time.monotonic() < deadline, f"the stream never started: {streamed}"
        time.sleep(0.05)
    server.kill_shard()
    killed_at = time.monotonic()
    for t in threads:
        t.join(FAIL_WITHIN_S + 5)
        assert not t.is_alive(), "a request hung after its shard died"

    assert plain["status"] == 424, plain
    assert plain["body"]["error_type"] == "generation", plain
    assert plain["ended_at"] - killed_at < FAIL_WITHIN_S
    last = streamed["events"][-1]
    assert streamed["status"] == 200 and last.get("error_type") == "generation", last
    assert streamed["ended_at"] - killed_at < FAIL_WITHIN_S

    r = requests.get(server.url + "/health", timeout=10)
    assert r.status_code == 503 and r.json()["error_type"] == "healthcheck", r.text
    # New requests are refused as "not ready" (retryable), not accepted and then lost.
    r = post(server, "/generate", {"inputs": "Hello", "parameters": {"max_new_tokens": 2}})
    assert r.status_code == 503, r.text

    server.restart_shard()
    deadline = time.monotonic() + RECOVER_WITHIN_S
    while requests.get(server.url + "/health", timeout=10).status_code != 200:
        assert time.monotonic() < deadline, f"health not back {RECOVER_WITHIN_S} s after the restart"
        time.sleep(0.2)
    # Health came back through the handshake: the new process was asked what it serves and
    # warmed before the router served it.
    assert "serves the same model and is warm" in server.router_log(), server.log_tails()
    out = generate(server, "Once upon a time", max_new_tokens=4, details=True)
    assert out["details"]["generated_tokens"] == 4


def test_a_shard_restarted_on_another_model_stops_the_router(launch):
    """The launcher restarts a dead shard with the same command, but a file changed under
    it (or a bug) could bring back something else: the router must not serve it with the
    first model's tokenizer, limits and name."""
    other = DATA_DIR / "models" / "smollm2-hf-f32"
    assert other.is_dir(), f"{other} is missing: scripts/test builds it (scripts/gguf_to_hf.py)"
    server = launch(name="sonde-shard-swap")
    server.kill_shard()
    server.restart_shard(model=other)
    router = server.procs["router"]
    try:
        code = router.wait(RECOVER_WITHIN_S)
    except subprocess.TimeoutExpired:
        code = None
    log = server.router_log()
    assert code not in (None, 0), f"the router kept running (or exited 0) on another model:\n{log[-3000:]}"
    assert "serves something else than it did at startup" in log, log[-3000:]
