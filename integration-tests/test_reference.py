"""Scores served over HTTP against the independent float64 forward pass (forward.json).

The shard is checked against the same reference in its own tests; here the question is
whether the router carries every number to the right place: prompt position p, token k,
label j, top-N rank r.
"""

import math

import pytest

from sonde_http import REF_TOL, SAME_TOL, TIE, assert_close, generate

N_PROMPTS = 8
MAX_NEW = 8


def _prompt(reference, i):
    prompts = reference["prompts"]
    assert len(prompts) >= 3, "forward.json should hold at least 3 prompts"
    if i >= len(prompts):
        pytest.fail(f"forward.json has only {len(prompts)} prompts")
    return prompts[i]


@pytest.fixture(scope="module")
def scored(server, reference):
    """One scored /generate per reference prompt, computed once for the whole module."""
    out = []
    for p in reference["prompts"][:N_PROMPTS]:
        out.append(generate(server, p["text"], max_new_tokens=MAX_NEW, details=True,
                            decoder_input_details=True, top_n_tokens=5,
                            logprob_token_ids=reference["label_ids"]))
    return out


def _compared_steps(ref_prompt, tokens):
    """Generated steps that must match the reference greedy run: up to the first near-tie."""
    n = 0
    for k in range(len(tokens)):
        if ref_prompt["greedy_margin"][k] <= TIE:
            break
        n = k + 1
    return n


def _check_labels(got, want_logprobs, label_ids, what):
    assert [e["id"] for e in got] == label_ids, f"{what}: label ids/order"
    for j, (g, w) in enumerate(zip(got, want_logprobs)):
        assert isinstance(g["text"], str), g
        assert_close(g["logprob"], w, REF_TOL, f"{what} label {label_ids[j]}")


@pytest.mark.parametrize("i", range(N_PROMPTS))
def test_prefill_matches_reference(scored, reference, i):
    p, d = _prompt(reference, i), scored[i]["details"]
    prefill = d["prefill"]
    assert [t["id"] for t in prefill] == p["ids"], "router tokenized differently"
    assert d["input_length"] == len(p["ids"])
    assert prefill[0]["logprob"] is None
    for pos in range(1, len(p["ids"])):
        assert_close(prefill[pos]["logprob"], p["logprob"][pos], REF_TOL, f"prefill[{pos}]")
        # Prompt position p carries what the model predicted for ids[p], i.e. after ids[:p].
        _check_labels(prefill[pos]["label_logprobs"], p["labels"][pos - 1],
                      reference["label_ids"], f"prefill[{pos}]")


@pytest.mark.parametrize("i", range(N_PROMPTS))
def test_greedy_tokens_match_reference(scored, reference, i):
    p, d = _prompt(reference, i), scored[i]["details"]
    tokens = d["tokens"]
    assert d["generated_tokens"] == len(tokens)
    if d["finish_reason"] == "length":
        assert len(tokens) == MAX_NEW
    else:
        assert d["finish_reason"] == "eos_token", d["finish_reason"]
        assert tokens[-1]["special"] is True
    for k in range(_compared_steps(p, tokens)):
        assert tokens[k]["id"] == p["greedy"][k], f"step {k}"
        assert_close(tokens[k]["logprob"], p["greedy_logprobs"][k], REF_TOL, f"token {k}")
    # The first generated token comes from the distribution after the whole prompt.
    _check_labels(tokens[0]["label_logprobs"], p["labels"][-1], reference["label_ids"],
                  "tokens[0]")
    for k, t in enumerate(tokens):
        assert len(t["label_logprobs"]) == len(reference["label_ids"]), f"token {k}"


@pytest.mark.parametrize("i", range(N_PROMPTS))
def test_first_top_tokens_match_reference(scored, reference, i):
    p, d = _prompt(reference, i), scored[i]["details"]
    ref_top = p["top"][-1]
    top = d["top_tokens"][0]
    assert len(top) == 5
    assert len(d["top_tokens"]) == len(d["tokens"])
    for r, entry in enumerate(top):
        assert_close(entry["logprob"], ref_top[r][1], REF_TOL, f"top[{r}]")
        # Accept any id whose reference logprob ties with rank r within the tolerance.
        tied = {tid for tid, lp in ref_top if abs(lp - ref_top[r][1]) <= TIE}
        assert entry["id"] in tied, f"top[{r}] id {entry['id']}, reference {ref_top[r]}"
    for k, (tok, alts) in enumerate(zip(d["tokens"], d["top_tokens"])):
        assert len(alts) == 5 and alts[0]["id"] == tok["id"], f"step {k}"
        lps = [a["logprob"] for a in alts]
        assert lps == sorted(lps, reverse=True), f"step {k}: {lps}"


def test_return_logits_and_rank(server, reference):
    p = _prompt(reference, 1)
    r = generate(server, p["text"], max_new_tokens=6, details=True, decoder_input_details=True,
                 return_logits=True)
    d = r["details"]
    for k, t in enumerate(d["tokens"]):
        assert isinstance(t["logit"], float) and math.isfinite(t["logit"]), t
        assert type(t["rank"]) is int and t["rank"] == 1, f"greedy token {k} has rank {t['rank']}"
    # Prompt tokens were not chosen by the model, so their rank says where they stood.
    for pos in range(1, len(p["ids"])):
        t, ref_top = d["prefill"][pos], p["top"][pos - 1]
        assert type(t["rank"]) is int and t["rank"] >= 1, t
        assert isinstance(t["logit"], float) and math.isfinite(t["logit"]), t
        ranks = [r for r, (tid, _) in enumerate(ref_top) if tid == t["id"]]
        if ranks:
            lp = ref_top[ranks[0]][1]
            # Rank is only pinned when no neighbour of the reference ties with it.
            if all(abs(lp - other) > TIE for j, (_, other) in enumerate(ref_top) if j != ranks[0]):
                assert t["rank"] == ranks[0] + 1, f"prefill[{pos}] rank"
        else:
            assert t["rank"] > len(ref_top) - 1, f"prefill[{pos}] rank {t['rank']}"


def test_label_logprobs_agree_with_token_and_top_scores(scored, reference):
    """A label that is also the chosen token or a top-N entry must carry the same number."""
    label_ids = reference["label_ids"]
    checked = 0
    for r in scored:
        d = r["details"]
        for k, (tok, alts) in enumerate(zip(d["tokens"], d["top_tokens"])):
            assert [e["id"] for e in tok["label_logprobs"]] == label_ids, f"step {k}"
            labels = {e["id"]: e["logprob"] for e in tok["label_logprobs"]}
            for scored_tok in [tok, *alts]:
                if scored_tok["id"] in labels:
                    assert abs(labels[scored_tok["id"]] - scored_tok["logprob"]) <= SAME_TOL, (
                        f"step {k}: label {scored_tok['id']}")
                    checked += 1
    # eos (2) and newline (198) are labels and show up in these prompts' top-5s.
    assert checked > 0, "no label overlapped a scored token: the check above never ran"
