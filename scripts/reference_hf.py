"""The self-check of reference_forward.py: a Hugging Face folder written by gguf_to_hf.py, read
with transformers' conventions (HF names, un-permuted Q/K rows, `rotate_half` rope, Gemma's
1 + w norms), must give the GGUF pass's log-probabilities. Run as
`reference_forward.py --self-check MODEL.gguf HF_MODEL_DIR [PROMPTS]`.
"""

import json
import math
import os
import sys
import time

import numpy as np

from reference_forward import (
    SELF_CHECK_PROMPT, SELF_CHECK_TOLERANCE, Model, Tensors, arch_switches, load_gguf,
    load_prompts,
)

HF_ARCHS = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama",
            "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
            "Gemma3ForCausalLM": "gemma3", "Phi3ForCausalLM": "phi3"}


def hf_hparams(config):
    """The spec from an HF config.json, written from transformers' semantics."""
    arch = HF_ARCHS.get((config.get("architectures") or [None])[0])
    if arch is None:
        sys.exit(f"unsupported HF architectures {config.get('architectures')}")
    n_layer, n_embd, n_head = (config["num_hidden_layers"], config["hidden_size"],
                               config["num_attention_heads"])
    head_dim = config.get("head_dim") or n_embd // n_head
    n_rot = int(head_dim * config.get("partial_rotary_factor", 1.0))
    base = float(config.get("rope_theta", 10000.0))
    scaling = config.get("rope_scaling")
    factor = 1.0
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind != "linear":
            sys.exit(f"rope_scaling {kind!r} is not implemented by the self-check")
        factor = float(scaling["factor"])
    windows, rope = [None] * n_layer, [[base, factor]] * n_layer
    attn_scale, embed_scale, softcap = 1.0 / math.sqrt(head_dim), 1.0, None
    if arch == "gemma3":
        types = config.get("layer_types")
        if types is None:
            pattern = config.get("sliding_window_pattern", 6)
            types = ["sliding_attention" if (l + 1) % pattern else "full_attention"
                     for l in range(n_layer)]
        for l, kind in enumerate(types):
            if kind == "sliding_attention":
                windows[l] = config["sliding_window"]
                rope[l] = [float(config.get("rope_local_base_freq", 10000.0)), 1.0]
        attn_scale = config["query_pre_attn_scalar"] ** -0.5
        embed_scale = float(np.float32(n_embd ** 0.5))
        if config.get("attn_logit_softcapping"):
            sys.exit("attn_logit_softcapping is not implemented")
        softcap = config.get("final_logit_softcapping")
    elif arch in ("llama", "qwen2", "qwen3") and config.get("use_sliding_window"):
        sys.exit("use_sliding_window is not implemented by the self-check")
    return {
        "arch": arch,
        "n_layer": n_layer,
        "n_embd": n_embd,
        "n_ff": config["intermediate_size"],
        "n_head": n_head,
        "n_head_kv": config.get("num_key_value_heads", n_head),
        "head_dim": head_dim,
        "n_rot": n_rot,
        "eps": config["rms_norm_eps"],
        "rope_theta": base,
        "rope_linear_factor": factor,
        "rope": rope,
        "sliding_window": windows,
        "attn_scale": attn_scale,
        "embed_scale": embed_scale,
        "final_logit_softcapping": softcap,
        "attn_logit_softcapping": None,  # refused above when set
        **arch_switches(arch),
    }


