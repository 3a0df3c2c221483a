"""Hostile input on one server with small token limits: bodies far over the payload limit,
JSON nested 100,000 deep, huge stop strings, control characters and invalid UTF-8,
10,000-instance Vertex bodies, prompts at exactly the token limits, and a short
schemathesis run over every route of the OpenAPI document. Every answer is the documented
status with the {error, error_type} envelope, never a 5xx, and the server keeps serving."""

import json
import os
import re
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import jsonschema_rs  # schemathesis's own JSON Schema validator (installed with it)
import pytest
import requests

import harness
from sonde_http import assert_error, ok_json

MAX_INPUT, MAX_TOTAL = 64, 96
PAYLOAD_LIMIT = 2_000_000
JSON = {"Content-Type": "application/json"}
FAST_S = 2.0


@pytest.fixture(scope="module")
def lz():
    s = harness.start("--max-input-tokens", MAX_INPUT, "--max-total-tokens", MAX_TOTAL,
                      "--payload-limit", PAYLOAD_LIMIT, name="hostile")
    yield s
    s.stop()


def _raw(lz, data, path="/generate"):
    return requests.post(lz.url + path, data=data, headers=JSON, timeout=60)


def _send_until_answered(lz, head, chunks):
    """Sends the head, then chunks until the server answers; returns (bytes sent, answer)."""
    with socket.create_connection(("127.0.0.1", lz.port), timeout=30) as s:
        s.sendall(head)
        sent = 0
        try:
            for c in chunks:
                if select.select([s], [], [], 0)[0]:
                    break
                s.sendall(c)
                sent += len(c)
        except OSError:
            pass  # the server may close once it has refused; its answer is still there
        return sent, s.recv(65536)


@pytest.mark.parametrize("framing", ["content-length-100MB", "chunked"])
def test_body_far_over_the_limit_is_413_after_the_limit_not_the_body(lz, framing):
    piece = b"a" * 65536
    head = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if framing == "chunked":
        head += b"Transfer-Encoding: chunked\r\n\r\n"
        piece = b"%x\r\n%s\r\n" % (len(piece), piece)
    else:
        head += b"Content-Length: 100000000\r\n\r\n"
    # 8 MB at most: the answer must come once the limit is passed, not at 100 MB.
    sent, answer = _send_until_answered(lz, head, [piece] * 128)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["error_type"] == "payload_too_large" and str(PAYLOAD_LIMIT) in body["error"]
    assert sent < 8 * 1024 * 1024, sent


# Deep nesting, where the schema takes any JSON value (Vertex instances and parameters,
# OpenAI response_format) and where a typed field would refuse the first bracket: the body
# is read as JSON before any field is looked at, so the parser's depth limit stops it in
# every case (400: none of these bodies is JSON, they never close).
NESTED = [
    ("vertex-instances", "/predict", b'{"instances":' + b"[" * 100_000, 400),
    ("vertex-parameters", "/predict",
     b'{"instances":[{"inputs":"x"}],"parameters":' + b'{"a":' * 100_000, 400),
    ("openai-response-format", "/v1/chat/completions",
     b'{"messages":[{"role":"user","content":"x"}],"response_format":' + b"[" * 100_000, 400),
    ("closed-200-deep", "/predict",
     b'{"instances":[{"inputs":"x"}],"parameters":{"x":' + b"[" * 200 + b"]" * 200 + b"}}", 400),
    ("generate-top-level", "/generate", b"[" * 100_000, 400),
    ("generate-stop", "/generate", b'{"inputs":"x","parameters":{"stop":' + b"[" * 100_000, 400),
]


@pytest.mark.parametrize("path,body,status", [pytest.param(*r[1:], id=r[0]) for r in NESTED])
def test_deeply_nested_json_is_refused_fast(lz, path, body, status):
    started = time.monotonic()
    r = _raw(lz, body, path)
    assert_error(r, status, "malformed_json" if status == 400 else "validation")
    assert time.monotonic() - started < FAST_S
    assert len(r.content) < 4096, "the error should not echo the whole nesting"


STOPS = [
    ("1024-ascii", "a" * 1024, 200),
    ("1024-bytes-of-2-byte-chars", "é" * 512, 200),
    ("1025-ascii", "a" * 1025, 422),
    ("1026-bytes-of-2-byte-chars", "é" * 513, 422),
    ("1MB", "z" * 1_000_000, 422),
]


