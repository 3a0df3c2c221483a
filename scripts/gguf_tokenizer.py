"""A Hugging Face tokenizer.json built from a GGUF's SentencePiece-BPE vocabulary (used by
gguf_to_hf.py for Gemma 3, whose GGUF is the only tokenizer at hand).

The GGUF keeps the pieces of Gemma's tokenizer.model (tokenizer.ggml.model "llama":
tokenizer.ggml.tokens / scores / token_type, the SentencePiece piece types). They are turned
into a `tokenizers` pipeline the way transformers' GemmaConverter (convert_slow_tokenizer.py)
converts that tokenizer.model:
  model          BPE over every piece (id = index), byte_fallback, fuse_unk, unk "<unk>"; the
                 merges are SentencePieceExtractor's: for every piece, each split into two
                 in-vocabulary pieces is a merge (a piece's splits ordered by the ids of their
                 halves), all ranked by the merged piece's score, highest first, ties by longer
                 left then longer right half (a stable sort: then by piece id). As in the
                 converter, pieces 0-2 (pad, eos, bos) score 0.0.
  normalizer     Replace(" ", "▁"); no pre-tokenizer
  decoder        Sequence[Replace("▁", " "), ByteFallback, Fuse]
  added tokens   control (type 3) and user-defined (type 4) pieces in id order, normalized=False,
                 special for control pieces and <start_of_turn>/<end_of_turn>
  post-processor TemplateProcessing adding <bos> (and <eos>) as tokenizer.ggml.add_bos_token
                 (add_eos_token) say.
Gemma 3's vocabulary has its own "\\t" piece, so GemmaConverter's renaming of <0x09> to "\\t"
(for older Gemma vocabularies) does not apply and is refused rather than reproduced.
"""

from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
from tokenizers.models import BPE

CONTROL, USER_DEFINED = 3, 4
SPECIAL_PIECES = {"<start_of_turn>", "<end_of_turn>"}


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def generate_merges(pieces, scores):
    """transformers' generate_merges(vocab, vocab_scores) for pieces in id order."""
    vocab = {piece: i for i, piece in enumerate(pieces)}
    merges = []
    for piece, score in zip(pieces, scores):
        local = [(piece[:i], piece[i:], score) for i in range(1, len(piece))
                 if piece[:i] in vocab and piece[i:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def build(reader):
    """(tokenizer.json text, tokenizer_config dict) for the GGUF's SentencePiece vocabulary."""
    if field(reader, "tokenizer.ggml.model") != "llama":
        raise SystemExit("tokenizer.ggml.model must be llama (SentencePiece) to build a tokenizer")
    pieces = field(reader, "tokenizer.ggml.tokens")
    scores = [float(s) for s in field(reader, "tokenizer.ggml.scores")]
    types = [int(t) for t in field(reader, "tokenizer.ggml.token_type")]
    if len(set(pieces)) != len(pieces) or not len(pieces) == len(scores) == len(types):
        raise SystemExit("tokenizer.ggml.tokens/scores/token_type are inconsistent")
    if "\t" not in pieces:
        raise SystemExit("the vocabulary has no \"\\t\" piece (an older Gemma vocabulary)")
    ids = {name: field(reader, f"tokenizer.ggml.{name}_token_id")
           for name in ("bos", "eos", "unknown", "padding")}
    if pieces[ids["unknown"]] != "<unk>" or any(i is None for i in ids.values()):
        raise SystemExit("expected bos, eos, padding and an <unk> unknown token id")
    scores[:3] = [0.0, 0.0, 0.0]  # GemmaConverter.vocab: pad, eos, bos

    tok = Tokenizer(BPE(vocab={piece: i for i, piece in enumerate(pieces)},
                        merges=generate_merges(pieces, scores), unk_token="<unk>",
                        fuse_unk=True, byte_fallback=True, dropout=None))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    tok.add_tokens([AddedToken(piece, normalized=False,
                               special=kind == CONTROL or piece in SPECIAL_PIECES)
                    for piece, kind in zip(pieces, types) if kind in (CONTROL, USER_DEFINED)])
    bos, eos = pieces[ids["bos"]], pieces[ids["eos"]]
    add_bos = bool(field(reader, "tokenizer.ggml.add_bos_token", False))
    add_eos = bool(field(reader, "tokenizer.ggml.add_eos_token", False))
    if add_bos or add_eos:
        def template(seq, type_id):
            return " ".join(([f"{bos}:{type_id}"] if add_bos else []) + [f"${seq}:{type_id}"]
                            + ([f"{eos}:{type_id}"] if add_eos else []))
        tok.post_processor = processors.TemplateProcessing(
            single=template("A", 0), pair=template("A", 0) + " " + template("B", 1),
            special_tokens=[(t, ids[n]) for t, n, on in ((bos, "bos", add_bos),
                                                          (eos, "eos", add_eos)) if on])

    config = {
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pieces[ids["padding"]],
        "unk_token": "<unk>",
        "clean_up_tokenization_spaces": False,
        "tokenizer_class": "GemmaTokenizer",
    }
    template_text = field(reader, "tokenizer.chat_template")
    if template_text is not None:
        config["chat_template"] = template_text
    return tok.to_str(pretty=True), config
