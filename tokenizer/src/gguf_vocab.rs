//! The tokenizer fields of GGUF metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`),
//! read once into plain typed data.

use crate::error::TokenizerError;
use crate::gguf::{GgufMetadata, Value};

/// llama.cpp's `llama_token_type` values (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    Normal,
    Unknown,
    /// Special tokens such as `<s>` or `<|im_end|>`.
    Control,
    /// Added tokens matched verbatim in text but not special (e.g. runs of spaces).
    UserDefined,
    Unused,
    /// `<0xAB>`: one raw byte (SentencePiece byte fallback).
    Byte,
}

impl TokenType {
    fn from_code(code: i64) -> Self {
        match code {
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            // 1 is normal; llama.cpp also treats 0 (undefined) as normal.
            _ => TokenType::Normal,
        }
    }
}

#[derive(Debug, Clone)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `gpt2`, `llama`, …
    pub model: String,
    /// `tokenizer.ggml.pre`, when present.
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub types: Vec<TokenType>,
    /// SentencePiece scores; empty when the file has none.
    pub scores: Vec<f32>,
    /// BPE merges as `(left, right)`.
    pub merges: Vec<(String, String)>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// End-of-turn token (e.g. Llama 3's `<|eot_id|>`), a second way to stop.
    pub eot: Option<u32>,
    pub unk: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    pub chat_template: Option<String>,
}

impl GgufVocab {
    pub fn from_metadata(meta: &GgufMetadata) -> Result<Self, TokenizerError> {
        let model = meta
            .get_str("tokenizer.ggml.model")
            .ok_or_else(|| missing("tokenizer.ggml.model"))?
            .to_string();
        let tokens = string_array(meta, "tokenizer.ggml.tokens")?
            .ok_or_else(|| missing("tokenizer.ggml.tokens"))?;
        let n = tokens.len();
        let types = match meta.get_array("tokenizer.ggml.token_type") {
            Some(items) => {
                check_len("tokenizer.ggml.token_type", items.len(), n)?;
                items
                    .iter()
                    .map(|v| v.as_i64().map(TokenType::from_code))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| wrong_type("tokenizer.ggml.token_type", "integers"))?
            }
            None => vec![TokenType::Normal; n],
        };
        let scores = match meta.get_array("tokenizer.ggml.scores") {
            Some(items) => {
                check_len("tokenizer.ggml.scores", items.len(), n)?;
                items
                    .iter()
                    .map(Value::as_f32)
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| wrong_type("tokenizer.ggml.scores", "floats"))?
            }
            None => Vec::new(),
        };
        let merges = string_array(meta, "tokenizer.ggml.merges")?
            .unwrap_or_default()
            .iter()
            .map(|m| split_merge(m))
            .collect::<Result<Vec<_>, _>>()?;
        let token_id = |key: &str| -> Result<Option<u32>, TokenizerError> {
            let Some(value) = meta.get(key) else {
                return Ok(None);
            };
            // Some converters write -1, or another id outside the vocabulary, for "none";
            // a u64 too large for i64 is such an id too.
            let id = value
                .as_i64()
                .or_else(|| value.as_u64().map(|_| i64::MAX))
                .ok_or_else(|| wrong_type(key, "an integer"))?;
            Ok(u32::try_from(id).ok().filter(|&id| (id as usize) < n))
        };
        Ok(Self {
            model,
            pre: meta.get_str("tokenizer.ggml.pre").map(str::to_string),
            bos: token_id("tokenizer.ggml.bos_token_id")?,
            eos: token_id("tokenizer.ggml.eos_token_id")?,
            eot: token_id("tokenizer.ggml.eot_token_id")?,
            unk: token_id("tokenizer.ggml.unknown_token_id")?,
            add_bos: meta.get_bool("tokenizer.ggml.add_bos_token"),
            add_eos: meta.get_bool("tokenizer.ggml.add_eos_token"),
            add_space_prefix: meta.get_bool("tokenizer.ggml.add_space_prefix"),
            chat_template: meta.get_str("tokenizer.chat_template").map(str::to_string),
            tokens,
            types,
            scores,
            merges,
        })
    }
}

