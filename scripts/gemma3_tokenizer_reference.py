#!/usr/bin/env python3
"""Reference token ids for Gemma 3's tokenizer, from the GGUF's own vocabulary.

Writes the expected ids of a list of hard strings (whitespace runs, newlines, scripts,
emoji, combining marks, byte fallback, control characters, digits, code, special tokens
written in text, llama.cpp's own test strings) into a JSON file that
`tokenizer/tests/gemma3.rs` compares Sonde with. Three sources:

* SentencePiece (Google's `sentencepiece` package): a BPE ModelProto rebuilt from the
  GGUF's tokens, scores and token types, with the normalizer Gemma's `tokenizer.model`
  uses (see `sentencepiece_model`). This is the tokenizer Gemma was trained with.
* llama.cpp's `llama-server` (`--llama-server BIN`): its POST /tokenize and /detokenize.
  What Sonde must match for a GGUF file.
* Without the server, a line-by-line port of llama.cpp's SentencePiece path
  (`llama_vocab::impl::tokenize`, `tokenizer_st_partition`, `llm_tokenizer_spm_session`
  in src/llama-vocab.cpp) stands in for it; with the server, the port is checked
  against it on every case and the script fails if they ever differ.

Where SentencePiece and llama.cpp disagree the file says so per case; Sonde follows
llama.cpp for GGUF files.

Usage:
  gemma3_tokenizer_reference.py MODEL.gguf LLAMA_SPM_INP OUT.json [--llama-server BIN]

LLAMA_SPM_INP is data/vocab/ggml-vocab-llama-spm.gguf.inp (llama.cpp's test strings).
"""

from __future__ import annotations

import argparse
import heapq
import json
import socket
import subprocess
import sys
import tempfile
import time
import unicodedata
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import gguf
import sentencepiece
from sentencepiece import sentencepiece_model_pb2 as sp_pb2

# llama.cpp's token types (tokenizer.ggml.token_type), the same numbers as SentencePiece's.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"


@dataclass
class Vocab:
    tokens: list[str]
    scores: list[float]
    types: list[int]
    bos: int
    eos: int
    unk: int
    pad: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool


def read_vocab(path: Path) -> Vocab:
    reader = gguf.GGUFReader(path)

    def field(key, default=None):
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    if field("tokenizer.ggml.model") != "llama":
        sys.exit(f"{path}: tokenizer.ggml.model is not llama (SentencePiece)")
    tokens = field("tokenizer.ggml.tokens")
    return Vocab(
        tokens=tokens,
        scores=[float(s) for s in field("tokenizer.ggml.scores")],
        types=[int(t) for t in field("tokenizer.ggml.token_type")],
        bos=field("tokenizer.ggml.bos_token_id"),
        eos=field("tokenizer.ggml.eos_token_id"),
        unk=field("tokenizer.ggml.unknown_token_id"),
        pad=field("tokenizer.ggml.padding_token_id"),
        # llama.cpp's defaults for a SentencePiece vocabulary.
        add_bos=bool(field("tokenizer.ggml.add_bos_token", True)),
        add_eos=bool(field("tokenizer.ggml.add_eos_token", False)),
        add_space_prefix=bool(field("tokenizer.ggml.add_space_prefix", True)),
    )


# --- SentencePiece ------------------------------------------------------------------------


