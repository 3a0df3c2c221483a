"""Small HTTP helpers the e2e test modules share (plain requests, no client library)."""

import json
import math
import os
import time

import requests

TIMEOUT_S = 300
MODEL_ID = "SmolLM2-135M-Instruct.Q4_1"
# Reference logprobs are float64 over the same weights; the shard's documented error is
# ~2e-5 (docs/shard.md), so 1e-3 only catches real mistakes (wrong position, wrong softmax).
# scripts/gpu-check serves on a GPU, whose kernels sum in other orders, and sets the GPU's
# tolerances through SONDE_E2E_REF_TOL and SONDE_E2E_TIE; unset, these are the CPU's.
REF_TOL = float(os.environ.get("SONDE_E2E_REF_TOL", "1e-3"))
# Greedy steps whose top-2 margin in the reference is this small may legitimately flip.
TIE = float(os.environ.get("SONDE_E2E_TIE", "1e-3"))
# Same request, same server: the contract says alone == batched == streamed (|d| <= 1e-5).
SAME_TOL = 1e-5


def post(server, path, body, **kw):
    kw.setdefault("timeout", TIMEOUT_S)
    return requests.post(server.url + path, json=body, **kw)


def ok_json(resp):
    assert resp.status_code == 200, f"{resp.request.url}: {resp.status_code} {resp.text[:2000]}"
    return resp.json()


def watch_health(url, alive, logs, within_s, poll_s=0.02):
    """Polls the health route `url` until 200; returns what each poll saw, in order
    ("refused", or the HTTP status), consecutive repeats folded. Each 503 must be the
    loading answer (`error_type` healthcheck). Fails, with `logs()`, if `alive()` turns
    false or `within_s` pass first."""
    seen = []
    deadline = time.monotonic() + within_s
    while True:
        try:
            r = requests.get(url, timeout=5)
            got = r.status_code
            if got == 503:
                assert r.json()["error_type"] == "healthcheck", r.text
        except requests.ConnectionError:
            got = "refused"
        if not seen or seen[-1] != got:
            seen.append(got)
        if got == 200:
            return seen
        assert alive(), f"the server exited while starting (saw {seen}):\n{logs()}"
        assert time.monotonic() < deadline, \
            f"health not 200 after {within_s} s (saw {seen}):\n{logs()}"
        time.sleep(poll_s)


def assert_loading_then_ready(seen, logs):
    """What a health probe saw from start to ready (`watch_health`): nothing listening until
    the port is bound, then 503 while the model loads, then 200 — never a refusal once the
    port answered, since a platform may count that as a dead server."""
    assert 503 in seen, f"health never answered 503 while loading (saw {seen}):\n{logs()}"
    first = seen.index(503)
    assert "refused" not in seen[first:], f"health refused after answering (saw {seen})"
    assert set(seen[first:]) == {503, 200}, seen


def generate(server, inputs, path="/generate", **params):
    return ok_json(post(server, path, {"inputs": inputs, "parameters": params}))


def assert_error(resp, status, error_type=None, contains=()):
    """An error answer: the status, the {error, error_type} envelope, words in the sentence.

    `contains` items are strings, or tuples of alternatives where any one must appear
    (case-insensitive), for limits a sentence may spell in more than one way.
    """
    assert resp.status_code == status, (
        f"want {status}, got {resp.status_code}: {resp.text[:2000]}")
    try:
        body = resp.json()
    except ValueError:
        raise AssertionError(f"error body is not JSON: {resp.text[:2000]!r}") from None
    assert isinstance(body, dict), body
    assert isinstance(body.get("error"), str) and body["error"], body
    assert isinstance(body.get("error_type"), str) and body["error_type"], body
    if error_type is not None:
        assert body["error_type"] == error_type, body
    sentence = body["error"].lower()
    for want in contains:
        alts = want if isinstance(want, tuple) else (want,)
        assert any(a.lower() in sentence for a in alts), (
            f"error sentence lacks {alts}: {body['error']!r}")
    return body


def sse_events(resp):
    """Parses the `data:` lines of a Server-Sent Events body; stops at OpenAI's [DONE]."""
    assert resp.status_code == 200, f"{resp.status_code} {resp.text[:2000]}"
    ctype = resp.headers.get("content-type", "")
    assert ctype.startswith("text/event-stream"), ctype
    for raw in resp.iter_lines():
        line = raw.decode("utf-8")
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def stream_generate(server, inputs, **params):
    """/generate_stream folded back into /generate's shape: {generated_text, details}."""
    with requests.post(server.url + "/generate_stream", timeout=TIMEOUT_S, stream=True,
                       json={"inputs": inputs, "parameters": params}) as resp:
        events = list(sse_events(resp))
    assert events, "stream had no events"
    for e in events:
        assert "error" not in e, e
    for e in events[:-1]:
        assert e["generated_text"] is None, e
    tokens = [e["token"] for e in events]
    assert [e["index"] for e in events] == list(range(1, len(events) + 1)) or \
        [e["index"] for e in events] == list(range(len(events))), [e["index"] for e in events]
    last = events[-1]
    assert isinstance(last["generated_text"], str), last
    details = dict(last.get("details") or {})
    details["tokens"] = tokens
    if params.get("top_n_tokens"):
        details["top_tokens"] = [e["top_tokens"] for e in events]
    return {"generated_text": last["generated_text"], "details": details}


# SONDE_E2E_DELTAS=FILE appends every compared |got - want| to FILE as a JSON line (the test,
# what was compared, the difference, the tolerance), so scripts/gpu-check can report the
# errors it saw.
_DELTAS = os.environ.get("SONDE_E2E_DELTAS")


def _record_delta(what, delta, tol):
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    with open(_DELTAS, "a") as f:
        f.write(json.dumps({"test": test, "what": what, "delta": delta, "tol": tol}) + "\n")


def assert_close(got, want, tol, what):
    assert got is not None and math.isfinite(got), f"{what}: {got!r}"
    if _DELTAS:
        _record_delta(what, abs(got - want), tol)
    assert abs(got - want) <= tol, f"{what}: got {got!r}, want {want!r} (tol {tol})"


def assert_same_tokens(got, want, what, tol=SAME_TOL):
    """Two lists of token objects: same ids and texts, logprobs within tol."""
    assert [t["id"] for t in got] == [t["id"] for t in want], f"{what}: ids differ"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g["text"] == w["text"], f"{what}[{i}] text: {g['text']!r} vs {w['text']!r}"
        if w["logprob"] is None:
            assert g["logprob"] is None, f"{what}[{i}]: {g['logprob']!r} vs None"
        else:
            assert_close(g["logprob"], w["logprob"], tol, f"{what}[{i}].logprob")


def assert_same_details(got, want, what, tol=SAME_TOL):
    gd, wd = got["details"], want["details"]
    assert_same_tokens(gd["tokens"], wd["tokens"], f"{what} tokens", tol)
    if "top_tokens" in wd:
        assert len(gd["top_tokens"]) == len(wd["top_tokens"]), what
        for i, (g, w) in enumerate(zip(gd["top_tokens"], wd["top_tokens"])):
            assert_same_tokens(g, w, f"{what} top_tokens[{i}]", tol)
    if wd.get("prefill"):
        assert_same_tokens(gd["prefill"], wd["prefill"], f"{what} prefill", tol)
