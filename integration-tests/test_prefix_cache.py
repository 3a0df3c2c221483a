"""The automatic prefix cache over HTTP, on the real model: many candidate endings of one
long context, one after another and all at once, and /v1/score items of one query, each
answer compared with the same request on a server whose shard runs without the cache. The
answers must be equal — every prompt logprob, top token, label logprob and generated token
— while the cache reports the prompt tokens it supplied (Prometheus, OpenAI's usage)."""

import concurrent.futures as cf

import openai
import pytest

from sonde_http import MODEL_ID, ok_json, post

BLOCK = 16
CONTEXT = (
    "The following is a passage from a science textbook, followed by a question.\n\n"
    "Plants make their own food through photosynthesis. In the chloroplasts of leaf cells, "
    "chlorophyll absorbs light, mostly red and blue wavelengths, and reflects green, which is "
    "why leaves look green. The energy of that light splits water molecules into oxygen, "
    "which the plant releases, and hydrogen, which it combines with carbon dioxide taken in "
    "through small pores called stomata. The product is glucose, a sugar the plant burns for "
    "energy or links into starch and cellulose. Photosynthesis happens only where there is "
    "light, but plants respire day and night, so at night they take in oxygen and give off "
    "carbon dioxide like animals do. Desert plants such as cacti open their stomata at night "
    "to save water and store the carbon dioxide as an acid until morning.\n\n"
    "Question: Which gas do plants release during photosynthesis?\nAnswer:"
)
ENDINGS = [" Oxygen.", " Carbon dioxide.", " Nitrogen.", " Hydrogen.", " Water vapour.",
           " Methane.", " Oxygen, split from water.", " None at all."]
SCORES = {"max_new_tokens": 3, "details": True, "decoder_input_details": True,
          "top_n_tokens": 3, "logprob_token_ids": [0, 13, 260]}


@pytest.fixture(scope="module")
def cold(launch):
    return launch(["--enable-prefill-logprobs"], name="sonde-no-prefix-cache",
                  shard_args=["--prefix-caching", "false"])


def _hits(server):
    return server.metrics().get("sonde_prefix_cache_hit_tokens_total", 0.0)


def _context_blocks(server, text):
    ids = ok_json(post(server, "/tokenize", {"inputs": text}))
    return len(ids) // BLOCK * BLOCK


def _answer(server, text):
    return ok_json(post(server, "/generate", {"inputs": text, "parameters": SCORES}))


def test_info_says_whether_the_cache_is_on(server, cold):
    assert server.info()["prefix_caching"] is True
    assert server.info()["prefix_block_tokens"] == BLOCK
    assert cold.info()["prefix_caching"] is False


def test_endings_of_one_context_score_as_without_the_cache(server, cold):
    shared = _context_blocks(server, CONTEXT)
    assert shared >= 8 * BLOCK, "the context spans many blocks"
    before = _hits(server)
    for ending in ENDINGS:
        text = CONTEXT + ending
        assert _answer(server, text) == _answer(cold, text), ending
    hits = _hits(server) - before
    assert hits >= (len(ENDINGS) - 1) * shared, f"{hits} prompt tokens from the cache"
    assert _hits(cold) == 0


def test_endings_arriving_together_score_as_without_the_cache(server, cold):
    context = "From a primer. " + CONTEXT
    shared = _context_blocks(server, context)
    before = _hits(server)
    with cf.ThreadPoolExecutor(len(ENDINGS)) as pool:
        warm = list(pool.map(lambda e: _answer(server, context + e), ENDINGS))
    for ending, got in zip(ENDINGS, warm, strict=True):
        assert got == _answer(cold, context + ending), ending
    # Whether they met in one prefill (the shard's second wave) or came one after another,
    # only the first computed the context.
    hits = _hits(server) - before
    assert hits >= (len(ENDINGS) - 1) * shared, f"{hits} prompt tokens from the cache"


def test_score_items_of_one_query_score_as_without_the_cache(server, cold):
    # Each test's context starts differently, so none finds another's blocks cached.
    query = "From a field guide. " + CONTEXT
    shared = _context_blocks(server, query)
    body = {"query": query, "items": ENDINGS, "label_token_ids": [0, 13, 260, 1000]}
    before = _hits(server)
    warm = ok_json(post(server, "/v1/score", body))
    assert warm == ok_json(post(cold, "/v1/score", body))
    hits = _hits(server) - before
    assert hits >= (len(ENDINGS) - 1) * shared, f"{hits} prompt tokens from the cache"


def test_openai_usage_counts_the_cached_prompt_tokens(server, cold):
    """OpenAI's `usage.prompt_tokens_details.cached_tokens`, read by the official client:
    what the cache supplied, streamed or not; 0 on a server without the cache."""
    context = "From a lecture. " + CONTEXT
    shared = _context_blocks(server, context)
    warm_client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", timeout=300,
                                max_retries=0)
    cold_client = openai.OpenAI(base_url=cold.url + "/v1", api_key="x", timeout=300,
                                max_retries=0)

    def complete(client, ending):
        return client.completions.create(model=MODEL_ID, prompt=context + ending, max_tokens=2,
                                         temperature=0)

    first = complete(warm_client, ENDINGS[0])
    assert first.usage.prompt_tokens_details.cached_tokens == 0, "nothing was cached yet"
    again = complete(warm_client, ENDINGS[1])
    assert again.usage.prompt_tokens_details.cached_tokens >= shared
    assert again.usage.prompt_tokens_details.cached_tokens < again.usage.prompt_tokens
    assert complete(cold_client, ENDINGS[1]).usage.prompt_tokens_details.cached_tokens == 0
    assert again.choices[0].text == complete(cold_client, ENDINGS[1]).choices[0].text

    stream = warm_client.completions.create(model=MODEL_ID, prompt=context + ENDINGS[2],
                                            max_tokens=2, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    usage = [c.usage for c in stream if c.usage is not None]
    assert len(usage) == 1 and usage[0].prompt_tokens_details.cached_tokens >= shared
