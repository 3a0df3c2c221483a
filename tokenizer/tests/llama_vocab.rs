//! llama.cpp's tokenizer reference vectors: for each `ggml-vocab-NAME.gguf`, the strings
//! in `.inp` must encode to exactly the ids in `.out` (produced by the model's original
//! Hugging Face tokenizer), and those ids must decode back to the string.
//!
//! The files come from `scripts/fetch-data vocab` (the README's test command runs it).

use std::fs;
use std::path::PathBuf;

use sonde_tokenizer::{ModelTokenizer, TokenizerError};

fn vocab_dir() -> PathBuf {
    let data = std::env::var_os("SONDE_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data"));
    data.join("vocab")
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
        .map(|line| line.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(texts.len(), ids.len(), "{name}: .inp and .out disagree on the number of cases");
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
    let tokenizer = ModelTokenizer::from_gguf_file(&vocab_file(name))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
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
            failures.push(format!("decode {expected:?}\n   expected {text:?}\n   got      {decoded:?}"));
        }
        let bytes: Vec<u8> = expected
            .iter()
            .flat_map(|&id| tokenizer.token_bytes(id).unwrap().to_vec())
            .collect();
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
}

#[test]
fn gguf_without_pre_tokenizer_is_refused_with_the_supported_list() {
    // gpt-neox's vocab file predates `tokenizer.ggml.pre`; guessing a split is how a
    // server silently serves wrong tokens.
    let err = ModelTokenizer::from_gguf_file(&vocab_file("gpt-neox")).unwrap_err();
    assert!(matches!(err, TokenizerError::UnsupportedPreTokenizer { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("tokenizer.ggml.pre") && msg.contains("smollm"), "{msg}");
}

#[test]
fn unsupported_tokenizer_model_is_named() {
    let err = ModelTokenizer::from_gguf_file(&vocab_file("bert-bge")).unwrap_err();
    assert!(matches!(err, TokenizerError::UnsupportedModel { .. }), "{err}");
    assert!(err.to_string().contains("`bert`"), "{err}");
}
