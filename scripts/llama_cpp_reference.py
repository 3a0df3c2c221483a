#!/usr/bin/env python3
"""llama.cpp's own answers for the prompts of a float64 reference, and the comparison.

Starts llama.cpp's `llama-server` (scripts/build-llama-server) on MODEL.gguf on 127.0.0.1 (a
free port, 2 threads, one slot, no warm-up), and for the prompt ids of FORWARD.json (the output
of reference_forward.py on the same file) records

  * its greedy continuation (POST /completion with the token-id prompt, temperature 0, top_k 1,
    no prompt cache, n_probs TOP_N: the log-probabilities of its top tokens before sampling at
    each step). llama-server stops at an end-of-generation token, which the reference does not:
    the request is then repeated with the tokens so far as the prompt until GREEDY_TOKENS are
    there;
  * its tokenization (POST /tokenize) of HARD_STRINGS and of the prompts' texts, with
    add_special and parse_special true (as a server prompt is tokenized) and with both false;

then compares its greedy tokens with the reference's (equal? the first divergence and the
reference's top-1/top-2 margin there) and its log-probabilities with the reference's top-10 at
every step where both have seen the same tokens. Writes it all to OUT.json and prints a summary.

Usage:
  llama_cpp_reference.py [--server BIN] [--server-arg=ARG ...] MODEL.gguf FORWARD.json OUT.json
  llama_cpp_reference.py [--server BIN] --gemma3-prompt-ids MODEL.gguf OUT.json
      tokenizes reference_forward.GEMMA3_PROMPTS (BOS added, special tokens parsed) and writes
      {"vocab_sha256", "prompts": [{"text", "ids"}]}: the source of reference_forward.py's
      builtin:gemma3 ids.

BIN defaults to data/llama.cpp/build/bin/llama-server (under $SONDE_DATA_DIR if set).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.environ.get("SONDE_DATA_DIR", os.path.join(ROOT, "data"))
DEFAULT_SERVER = os.path.join(DATA, "llama.cpp", "build", "bin", "llama-server")
GREEDY_TOKENS = 32
TOP_N = 10
CONTEXT = 2048
HARD_STRINGS = [
    "",
    " ",
    "  ",
    "\t",
    "\n",
    "\n\n\n",
    " \n \t x",
    "Hello world",
    " Hello world",
    "Hello  world   ",
    "hello\r\nworld",
    "1234567890 3.14159 1,000,000 2024-03-15",
    "    def f(x):\n        return x ** 2  # square\n",
    "tab\tseparated\tvalues",
    "ÀÁÂÃÄÅ àáâãäå ñ ß ø",
    "e\u0301 n\u0303 (combining marks)",
    "東京の天気は晴れです。",
    "Привет, мир! Ελληνικά",
    "مرحبا بالعالم",
    "🙂😀👍🏽 🇫🇷 👨‍👩‍👧",
    "\u0000\u0001\u001f control",
    "\u200b zero\u200dwidth \ufeff",
    "supercalifragilisticexpialidocious" * 3,
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos><eos><pad><unk>",
    "<|endoftext|> <s> </s>",
    "<|im_start|",
    "a<|im_end|>b",
]


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A llama-server child process on 127.0.0.1; stopped (by its own pid) on exit."""

    def __init__(self, binary, model, extra=()):
        self.port = free_port()
        self.args = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(self.port),
                     "-t", "2", "-tb", "2", "-c", str(CONTEXT), "-np", "1", "--no-warmup",
                     *extra]
        self.log = tempfile.NamedTemporaryFile(prefix="llama-server.", suffix=".log", delete=False)
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while True:
            if self.proc.poll() is not None:
                self.fail(f"llama-server exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.url("/health"), timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                self.fail("llama-server did not become healthy")
            time.sleep(0.3)

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def fail(self, message):
        self.stop()
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-3000:]
        sys.exit(f"{message}; log {self.log.name}:\n{tail}")

    def post(self, path, body):
        req = urllib.request.Request(self.url(path), data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            self.fail(f"POST {path}: HTTP {e.code}: {e.read()[:500]!r}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def greedy(server, ids):
    """GREEDY_TOKENS greedy tokens after `ids`, each with llama.cpp's top TOP_N [id, logprob]."""
    tokens, steps = [], []
    while len(tokens) < GREEDY_TOKENS:
        r = server.post("/completion", {
            "prompt": ids + tokens, "n_predict": GREEDY_TOKENS - len(tokens),
            "temperature": 0.0, "top_k": 1, "n_probs": TOP_N, "cache_prompt": False,
            "return_tokens": True, "samplers": ["top_k"],
        })
        if r["tokens_evaluated"] != len(ids) + len(tokens):
            server.fail(f"llama-server evaluated {r['tokens_evaluated']} prompt tokens,"
                        f" expected {len(ids) + len(tokens)} (did it add a BOS?)")
        probs = r["completion_probabilities"]
        # At an end-of-generation token llama-server stops; `tokens` then leaves that token
        # out while `completion_probabilities` has it: both are the same steps.
        got = [p["id"] for p in probs]
        if not probs or got[:len(r["tokens"])] != r["tokens"] or len(got) > len(r["tokens"]) + 1:
            server.fail(f"completion_probabilities {got} do not match the tokens {r['tokens']}")
        for p in probs:
            tokens.append(p["id"])
            steps.append({"id": p["id"], "logprob": p["logprob"],
                          "top": [[t["id"], t["logprob"]] for t in p["top_logprobs"]]})
    return tokens[:GREEDY_TOKENS], steps[:GREEDY_TOKENS]


def tokenize(server, text, special):
    r = server.post("/tokenize", {"content": text, "add_special": special,
                                  "parse_special": special})
    return r["tokens"]


def compare(ref, got_tokens, got_steps):
    """Agreement of llama.cpp's greedy tokens with the reference's, and its logprob errors
    against the reference's top-10 while both have seen the same tokens."""
    want = ref["greedy"]
    diverge = next((k for k, (a, b) in enumerate(zip(want, got_tokens)) if a != b), None)
    out = {"equal": diverge is None, "first_divergence": diverge}
    if diverge is not None:
        ref_top = dict(ref["greedy_top"][diverge]) if "greedy_top" in ref else {}
        out.update({
            "reference_token": want[diverge], "llama_token": got_tokens[diverge],
            "reference_margin": ref["greedy_margin"][diverge],
            "reference_logprob_of_llama_token": ref_top.get(got_tokens[diverge]),
            "llama_margin": got_steps[diverge]["top"][0][1] - got_steps[diverge]["top"][1][1],
        })
    errors = []
    last = GREEDY_TOKENS if diverge is None else diverge + 1  # step `diverge` saw equal tokens
    for k in range(min(last, len(got_steps))):
        if "greedy_top" not in ref:
            errors.append(abs(got_steps[k]["logprob"] - ref["greedy_logprobs"][k]))
            continue
        ref_top = dict(ref["greedy_top"][k])
        errors += [abs(lp - ref_top[t]) for t, lp in got_steps[k]["top"] if t in ref_top]
    if errors:
        out.update({"logprob_error_mean": sum(errors) / len(errors),
                    "logprob_error_max": max(errors), "logprobs_compared": len(errors)})
    return out


def run(server, forward_path, out_path):
    with open(forward_path, encoding="utf-8") as f:
        forward = json.load(f)
    started = time.perf_counter()
    prompts, summary = [], []
    for i, ref in enumerate(forward["prompts"]):
        tokens, steps = greedy(server, ref["ids"])
        cmp = compare(ref, tokens, steps)
        entry = {"ids": ref["ids"], "greedy": tokens, "steps": steps, "comparison": cmp}
        if ref.get("text") is not None:
            entry["text"] = ref["text"]
            entry["tokenized"] = tokenize(server, ref["text"], True)
            entry["tokenized_matches_reference_ids"] = entry["tokenized"] == ref["ids"]
        prompts.append(entry)
        line = f"prompt {i}: {len(ref['ids']):4d} tokens, greedy "
        if cmp["equal"]:
            line += "equal"
        else:
            line += (f"differs at {cmp['first_divergence']} (ref {cmp['reference_token']} vs"
                     f" llama {cmp['llama_token']}, ref margin {cmp['reference_margin']:.3g},"
                     f" llama margin {cmp['llama_margin']:.3g})")
        if "logprob_error_max" in cmp:
            line += (f"; logprob error mean {cmp['logprob_error_mean']:.3g}"
                     f" max {cmp['logprob_error_max']:.3g} ({cmp['logprobs_compared']})")
        if "tokenized_matches_reference_ids" in entry:
            line += f"; text tokenizes to the ids: {entry['tokenized_matches_reference_ids']}"
        print(line, flush=True)
        summary.append(cmp)
    strings = [{"text": s, "special": tokenize(server, s, True),
                "plain": tokenize(server, s, False)} for s in HARD_STRINGS]
    errors = [c for c in summary if "logprob_error_max" in c]
    total = {
        "prompts": len(summary),
        "greedy_equal": sum(c["equal"] for c in summary),
        "logprob_error_max": max((c["logprob_error_max"] for c in errors), default=None),
        "logprob_error_mean": (sum(c["logprob_error_mean"] * c["logprobs_compared"]
                                   for c in errors)
                               / max(1, sum(c["logprobs_compared"] for c in errors))),
        "seconds": time.perf_counter() - started,
    }
    print(f"greedy equal in {total['greedy_equal']}/{total['prompts']} prompts; logprob error"
          f" mean {total['logprob_error_mean']:.3g} max {total['logprob_error_max']};"
          f" {total['seconds']:.1f}s")
    out = {
        "description": __doc__.split("\nUsage:")[0].strip(),
        "server_args": server.args[1:],
        "forward": os.path.basename(forward_path),
        "model_sha256": forward.get("model_sha256"),
        "fields": {
            "greedy": f"llama.cpp's {GREEDY_TOKENS} greedy tokens (continued past an"
                      " end-of-generation token)",
            "steps": f"per greedy token: its logprob and llama.cpp's top {TOP_N} [id, logprob]"
                     " before sampling",
            "tokenized": "POST /tokenize of the prompt's text, add_special and parse_special",
            "strings": "HARD_STRINGS tokenized with add_special+parse_special (special) and"
                       " without (plain)",
        },
        "summary": total,
        "prompts": prompts,
        "strings": strings,
    }
    tmp = out_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    os.replace(tmp, out_path)


def gemma3_prompt_ids(server, model, out_path):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import reference_forward
    from gguf import GGUFReader
    prompts = [{"text": t, "ids": tokenize(server, t, True)}
               for t in reference_forward.GEMMA3_PROMPTS]
    out = {"vocab_sha256": reference_forward.vocab_sha256(GGUFReader(model)),
           "prompts": prompts}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
        f.write("\n")
    print(f"{sum(len(p['ids']) for p in prompts)} tokens in {len(prompts)} prompts")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", default=DEFAULT_SERVER)
    parser.add_argument("--gemma3-prompt-ids", action="store_true")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="an extra llama-server argument (repeat it), e.g. --server-arg=-fa"
                             " --server-arg=off")
    parser.add_argument("model")
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args()
    if not os.access(args.server, os.X_OK):
        sys.exit(f"no llama-server at {args.server} (scripts/build-llama-server builds it)")
    if len(args.paths) != (1 if args.gemma3_prompt_ids else 2):
        sys.exit(__doc__)
    with Server(args.server, args.model, args.server_arg) as server:
        if args.gemma3_prompt_ids:
            gemma3_prompt_ids(server, args.model, args.paths[0])
        else:
            run(server, *args.paths)


if __name__ == "__main__":
    main()
