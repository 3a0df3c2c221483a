#!/usr/bin/env python3
"""Independent float64 reference forward pass of a GGUF decoder (llama, mistral, qwen2, qwen3,
gemma2, gemma3, phi3).

Written from each architecture's definition (llama.cpp's src/models/*.cpp, HF transformers'
modeling files) in numpy, sharing no code with Sonde: weights come from the `gguf` package
(`GGUFReader` + `gguf.quants.dequantize`, which yields float32 values that are then held in
float64) and every computation after dequantization is float64. Every tensor of the file must be
applied and every architecture key that changes the maths must be implemented, else the script
exits naming it.

The math, for token ids t_0..t_{n-1} (hyperparameters from the GGUF metadata `{arch}.*`):

  x_p       = E[t_p] * embed_scale                   E = token_embd [n_vocab, n_embd];
                                                     embed_scale = f32(sqrt(n_embd)) for gemma2/3
  rms(x, w) = x / sqrt(mean(x^2) + eps) * w          eps = attention.layer_norm_rms_epsilon
                                                     (gemma2/3 files store HF's 1 + w: applied as x*w)
  per layer l:
    h       = rms(x, attn_norm)
    q, k, v = h Wq^T + bq, h Wk^T + bk, h Wv^T + bv  biases when the file has them; phi3 (any
                                                     file with attn_qkv) splits its rows [q|k|v]
    qwen3, gemma3: q, k = rms(q_h, attn_q_norm), rms(k_h, attn_k_norm) per head over head_dim
    rope(q), rope(k) over the first n_rot = rope.dimension_count dims of each head (the rest pass
              unchanged): pair i < n_rot/2 at position p turns by
              angle = (p / factor) * base^(-2i/n_rot) / ff[i]
              base = rope.freq_base (gemma3 sliding layers: rope.freq_base_swa, default 10000),
              factor = rope.scaling.factor for linear scaling (the default type when only a factor
              is given; gemma3 sliding layers: 1), ff = rope_freqs.weight (Llama 3.1) or 1.
              llama/mistral (GGUF layout, Q/K rows permuted by the converter) pair (x[2i], x[2i+1]);
              qwen2/qwen3/gemma3/phi3 and every HF folder pair (x[i], x[i + n_rot/2]) (NeoX)
    a_h     = softmax(scale * q_h k_g^T + mask) v_g,  g = h // (n_head / n_head_kv)
              scale = 1/sqrt(head_dim) (gemma3 27B: 1/sqrt(n_embd/n_head)); mask: causal, and on
              gemma3's sliding layers (l % pattern < pattern - 1, pattern 6) key j is seen from
              query p only when p - window < j <= p (window = attention.sliding_window)
    o       = concat(a_0..a_{n_head-1}) Wo^T + bo
    gemma2: scores capped as c * tanh(scores / c) before the mask, c = attn_logit_softcapping
            (default 50); windows (default 4096) on the even layers; one rope base
    gemma2, gemma3: o = rms(o, post_attention_norm)
    x       = x + o
    h       = rms(x, ffn_norm)
    f       = (act(h Wgate^T + bg) * (h Wup^T + bu)) Wdown^T + bd     phi3: ffn_up rows [gate|up]
              act = silu(z) = z / (1 + exp(-z)); gemma2/3: gelu_tanh(z) =
              z/2 (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))
    gemma2, gemma3: f = rms(f, post_ffw_norm)
    x       = x + f
  logits_p  = rms(x_p, output_norm) Wout^T (+ output.bias)   Wout = output.weight, or E when tied
              with final_logit_softcapping c (gemma2: default 30): c * tanh(logits / c)
  logprobs  = log_softmax(logits) over the full vocabulary (computed in chunks of positions)

Usage:
  reference_forward.py MODEL.gguf PROMPTS OUT.json
      PROMPTS is one of
        HF_TOKENIZER_DIR  a folder with tokenizer.json: the fixed PROMPTS are tokenized with it
                          (its own add_special_tokens), e.g. SmolLM2's;
        IDS.json          {"prompts": [{"text": str or null, "ids": [int, ...]}, ...]} or a bare
                          list of id lists;
        builtin:gemma3    fixed ids (llama.cpp's tokenization, BOS added, of GEMMA3_PROMPTS) for
                          Gemma 3's 262,144-token vocabulary (checked against the file's).
      Writes, per prompt, the prompt ids, the log-probability of each prompt token, the top-10
      and the label_ids log-probabilities of the next-token distribution at every position, and
      a GREEDY_TOKENS-token greedy continuation with logprobs and top-1/top-2 margins.
  reference_forward.py --self-check MODEL.gguf HF_MODEL_DIR [PROMPTS]
      Checks a folder written by gguf_to_hf.py (f32; LlamaForCausalLM, Gemma3ForCausalLM,
      Qwen3ForCausalLM, Qwen2ForCausalLM or Phi3ForCausalLM): the forward pass over its HF-named,
      un-permuted weights (HF norm conventions, NeoX rope) must give the GGUF pass's
      log-probabilities within SELF_CHECK_TOLERANCE. The ids: the folder's tokenizer.json on
      PROMPTS[SELF_CHECK_PROMPT], else PROMPTS (as above), else builtin:gemma3 for Gemma 3's
      vocabulary; repeated past the sliding window when the model has one.
"""

