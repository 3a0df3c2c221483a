"""lm-evaluation-harness, unmodified, against the real server: its `local-completions`
model with the server's own tokenizer (`tokenizer_backend=remote`: /tokenizer_info,
/tokenize, /detokenize), sending token-id prompts to /v1/completions.

- A multiple-choice task (`echo` + `logprobs`, `max_tokens: 1`): every log-likelihood it
  reports must equal the sum of the prompt logprobs Sonde's TGI route gives for the same
  tokens, and its accuracy the argmax of those sums.
- A generative task (greedy, stop sequences): every answer must be the text Sonde's TGI
  route generates for the same prompt and stops.

The harness adds nothing and loses nothing on the way."""

import json
import os
import subprocess
import sys

from sonde_http import MODEL_ID, generate, ok_json, post

# Questions whose answers the model may or may not know: the test checks the numbers, not
# the model.
DOCS = [
    {"question": "The capital of France is", "choices": [" Paris", " London", " Rome"],
     "answer": 0},
    {"question": "Two plus two equals", "choices": [" four", " five", " three hundred"],
     "answer": 0},
    {"question": "The sun rises in the", "choices": [" west", " east"], "answer": 1},
    {"question": "Water freezes at zero degrees", "choices": [" Celsius", " Fahrenheit"],
     "answer": 0},
]

QUESTIONS = [
    {"question": "The capital of France is", "answer": "Paris"},
    {"question": "Once upon a time, there was a", "answer": "girl"},
    {"question": "The three primary colors are", "answer": "red"},
]

GEN_TASK = """task: sonde_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: [".", "\\n"]
  max_gen_toks: 12
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
"""

TASK = """task: sonde_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
"""


def _run_harness(server, tmp_path, task, template, docs):
    data = tmp_path / f"{task}.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / f"{task}.yaml").write_text(template.format(data=data))
    out = tmp_path / "out"
    model_args = ",".join([
        f"model={MODEL_ID}",
        f"base_url={server.url}/v1/completions",
        "tokenizer_backend=remote",
        "tokenized_requests=True",
        "num_concurrent=2",
        "max_retries=1",
    ])
    # The datasets library must not look for the task's data anywhere but on disk.
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               HF_HOME=str(tmp_path / "hf"))
    cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions",
           "--model_args", model_args, "--tasks", task, "--include_path", str(tasks),
           "--output_path", str(out), "--log_samples", "--batch_size", "1"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"lm_eval failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    results = next(out.rglob("results_*.json"))
    samples = next(out.rglob(f"samples_{task}_*.jsonl"))
    rows = [json.loads(line) for line in samples.read_text().splitlines() if line.strip()]
    return json.loads(results.read_text()), sorted(rows, key=lambda r: r["doc_id"])


def _tokens(server, text):
    return ok_json(post(server, "/tokenize", {"prompt": text, "add_special_tokens": False}))["tokens"]


def _loglikelihood(server, context, continuation):
    """The continuation's log-probability after the context, from /generate's prompt scores
    over the tokens the harness scores: context tokens, then the rest of the whole's."""
    ctx = _tokens(server, context)
    whole = _tokens(server, context + continuation)
    assert whole[:len(ctx)] == ctx, "the context tokenizes the same alone and joined"
    text = ok_json(post(server, "/detokenize", {"tokens": whole}))["prompt"]
    r = generate(server, text, max_new_tokens=0, decoder_input_details=True)
    prefill = r["details"]["prefill"]
    assert [t["id"] for t in prefill] == whole, "the text reads back as the same tokens"
    return sum(t["logprob"] for t in prefill[len(ctx):])


def test_lm_eval_multiple_choice_scores_are_sondes(server, tmp_path):
    results, rows = _run_harness(server, tmp_path, "sonde_mc", TASK, DOCS)
    assert [r["doc_id"] for r in rows] == list(range(len(DOCS)))
    correct = 0
    for row, doc in zip(rows, DOCS):
        got = [float(resp[0][0]) for resp in row["resps"]]
        assert len(got) == len(doc["choices"])
        want = [_loglikelihood(server, doc["question"], c) for c in doc["choices"]]
        # The same f32 scores summed in the same order: equal, not merely close.
        assert got == want, f"doc {row['doc_id']}: harness {got} != Sonde {want}"
        correct += max(range(len(want)), key=want.__getitem__) == doc["answer"]
    acc = results["results"]["sonde_mc"]["acc,none"]
    assert acc == correct / len(DOCS)


def test_lm_eval_generation_is_sondes(server, tmp_path):
    results, rows = _run_harness(server, tmp_path, "sonde_gen", GEN_TASK, QUESTIONS)
    assert [r["doc_id"] for r in rows] == list(range(len(QUESTIONS)))
    for row, doc in zip(rows, QUESTIONS):
        got = row["resps"][0][0]
        stops = [".", "\n"]
        r = generate(server, doc["question"], max_new_tokens=12, stop=stops, details=True)
        want = r["generated_text"]
        # TGI's text keeps the stop sequence it ended on; OpenAI's (the harness's) does not.
        if r["details"]["finish_reason"] == "stop_sequence":
            stop = next(s for s in stops if want.endswith(s))
            want = want[: -len(stop)]
        assert got == want, f"doc {row['doc_id']}"
    assert "exact_match,none" in results["results"]["sonde_gen"]
