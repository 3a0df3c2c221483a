"""Speculative decoding over HTTP, on the real model: the default server drafts tokens from
each request's own prompt and output, and every answer must equal the same request's on a
server whose shard does not draft — tokens, text, logprobs, top tokens, label logprobs,
finish reasons — greedy and seeded sampling, whole and streamed (several tokens may come
in one step), with stop sequences ending a request inside a draft; while /metrics shows
drafts were fed and taken."""

import concurrent.futures as cf

import openai
import pytest

from sonde_http import MODEL_ID, ok_json, post

REPEATING = (
    "Name: Ada Lovelace. Born: 1815. Field: mathematics.\n"
    "Name: Alan Turing. Born: 1912. Field: mathematics.\n"
    "Name: Grace Hopper. Born: 1906. Field: computing.\n"
    "Name: Ada Lovelace. Born:"
)
CODE = (
    "def area(shape):\n"
    "    if shape.kind == 'square':\n"
    "        return shape.side * shape.side\n"
    "    if shape.kind == 'rectangle':\n"
    "        return shape.width * shape.height\n"
    "    if shape.kind =="
)
PLAIN = "The history of the printing press begins in"
PROMPTS = [REPEATING, CODE, PLAIN]
DETAILS = {"details": True, "top_n_tokens": 3, "logprob_token_ids": [0, 13, 260]}


@pytest.fixture(scope="module")
def plain(launch):
    return launch(["--enable-prefill-logprobs"], name="sonde-no-speculation",
                  shard_args=["--speculate", "0"])


def _metric(server, name):
    return server.metrics().get(name, 0.0)


def _generate(server, text, **parameters):
    body = {"inputs": text, "parameters": {**DETAILS, **parameters}}
    return ok_json(post(server, "/generate", body))


def test_generate_answers_equal_those_of_a_server_that_does_not_draft(server, plain):
    drafted = _metric(server, "sonde_speculative_drafted_tokens_total")
    accepted = _metric(server, "sonde_speculative_accepted_tokens_total")
    for text in PROMPTS:
        for params in [{"max_new_tokens": 40},
                       {"max_new_tokens": 40, "do_sample": True, "temperature": 0.8,
                        "top_k": 20, "seed": 42},
                       {"max_new_tokens": 30, "repetition_penalty": 1.2},
                       {"max_new_tokens": 40, "stop": ["1912"]}]:
            assert _generate(server, text, **params) == _generate(plain, text, **params), \
                (text[:20], params)
    assert _metric(server, "sonde_speculative_drafted_tokens_total") > drafted
    assert _metric(server, "sonde_speculative_accepted_tokens_total") > accepted + 10
    assert _metric(plain, "sonde_speculative_drafted_tokens_total") == 0


def test_streamed_openai_completions_equal_the_plain_servers(server, plain):
    def stream(s, text):
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="-")
        chunks = client.completions.create(model=MODEL_ID, prompt=text, max_tokens=32,
                                           logprobs=2, stream=True, temperature=0)
        out = []
        for c in chunks:
            choice = c.choices[0]
            lp = choice.logprobs
            out.append((choice.text, choice.finish_reason,
                        lp and (lp.tokens, lp.token_logprobs, lp.top_logprobs)))
        return out

    for text in PROMPTS:
        got, want = stream(server, text), stream(plain, text)
        assert "".join(t for t, _, _ in got) == "".join(t for t, _, _ in want), text[:20]
        # Token by token, whatever the steps that carried them.
        flat = lambda chunks: [x for _, _, lp in chunks if lp for x in zip(*lp)]  # noqa: E731
        assert flat(got) == flat(want), text[:20]
        assert got[-1][1] == want[-1][1]


def test_concurrent_drafting_requests_equal_their_plain_answers(server, plain):
    # A few streams at once share the step's row budget; each answer is its own.
    texts = [REPEATING, CODE, REPEATING + " 1815. Field:", CODE + " 'circle':"]
    params = {"max_new_tokens": 24}
    with cf.ThreadPoolExecutor(len(texts)) as pool:
        got = list(pool.map(lambda t: _generate(server, t, **params), texts))
    for text, answer in zip(texts, got, strict=True):
        assert answer == _generate(plain, text, **params), text[-20:]
