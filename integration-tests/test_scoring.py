"""Pure scoring (max_new_tokens 0) and the prefill flag: TGI silently returns [] here."""

import math
import struct

from sonde_http import (MODEL_ID, REF_TOL, SAME_TOL, assert_close, assert_error, generate,
                        ok_json, post)

PROMPT = "Once upon a time"


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


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


def test_v1_score_matches_the_float64_reference_and_generate(server, reference):
    """SGLang's /v1/score on the real model: each item's label probabilities are the
    full-vocabulary label logprobs after query + item — the float64 reference's within its
    tolerance, /generate's bit for bit — and scoring items together changes nothing."""
    labels = reference["label_ids"][:4]
    prompts = [p for p in reference["prompts"] if len(p["ids"]) >= 3][:3]
    assert prompts
    for p in prompts:
        ids = p["ids"]
        # Token ids: the query is the first two, the item the rest.
        body = {"query": ids[:2], "items": [ids[2:]], "label_token_ids": labels}
        got = ok_json(post(server, "/v1/score", body))
        assert got["object"] == "scoring"
        assert got["usage"]["prompt_tokens"] == len(ids)
        scores = got["scores"][0]
        want = p["labels"][len(ids) - 1]
        for j, s in enumerate(scores):
            assert_close(math.log(s), want[j], REF_TOL, f"{p['text']!r} label {j}")
        # /generate's label logprobs of the first generated token are at the same position.
        g = generate(server, p["text"], max_new_tokens=1, logprob_token_ids=labels,
                     details=True, decoder_input_details=True)
        assert [t["id"] for t in g["details"]["prefill"]] == ids
        lp = [e["logprob"] for e in g["details"]["tokens"][0]["label_logprobs"]]
        # The score is exp of the shard's f32 logprob, taken in f64; JSON carries that f32
        # in its shortest digits, so the two meet as f32s.
        assert [f32(math.log(s)) for s in scores] == [f32(x) for x in lp]
    # Many items in one call: each equals its score alone.
    query = prompts[0]["ids"][:2]
    items = [prompts[0]["ids"][2:], [198], [17, 198], prompts[0]["ids"][2:3]]
    together = ok_json(post(server, "/v1/score", {"query": query, "items": items,
                                                  "label_token_ids": labels}))["scores"]
    for item, score in zip(items, together, strict=True):
        alone = ok_json(post(server, "/v1/score", {"query": query, "items": [item],
                                                   "label_token_ids": labels}))["scores"][0]
        assert alone == score
    soft = ok_json(post(server, "/v1/score", {"query": query, "items": items,
                                              "label_token_ids": labels, "apply_softmax": True}))
    for row, raw in zip(soft["scores"], together, strict=True):
        assert abs(sum(row) - 1.0) < 1e-12
        assert all(abs(a - b / sum(raw)) < 1e-12 for a, b in zip(row, raw))
