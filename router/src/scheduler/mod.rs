//! Continuous batching. `Scheduler` is a cloneable handle; one task (`batcher`) owns the
//! queue, the running requests and the `Shard`, and is the only one to call the shards. Requests arrive on a channel; each gets its events on its own channel, and a
//! dropped receiver is how a request is cancelled.

mod batcher;
mod queue;

use std::time::Duration;

use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::infer::{Backend, EventReceiver, ValidRequest};
use crate::shard::{Shard, ShardInfo};
use crate::state::HealthCell;
use queue::Entry;

/// The batching policy (TGI's flags and meanings).
#[derive(Debug, Clone)]
pub struct BatchingConfig {
    /// Prompt tokens in one prefill call.
    pub max_batch_prefill_tokens: u32,
    /// KV tokens (prompt + max_new_tokens) over every running request.
    pub max_batch_total_tokens: u32,
    /// A prefill interrupts the running batch only if it brings at least
    /// `ratio × running` requests...
    pub waiting_served_ratio: f32,
    /// ...unless requests have waited this many decode steps.
    pub max_waiting_tokens: u32,
    /// A shard call taking longer than this fails its requests (424): a stuck shard must
    /// not hang every client.
    pub step_timeout: Duration,
}

/// What a shard must answer before it is served: at startup, and again when it comes back
/// after a failure (the launcher restarts a dead shard, and a new process may have loaded
/// something else, or not be warm).
#[derive(Debug, Clone)]
pub struct Handshake {
    /// The shard's `Info` at startup, which a restarted shard must repeat.
    pub info: ShardInfo,
    /// Prompt tokens of the warmup.
    pub warmup_tokens: u32,
}

#[derive(Clone)]
pub struct Scheduler {
    tx: mpsc::UnboundedSender<Entry>,
}

impl Scheduler {
    /// Starts the batching task; it ends when every handle is dropped.
    pub fn spawn(
        shard: impl Shard,
        config: BatchingConfig,
        health: HealthCell,
        handshake: Handshake,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let batcher = batcher::Batcher::new(shard, config, health, handshake);
        tokio::spawn(batcher.run(rx));
        Self { tx }
    }
}

impl Backend for Scheduler {
    fn schedule(&self, request: ValidRequest) -> Result<EventReceiver, ApiError> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.tx.send(Entry::new(request, tx)).map_err(|_| {
            ApiError::NotReady("the scheduler has stopped: the server is shutting down".to_string())
        })?;
        Ok(rx)
    }
}
