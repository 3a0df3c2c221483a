//! Reading a Hugging Face model folder: `tokenizer.json` (the pipeline), and, when
//! present, `tokenizer_config.json` (chat template, BOS/EOS strings),
//! `chat_template.jinja` (newer transformers keep the template there) and `config.json`
//! (BOS/EOS ids).

use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value as Json;
use tokenizers::Tokenizer;

use crate::error::TokenizerError;
use crate::model_tokenizer::{SpecialTokens, TokenizerParts};
use crate::token_bytes::VocabEncoding;

/// Everything a `ModelTokenizer` needs, from a Hugging Face folder.
pub(crate) fn parts(dir: &Path) -> Result<TokenizerParts, TokenizerError> {
    let files = read_dir(dir)?;
    let tokenizer = files.tokenizer;
    let size = tokenizer.get_vocab_size(true);
    let added = tokenizer.get_added_tokens_decoder();
    let mut special = vec![false; size];
    for (id, token) in &added {
        if let Some(slot) = special.get_mut(*id as usize) {
            *slot = token.special;
        }
    }
    let encoding = vocab_encoding(&tokenizer);
    let token_bytes = (0..size as u32)
        .map(|id| {
            if let Some(token) = added.get(&id) {
                return token.content.as_bytes().to_vec();
            }
            match (encoding, tokenizer.id_to_token(id)) {
                (Some(enc), Some(token)) => enc.token_bytes(&token),
                // An unfamiliar decoder (WordPiece, …): ask it about the token alone.
                _ => tokenizer
                    .decode(&[id], false)
                    .unwrap_or_default()
                    .into_bytes(),
            }
        })
        .collect();
    let id_of = |text: &Option<String>| text.as_deref().and_then(|t| tokenizer.token_to_id(t));
    let bos = id_of(&files.bos_token).or(files.bos_token_id);
    let mut eos: Vec<u32> = id_of(&files.eos_token).into_iter().collect();
    for id in files.eos_token_ids {
        if !eos.contains(&id) {
            eos.push(id);
        }
    }
    // The post-processor decides what `add_special_tokens` adds; ask it.
    let add_bos = bos.is_some()
        && tokenizer
            .encode("a", true)
            .is_ok_and(|e| e.get_ids().first().copied() == bos);
    let text_of = |id: Option<u32>, text: Option<String>| {
        text.or_else(|| id.and_then(|id| tokenizer.id_to_token(id)))
            .unwrap_or_default()
    };
    Ok(TokenizerParts {
        gguf: None,
        bos_text: text_of(bos, files.bos_token),
        eos_text: text_of(eos.first().copied(), files.eos_token),
        token_bytes,
        special,
        special_tokens: SpecialTokens { bos, eos, add_bos },
        chat_template: files.chat_template,
        tokenizer,
    })
}

/// Which byte encoding the vocabulary of a pipeline uses, told by its decoder
/// (serialised, since `tokenizers` does not expose a `Sequence` decoder's steps).
fn vocab_encoding(tokenizer: &Tokenizer) -> Option<VocabEncoding> {
    let decoder = serde_json::to_value(tokenizer.get_decoder()?)
        .ok()?
        .to_string();
    if decoder.contains("\"ByteLevel\"") {
        Some(VocabEncoding::ByteLevel)
    } else if decoder.contains("\"ByteFallback\"") || decoder.contains("\"Metaspace\"") {
        Some(VocabEncoding::SentencePiece)
    } else {
        None
    }
}

/// What the folder's files say.
struct HfFiles {
    tokenizer: Tokenizer,
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    bos_token_id: Option<u32>,
    eos_token_ids: Vec<u32>,
}

#[derive(Deserialize, Default)]
struct TokenizerConfig {
    #[serde(default)]
    chat_template: Option<Json>,
    #[serde(default)]
    bos_token: Option<Json>,
    #[serde(default)]
    eos_token: Option<Json>,
}

#[derive(Deserialize, Default)]
struct ModelConfig {
    #[serde(default)]
    bos_token_id: Option<Json>,
    #[serde(default)]
    eos_token_id: Option<Json>,
}