@pytest.mark.parametrize("stop,status", [pytest.param(*r[1:], id=r[0]) for r in STOPS])
def test_stop_sequences_are_limited_to_1024_bytes(lz, stop, status):
    started = time.monotonic()
    r = harness.post(lz, "/generate", harness.gen_body("Hello", 2, stop=[stop]))
    if status == 200:
        assert ok_json(r)["details"]["generated_tokens"] == 2
    else:
        assert_error(r, 422, "validation", ["stop[0]", "1024", str(len(stop.encode()))])
        assert time.monotonic() - started < FAST_S


def test_control_characters_are_served(lz):
    text = "\u0000\u0001\u0007\u001b[31m red \u007f\u200b\ufeff\u2028 tab\there"
    toks = ok_json(harness.post(lz, "/tokenize", {"inputs": text}))
    # Offsets are bytes; the tokens cover the whole text, NUL and escapes included.
    assert toks[0]["start"] == 0 and toks[-1]["stop"] == len(text.encode()), toks
    assert toks[0]["text"] == "\u0000", toks[0]
    out = ok_json(harness.post(lz, "/generate", harness.gen_body(text, 2, stop=["\u0000"])))
    assert 1 <= out["details"]["generated_tokens"] <= 2


@pytest.mark.parametrize("raw", [b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\\ud800"],
                         ids=["ff-fe", "bad-continuation", "encoded-surrogate", "lone-surrogate-escape"])
def test_invalid_utf8_is_400(lz, raw):
    r = _raw(lz, b'{"inputs":"' + raw + b'","parameters":{"max_new_tokens":2}}')
    assert_error(r, 400, "malformed_json", ["json"])


def test_ten_thousand_vertex_instances_are_refused_fast(lz):
    body = json.dumps({"instances": [{"inputs": "Hi"}] * 10_000}).encode()
    started = time.monotonic()
    r = _raw(lz, body, "/predict")
    elapsed = time.monotonic() - started
    assert_error(r, 422, "validation", ["--max-vertex-instances", "10000", "128"])
    assert elapsed < FAST_S, elapsed


def _prompt_of(lz, n):
    """A text of exactly n tokens, as /tokenize counts them."""
    text = "hello" + " hello" * (n - 1)
    assert len(ok_json(harness.post(lz, "/tokenize", {"inputs": text}))) == n
    return text


def test_prompts_at_exactly_the_token_limits(lz):
    info = ok_json(requests.get(lz.url + "/info", timeout=30))
    assert (info["max_input_tokens"], info["max_total_tokens"]) == (MAX_INPUT, MAX_TOTAL)
    at, over = _prompt_of(lz, MAX_INPUT), _prompt_of(lz, MAX_INPUT + 1)
    # At both limits at once: the longest prompt and the most tokens it leaves room for.
    out = ok_json(harness.post(lz, "/generate", harness.gen_body(at, MAX_TOTAL - MAX_INPUT)))
    assert 1 <= out["details"]["generated_tokens"] <= MAX_TOTAL - MAX_INPUT
    assert_error(harness.post(lz, "/generate", harness.gen_body(over, 1)), 422, "validation",
                 [str(MAX_INPUT), str(MAX_INPUT + 1)])
    assert_error(harness.post(lz, "/generate", harness.gen_body(at, MAX_TOTAL - MAX_INPUT + 1)),
                 422, "validation", [str(MAX_TOTAL)])
    # The same through Vertex and OpenAI.
    v = ok_json(harness.post(lz, "/predict", {"instances": [{"inputs": at}],
                                              "parameters": {"max_new_tokens": 1}}))
    assert len(v["predictions"]) == 1
    assert_error(harness.post(lz, "/predict", {"instances": [{"inputs": over}]}), 422,
                 "validation", ["instances[0]", str(MAX_INPUT)])
    c = ok_json(harness.post(lz, "/v1/completions", {"prompt": at, "max_tokens": 1, "temperature": 0}))
    assert c["usage"]["prompt_tokens"] == MAX_INPUT
    assert_error(harness.post(lz, "/v1/completions", {"prompt": over, "max_tokens": 1}), 422,
                 "validation", [str(MAX_INPUT)])


# Schemathesis: generated requests for every operation of /api-doc/openapi.json, checked
# for 5xx and for answers the document does not describe (status, content type, schema of
# JSON bodies and of each streamed event, headers). Its coverage phase (boundary and wrong
# values of every field, ~1,300 requests, about a minute here) plus a few random examples
# per operation, with a fixed seed: short and repeatable in CI.
SCHEMATHESIS_CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
                       "response_schema_conformance,response_headers_conformance")