def load_hf(folder):
    """The model from a Hugging Face folder (config.json, model.safetensors): NeoX rope
    (rotate_half) on un-permuted Q/K rows; Gemma's norms as x * (1 + w)."""
    from safetensors.numpy import load_file
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    hp = hf_hparams(config)
    raw = load_file(os.path.join(folder, "model.safetensors"))
    if any(t.dtype != np.float32 for t in raw.values()):
        sys.exit("the self-check needs an f32 folder")
    t = Tensors({name: x.astype(np.float64) for name, x in raw.items()})
    d, n_ff, arch = hp["n_embd"], hp["n_ff"], hp["arch"]
    nq, nkv = hp["n_head"] * hp["head_dim"], hp["n_head_kv"] * hp["head_dim"]
    gemma = arch == "gemma3"

    def norm(name, size):
        w = t.take(name, [size])
        return 1.0 + w if gemma else w

    embed = t.pool["model.embed_tokens.weight"]
    n_vocab = embed.shape[0]
    embed = t.take("model.embed_tokens.weight", [n_vocab, d])
    bias = config.get("attention_bias", arch == "qwen2")
    layers = []
    for i in range(hp["n_layer"]):
        p = f"model.layers.{i}."
        L = {"attn_norm": norm(p + "input_layernorm.weight", d)}
        if arch == "phi3":
            qkv = t.take(p + "self_attn.qkv_proj.weight", [nq + 2 * nkv, d])
            L["wq"], L["wk"], L["wv"] = qkv[:nq], qkv[nq:nq + nkv], qkv[nq + nkv:]
        else:
            for name, rows in (("q", nq), ("k", nkv), ("v", nkv)):
                L["w" + name] = t.take(p + f"self_attn.{name}_proj.weight", [rows, d])
                if bias:
                    L["b" + name] = t.take(p + f"self_attn.{name}_proj.bias", [rows])
        L["wo"] = t.take(p + "self_attn.o_proj.weight", [d, nq])
        if bias and arch != "qwen2":
            L["bo"] = t.take(p + "self_attn.o_proj.bias", [d])
        if hp["qk_norm"]:
            L["q_norm"] = norm(p + "self_attn.q_norm.weight", hp["head_dim"])
            L["k_norm"] = norm(p + "self_attn.k_norm.weight", hp["head_dim"])
        if gemma:
            L["post_attn_norm"] = norm(p + "post_attention_layernorm.weight", d)
            L["ffn_norm"] = norm(p + "pre_feedforward_layernorm.weight", d)
            L["post_ffn_norm"] = norm(p + "post_feedforward_layernorm.weight", d)
        else:
            L["ffn_norm"] = norm(p + "post_attention_layernorm.weight", d)
        if arch == "phi3":
            up = t.take(p + "mlp.gate_up_proj.weight", [2 * n_ff, d])
            L["w_gate"], L["w_up"] = up[:n_ff], up[n_ff:]
        else:
            L["w_gate"] = t.take(p + "mlp.gate_proj.weight", [n_ff, d])
            L["w_up"] = t.take(p + "mlp.up_proj.weight", [n_ff, d])
        L["w_down"] = t.take(p + "mlp.down_proj.weight", [d, n_ff])
        layers.append(L)
    final_norm = norm("model.norm.weight", d)
    tied = config.get("tie_word_embeddings", False)
    lm_head = embed if tied else t.take("lm_head.weight", [n_vocab, d])
    t.finish()
    hp["n_vocab"] = n_vocab
    hp["rope_freqs"] = None
    hp["tied"] = tied
    # HF's rotate_half pairs (x[i], x[i + d/2]): the NeoX style, for every architecture.
    hp_neox = dict(hp, rope_style="neox")
    return hp, Model(hp_neox, layers, embed, final_norm, lm_head, None, "neox")


def self_check(model_path, hf_dir, prompt_spec=None):
    gguf_hp, gguf_model, reader = load_gguf(model_path)
    hf_hp, hf_model = load_hf(hf_dir)
    if gguf_hp != hf_hp:
        diff = {k: (gguf_hp.get(k), hf_hp.get(k)) for k in gguf_hp.keys() | hf_hp.keys()
                if gguf_hp.get(k) != hf_hp.get(k)}
        sys.exit(f"config.json hyperparameters differ from the GGUF's (GGUF, HF): {diff}")
    tokenizer = os.path.join(hf_dir, "tokenizer.json")
    if prompt_spec is None and os.path.exists(tokenizer):
        prompt_spec = hf_dir
    elif prompt_spec is None:
        prompt_spec = "builtin:gemma3"
    prompts, _ = load_prompts(prompt_spec, reader, gguf_hp["n_vocab"])
    index = SELF_CHECK_PROMPT if os.path.isdir(prompt_spec) else 0
    ids = list(prompts[min(index, len(prompts) - 1)][1])
    windows = [w for w in gguf_hp["sliding_window"] if w is not None]
    if windows:
        # Past the window, so that the sliding mask is exercised: all prompts, repeated.
        every = [t for _, p in prompts for t in p]
        while len(ids) <= max(windows) + 16:
            ids += every
        ids = ids[:max(windows) + 48]
    ids = np.array(ids)
    start = time.perf_counter()
    a, b = gguf_model.forward(ids, []), hf_model.forward(ids, [])
    # The output layer over the last 64 positions (and the first 8): enough to compare.
    rows = sorted(set(range(min(8, len(ids)))) | set(range(max(0, len(ids) - 64), len(ids))))
    diff = 0.0
    for (_, la), (_, lb) in zip(gguf_model.logprob_chunks(a[rows]),
                                hf_model.logprob_chunks(b[rows])):
        diff = max(diff, float(np.abs(la - lb).max()))
    hidden = float(np.abs(a - b).max())
    print(f"self-check: {len(ids)} tokens ({len(rows)} scored), max |logprob(GGUF) -"
          f" logprob(HF)| = {diff:.3g}, max |hidden difference| = {hidden:.3g},"
          f" {time.perf_counter() - start:.1f}s")
    if not diff <= SELF_CHECK_TOLERANCE:
        sys.exit(f"self-check failed: difference {diff} above {SELF_CHECK_TOLERANCE}")
