#!/usr/bin/env python3
"""Dequantize a Llama-architecture GGUF into a Hugging Face layout folder.

Reads the GGUF with the `gguf` package, dequantizes every tensor (`gguf.quants.dequantize`,
float32), and writes OUT_DIR with
  config.json           LlamaForCausalLM config from the GGUF metadata
  model.safetensors     HF tensor names, [out, in] shapes, in the chosen dtype
  tokenizer.json,
  tokenizer_config.json copied from HF_TOKENIZER_DIR
llama.cpp's converter permutes the rows of attn_q and attn_k so that rope rotates interleaved
pairs (x[2i], x[2i+1]); they are un-permuted per head back to HF's rotate_half layout, where
pair i is (x[i], x[i+d/2]). With tied embeddings (no output.weight) no lm_head.weight is
written. bf16 is rounded to nearest even from the float32 values. The folder is built under a
temporary name next to OUT_DIR and renamed into place at the end.

Usage: gguf_to_hf.py MODEL.gguf HF_TOKENIZER_DIR OUT_DIR [--dtype f32|f16|bf16]
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

DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def metadata(reader, key):
    return reader.fields[key].contents()


def config(reader, dtype, tied):
    if metadata(reader, "general.architecture") != "llama":
        raise SystemExit("only the llama architecture is supported")
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
        "rms_norm_eps": float(str(np.float32(
            metadata(reader, "llama.attention.layer_norm_rms_epsilon")))),
        "rope_theta": float(metadata(reader, "llama.rope.freq_base")),
        "rope_scaling": None,
        "max_position_embeddings": metadata(reader, "llama.context_length"),
        "vocab_size": metadata(reader, "llama.vocab_size"),
        "tie_word_embeddings": tied,
        "bos_token_id": metadata(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": metadata(reader, "tokenizer.ggml.eos_token_id"),
        "torch_dtype": dtype,
    }


def hf_name(gguf_name):
    base, suffix = gguf_name.rsplit(".", 1)
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}.{suffix}"
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("tokenizer_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--dtype", choices=DTYPES, default="f32")
    args = parser.parse_args()
    dtype = DTYPES[args.dtype]

    reader = GGUFReader(args.model)
    names = {t.name for t in reader.tensors}
    cfg = config(reader, dtype, "output.weight" not in names)
    heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}
    tensors = {}
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type)
        if not np.isfinite(w).all():
            raise SystemExit(f"{t.name} has non-finite values")
        kind = t.name.split(".")[-2]
        if kind in heads:
            w = unpermute(w, heads[kind])
        tensors[hf_name(t.name)] = encode(w, dtype)

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
            shutil.copyfile(os.path.join(args.tokenizer_dir, name), os.path.join(tmp, name))
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
