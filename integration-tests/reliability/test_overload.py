"""Overload: 256 clients at once against --max-concurrent-requests 128. Each gets either its
whole, correct generation or a prompt 429 `overloaded`; none hangs or gets a 5xx; the
server's own counters agree with what the clients saw; afterwards the queue and batch are
empty and a new request is served."""

import threading
import time

import pytest
import requests

import harness
from sonde_http import assert_error, ok_json

MAX_CONCURRENT = 128
CLIENTS = 256
NEW_TOKENS = 4
# A few distinct prompts, so the batch mixes lengths and each answer can be checked
# against its prompt's generation alone. Half share a long context (several of the prefix
# cache's 16-token blocks), so the burst also runs through the cache's hits and its second
# wave for requests of one batch that share a prefix.
CONTEXT = ("Town bulletin. The council met on Tuesday to discuss the new library, the repairs "
           "to the bridge over the river, and the summer market, which opens next month. ")
PROMPTS = [f"{CONTEXT}Report {i}: the weather in town today is" for i in range(4)] + \
    [f"List {i} of things to pack for a trip: a map," for i in range(4)]
CLIENT_TIMEOUT_S = 120
# What the issue asks: a refusal must come at once, not after queueing.
REJECT_P99_S = 1.0


@pytest.fixture(scope="module")
def lz():
    s = harness.start("--max-concurrent-requests", MAX_CONCURRENT, name="overload")
    yield s
    s.stop()


def _client(lz, i, barrier, out):
    body = harness.gen_body(PROMPTS[i % len(PROMPTS)], NEW_TOKENS)
    with requests.Session() as session:
        # Connect first (a keep-alive connection), so the latency measured is the server's
        # answer, not 256 TCP handshakes queued behind each other.
        assert session.get(lz.url + "/health", timeout=30).status_code == 200
        barrier.wait()
        started = time.perf_counter()
        try:
            r = session.post(lz.url + "/generate", json=body, timeout=(10, CLIENT_TIMEOUT_S))
            out[i] = (r, time.perf_counter() - started)
        except requests.RequestException as e:  # a timeout here is a hang
            out[i] = (e, time.perf_counter() - started)


def _burst(lz):
    out = [None] * CLIENTS
    barrier = threading.Barrier(CLIENTS)
    threads = [threading.Thread(target=_client, args=(lz, i, barrier, out), daemon=True)
               for i in range(CLIENTS)]
    started = time.monotonic()
    for t in threads:
        t.start()
    deadline = started + CLIENT_TIMEOUT_S + 30
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = [i for i, t in enumerate(threads) if t.is_alive()]
    assert not hung, f"{len(hung)} clients still waiting after {CLIENT_TIMEOUT_S + 30} s"
    return out, time.monotonic() - started


def test_256_clients_get_a_whole_answer_or_a_prompt_429(lz):
    want = harness.references(lz, PROMPTS, NEW_TOKENS)
    ok0 = harness.request_count(lz, "/generate", 200)
    busy0 = harness.request_count(lz, "/generate", 429)

    out, wall = _burst(lz)

    accepted, rejected, other = [], [], []
    for i, (r, latency) in enumerate(out):
        if isinstance(r, Exception):
            other.append((i, repr(r)))
        elif r.status_code == 200:
            prompt = PROMPTS[i % len(PROMPTS)]
            harness.assert_generation(r.json(), want[prompt], NEW_TOKENS, f"client {i}")
            accepted.append(latency)
        elif r.status_code == 429:
            assert_error(r, 429, "overloaded", ["--max-concurrent-requests"])
            rejected.append(latency)
        else:
            other.append((i, r.status_code, r.text[:300]))
    figures = {
        "clients": CLIENTS, "max_concurrent_requests": MAX_CONCURRENT,
        "accepted": len(accepted), "rejected": len(rejected), "burst_s": round(wall, 2),
        "accepted_p50_s": round(harness.percentile(accepted, 50), 3),
        "accepted_p99_s": round(harness.percentile(accepted, 99), 3),
        "rejected_p50_s": rejected and round(harness.percentile(rejected, 50), 3),
        "rejected_p99_s": rejected and round(harness.percentile(rejected, 99), 3),
    }
    harness.report("overload", figures)

    assert not other, f"answers that are neither a 200 nor a 429: {other[:10]}"
    # The burst must really overload the server, or the 429 path went untested; and a 429
    # may only come while 128 others hold the slots, so at least 128 got through.
    assert rejected, f"no client was refused: {figures}"
    assert len(accepted) >= MAX_CONCURRENT, figures
    assert figures["rejected_p99_s"] < REJECT_P99_S, figures
    # Nothing accepted went missing on the server's side either.
    assert harness.request_count(lz, "/generate", 200) - ok0 == len(accepted)
    assert harness.request_count(lz, "/generate", 429) - busy0 == len(rejected)

    idle_s = harness.wait_idle(lz)
    after = ok_json(harness.post(lz, "/generate", harness.gen_body(PROMPTS[0], NEW_TOKENS)))
    harness.assert_generation(after, want[PROMPTS[0]], NEW_TOKENS, "after the burst")
    harness.report("overload_recovery", {"idle_after_burst_s": round(idle_s, 2)})
