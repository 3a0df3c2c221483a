//! TGI's wire types (`/generate`, `/generate_stream`, `/`, Vertex `inputs` instances),
//! with Sonde's additive score fields.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use sonde_proto::LogprobsMode;

use crate::infer::FinishReason;

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GenerateRequest {
    #[schema(example = "What is Deep Learning?")]
    pub inputs: String,
    #[serde(default)]
    pub parameters: GenerateParameters,
    /// Only read by the `/` compat route: true streams Server-Sent Events.
    #[serde(default)]
    pub stream: bool,
}

/// Integers are read wide and checked by validation, so an out-of-range value gets a
/// sentence naming the field and the limit instead of a type error.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GenerateParameters {
    /// Generated tokens at most; 0 only with `decoder_input_details` (pure scoring).
    pub max_new_tokens: Option<i64>,
    #[serde(default)]
    pub do_sample: bool,
    pub temperature: Option<f64>,
    pub top_k: Option<i64>,
    pub top_p: Option<f64>,
    pub typical_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub seed: Option<u64>,
    #[serde(default)]
    pub stop: Vec<String>,
    pub truncate: Option<i64>,
    #[serde(default)]
    pub return_full_text: bool,
    #[serde(default)]
    pub details: bool,
    #[serde(default)]
    pub decoder_input_details: bool,
    pub top_n_tokens: Option<i64>,
    pub best_of: Option<i64>,
    /// Sonde: `raw` (the model's distribution) or `processed` (what was sampled from).
    #[schema(value_type = Option<String>, pattern = "^(raw|processed)$")]
    pub logprobs_mode: Option<LogprobsMode>,
    /// Sonde: attach `logit` and `rank` to every token.
    #[serde(default)]
    pub return_logits: bool,
    /// Sonde: report these ids' logprobs at every step (and prompt position).
    #[serde(default)]
    pub logprob_token_ids: Vec<i64>,
    /// Accepted for TGI clients that always send them; no effect.
    #[serde(default)]
    pub watermark: bool,
    /// Accepted for TGI clients that always send it; must be null.
    pub grammar: Option<serde_json::Value>,
    pub adapter_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LabelLogprob {
    pub id: u32,
    pub text: String,
    pub logprob: f32,
}

/// A generated token with its scores.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Token {
    pub id: u32,
    pub text: String,
    /// Log-probability; a token outside the sampler's support in processed mode reports
    /// the floor -9999.0 (JSON has no -inf).
    pub logprob: f32,
    pub special: bool,
    #[serde(flatten)]
    pub extra: ExtraScores,
}

/// A prompt token; `logprob` is null for the first one.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PrefillToken {
    pub id: u32,
    pub text: String,
    pub logprob: Option<f32>,
    #[serde(flatten)]
    pub extra: ExtraScores,
}

/// The scores a token has beyond its logprob, when the request asked for them.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ExtraScores {
    /// The raw logit (`return_logits`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logit: Option<f32>,
    /// 1-based rank in the vocabulary (`return_logits`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// The labels' logprobs (`logprob_token_ids`), in the order asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label_logprobs: Option<Vec<LabelLogprob>>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TopToken {
    pub id: u32,
    pub text: String,
    pub logprob: f32,
    pub special: bool,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BestOfSequence {
    pub generated_text: String,
    pub finish_reason: FinishReason,
    pub generated_tokens: u32,
    pub seed: Option<u64>,
    pub prefill: Vec<PrefillToken>,
    pub tokens: Vec<Token>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top_tokens: Vec<Vec<TopToken>>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Details {
    pub finish_reason: FinishReason,
    pub generated_tokens: u32,
    pub seed: Option<u64>,
    pub input_length: u32,
    pub prefill: Vec<PrefillToken>,
    pub tokens: Vec<Token>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top_tokens: Vec<Vec<TopToken>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_of_sequences: Option<Vec<BestOfSequence>>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct GenerateResponse {
    pub generated_text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Details>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StreamDetails {
    pub finish_reason: FinishReason,
    pub generated_tokens: u32,
    pub seed: Option<u64>,
    pub input_length: u32,
}

/// One Server-Sent Event of `/generate_stream`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StreamResponse {
    pub index: u32,
    pub token: Token,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top_tokens: Vec<TopToken>,
    pub generated_text: Option<String>,
    pub details: Option<StreamDetails>,
}
