"""The official OpenAI Python client against /v1: completions, chat, streaming, logprobs."""

import math

import openai
import pytest

from sonde_http import MODEL_ID, REF_TOL, SAME_TOL, assert_close, generate

PROMPT = "Once upon a time"
# Rendered with the model's template (default system prompt added) this is forward.json's
# prompt 4 exactly, so chat scores have a reference too.
CHAT = [{"role": "user", "content": "List three primary colors."}]
CHAT_REF = 4


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", timeout=300, max_retries=0)


def test_models_list(client):
    ids = [m.id for m in client.models.list().data]
    assert MODEL_ID in ids, ids


def test_completion_logprobs(client, server):
    c = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=8, temperature=0,
                                  logprobs=3)
    assert c.object == "text_completion" and c.model == MODEL_ID
    ch = c.choices[0]
    lp = ch.logprobs
    n = len(lp.tokens)
    assert n == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert c.usage.prompt_tokens == 4 and c.usage.completion_tokens == n
    assert c.usage.total_tokens == 4 + n
    assert ch.finish_reason == "length" and n == 8
    assert "".join(lp.tokens) == ch.text
    for i in range(n):
        assert 1 <= len(lp.top_logprobs[i]) <= 3, lp.top_logprobs[i]
        # Greedy: the chosen token is the most likely alternative.
        best = max(lp.top_logprobs[i].items(), key=lambda kv: kv[1])
        assert best[0] == lp.tokens[i] and abs(best[1] - lp.token_logprobs[i]) <= SAME_TOL
        if i:
            assert lp.text_offset[i] - lp.text_offset[i - 1] == len(lp.tokens[i - 1])
    # The same numbers as TGI's route: one scoring path behind every API.
    tgi = generate(server, PROMPT, max_new_tokens=8, details=True)["details"]["tokens"]
    assert [t["text"] for t in tgi] == lp.tokens
    for got, want in zip(lp.token_logprobs, tgi):
        assert_close(got, want["logprob"], SAME_TOL, "token_logprob")


def test_completion_echo_scores_prompt(client, reference):
    ref = reference["prompts"][0]
    c = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=0, echo=True,
                                  logprobs=1, temperature=0)
    ch = c.choices[0]
    lp = ch.logprobs
    assert ch.text == PROMPT
    assert "".join(lp.tokens) == PROMPT
    assert len(lp.tokens) == len(ref["ids"]) == c.usage.prompt_tokens
    assert c.usage.completion_tokens == 0
    assert lp.token_logprobs[0] is None
    for pos in range(1, len(ref["ids"])):
        assert_close(lp.token_logprobs[pos], ref["logprob"][pos], REF_TOL, f"echo[{pos}]")
    assert lp.text_offset[0] == 0


def test_completion_stream_matches(client):
    kw = dict(model=MODEL_ID, prompt=PROMPT, max_tokens=8, temperature=0)
    full = client.completions.create(**kw)
    text, finish = "", None
    for chunk in client.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            text += ch.text
            finish = ch.finish_reason or finish
    assert text == full.choices[0].text
    assert finish == full.choices[0].finish_reason == "length"


def _chat(client, **kw):
    return client.chat.completions.create(model=MODEL_ID, messages=CHAT, max_tokens=8,
                                          temperature=0, logprobs=True, top_logprobs=2, **kw)


def test_chat_logprobs(client, reference):
    ref = reference["prompts"][CHAT_REF]
    c = _chat(client)
    assert c.object == "chat.completion" and c.model == MODEL_ID
    ch = c.choices[0]
    assert ch.message.role == "assistant"
    content = ch.logprobs.content
    assert c.usage.prompt_tokens == len(ref["ids"]), "chat template renders differently"
    assert c.usage.completion_tokens == len(content)
    assert "".join(e.token for e in content) == ch.message.content
    for i, e in enumerate(content):
        assert math.isfinite(e.logprob) and e.logprob <= 0
        assert bytes(e.bytes) == e.token.encode("utf-8"), e
        assert len(e.top_logprobs) == 2, e.top_logprobs
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
        assert e.top_logprobs[0].token == e.token
        assert abs(e.top_logprobs[0].logprob - e.logprob) <= SAME_TOL
    for i, e in enumerate(content):
        if ref["greedy_margin"][i] <= 1e-3:
            break  # a near-tie may flip; later steps then follow another path
        assert_close(e.logprob, ref["greedy_logprobs"][i], REF_TOL, f"chat token {i}")


def test_chat_stream_matches(client):
    full = _chat(client)
    text, entries, finish = "", [], None
    for chunk in _chat(client, stream=True):
        for ch in chunk.choices:
            text += ch.delta.content or ""
            if ch.logprobs and ch.logprobs.content:
                entries.extend(ch.logprobs.content)
            finish = ch.finish_reason or finish
    want = full.choices[0]
    assert text == want.message.content
    assert finish == want.finish_reason
    assert [e.token for e in entries] == [e.token for e in want.logprobs.content]
    for g, w in zip(entries, want.logprobs.content):
        assert abs(g.logprob - w.logprob) <= SAME_TOL
        assert [t.token for t in g.top_logprobs] == [t.token for t in w.top_logprobs]
        for gt, wt in zip(g.top_logprobs, w.top_logprobs):
            assert abs(gt.logprob - wt.logprob) <= SAME_TOL


def test_chat_without_logprobs_has_none(client):
    c = client.chat.completions.create(model=MODEL_ID, messages=CHAT, max_tokens=4,
                                       temperature=0)
    assert c.choices[0].logprobs is None
    short = c.choices[0].message.content
    assert short and _chat(client).choices[0].message.content.startswith(short)


GREEDY_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a village by the sea,",
    "1, 2, 3, 4, 5, 6,",
    "Photosynthesis is the process by which",
    "The three primary colors are",
]


def test_greedy_text_is_the_same_with_and_without_logprobs(client, server):
    """An answer that shows no logprob has its greedy tokens found from the output layer's
    index, without every logit (docs/shard.md, "Greedy tokens without scores"): the same
    tokens. Sent together, so the unscored and scored requests share decode steps."""
    from concurrent.futures import ThreadPoolExecutor

    def complete(prompt, logprobs):
        c = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=32,
                                      temperature=0, logprobs=logprobs)
        return c.choices[0].text

    def tgi(prompt, details):
        return generate(server, prompt, max_new_tokens=32, details=details)["generated_text"]

    with ThreadPoolExecutor(len(GREEDY_PROMPTS) * 4) as pool:
        jobs = [(p, pool.submit(complete, p, None), pool.submit(complete, p, 1),
                 pool.submit(tgi, p, False), pool.submit(tgi, p, True))
                for p in GREEDY_PROMPTS]
        for prompt, plain, scored, tgi_plain, tgi_scored in jobs:
            text = scored.result()
            assert text, prompt
            assert plain.result() == text, prompt
            assert tgi_plain.result() == tgi_scored.result() == text, prompt
