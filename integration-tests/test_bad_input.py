"""Every client mistake gets its own status, the {error, error_type} envelope and a sentence
naming the field or limit — never a 500, a panic or a hang (TGI's Vertex adapter: all 500)."""

import json
import re

import pytest
import requests

from sonde_http import MODEL_ID, TIMEOUT_S, assert_error, generate, ok_json

JSON = {"Content-Type": "application/json"}
V = "validation"


def gen(**params):
    return json.dumps({"inputs": "Hello", "parameters": params}).encode()


def inst(**params):
    return json.dumps({"instances": [{"inputs": "Hello", "parameters": params}]}).encode()


def instances(n):
    return json.dumps({"instances": [{"inputs": "Hi"}] * n}).encode()


# A typo'd name is a prefix of the real one, so the sentence must name the typo itself.
TYPO = re.compile(r"max_new_token(?!s)")

# (id, path, body, headers, status, error_type or None when API.md leaves it open, words)
ROWS = [
    ("malformed-json", "/generate", b'{"inputs": "Hello", ', JSON, 400, None, ["json"]),
    ("text-plain", "/generate", gen(max_new_tokens=2), {"Content-Type": "text/plain"},
     415, None, ["json"]),
    ("form-encoded", "/generate", b"inputs=Hello",
     {"Content-Type": "application/x-www-form-urlencoded"}, 415, None, ["json"]),
    ("nan-literal", "/generate", b'{"inputs":"Hello","parameters":{"temperature":NaN}}',
     JSON, 400, None, ["json"]),
    ("wrong-type", "/generate", gen(max_new_tokens="ten"), JSON, 422, V, ["max_new_tokens"]),
    ("inputs-not-string", "/generate", b'{"inputs": 5}', JSON, 422, V, ["inputs"]),
    ("inputs-missing", "/generate", b'{"parameters": {}}', JSON, 422, V, ["inputs"]),
    ("negative-max-new", "/generate", gen(max_new_tokens=-1), JSON, 422, V, ["max_new_tokens"]),
    ("huge-max-new", "/generate", gen(max_new_tokens=10**12), JSON, 422, V, ["max_new_tokens"]),
    ("temperature-0", "/generate", gen(temperature=0), JSON, 422, V, ["temperature"]),
    ("temperature-neg", "/generate", gen(temperature=-1), JSON, 422, V, ["temperature"]),
    ("top-p-1.5", "/generate", gen(top_p=1.5), JSON, 422, V, ["top_p"]),
    ("top-p-0", "/generate", gen(top_p=0), JSON, 422, V, ["top_p"]),
    ("top-k-0", "/generate", gen(top_k=0), JSON, 422, V, ["top_k"]),
    ("typical-p-0", "/generate", gen(typical_p=0), JSON, 422, V, ["typical_p"]),
    ("rep-penalty-0", "/generate", gen(repetition_penalty=0), JSON, 422, V,
     ["repetition_penalty"]),
    ("freq-penalty-3", "/generate", gen(frequency_penalty=3), JSON, 422, V,
     ["frequency_penalty"]),
    ("seed-negative", "/generate", gen(seed=-1), JSON, 422, V, ["seed"]),
    ("truncate-0", "/generate", gen(truncate=0), JSON, 422, V, ["truncate"]),
    ("stop-5", "/generate", gen(stop=["a", "b", "c", "d", "e"]), JSON, 422, V, ["stop", "4"]),
    ("top-n-6", "/generate", gen(top_n_tokens=6), JSON, 422, V, ["top_n_tokens", "5"]),
    ("best-of-3", "/generate", gen(best_of=3, do_sample=True), JSON, 422, V, ["best_of", "2"]),
    ("best-of-greedy", "/generate", gen(best_of=2), JSON, 422, V, ["best_of"]),
    ("best-of-stream", "/generate_stream", gen(best_of=2, do_sample=True), JSON, 422, V,
     ["best_of"]),
    ("label-out-of-vocab", "/generate", gen(logprob_token_ids=[10**6]), JSON, 422, V,
     ["logprob_token_ids"]),
    ("labels-129", "/generate", gen(logprob_token_ids=list(range(129))), JSON, 422, V,
     ["logprob_token_ids", "128"]),
    ("logprobs-mode", "/generate", gen(logprobs_mode="cooked"), JSON, 422, V, ["logprobs_mode"]),
    ("unknown-field", "/generate", b'{"inputs": "Hello", "paramters": {}}', JSON, 422, V,
     ["paramters"]),
    ("unknown-parameter", "/generate", gen(max_new_token=5), JSON, 422, V, [TYPO]),
    ("payload-limit", "/generate", b'{"inputs": "' + b"a" * 2_100_000 + b'"}', JSON, 413, None,
     [("2000000", "2,000,000", "2 mb", "payload")]),
    # The same mistakes through Vertex, which must keep the status and name the instance.
    ("v-malformed-json", "/predict", b'{"instances": [', JSON, 400, None, ["json"]),
    ("v-text-plain", "/predict", instances(1), {"Content-Type": "text/plain"}, 415, None,
     ["json"]),
    ("v-empty", "/predict", b'{"instances": []}', JSON, 422, V, ["instances"]),
    ("v-too-many", "/predict", instances(129), JSON, 422, V, ["instances", "128"]),
    ("v-missing-instances", "/predict", b'{"instance": []}', JSON, 422, V, ["instance"]),
    ("v-wrong-type", "/predict", inst(max_new_tokens="ten"), JSON, 422, V,
     ["instances[0]", "max_new_tokens"]),
    ("v-temperature-0", "/vertex", inst(temperature=0), JSON, 422, V,
     ["instances[0]", "temperature"]),
    ("v-unknown-parameter", "/predict", inst(max_new_token=5), JSON, 422, V,
     ["instances[0]", TYPO]),
    ("v-top-n-6", "/predict", inst(top_n_tokens=6, details=True), JSON, 422, V,
     ["instances[0]", "top_n_tokens"]),
    ("oai-messages-type", "/v1/chat/completions",
     json.dumps({"model": MODEL_ID, "messages": "hi"}).encode(), JSON, 422, V, ["messages"]),
    ("oai-top-logprobs-6", "/v1/chat/completions",
     json.dumps({"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}],
                 "logprobs": True,
                 "top_logprobs": 6}).encode(), JSON, 422, V, ["top_logprobs"]),
    ("oai-logprobs-6", "/v1/completions",
     json.dumps({"model": MODEL_ID, "prompt": "hi", "logprobs": 6}).encode(), JSON, 422, V,
     ["logprobs"]),
]


