//! The batching loop against a fake shard that keeps batches as a real one does (ids,
//! merge on decode, filter, clear, a KV budget it refuses to exceed) and emits, for each
//! request, the tokens `first input id + 0, + 1, ...`, so every event can be traced to
//! the request it belongs to.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::super::{BatchingConfig, Handshake, Scheduler};
use crate::client::ClientError;
use crate::error::ApiError;
use crate::infer::{Backend, EventReceiver, FinishReason, InferEvent, TokenScore, ValidRequest};
use crate::shard::{CachedBatch, Generation, NewBatch, Shard, ShardInfo, StepOutput};
use crate::state::{Health, HealthCell};

/// A shard call as the fake saw it (request ids, not batch ids, so tests read simply).
#[derive(Debug, Clone, PartialEq)]
enum Call {
    Prefill(Vec<u64>),
    Decode(Vec<u64>),
    Filter(Vec<u64>),
    Clear(Option<u64>),
    Info,
    Warmup,
}

struct Running {
    id: u64,
    first_token: u32,
    generated: u32,
    max_new_tokens: u32,
    reserved: u32,
}

#[derive(Default)]
struct State {
    batches: HashMap<u64, Vec<Running>>,
    calls: Vec<Call>,
    decodes: usize,
    /// The decode call (1-based) that fails, and how.
    fail_decode: Option<(usize, tonic::Code)>,
    /// What `Info` answers: the model it serves.
    model_id: String,
}

#[derive(Clone)]
struct FakeShard {
    state: Arc<Mutex<State>>,
    kv_budget: u32,
}

impl FakeShard {
    fn new(kv_budget: u32) -> Self {
        Self {
            state: Arc::default(),
            kv_budget,
        }
    }

    fn calls(&self) -> Vec<Call> {
        self.state.lock().unwrap().calls.clone()
    }

    fn fail_decode(&self, nth: usize, code: tonic::Code) {
        self.state.lock().unwrap().fail_decode = Some((nth, code));
    }

    /// Makes `Info` answer another model, as a shard restarted on another file would.
    fn serve_model(&self, model_id: &str) {
        self.state.lock().unwrap().model_id = model_id.to_string();
    }
}

fn shard_info(model_id: &str) -> ShardInfo {
    ShardInfo {
        model_id: model_id.to_string(),
        architecture: "llama".into(),
        weights_format: "gguf".into(),
        dtype: "q4_1".into(),
        device: "cpu".into(),
        vocab_size: 1000,
        eos_token_ids: vec![2],
        bos_token_id: Some(1),
        max_context: 2048,
        max_label_tokens: 128,
        prefix_caching: true,
        prefix_block_tokens: 16,
    }
}

/// The scheduler over `shard`, which passed its startup handshake with the model `m`.
fn spawn(shard: &FakeShard, config: BatchingConfig, health: HealthCell) -> Scheduler {
    let handshake = Handshake {
        info: shard_info("m"),
        warmup_tokens: 8,
    };
    shard.serve_model("m");
    Scheduler::spawn(shard.clone(), config, health, handshake)
}

fn error(code: tonic::Code, message: &str) -> ClientError {
    ClientError::Status {
        rank: 0,
        code,
        message: message.to_string(),
    }
}

fn token(id: u32) -> TokenScore {
    TokenScore {
        id,
        logprob: Some(-1.0),
        logit: None,
        rank: None,
        top: Vec::new(),
        labels: Vec::new(),
    }
}

/// One token for each request of `batch`; the finished leave it.
fn step(id: u64, mut batch: Vec<Running>, state: &mut State) -> StepOutput {
    let mut generations = Vec::new();
    for r in &mut batch {
        r.generated += 1;
        let finish = (r.generated == r.max_new_tokens).then_some(FinishReason::Length);
        generations.push(Generation {
            request_id: r.id,
            prefill: Vec::new(),
            token: Some(token(r.first_token + r.generated - 1)),
            finish,
            cached_prompt_tokens: 0,
        });
    }
    batch.retain(|r| r.generated < r.max_new_tokens);
    let cached = (!batch.is_empty()).then(|| cached(id, &batch));
    if !batch.is_empty() {
        state.batches.insert(id, batch);
    }
    StepOutput {
        generations,
        batch: cached,
        forward_ns: 1,
        prefix_cache: None,
        speculation: None,
    }
}

