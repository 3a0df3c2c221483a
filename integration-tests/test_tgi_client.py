"""TGI's own Python client (text-generation) against Sonde: the drop-in promise.

The client posts to `/` with every TGI parameter it knows (watermark, grammar, nulls), so
these tests also pin that Sonde's strict parsing still accepts what TGI clients send.
"""

import asyncio
import math

import pytest
from text_generation import AsyncClient, Client
from text_generation.types import FinishReason

from sonde_http import SAME_TOL

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def client(server):
    return Client(server.url, timeout=300)


def _check_length(details, n):
    if details.finish_reason == FinishReason.Length:
        assert details.generated_tokens == n
    else:
        assert details.finish_reason == FinishReason.EndOfSequenceToken
        assert details.generated_tokens < n
    assert len(details.tokens) == details.generated_tokens


def test_generate_token_logprobs(client):
    r = client.generate(PROMPT, max_new_tokens=8)
    _check_length(r.details, 8)
    assert r.generated_text == "".join(t.text for t in r.details.tokens)
    for t in r.details.tokens:
        assert t.logprob is not None and math.isfinite(t.logprob) and t.logprob <= 0, t
    # This prompt's greedy run has no eos in its first 32 tokens (forward.json).
    assert r.details.finish_reason == FinishReason.Length


def test_top_n_tokens(client):
    r = client.generate(PROMPT, max_new_tokens=8, top_n_tokens=3)
    assert len(r.details.top_tokens) == len(r.details.tokens)
    for tok, top in zip(r.details.tokens, r.details.top_tokens):
        assert len(top) == 3, top
        lps = [t.logprob for t in top]
        assert lps == sorted(lps, reverse=True), lps
        assert len({t.id for t in top}) == 3, top
        # Greedy picks the argmax, which is the first alternative (both break ties to the smaller id).
        assert top[0].id == tok.id, (tok, top)
        assert abs(top[0].logprob - tok.logprob) <= SAME_TOL


def test_decoder_input_details(client, reference):
    ids = reference["prompts"][0]["ids"]
    assert reference["prompts"][0]["text"] == PROMPT
    r = client.generate(PROMPT, max_new_tokens=2, decoder_input_details=True)
    prefill = r.details.prefill
    assert [t.id for t in prefill] == ids
    assert prefill[0].logprob is None
    for t in prefill[1:]:
        assert t.logprob is not None and math.isfinite(t.logprob) and t.logprob <= 0, t


def test_stream_equals_generate(client):
    full = client.generate(PROMPT, max_new_tokens=8, top_n_tokens=2)
    events = list(client.generate_stream(PROMPT, max_new_tokens=8, top_n_tokens=2))
    assert len(events) == len(full.details.tokens)
    for i, (ev, want) in enumerate(zip(events, full.details.tokens)):
        assert ev.token.id == want.id, i
        assert ev.token.text == want.text, i
        assert abs(ev.token.logprob - want.logprob) <= SAME_TOL, (i, ev.token, want)
        assert [t.id for t in ev.top_tokens] == [t.id for t in full.details.top_tokens[i]]
        for g, w in zip(ev.top_tokens, full.details.top_tokens[i]):
            assert abs(g.logprob - w.logprob) <= SAME_TOL
    for ev in events[:-1]:
        assert ev.generated_text is None and ev.details is None
    last = events[-1]
    assert last.generated_text == full.generated_text
    assert last.details.finish_reason == full.details.finish_reason
    assert last.details.generated_tokens == full.details.generated_tokens


def test_async_client_matches_sync(server, client):
    want = client.generate(PROMPT, max_new_tokens=6, top_n_tokens=2)

    async def run():
        ac = AsyncClient(server.url, timeout=300)
        got = await ac.generate(PROMPT, max_new_tokens=6, top_n_tokens=2)
        streamed = [ev async for ev in ac.generate_stream(PROMPT, max_new_tokens=6)]
        return got, streamed

    got, streamed = asyncio.run(run())
    assert got.generated_text == want.generated_text
    assert [t.id for t in got.details.tokens] == [t.id for t in want.details.tokens]
    for g, w in zip(got.details.tokens, want.details.tokens):
        assert abs(g.logprob - w.logprob) <= SAME_TOL
    assert [e.token.id for e in streamed] == [t.id for t in want.details.tokens]
    assert streamed[-1].generated_text == want.generated_text


def test_sampling_with_seed_is_reproducible(client):
    # The client sends do_sample/seed/temperature/top_k/top_p through Parameters as TGI does.
    kw = dict(max_new_tokens=8, do_sample=True, seed=7, temperature=0.8, top_k=20, top_p=0.95)
    a = client.generate(PROMPT, **kw)
    b = client.generate(PROMPT, **kw)
    assert a.details.seed == 7
    assert [t.id for t in a.details.tokens] == [t.id for t in b.details.tokens]
    assert a.generated_text == b.generated_text
