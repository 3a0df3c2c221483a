//! The engine's own request and answer types. Protobuf stops in the gRPC server
//! (`convert.rs` turns messages into these and back); the engine and its tests speak only
//! these, so the wire's conventions (0 for "unset", enums as integers) end at the edge.

use sonde_proto::LogprobsMode;

use crate::sampling::SamplingParams;

/// A request as the router sent it, before the engine checked it against the model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Request {
    pub id: u64,
    pub input_ids: Vec<u32>,
    pub sampling: SamplingParams,
    pub stopping: StopOptions,
    pub scores: ScoreOptions,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopOptions {
    /// 0 only with prompt logprobs: the request is scored and generates nothing.
    pub max_new_tokens: u32,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos_token: bool,
}

/// What a request asks to have reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScoreOptions {
    pub top_n_tokens: u32,
    pub prefill_logprobs: bool,
    pub logprobs_mode: LogprobsMode,
    pub return_logits: bool,
    /// Label ids whose logprobs every position reports.
    pub logprob_token_ids: Vec<u32>,
    /// The answer shows no generated token's logprob, so it may be left out.
    pub skip_token_logprobs: bool,
}

/// A new batch to prefill, under an id the router chose.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    pub id: u64,
    pub requests: Vec<Request>,
}

/// A batch the engine holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CachedBatch {
    pub id: u64,
    pub request_ids: Vec<u64>,
    /// KV tokens its requests reserve (prompt + max_new_tokens each).
    pub reserved_tokens: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Length,
    EosToken,
    StopToken,
}

/// One token and its scores. The first prompt token has no logprob: nothing precedes it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenScore {
    pub id: u32,
    pub logprob: Option<f32>,
    pub logit: Option<f32>,
    /// 1-based among the raw logits of the whole vocabulary.
    pub rank: Option<u32>,
    /// Best first, exactly `top_n_tokens` of them.
    pub top_tokens: Vec<TopToken>,
    /// In the order of the request's `logprob_token_ids`.
    pub label_logprobs: Vec<f32>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopToken {
    pub id: u32,
    pub logprob: f32,
}

/// One request's outcome of one step.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub request_id: u64,
    /// Prompt scores, on the prefill step of a request that asked for them.
    pub prefill: Vec<TokenScore>,
    /// None when the request generates nothing (`max_new_tokens` 0).
    pub token: Option<TokenScore>,
    /// Set on the request's last step, when the engine drops it from its batch.
    pub finish_reason: Option<FinishReason>,
    /// Tokens generated so far, this one included.
    pub generated_tokens: u32,
    /// Prompt tokens the prefix cache supplied (prefill only).
    pub cached_prompt_tokens: u32,
}
