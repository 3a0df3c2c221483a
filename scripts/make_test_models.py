#!/usr/bin/env python3
"""GGUF test models, from real weights, for architectures and tensors no small real model has.

Each good file is a valid model that llama.cpp's llama-server loads and runs; every weight is a
real SmolLM2-135M-Instruct (or Gemma 3 270M) weight in its original quantized blocks (rows are
only reordered or concatenated, which keeps each row's blocks intact), so llama.cpp and the
float64 reference (reference_forward.py) see exactly the same numbers. Tokenizer metadata is
copied unchanged. The output is deterministic: the same bytes on every run.

  llama31-rope.gguf  SmolLM2 + `rope_freqs.weight` computed as llama.cpp's converter does for
                     rope_type "llama3" with Llama 3.1's own factors (factor 8, low_freq_factor 1,
                     high_freq_factor 4, original context 8192) on SmolLM2's base 1e5 and
                     head_dim 64: pairs 0-16 keep factor 1 (wavelength < 2048), pairs 17-19 are
                     interpolated (1.49, 2.39, 4.13), pairs 20-31 get 8. SmolLM2's 8192-token
                     context is also Llama 3.1's original one, so nothing needed rescaling.
  llama-linear.gguf  SmolLM2 + `llama.rope.scaling.type = linear`, factor 2 (positions / 2).
  qwen3.gguf         SmolLM2 relabelled as arch qwen3 (keys `qwen3.*`, key/value_length 64),
                     Q/K rows un-permuted back to HF order (NeoX rope), plus per-layer
                     `attn_q_norm` / `attn_k_norm` [64] derived from the layer's weights: each
                     within-head dim's expected RMS, |W_row * attn_norm| averaged over heads
                     (values 0.1 to 4, mostly around 1-2), so that the normalized q and k keep
                     about the original magnitudes and the model stays a working model.
  qwen2.gguf         SmolLM2 as arch qwen2, Q/K un-permuted, with q/k/v biases derived from the
                     weights: 0.2 * the row's expected RMS * tanh(row sum / std of row sums).
  phi3.gguf          SmolLM2 as arch phi3: `attn_qkv` = rows [q|k|v], `ffn_up` = rows [gate|up]
                     (no ffn_gate), `phi3.rope.dimension_count` 32 of head_dim 64 (partial
                     rotary). So that the model stays a working model, each head's Q/K rows are
                     ordered [x_0..x_15, y_0..y_15, x_16..x_31, y_16..y_31] (x_i, y_i: HF's pair
                     i) and `rope.freq_base` is sqrt(1e5): NeoX pair j < 16 of the 32 rotated
                     dims then turns at base'^(-2j/32) = 1e5^(-2j/64), exactly SmolLM2's pair j;
                     its 16 slowest pairs are no longer rotated.
  gemma3-swa.gguf    Gemma 3 270M with `gemma3.attention.sliding_window` 32 (instead of 512, so
                     that short prompts cross it) and `gemma3.rope.scaling.type = linear`, factor
                     4 (applied by llama.cpp on the global layers 5, 11, 17 only).
  gemma2.gguf        Gemma 3 270M as arch gemma2: q/k norms dropped (Q/K rows rescaled by what the
                     norm made of them on average, re-quantized to Q8_0), rope base 10,000 on every
                     layer, window 32 on the even layers, attention / final softcaps 50 / 30.

Bad files, which a loader must refuse by name (llama.cpp's behaviour in brackets):
  bad-extra-tensor.gguf   SmolLM2 + `blk.0.attn_sinks.weight` F32 [9] [refused: wrong number of
                          tensors]
  bad-rope-yarn.gguf      SmolLM2 + `llama.rope.scaling.type = yarn`, factor 4 [runs YaRN]
  bad-truncated.gguf      SmolLM2 cut in the middle of its tensor data [refused]
  bad-attn-q-shape.gguf   SmolLM2 with `blk.0.attn_q.weight` of 512 rows instead of 576
                          [refused: wrong shape]

Usage: make_test_models.py OUT_DIR [--smollm2 GGUF] [--gemma3 GGUF] [--only NAME ...]
  (defaults: $SONDE_DATA_DIR/models/SmolLM2-135M-Instruct.Q4_1.gguf and
  gemma-3-270m-q4_k_m.gguf; OUT_DIR is usually data/models/test)
"""

