#!/usr/bin/env python3
"""Independent float64 reference forward pass of a Llama-architecture GGUF model.

Written from the architecture definition in numpy, sharing no code with Sonde: weights come
from the `gguf` package (`GGUFReader` + `gguf.quants.dequantize`, which yields float32
values that are then held in float64), prompts are tokenized by the `tokenizers` package from
a Hugging Face tokenizer.json, and every computation after dequantization is float64.

The math, for token ids t_0..t_{n-1} (hyperparameters read from the GGUF metadata):

  x_p       = E[t_p]                                     E = token_embd, [n_vocab, n_embd]
  rms(x, w) = x / sqrt(mean(x^2) + eps) * w              eps = ...layer_norm_rms_epsilon
  per layer l:
    h       = rms(x, attn_norm)
    q, k, v = h Wq^T, h Wk^T, h Wv^T                      n_head q heads, n_head_kv k/v heads
    rope(q), rope(k): at position p, pair i in [0, d/2) of each head is rotated by the angle
              p * theta^(-2i/d)  (theta = llama.rope.freq_base, d = head dim);
              GGUF layout pairs (x[2i], x[2i+1]) (llama.cpp permutes the Q/K rows for this),
              Hugging Face layout pairs (x[i], x[i+d/2]) (rotate_half)
    a_h     = softmax(q_h k_g^T / sqrt(d) + causal mask) v_g,  g = h // (n_head / n_head_kv)
    x       = x + concat(a_0..a_{n_head-1}) Wo^T
    h       = rms(x, ffn_norm)
    x       = x + (silu(h Wgate^T) * (h Wup^T)) Wdown^T,  silu(z) = z / (1 + exp(-z))
  logits_p  = rms(x_p, output_norm) Wout^T               Wout = output.weight, or E when tied
  logprobs  = log_softmax(logits) over the full vocabulary

Usage:
  reference_forward.py MODEL.gguf HF_TOKENIZER_DIR OUT.json
      Runs the fixed PROMPTS and writes, per prompt, the prompt ids, the log-probability of
      each prompt token, the top-10 and the LABEL_IDS log-probabilities of the next-token
      distribution at every position, and a GREEDY_TOKENS-token greedy continuation.
  reference_forward.py --self-check MODEL.gguf HF_MODEL_DIR
      Checks a folder written by gguf_to_hf.py (f32): the forward pass over its un-permuted
      weights with rotate_half rope must give the GGUF-layout pass's log-probabilities.
"""

import hashlib
import json
import os
import sys
import time
from importlib.metadata import version

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.numpy import load_file
from tokenizers import Tokenizer

PROMPTS = [
    "Once upon a time",
    "The quick brown fox jumps over the lazy dog. It was a sunny morning in the small village,"
    " and everyone was getting ready for the annual harvest festival.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"
    "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\nprint(fibonacci(10))\n",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nList three primary colors.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "Invoice #4471 (2024-03-15): 3 x $12.99 = $38.97; tax 8.25% -> $3.22; total: $42.19!"
    " Call +1 (555) 010-2030... ok?",
    "Müller's café in Zürich serves crème brûlée — 東京の天気は晴れです。Привет, мир! "
    "Ελληνικά, ¿qué tal? 🙂",
    "Photosynthesis is the process by which green plants, algae and some bacteria convert"
    " light energy into chemical energy. During this process, carbon dioxide and water are"
    " combined, using the energy of sunlight captured by chlorophyll, to produce glucose and"
    " oxygen. The reactions take place in the chloroplasts and are usually divided into two"
    " stages: the light-dependent reactions, which occur in the thylakoid membranes and"
    " produce ATP and NADPH, and the Calvin cycle, which uses these molecules to fix carbon"
    " in the stroma. Almost all life on Earth depends, directly or indirectly, on the sugars"
    " and oxygen that photosynthesis provides.",
]
LABEL_IDS = [0, 1, 2, 17, 198, 330, 1032, 2767, 5821, 10004, 16384, 22222, 30000, 38917,
             45678, 49151]
TOP_K = 10
GREEDY_TOKENS = 32
SELF_CHECK_PROMPT = 3
SELF_CHECK_TOLERANCE = 1e-9


