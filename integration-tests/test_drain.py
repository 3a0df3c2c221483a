"""SIGTERM drains: health turns 503 and new requests are refused at once, while the
requests already running finish; then the router exits 0."""

import signal
import time

import requests

from launched import generating
from sonde_http import TIMEOUT_S, post, sse_events

STREAMS = 4


def test_sigterm_lets_running_streams_finish(launch):
    server = launch(name="sonde-drain")
    results = [None] * STREAMS

    def run(i):
        body = {"inputs": f"Story {i}: once upon a time", "parameters": {"max_new_tokens": 64, "details": True}}
        with requests.post(server.url + "/generate_stream", json=body, stream=True, timeout=TIMEOUT_S) as r:
            results[i] = list(sse_events(r))

    # Signal only once every stream is generating.
    threads = generating(server, STREAMS, run)
    router = server.procs["router"]
    router.send_signal(signal.SIGTERM)
    time.sleep(0.3)

    r = requests.get(server.url + "/health", timeout=10)
    assert r.status_code == 503 and r.json()["error_type"] == "healthcheck", r.text
    r = post(server, "/generate", {"inputs": "late", "parameters": {"max_new_tokens": 2}})
    assert r.status_code == 503, r.text

    for t in threads:
        t.join(120)
    for i, events in enumerate(results):
        assert events, f"stream {i} got nothing"
        last = events[-1]
        assert "error" not in last, f"stream {i} was cut: {last}"
        details = last["details"]
        assert details["finish_reason"] in ("length", "eos_token"), last
        assert details["generated_tokens"] == len(events), last
    assert router.wait(30) == 0
