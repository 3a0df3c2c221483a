//! The batching loop: admit, prefill, decode, dispatch, repeat.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::queue::{Budget, Entry, Queue};
use super::{BatchingConfig, Handshake};
use crate::client::ClientError;
use crate::error::ApiError;
use crate::infer::InferEvent;
use crate::metrics as m;
use crate::shard::{CachedBatch, Generation, NewBatch, PrefixCacheStats, Shard, SpeculationStats};
use crate::state::{Health, HealthCell};

/// How often an idle scheduler checks that the shard is alive.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

pub(super) struct Batcher<S> {
    client: S,
    config: BatchingConfig,
    handshake: Handshake,
    queue: Queue,
    /// Requests the shard holds, by their shard id.
    running: HashMap<u64, Entry>,
    /// Batches the shard holds; more than one only between a prefill and the decode
    /// that merges them.
    cached: Vec<CachedBatch>,
    health: HealthCell,
    next_request_id: u64,
    next_batch_id: u64,
    /// Decode steps since the last prefill.
    waiting_steps: u32,
}

enum Step {
    Prefill,
    Decode,
}

impl<S: Shard> Batcher<S> {
    pub(super) fn new(
        client: S,
        config: BatchingConfig,
        health: HealthCell,
        handshake: Handshake,
    ) -> Self {
        Self {
            client,
            config,
            health,
            handshake,
            queue: Queue::default(),
            running: HashMap::new(),
            cached: Vec::new(),
            next_request_id: 0,
            next_batch_id: 0,
            waiting_steps: 0,
        }
    }

    pub(super) async fn run(mut self, mut inbox: mpsc::UnboundedReceiver<Entry>) {
        loop {
            if self.cached.is_empty() && self.queue.is_empty() {
                // Idle: wait for a request (a closed inbox means shutdown), and check the
                // shard every second meanwhile, so health turns 503 when a shard dies
                // with no request in flight, and 200 again when it is back.
                match tokio::time::timeout(PROBE_INTERVAL, inbox.recv()).await {
                    Ok(Some(entry)) => self.queue.push(entry),
                    Ok(None) => break,
                    Err(_) => {
                        self.probe().await;
                        continue;
                    }
                }
            }
            while let Ok(entry) = inbox.try_recv() {
                self.queue.push(entry);
            }
            self.queue.drop_cancelled();
            if self.health.get() == Health::ShardFailed {
                // Nothing runs on a shard that has not passed the handshake again.
                self.probe().await;
                if self.health.get() != Health::Ready {
                    self.fail_queued();
                    continue;
                }
            }
            self.admit().await;
            self.drop_cancelled().await;
            if !self.cached.is_empty() {
                self.decode().await;
            }
            self.report_gauges();
        }
        if let Err(e) = self.client.clear(None).await {
            tracing::warn!(error = %e, "could not clear the shard caches at shutdown");
        }
    }

    /// Asks the shard whether it is alive (idle time only: a busy shard answers every step);
    /// one that failed must pass the handshake again before it is served.
    async fn probe(&self) {
        let alive = tokio::time::timeout(PROBE_INTERVAL, self.client.health())
            .await
            .is_ok_and(|r| r.is_ok());
        match (alive, self.health.get()) {
            (true, Health::ShardFailed) => self.rehandshake().await,
            (false, Health::Ready) => {
                tracing::error!(
                    "the shard does not answer its health check; health is 503 until it does"
                );
                self.health.set(Health::ShardFailed);
            }
            _ => {}
        }
    }

    /// A shard that answers again after a failure is likely a new process: it must serve
    /// what the router was started for (its Info the same as at startup) and be warm before
    /// health is 200 again. One that serves something else stops the server: its answers
    /// would not match the tokenizer, the limits or the model name clients were told.
    async fn rehandshake(&self) {
        let expected = &self.handshake;
        let info = match self.deadline(self.client.info()).await {
            Ok(info) => info,
            Err(e) => {
                tracing::warn!(error = %e, "the shard answers its health check but not Info; retrying");
                return;
            }
        };
        if info != expected.info {
            let reason = format!(
                "the restarted shard serves something else than it did at startup ({}); \
                 refusing to serve it",
                expected.info.differences(&info)
            );
            tracing::error!("{reason}");
            self.health.fail(reason);
            return;
        }
        match self
            .deadline(self.client.warmup(expected.warmup_tokens))
            .await
        {
            Ok(budget) if budget >= self.config.max_batch_total_tokens => {
                tracing::info!(
                    "the shard answers again, serves the same model and is warm; serving"
                );
                self.health.set(Health::Ready);
            }
            Ok(budget) => {
                let reason = format!(
                    "the restarted shard's KV budget ({budget} tokens) is below the {} the \
                     router admits requests under; refusing to overcommit it",
                    self.config.max_batch_total_tokens
                );
                tracing::error!("{reason}");
                self.health.fail(reason);
            }
            Err(e) => tracing::warn!(error = %e, "warming up the restarted shard failed; retrying"),
        }
    }

