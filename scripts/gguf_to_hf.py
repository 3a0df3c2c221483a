#!/usr/bin/env python3
"""Dequantize a llama or gemma3 GGUF into a Hugging Face layout folder.

Reads the GGUF with the `gguf` package, dequantizes every tensor (`gguf.quants.dequantize`,
float32), and writes OUT_DIR with
  config.json           LlamaForCausalLM / Gemma3ForCausalLM config from the GGUF metadata
  model.safetensors     HF tensor names, [out, in] shapes, in the chosen dtype
  tokenizer.json,
  tokenizer_config.json llama: copied from HF_TOKENIZER_DIR; gemma3: built from the GGUF's
                        SentencePiece vocabulary as transformers' GemmaConverter would
                        (gguf_tokenizer.py)
llama: llama.cpp's converter permutes the rows of attn_q and attn_k so that rope rotates
interleaved pairs (x[2i], x[2i+1]); they are un-permuted per head back to HF's rotate_half
layout, where pair i is (x[i], x[i+d/2]).
gemma3: Q/K rows are as in HF (NeoX rope, never permuted). llama.cpp's converter stores every
RMSNorm weight as HF's w + 1 (HF applies x * (1 + w)); w_gguf - 1 is written (float32).
Every `gemma3.*` metadata key must be one the converter maps into config.json, else it exits
naming the key. Sliding layers follow llama.cpp: with attention.sliding_window, layer l slides
when l % pattern < pattern - 1 (pattern = attention.sliding_window_pattern, default 6; a
per-layer bool array is used as it is).
With tied embeddings (no output.weight) no lm_head.weight is written. bf16 is rounded to nearest
even from the float32 values. The folder is built under a temporary name next to OUT_DIR and
renamed into place at the end.

Usage: gguf_to_hf.py MODEL.gguf [HF_TOKENIZER_DIR] OUT_DIR [--dtype f32|f16|bf16]
  HF_TOKENIZER_DIR is required for llama; for gemma3 omit it or pass "-", e.g.
  gguf_to_hf.py data/models/gemma-3-270m-q4_k_m.gguf - data/models/gemma3-hf-f32 --dtype f32
"""

import argparse
import json
import os
import shutil
import tempfile

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors import TensorSpec, serialize_file

import gguf_tokenizer

DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
LAYER_TENSORS = {
    "llama": {
        "attn_norm": "input_layernorm",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_norm": "post_attention_layernorm",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    },
    "gemma3": {
        "attn_norm": "input_layernorm",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    },
}
GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# gemma3 tensors stored as HF's weight + 1.
GEMMA3_NORMS = {"attn_norm", "attn_q_norm", "attn_k_norm", "post_attention_norm", "ffn_norm",
                "post_ffw_norm", "output_norm"}
# The `gemma3.*` keys gemma3_config maps (or checks); any other one is refused.
GEMMA3_KEYS = {
    "context_length", "embedding_length", "block_count", "feed_forward_length", "vocab_size",
    "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
    "attention.key_length", "attention.value_length", "attention.sliding_window",
    "attention.sliding_window_pattern", "rope.dimension_count", "rope.freq_base",
    "rope.freq_base_swa", "rope.scaling.type", "rope.scaling.factor",
    "final_logit_softcapping", "attn_logit_softcapping",
}


def metadata(reader, key, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def f32_decimal(value):
    """A float32 metadata value as the shortest decimal that round-trips it (1e-05)."""
    return float(str(np.float32(value)))


def llama_config(reader, dtype, tied, n_vocab):
    n_embd = metadata(reader, "llama.embedding_length")
    n_head = metadata(reader, "llama.attention.head_count")
    if metadata(reader, "llama.rope.dimension_count") != n_embd // n_head:
        raise SystemExit("partial rotary embeddings are not supported")
    if any(key.startswith("llama.rope.scaling") for key in reader.fields):
        raise SystemExit("rope scaling is not supported")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": n_embd,
        "intermediate_size": metadata(reader, "llama.feed_forward_length"),
        "num_hidden_layers": metadata(reader, "llama.block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": metadata(reader, "llama.attention.head_count_kv"),
        "head_dim": n_embd // n_head,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        # Stored as float32; written as the shortest decimal that round-trips it (1e-05).
        "rms_norm_eps": f32_decimal(metadata(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(metadata(reader, "llama.rope.freq_base")),
        "rope_scaling": None,
        "max_position_embeddings": metadata(reader, "llama.context_length"),
        "vocab_size": metadata(reader, "llama.vocab_size"),
        "tie_word_embeddings": tied,
        "bos_token_id": metadata(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": metadata(reader, "tokenizer.ggml.eos_token_id"),
        "torch_dtype": dtype,
    }


def gemma3_config(reader, dtype, tied, n_vocab):
    for key in reader.fields:
        if key.startswith("gemma3.") and key[len("gemma3."):] not in GEMMA3_KEYS:
            raise SystemExit(f"metadata key {key} is not supported by the converter")

    def get(key, default=None):
        return metadata(reader, "gemma3." + key, default)

    def need_int(key):
        value = get(key)
        if not isinstance(value, int):
            raise SystemExit(f"gemma3.{key} must be one integer, not {value!r}")
        return value

    n_layer, n_embd = need_int("block_count"), need_int("embedding_length")
    n_head, n_head_kv = need_int("attention.head_count"), need_int("attention.head_count_kv")
    head_dim = need_int("attention.key_length")
    if get("attention.value_length", head_dim) != head_dim:
        raise SystemExit("gemma3.attention.value_length != key_length is not supported")
    if get("rope.dimension_count", head_dim) != head_dim:
        raise SystemExit("partial rotary embeddings are not supported")
    if get("vocab_size", n_vocab) != n_vocab:
        raise SystemExit(f"gemma3.vocab_size != token_embd rows ({n_vocab})")
    window = get("attention.sliding_window", 0)
    pattern = get("attention.sliding_window_pattern", 6)
    if not window:
        sliding = [False] * n_layer
    elif isinstance(pattern, list):
        sliding = [bool(s) for s in pattern]
    else:
        sliding = [pattern == 0 or l % pattern < pattern - 1 for l in range(n_layer)]
    if len(sliding) != n_layer:
        raise SystemExit("gemma3.attention.sliding_window_pattern has the wrong length")
    kind, factor = get("rope.scaling.type", "linear"), get("rope.scaling.factor")
    if kind not in ("linear", "none"):
        raise SystemExit(f"gemma3.rope.scaling.type {kind!r} is not supported")
    rope_scaling = ({"rope_type": "linear", "factor": f32_decimal(factor)}
                    if kind == "linear" and factor else None)
    caps = {key: f32_decimal(get(key)) if get(key) else None
            for key in ("final_logit_softcapping", "attn_logit_softcapping")}
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": n_embd,
        "intermediate_size": need_int("feed_forward_length"),
        "num_hidden_layers": n_layer,
        "num_attention_heads": n_head,
        "num_key_value_heads": n_head_kv,
        "head_dim": head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": False,
        "rms_norm_eps": f32_decimal(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "rope_local_base_freq": float(get("rope.freq_base_swa", 10000.0)),
        "rope_scaling": rope_scaling,
        "sliding_window": int(window) if window else None,
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
        # llama.cpp (src/llama-model.cpp): 27B (62 layers) scales queries by
        # 1/sqrt(n_embd / n_head), every other size by 1/sqrt(head_dim).
        "query_pre_attn_scalar": n_embd // n_head if n_layer == 62 else head_dim,
        "max_position_embeddings": need_int("context_length"),
        "vocab_size": n_vocab,
        **caps,
        "tie_word_embeddings": tied,
        "bos_token_id": metadata(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": metadata(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": metadata(reader, "tokenizer.ggml.padding_token_id"),
        "torch_dtype": dtype,
    }


CONFIGS = {"llama": llama_config, "gemma3": gemma3_config}


def hf_name(gguf_name, layer_tensors):
    base, suffix = gguf_name.rsplit(".", 1)
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in layer_tensors:
        return f"model.layers.{parts[1]}.{layer_tensors[parts[2]]}.{suffix}"
    if base in GLOBAL_TENSORS:
        return f"{GLOBAL_TENSORS[base]}.{suffix}"
    raise SystemExit(f"unexpected tensor {gguf_name}")


def unpermute(w, n_head):
    """GGUF rows (head, d/2, 2) back to HF rows (head, 2, d/2)."""
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def encode(w, dtype):
    """The tensor's little-endian bytes in `dtype`, as a contiguous numpy array."""
    if dtype == "bfloat16":
        bits = np.ascontiguousarray(w, dtype="<f4").view("<u4")
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
    return np.ascontiguousarray(w, dtype="<f2" if dtype == "float16" else "<f4")


def gemma3_tokenizer(reader, tokenizer_dir):
    """{file name: text} of the tokenizer.json and tokenizer_config.json built from the GGUF."""
    if tokenizer_dir != "-":
        raise SystemExit("gemma3's tokenizer is built from the GGUF: omit HF_TOKENIZER_DIR")
    text, config = gguf_tokenizer.build(reader)
    return {"tokenizer.json": text,
            "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False) + "\n"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("tokenizer_dir", nargs="?", default="-")
    parser.add_argument("out_dir")
    parser.add_argument("--dtype", choices=DTYPES, default="f32")
    args = parser.parse_args()
    dtype = DTYPES[args.dtype]

    reader = GGUFReader(args.model)
    arch = metadata(reader, "general.architecture")
    if arch not in CONFIGS:
        raise SystemExit(f"architecture {arch!r} is not supported (only {', '.join(CONFIGS)})")
    shapes = {t.name: [int(n) for n in t.shape] for t in reader.tensors}
    if "token_embd.weight" not in shapes:
        raise SystemExit("token_embd.weight is missing")
    cfg = CONFIGS[arch](reader, dtype, "output.weight" not in shapes,
                        shapes["token_embd.weight"][-1])
    if arch == "llama":
        if args.tokenizer_dir == "-":
            raise SystemExit("llama needs HF_TOKENIZER_DIR (a folder with tokenizer.json)")
        heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}
        norms, tokenizer = set(), None
    else:
        heads, norms = {}, GEMMA3_NORMS
        tokenizer = gemma3_tokenizer(reader, args.tokenizer_dir)
    tensors = {}
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type)
        if not np.isfinite(w).all():
            raise SystemExit(f"{t.name} has non-finite values")
        kind = t.name.split(".")[-2]
        if kind in heads:
            w = unpermute(w, heads[kind])
        if kind in norms:
            w = w.astype(np.float32) - np.float32(1.0)
        tensors[hf_name(t.name, LAYER_TENSORS[arch])] = encode(w, dtype)

    out_dir = os.path.abspath(args.out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(out_dir) + ".", dir=parent)
    try:
        specs = {name: TensorSpec(dtype=dtype, shape=list(a.shape), data_ptr=a.ctypes.data,
                                  data_len=a.nbytes) for name, a in tensors.items()}
        serialize_file(specs, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if tokenizer is None:
                shutil.copyfile(os.path.join(args.tokenizer_dir, name), os.path.join(tmp, name))
            else:
                with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                    f.write(tokenizer[name])
        os.chmod(tmp, 0o755)  # mkdtemp's folder, and safetensors' file, are private
        for name in os.listdir(tmp):
            os.chmod(os.path.join(tmp, name), 0o644)
        shutil.rmtree(out_dir, ignore_errors=True)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"wrote {out_dir}: {len(tensors)} tensors, {dtype}")


if __name__ == "__main__":
    main()
