"""A request's scores do not depend on its neighbours (TGI #2502/#459, vLLM #11778).

32 different prompts of different lengths run alone, then all at once, then all at once
streamed; every number must equal the alone run (the shard is bit-exact, so |d| <= 1e-5
leaves room only for a float printed differently, not for a batch-dependent kernel).
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from sonde_http import assert_same_details, generate, stream_generate

_STARTS = ["Once upon a time", "The capital of France is", "def add(a, b):",
           "In 1969, astronauts", "The recipe calls for", "Dear diary, today",
           "Photosynthesis converts", "Les marchés financiers"]
# Lengths differ so the batch is ragged; i // 8 makes the repeated starts distinct.
PROMPTS = [" ".join([s] + ["and then"] * (3 * (i // 8))) for i, s in enumerate(_STARTS * 4)]
PARAMS = {"max_new_tokens": 16, "details": True, "top_n_tokens": 2,
          "decoder_input_details": True}
# Prompt logprobs are not offered on streams (API.md), so streams score generated tokens only.
STREAM_PARAMS = {k: v for k, v in PARAMS.items() if k != "decoder_input_details"}


def _all_at_once(fn):
    barrier = threading.Barrier(len(PROMPTS))

    def one(prompt):
        barrier.wait()
        return fn(prompt)

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(one, PROMPTS))


@pytest.fixture(scope="module")
def alone(server):
    assert len(set(PROMPTS)) == 32
    return [generate(server, p, **PARAMS) for p in PROMPTS]


def test_alone_results_are_complete(alone):
    lengths = {len(r["details"]["prefill"]) for r in alone}
    assert len(lengths) > 4, f"prompt lengths should vary: {lengths}"
    for r in alone:
        d = r["details"]
        assert len(d["tokens"]) == d["generated_tokens"] >= 1
        assert len(d["top_tokens"]) == len(d["tokens"])


def test_concurrent_equals_alone(server, alone):
    together = _all_at_once(lambda p: generate(server, p, **PARAMS))
    for i, (got, want) in enumerate(zip(together, alone)):
        assert got["generated_text"] == want["generated_text"], f"prompt {i}"
        assert got["details"]["finish_reason"] == want["details"]["finish_reason"], f"prompt {i}"
        assert_same_details(got, want, f"prompt {i}")


def test_concurrent_streams_equal_alone(server, alone):
    streamed = _all_at_once(lambda p: stream_generate(server, p, **STREAM_PARAMS))
    for i, (got, want) in enumerate(zip(streamed, alone)):
        assert got["generated_text"] == want["generated_text"], f"prompt {i}"
        assert got["details"]["finish_reason"] == want["details"]["finish_reason"], f"prompt {i}"
        assert got["details"]["generated_tokens"] == want["details"]["generated_tokens"]
        want_no_prefill = {**want, "details": {**want["details"], "prefill": []}}
        assert_same_details(got, want_no_prefill, f"stream {i}")
