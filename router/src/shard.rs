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

/// One request's outcome of one step.
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
    /// The prefix cache's totals after a prefill (decode steps do not touch it).
    pub prefix_cache: Option<PrefixCacheStats>,
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
