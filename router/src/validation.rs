//! Turns wire parameters into a `ValidGenerate`, once, with a sentence per violation that
//! names the field, the value and the limit.

use std::sync::Arc;

use sonde_tokenizer::ModelTokenizer;

use crate::error::ApiError;
use crate::infer::{LogprobsMode, Sampling, ScoreRequest, ValidRequest};
use crate::invalid;
use crate::tgi::types::{GenerateParameters, LogprobsModeParam};

/// Longest stop sequence accepted, in bytes: matching looks back this far after each token.
pub const MAX_STOP_SEQUENCE_BYTES: usize = 1024;

/// The limits a request is checked against, resolved at startup from flags and the shard.
#[derive(Debug, Clone)]
pub struct ValidationLimits {
    pub max_input_tokens: u32,
    pub max_total_tokens: u32,
    pub max_top_n_tokens: u32,
    pub max_best_of: u32,
    pub max_stop_sequences: usize,
    pub max_label_tokens: u32,
    pub enable_prefill_logprobs: bool,
    pub default_logprobs_mode: LogprobsMode,
    /// `max_new_tokens` when the request gives none (capped by what the context leaves).
    pub default_max_new_tokens: u32,
    pub vocab_size: u32,
    /// The shard's KV budget: a request reserving more could never be scheduled.
    pub max_batch_total_tokens: u32,
}

/// A generate request after validation, with what the HTTP layer needs to answer it.
#[derive(Debug, Clone)]
pub struct ValidGenerate {
    pub request: ValidRequest,
    pub stop: Vec<String>,
    pub details: bool,
    pub decoder_input_details: bool,
    pub return_full_text: bool,
    pub best_of: u32,
}

impl ValidGenerate {
    /// Whether any score was asked for (Vertex answers plain text otherwise).
    pub fn wants_scores(&self) -> bool {
        let s = &self.request.scores;
        self.details
            || self.decoder_input_details
            || s.top_n > 0
            || s.return_logits
            || !s.label_ids.is_empty()
    }
}

#[derive(Clone)]
pub struct Validator {
    tokenizer: Arc<ModelTokenizer>,
    limits: ValidationLimits,
}

impl Validator {
    pub fn new(tokenizer: Arc<ModelTokenizer>, limits: ValidationLimits) -> Self {
        Self { tokenizer, limits }
    }

    pub fn limits(&self) -> &ValidationLimits {
        &self.limits
    }

    pub fn tokenizer(&self) -> &Arc<ModelTokenizer> {
        &self.tokenizer
    }