import argparse
import math
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.environ.get("SONDE_DATA_DIR", os.path.join(ROOT, "data"))
SMOLLM2 = os.path.join(DATA, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA3 = os.path.join(DATA, "models", "gemma-3-270m-q4_k_m.gguf")
F32 = GGMLQuantizationType.F32
Q8_0 = GGMLQuantizationType.Q8_0


class Model:
    """A GGUF's metadata [(key, value, type, sub_type)] and tensors {name: (rows, type)}, where
    rows is the reader's array: [rows, bytes per row] uint8 for quantized types, the values for
    float types. Editing it and calling `write` makes a new file."""

    def __init__(self, path):
        self.reader = GGUFReader(path)
        self.arch = self.reader.fields["general.architecture"].contents()
        self.kv = []
        for f in self.reader.fields.values():
            if f.name == "general.architecture" or f.name.startswith("GGUF."):
                continue
            vtype = f.types[0]
            sub = f.types[-1] if vtype == GGUFValueType.ARRAY else None
            self.kv.append([f.name, f.contents(), vtype, sub])
        self.tensors = {t.name: (np.asarray(t.data), t.tensor_type) for t in self.reader.tensors}

    def get(self, key):
        return next(v for k, v, _, _ in self.kv if k == key)

    def set(self, key, value, vtype):
        for entry in self.kv:
            if entry[0] == key:
                entry[1], entry[2] = value, vtype
                return
        self.kv.append([key, value, vtype, None])

    def relabel(self, arch):
        """Renames the `{old arch}.*` keys to `{arch}.*`."""
        old = self.arch + "."
        for entry in self.kv:
            if entry[0].startswith(old):
                entry[0] = arch + "." + entry[0][len(old):]
        self.arch = arch

    def weights(self, name):
        """The dequantized values of a tensor, float64 [out, in]."""
        rows, kind = self.tensors[name]
        return dequantize(rows, kind).astype(np.float64)

    def write(self, path):
        tmp = path + ".tmp"
        writer = GGUFWriter(tmp, arch=self.arch)
        for key, value, vtype, sub in self.kv:
            writer.add_key_value(key, value, vtype, sub_type=sub)
        for name, (rows, kind) in self.tensors.items():
            writer.add_tensor_info(name, rows.shape, rows.dtype, rows.nbytes, kind)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for rows, _ in self.tensors.values():
            writer.write_tensor_data(np.ascontiguousarray(rows))
        writer.close()
        os.replace(tmp, path)


def heads_of(m):
    a = m.arch
    return m.get(f"{a}.attention.head_count"), m.get(f"{a}.attention.head_count_kv")


def reorder_rows(rows, n_head, order):
    """Applies the within-head row order `order` (a permutation of range(head_dim)) to every
    head of a [n_head * head_dim, ...] row array."""
    head_dim = rows.shape[0] // n_head
    index = (np.arange(n_head)[:, None] * head_dim + np.asarray(order)[None, :]).reshape(-1)
    return rows[index]


def unpermute_order(head_dim):
    """GGUF row (2i + c) holds HF row (c * head_dim/2 + i); this lists, for each HF row, its
    GGUF row: llama.cpp's converter permutation undone."""
    half = head_dim // 2
    return [2 * (r % half) + r // half for r in range(head_dim)]


def to_hf_layout(m):
    """Un-permutes the Q/K rows of every layer of a llama-arch model (NeoX rope from here)."""
    n_head, n_head_kv = heads_of(m)
    head_dim = m.get(f"{m.arch}.embedding_length") // n_head
    order = unpermute_order(head_dim)
    for name, (rows, kind) in list(m.tensors.items()):
        if name.endswith("attn_q.weight"):
            m.tensors[name] = (reorder_rows(rows, n_head, order), kind)
        elif name.endswith("attn_k.weight"):
            m.tensors[name] = (reorder_rows(rows, n_head_kv, order), kind)


def llama3_rope_factors(base, dim, factor=8.0, low=1.0, high=4.0, original=8192):
    """llama.cpp's convert_hf_to_gguf.py (conversion/llama.py, rope_type "llama3")."""
    freqs = (1.0 / (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32)
                                          / np.float32(dim)))).astype(np.float64)
    low_wavelen, high_wavelen = original / low, original / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def named(m, text):
    m.set("general.name", f"Sonde test model: {text}", GGUFValueType.STRING)