fn cached(id: u64, batch: &[Running]) -> CachedBatch {
    CachedBatch {
        id,
        request_ids: batch.iter().map(|r| r.id).collect(),
        reserved_tokens: batch.iter().map(|r| r.reserved).sum(),
    }
}

/// Each call takes a millisecond, as a forward pass takes time: the test's own task
/// runs in between.
async fn work() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

impl Shard for FakeShard {
    async fn health(&self) -> Result<(), ClientError> {
        Ok(())
    }

    async fn info(&self) -> Result<ShardInfo, ClientError> {
        let mut state = self.state.lock().unwrap();
        state.calls.push(Call::Info);
        Ok(shard_info(&state.model_id))
    }

    async fn warmup(&self, _tokens: u32) -> Result<u32, ClientError> {
        self.state.lock().unwrap().calls.push(Call::Warmup);
        Ok(self.kv_budget)
    }

    async fn prefill(&self, batch: NewBatch) -> Result<StepOutput, ClientError> {
        work().await;
        let mut state = self.state.lock().unwrap();
        let ids = batch.requests.iter().map(|(id, _)| *id).collect();
        state.calls.push(Call::Prefill(ids));
        let held: u32 = state.batches.values().flatten().map(|r| r.reserved).sum();
        let new: u32 = batch
            .requests
            .iter()
            .map(|(_, r)| r.reserved_tokens())
            .sum();
        if held + new > self.kv_budget {
            return Err(error(tonic::Code::ResourceExhausted, "over the KV budget"));
        }
        let running = batch
            .requests
            .iter()
            .map(|(id, r)| Running {
                id: *id,
                first_token: r.input_ids[0],
                generated: 0,
                max_new_tokens: r.max_new_tokens,
                reserved: r.reserved_tokens(),
            })
            .collect();
        Ok(step(batch.id, running, &mut state))
    }

    async fn decode(&self, batches: Vec<CachedBatch>) -> Result<StepOutput, ClientError> {
        work().await;
        let mut state = self.state.lock().unwrap();
        let ids = batches.iter().flat_map(|b| b.request_ids.clone()).collect();
        state.calls.push(Call::Decode(ids));
        state.decodes += 1;
        if let Some((nth, code)) = state.fail_decode {
            if nth == state.decodes {
                return Err(error(code, "injected failure"));
            }
        }
        let mut merged = Vec::new();
        for b in &batches {
            let batch = state.batches.remove(&b.id);
            merged.extend(batch.ok_or_else(|| error(tonic::Code::NotFound, "no such batch"))?);
        }
        Ok(step(batches[0].id, merged, &mut state))
    }

    async fn filter(
        &self,
        batch_id: u64,
        request_ids: Vec<u64>,
    ) -> Result<CachedBatch, ClientError> {
        let mut state = self.state.lock().unwrap();
        state.calls.push(Call::Filter(request_ids.clone()));
        let batch = state
            .batches
            .get_mut(&batch_id)
            .ok_or_else(|| error(tonic::Code::NotFound, "no such batch"))?;
        batch.retain(|r| request_ids.contains(&r.id));
        Ok(cached(batch_id, batch))
    }

    async fn clear(&self, id: Option<u64>) -> Result<(), ClientError> {
        let mut state = self.state.lock().unwrap();
        state.calls.push(Call::Clear(id));
        match id {
            Some(id) => drop(state.batches.remove(&id)),
            None => state.batches.clear(),
        }
        Ok(())
    }
}

fn config(max_batch_total_tokens: u32) -> BatchingConfig {
    BatchingConfig {
        max_batch_prefill_tokens: 4096,
        max_batch_total_tokens,
        waiting_served_ratio: 0.3,
        max_waiting_tokens: 20,
        step_timeout: Duration::from_secs(10),
    }
}

/// A greedy request whose tokens start at `first_token`.
fn request(first_token: u32, prompt_len: usize, max_new_tokens: u32) -> ValidRequest {
    ValidRequest::greedy(vec![first_token; prompt_len], max_new_tokens)
}

/// What one request received, to the end of its channel.
#[derive(Debug, Default)]
struct Received {
    tokens: Vec<u32>,
    finish: Option<FinishReason>,
    error: Option<ApiError>,
}

