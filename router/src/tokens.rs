//! The tokenizer's routes: TGI's `/tokenize`, and vLLM's remote-tokenizer contract
//! (`/tokenize` with `prompt`, `/detokenize`, `/tokenizer_info`), which
//! lm-evaluation-harness calls with `tokenizer_backend=remote` so that the tokens it scores
//! are the server's own.

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use sonde_tokenizer::ModelTokenizer;
use utoipa::ToSchema;

use crate::error::{ApiError, ErrorBody};
use crate::invalid;
use crate::json::ApiJson;
use crate::state::{AppState, Ready};

/// TGI's `{inputs}` or vLLM's `{prompt, add_special_tokens}`; the answer has the shape
/// of the API asked.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    /// TGI: the text; answered with each token and the span of text it covers.
    pub inputs: Option<String>,
    /// vLLM: the text; answered with `{count, max_model_len, tokens}`.
    pub prompt: Option<String>,
    /// vLLM: add the model's BOS/EOS as it does for a prompt (default true; TGI's
    /// `inputs` always are).
    pub add_special_tokens: Option<bool>,
    /// Accepted for vLLM clients; one model is served.
    pub model: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SimpleToken {
    pub id: u32,
    /// The piece of `inputs` the token covers.
    pub text: String,
    /// Byte offsets into `inputs`.
    pub start: usize,
    pub stop: usize,
}

/// vLLM's answer to `/tokenize`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenizeResponse {
    pub count: usize,
    /// Prompt + generated tokens at most (`--max-total-tokens`).
    pub max_model_len: u32,
    pub tokens: Vec<u32>,
}

/// `/tokenize`'s answer: TGI's list for `inputs`, vLLM's object for `prompt`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum TokenizeAnswer {
    Tgi(Vec<SimpleToken>),
    Vllm(TokenizeResponse),
}

/// The prompt's tokens as serving sees them (special tokens written in the text match).
#[utoipa::path(post, path = "/tokenize", tag = "Ops", request_body = TokenizeRequest,
    responses((status = 200, body = TokenizeAnswer,
               description = "`inputs`: a list of SimpleToken; `prompt`: a TokenizeResponse")))]
pub async fn tokenize(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<TokenizeRequest>,
) -> Result<Json<TokenizeAnswer>, ApiError> {
    let ready = state.ready()?;
    match (req.inputs, req.prompt) {
        (Some(inputs), None) => {
            if req.add_special_tokens.is_some() {
                return Err(invalid!(
                    "`add_special_tokens` goes with `prompt` (vLLM's /tokenize); `inputs` is TGI's"
                ));
            }
            Ok(Json(TokenizeAnswer::Tgi(tgi_tokens(ready, inputs).await?)))
        }
        (None, Some(prompt)) => {
            let add_special_tokens = req.add_special_tokens.unwrap_or(true);
            let tokens = ready.validator.tokenize(prompt, add_special_tokens).await;
            let tokens = tokens.map_err(|e| e.in_words(&PromptNames))?;
            let max_model_len = ready.validator.limits().max_total_tokens;
            let answer = TokenizeResponse {
                count: tokens.len(),
                max_model_len,
                tokens,
            };
            Ok(Json(TokenizeAnswer::Vllm(answer)))
        }
        _ => Err(invalid!(
            "give exactly one of `inputs` (TGI's /tokenize) or `prompt` (vLLM's)"
        )),
    }
}

/// vLLM's `/tokenize` calls its text `prompt`.
struct PromptNames;

impl crate::request::FieldNames for PromptNames {
    fn name(&self, field: crate::request::Field) -> Option<&'static str> {
        (field == crate::request::Field::Prompt).then_some("prompt")
    }
}

async fn tgi_tokens(ready: &Ready, inputs: String) -> Result<Vec<SimpleToken>, ApiError> {
    let tokenizer = ready.validator.tokenizer().clone();
    tokio::task::spawn_blocking(move || {
        let spans = tokenizer.encode_with_offsets(&inputs, true)?;
        Ok::<_, sonde_tokenizer::TokenizerError>(
            spans
                .into_iter()
                .map(|s| SimpleToken {
                    id: s.id,
                    text: inputs.get(s.start..s.stop).unwrap_or_default().to_string(),
                    start: s.start,
                    stop: s.stop,
                })
                .collect(),
        )
    })
    .await
    .map_err(|e| ApiError::Internal(format!("tokenizer task failed: {e}")))?
    .map_err(|e| invalid!("`inputs` could not be tokenized: {e}"))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    pub tokens: Vec<i64>,
    /// Accepted for vLLM clients; one model is served.
    pub model: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DetokenizeResponse {
    /// The text of `tokens`, special tokens included, as the model's decoder writes it.
    pub prompt: String,
}

/// vLLM's `/detokenize`: the text of token ids.
#[utoipa::path(post, path = "/detokenize", tag = "Ops", request_body = DetokenizeRequest,
    responses((status = 200, body = DetokenizeResponse)))]
pub async fn detokenize(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<DetokenizeRequest>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let tokenizer = state.ready()?.validator.tokenizer();
    let vocab = tokenizer.vocab_size();
    let ids = req
        .tokens
        .iter()
        .map(|&id| {
            u32::try_from(id)
                .ok()
                .filter(|&i| (i as usize) < vocab)
                .ok_or_else(|| invalid!("`tokens` holds {id}, outside the vocabulary (0..{vocab})"))
        })
        .collect::<Result<Vec<u32>, _>>()?;
    let prompt = tokenizer
        .decode(&ids, false)
        .map_err(|e| ApiError::Internal(format!("decoding tokens: {e}")))?;
    Ok(Json(DetokenizeResponse { prompt }))
}

/// What a remote-tokenizer client needs to tokenize and template as the server does.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenizerInfo {
    pub tokenizer_class: String,
    pub bos_token: Option<String>,
    /// The first of the model's end-of-sequence tokens.
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    /// Whether the model's prompts start with `bos_token` (`add_special_tokens`).
    pub add_bos_token: bool,
    /// The model's chat template (Jinja), as `/v1/chat/completions` renders it.
    pub chat_template: Option<String>,
    /// Prompt + generated tokens at most (`--max-total-tokens`).
    pub model_max_length: u32,
    pub vocab_size: usize,
}

/// vLLM's `/tokenizer_info`.
#[utoipa::path(get, path = "/tokenizer_info", tag = "Ops",
    responses((status = 200, body = TokenizerInfo), (status = 503, body = ErrorBody)))]
pub async fn tokenizer_info(
    State(state): State<AppState>,
) -> Result<Json<TokenizerInfo>, ApiError> {
    let ready = state.ready()?;
    let tokenizer: &ModelTokenizer = ready.validator.tokenizer();
    let special = tokenizer.special_tokens();
    let text = |id: Option<u32>| id.and_then(|id| tokenizer.token_text(id));
    Ok(Json(TokenizerInfo {
        tokenizer_class: "sonde".to_string(),
        bos_token: text(special.bos),
        eos_token: text(special.eos.first().copied()),
        pad_token: None,
        add_bos_token: special.add_bos,
        chat_template: tokenizer
            .chat_template()
            .ok()
            .map(|t| t.source().to_string()),
        model_max_length: ready.validator.limits().max_total_tokens,
        vocab_size: tokenizer.vocab_size(),
    }))
}