def insert_after(m, after, name, entry):
    items = list(m.tensors.items())
    at = next(i for i, (k, _) in enumerate(items) if k == after) + 1
    m.tensors = dict(items[:at] + [(name, entry)] + items[at:])


def llama31_rope(src):
    m = Model(src)
    base = float(m.get("llama.rope.freq_base"))
    dim = m.get("llama.rope.dimension_count")
    factors = llama3_rope_factors(base, dim)
    # llama.cpp's converter writes it right after the token embedding (generate_extra_tensors).
    insert_after(m, "token_embd.weight", "rope_freqs.weight", (factors, F32))
    named(m, "SmolLM2-135M-Instruct + Llama 3.1 rope_freqs")
    print("  rope_freqs:", " ".join(f"{f:.3g}" for f in factors))
    return m


def llama_linear(src):
    m = Model(src)
    m.set("llama.rope.scaling.type", "linear", GGUFValueType.STRING)
    m.set("llama.rope.scaling.factor", 2.0, GGUFValueType.FLOAT32)
    named(m, "SmolLM2-135M-Instruct + linear rope scaling 2")
    return m


def expected_rms(w, norm):
    """The expected RMS of each output of `w` [out, in] applied to rms-normalized inputs scaled
    by `norm` (inputs of unit variance): |w_row * norm|."""
    return np.sqrt(((w * norm) ** 2).sum(axis=1))


def qk_norm_weights(w, norm, n_head):
    """[head_dim] norm weights from a Q or K weight [n_head * head_dim, n_in] in HF order and the
    layer's attn_norm: each within-head dim's expected RMS (over heads), so that normalized
    q and k keep about the magnitudes of the original model's and its attention its sharpness."""
    head_dim = w.shape[0] // n_head
    r = expected_rms(w, norm).reshape(n_head, head_dim)
    return np.sqrt((r ** 2).mean(axis=0)).astype(np.float32)


def qwen3(src):
    m = Model(src)
    n_head, n_head_kv = heads_of(m)
    head_dim = m.get("llama.embedding_length") // n_head
    to_hf_layout(m)
    m.relabel("qwen3")
    m.set("qwen3.attention.key_length", head_dim, GGUFValueType.UINT32)
    m.set("qwen3.attention.value_length", head_dim, GGUFValueType.UINT32)
    n_layer = m.get("qwen3.block_count")
    for i in range(n_layer):
        p = f"blk.{i}."
        norm = m.weights(p + "attn_norm.weight")
        qn = qk_norm_weights(m.weights(p + "attn_q.weight"), norm, n_head)
        kn = qk_norm_weights(m.weights(p + "attn_k.weight"), norm, n_head_kv)
        insert_after(m, p + "attn_k.weight", p + "attn_k_norm.weight", (kn, F32))
        insert_after(m, p + "attn_q.weight", p + "attn_q_norm.weight", (qn, F32))
        if i == 0:
            print(f"  blk.0 q_norm {qn.min():.3f}..{qn.max():.3f},"
                  f" k_norm {kn.min():.3f}..{kn.max():.3f}")
    named(m, "SmolLM2-135M-Instruct as qwen3 with q/k norms")
    return m


