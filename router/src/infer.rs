//! The seam between the HTTP layer and scheduling: a validated request goes in, a stream of
//! per-step events comes out. Handlers never see protobuf types, and tests can put a fake
//! `Backend` behind the routes.

use serde::Serialize;
use sonde_proto::LogprobsMode;
use tokio::sync::mpsc;
use utoipa::ToSchema;

use crate::error::ApiError;

#[derive(Debug, Clone, PartialEq)]
pub enum Sampling {
    /// Argmax of the processed logits, ties to the smaller id.
    Greedy,
    Sample {
        temperature: f32,
        top_k: Option<u32>,
        top_p: Option<f32>,
        typical_p: Option<f32>,
        seed: u64,
    },
}

impl Sampling {
    pub fn seed(&self) -> Option<u64> {
        match self {
            Sampling::Greedy => None,
            Sampling::Sample { seed, .. } => Some(*seed),
        }
    }
}

/// What a request asks the shard to score (by default: only each token's logprob).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScoreRequest {
    pub top_n_tokens: u32,
    pub prefill_logprobs: bool,
    pub mode: LogprobsMode,
    pub return_logits: bool,
    pub label_ids: Vec<u32>,
    /// See `ScoreSpec::skip_token_logprobs`.
    pub skip_token_logprobs: bool,
}

/// A request the shard can run as is: tokenized, truncated and within every limit.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRequest {
    pub input_ids: Vec<u32>,
    pub max_new_tokens: u32,
    pub sampling: Sampling,
    pub repetition_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub scores: ScoreRequest,
}

impl ValidRequest {
    /// A greedy request with no penalties and no extra scores: what tests start from.
    #[cfg(test)]
    pub fn greedy(input_ids: Vec<u32>, max_new_tokens: u32) -> Self {
        Self {
            input_ids,
            max_new_tokens,
            sampling: Sampling::Greedy,
            repetition_penalty: None,
            frequency_penalty: None,
            scores: ScoreRequest::default(),
        }
    }

    /// KV cache tokens the request holds while it runs.
    pub fn reserved_tokens(&self) -> u32 {
        self.input_ids.len() as u32 + self.max_new_tokens
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// `max_new_tokens` reached.
    Length,
    /// The model's end-of-sequence token.
    EosToken,
    /// One of the request's stop sequences appeared in the text.
    StopSequence,
}

/// The scores of one token at one position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenScore {
    pub id: u32,
    /// None only for the first prompt token; may be -inf in processed mode.
    pub logprob: Option<f32>,
    pub logit: Option<f32>,
    pub rank: Option<u32>,
    /// `(id, logprob)`, exactly top_n_tokens, descending, ties to the smaller id.
    pub top: Vec<(u32, f32)>,
    /// Logprobs of the request's label ids, in their order.
    pub labels: Vec<f32>,
}

/// One step of one request, as the scheduler reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum InferEvent {
    /// First event of every request: its prompt scores (empty unless asked for) and the
    /// prompt tokens the shard's prefix cache supplied.
    Prompt {
        scores: Vec<TokenScore>,
        cached_tokens: u32,
    },
    /// A generated token; `finish` is set on the last one.
    Token {
        token: TokenScore,
        finish: Option<FinishReason>,
    },
    /// The request ended without a token (pure scoring, `max_new_tokens` 0).
    End(FinishReason),
}

/// Events of one request. Dropping the receiver cancels the request: the scheduler frees
/// its slot at the next step.
pub type EventReceiver = mpsc::UnboundedReceiver<Result<InferEvent, ApiError>>;

pub trait Backend: Send + Sync + 'static {
    /// Queues a request; its events arrive on the receiver.
    fn schedule(&self, request: ValidRequest) -> Result<EventReceiver, ApiError>;
}
