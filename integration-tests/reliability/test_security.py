"""Security, on the real launcher with --api-key: every inference route, at its own path and
under Vertex's /invoke prefix, is 401 without the key (and with a wrong one) and served
with it; health, info, metrics and docs stay open; the key never reaches the log; and
prompts and generated text are not logged at the default log level."""

import uuid

import pytest
import requests

import harness
from sonde_http import assert_error, ok_json

# A key that looks like nothing else in a log, so finding it means it leaked.
API_KEY = "sk-sonde-" + uuid.uuid4().hex
# The prompt marker: a word no model output or log line would contain by chance.
MARKER = "zqxmarker" + uuid.uuid4().hex[:12]

CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 2, "temperature": 0}
ROUTES = [
    ("POST", "/generate", {"inputs": "Hello", "parameters": {"max_new_tokens": 2}}),
    ("POST", "/generate_stream", {"inputs": "Hello", "parameters": {"max_new_tokens": 2}}),
    ("POST", "/", {"inputs": "Hello", "parameters": {"max_new_tokens": 2}}),
    ("POST", "/predict", {"instances": [{"inputs": "Hello", "parameters": {"max_new_tokens": 2}}]}),
    ("POST", "/vertex", {"instances": [{"inputs": "Hello", "parameters": {"max_new_tokens": 2}}]}),
    ("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 2, "temperature": 0}),
    ("POST", "/v1/chat/completions", CHAT),
    ("GET", "/v1/models", None),
    ("POST", "/tokenize", {"inputs": "Hello"}),
]
# Under /invoke, TGI's "/" is "/invoke" ("/invoke/" is a 404: no route, nothing served).
PATHS = [(m, (prefix + p).rstrip("/") or "/", b) for prefix in ("", "/invoke") for m, p, b in ROUTES]
OPEN = ["/health", "/info", "/metrics", "/docs", "/api-doc/openapi.json",
        "/invoke/health", "/invoke/info", "/invoke/metrics"]


@pytest.fixture(scope="module")
def lz():
    s = harness.start("--api-key", API_KEY, name="security")
    yield s
    s.stop()


def _call(lz, method, path, body, headers):
    return requests.request(method, lz.url + path, json=body, headers=headers, timeout=120)


@pytest.mark.parametrize("method,path,body", [pytest.param(*p, id=f"{p[0]} {p[1]}") for p in PATHS])
def test_inference_routes_need_the_key(lz, method, path, body):
    assert_error(_call(lz, method, path, body, {}), 401, "unauthorized", ["Authorization"])
    assert_error(_call(lz, method, path, body, {"Authorization": "Bearer wrong-" + API_KEY}),
                 401, "unauthorized")
    # The key in another scheme or header is not the key.
    assert_error(_call(lz, method, path, body, {"Authorization": "Basic " + API_KEY}), 401)
    assert_error(_call(lz, method, path, body, {"X-Api-Key": API_KEY}), 401)
    r = _call(lz, method, path, body, {"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200, f"{method} {path} with the key: {r.status_code} {r.text[:300]}"
    assert r.content, f"{method} {path}: empty answer"


@pytest.mark.parametrize("path", OPEN)
def test_probes_and_docs_stay_open(lz, path):
    assert requests.get(lz.url + path, timeout=30).status_code == 200


def test_key_prompts_and_outputs_never_reach_the_log(lz):
    auth = {"Authorization": f"Bearer {API_KEY}"}
    prompt = f"Repeat this word: {MARKER} {MARKER} {MARKER}"
    out = ok_json(requests.post(lz.url + "/generate", headers=auth, timeout=120, json={
        "inputs": prompt, "parameters": {"max_new_tokens": 12}}))
    generated = out["generated_text"].strip()
    chat = ok_json(requests.post(lz.url + "/v1/chat/completions", headers=auth, timeout=120,
                                 json={**CHAT, "messages": [{"role": "user", "content": prompt}]}))
    # Errors must not echo the prompt into the log either: a too-long prompt, bad JSON.
    requests.post(lz.url + "/generate", headers=auth, timeout=60,
                  json={"inputs": (MARKER + " ") * 5000, "parameters": {"max_new_tokens": 1}})
    requests.post(lz.url + "/generate", headers={**auth, "Content-Type": "application/json"},
                  data=f'{{"inputs": "{MARKER}", ', timeout=60)
    # A wrong key is not logged either (it may be a real key of another service).
    requests.post(lz.url + "/generate", headers={"Authorization": f"Bearer {MARKER}-key"},
                  json={"inputs": "x"}, timeout=60)
    log = lz.log_path.read_text(errors="replace")
    assert "router" in log and "shard" in log, "the log is not the launcher's whole output"
    assert API_KEY not in log, "the API key is in the log"
    assert MARKER not in log, "a prompt (or a wrong key) is in the log at the default level"
    # Generated text: long enough pieces that a match is not a coincidence of common words.
    for text in (generated, chat["choices"][0]["message"]["content"].strip()):
        if len(text) >= 12:
            assert text not in log, f"generated text {text!r} is in the log"
    # The key also stays off the command lines of the children (visible to every user).
    for pid in (lz.shard_pid(),):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert API_KEY.encode() not in f.read()
    harness.report("security", {"routes_checked": len(PATHS), "log_bytes": len(log)})
