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

/// What the folder says beyond the pipeline itself.
#[derive(Debug)]
pub(crate) struct HfFiles {
    pub tokenizer: Tokenizer,
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
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

pub(crate) fn read_dir(dir: &Path) -> Result<HfFiles, TokenizerError> {
    let tokenizer_path = dir.join("tokenizer.json");
    if !tokenizer_path.is_file() {
        return Err(hf_error(
            dir,
            "no tokenizer.json (only fast-tokenizer folders are supported)",
        ));
    }
    let tokenizer = Tokenizer::from_file(&tokenizer_path)
        .map_err(|e| hf_error(dir, &format!("tokenizer.json: {e}")))?;
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
