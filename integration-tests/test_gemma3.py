"""The second real model, Gemma 3 270M Q4_K_M, served by the real launcher over HTTP.

Gemma 3 is a different architecture (sliding and global layers, q/k norms, post-norms, GeGLU,
an embedding scale, a 262,144-token SentencePiece vocabulary) in different block formats
(Q4_K, Q5_0, Q6_K, Q8_0): what the shard's tests check against the float64 reference, here
through the router's tokenizer and every field of the HTTP answer.

  * the router tokenizes every hard string of data/reference/gemma3-tokenizer/reference.json
    as llama.cpp does (its llama-vocab.cpp, checked against llama-server when one is built);
  * the reference prompts, sent as text, become the reference's ids (llama-server's); their
    prompt logprobs and greedy tokens are the float64 pass's;
  * the file has no chat template, so chat completions are refused with a sentence saying so.
"""

import json

import pytest
import requests

from conftest import DATA_DIR, DEVICE
from launched import Launched, launcher_cmd
from sonde_http import REF_TOL, TIE, assert_close, assert_error, generate, ok_json, post

GEMMA = DATA_DIR / "models" / "gemma-3-270m-q4_k_m.gguf"
FORWARD = DATA_DIR / "reference" / "gemma3" / "forward.json"
TOKENIZER = DATA_DIR / "reference" / "gemma3-tokenizer" / "reference.json"
MAX_NEW = 16


def _load(path):
    if not path.is_file():
        pytest.fail(f"{path} is missing: run scripts/test", pytrace=False)
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def gemma():
    if not GEMMA.is_file():
        pytest.fail(f"{GEMMA} is missing: run scripts/fetch-data gemma", pytrace=False)
    lz = Launched([], name="gemma3")
    lz.cmd = [str(c) for c in launcher_cmd(lz.port, lz.uds_prefix, "--model-id", GEMMA,
                                           "--enable-prefill-logprobs")]
    lz.start()
    yield lz
    lz.stop()


@pytest.fixture(scope="module")
def forward():
    return _load(FORWARD)


def test_info_names_the_model(gemma):
    info = ok_json(requests.get(gemma.url + "/info", timeout=30))
    assert info["model_id"] == str(GEMMA), info
    assert info["architecture"] == "gemma3", info
    assert info["model_device_type"] == (DEVICE or "cpu"), info
    # Every block format of the file, spelled as GGUF spells it.
    assert set(info["model_dtype"].split(", ")) == {"q8_0", "q5_0", "q4_k", "q6_k"}, info


def test_tokenize_matches_llama_cpp_on_hard_strings(gemma):
    ref = _load(TOKENIZER)
    cases = [c for c in ref["cases"] if c["parse_special"] and not c["add_special"]]
    assert len(cases) >= 200, len(cases)
    bos = 2  # Gemma's <bos>; the file asks for it (tokenizer.ggml.add_bos_token)
    wrong = []
    for case in cases:
        got = [t["id"] for t in ok_json(post(gemma, "/tokenize", {"inputs": case["text"]}))]
        if got != [bos] + case["llama_cpp"]:
            wrong.append((case["text"], got[:12], case["llama_cpp"][:12]))
    assert not wrong, f"{len(wrong)} of {len(cases)} strings differ: {wrong[:5]}"


@pytest.mark.parametrize("i", range(8))
def test_prompt_logprobs_and_greedy_tokens_match_the_float64_reference(gemma, forward, i):
    p = forward["prompts"][i]
    out = generate(gemma, p["text"], max_new_tokens=MAX_NEW, details=True,
                   decoder_input_details=True)
    d = out["details"]
    assert [t["id"] for t in d["prefill"]] == p["ids"], "tokenized unlike llama.cpp"
    assert d["prefill"][0]["logprob"] is None
    for pos in range(1, len(p["ids"])):
        assert_close(d["prefill"][pos]["logprob"], p["logprob"][pos], REF_TOL,
                     f"prompt {i} position {pos}")
    for k, token in enumerate(d["tokens"]):
        if p["greedy_margin"][k] <= TIE:
            break
        assert token["id"] == p["greedy"][k], f"prompt {i} step {k}"
        assert_close(token["logprob"], p["greedy_logprobs"][k], REF_TOL, f"prompt {i} step {k}")


def test_chat_without_a_template_is_refused_clearly(gemma):
    body = {"model": "tgi", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    resp = post(gemma, "/v1/chat/completions", body)
    assert_error(resp, 422, contains=["chat template"])
    # The server keeps serving.
    assert generate(gemma, "Hello", max_new_tokens=2)["generated_text"] is not None