    /// Fails what waits while the shard is down: it cannot run until the shard is back.
    fn fail_queued(&mut self) {
        let error = ApiError::Generation(
            "the shard is down and being restarted; retry shortly".to_string(),
        );
        while let Some(entry) = self.queue.pop_front() {
            metrics::counter!(m::FAILED_REQUESTS, "reason" => "shard_down").increment(1);
            entry.fail(error.clone());
        }
    }

    fn report_gauges(&self) {
        metrics::gauge!(m::QUEUE_SIZE).set(self.queue.len() as f64);
        metrics::gauge!(m::BATCH_SIZE).set(self.running.len() as f64);
        let reserved: u32 = self.cached.iter().map(|b| b.reserved_tokens).sum();
        metrics::gauge!(m::BATCH_RESERVED_TOKENS).set(reserved as f64);
    }

    /// Prefills a new batch from the queue when the policy allows.
    async fn admit(&mut self) {
        if self.queue.is_empty() {
            return;
        }
        let reserved: u32 = self.cached.iter().map(|b| b.reserved_tokens).sum();
        let running = self.running.len();
        let min_size = if running == 0 || self.waiting_steps >= self.config.max_waiting_tokens {
            0
        } else {
            (running as f32 * self.config.waiting_served_ratio).floor() as usize
        };
        let budget = Budget {
            min_size,
            prefill_tokens: self.config.max_batch_prefill_tokens,
            total_tokens: self.config.max_batch_total_tokens.saturating_sub(reserved),
        };
        let Some(entries) = self.queue.next_batch(budget) else {
            if self.cached.is_empty() {
                // Nothing runs and the head still does not fit: validation should have
                // refused it; fail it rather than spin.
                if let Some(entry) = self.queue.pop_front() {
                    entry.fail(ApiError::Validation(format!(
                        "the request needs {} KV tokens, more than the server's budget of {}",
                        entry.request.reserved_tokens(),
                        self.config.max_batch_total_tokens
                    )));
                }
            }
            return;
        };
        self.prefill(entries).await;
        self.waiting_steps = 0;
    }

    async fn prefill(&mut self, entries: Vec<Entry>) {
        let batch_id = self.next_batch_id;
        self.next_batch_id += 1;
        let mut requests = Vec::with_capacity(entries.len());
        let mut ids = Vec::with_capacity(entries.len());
        for entry in entries {
            let id = self.next_request_id;
            self.next_request_id += 1;
            metrics::counter!(m::INPUT_TOKENS).increment(entry.request.input_ids.len() as u64);
            requests.push((id, entry.request.clone()));
            ids.push(id);
            self.running.insert(id, entry);
        }
        let batch = NewBatch {
            id: batch_id,
            requests,
        };
        let started = Instant::now();
        let client = self.client.clone();
        match self.deadline(client.prefill(batch)).await {
            Ok(resp) => {
                observe(Step::Prefill, started, resp.forward_ns);
                if let Some(prefix) = resp.prefix_cache {
                    observe_prefix_cache(prefix);
                }
                self.dispatch(resp.generations, true);
                if let Some(batch) = resp.batch {
                    self.cached.push(batch);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, batch_id, "prefill failed");
                self.fail(&ids, &e);
                // Best effort: the shard may hold part of the batch, or be gone.
                let _ = self.deadline(self.client.clear(Some(batch_id))).await;
            }
        }
    }

    async fn decode(&mut self) {
        let batches = std::mem::take(&mut self.cached);
        let ids: Vec<u64> = batches
            .iter()
            .flat_map(|b| b.request_ids.iter().copied())
            .collect();
        let started = Instant::now();
        let client = self.client.clone();
        match self.deadline(client.decode(batches)).await {
            Ok(resp) => {
                observe(Step::Decode, started, resp.forward_ns);
                if let Some(speculation) = resp.speculation {
                    observe_speculation(speculation);
                }
                self.dispatch(resp.generations, false);
                if let Some(batch) = resp.batch {
                    self.cached.push(batch);
                }
                self.waiting_steps += 1;
            }
            Err(e) => {
                tracing::error!(error = %e, "decode failed");
                self.fail(&ids, &e);
                let _ = self.deadline(self.client.clear(None)).await;
            }
        }
    }

