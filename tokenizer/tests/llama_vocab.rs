//! llama.cpp's tokenizer reference vectors: for each `ggml-vocab-NAME.gguf`, the strings
//! in `.inp` must encode to exactly the ids in `.out` (produced by the model's original
//! Hugging Face tokenizer), and those ids must decode back to the string.
//!
//! The files come from `scripts/fetch-data vocab` (the README's test command runs it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::PathBuf;

use sonde_tokenizer::{ChatInputs, ModelTokenizer, TokenizerError};

mod common;

fn vocab_dir() -> PathBuf {
    sonde_testdata::path("vocab")
}

fn vocab_file(name: &str) -> PathBuf {
    let path = vocab_dir().join(format!("ggml-vocab-{name}.gguf"));
    assert!(
        path.is_file(),
        "{} is missing: run `scripts/fetch-data vocab` first",
        path.display()
    );
    path
}

/// The cases of one vocabulary, split exactly as llama.cpp's `test-tokenizer-0` splits them.
fn read_cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let path = vocab_file(name);
    let inp = fs::read_to_string(path.with_extension("gguf.inp")).unwrap();
    let out = fs::read_to_string(path.with_extension("gguf.out")).unwrap();
    let sep = "\n__ggml_vocab_test__\n";
    let mut texts = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(sep) {
            Some(pos) => {
                texts.push(rest[..pos].to_string());
                rest = &rest[pos + sep.len()..];
            }
            None => {
                texts.push(rest.to_string());
                rest = "";
            }
        }
    }
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|line| {
            line.split_whitespace()
                .map(|t| t.parse().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(
        texts.len(),
        ids.len(),
        "{name}: .inp and .out disagree on the number of cases"
    );
    assert!(!texts.is_empty(), "{name}: no cases");
    texts.into_iter().zip(ids).collect()
}

/// How the vocabulary's decoded text relates to the input.
#[derive(Clone, Copy, PartialEq)]
enum Prefix {
    /// Byte-level BPE: tokens hold exactly the input's bytes.
    None,
    /// SentencePiece with `add_space_prefix`: the tokens' bytes start with the added space,
    /// which `decode` strips again.
    Space,
}

fn check_vocab(name: &str, prefix: Prefix) {
    let tokenizer =
        ModelTokenizer::from_gguf_file(&vocab_file(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let cases = read_cases(name);
    let mut failures = Vec::new();
    for (text, expected) in &cases {
        let got = tokenizer.encode(text, false).unwrap();
        if &got != expected {
            failures.push(format!(
                "encode {text:?}\n   expected {expected:?}\n   got      {got:?}"
            ));
            continue;
        }
        let decoded = tokenizer.decode(expected, false).unwrap();
        if &decoded != text {
            failures.push(format!(
                "decode {expected:?}\n   expected {text:?}\n   got      {decoded:?}"
            ));
        }
        let bytes = common::concat_token_bytes(&tokenizer, expected);
        let want = match prefix {
            Prefix::Space if !text.is_empty() => format!(" {text}"),
            _ => text.clone(),
        };
        if bytes != want.as_bytes() {
            failures.push(format!(
                "token bytes of {text:?}: got {:?}",
                String::from_utf8_lossy(&bytes)
            ));
        }
        // Streamed token by token, the text comes out whole: no chunk ends inside a
        // character, so none carries U+FFFD (the inputs hold none).
        let mut stream = tokenizer.stream_decoder();
        let mut chunks: Vec<String> = expected
            .iter()
            .map(|&id| stream.push(tokenizer.token_bytes(id).unwrap()))
            .collect();
        chunks.push(stream.finish());
        if chunks.concat() != want || chunks.iter().any(|c| c.contains('\u{FFFD}')) {
            failures.push(format!("streaming {text:?}: got {chunks:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

macro_rules! vocab_tests {
    ($($test:ident => $name:literal, $prefix:expr;)*) => {
        $(
            #[test]
            fn $test() {
                check_vocab($name, $prefix);
            }
        )*
    };
}

vocab_tests! {
    gpt_2 => "gpt-2", Prefix::None;
    qwen2 => "qwen2", Prefix::None;
    qwen35 => "qwen35", Prefix::None;
    starcoder => "starcoder", Prefix::None;
    refact => "refact", Prefix::None;
    llama_bpe => "llama-bpe", Prefix::None;
    llama_spm => "llama-spm", Prefix::Space;
    phi_3 => "phi-3", Prefix::Space;
    deepseek_llm => "deepseek-llm", Prefix::None;
    deepseek_coder => "deepseek-coder", Prefix::None;
    falcon => "falcon", Prefix::None;
    mpt => "mpt", Prefix::None;
    command_r => "command-r", Prefix::None;
    gemma_4 => "gemma-4", Prefix::None;
}

/// A SentencePiece pipeline saved as `tokenizer.json` and read back as a Hugging Face
/// folder keeps its ids, its decoding and its byte table (`▁`, `<0xAB>` tokens).
#[test]
fn llama_spm_survives_a_round_trip_through_tokenizer_json() {
    let from_gguf = ModelTokenizer::from_gguf_file(&vocab_file("llama-spm")).unwrap();
    let dir = std::env::temp_dir().join(format!("sonde-spm-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    from_gguf
        .inner()
        .save(dir.join("tokenizer.json"), false)
        .unwrap();
    fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": "<s>", "eos_token": "</s>"}"#,
    )
    .unwrap();
    let from_hf = ModelTokenizer::from_hf_dir(&dir).unwrap();
    fs::remove_dir_all(&dir).unwrap();
    for (text, expected) in read_cases("llama-spm") {
        assert_eq!(from_hf.encode(&text, false).unwrap(), expected, "{text:?}");
        assert_eq!(from_hf.decode(&expected, false).unwrap(), text);
    }
    for id in 0..from_gguf.vocab_size() as u32 {
        assert_eq!(
            from_hf.token_bytes(id),
            from_gguf.token_bytes(id),
            "token {id}"
        );
    }
    assert_eq!(from_hf.special_tokens(), from_gguf.special_tokens());
    assert_eq!(
        from_hf.encode("Hi", true).unwrap()[0],
        1,
        "BOS from the post-processor"
    );
}

#[test]
fn gguf_without_pre_tokenizer_is_refused_with_the_supported_list() {
    // gpt-neox's vocab file predates `tokenizer.ggml.pre`; guessing a split is how a
    // server silently serves wrong tokens.
    let err = ModelTokenizer::from_gguf_file(&vocab_file("gpt-neox")).unwrap_err();
    assert!(
        matches!(err, TokenizerError::UnsupportedPreTokenizer { .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("tokenizer.ggml.pre") && msg.contains("smollm"),
        "{msg}"
    );
}

#[test]
fn unsupported_tokenizer_models_are_named() {
    for (name, model) in [("bert-bge", "bert"), ("nomic-bert-moe", "t5")] {
        let err = ModelTokenizer::from_gguf_file(&vocab_file(name)).unwrap_err();
        assert!(
            matches!(err, TokenizerError::UnsupportedModel { .. }),
            "{err}"
        );
        assert!(err.to_string().contains(&format!("`{model}`")), "{err}");
    }
    let err = ModelTokenizer::from_gguf_file(&vocab_file("aquila")).unwrap_err();
    assert!(
        matches!(err, TokenizerError::UnsupportedPreTokenizer { .. }),
        "{err}"
    );
}

/// Baichuan's vocabulary has no reference ids; it must at least give back every string.
#[test]
fn baichuan_round_trips_the_reference_strings() {
    let tokenizer = ModelTokenizer::from_gguf_file(&vocab_file("baichuan")).unwrap();
    for (text, _) in read_cases("llama-spm") {
        let ids = tokenizer.encode(&text, false).unwrap();
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), text, "{ids:?}");
    }
}

/// Every chat template these vocabularies ship compiles and renders a conversation.
#[test]
fn shipped_chat_templates_render() {
    let messages = [
        serde_json::json!({"role": "system", "content": "Be brief."}),
        serde_json::json!({"role": "user", "content": "Hi"}),
        serde_json::json!({"role": "assistant", "content": "Hello!"}),
        serde_json::json!({"role": "user", "content": "Capital of France?"}),
    ];
    let inputs = ChatInputs {
        messages: &messages,
        add_generation_prompt: true,
        tools: None,
    };
    for name in ["phi-3", "qwen2", "gemma-4"] {
        let tokenizer = ModelTokenizer::from_gguf_file(&vocab_file(name)).unwrap();
        let prompt = tokenizer
            .apply_chat_template(&inputs)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        // (Phi-3's template drops system messages, so only the turns are checked.)
        assert!(
            prompt.contains("Hello!") && prompt.contains("Capital of France?"),
            "{name}: {prompt}"
        );
        // The rendered special tokens come back as single special ids.
        let ids = tokenizer.encode(&prompt, false).unwrap();
        assert!(
            ids.iter().any(|&id| tokenizer.is_special(id)),
            "{name}: {prompt}"
        );
    }
}

/// Random text mixing scripts, emoji, combining marks, digits, control characters and
/// whitespace comes back byte for byte from every supported vocabulary (byte-level BPE
/// and byte fallback cover every byte), and its token spans stay inside the text.
#[test]
fn random_text_round_trips_in_every_vocabulary() {
    const POOL: &[&str] = &[
        "a",
        "Z",
        "é",
        "e\u{301}",
        "ß",
        "ж",
        "λ",
        "א",
        "ع",
        "क",
        "ि",
        "ก",
        "我",
        "天",
        "한",
        "ア",
        "😁",
        "🦀",
        "👩‍💻",
        "1",
        "7",
        "٣",
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "\u{a0}",
        "\u{3000}",
        "'s",
        "'LL",
        "!",
        "...",
        "$",
        "<",
        ">",
        "_",
        "\u{0}",
        "\u{7f}",
        "\u{feff}",
        "<s>",
        "▁",
    ];
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let texts: Vec<String> = (0..200)
        .map(|_| {
            let len = (next() % 24) as usize;
            (0..len)
                .map(|_| POOL[(next() % POOL.len() as u64) as usize])
                .collect()
        })
        .collect();
    for name in [
        "gpt-2",
        "qwen2",
        "starcoder",
        "llama-bpe",
        "llama-spm",
        "phi-3",
        "deepseek-llm",
        "deepseek-coder",
        "falcon",
        "mpt",
        "command-r",
        "gemma-4",
    ] {
        let tokenizer = ModelTokenizer::from_gguf_file(&vocab_file(name)).unwrap();
        // SentencePiece writes spaces as '▁', so a literal '▁' decodes as a space there;
        // and text after a special token written in the input gets the word-start space
        // (llama.cpp and Hugging Face's Llama tokenizers do both the same way).
        let sentencepiece = ["llama-spm", "phi-3", "gemma-4"].contains(&name);
        let lossy = |t: &&String| sentencepiece && (t.contains('▁') || t.contains("<s>"));
        for text in texts.iter().filter(|t| !lossy(t)) {
            let ids = tokenizer.encode(text, false).unwrap();
            let decoded = tokenizer.decode(&ids, false).unwrap();
            assert_eq!(&decoded, text, "{name}: {ids:?}");
            for span in tokenizer.encode_with_offsets(text, true).unwrap() {
                assert!(
                    span.start <= span.stop && span.stop <= text.len(),
                    "{name}: {span:?}"
                );
            }
        }
    }
}
