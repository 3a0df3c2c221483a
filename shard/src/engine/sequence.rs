//! One request as the engine holds it: validated options, its sampler and its KV cache.

use sonde_proto::LogprobsMode;

use super::types::{FinishReason, Request};
use crate::error::EngineError;
use crate::loader::ModelFacts;
use crate::model::SeqCache;
use crate::sampling::{Sampler, SamplingParams};

/// Most label ids a request may name; each costs a lookup per position.
pub const MAX_LABEL_TOKENS: usize = 128;

/// What a request asked to have reported, validated.
#[derive(Debug, Clone)]
pub struct ScoreSpec {
    pub top_n_tokens: usize,
    pub prefill_logprobs: bool,
    pub mode: LogprobsMode,
    pub return_logits: bool,
    pub labels: Vec<u32>,
    /// The answer shows no generated token's logprob.
    pub skip_token_logprobs: bool,
}

impl ScoreSpec {
    /// Whether a generated token needs no score at all: none asked for, and its logprob
    /// not shown.
    pub fn token_unscored(&self) -> bool {
        self.skip_token_logprobs
            && self.top_n_tokens == 0
            && !self.return_logits
            && self.labels.is_empty()
    }
}

#[derive(Debug, Clone)]
pub struct Stopping {
    pub max_new_tokens: usize,
    pub stop_token_ids: Vec<u32>,
    pub eos_token_ids: Vec<u32>,
}

impl Stopping {
    /// Why generation ends after `token`, the `generated`-th token, if it does.
    pub fn finish_reason(&self, token: u32, generated: usize) -> Option<FinishReason> {
        if self.eos_token_ids.contains(&token) {
            Some(FinishReason::EosToken)
        } else if self.stop_token_ids.contains(&token) {
            Some(FinishReason::StopToken)
        } else if generated >= self.max_new_tokens {
            Some(FinishReason::Length)
        } else {
            None
        }
    }
}

/// A request checked against the model, before anything is allocated for it.
pub struct ValidRequest {
    pub id: u64,
    pub input_ids: Vec<u32>,
    pub sampling: SamplingParams,
    pub stopping: Stopping,
    pub scores: ScoreSpec,
}

impl ValidRequest {
    /// KV cache tokens the request may use: its prompt and every token it may generate.
    pub fn reservation(&self) -> usize {
        self.input_ids.len() + self.stopping.max_new_tokens
    }

    pub fn validate(req: Request, facts: &ModelFacts) -> Result<Self, EngineError> {
        let id = req.id;
        let bad = |msg: String| EngineError::InvalidRequest(format!("request {id}: {msg}"));
        let vocab = facts.vocab_size;
        if req.input_ids.is_empty() {
            return Err(bad(
                "input_ids is empty; a prompt needs at least one token".into()
            ));
        }
        let check_ids = |field: &str, ids: &[u32]| match ids.iter().find(|&&t| t as usize >= vocab)
        {
            Some(t) => Err(bad(format!(
                "{field} contains token id {t}, but the vocabulary has {vocab} tokens (ids 0..{})",
                vocab - 1
            ))),
            None => Ok(()),
        };
        check_ids("input_ids", &req.input_ids)?;

        let Request {
            stopping, scores, ..
        } = req;
        check_ids("stopping.stop_token_ids", &stopping.stop_token_ids)?;
        check_ids("scores.logprob_token_ids", &scores.logprob_token_ids)?;
        if scores.logprob_token_ids.len() > MAX_LABEL_TOKENS {
            return Err(bad(format!(
                "scores.logprob_token_ids names {} ids; at most {MAX_LABEL_TOKENS} are allowed",
                scores.logprob_token_ids.len()
            )));
        }
        if scores.top_n_tokens as usize > vocab {
            return Err(bad(format!(
                "scores.top_n_tokens is {}, more than the vocabulary's {vocab} tokens",
                scores.top_n_tokens
            )));
        }
        let max_new_tokens = stopping.max_new_tokens as usize;
        if max_new_tokens == 0 && !scores.prefill_logprobs {
            return Err(bad(
                "stopping.max_new_tokens is 0 without scores.prefill_logprobs: \
                 the request would compute nothing"
                    .into(),
            ));
        }
        let total = req.input_ids.len() + max_new_tokens;
        if total > facts.max_context {
            return Err(bad(format!(
                "{} prompt tokens + max_new_tokens {max_new_tokens} = {total} exceeds the \
                 model's context of {} tokens",
                req.input_ids.len(),
                facts.max_context
            )));
        }
        req.sampling.validate().map_err(|e| bad(e.to_string()))?;
        Ok(ValidRequest {
            id,
            input_ids: req.input_ids,
            sampling: req.sampling,
            stopping: Stopping {
                max_new_tokens,
                stop_token_ids: stopping.stop_token_ids,
                eos_token_ids: if stopping.ignore_eos_token {
                    Vec::new()
                } else {
                    facts.eos_token_ids.clone()
                },
            },
            scores: ScoreSpec {
                top_n_tokens: scores.top_n_tokens as usize,
                prefill_logprobs: scores.prefill_logprobs,
                mode: scores.logprobs_mode,
                return_logits: scores.return_logits,
                labels: scores.logprob_token_ids,
                skip_token_logprobs: scores.skip_token_logprobs,
            },
        })
    }
}

/// A request the engine is running.
pub struct Sequence {
    pub id: u64,
    pub cache: SeqCache,
    pub sampler: Sampler,
    pub stopping: Stopping,
    pub scores: ScoreSpec,
    /// The token the next decode step feeds in.
    pub last_token: u32,
    pub generated: usize,
    /// Prompt and generated tokens, where drafts are looked up.
    pub history: Vec<u32>,
    /// The longest draft the next step may feed (`speculation.rs`).
    pub draft_len: usize,
}

impl Sequence {
    /// KV cache tokens this sequence holds reserved.
    pub fn reservation(&self) -> usize {
        self.cache.capacity()
    }

    /// Whether its next tokens are the argmax of the raw logits and need no score: then a
    /// row's token is all the step must find (`Model::greedy_tokens`).
    pub fn argmax_only(&self) -> bool {
        let params = self.sampler.params();
        !params.do_sample && !params.has_processors() && self.scores.token_unscored()
    }
}