async fn next_token(rx: &mut EventReceiver) -> u32 {
    loop {
        match rx.recv().await.expect("a token before the end") {
            Ok(InferEvent::Token { token, .. }) => return token.id,
            Ok(_) => {}
            Err(e) => panic!("error instead of a token: {e}"),
        }
    }
}

async fn receive(mut rx: EventReceiver, mut got: Received) -> Received {
    while let Some(event) = rx.recv().await {
        match event {
            Ok(InferEvent::Token { token, finish }) => {
                got.tokens.push(token.id);
                got.finish = finish;
            }
            Ok(InferEvent::Prompt { .. }) => {}
            Ok(InferEvent::End(f)) => got.finish = Some(f),
            Err(e) => got.error = Some(e),
        }
    }
    got
}

fn counting(first: u32, n: u32) -> Vec<u32> {
    (first..first + n).collect()
}

#[tokio::test]
async fn admission_keeps_within_the_kv_budget_and_serves_the_rest_after() {
    // Three requests of 50 KV tokens each under a budget of 100: two run, the third
    // waits for room instead of being sent to a shard that would refuse it.
    let shard = FakeShard::new(100);
    let scheduler = spawn(&shard, config(100), HealthCell::new());
    let rxs: Vec<_> = [100, 200, 300]
        .into_iter()
        .map(|first| scheduler.schedule(request(first, 10, 40)).unwrap())
        .collect();
    for (rx, first) in rxs.into_iter().zip([100, 200, 300]) {
        let got = receive(rx, Received::default()).await;
        assert!(got.error.is_none(), "{got:?}");
        assert_eq!(got.tokens, counting(first, 40));
        assert_eq!(got.finish, Some(FinishReason::Length));
    }
    let calls = shard.calls();
    let prefills: Vec<_> = calls
        .iter()
        .filter(|c| matches!(c, Call::Prefill(_)))
        .collect();
    assert_eq!(
        prefills,
        [&Call::Prefill(vec![0, 1]), &Call::Prefill(vec![2])]
    );
    // The third was prefilled only once the first two had finished (40 steps: a prefill
    // and 39 decodes).
    let third = calls
        .iter()
        .position(|c| c == &Call::Prefill(vec![2]))
        .unwrap();
    let decodes_before = calls[..third]
        .iter()
        .filter(|c| matches!(c, Call::Decode(_)))
        .count();
    assert_eq!(decodes_before, 39);
}