def qwen2(src):
    m = Model(src)
    to_hf_layout(m)
    m.relabel("qwen2")
    for i in range(m.get("qwen2.block_count")):
        norm = m.weights(f"blk.{i}.attn_norm.weight")
        for part in ("v", "k", "q"):
            name = f"blk.{i}.attn_{part}.weight"
            w = m.weights(name)
            z = w.sum(axis=1)
            bias = (0.2 * expected_rms(w, norm) * np.tanh(z / z.std())).astype(np.float32)
            insert_after(m, name, f"blk.{i}.attn_{part}.bias", (bias, F32))
    named(m, "SmolLM2-135M-Instruct as qwen2 with q/k/v biases")
    return m


def phi3(src):
    m = Model(src)
    n_head, n_head_kv = heads_of(m)
    head_dim = m.get("llama.embedding_length") // n_head
    n_rot = head_dim // 2
    # HF row r of a head: x_r for r < 32, y_(r-32) otherwise. New order: the 16 fastest pairs
    # as NeoX pairs of the first 32 dims, then the rest unrotated.
    half, quarter = head_dim // 2, head_dim // 4
    hf_order = (list(range(quarter)) + list(range(half, half + quarter))
                + list(range(quarter, half)) + list(range(half + quarter, head_dim)))
    gguf_of_hf = unpermute_order(head_dim)
    order = [gguf_of_hf[r] for r in hf_order]
    m.relabel("phi3")
    m.set("phi3.rope.dimension_count", n_rot, GGUFValueType.UINT32)
    m.set("phi3.rope.freq_base", math.sqrt(float(m.get("phi3.rope.freq_base"))),
          GGUFValueType.FLOAT32)
    tensors = {}
    for name, entry in m.tensors.items():
        p, _, kind = name.rpartition(".")[0].rpartition(".")
        if kind in ("attn_q", "attn_k", "attn_v", "ffn_gate"):
            continue
        if kind == "attn_output":
            q, qt = m.tensors[p + ".attn_q.weight"]
            k, kt = m.tensors[p + ".attn_k.weight"]
            v, vt = m.tensors[p + ".attn_v.weight"]
            if not qt == kt == vt:
                sys.exit(f"{p}: q/k/v block types differ")
            qkv = np.concatenate([reorder_rows(q, n_head, order),
                                  reorder_rows(k, n_head_kv, order), v])
            tensors[p + ".attn_qkv.weight"] = (qkv, qt)
        if kind == "ffn_up":
            gate, gt = m.tensors[p + ".ffn_gate.weight"]
            if gt != entry[1]:
                sys.exit(f"{p}: gate/up block types differ")
            entry = (np.concatenate([gate, entry[0]]), gt)
        tensors[name] = entry
    m.tensors = tensors
    named(m, "SmolLM2-135M-Instruct as phi3, fused qkv/gate-up, partial rotary 32/64")
    return m


def gemma3_swa(src):
    m = Model(src)
    m.set("gemma3.attention.sliding_window", 32, GGUFValueType.UINT32)
    m.set("gemma3.rope.scaling.type", "linear", GGUFValueType.STRING)
    m.set("gemma3.rope.scaling.factor", 4.0, GGUFValueType.FLOAT32)
    named(m, "Gemma 3 270M with sliding window 32 and linear rope scaling 4")
    return m