SCHEMATHESIS_EXAMPLES = 5


def test_schemathesis_finds_no_5xx_and_no_undocumented_answer(lz, tmp_path):
    st = Path(sys.executable).parent / "st"
    assert st.is_file(), f"{st} is missing: install scripts/requirements-e2e.txt"
    cmd = [str(st), "run", f"{lz.url}/api-doc/openapi.json", "--checks", SCHEMATHESIS_CHECKS,
           "--max-examples", str(SCHEMATHESIS_EXAMPLES), "--seed", "7", "--workers", "1",
           "--generation-database", "none", "--request-timeout", "60", "--no-color"]
    started = time.monotonic()
    # Its own folder: schemathesis and hypothesis write their files in the working directory.
    run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "NO_COLOR": "1"})
    summary = run.stdout[-6000:]
    assert run.returncode == 0, f"schemathesis failed ({run.returncode}):\n{summary}\n{run.stderr[-2000:]}"
    tested = re.search(r"Tested:\s*(\d+)", run.stdout)
    cases = re.search(r"(\d+) generated", run.stdout)
    paths = requests.get(lz.url + "/api-doc/openapi.json", timeout=30).json()["paths"]
    assert tested and int(tested.group(1)) == sum(len(ops) for ops in paths.values()), summary
    harness.report("schemathesis", {"seconds": round(time.monotonic() - started, 1),
                                    "operations": int(tested.group(1)),
                                    "requests": int(cases.group(1)) if cases else None})


# Random requests rarely make a stream that succeeds (most are refused), so each streaming
# route also gets one good request whose every event is checked against the document.
STREAMS = [
    ("/generate_stream", {"inputs": "Hello", "parameters": {"max_new_tokens": 3, "details": True,
                                                            "top_n_tokens": 2}}),
    ("/", {"inputs": "Hello", "stream": True, "parameters": {"max_new_tokens": 3}}),
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 3, "stream": True, "logprobs": 2,
                         "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                              "stream": True, "logprobs": True, "top_logprobs": 2,
                              "temperature": 0, "stream_options": {"include_usage": True}}),
]


@pytest.mark.parametrize("path,body", STREAMS, ids=[p for p, _ in STREAMS])
def test_every_streamed_event_matches_the_document(lz, path, body):
    spec = ok_json(requests.get(lz.url + "/api-doc/openapi.json", timeout=30))
    event = spec["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]
    data = event["itemSchema"]["properties"]["data"]
    openai = "anyOf" in data  # OpenAI's stream ends with a `[DONE]` that is not JSON
    content = data["anyOf"][1]["contentSchema"] if openai else data["contentSchema"]
    validator = jsonschema_rs.validator_for({**content, "components": spec["components"]})
    assert not validator.is_valid({"index": "one"}), "the schema accepts anything"
    r = requests.post(lz.url + path, json=body, timeout=120)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
    assert len(events) >= 3, r.text
    if openai:
        assert events.pop() == "[DONE]", events
    for e in events:
        errors = [err.message for err in validator.iter_errors(json.loads(e))]
        assert not errors, f"{path} event {e[:300]} does not match the document: {errors[:3]}"


def test_still_serving_after_all_of_it(lz):
    assert requests.get(lz.url + "/health", timeout=30).status_code == 200
    out = ok_json(harness.post(lz, "/generate", harness.gen_body("Once upon a time", 4)))
    assert out["details"]["generated_tokens"] == 4
    assert harness.wait_idle(lz) < 15
    # No answer of the whole module was a server error (/health said 503 while loading).
    errors = {k: v for k, v in lz.metrics().items()
              if k.startswith("sonde_request_count{") and 'status="5' in k and v
              and 'route="/health"' not in k}
    assert not errors, errors