class Model:
    """Float64 weights and hyperparameters; `rope` is "interleaved" (GGUF) or "half" (HF)."""

    def __init__(self, hp, layers, embed, norm, lm_head, rope):
        self.n_head, self.n_head_kv, self.head_dim = hp["n_head"], hp["n_head_kv"], hp["head_dim"]
        self.eps = hp["eps"]
        self.inv_freq = hp["rope_theta"] ** (-np.arange(0, self.head_dim, 2) / self.head_dim)
        self.layers, self.embed, self.norm, self.lm_head = layers, embed, norm, lm_head
        self.rope_style = rope

    def rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, positions):
        """Rotates x [heads, n, head_dim] at the given positions."""
        angle = positions[:, None] * self.inv_freq[None, :]
        cos, sin = np.cos(angle), np.sin(angle)
        if self.rope_style == "interleaved":
            a, b = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2] = a * cos - b * sin
            out[..., 1::2] = a * sin + b * cos
            return out
        half = self.head_dim // 2
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

    def forward(self, ids, cache):
        """Log-probabilities [len(ids), n_vocab] of the token after each of `ids`, which follow
        the tokens already in `cache` (per layer [K, V], each [n_head_kv, n_past, head_dim],
        extended in place)."""
        n, d = len(ids), self.head_dim
        past = cache[0][0].shape[1] if cache else 0
        positions = np.arange(past, past + n, dtype=np.float64)
        mask = np.where(np.arange(past + n)[None, :] > positions[:, None], -np.inf, 0.0)
        group = self.n_head // self.n_head_kv
        x = self.embed[ids]
        for i, layer in enumerate(self.layers):
            h = self.rms(x, layer["attn_norm"])
            q = (h @ layer["wq"].T).reshape(n, self.n_head, d).transpose(1, 0, 2)
            k = (h @ layer["wk"].T).reshape(n, self.n_head_kv, d).transpose(1, 0, 2)
            v = (h @ layer["wv"].T).reshape(n, self.n_head_kv, d).transpose(1, 0, 2)
            q, k = self.rope(q, positions), self.rope(k, positions)
            if len(cache) == i:
                cache.append([k, v])
            else:
                cache[i] = [np.concatenate([cache[i][0], k], axis=1),
                            np.concatenate([cache[i][1], v], axis=1)]
            keys = np.repeat(cache[i][0], group, axis=0)
            values = np.repeat(cache[i][1], group, axis=0)
            scores = q @ keys.transpose(0, 2, 1) / np.sqrt(d) + mask
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            attn = (scores / scores.sum(axis=-1, keepdims=True)) @ values
            x = x + attn.transpose(1, 0, 2).reshape(n, self.n_head * d) @ layer["wo"].T
            h = self.rms(x, layer["ffn_norm"])
            gate = h @ layer["w_gate"].T
            x = x + (gate / (1.0 + np.exp(-gate)) * (h @ layer["w_up"].T)) @ layer["w_down"].T
        logits = self.rms(x, self.norm) @ self.lm_head.T
        shifted = logits - logits.max(axis=-1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def metadata(reader, key):
    return reader.fields[key].contents()


def gguf_hparams(reader):
    arch = metadata(reader, "general.architecture")
    if arch != "llama":
        sys.exit(f"unsupported architecture {arch!r}")
    n_embd = metadata(reader, "llama.embedding_length")
    n_head = metadata(reader, "llama.attention.head_count")
    return {
        "n_layer": metadata(reader, "llama.block_count"),
        "n_embd": n_embd,
        "n_ff": metadata(reader, "llama.feed_forward_length"),
        "n_head": n_head,
        "n_head_kv": metadata(reader, "llama.attention.head_count_kv"),
        "head_dim": n_embd // n_head,
        # Stored as float32; the shortest decimal that round-trips it (1e-05), as in HF configs.
        "eps": float(str(np.float32(metadata(reader, "llama.attention.layer_norm_rms_epsilon")))),
        "rope_theta": float(metadata(reader, "llama.rope.freq_base")),
    }


def load_gguf(path):
    """The model in GGUF's own layout: Q/K rows permuted, so rope pairs are interleaved."""
    reader = GGUFReader(path)
    hp = gguf_hparams(reader)
    w = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64) for t in reader.tensors}
    layers = [{"attn_norm": w[f"blk.{i}.attn_norm.weight"], "wq": w[f"blk.{i}.attn_q.weight"],
               "wk": w[f"blk.{i}.attn_k.weight"], "wv": w[f"blk.{i}.attn_v.weight"],
               "wo": w[f"blk.{i}.attn_output.weight"], "ffn_norm": w[f"blk.{i}.ffn_norm.weight"],
               "w_gate": w[f"blk.{i}.ffn_gate.weight"], "w_up": w[f"blk.{i}.ffn_up.weight"],
               "w_down": w[f"blk.{i}.ffn_down.weight"]} for i in range(hp["n_layer"])]
    embed = w["token_embd.weight"]
    return hp, Model(hp, layers, embed, w["output_norm.weight"],
                     w.get("output.weight", embed), "interleaved")