def gemma2(src):
    """Gemma 3 270M as arch gemma2: its q/k norms dropped (Gemma 2 has none; Q and K rescaled
    to make up for them, see below), one rope base
    (10,000, Gemma 3's local one), a 32-token window on the even layers, and Gemma 2's
    attention and final logit softcaps (50, 30) written out."""
    m = Model(src)
    head_dim = m.get("gemma3.attention.key_length")
    for i in range(m.get("gemma3.block_count")):
        p = f"blk.{i}."
        norm = m.weights(p + "attn_norm.weight")
        for part in ("q", "k"):
            # Without its q/k norms the model's scores grow into the thousands and its
            # attention picks keys by differences below f32 rounding. So each Q/K row is
            # scaled by what its norm would have made of it on average (the norm weight over
            # the row's expected RMS) and stored as Q8_0: a working model again.
            w = m.weights(p + f"attn_{part}.weight")
            qk_norm = m.weights(p + f"attn_{part}_norm.weight")
            scale = np.tile(qk_norm, w.shape[0] // head_dim) / expected_rms(w, norm)
            rows = quantize((w * scale[:, None]).astype(np.float32), Q8_0)
            m.tensors[p + f"attn_{part}.weight"] = (rows, Q8_0)
            del m.tensors[p + f"attn_{part}_norm.weight"]
    m.relabel("gemma2")
    m.set("gemma2.rope.freq_base", 10000.0, GGUFValueType.FLOAT32)
    m.set("gemma2.attention.sliding_window", 32, GGUFValueType.UINT32)
    m.set("gemma2.attn_logit_softcapping", 50.0, GGUFValueType.FLOAT32)
    m.set("gemma2.final_logit_softcapping", 30.0, GGUFValueType.FLOAT32)
    named(m, "Gemma 3 270M as Gemma 2 (no q/k norms, window 32, softcaps 50 / 30)")
    return m


def bad_extra_tensor(src):
    m = Model(src)
    n_head, _ = heads_of(m)
    insert_after(m, "blk.0.attn_v.weight", "blk.0.attn_sinks.weight",
                 (np.zeros(n_head, dtype=np.float32), F32))
    return m


def bad_rope_yarn(src):
    m = Model(src)
    m.set("llama.rope.scaling.type", "yarn", GGUFValueType.STRING)
    m.set("llama.rope.scaling.factor", 4.0, GGUFValueType.FLOAT32)
    m.set("llama.rope.scaling.original_context_length", 2048, GGUFValueType.UINT32)
    return m


def bad_attn_q_shape(src):
    m = Model(src)
    rows, kind = m.tensors["blk.0.attn_q.weight"]
    m.tensors["blk.0.attn_q.weight"] = (rows[:512], kind)
    return m


def write_truncated(src, path):
    reader = GGUFReader(src)
    start = min(t.data_offset for t in reader.tensors)
    end = max(t.data_offset + t.n_bytes for t in reader.tensors)
    cut = start + (end - start) // 2
    with open(src, "rb") as f:
        data = f.read(cut)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


BUILDERS = {
    "llama31-rope": ("smollm2", llama31_rope),
    "llama-linear": ("smollm2", llama_linear),
    "qwen3": ("smollm2", qwen3),
    "qwen2": ("smollm2", qwen2),
    "phi3": ("smollm2", phi3),
    "gemma3-swa": ("gemma3", gemma3_swa),
    "gemma2": ("gemma3", gemma2),
    "bad-extra-tensor": ("smollm2", bad_extra_tensor),
    "bad-rope-yarn": ("smollm2", bad_rope_yarn),
    "bad-truncated": ("smollm2", None),
    "bad-attn-q-shape": ("smollm2", bad_attn_q_shape),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--smollm2", default=SMOLLM2)
    parser.add_argument("--gemma3", default=GEMMA3)
    parser.add_argument("--only", nargs="+", choices=sorted(BUILDERS), metavar="NAME")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    sources = {"smollm2": args.smollm2, "gemma3": args.gemma3}
    for name in args.only or BUILDERS:
        source, build = BUILDERS[name]
        path = os.path.join(args.out_dir, name + ".gguf")
        print(f"{name}: from {os.path.basename(sources[source])}", flush=True)
        if build is None:
            write_truncated(sources[source], path)
        else:
            build(sources[source]).write(path)
        print(f"  wrote {path} ({os.path.getsize(path):,} bytes)", flush=True)


if __name__ == "__main__":
    main()