def sentencepiece_model(vocab: Vocab, split_specials: bool) -> sentencepiece.SentencePieceProcessor:
    """Gemma's tokenizer.model rebuilt from the GGUF.

    What llama.cpp's converter (`_create_vocab_sentencepiece` in conversion/base.py) did to
    the pieces is undone: added tokens that are not special were written with spaces for
    `▁` ("pre-normalize user-defined spaces"), so their `▁` comes back; every added token
    got the score -1000, which a user-defined piece never uses (it is matched before BPE).

    The normalizer is inferred from the file: `add_space_prefix = false` is SentencePiece's
    `add_dummy_prefix = false` (the converter sets it for Gemma 3); whitespace is kept as
    it is (the vocabulary has user-defined pieces for runs of up to 31 spaces, which
    `remove_extra_whitespaces` would make unreachable); and no Unicode normalization
    (`identity`): about 2,000 pieces change under NFKC (e.g. `𝔹`, `ﬁ`, `２`) and would be
    unreachable behind an NFKC normalizer. `check_identity_normalizer` checks this.

    With `split_specials`, control tokens are user-defined pieces, so SentencePiece itself
    splits them out of the text: the analogue of llama.cpp's parse_special. Without it they
    are control pieces, which SentencePiece never matches in text (parse_special = false).
    <unk> stays the unknown piece either way (SentencePiece refuses a model without one),
    so SentencePiece never splits "<unk>" out of text where llama.cpp does.
    """
    model = sp_pb2.ModelProto()
    for i, (text, score, ty) in enumerate(zip(vocab.tokens, vocab.scores, vocab.types)):
        piece = model.pieces.add()
        if i == vocab.unk:
            piece.type = sp_pb2.ModelProto.SentencePiece.UNKNOWN
        elif ty == CONTROL and not split_specials:
            piece.type = sp_pb2.ModelProto.SentencePiece.CONTROL
        elif ty in (CONTROL, USER_DEFINED):
            piece.type = sp_pb2.ModelProto.SentencePiece.USER_DEFINED
            text = text.replace(" ", SPACE)
        elif ty == BYTE:
            piece.type = sp_pb2.ModelProto.SentencePiece.BYTE
        elif ty == UNUSED:
            piece.type = sp_pb2.ModelProto.SentencePiece.UNUSED
        else:
            piece.type = sp_pb2.ModelProto.SentencePiece.NORMAL
        piece.piece = text
        piece.score = score
    spec = model.trainer_spec
    spec.model_type = sp_pb2.TrainerSpec.BPE
    spec.vocab_size = len(vocab.tokens)
    spec.byte_fallback = True
    spec.unk_id, spec.bos_id, spec.eos_id = vocab.unk, vocab.bos, vocab.eos
    spec.pad_id = -1 if vocab.pad is None else vocab.pad
    spec.unk_piece = vocab.tokens[vocab.unk]
    spec.bos_piece = vocab.tokens[vocab.bos]
    spec.eos_piece = vocab.tokens[vocab.eos]
    if vocab.pad is not None:
        spec.pad_piece = vocab.tokens[vocab.pad]
    norm = model.normalizer_spec
    norm.name = "identity"
    norm.add_dummy_prefix = vocab.add_space_prefix
    norm.remove_extra_whitespaces = False
    norm.escape_whitespaces = True
    model.denormalizer_spec.name = "identity"
    sp = sentencepiece.SentencePieceProcessor()
    sp.LoadFromSerializedProto(model.SerializeToString())
    return sp


def check_identity_normalizer(vocab: Vocab) -> int:
    """Number of normal pieces NFKC would change (0 would leave the choice open)."""
    return sum(
        1
        for text, ty in zip(vocab.tokens, vocab.types)
        if ty == NORMAL and unicodedata.normalize("NFKC", text) != text
    )


# --- llama.cpp, ported ----------------------------------------------------------------------


# Token texts llama.cpp makes control tokens whatever their type in the file ("auto-detect
# special tokens by text" in llama_vocab::impl::load: the end-of-turn, end-of-message,
# fill-in-the-middle and end-of-generation lists). In Gemma 3 this makes the user-defined
# HTML tag `</s>` a control token, so parse_special = false leaves it as text.
CONTROL_BY_TEXT = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
    "<end_of_utterance>", "<|eom_id|>",
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>",
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
    "<|code_suffix|>", "<|suffix|>",
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
    "<|code_middle|>", "<|middle|>",
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
    "<|file_sep|>",
    "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "</s>", "[EOS]", "<eos>", "<turn|>",
    "<|tool_response>", "[e~[",
}
# ... and these it makes user-defined ("quick hack for gpt-oss").
USER_DEFINED_BY_TEXT = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}


