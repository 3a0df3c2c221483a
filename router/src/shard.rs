//! What the scheduler needs from the shards, in the router's own types. `client.rs`
//! implements it over gRPC (protobuf stops there); the batcher's unit tests implement it
//! with a fake, so batching is tested without a model.

use std::future::Future;

use crate::client::ClientError;
use crate::infer::{FinishReason, TokenScore, ValidRequest};

/// A batch the shard holds in its KV cache.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedBatch {
    pub id: u64,
    /// The scheduler's ids of the requests still in it.
    pub request_ids: Vec<u64>,
    /// KV tokens it has reserved (prompt + max_new_tokens per request).
    pub reserved_tokens: u32,
}

/// One request's outcome of one step, or one of its tokens: a decode step that verified
/// a draft (speculative decoding) gives a request several, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub request_id: u64,
    /// Prompt scores; prefill only (empty unless asked for).
    pub prefill: Vec<TokenScore>,
    /// None only when the request ends without a token (pure scoring).
    pub token: Option<TokenScore>,
    /// Set on the request's last step: the shard has dropped it from its batch.
    pub finish: Option<FinishReason>,
    /// Prompt tokens the shard's prefix cache supplied (prefill only).
    pub cached_prompt_tokens: u32,
}

/// The answer to a prefill or a decode.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    pub generations: Vec<Generation>,
    /// The batch that goes on, if any request in it has not finished.
    pub batch: Option<CachedBatch>,
    /// Time the shard spent in the model's forward pass.
    pub forward_ns: u64,
    /// The prefix cache's totals after the step (only prefills change them, and the
    /// batcher reads them only then).
    pub prefix_cache: Option<PrefixCacheStats>,
    /// Speculative decoding's totals after the step (only decodes change them).
    pub speculation: Option<SpeculationStats>,
}

/// The shard's speculative decoding since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpeculationStats {
    pub drafted_tokens: u64,
    /// Draft tokens that were the token sampled at their position.
    pub accepted_tokens: u64,
}

/// The shard's prefix cache since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Prompt tokens loaded from the cache instead of computed.
    pub hit_tokens: u64,
    pub evicted_tokens: u64,
    /// Tokens cached now.
    pub cached_tokens: u64,
}

/// What a shard serves, as its `Info` says. A shard that restarts must say the same before
/// it is served again.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ShardInfo {
    pub model_id: String,
    pub architecture: String,
    pub weights_format: String,
    pub dtype: String,
    pub device: String,
    pub vocab_size: u32,
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub max_context: u32,
    pub max_label_tokens: u32,
    pub prefix_caching: bool,
    pub prefix_block_tokens: u32,
}

impl ShardInfo {
    /// Where `now` differs from `self`, as `field: was → now` pairs.
    pub fn differences(&self, now: &ShardInfo) -> String {
        let (Ok(serde_json::Value::Object(was)), Ok(serde_json::Value::Object(now))) =
            (serde_json::to_value(self), serde_json::to_value(now))
        else {
            return format!("{self:?} → {now:?}");
        };
        was.iter()
            .filter(|(field, value)| now.get(*field) != Some(value))
            .map(|(field, value)| {
                let new = now.get(field).cloned().unwrap_or_default();
                format!("{field}: {value} → {new}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A new batch to prefill: each request under the scheduler's id for it.
#[derive(Debug, Clone)]
pub struct NewBatch {
    pub id: u64,
    pub requests: Vec<(u64, ValidRequest)>,
}

/// The shard calls the batcher makes. Every call may fail; `ClientError::shard_down` says
/// whether the shard itself is gone.
pub trait Shard: Clone + Send + Sync + 'static {
    fn health(&self) -> impl Future<Output = Result<(), ClientError>> + Send;
    /// What the shard serves.
    fn info(&self) -> impl Future<Output = Result<ShardInfo, ClientError>> + Send;
    /// Runs a prompt of `tokens` tokens through every kernel once; answers the shard's KV
    /// budget in tokens.
    fn warmup(&self, tokens: u32) -> impl Future<Output = Result<u32, ClientError>> + Send;
    fn prefill(
        &self,
        batch: NewBatch,
    ) -> impl Future<Output = Result<StepOutput, ClientError>> + Send;
    /// One decode step over every given batch; the shard merges them into one.
    fn decode(
        &self,
        batches: Vec<CachedBatch>,
    ) -> impl Future<Output = Result<StepOutput, ClientError>> + Send;
    /// Keeps only `request_ids` of batch `batch_id`.
    fn filter(
        &self,
        batch_id: u64,
        request_ids: Vec<u64>,
    ) -> impl Future<Output = Result<CachedBatch, ClientError>> + Send;
    /// Frees batch `id`, or every batch.
    fn clear(&self, id: Option<u64>) -> impl Future<Output = Result<(), ClientError>> + Send;
}
