"""Vertex AI's custom-container contract: /predict, /vertex, /invoke/*, AIP_* routes, limits.

TGI's Vertex adapter keeps only max_new_tokens and seed and maps every error to 500; these
tests pin that Sonde honours every parameter, says which instance failed, and never cuts
a response short.
"""

import pytest
import requests

from sonde_http import assert_error, assert_same_details, generate, ok_json, post

PROMPT = "Once upon a time"
SAMPLED = {"max_new_tokens": 8, "temperature": 0.7, "top_p": 0.9, "seed": 42,
           "details": True, "top_n_tokens": 3}
CHAT_INSTANCE = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
                 "max_tokens": 8, "temperature": 0}
COMPLETION_INSTANCE = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}


def predict(server, body, path="/predict"):
    out = ok_json(post(server, path, body))
    assert set(out) == {"predictions"}, out.keys()
    assert len(out["predictions"]) == len(body["instances"])
    return out["predictions"]


def _same_generate(pred, want):
    assert isinstance(pred, dict), pred
    assert pred["generated_text"] == want["generated_text"]
    assert pred["details"]["finish_reason"] == want["details"]["finish_reason"]
    assert pred["details"]["seed"] == want["details"]["seed"]
    assert_same_details(pred, want, "prediction")


@pytest.mark.parametrize("path", ["/predict", "/vertex", "/invoke/predict"])
def test_instance_honours_every_parameter(server, path):
    want = generate(server, PROMPT, **SAMPLED)
    assert want["details"]["seed"] == 42
    [pred] = predict(server, {"instances": [{"inputs": PROMPT, "parameters": SAMPLED}]}, path)
    _same_generate(pred, want)
    assert len(pred["details"]["top_tokens"][0]) == 3


def test_instance_without_scores_is_plain_text(server):
    params = {"max_new_tokens": 8, "temperature": 0.7, "seed": 3}
    want = generate(server, PROMPT, **params)
    [pred] = predict(server, {"instances": [{"inputs": PROMPT, "parameters": params}]})
    assert pred == want["generated_text"]
    assert isinstance(pred, str) and pred


def test_top_level_parameters_are_defaults(server):
    # Instance parameters override key by key: instance 1 keeps the default `details`.
    body = {"parameters": {"max_new_tokens": 4, "details": True},
            "instances": [{"inputs": PROMPT},
                          {"inputs": PROMPT, "parameters": {"max_new_tokens": 2}},
                          {"inputs": PROMPT, "parameters": {"details": False}}]}
    p0, p1, p2 = predict(server, body)
    assert p0["details"]["generated_tokens"] == 4  # no eos in this prompt's first 32 greedy
    assert p1["details"]["generated_tokens"] == 2
    assert p0["generated_text"].startswith(p1["generated_text"])
    assert p2 == p0["generated_text"]


def test_instances_come_back_in_order(server, reference):
    texts = [p["text"] for p in reference["prompts"][:5]]
    want = [generate(server, t, max_new_tokens=8)["generated_text"] for t in texts]
    assert len(set(want)) > 1, "prompts should differ in output for the order to be tested"
    got = predict(server, {"instances": [{"inputs": t} for t in texts],
                           "parameters": {"max_new_tokens": 8}})
    assert got == want


@pytest.mark.parametrize("prefix", ["", "/invoke"])
def test_chat_and_completion_instances(server, prefix):
    chat = ok_json(post(server, prefix + "/v1/chat/completions", CHAT_INSTANCE))
    comp = ok_json(post(server, prefix + "/v1/completions", COMPLETION_INSTANCE))
    pc, pt = predict(server, {"instances": [CHAT_INSTANCE, COMPLETION_INSTANCE]},
                     prefix + "/predict")
    assert pc["object"] == "chat.completion"
    assert pc["choices"][0]["message"]["content"] == chat["choices"][0]["message"]["content"]
    assert pc["usage"]["prompt_tokens"] == chat["usage"]["prompt_tokens"]
    assert pt["object"] == "text_completion"
    assert pt["choices"][0]["text"] == comp["choices"][0]["text"]
    [bare] = predict(server, {"instances": [{"prompt": PROMPT, "max_tokens": 8}]})
    assert bare["object"] == "text_completion" and isinstance(bare["choices"][0]["text"], str)


def test_invoke_generate_is_generate(server):
    want = generate(server, PROMPT, **SAMPLED)
    got = generate(server, PROMPT, path="/invoke/generate", **SAMPLED)
    _same_generate(got, want)
    assert ok_json(requests.get(server.url + "/invoke/info", timeout=30)) == server.info()


def test_error_names_the_instance(server):
    body = {"instances": [{"inputs": PROMPT, "parameters": {"max_new_tokens": 2}},
                          {"inputs": PROMPT, "parameters": {"temperature": -1}}]}
    assert_error(post(server, "/predict", body), 422, "validation",
                 ["instances[1]", "temperature"])


def test_unknown_instance_shape(server):
    assert_error(post(server, "/predict", {"instances": [{"text": PROMPT}]}), 422,
                 "validation", ["instances[0]"])


@pytest.fixture(scope="module")
def custom_routes(launch):
    return launch([], env={"AIP_PREDICT_ROUTE": "/custom/predict",
                           "AIP_HEALTH_ROUTE": "/custom/health"}, name="sonde-aip")


def test_aip_routes(custom_routes):
    r = requests.get(custom_routes.url + "/custom/health", timeout=30)
    assert r.status_code == 200, r.text
    assert requests.get(custom_routes.url + "/health", timeout=30).status_code == 200
    body = {"instances": [{"inputs": PROMPT, "parameters": {"max_new_tokens": 4, "seed": 1,
                                                            "temperature": 0.5}}]}
    [a] = predict(custom_routes, body, "/custom/predict")
    [b] = predict(custom_routes, body, "/vertex")
    [c] = predict(custom_routes, body, "/invoke/custom/predict")
    assert isinstance(a, str) and a == b == c


@pytest.fixture(scope="module")
def small_response(launch):
    return launch(["--max-response-bytes", "2000"], name="sonde-small")


def test_response_over_limit_is_413_not_truncated(small_response):
    big = {"inputs": PROMPT, "parameters": {"max_new_tokens": 32, "details": True,
                                            "top_n_tokens": 5}}
    r = post(small_response, "/predict", {"instances": [big]})
    body = assert_error(r, 413, contains=[("2000", "2 kb", "max-response-bytes")])
    assert "predictions" not in body
    # It is the size that was refused: a small answer from the same server still comes back.
    [small] = predict(small_response, {"instances": [{"inputs": PROMPT,
                                                      "parameters": {"max_new_tokens": 2}}]})
    assert isinstance(small, str)