fn string_array(meta: &GgufMetadata, key: &str) -> Result<Option<Vec<String>>, TokenizerError> {
    let Some(items) = meta.get_array(key) else {
        return Ok(None);
    };
    items
        .iter()
        .map(|v| v.as_str().map(str::to_string))
        .collect::<Option<Vec<_>>>()
        .map(Some)
        .ok_or_else(|| wrong_type(key, "strings"))
}

/// A merge is stored as `"left right"`. The separator is the first space after the first
/// byte, as llama.cpp reads it, so a merge whose left part is itself a space still parses.
fn split_merge(merge: &str) -> Result<(String, String), TokenizerError> {
    merge
        .char_indices()
        .skip(1)
        .find(|&(_, c)| c == ' ')
        .map(|(pos, _)| (merge[..pos].to_string(), merge[pos + 1..].to_string()))
        .ok_or_else(|| TokenizerError::Metadata {
            key: "tokenizer.ggml.merges".into(),
            problem: format!("merge {merge:?} has no space between its two parts"),
        })
}

fn check_len(key: &str, got: usize, want: usize) -> Result<(), TokenizerError> {
    if got == want {
        return Ok(());
    }
    Err(TokenizerError::Metadata {
        key: key.into(),
        problem: format!("has {got} entries but tokenizer.ggml.tokens has {want}"),
    })
}

fn missing(key: &str) -> TokenizerError {
    TokenizerError::Metadata {
        key: key.into(),
        problem: "missing; the file carries no tokenizer".into(),
    }
}

fn wrong_type(key: &str, want: &str) -> TokenizerError {
    TokenizerError::Metadata {
        key: key.into(),
        problem: format!("expected {want}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(entries: Vec<(&str, Value)>) -> GgufMetadata {
        let mut meta = GgufMetadata::default();
        meta.kv
            .insert("tokenizer.ggml.model".into(), Value::String("gpt2".into()));
        let tokens = ["a", "b"].map(|t| Value::String(t.into())).to_vec();
        meta.kv
            .insert("tokenizer.ggml.tokens".into(), Value::Array(tokens));
        for (key, value) in entries {
            meta.kv.insert(key.into(), value);
        }
        meta
    }

    #[test]
    fn token_ids_of_none_are_absent_not_errors() {
        let meta = metadata(vec![
            ("tokenizer.ggml.bos_token_id", Value::I32(-1)),
            ("tokenizer.ggml.eos_token_id", Value::U32(7)),
            ("tokenizer.ggml.unknown_token_id", Value::U64(u64::MAX)),
            ("tokenizer.ggml.eot_token_id", Value::U32(1)),
        ]);
        let vocab = GgufVocab::from_metadata(&meta).unwrap();
        assert_eq!(
            (vocab.bos, vocab.eos, vocab.unk, vocab.eot),
            (None, None, None, Some(1))
        );
    }

    #[test]
    fn mismatched_array_lengths_and_types_are_named() {
        let short = metadata(vec![(
            "tokenizer.ggml.token_type",
            Value::Array(vec![Value::I32(1)]),
        )]);
        let err = GgufVocab::from_metadata(&short).unwrap_err().to_string();
        assert!(
            err.contains("token_type") && err.contains("has 1 entries"),
            "{err}"
        );
        let wrong = metadata(vec![(
            "tokenizer.ggml.bos_token_id",
            Value::String("1".into()),
        )]);
        let err = GgufVocab::from_metadata(&wrong).unwrap_err().to_string();
        assert!(
            err.contains("bos_token_id") && err.contains("integer"),
            "{err}"
        );
        let mut none = metadata(vec![]);
        none.kv.remove("tokenizer.ggml.tokens");
        let err = GgufVocab::from_metadata(&none).unwrap_err().to_string();
        assert!(
            err.contains("tokenizer.ggml.tokens") && err.contains("missing"),
            "{err}"
        );
    }

    #[test]
    fn merges_split_at_the_first_space_after_the_first_char() {
        assert_eq!(split_merge("Ġ t").unwrap(), ("Ġ".into(), "t".into()));
        assert_eq!(split_merge("  x").unwrap(), (" ".into(), "x".into()));
        assert!(split_merge("ab").is_err());
    }
}