def _check_words(body, words):
    sentence = body["error"].lower()
    for w in words:
        if isinstance(w, re.Pattern):
            assert w.search(sentence), f"error sentence lacks /{w.pattern}/: {body['error']!r}"
        else:
            alts = w if isinstance(w, tuple) else (w,)
            assert any(a.lower() in sentence for a in alts), (
                f"error sentence lacks {alts}: {body['error']!r}")


@pytest.mark.parametrize("path,body,headers,status,error_type,words",
                         [pytest.param(*row[1:], id=row[0]) for row in ROWS])
def test_bad_request(server, path, body, headers, status, error_type, words):
    r = requests.post(server.url + path, data=body, headers=headers, timeout=TIMEOUT_S)
    _check_words(assert_error(r, status, error_type), words)


def test_prompt_over_max_input_tokens(server):
    limit = server.info()["max_input_tokens"]
    text = " hello" * (limit + 20)
    toks = ok_json(requests.post(server.url + "/tokenize", json={"inputs": text},
                                 timeout=TIMEOUT_S))
    n = len(toks)
    assert n > limit
    r = requests.post(server.url + "/generate", timeout=TIMEOUT_S,
                      json={"inputs": text, "parameters": {"max_new_tokens": 1}})
    _check_words(assert_error(r, 422, V), [str(limit), str(n)])
    # `truncate` is the documented way out: keep the last 8 prompt tokens.
    ok = generate(server, text, max_new_tokens=1, truncate=8, details=True,
                  decoder_input_details=True)
    assert ok["details"]["input_length"] == 8
    assert [t["id"] for t in ok["details"]["prefill"]] == [t["id"] for t in toks[-8:]]


def test_edge_values_accepted(server):
    # top_p/typical_p = 1.0 mean "off" (TGI rejects them); frequency_penalty spans [-2, 2].
    r = generate(server, "Hello", max_new_tokens=2, top_p=1.0, typical_p=1.0,
                 frequency_penalty=-2.0, details=True)
    assert r["details"]["generated_tokens"] == 2


def test_server_still_healthy_after_the_table(server):
    assert requests.get(server.url + "/health", timeout=30).status_code == 200
    r = generate(server, "Hello", max_new_tokens=2, details=True)
    assert len(r["details"]["tokens"]) == 2


GOOD = {"inputs": "Hello", "parameters": {"max_new_tokens": 2}}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}],
                         ids=["missing", "wrong"])
@pytest.mark.parametrize("path", ["/generate", "/predict", "/v1/completions"])
def test_api_key_required(auth_server, headers, path):
    body = {"instances": [GOOD]} if path == "/predict" else (
        {"model": MODEL_ID, "prompt": "Hello", "max_tokens": 2} if path.startswith("/v1")
        else GOOD)
    r = requests.post(auth_server.url + path, json=body, headers=headers, timeout=TIMEOUT_S)
    assert_error(r, 401)


def test_api_key_open_routes_and_good_key(auth_server):
    for route in ("/health", "/metrics"):
        r = requests.get(auth_server.url + route, timeout=30)
        assert r.status_code == 200, f"{route}: {r.status_code} {r.text[:500]}"
    r = requests.post(auth_server.url + "/generate", json=GOOD, timeout=TIMEOUT_S,
                      headers={"Authorization": "Bearer test-secret"})
    assert ok_json(r)["generated_text"] is not None