#[tokio::test]
async fn a_new_request_joins_the_running_batch() {
    let shard = FakeShard::new(10_000);
    let scheduler = spawn(&shard, config(10_000), HealthCell::new());
    let mut long = scheduler.schedule(request(100, 4, 30)).unwrap();
    let first = next_token(&mut long).await;
    let short = scheduler.schedule(request(500, 4, 3)).unwrap();
    let short = receive(short, Received::default()).await;
    assert_eq!(short.tokens, counting(500, 3));
    let long = receive(
        long,
        Received {
            tokens: vec![first],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(long.tokens, counting(100, 30));
    // The short one ran beside the long one: a decode step carried both.
    let calls = shard.calls();
    assert!(calls.contains(&Call::Decode(vec![0, 1])), "{calls:?}");
    let last_long = calls
        .iter()
        .rposition(|c| matches!(c, Call::Decode(ids) if ids.contains(&0)));
    let short_prefill = calls.iter().position(|c| c == &Call::Prefill(vec![1]));
    assert!(short_prefill < last_long, "{calls:?}");
}

#[tokio::test]
async fn a_cancelled_request_is_filtered_out_and_the_others_go_on() {
    let shard = FakeShard::new(10_000);
    let scheduler = spawn(&shard, config(10_000), HealthCell::new());
    let mut kept = scheduler.schedule(request(100, 4, 20)).unwrap();
    let mut left = scheduler.schedule(request(200, 4, 20)).unwrap();
    let first = next_token(&mut kept).await;
    next_token(&mut left).await;
    drop(left);
    let kept = receive(
        kept,
        Received {
            tokens: vec![first],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(kept.tokens, counting(100, 20));
    let calls = shard.calls();
    let filter = calls.iter().position(|c| c == &Call::Filter(vec![0]));
    let filter = filter.unwrap_or_else(|| panic!("no FilterBatch keeping request 0: {calls:?}"));
    // After the filter no step computes the request that left.
    assert!(calls[filter..]
        .iter()
        .all(|c| !matches!(c, Call::Decode(ids) if ids.contains(&1))));
    // When every request of a batch leaves, the batch is cleared rather than filtered.
    let mut only = scheduler.schedule(request(300, 4, 50)).unwrap();
    next_token(&mut only).await;
    drop(only);
    for _ in 0..100 {
        if shard.calls().contains(&Call::Clear(Some(1))) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!(
        "the batch of a cancelled request was never cleared: {:?}",
        shard.calls()
    );
}

#[tokio::test]
async fn a_shard_error_fails_every_request_of_the_step_and_serving_goes_on() {
    let shard = FakeShard::new(10_000);
    let health = HealthCell::new();
    health.set(Health::Ready);
    let scheduler = spawn(&shard, config(10_000), health.clone());
    shard.fail_decode(3, tonic::Code::Internal);
    let a = scheduler.schedule(request(100, 4, 20)).unwrap();
    let b = scheduler.schedule(request(200, 4, 20)).unwrap();
    for (rx, first) in [(a, 100), (b, 200)] {
        let got = receive(rx, Received::default()).await;
        // The prefill and two decodes succeeded: three tokens, then the error.
        assert_eq!(got.tokens, counting(first, 3));
        let error = got.error.expect("the failure reaches the request");
        assert!(
            matches!(error, ApiError::Generation(ref m) if m.contains("injected failure")),
            "{error}"
        );
        assert_eq!(got.finish, None);
    }
    assert!(shard.calls().contains(&Call::Clear(None)));
    // A request refused by the shard is not a dead shard: health stays 200 and the next
    // request is served.
    assert_eq!(health.get(), Health::Ready);
    let c = receive(
        scheduler.schedule(request(300, 4, 5)).unwrap(),
        Received::default(),
    )
    .await;
    assert_eq!(c.tokens, counting(300, 5));
}

/// A serving scheduler whose shard goes away under a request's first decode: what the
/// request received, the scheduler and its health.
async fn shard_gone(shard: &FakeShard) -> (Received, Scheduler, HealthCell) {
    let health = HealthCell::new();
    health.set(Health::Ready);
    let scheduler = spawn(shard, config(10_000), health.clone());
    shard.fail_decode(1, tonic::Code::Unavailable);
    let got = receive(
        scheduler.schedule(request(100, 4, 5)).unwrap(),
        Received::default(),
    )
    .await;
    (got, scheduler, health)
}

#[tokio::test]
async fn a_shard_that_is_gone_turns_health_to_503() {
    let (got, _scheduler, health) = shard_gone(&FakeShard::new(10_000)).await;
    assert_eq!(got.tokens, [100]);
    assert!(got.error.is_some());
    assert_eq!(health.get(), Health::ShardFailed);
}

#[tokio::test]
async fn a_shard_back_after_a_failure_is_asked_info_and_warmed_before_health_is_200() {
    let shard = FakeShard::new(10_000);
    let (got, scheduler, health) = shard_gone(&shard).await;
    assert!(got.error.is_some());
    assert_eq!(health.get(), Health::ShardFailed);
    // The idle scheduler probes every second; the shard answers again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while health.get() != Health::Ready {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never healthy again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let calls = shard.calls();
    let info = calls.iter().position(|c| *c == Call::Info);
    let warmup = calls.iter().position(|c| *c == Call::Warmup);
    assert!(
        info.is_some() && warmup > info,
        "health turned 200 without Info then Warmup: {calls:?}"
    );
    let c = receive(
        scheduler.schedule(request(300, 4, 3)).unwrap(),
        Received::default(),
    )
    .await;
    assert_eq!(c.tokens, counting(300, 3));
}

#[tokio::test]
async fn a_shard_back_with_another_model_fails_the_server_for_good() {
    let shard = FakeShard::new(10_000);
    let (_, _scheduler, health) = shard_gone(&shard).await;
    shard.serve_model("another");
    let reason = tokio::time::timeout(Duration::from_secs(5), health.failure())
        .await
        .expect("the mismatch stops the server");
    assert_eq!(health.get(), Health::Failed);
    assert!(
        reason.contains("another") && reason.contains("refusing"),
        "{reason}"
    );
    // Final: a later recovery does not undo it.
    health.set(Health::Ready);
    assert_eq!(health.get(), Health::Failed);
}