class LlamaCppPort:
    """llama.cpp's SentencePiece tokenizer (LLAMA_VOCAB_TYPE_SPM), transcribed."""

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self.token_to_id = {}
        for i, text in enumerate(vocab.tokens):
            self.token_to_id[text] = i  # a later duplicate wins, as in llama.cpp
        # Token attributes after llama.cpp's overrides by text.
        self.control = [ty == CONTROL for ty in vocab.types]
        self.user_defined = [ty == USER_DEFINED for ty in vocab.types]
        for text, i in self.token_to_id.items():
            if text in CONTROL_BY_TEXT:
                self.control[i] = True
            if text in USER_DEFINED_BY_TEXT:
                self.control[i], self.user_defined[i] = False, True
        # cache_special_tokens: control, user-defined and unknown tokens, longest first.
        special = [
            i
            for i, ty in enumerate(vocab.types)
            if self.control[i] or self.user_defined[i] or ty == UNKNOWN
        ]
        self.special = sorted(special, key=lambda i: -len(vocab.tokens[i].encode()))

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        v = self.vocab
        fragments: list[str | int] = [text] if text else []
        # tokenizer_st_partition: each special token, longest first, splits every text
        # fragment at each of its occurrences (left to right, not overlapping).
        for tid in self.special:
            if not parse_special and (self.control[tid] or v.types[tid] == UNKNOWN):
                continue
            needle = v.tokens[tid]
            out: list[str | int] = []
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                    continue
                for k, part in enumerate(frag.split(needle)):
                    if k:
                        out.append(tid)
                    if part:
                        out.append(part)
            fragments = out
        ids = []
        if add_special and v.add_bos:
            ids.append(v.bos)
        is_prev_special = True
        for frag in fragments:
            if isinstance(frag, int):
                ids.append(frag)
                is_prev_special = True
                continue
            if v.add_space_prefix and is_prev_special:
                frag = " " + frag
            self._spm(frag.replace(" ", SPACE), ids)
            is_prev_special = False
        if add_special and v.add_eos:
            ids.append(v.eos)
        return ids

    def _spm(self, text: str, out: list[int]) -> None:
        # llm_tokenizer_spm_session::tokenize: symbols are UTF-8 characters; the adjacent
        # pair whose concatenation is a token of the highest score merges first, the
        # leftmost of equal scores first.
        syms = list(text)
        n = len(syms)
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        if n:
            nxt[-1] = -1
        queue: list[tuple[float, int, int, int]] = []

        def try_add(left: int, right: int) -> None:
            if left == -1 or right == -1:
                return
            joined = syms[left] + syms[right]
            tid = self.token_to_id.get(joined)
            if tid is None:
                return
            heapq.heappush(queue, (-self.vocab.scores[tid], left, right, len(joined)))

        for i in range(1, n):
            try_add(i - 1, i)
        while queue:
            _, left, right, size = heapq.heappop(queue)
            if not syms[left] or not syms[right] or len(syms[left]) + len(syms[right]) != size:
                continue
            syms[left] += syms[right]
            syms[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            try_add(prev[left], left)
            try_add(left, nxt[left])
        i = 0 if n else -1
        while i != -1:
            tid = self.token_to_id.get(syms[i])
            if tid is not None:
                out.append(tid)
            else:
                # resegment: a symbol that is no token is a character outside the
                # vocabulary; it becomes its UTF-8 bytes as <0xAB> tokens.
                out.extend(self._byte_token(b) for b in syms[i].encode())
            i = nxt[i]

    def _byte_token(self, byte: int) -> int:
        tid = self.token_to_id.get(f"<0x{byte:02X}>")
        return tid if tid is not None else self.token_to_id[chr(byte)]

    def piece(self, tid: int) -> bytes:
        """common_token_to_piece(.., special = true): what /detokenize concatenates."""
        text, ty = self.vocab.tokens[tid], self.vocab.types[tid]
        if self.control[tid] or self.user_defined[tid] or ty == UNKNOWN:
            return text.encode()
        if ty == NORMAL:
            return text.replace(SPACE, " ").encode()
        if ty == BYTE:
            return bytes([int(text[3:5], 16)])
        return b""  # unused tokens print nothing

    def detokenize(self, ids: list[int]) -> bytes:
        return b"".join(self.piece(i) for i in ids)


# --- llama-server ---------------------------------------------------------------------------


class LlamaServer:
    """llama.cpp's HTTP server on a free loopback port, for /tokenize and /detokenize."""

    def __init__(self, binary: Path, model: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [str(binary), "-m", str(model), "-t", "1", "-c", "512", "--host", "127.0.0.1",
             "--port", str(self.port), "--no-webui"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                sys.exit(f"llama-server exited:\n{self.log.read().decode(errors='replace')[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                sys.exit("llama-server did not become healthy in 120 s")
            time.sleep(0.5)

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        body = {"content": text, "add_special": add_special, "parse_special": parse_special}
        return self.post("/tokenize", body)["tokens"]

    def pieces(self, ids: list[int]) -> list[bytes]:
        """Each token's piece as raw bytes (`with_pieces` gives bytes where not UTF-8)."""
        out = []
        for tid in ids:
            [tok] = self.post("/tokenize", {"content": [tid], "with_pieces": True})["tokens"]
            p = tok["piece"]
            out.append(p.encode() if isinstance(p, str) else bytes(p))
        return out

    def detokenize(self, ids: list[int]) -> str:
        return self.post("/detokenize", {"tokens": ids})["content"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# --- the strings ------------------------------------------------------------------------------


def hard_strings(vocab: Vocab) -> list[str]:
    nl = "\n"
    strings = [
        # Empty and whitespace: leading, trailing, runs (Gemma has user-defined tokens for
        # runs of 2..31 spaces, 1..31 newlines and 1..31 tabs), mixed.
        "", " ", "  ", "   ", " " * 31, " " * 32, " " * 40, " " * 100,
        " Hello", "  Hello", "Hello ", "Hello  ", "Hello   world", "Hello world  ",
        "a b", "a  b", "a   b", " a ", "  a  ", "\ta", "a\t", "\t", "\t\t", "\t" * 31,
        "\t" * 33, " \t ", "\t \t", "\t\n", "\n\t", nl, nl * 2, nl * 3, nl * 31, nl * 32,
        nl * 45, " \n", "\n ", " \n ", "a\nb", "a\n\nb", "a \n b", "a\n\n\n\nb",
        "line1\nline2\r\nline3\rline4", "\r", "\r\n", "\r\n\r\n", "\n\r\n",
        "\u00a0", "a\u00a0b", "\u3000", "a\u3000b", "\u2028", "\u2029", "\u200b", "a\u200bb",
        "\ufeff", "\ufeffHello", "\u1680", "\u0085", "\x0b\x0c",
        # Unicode: CJK, Japanese, Korean, emoji (with ZWJ sequences and modifiers),
        # combining marks, right-to-left scripts, rare and absent characters.
        "我想在apple工作1314151天～", "日本語のテキストです。", "한국어 문장입니다", "中文，标点！",
        "😁", "🦙", "🦙🦙", "🦀🎉", "👩‍💻", "👍🏽", "🏳️‍🌈", "🧑‍🤝‍🧑", "🇫🇷", "🫠🫨🪿",
        "e\u0301", "é", "Å", "a\u0300\u0301\u0302\u0303", "ñ vs n\u0303",
        "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a",
        "कि", "हिन्दी भाषा", "ภาษาไทย", "ქართული", "தமிழ்", "Ελληνικά", "Привет, мир!",
        "مرحبا بالعالم", "שלום עולם", "abc אבג 123 دجه", "\u202eabc\u202c", "\u200fRTL\u200e",
        "𝔹𝕖𝕥𝕒", "ﬁne", "①②③", "½ ¼ ¾", "℃ ™ ©",
        # Characters outside the vocabulary: byte fallback (UTF-8 bytes as <0xAB> tokens).
        "𠀀", "𠀁𪚥", "𐀀𐀁", "𓀀 𓀁", "\U000f0000", "\U0010fffd", "\U000e0001", "\uffff",
        "\u0378", "ǅ", "a𠀀b", " 𠀀 ", "\ufffd", "\ue000",
        # Control characters.
        "\x00", "a\x00b", "\x01\x02\x03", "\x7f", "\x1b[31mred\x1b[0m", "\x08\x07",
        "tab\tsep\tvalues",
        # Digits and numbers.
        "0", "3", "33", "333", "1234567890", "3.14159", "1,000,000", "-42", "1e-10",
        "0x1F", "٣٤٥", "２０２４年", "१२३",
        # Code.
        "def f(x):\n    return x * 2\n",
        "fn main() {\n\tprintln!(\"hi\");\n}\n",
        "if (a&&b) { c[i++] = d->e; } // done",
        '{"key": [1, 2.5, null], "k2": "v"}',
        "<table><tr><td>x</td></tr></table>",
        "<s>bold?</s> <b>b</b> <code>x</code>",
        "```python\nprint('hi')\n```",
        "SELECT * FROM t WHERE id = 1;",
        "    indented\n        more\n\tand tab",
        # Special tokens written in text (with and without parse_special), and look-alikes.
        "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
        "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<unk>", "<mask>",
        "<bos>Hello", "Hello<eos>", "<bos><bos>", "a<pad>b", "<unused0>", "<unused99>",
        "<unused6241>", "<unused6242>", "x<unused12>3", "<start_of_image>", "<end_of_image>",
        "[multimodal]", "<start_of_turn", "start_of_turn>", "<<start_of_turn>>",
        " <start_of_turn> ", "<start_of_turn>\n\n", "  <end_of_turn>  ",
        "<0x41>", "<0xFF>", "<0x0A>", "<0x41><0x42>", "\u2581", "\u2581\u2581Hello",
        "Hello\u2581world",
        # Longer prose.
        "The quick brown fox jumps over the lazy dog. " * 3,
        "In 1492, Columbus sailed the ocean blue; in 2024 — well, who knows? (Nobody.)",
    ]
    return strings


def llama_cpp_test_strings(path: Path) -> list[str]:
    """llama.cpp's test strings, split exactly as its test-tokenizer-0 splits them."""
    return path.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")


# Token-id lists for decoding beyond what the encode cases produce: lone and truncated
# byte tokens, every kind of token, tokens back to back.
def decode_ids(vocab: Vocab, port: LlamaCppPort) -> list[list[int]]:
    byte = lambda b: port._byte_token(b)  # noqa: E731
    t = port.token_to_id
    return [
        [],
        [byte(0xE4)],
        [byte(0xE4), byte(0xB8)],
        [byte(0xE4), byte(0xB8), byte(0xAD)],
        [t["▁a"], byte(0xF0), byte(0x9F), t["▁b"]],
        [byte(0xFF), byte(0xFE)],
        [byte(0x80)],
        [byte(0x00), byte(0x0A)],
        [vocab.bos, t["Hello"], vocab.eos],
        [vocab.pad, vocab.unk, t["<mask>"], t["<unused0>"], t["[multimodal]"]],
        [t["<start_of_turn>"], t["user"], t["\n"], t["Hi"], t["<end_of_turn>"]],
        [t["  "], t["\n\n"], t["\t"], t["<table>"]],
        [t[SPACE], t[SPACE], t["▁Hello"]],
    ]


# --- main -------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("llama_spm_inp", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary")
    args = ap.parse_args()

    vocab = read_vocab(args.model)
    nfkc_changed = check_identity_normalizer(vocab)
    if nfkc_changed == 0:
        sys.exit("no piece changes under NFKC: the identity normalizer is not established")
    sp_plain = sentencepiece_model(vocab, split_specials=False)
    sp_special = sentencepiece_model(vocab, split_specials=True)
    port = LlamaCppPort(vocab)
    server = LlamaServer(args.llama_server, args.model) if args.llama_server else None

    texts = []
    for text in hard_strings(vocab) + llama_cpp_test_strings(args.llama_spm_inp):
        if text not in texts:
            texts.append(text)
    cases = []
    decode_lists = []
    disagreements = 0
    try:
        for text in texts:
            variants = [(False, True), (False, False)]
            if text in ("", "Hello", "<bos>Hello", " Hello", "<start_of_turn>user\nHi"):
                variants += [(True, True), (True, False)]
            for add_special, parse_special in variants:
                sp = sp_special if parse_special else sp_plain
                sp_ids = sp.EncodeAsIds(text)
                if add_special and vocab.add_bos:
                    sp_ids = [vocab.bos] + sp_ids
                if add_special and vocab.add_eos:
                    sp_ids = sp_ids + [vocab.eos]
                port_ids = port.tokenize(text, add_special, parse_special)
                case = {
                    "text": text,
                    "add_special": add_special,
                    "parse_special": parse_special,
                    "sentencepiece": sp_ids,
                }
                if server:
                    ids = server.tokenize(text, add_special, parse_special)
                    if ids != port_ids:
                        sys.exit(
                            f"the port of llama.cpp disagrees with llama-server on {text!r} "
                            f"(add_special={add_special}, parse_special={parse_special}):\n"
                            f"  llama-server {ids}\n  port         {port_ids}"
                        )
                else:
                    ids = port_ids
                case["llama_cpp"] = ids
                case["agree"] = ids == sp_ids
                disagreements += not case["agree"]
                cases.append(case)
                if ids not in decode_lists:
                    decode_lists.append(ids)
        for ids in decode_ids(vocab, port):
            if ids not in decode_lists:
                decode_lists.append(ids)

        decodes = []
        for ids in decode_lists:
            raw = port.detokenize(ids)
            entry = {
                "ids": ids,
                # What llama.cpp's detokenizer writes (control tokens included), as hex
                # because it need not be UTF-8.
                "llama_cpp_hex": raw.hex(),
                # SentencePiece's DecodeIds (control tokens left out; invalid UTF-8 as
                # U+FFFD).
                "sentencepiece": sp_plain.DecodeIds(ids),
            }
            if server:
                pieces = b"".join(server.pieces(ids)) if ids else b""
                if pieces != raw:
                    sys.exit(f"llama-server's pieces of {ids} are {pieces!r}, the port's {raw!r}")
                # /detokenize answers JSON, so bytes that are not UTF-8 arrive replaced.
                entry["llama_server_text"] = server.detokenize(ids)
            decodes.append(entry)
    finally:
        if server:
            server.close()

    result = {
        "model": args.model.name,
        "source": {
            "llama_cpp": "llama-server" if server else "port of llama.cpp's llama-vocab.cpp",
            "sentencepiece": f"sentencepiece {sentencepiece.__version__}, BPE ModelProto from the GGUF",
        },
        "normalizer": {
            "name": "identity",
            "add_dummy_prefix": vocab.add_space_prefix,
            "remove_extra_whitespaces": False,
            "escape_whitespaces": True,
            "pieces_changed_by_nfkc": nfkc_changed,
        },
        "cases": cases,
        "decode": decodes,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, ensure_ascii=True, indent=1) + "\n", encoding="utf-8")
    print(
        f"{args.out}: {len(cases)} encode cases ({disagreements} where SentencePiece and "
        f"llama.cpp differ), {len(decodes)} decode cases; llama.cpp from "
        f"{result['source']['llama_cpp']}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
