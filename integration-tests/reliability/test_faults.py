"""Faults, on the real launcher: clients that never read their stream, and a shard that
hangs (SIGSTOP). For each, what the other clients see, how long recovery takes, and that
every accepted request gets an answer or an error. (A killed shard and clients dropping
mid-stream are covered by test_launcher.py and test_disconnect.py.)"""

import json
import os
import signal
import threading
import time

import pytest
import requests

import harness
from launched import generating
from sonde_http import assert_error, ok_json, sse_events

STEP_TIMEOUT_S = 3
MAX_CONCURRENT = 12
SLOW_READERS = 8
# Liveness: checks every 1 s, 2 s each, 3 missed in a row (launcher/src/liveness.rs), then a
# 1 s back-off and a shard start of about a second.
RECOVER_WITHIN_S = 30
PROMPTS = [f"Recipe {i}: to bake bread, first" for i in range(4)]
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def lz():
    s = harness.start("--shard-step-timeout", STEP_TIMEOUT_S,
                      "--max-concurrent-requests", MAX_CONCURRENT, name="faults")
    yield s
    s.stop()


# The silent streams' 400 tokens of ~6 KB events: on loopback the server's send buffer
# grows to ~4 MB, so their writes do not block (and --http-write-timeout does not drop
# them); what this shows is that a client's reading pace never holds up the scheduler or
# the other clients, and that its slot is freed when it goes away. (Streams that do
# overflow the buffers: test_connections.py.)
SILENT_TOKENS = 400


def _concurrent(lz, bodies):
    """Sends the bodies at once; their (status, json, seconds) in order."""
    out = [None] * len(bodies)

    def one(i):
        started = time.monotonic()
        r = harness.post(lz, "/generate", bodies[i], timeout=60)
        out[i] = (r.status_code, r.json(), time.monotonic() - started)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert all(o is not None for o in out), f"requests did not finish: {out}"
    return out


def test_clients_that_never_read_do_not_stall_others_and_free_their_slots(lz):
    want = harness.references(lz, PROMPTS, NEW_TOKENS)
    socks = [harness.silent_stream(lz, i, SILENT_TOKENS) for i in range(SLOW_READERS)]
    try:
        lz.wait_gauge("sonde_batch_current_size", SLOW_READERS)
        # The slots left over serve other clients, with the right answers, meanwhile.
        bodies = [harness.gen_body(p, NEW_TOKENS) for p in PROMPTS]
        served = _concurrent(lz, bodies)
        for (status, body, _), p in zip(served, PROMPTS):
            assert status == 200, body
            harness.assert_generation(body, want[p], NEW_TOKENS, p)
        # The silent streams were still generating all along: closing them is what ends them.
        running = lz.gauge("sonde_batch_current_size")
        assert running >= SLOW_READERS, f"the silent streams ended early ({running} running)"
    finally:
        for s in socks:
            s.close()
    freed_s = harness.wait_idle(lz, within_s=10)
    # Every slot is free again: all MAX_CONCURRENT at once are accepted, none gets a 429.
    bodies = [harness.gen_body(PROMPTS[i % len(PROMPTS)], NEW_TOKENS) for i in range(MAX_CONCURRENT)]
    after = _concurrent(lz, bodies)
    assert [s for s, _, _ in after] == [200] * MAX_CONCURRENT, [(s, b) for s, b, _ in after]
    harness.report("slow_readers", {
        "silent_streams": SLOW_READERS,
        "others_served_max_s": round(max(t for _, _, t in served), 2),
        "freed_after_close_s": round(freed_s, 2),
    })


def _hanging_request(lz, i, out):
    body = {"inputs": f"Tale {i}: long ago", "parameters": {"max_new_tokens": 300}}
    try:
        if i == 0:  # one of them streams: its error comes as the last event
            with requests.post(lz.url + "/generate_stream", json=body, stream=True,
                               timeout=60) as r:
                out[i] = ("stream", r.status_code, list(sse_events(r)), time.monotonic())
        else:
            r = harness.post(lz, "/generate", body, timeout=60)
            out[i] = ("json", r.status_code, r.json(), time.monotonic())
    except requests.RequestException as e:
        out[i] = ("exception", None, repr(e), time.monotonic())


def test_stopped_shard_fails_its_requests_with_424_and_is_restarted(lz):
    harness.wait_idle(lz)
    out = [None] * 4
    threads = generating(lz, 4, lambda i: _hanging_request(lz, i, out))
    old = lz.shard_pid()
    os.kill(old, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        for t in threads:
            t.join(STEP_TIMEOUT_S + 10)
        assert not any(t.is_alive() for t in threads), "a request hung on the stopped shard"
        failed_after = []
        for i, (kind, status, body, at) in enumerate(out):
            if kind == "stream":
                assert status == 200 and body, (i, status, body)
                assert body[-1].get("error_type") == "generation", (i, body[-1])
            else:
                assert kind == "json" and status == 424, (i, kind, status, body)
                assert body["error_type"] == "generation", body
            assert "no answer within" in json.dumps(body), body
            failed_after.append(at - stopped)
        # ~the deadline: the step running at SIGSTOP began a little before it.
        assert max(failed_after) < STEP_TIMEOUT_S + 2, failed_after

        # Meanwhile nothing new is accepted and then lost: health and requests say 503.
        r = requests.get(lz.url + "/health", timeout=10)
        assert_error(r, 503, "healthcheck")
        assert_error(harness.post(lz, "/generate", harness.gen_body("Hello", 2)), 503)

        # The launcher notices the silence, kills the shard and starts a new one.
        recovered = lz.wait_healthy_again(stopped, RECOVER_WITHIN_S, "SIGSTOP")
    finally:
        try:
            os.kill(old, signal.SIGCONT)  # if it is still there, let the teardown stop it
        except ProcessLookupError:
            pass
    assert lz.shard_pid() != old
    logs = lz.logs(400)
    assert "does not answer its health checks; killing it" in logs, logs
    assert "restarting the shard" in logs, logs
    out = ok_json(harness.post(lz, "/generate", harness.gen_body("Once upon a time", 3)))
    assert out["details"]["generated_tokens"] == 3
    harness.report("stopped_shard", {
        "step_timeout_s": STEP_TIMEOUT_S,
        "requests_failed_within_s": round(max(failed_after), 2),
        "healthy_again_after_s": round(recovered, 2),
    })
