"""Pure scoring (max_new_tokens 0) and the prefill flag: TGI silently returns [] here."""

from sonde_http import (MODEL_ID, REF_TOL, SAME_TOL, assert_close, assert_error, generate,
                        post)

PROMPT = "Once upon a time"


def test_score_only(server, reference):
    ref = reference["prompts"][1]
    r = generate(server, ref["text"], max_new_tokens=0, decoder_input_details=True)
    assert r["generated_text"] == ""
    d = r["details"]
    assert d["tokens"] == []
    assert d["generated_tokens"] == 0
    assert d["finish_reason"] == "length"
    assert [t["id"] for t in d["prefill"]] == ref["ids"]
    assert d["prefill"][0]["logprob"] is None
    for pos in range(1, len(ref["ids"])):
        assert_close(d["prefill"][pos]["logprob"], ref["logprob"][pos], REF_TOL, f"prefill[{pos}]")
    # Scoring alone and scoring on the way to generating give the same prompt numbers.
    g = generate(server, ref["text"], max_new_tokens=3, decoder_input_details=True)
    for pos in range(1, len(ref["ids"])):
        assert abs(g["details"]["prefill"][pos]["logprob"] - d["prefill"][pos]["logprob"]) \
            <= SAME_TOL


def test_score_only_with_top_n_and_labels(server, reference):
    ref = reference["prompts"][0]
    labels = reference["label_ids"][:3]
    r = generate(server, PROMPT, max_new_tokens=0, decoder_input_details=True, top_n_tokens=2,
                 logprob_token_ids=labels)
    prefill = r["details"]["prefill"]
    for pos in range(1, len(prefill)):
        got = [e["logprob"] for e in prefill[pos]["label_logprobs"]]
        assert len(got) == 3
        for j, g in enumerate(got):
            assert_close(g, ref["labels"][pos - 1][j], REF_TOL, f"prefill[{pos}] label {j}")


def test_prefill_without_flag_names_it(plain_server):
    r = post(plain_server, "/generate", {"inputs": PROMPT, "parameters": {
        "max_new_tokens": 2, "decoder_input_details": True}})
    assert_error(r, 422, "validation", ["--enable-prefill-logprobs"])


def test_plain_server_still_generates(plain_server):
    r = generate(plain_server, PROMPT, max_new_tokens=2, details=True)
    assert r["details"]["prefill"] == []
    assert len(r["details"]["tokens"]) == 2


def test_echo_without_flag_names_it(plain_server):
    r = post(plain_server, "/v1/completions", {"model": MODEL_ID, "prompt": PROMPT,
                                               "max_tokens": 1, "echo": True, "logprobs": 1})
    assert_error(r, 422, "validation", ["--enable-prefill-logprobs"])


def test_zero_new_tokens_needs_decoder_input_details(server):
    r = post(server, "/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": 0}})
    assert_error(r, 422, "validation", ["max_new_tokens", "decoder_input_details"])


def test_prefill_not_with_streaming(server):
    r = post(server, "/generate_stream", {"inputs": PROMPT, "parameters": {
        "max_new_tokens": 2, "decoder_input_details": True}})
    assert_error(r, 422, "validation", ["decoder_input_details"])