    /// Frees the shard slots of requests whose client went away.
    async fn drop_cancelled(&mut self) {
        let mut kept = Vec::with_capacity(self.cached.len());
        for batch in std::mem::take(&mut self.cached) {
            let keep: Vec<u64> = batch
                .request_ids
                .iter()
                .copied()
                .filter(|id| self.running.get(id).is_some_and(|e| !e.is_cancelled()))
                .collect();
            if keep.len() == batch.request_ids.len() {
                kept.push(batch);
                continue;
            }
            for id in &batch.request_ids {
                if !keep.contains(id) {
                    self.running.remove(id);
                }
            }
            let result = if keep.is_empty() {
                self.deadline(self.client.clear(Some(batch.id)))
                    .await
                    .map(|_| None)
            } else {
                self.deadline(self.client.filter(batch.id, keep.clone()))
                    .await
                    .map(Some)
            };
            match result {
                Ok(Some(filtered)) => kept.push(filtered),
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(error = %e, "filtering a batch failed");
                    self.fail(&keep, &e);
                    let _ = self.deadline(self.client.clear(Some(batch.id))).await;
                }
            }
        }
        self.cached = kept;
    }

    /// Hands each generation to its request; forgets the ones that finished (the shard
    /// already dropped them).
    fn dispatch(&mut self, generations: Vec<Generation>, prefill: bool) {
        let now = Instant::now();
        for g in generations {
            let Some(entry) = self.running.get_mut(&g.request_id) else {
                continue;
            };
            let finish = g.finish;
            if prefill {
                let _ = entry.tx.send(Ok(InferEvent::Prompt {
                    scores: g.prefill,
                    cached_tokens: g.cached_prompt_tokens,
                }));
            }
            match g.token {
                Some(token) => {
                    match entry.last_event_at {
                        None => metrics::histogram!(m::TIME_TO_FIRST_TOKEN)
                            .record(now.duration_since(entry.queued_at).as_secs_f64()),
                        Some(last) => metrics::histogram!(m::INTER_TOKEN_LATENCY)
                            .record(now.duration_since(last).as_secs_f64()),
                    }
                    metrics::counter!(m::GENERATED_TOKENS).increment(1);
                    entry.last_event_at = Some(now);
                    let _ = entry.tx.send(Ok(InferEvent::Token { token, finish }));
                }
                None => {
                    if let Some(reason) = finish {
                        let _ = entry.tx.send(Ok(InferEvent::End(reason)));
                    }
                }
            }
            if finish.is_some() {
                self.running.remove(&g.request_id);
            }
        }
    }

    /// Fails the given requests with a 424 naming the shard's error.
    fn fail(&mut self, ids: &[u64], error: &ClientError) {
        if error.shard_down() {
            tracing::error!(error = %error, "the shard is down; health is 503 until it answers again");
            self.health.set(Health::ShardFailed);
        }
        let api = ApiError::Generation(format!("generation failed in the shard: {error}"));
        for id in ids {
            if let Some(entry) = self.running.remove(id) {
                metrics::counter!(m::FAILED_REQUESTS, "reason" => "generation").increment(1);
                entry.fail(api.clone());
            }
        }
    }

    /// Runs a shard call under the per-step deadline.
    async fn deadline<T>(
        &self,
        call: impl Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        match tokio::time::timeout(self.config.step_timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(ClientError::Status {
                rank: 0,
                code: tonic::Code::DeadlineExceeded,
                message: format!("no answer within {:?}", self.config.step_timeout),
            }),
        }
    }
}

fn observe(step: Step, started: Instant, forward_ns: u64) {
    let method = match step {
        Step::Prefill => "prefill",
        Step::Decode => "decode",
    };
    metrics::histogram!(m::STEP_DURATION, "method" => method)
        .record(started.elapsed().as_secs_f64());
    metrics::histogram!(m::FORWARD_DURATION, "method" => method).record(forward_ns as f64 * 1e-9);
}

/// The shard keeps the totals (they survive router-side retries); a restarted shard
/// starts them at 0, which Prometheus reads as a counter reset.
fn observe_prefix_cache(s: PrefixCacheStats) {
    metrics::counter!(m::PREFIX_CACHE_HIT_TOKENS).absolute(s.hit_tokens);
    metrics::counter!(m::PREFIX_CACHE_EVICTED_TOKENS).absolute(s.evicted_tokens);
    metrics::gauge!(m::PREFIX_CACHE_TOKENS).set(s.cached_tokens as f64);
}

/// Totals kept by the shard, as for the prefix cache.
fn observe_speculation(s: SpeculationStats) {
    metrics::counter!(m::SPECULATIVE_DRAFTED_TOKENS).absolute(s.drafted_tokens);
    metrics::counter!(m::SPECULATIVE_ACCEPTED_TOKENS).absolute(s.accepted_tokens);
}

#[cfg(test)]
#[path = "batcher_tests.rs"]
mod tests;