    /// Tokenizes off the async workers: a 2 MB prompt takes long enough to stall them.
    pub async fn tokenize(
        &self,
        text: String,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, ApiError> {
        let tokenizer = self.tokenizer.clone();
        tokio::task::spawn_blocking(move || tokenizer.encode(&text, add_special_tokens))
            .await
            .map_err(|e| ApiError::Internal(format!("tokenizer task failed: {e}")))?
            .map_err(|e| invalid!("`inputs` could not be tokenized: {e}"))
    }

    /// Validates `params` for the prompt `inputs`.
    pub async fn validate(
        &self,
        inputs: String,
        params: &GenerateParameters,
        add_special_tokens: bool,
    ) -> Result<ValidGenerate, ApiError> {
        // Cheap checks first, so a bad parameter is not preceded by tokenizing 2 MB.
        check_parameters(params, &self.limits)?;
        let ids = self.tokenize(inputs, add_special_tokens).await?;
        self.build(ids, params)
    }

    /// Validates `params` for an already tokenized prompt.
    pub fn validate_ids(
        &self,
        ids: Vec<u32>,
        params: &GenerateParameters,
    ) -> Result<ValidGenerate, ApiError> {
        check_parameters(params, &self.limits)?;
        self.build(ids, params)
    }

    /// The checks that need the prompt's tokens, and the request they make.
    fn build(
        &self,
        mut ids: Vec<u32>,
        params: &GenerateParameters,
    ) -> Result<ValidGenerate, ApiError> {
        let l = &self.limits;
        if let Some(truncate) = params.truncate {
            let keep = truncate as usize;
            if ids.len() > keep {
                ids.drain(..ids.len() - keep);
            }
        }
        if ids.is_empty() {
            return Err(invalid!("`inputs` must not be empty: it has 0 tokens"));
        }
        let input_len = ids.len() as u32;
        if input_len > l.max_input_tokens {
            return Err(invalid!(
                "`inputs` must have at most {} tokens (--max-input-tokens). Given: {input_len}; \
                 `truncate` keeps the last N",
                l.max_input_tokens
            ));
        }
        let room = l.max_total_tokens.saturating_sub(input_len);
        let max_new_tokens = match params.max_new_tokens {
            None => {
                let kv_room = l.max_batch_total_tokens.saturating_sub(input_len);
                l.default_max_new_tokens.min(room).min(kv_room)
            }
            Some(n) => n as u32,
        };
        if input_len + max_new_tokens > l.max_total_tokens {
            return Err(invalid!(
                "`inputs` tokens + `max_new_tokens` must be <= {} (--max-total-tokens). Given: {input_len} \
                 `inputs` tokens and {max_new_tokens} `max_new_tokens`",
                l.max_total_tokens
            ));
        }
        if input_len + max_new_tokens > l.max_batch_total_tokens {
            return Err(invalid!(
                "`inputs` tokens + `max_new_tokens` must be <= {} (the shard's --max-batch-total-tokens). \
                 Given: {input_len} + {max_new_tokens}",
                l.max_batch_total_tokens
            ));
        }
        if max_new_tokens == 0 && !params.decoder_input_details {
            return Err(invalid!(
                "`max_new_tokens` is 0 (the prompt leaves no room, or it was asked for); 0 is allowed \
                 only with `decoder_input_details: true` (pure scoring)"
            ));
        }
        let sampling = sampling(params);
        let label_ids = params
            .logprob_token_ids
            .iter()
            .map(|&id| id as u32)
            .collect();
        let request = ValidRequest {
            input_ids: ids,
            max_new_tokens,
            sampling,
            repetition_penalty: params.repetition_penalty.map(|x| x as f32),
            frequency_penalty: params
                .frequency_penalty
                .filter(|&x| x != 0.0)
                .map(|x| x as f32),
            scores: ScoreRequest {
                top_n: params.top_n_tokens.unwrap_or(0) as u32,
                prefill_logprobs: params.decoder_input_details,
                mode: match params.logprobs_mode {
                    None => l.default_logprobs_mode,
                    Some(LogprobsModeParam::Raw) => LogprobsMode::Raw,
                    Some(LogprobsModeParam::Processed) => LogprobsMode::Processed,
                },
                return_logits: params.return_logits,
                label_ids,
            },
        };
        Ok(ValidGenerate {
            request,
            stop: params.stop.clone(),
            details: params.details,
            decoder_input_details: params.decoder_input_details,
            return_full_text: params.return_full_text,
            best_of: params.best_of.unwrap_or(1) as u32,
        })
    }
}

/// Sampling turns on with `do_sample` or any parameter that only means something when
/// sampling (API.md); a missing seed gets a random one, reported in `details.seed`.
fn sampling(p: &GenerateParameters) -> Sampling {
    let temperature = p.temperature.unwrap_or(1.0);
    let top_p = p.top_p.filter(|&x| x < 1.0);
    let typical_p = p.typical_p.filter(|&x| x < 1.0);
    let sample = p.do_sample
        || temperature != 1.0
        || p.top_k.is_some()
        || top_p.is_some()
        || typical_p.is_some();
    if !sample {
        return Sampling::Greedy;
    }
    Sampling::Sample {
        temperature: temperature as f32,
        top_k: p.top_k.map(|k| k as u32),
        top_p: top_p.map(|x| x as f32),
        typical_p: typical_p.map(|x| x as f32),
        seed: p.seed.unwrap_or_else(rand::random),
    }
}

fn check_parameters(p: &GenerateParameters, l: &ValidationLimits) -> Result<(), ApiError> {
    if let Some(n) = p.max_new_tokens {
        if n < 0 || n > l.max_total_tokens as i64 {
            return Err(invalid!(
                "`max_new_tokens` must be between 0 and {} (--max-total-tokens), got {n}",
                l.max_total_tokens
            ));
        }
    }
    // The shard samples in f32, so each value is checked as it will arrive there: 1e-300
    // would become 0 and 1e300 infinity (found by tests/props.rs).
    if let Some(t) = p.temperature {
        if !positive_f32(t) {
            return Err(invalid!(
                "`temperature` must be a finite number > 0 (as a 32-bit float), got {t}"
            ));
        }
    }
    if let Some(k) = p.top_k {
        if k <= 0 || k > u32::MAX as i64 {
            return Err(invalid!("`top_k` must be > 0, got {k}"));
        }
    }
    for (name, value) in [("top_p", p.top_p), ("typical_p", p.typical_p)] {
        if let Some(x) = value {
            if !(positive_f32(x) && x <= 1.0) {
                return Err(invalid!(
                    "`{name}` must be > 0 (as a 32-bit float) and <= 1.0 (1.0 is off), got {x}"
                ));
            }
        }
    }
    if let Some(x) = p.repetition_penalty {
        if !positive_f32(x) {
            return Err(invalid!(
                "`repetition_penalty` must be a finite number > 0 (as a 32-bit float), got {x}"
            ));
        }
    }
    if let Some(x) = p.frequency_penalty {
        if !(-2.0..=2.0).contains(&x) {
            return Err(invalid!(
                "`frequency_penalty` must be between -2.0 and 2.0, got {x}"
            ));
        }
    }
    check_stop(&p.stop, l)?;
    if let Some(t) = p.truncate {
        if t < 1 || t > l.max_input_tokens as i64 {
            return Err(invalid!(
                "`truncate` must be between 1 and {} (--max-input-tokens), got {t}",
                l.max_input_tokens
            ));
        }
    }
    if let Some(n) = p.top_n_tokens {
        if n < 0 || n > l.max_top_n_tokens as i64 {
            return Err(invalid!(
                "`top_n_tokens` must be between 0 and {} (--max-top-n-tokens), got {n}",
                l.max_top_n_tokens
            ));
        }
    }
    if let Some(b) = p.best_of {
        if b < 1 || b > l.max_best_of as i64 {
            return Err(invalid!(
                "`best_of` must be between 1 and {} (--max-best-of), got {b}",
                l.max_best_of
            ));
        }
        if b > 1 {
            if sampling(p) == Sampling::Greedy {
                return Err(invalid!("`best_of` > 1 needs sampling: set `do_sample`, `temperature`, `top_k` or `top_p`"));
            }
            if p.seed.is_some() {
                return Err(invalid!(
                    "`seed` must not be set when `best_of` > 1: each candidate gets its own"
                ));
            }
        }
    }
    if p.decoder_input_details && !l.enable_prefill_logprobs {
        return Err(invalid!(
            "`decoder_input_details` (prompt logprobs) needs the server started with --enable-prefill-logprobs"
        ));
    }
    check_labels(&p.logprob_token_ids, l)?;
    if p.grammar.as_ref().is_some_and(|g| !g.is_null()) {
        return Err(invalid!("`grammar` is not supported by this server"));
    }
    if p.adapter_id.is_some() {
        return Err(invalid!(
            "`adapter_id` is not supported by this server (no LoRA adapters)"
        ));
    }
    Ok(())
}

/// Whether `x` is still a finite number above 0 once the shard receives it as an f32.
fn positive_f32(x: f64) -> bool {
    let x = x as f32;
    x.is_finite() && x > 0.0
}

fn check_stop(stop: &[String], l: &ValidationLimits) -> Result<(), ApiError> {
    if stop.len() > l.max_stop_sequences {
        return Err(invalid!(
            "`stop` must have at most {} sequences (--max-stop-sequences), got {}",
            l.max_stop_sequences,
            stop.len()
        ));
    }
    for (i, s) in stop.iter().enumerate() {
        if s.is_empty() {
            return Err(invalid!("`stop[{i}]` must not be empty"));
        }
        if s.len() > MAX_STOP_SEQUENCE_BYTES {
            return Err(invalid!(
                "`stop[{i}]` must be at most {MAX_STOP_SEQUENCE_BYTES} bytes, got {}",
                s.len()
            ));
        }
    }
    Ok(())
}

fn check_labels(ids: &[i64], l: &ValidationLimits) -> Result<(), ApiError> {
    if ids.len() > l.max_label_tokens as usize {
        return Err(invalid!(
            "`logprob_token_ids` must have at most {} ids, got {}",
            l.max_label_tokens,
            ids.len()
        ));
    }
    if let Some(bad) = ids.iter().find(|&&id| id < 0 || id >= l.vocab_size as i64) {
        return Err(invalid!(
            "`logprob_token_ids` holds {bad}, outside the vocabulary (0..{})",
            l.vocab_size
        ));
    }
    Ok(())
}

#[cfg(test)]
#[path = "validation_tests.rs"]
mod tests;
