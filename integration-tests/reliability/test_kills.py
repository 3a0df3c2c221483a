"""Processes killed under load, on the real launcher: the shard (SIGKILL, as the OOM killer
would) while 16 requests stream, and the router. For each, what the clients see, how long
until the errors and the recovery, and that no accepted request hangs or is silently lost.
(test_shard_failure.py kills one shard under two requests; test_launcher.py kills an idle
router.)"""

import os
import signal
import subprocess
import threading
import time

import requests

import harness
from sonde_http import assert_error, ok_json, sse_events

CLIENTS = 16
# Long enough that every request is still generating when its process dies.
LONG_TOKENS = 400
FAIL_WITHIN_S = 5
# A dead shard: the launcher's first restart waits 1 s (supervisor.rs), then the model loads.
RECOVER_WITHIN_S = 30
# The launcher sees its router exit at once, then stops the shard (SIGTERM, a grace period).
EXIT_WITHIN_S = 15
PROBE = "The three primary colors are"
PROBE_TOKENS = 12


def _client(lz, i, out, started):
    """Half stream and half wait for JSON; records what each saw, and when."""
    body = {"inputs": f"Story {i}: the ship left the harbour and",
            "parameters": {"max_new_tokens": LONG_TOKENS}}
    try:
        if i % 2 == 0:
            with requests.post(lz.url + "/generate_stream", json=body, stream=True,
                               timeout=120) as r:
                events = []
                for e in sse_events(r):
                    events.append(e)
                    started[i].set()
                out[i] = ("stream", r.status_code, events, time.monotonic())
        else:
            started[i].set()
            r = harness.post(lz, "/generate", body)
            out[i] = ("json", r.status_code, r.json(), time.monotonic())
    except requests.RequestException as e:
        out[i] = ("exception", None, type(e).__name__, time.monotonic())
    finally:
        started[i].set()


def _under_load(lz):
    """CLIENTS requests running (every one of them in the batch); their threads and slots."""
    out = [None] * CLIENTS
    started = [threading.Event() for _ in range(CLIENTS)]
    threads = [threading.Thread(target=_client, args=(lz, i, out, started))
               for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for e in started:
        assert e.wait(60), "a stream never started"
    lz.wait_gauge("sonde_batch_current_size", CLIENTS)
    return threads, out


def _pid_of(what, lz):
    out = subprocess.run(["pgrep", "-f", f"sonde-{what} .*{lz.uds_prefix}"],
                         capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def test_shard_killed_under_load_fails_every_request_then_recovers():
    lz = harness.start(name="kill-shard")
    try:
        want = ok_json(harness.post(lz, "/generate", harness.gen_body(PROBE, PROBE_TOKENS)))
        threads, out = _under_load(lz)
        old = lz.shard_pid()
        os.kill(old, signal.SIGKILL)
        killed = time.monotonic()
        for t in threads:
            t.join(FAIL_WITHIN_S + 10)
        assert not any(t.is_alive() for t in threads), f"a request hung after the shard died: {out}"

        # Every one of them got an answer: an error, never silence or a dropped connection.
        failed_after = []
        for i, (kind, status, body, at) in enumerate(out):
            if kind == "stream":
                assert status == 200 and body, (i, status, body)
                assert body[-1].get("error_type") == "generation", (i, body[-1])
                assert body[-1].get("error"), (i, body[-1])
            else:
                assert kind == "json" and status == 424, (i, kind, status, body)
                assert body["error_type"] == "generation" and body["error"], body
            failed_after.append(at - killed)
        assert max(failed_after) < FAIL_WITHIN_S, failed_after

        # Meanwhile nothing new is accepted and then lost: 503 until a shard answers again.
        assert_error(harness.post(lz, "/generate", harness.gen_body("Hello", 2)), 503)
        recovered = lz.wait_healthy_again(killed, RECOVER_WITHIN_S, "SIGKILL")
        assert lz.shard_pid() != old
        assert "restarting the shard" in lz.logs(400)

        # The new shard answers as the old one did (greedy: the same tokens and logprobs).
        again = ok_json(harness.post(lz, "/generate", harness.gen_body(PROBE, PROBE_TOKENS)))
        harness.assert_generation(again, want, PROBE_TOKENS, "after the restart")
        assert harness.wait_idle(lz) < 15
        harness.report("shard_killed_under_load", {
            "requests_running": CLIENTS,
            "errors_received": len(failed_after),
            "first_error_after_s": round(min(failed_after), 2),
            "last_error_after_s": round(max(failed_after), 2),
            "healthy_again_after_s": round(recovered, 2),
        })
    finally:
        lz.stop()


def test_router_killed_under_load_stops_the_launcher_non_zero():
    lz = harness.start(name="kill-router")
    try:
        threads, out = _under_load(lz)
        routers = _pid_of("router", lz)
        assert len(routers) == 1, routers
        os.kill(routers[0], signal.SIGKILL)
        killed = time.monotonic()
        for t in threads:
            t.join(10)
        assert not any(t.is_alive() for t in threads), f"a client hung after the router died: {out}"
        # With the process gone, the kernel resets its connections: each client sees a
        # broken connection (never a silent success, never a hang)
        seen = sorted({(kind, str(body) if kind == "exception" else status)
                       for kind, status, body, _ in out})
        # (a stream that ended cleanly without its final event would be a silent loss).
        for i, (kind, status, body, _) in enumerate(out):
            assert kind == "exception", (i, kind, status, body)
        clients_failed_after = max(at for *_, at in out) - killed

        # The launcher notices, stops the shard and exits non-zero, so the platform restarts
        # the container.
        code = lz.wait_exit(EXIT_WITHIN_S)
        exited = time.monotonic() - killed
        assert code != 0, lz.logs()
        assert "the router exited" in lz.logs(200), lz.logs()
        assert _pid_of("shard", lz) == [], "the shard outlived its router"
        try:
            requests.get(lz.url + "/health", timeout=5)
            raise AssertionError("something still answers on the router's port")
        except requests.ConnectionError:
            pass
        harness.report("router_killed_under_load", {
            "requests_running": CLIENTS,
            "clients_saw": [f"{k}: {v}" for k, v in seen],
            "clients_failed_within_s": round(clients_failed_after, 2),
            "launcher_exit_code": code,
            "launcher_exited_after_s": round(exited, 2),
        })
    finally:
        lz.stop()