import hashlib
import json
import math
import os
import sys
import time
from importlib.metadata import version

# One BLAS thread unless told otherwise: the matrices of a decode step are small, and OpenBLAS's
# spinning threads make them several times slower on a busy 2-core machine.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from gguf import GGUFReader  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

from reference_prompts import (  # noqa: E402  (the prompts; llama_cpp_reference.py reads them here)
    GEMMA3_PROMPT_IDS, GEMMA3_PROMPTS, GEMMA3_VOCAB_SHA256, PROMPTS,
)
# Label ids whose log-probabilities are recorded, per vocabulary size (SmolLM2's fixed list; any
# other vocabulary: special ids and a spread over the whole range, see label_ids).
LABEL_IDS = {49152: [0, 1, 2, 17, 198, 330, 1032, 2767, 5821, 10004, 16384, 22222, 30000,
                     38917, 45678, 49151]}
TOP_K = 10
GREEDY_TOKENS = 32
SELF_CHECK_PROMPT = 3
SELF_CHECK_TOLERANCE = 1e-9
LOGIT_CHUNK_ELEMENTS = 1 << 24  # positions x vocabulary per chunk of the output layer (128 MiB)

ARCHS = ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
# `{arch}.*` keys the reference implements (or that do not change the maths); any other key of
# the architecture is refused by name.
COMMON_KEYS = {
    "context_length", "embedding_length", "block_count", "feed_forward_length", "vocab_size",
    "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
    "attention.key_length", "attention.value_length", "rope.dimension_count", "rope.freq_base",
    "rope.scaling.type", "rope.scaling.factor", "rope.scale_linear",
    "rope.scaling.original_context_length", "rope.scaling.finetuned",
}
ARCH_KEYS = {
    "llama": set(), "qwen2": set(), "qwen3": set(),
    "gemma2": {"attention.sliding_window", "attn_logit_softcapping", "final_logit_softcapping"},
    "gemma3": {"attention.sliding_window", "attention.sliding_window_pattern",
               "rope.freq_base_swa", "final_logit_softcapping"},
    # llama.cpp reads phi3's sliding window and disables it (src/models/phi3.cpp), as here.
    "phi3": {"attention.sliding_window"},
}


