#!/usr/bin/env python3
"""Independent reference for the SmolLM2 GGUF tokenizer and chat template.

Reads the GGUF with the `gguf` package (not Sonde's reader), rebuilds SmolLM2's published
Hugging Face tokenizer pipeline (`tokenizer.json` of SmolLM2-135M-Instruct: no normalizer,
Digits(individual) + ByteLevel pre-tokenizer, BPE without byte fallback, ByteLevel decoder,
its 17 special tokens) in the Python `tokenizers` package, and renders the chat template
with Jinja2 configured as transformers' `apply_chat_template` does. Writes the ids of
llama.cpp's starcoder test strings (SmolLM2 shares StarCoder's split), of a rendered
conversation, and the renderings themselves to OUT_DIR/smollm2.json for the Rust tests to
compare, and saves the pipeline as a Hugging Face folder (OUT_DIR/smollm2-hf: tokenizer.json,
tokenizer_config.json, config.json) for the tests of Sonde's Hugging Face loader.

Usage: smollm2_reference.py MODEL.gguf STARCODER.inp OUT_DIR
"""

import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.sandbox
from gguf import GGUFReader
from tokenizers import Tokenizer

CONTROL = 3
CONVERSATION = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
]


def field_strings(reader, key):
    field = reader.fields[key]
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def field_ints(reader, key):
    field = reader.fields[key]
    return [int(field.parts[i][0]) for i in field.data]


def hf_tokenizer(reader):
    tokens = field_strings(reader, "tokenizer.ggml.tokens")
    types = field_ints(reader, "tokenizer.ggml.token_type")
    merges = field_strings(reader, "tokenizer.ggml.merges")
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, (t, ty) in enumerate(zip(tokens, types)) if ty == CONTROL
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, byte_level]},
        "post_processor": None,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": [m.split(" ", 1) for m in merges]},
    }
    return Tokenizer.from_str(json.dumps(spec))


def render(template, add_generation_prompt):
    # transformers: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    return env.from_string(template).render(
        messages=CONVERSATION, add_generation_prompt=add_generation_prompt,
        bos_token="<|im_start|>", eos_token="<|im_end|>")


def write_hf_folder(tok, template, folder):
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    config = {
        "add_prefix_space": False,
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>", "lstrip": False, "normalized": False,
                      "rstrip": False, "single_word": False},
        "chat_template": template,
        "tokenizer_class": "GPT2Tokenizer",
    }
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "bos_token_id": 1,
                   "eos_token_id": 2, "vocab_size": tok.get_vocab_size()}, f, indent=2)


def main(model, inp, out_dir):
    reader = GGUFReader(model)
    tok = hf_tokenizer(reader)
    template = field_strings(reader, "tokenizer.chat_template")[0]
    with open(inp, encoding="utf-8") as f:
        raw = f.read()
    # Split exactly as llama.cpp's test-tokenizer-0 does.
    texts = raw.split("\n__ggml_vocab_test__\n")
    if texts and texts[-1] == "":
        texts.pop()
    chat = render(template, True)
    texts.append(chat)
    cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids,
              "decoded": tok.decode(tok.encode(t, add_special_tokens=False).ids,
                                    skip_special_tokens=False)}
             for t in texts]
    reference = {
        "conversation": CONVERSATION,
        "chat_with_generation_prompt": chat,
        "chat_without_generation_prompt": render(template, False),
        "cases": cases,
    }
    with open(os.path.join(out_dir, "smollm2.json"), "w", encoding="utf-8") as f:
        json.dump(reference, f, ensure_ascii=False, indent=1)
    write_hf_folder(tok, template, os.path.join(out_dir, "smollm2-hf"))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