def load_hf(folder):
    """The model from a Hugging Face folder (config.json, model.safetensors): rotate_half."""
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    hp = {"n_layer": config["num_hidden_layers"], "n_embd": config["hidden_size"],
          "n_ff": config["intermediate_size"], "n_head": config["num_attention_heads"],
          "n_head_kv": config["num_key_value_heads"], "head_dim": config["head_dim"],
          "eps": config["rms_norm_eps"], "rope_theta": config["rope_theta"]}
    raw = load_file(os.path.join(folder, "model.safetensors"))
    if any(t.dtype != np.float32 for t in raw.values()):
        sys.exit("the self-check needs an f32 folder")
    w = {name: t.astype(np.float64) for name, t in raw.items()}
    layers = []
    for i in range(hp["n_layer"]):
        p = f"model.layers.{i}."
        layers.append({"attn_norm": w[p + "input_layernorm.weight"],
                       "wq": w[p + "self_attn.q_proj.weight"],
                       "wk": w[p + "self_attn.k_proj.weight"],
                       "wv": w[p + "self_attn.v_proj.weight"],
                       "wo": w[p + "self_attn.o_proj.weight"],
                       "ffn_norm": w[p + "post_attention_layernorm.weight"],
                       "w_gate": w[p + "mlp.gate_proj.weight"],
                       "w_up": w[p + "mlp.up_proj.weight"],
                       "w_down": w[p + "mlp.down_proj.weight"]})
    embed = w["model.embed_tokens.weight"]
    lm_head = embed if config["tie_word_embeddings"] else w["lm_head.weight"]
    return hp, Model(hp, layers, embed, w["model.norm.weight"], lm_head, "half")


def ranked(logprobs):
    """Token ids by descending log-probability, ties to the smaller id."""
    return np.argsort(-logprobs, kind="stable")


def run_prompt(model, tok, text):
    ids = tok.encode(text).ids
    cache = []
    lp = model.forward(np.array(ids), cache)
    greedy, greedy_lp, margin = [], [], []
    row = lp[-1]
    for step in range(GREEDY_TOKENS):
        order = ranked(row)
        greedy.append(int(order[0]))
        greedy_lp.append(float(row[order[0]]))
        margin.append(float(row[order[0]] - row[order[1]]))
        if step + 1 < GREEDY_TOKENS:
            row = model.forward(np.array([greedy[-1]]), cache)[0]
    top = [[[int(t), float(r[t])] for t in ranked(r)[:TOP_K]] for r in lp]
    return {
        "text": text,
        "ids": ids,
        "logprob": [None] + [float(lp[p - 1, ids[p]]) for p in range(1, len(ids))],
        "top": top,
        "labels": lp[:, LABEL_IDS].tolist(),
        "greedy": greedy,
        "greedy_logprobs": greedy_lp,
        "greedy_margin": margin,
    }


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def reference(model_path, tokenizer_dir, out_path):
    tok = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    hp, model = load_gguf(model_path)
    prompts = []
    for text in PROMPTS:
        start = time.perf_counter()
        prompts.append(run_prompt(model, tok, text))
        p = prompts[-1]
        print(f"{len(p['ids']):4d} tokens, {time.perf_counter() - start:5.1f}s: {text[:40]!r}"
              f" -> {tok.decode(p['greedy'], skip_special_tokens=False)!r}")
    print(f"{sum(len(p['ids']) for p in prompts)} prompt tokens in {len(prompts)} prompts")
    out = {
        "description": __doc__.split("\nUsage:")[0].strip(),
        "layout": "GGUF (Q/K rows as stored, interleaved rope pairs)",
        "model_sha256": sha256(model_path),
        "versions": {name: version(name) for name in ("numpy", "gguf", "tokenizers")},
        "hparams": hp,
        "fields": {
            "ids": "prompt token ids (tokenizer.json, its own add_special_tokens)",
            "logprob": "logprob[p] = log P(ids[p] | ids[:p]); null at p = 0",
            "top": f"top[p] = the {TOP_K} most likely [id, logprob] after ids[..=p],"
                   " descending, ties to the smaller id",
            "labels": "labels[p][j] = log P(label_ids[j] | ids[..=p])",
            "greedy": f"{GREEDY_TOKENS} argmax tokens after the prompt (ties to the smaller"
                      " id), not stopped at eos",
            "greedy_logprobs": "log-softmax of each greedy token at its step",
            "greedy_margin": "top-1 minus top-2 logprob at each greedy step",
        },
        "label_ids": LABEL_IDS,
        "prompts": prompts,
    }
    tmp = out_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        f.write("\n")
    os.replace(tmp, out_path)


def self_check(model_path, hf_dir):
    gguf_hp, gguf_model = load_gguf(model_path)
    hf_hp, hf_model = load_hf(hf_dir)
    if gguf_hp != hf_hp:
        sys.exit(f"config.json hyperparameters {hf_hp} differ from the GGUF's {gguf_hp}")
    ids = np.array(Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json"))
                   .encode(PROMPTS[SELF_CHECK_PROMPT]).ids)
    diff = np.abs(gguf_model.forward(ids, []) - hf_model.forward(ids, [])).max()
    print(f"self-check: {len(ids)} tokens, max |logprob(GGUF) - logprob(HF)| = {diff:.3g}")
    if not diff <= SELF_CHECK_TOLERANCE:
        sys.exit(f"self-check failed: difference {diff} above {SELF_CHECK_TOLERANCE}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--self-check":
        self_check(*sys.argv[2:])
    elif len(sys.argv) == 4:
        reference(*sys.argv[1:])
    else:
        sys.exit(__doc__)