def metadata(reader, key, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def f32_decimal(value):
    """A float32 metadata value as the shortest decimal that round-trips it (1e-05), as HF
    configs write it."""
    return float(str(np.float32(value)))


def rope_scale(get, arch):
    """Linear rope scaling factor of the file (positions / factor), 1.0 without scaling; llama.cpp
    treats a factor without a type as linear (src/llama-model.cpp, load_hparams)."""
    kind = get("rope.scaling.type", "linear")
    factor = get("rope.scaling.factor")
    if factor is None:
        factor = get("rope.scale_linear")
    factor = 0.0 if factor is None else float(factor)
    if kind == "none":
        return 1.0
    if kind != "linear":
        sys.exit(f"{arch}.rope.scaling.type = {kind!r} is not implemented by the reference")
    return 1.0 if factor == 0.0 else f32_decimal(factor)


def arch_switches(arch):
    """The switches that follow from the architecture alone, the same for a GGUF and an HF
    folder: rope pairs (llama's GGUF rows are permuted for interleaved pairs), q/k norms,
    post-norms, activation."""
    gemma = arch in ("gemma2", "gemma3")
    return {
        "rope_style": "interleaved" if arch == "llama" else "neox",
        "qk_norm": arch in ("qwen3", "gemma3"),
        "post_norms": gemma,
        "act": "gelu_tanh" if gemma else "silu",
    }


def gguf_hparams(reader):
    """The spec of the model: every switch the forward pass reads, from the GGUF metadata."""
    arch = metadata(reader, "general.architecture")
    if arch not in ARCHS:
        sys.exit(f"unsupported architecture {arch!r}")
    allowed = COMMON_KEYS | ARCH_KEYS[arch]
    for key in reader.fields:
        if key.startswith(arch + ".") and key[len(arch) + 1:] not in allowed:
            sys.exit(f"metadata key {key} is not implemented by the reference")

    def get(key, default=None):
        return metadata(reader, f"{arch}.{key}", default)

    n_layer, n_embd = get("block_count"), get("embedding_length")
    n_head = get("attention.head_count")
    for key in ("embedding_length", "block_count", "feed_forward_length", "attention.head_count"):
        if not isinstance(get(key), int):
            sys.exit(f"{arch}.{key} must be one integer (per-layer arrays are not implemented)")
    n_head_kv = get("attention.head_count_kv", n_head)
    head_dim = get("attention.key_length", n_embd // n_head)
    head_dim_v = get("attention.value_length", n_embd // n_head)
    if head_dim_v != head_dim:
        sys.exit(f"key_length {head_dim} != value_length {head_dim_v} is not implemented")
    n_rot = get("rope.dimension_count", head_dim)
    if arch != "phi3" and n_rot != head_dim:
        sys.exit(f"{arch} needs rope.dimension_count == head_dim ({n_rot} != {head_dim})")
    if n_rot % 2 or n_rot > head_dim:
        sys.exit(f"rope.dimension_count {n_rot} must be even and at most head_dim {head_dim}")
    base = float(get("rope.freq_base", 10000.0))
    scale = rope_scaling = rope_scale(get, arch)
    windows = [None] * n_layer
    rope = [[base, scale]] * n_layer
    attn_scale = 1.0 / math.sqrt(head_dim)
    embed_scale, softcap, attn_softcap = 1.0, None, None
    if arch == "gemma2":
        # llama.cpp (src/llama-model.cpp, LLM_ARCH_GEMMA2; src/models/gemma2.cpp): window 4096
        # unless the file says, on the even layers (swa pattern 2); one rope base; scores
        # capped at 50 and logits at 30 unless the file says; 27B (46 layers) scales queries by
        # n_embd / n_head. HF's Gemma2: the same (is_sliding = not layer_idx % 2).
        window = int(get("attention.sliding_window", 4096))
        for l in range(0, n_layer, 2):
            windows[l] = window
        if n_layer == 46:
            attn_scale = 1.0 / math.sqrt(n_embd // n_head)
        embed_scale = float(np.float32(math.sqrt(n_embd)))
        attn_softcap = f32_decimal(get("attn_logit_softcapping", 50.0))
        softcap = f32_decimal(get("final_logit_softcapping", 30.0))
    if arch == "gemma3":
        window = get("attention.sliding_window", 0)
        if window:
            pattern = get("attention.sliding_window_pattern", 6)
            swa = (list(pattern) if isinstance(pattern, list) else
                   [pattern == 0 or l % pattern < pattern - 1 for l in range(n_layer)])
            if len(swa) != n_layer:
                sys.exit("attention.sliding_window_pattern has the wrong length")
            swa_base = float(get("rope.freq_base_swa", 10000.0))
            for l in range(n_layer):
                if swa[l]:
                    windows[l], rope[l] = int(window), [swa_base, 1.0]
        # llama.cpp's f_attention_scale (src/models/gemma3.cpp): 27B (62 layers) scales by
        # n_embd / n_head, every other size by head_dim (= query_pre_attn_scalar in HF configs).
        if n_layer == 62:
            attn_scale = 1.0 / math.sqrt(n_embd // n_head)
        # ggml_scale by sqrtf(n_embd): the float32 value (HF: the buffer in the weight dtype).
        embed_scale = float(np.float32(math.sqrt(n_embd)))
        cap = get("final_logit_softcapping")
        softcap = f32_decimal(cap) if cap else None
    return {
        "arch": arch,
        "n_layer": n_layer,
        "n_embd": n_embd,
        "n_ff": get("feed_forward_length"),
        "n_head": n_head,
        "n_head_kv": n_head_kv,
        "head_dim": head_dim,
        "n_rot": n_rot,
        "eps": f32_decimal(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": base,
        "rope_linear_factor": rope_scaling,
        "rope": rope,
        "sliding_window": windows,
        "attn_scale": attn_scale,
        "embed_scale": embed_scale,
        "final_logit_softcapping": softcap,
        "attn_logit_softcapping": attn_softcap,
        **arch_switches(arch),
    }


class Tensors:
    """The file's tensors by name; each is taken once, and `finish` fails on any left over."""

    def __init__(self, tensors):
        self.pool = dict(tensors)

    def take(self, name, shape, optional=False):
        if name not in self.pool:
            if optional:
                return None
            sys.exit(f"missing tensor {name}")
        w = self.pool.pop(name)
        if tuple(w.shape) != tuple(shape):
            sys.exit(f"tensor {name} has shape {list(w.shape)}, expected {list(shape)}")
        return w

    def finish(self):
        if self.pool:
            sys.exit("tensors the reference does not apply: " + ", ".join(sorted(self.pool)))


def gguf_layers(hp, t):
    """Per-layer weights from GGUF names, in llama.cpp's shapes ([out, in] as numpy)."""
    d, n_ff = hp["n_embd"], hp["n_ff"]
    nq, nkv = hp["n_head"] * hp["head_dim"], hp["n_head_kv"] * hp["head_dim"]
    layers = []
    for i in range(hp["n_layer"]):
        p = f"blk.{i}."
        L = {"attn_norm": t.take(p + "attn_norm.weight", [d])}
        qkv = t.take(p + "attn_qkv.weight", [nq + 2 * nkv, d], optional=True)
        if qkv is not None:
            L["wq"], L["wk"], L["wv"] = qkv[:nq], qkv[nq:nq + nkv], qkv[nq + nkv:]
            b = t.take(p + "attn_qkv.bias", [nq + 2 * nkv], optional=True)
            if b is not None:
                L["bq"], L["bk"], L["bv"] = b[:nq], b[nq:nq + nkv], b[nq + nkv:]
        else:
            L["wq"] = t.take(p + "attn_q.weight", [nq, d])
            L["wk"] = t.take(p + "attn_k.weight", [nkv, d])
            L["wv"] = t.take(p + "attn_v.weight", [nkv, d])
        if "bq" not in L:
            for name, rows in (("q", nq), ("k", nkv), ("v", nkv)):
                b = t.take(p + f"attn_{name}.bias", [rows], optional=True)
                if b is not None:
                    L["b" + name] = b
        L["wo"] = t.take(p + "attn_output.weight", [d, nq])
        if hp["arch"] == "llama":  # the only one of these whose loader creates wo_b
            L["bo"] = t.take(p + "attn_output.bias", [d], optional=True)
        if hp["qk_norm"]:
            L["q_norm"] = t.take(p + "attn_q_norm.weight", [hp["head_dim"]])
            L["k_norm"] = t.take(p + "attn_k_norm.weight", [hp["head_dim"]])
        if hp["post_norms"]:
            L["post_attn_norm"] = t.take(p + "post_attention_norm.weight", [d])
            L["post_ffn_norm"] = t.take(p + "post_ffw_norm.weight", [d])
        L["ffn_norm"] = t.take(p + "ffn_norm.weight", [d])
        if hp["arch"] == "phi3":
            up = t.take(p + "ffn_up.weight", [2 * n_ff, d])
            L["w_gate"], L["w_up"] = up[:n_ff], up[n_ff:]
        else:
            L["w_gate"] = t.take(p + "ffn_gate.weight", [n_ff, d])
            L["w_up"] = t.take(p + "ffn_up.weight", [n_ff, d])
            if hp["arch"] == "llama":
                for name, rows in (("gate", n_ff), ("up", n_ff)):
                    b = t.take(p + f"ffn_{name}.bias", [rows], optional=True)
                    if b is not None:
                        L["b_" + name] = b
        L["w_down"] = t.take(p + "ffn_down.weight", [d, n_ff])
        if hp["arch"] == "llama":
            b = t.take(p + "ffn_down.bias", [d], optional=True)
            if b is not None:
                L["b_down"] = b
        layers.append({k: v for k, v in L.items() if v is not None})
    return layers


def load_gguf(path):
    """The model in GGUF's own layout (llama: Q/K rows permuted, so rope pairs interleave)."""
    try:
        reader = GGUFReader(path)
    except (ValueError, OSError) as e:  # e.g. a truncated file: tensor data past its end
        sys.exit(f"cannot read {path} as GGUF (truncated or corrupt?): {e}")
    hp = gguf_hparams(reader)
    t = Tensors({x.name: dequantize(x.data, x.tensor_type).astype(np.float64)
                 for x in reader.tensors})
    d = hp["n_embd"]
    embed = t.pool.get("token_embd.weight")
    if embed is None or embed.ndim != 2 or embed.shape[1] != d:
        sys.exit("token_embd.weight is missing or not [n_vocab, n_embd]")
    n_vocab = embed.shape[0]
    vocab = metadata(reader, f"{hp['arch']}.vocab_size")
    if vocab is not None and vocab != n_vocab:
        sys.exit(f"{hp['arch']}.vocab_size {vocab} != token_embd rows {n_vocab}")
    embed = t.take("token_embd.weight", [n_vocab, d])
    ff = None
    if hp["arch"] == "llama":
        ff = t.take("rope_freqs.weight", [hp["n_rot"] // 2], optional=True)
    layers = gguf_layers(hp, t)
    norm = t.take("output_norm.weight", [d])
    lm_head = t.take("output.weight", [n_vocab, d], optional=True)
    lm_head_b = t.take("output.bias", [n_vocab], optional=True) if hp["arch"] == "qwen2" else None
    t.finish()
    hp["n_vocab"] = n_vocab
    hp["rope_freqs"] = None if ff is None else ff.tolist()
    hp["tied"] = lm_head is None
    model = Model(hp, layers, embed, norm, embed if lm_head is None else lm_head, lm_head_b,
                  hp["rope_style"])
    return hp, model, reader


class Model:
    """Float64 weights and the spec; `rope_style` "interleaved" (llama GGUF) or "neox"."""

    def __init__(self, hp, layers, embed, norm, lm_head, lm_head_b, rope_style):
        self.hp = hp
        self.n_head, self.n_head_kv, self.head_dim = hp["n_head"], hp["n_head_kv"], hp["head_dim"]
        self.n_rot, self.eps = hp["n_rot"], hp["eps"]
        ff = np.ones(self.n_rot // 2) if hp["rope_freqs"] is None else np.array(hp["rope_freqs"])
        exponent = -np.arange(0, self.n_rot, 2) / self.n_rot
        # Per layer: the angle per unit position of each pair, and the positions' divisor.
        self.inv_freq = [base ** exponent / ff for base, _ in hp["rope"]]
        self.pos_div = [factor for _, factor in hp["rope"]]
        self.layers, self.embed, self.norm = layers, embed, norm
        self.lm_head, self.lm_head_b = lm_head, lm_head_b
        self.rope_style = rope_style

    def rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, positions, layer):
        """Rotates the first n_rot dims of x [heads, n, head_dim] at the given positions."""
        angle = (positions / self.pos_div[layer])[:, None] * self.inv_freq[layer][None, :]
        cos, sin = np.cos(angle), np.sin(angle)
        out = x.copy()
        r = self.n_rot
        if self.rope_style == "interleaved":
            a, b = x[..., 0:r:2], x[..., 1:r:2]
            out[..., 0:r:2] = a * cos - b * sin
            out[..., 1:r:2] = a * sin + b * cos
        else:
            a, b = x[..., :r // 2], x[..., r // 2:r]
            out[..., :r // 2] = a * cos - b * sin
            out[..., r // 2:r] = a * sin + b * cos
        return out

    def act(self, z):
        if self.hp["act"] == "silu":
            return z / (1.0 + np.exp(-z))
        return 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z ** 3)))

    def forward(self, ids, cache):
        """Final-normed hidden states [len(ids), n_embd] after each of `ids`, which follow the
        tokens already in `cache` (per layer [K, V], each [n_head_kv, n_past, head_dim],
        extended in place)."""
        return self.forward_batch([(ids, cache)])

    def forward_batch(self, seqs):
        """`forward` for several sequences [(ids, cache)] at once: the dense layers run on all
        their rows together (the weights are read once per step), attention per sequence. The
        hidden states of the sequences are returned concatenated in order."""
        d, group = self.head_dim, self.n_head // self.n_head_kv
        lengths = [len(ids) for ids, _ in seqs]
        bounds = np.cumsum([0] + lengths)
        geometry = []
        for ids, cache in seqs:
            past = cache[0][0].shape[1] if cache else 0
            positions = np.arange(past, past + len(ids), dtype=np.float64)
            keys_pos = np.arange(past + len(ids))
            geometry.append((positions, keys_pos, keys_pos[None, :] > positions[:, None]))
        all_ids = np.concatenate([np.asarray(ids, dtype=np.int64) for ids, _ in seqs])
        x = self.embed[all_ids] * self.hp["embed_scale"]
        for i, L in enumerate(self.layers):
            h = self.rms(x, L["attn_norm"])
            q_all, k_all, v_all = h @ L["wq"].T, h @ L["wk"].T, h @ L["wv"].T
            if "bq" in L:
                q_all = q_all + L["bq"]
            if "bk" in L:
                k_all = k_all + L["bk"]
            if "bv" in L:
                v_all = v_all + L["bv"]
            outs = []
            for s, (_, cache) in enumerate(seqs):
                n = lengths[s]
                rows = slice(bounds[s], bounds[s + 1])
                positions, keys_pos, causal = geometry[s]
                q = q_all[rows].reshape(n, self.n_head, d).transpose(1, 0, 2)
                k = k_all[rows].reshape(n, self.n_head_kv, d).transpose(1, 0, 2)
                v = v_all[rows].reshape(n, self.n_head_kv, d).transpose(1, 0, 2)
                if "q_norm" in L:
                    q, k = self.rms(q, L["q_norm"]), self.rms(k, L["k_norm"])
                q, k = self.rope(q, positions, i), self.rope(k, positions, i)
                if len(cache) == i:
                    cache.append([k, v])
                else:
                    cache[i] = [np.concatenate([cache[i][0], k], axis=1),
                                np.concatenate([cache[i][1], v], axis=1)]
                masked = causal
                window = self.hp["sliding_window"][i]
                if window is not None:
                    masked = causal | (keys_pos[None, :] <= positions[:, None] - window)
                keys = np.repeat(cache[i][0], group, axis=0)
                values = np.repeat(cache[i][1], group, axis=0)
                scores = (q * self.hp["attn_scale"]) @ keys.transpose(0, 2, 1)
                cap = self.hp.get("attn_logit_softcapping")
                if cap:
                    scores = cap * np.tanh(scores / cap)
                scores = np.where(masked, -np.inf, scores)
                scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
                attn = (scores / scores.sum(axis=-1, keepdims=True)) @ values
                outs.append(attn.transpose(1, 0, 2).reshape(n, self.n_head * d))
            o = np.concatenate(outs) @ L["wo"].T
            if "bo" in L:
                o = o + L["bo"]
            if "post_attn_norm" in L:
                o = self.rms(o, L["post_attn_norm"])
            x = x + o
            h = self.rms(x, L["ffn_norm"])
            gate, up = h @ L["w_gate"].T, h @ L["w_up"].T
            if "b_gate" in L:
                gate = gate + L["b_gate"]
            if "b_up" in L:
                up = up + L["b_up"]
            f = (self.act(gate) * up) @ L["w_down"].T
            if "b_down" in L:
                f = f + L["b_down"]
            if "post_ffn_norm" in L:
                f = self.rms(f, L["post_ffn_norm"])
            x = x + f
        return self.rms(x, self.norm)

    def logprob_chunks(self, hidden):
        """Yields (start, log-probabilities [rows, n_vocab]) over the rows of `hidden`, a few
        rows at a time so that positions x vocabulary never materialises in full."""
        rows = max(1, LOGIT_CHUNK_ELEMENTS // self.lm_head.shape[0])
        for start in range(0, len(hidden), rows):
            logits = hidden[start:start + rows] @ self.lm_head.T
            if self.lm_head_b is not None:
                logits = logits + self.lm_head_b
            cap = self.hp["final_logit_softcapping"]
            if cap:
                logits = cap * np.tanh(logits / cap)
            m = logits.max(axis=-1, keepdims=True)
            yield start, logits - (m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True)))


def top_k(row, k):
    """The k most likely [id, logprob], descending, ties to the smaller id."""
    threshold = np.partition(row, len(row) - k)[len(row) - k]
    ids = np.nonzero(row >= threshold)[0]
    order = np.lexsort((ids, -row[ids]))[:k]
    return [[int(ids[j]), float(row[ids[j]])] for j in order]


def run_prompts(model, prompt_ids, labels):
    """The scores of each prompt and its greedy continuation. The prompts are run together
    (prefill in one batch, then GREEDY_TOKENS decode steps in lockstep): each sequence has its
    own cache and attention, so its numbers are those of a run alone up to the summation order
    of the matrix products."""
    prompt_ids = [[int(t) for t in ids] for ids in prompt_ids]
    caches = [[] for _ in prompt_ids]
    hidden = model.forward_batch(list(zip(prompt_ids, caches)))
    offsets = np.cumsum([0] + [len(ids) for ids in prompt_ids])
    out = [{"ids": ids, "logprob": [None], "top": [], "labels": [], "greedy": [],
            "greedy_logprobs": [], "greedy_margin": [], "greedy_top": []} for ids in prompt_ids]
    rows = []
    for start, lp in model.logprob_chunks(hidden):
        for r, row in enumerate(lp):
            g = start + r
            s = int(np.searchsorted(offsets, g, side="right")) - 1
            p, ids = g - offsets[s], prompt_ids[s]
            if p + 1 < len(ids):
                out[s]["logprob"].append(float(row[ids[p + 1]]))
            else:
                rows.append(row)
            out[s]["top"].append(top_k(row, TOP_K))
            out[s]["labels"].append(row[labels].tolist())
    for step in range(GREEDY_TOKENS):
        for s, row in enumerate(rows):
            best = top_k(row, TOP_K)
            out[s]["greedy_top"].append(best)
            out[s]["greedy"].append(best[0][0])
            out[s]["greedy_logprobs"].append(best[0][1])
            out[s]["greedy_margin"].append(best[0][1] - best[1][1])
        if step + 1 < GREEDY_TOKENS:
            h = model.forward_batch([([o["greedy"][-1]], c) for o, c in zip(out, caches)])
            rows = [row for _, lp in model.logprob_chunks(h) for row in lp]
    return out


def label_ids(n_vocab):
    if n_vocab in LABEL_IDS:
        return LABEL_IDS[n_vocab]
    spread = [round(j * (n_vocab - 1) / 15) for j in range(16)]
    return sorted(set([0, 1, 2, 3] + spread))


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def vocab_sha256(reader):
    """sha256 of the file's tokenizer.ggml.tokens, each followed by a NUL byte."""
    field = reader.fields["tokenizer.ggml.tokens"]
    digest = hashlib.sha256()
    for i in field.data:
        digest.update(bytes(field.parts[i]) + b"\0")
    return digest.hexdigest()


def load_prompts(spec, reader, n_vocab):
    """[(text or None, ids)] from a tokenizer folder, an ids JSON file or builtin:gemma3, and a
    description of where the ids come from."""
    if spec == "builtin:gemma3":
        if GEMMA3_PROMPT_IDS is None:
            sys.exit("GEMMA3_PROMPT_IDS is not filled in yet")
        if vocab_sha256(reader) != GEMMA3_VOCAB_SHA256:
            sys.exit("builtin:gemma3 ids are for Gemma 3's vocabulary; this file has another")
        return (list(zip(GEMMA3_PROMPTS, GEMMA3_PROMPT_IDS)),
                "llama.cpp's tokenization of GEMMA3_PROMPTS (BOS added, special tokens parsed)")
    if os.path.isdir(spec):
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(os.path.join(spec, "tokenizer.json"))
        return ([(text, tok.encode(text).ids) for text in PROMPTS],
                "prompt token ids (tokenizer.json, its own add_special_tokens)")
    with open(spec, encoding="utf-8") as f:
        data = json.load(f)
    items = data["prompts"] if isinstance(data, dict) else data
    prompts = []
    for item in items:
        text, ids = (item.get("text"), item["ids"]) if isinstance(item, dict) else (None, item)
        if not ids or any(not isinstance(t, int) or not 0 <= t < n_vocab for t in ids):
            sys.exit(f"prompt ids must be non-empty and within the vocabulary ({n_vocab})")
        prompts.append((text, ids))
    return prompts, f"prompt token ids as given in {os.path.basename(spec)}"


def reference(model_path, prompt_spec, out_path):
    hp, model, reader = load_gguf(model_path)
    labels = label_ids(hp["n_vocab"])
    prompt_list, ids_source = load_prompts(prompt_spec, reader, hp["n_vocab"])
    started = time.perf_counter()
    results = run_prompts(model, [ids for _, ids in prompt_list], labels)
    elapsed = time.perf_counter() - started
    prompts = [{"text": text, **p} for (text, _), p in zip(prompt_list, results)]
    for p in prompts:
        print(f"{len(p['ids']):4d} tokens: {str(p['text'])[:40]!r} -> {p['greedy'][:8]}..."
              f" min margin {min(p['greedy_margin']):.3g}")
    total = sum(len(p["ids"]) for p in prompts)
    print(f"{total} prompt tokens in {len(prompts)} prompts, {GREEDY_TOKENS} greedy tokens each:"
          f" {elapsed:.1f}s ({elapsed / len(prompts):.1f}s per prompt)", flush=True)
    out = {
        "description": __doc__.split("\nUsage:")[0].strip(),
        "layout": ("GGUF (Q/K rows as stored, interleaved rope pairs)"
                   if hp["rope_style"] == "interleaved" else
                   "GGUF (Q/K rows as stored, NeoX rope pairs)"),
        "model_sha256": sha256(model_path),
        "versions": {name: version(name) for name in ("numpy", "gguf", "tokenizers")},
        "hparams": hp,
        "fields": {
            "ids": ids_source,
            "logprob": "logprob[p] = log P(ids[p] | ids[:p]); null at p = 0",
            "top": f"top[p] = the {TOP_K} most likely [id, logprob] after ids[..=p],"
                   " descending, ties to the smaller id",
            "labels": "labels[p][j] = log P(label_ids[j] | ids[..=p])",
            "greedy": f"{GREEDY_TOKENS} argmax tokens after the prompt (ties to the smaller"
                      " id), not stopped at eos",
            "greedy_logprobs": "log-softmax of each greedy token at its step",
            "greedy_margin": "top-1 minus top-2 logprob at each greedy step",
            "greedy_top": f"the {TOP_K} most likely [id, logprob] at each greedy step",
        },
        "label_ids": labels,
        "prompts": prompts,
    }
    tmp = out_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        f.write("\n")
    os.replace(tmp, out_path)


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--self-check" and len(sys.argv) in (4, 5):
        from reference_hf import self_check
        self_check(*sys.argv[2:])
    elif len(sys.argv) == 4 and not sys.argv[1].startswith("-"):
        reference(*sys.argv[1:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