fn read_dir(dir: &Path) -> Result<HfFiles, TokenizerError> {
    let tokenizer_path = dir.join("tokenizer.json");
    if !tokenizer_path.is_file() {
        return Err(hf_error(
            dir,
            "no tokenizer.json (only fast-tokenizer folders are supported)",
        ));
    }
    let mut tokenizer = Tokenizer::from_file(&tokenizer_path)
        .map_err(|e| hf_error(dir, &format!("tokenizer.json: {e}")))?;
    // Some tokenizer.json files carry the truncation/padding of a training run (e.g.
    // 512 tokens); applied here they would silently cut prompts. Limits are the router's.
    tokenizer
        .with_truncation(None)
        .map_err(|e| hf_error(dir, &format!("tokenizer.json: {e}")))?;
    tokenizer.with_padding(None);
    let config: TokenizerConfig = read_json(dir, "tokenizer_config.json")?.unwrap_or_default();
    let model: ModelConfig = read_json(dir, "config.json")?.unwrap_or_default();

    let chat_template = match config.chat_template.as_ref().map(template_from_config) {
        Some(Some(t)) => Some(t),
        Some(None) => {
            return Err(hf_error(
                dir,
                "tokenizer_config.json: chat_template has an unknown shape",
            ))
        }
        None => read_optional(&dir.join("chat_template.jinja"))?,
    };
    let eos_token_ids = match &model.eos_token_id {
        Some(Json::Array(ids)) => ids.iter().filter_map(json_id).collect(),
        Some(id) => json_id(id).into_iter().collect(),
        None => Vec::new(),
    };
    Ok(HfFiles {
        tokenizer,
        chat_template,
        bos_token: config.bos_token.as_ref().and_then(token_content),
        eos_token: config.eos_token.as_ref().and_then(token_content),
        bos_token_id: model.bos_token_id.as_ref().and_then(json_id),
        eos_token_ids,
    })
}

/// `"chat_template"` is a string, or a list of `{"name", "template"}` of which the one
/// named `default` is the chat template.
fn template_from_config(value: &Json) -> Option<String> {
    match value {
        Json::String(s) => Some(s.clone()),
        Json::Array(items) => items
            .iter()
            .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Json::as_str)
            .map(str::to_string),
        _ => None,
    }
}

/// A special token is written as its text or as an `AddedToken` object.
fn token_content(value: &Json) -> Option<String> {
    match value {
        Json::String(s) => Some(s.clone()),
        Json::Object(map) => map
            .get("content")
            .and_then(Json::as_str)
            .map(str::to_string),
        _ => None,
    }
}

fn json_id(value: &Json) -> Option<u32> {
    value.as_u64().and_then(|id| u32::try_from(id).ok())
}

fn read_json<T: for<'de> Deserialize<'de>>(
    dir: &Path,
    name: &str,
) -> Result<Option<T>, TokenizerError> {
    let Some(text) = read_optional(&dir.join(name))? else {
        return Ok(None);
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| hf_error(dir, &format!("{name}: {e}")))
}

fn read_optional(path: &PathBuf) -> Result<Option<String>, TokenizerError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TokenizerError::Io {
            path: path.clone(),
            source,
        }),
    }
}

fn hf_error(dir: &Path, problem: &str) -> TokenizerError {
    TokenizerError::HfFiles {
        dir: dir.to_path_buf(),
        problem: problem.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_template_shapes() {
        assert_eq!(template_from_config(&json!("x")), Some("x".into()));
        let list =
            json!([{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d"}]);
        assert_eq!(template_from_config(&list), Some("d".into()));
        assert_eq!(template_from_config(&json!(3)), None);
    }

    #[test]
    fn special_token_as_string_or_object() {
        assert_eq!(token_content(&json!("<s>")), Some("<s>".into()));
        assert_eq!(
            token_content(&json!({"content": "</s>", "lstrip": false})),
            Some("</s>".into())
        );
    }
}
