//! The whole axum app over a fake backend: real validation and tokenizer, scripted tokens.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, Response, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::Value;
use sonde_proto::LogprobsMode;
use sonde_router::config::ServerConfig;
use sonde_router::error::ApiError;
use sonde_router::http::HttpLimits;
use sonde_router::infer::{
    Backend, EventReceiver, FinishReason, InferEvent, TokenScore, ValidRequest,
};
use sonde_router::state::{AppState, Info, Ready};
use sonde_router::validation::{ValidationLimits, Validator};
use sonde_tokenizer::ModelTokenizer;
use tokio::sync::mpsc;
use tower::ServiceExt;

pub fn model_path() -> PathBuf {
    sonde_testdata::smollm2_gguf()
}

pub fn tokenizer() -> Arc<ModelTokenizer> {
    static TOKENIZER: OnceLock<Arc<ModelTokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| Arc::new(ModelTokenizer::from_gguf_file(&model_path()).expect("tokenizer")))
        .clone()
}

/// What every fake generation says, token after token, repeated as needed.
pub const SCRIPT: &str = " Hello world, this is a test.";

pub fn script_ids() -> Vec<u32> {
    tokenizer().encode(SCRIPT, false).expect("script ids")
}

/// The id of generated token `i`.
pub fn script_id(i: usize) -> u32 {
    let ids = script_ids();
    ids[i % ids.len()]
}

/// The text of the first `n` generated tokens.
pub fn script_text(n: usize) -> String {
    let bytes: Vec<u8> = (0..n)
        .flat_map(|i| {
            tokenizer()
                .token_bytes(script_id(i))
                .expect("bytes")
                .to_vec()
        })
        .collect();
    String::from_utf8(bytes).expect("utf-8 script")
}

pub const TOKEN_LOGPROB: f32 = -0.5;
pub const LABEL_LOGPROB: f32 = -2.0;

type EventSender = mpsc::UnboundedSender<Result<InferEvent, ApiError>>;

/// A backend that answers every request with the script, and remembers what it was asked.
#[derive(Clone, Default)]
pub struct FakeBackend {
    pub requests: Arc<Mutex<Vec<ValidRequest>>>,
    pub senders: Arc<Mutex<Vec<EventSender>>>,
    /// Tokens the fake actually sent, over all requests.
    pub sent: Arc<AtomicU32>,
    /// Fail with a shard error after this many tokens.
    pub fail_after: Option<u32>,
    /// Pause between tokens (stopping early if the receiver goes away).
    pub delay: Option<Duration>,
}

impl FakeBackend {
    pub fn paced(ms: u64) -> Self {
        let delay = Some(Duration::from_millis(ms));
        Self {
            delay,
            ..Self::default()
        }
    }

    pub fn failing_after(tokens: u32) -> Self {
        let fail_after = Some(tokens);
        Self {
            fail_after,
            ..Self::default()
        }
    }

    pub fn requests(&self) -> Vec<ValidRequest> {
        self.requests.lock().expect("lock").clone()
    }

    pub fn last(&self) -> ValidRequest {
        self.requests().pop().expect("a scheduled request")
    }
}

fn score(id: u32, logprob: Option<f32>, r: &ValidRequest) -> TokenScore {
    let s = &r.scores;
    // Alternatives that never repeat the chosen id, in descending logprob.
    let others = (100u32..).filter(|&o| o != id);
    let top = std::iter::once(id)
        .chain(others)
        .take(s.top_n_tokens as usize)
        .enumerate()
        .map(|(k, t)| (t, TOKEN_LOGPROB - k as f32))
        .collect();
    TokenScore {
        id,
        logprob,
        logit: s.return_logits.then_some(3.0),
        rank: s.return_logits.then_some(1),
        top,
        labels: s.label_ids.iter().map(|_| LABEL_LOGPROB).collect(),
    }
}

impl Backend for FakeBackend {
    fn schedule(&self, request: ValidRequest) -> Result<EventReceiver, ApiError> {
        self.requests.lock().expect("lock").push(request.clone());
        let (tx, rx) = mpsc::unbounded_channel();
        self.senders.lock().expect("lock").push(tx.clone());
        let fake = self.clone();
        tokio::spawn(async move {
            let r = request;
            let prompt = if r.scores.prefill_logprobs {
                let first = |i: usize| (i > 0).then_some(-1.0);
                r.input_ids
                    .iter()
                    .enumerate()
                    .map(|(i, &id)| score(id, first(i), &r))
                    .collect()
            } else {
                Vec::new()
            };
            // As if the prefix cache held all but the last prompt token.
            let cached_tokens = r.input_ids.len().saturating_sub(1) as u32;
            let _ = tx.send(Ok(InferEvent::Prompt {
                scores: prompt,
                cached_tokens,
            }));
            if r.max_new_tokens == 0 {
                let _ = tx.send(Ok(InferEvent::End(FinishReason::Length)));
            }
            for i in 0..r.max_new_tokens {
                if fake.fail_after == Some(i) {
                    let _ = tx.send(Err(ApiError::Generation("shard 0 failed: fake".into())));
                    return;
                }
                if let Some(delay) = fake.delay {
                    tokio::select! {
                        _ = tx.closed() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
                let last = i + 1 == r.max_new_tokens;
                let token = score(script_id(i as usize), Some(TOKEN_LOGPROB), &r);
                let finish = last.then_some(FinishReason::Length);
                if tx.send(Ok(InferEvent::Token { token, finish })).is_err() {
                    return;
                }
                fake.sent.fetch_add(1, Ordering::SeqCst);
            }
        });
        Ok(rx)
    }
}

pub fn config() -> ServerConfig {
    ServerConfig {
        hostname: "127.0.0.1".into(),
        port: 0,
        listen_fd: None,
        predict_route: "/predict".into(),
        health_route: "/health".into(),
        api_key: None,
        payload_limit: 100_000,
        max_concurrent_requests: 16,
        max_vertex_instances: 4,
        max_score_items: 4,
        max_response_bytes: 1_500_000,
        model_path: model_path(),
        model_id: "smollm2-test".into(),
        drain_timeout: Duration::from_secs(1),
        http: HttpLimits {
            max_connections: 64,
            header_timeout: Duration::from_secs(2),
            body_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(3),
            write_timeout: Duration::from_secs(2),
        },
    }
}

pub fn limits() -> ValidationLimits {
    ValidationLimits {
        max_input_tokens: 1000,
        max_total_tokens: 1100,
        max_top_n_tokens: 5,
        max_best_of: 2,
        max_stop_sequences: 4,
        max_label_tokens: 8,
        enable_prefill_logprobs: true,
        default_logprobs_mode: LogprobsMode::Raw,
        default_max_new_tokens: 8,
        vocab_size: tokenizer().vocab_size() as u32,
        max_batch_total_tokens: u32::MAX,
    }
}

fn info(cfg: &ServerConfig, l: &ValidationLimits) -> Info {
    Info {
        model_id: cfg.model_id.clone(),
        model_dtype: "q4_1".into(),
        model_device_type: "cpu".into(),
        architecture: "llama".into(),
        weights_format: "gguf".into(),
        vocab_size: l.vocab_size,
        max_context: 2048,
        max_input_tokens: l.max_input_tokens,
        max_total_tokens: l.max_total_tokens,
        max_concurrent_requests: cfg.max_concurrent_requests,
        max_best_of: l.max_best_of,
        max_stop_sequences: l.max_stop_sequences,
        max_top_n_tokens: l.max_top_n_tokens,
        max_label_tokens: l.max_label_tokens,
        max_batch_prefill_tokens: 4096,
        max_batch_total_tokens: l.max_batch_total_tokens,
        waiting_served_ratio: 0.3,
        max_waiting_tokens: 20,
        enable_prefill_logprobs: l.enable_prefill_logprobs,
        prefix_caching: true,
        prefix_block_tokens: 16,
        logprobs_mode: "raw".into(),
        max_vertex_instances: cfg.max_vertex_instances,
        max_score_items: cfg.max_score_items,
        max_response_bytes: cfg.max_response_bytes,
        payload_limit: cfg.payload_limit,
        http: (&cfg.http).into(),
        num_shard: 1,
        router: "sonde-router".into(),
        version: "test".into(),
    }
}

pub fn make_ready(state: &AppState, backend: Arc<dyn Backend>) {
    let l = limits();
    state.set_ready(Ready {
        validator: Validator::new(tokenizer(), l.clone()),
        backend,
        info: info(&state.config, &l),
    });
}

/// A ready app over `fake` with `config`.
pub fn app_with(config: ServerConfig, fake: &FakeBackend) -> Router {
    let state = AppState::new(config);
    make_ready(&state, Arc::new(fake.clone()));
    sonde_router::server::app(state).expect("routes")
}

pub fn app(fake: &FakeBackend) -> Router {
    app_with(config(), fake)
}

pub async fn send(app: &Router, request: Request<Body>) -> Response<Body> {
    app.clone().oneshot(request).await.expect("infallible")
}

pub fn post(path: &str, body: &Value) -> Request<Body> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("request")
}

pub fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).expect("request")
}

pub async fn text(response: Response<Body>) -> String {
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    String::from_utf8(bytes.to_vec()).expect("utf-8 body")
}

/// Status and JSON body (Null when the body is empty).
pub async fn call(app: &Router, request: Request<Body>) -> (StatusCode, Value) {
    let response = send(app, request).await;
    let status = response.status();
    let body = text(response).await;
    let json = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
    };
    (status, json)
}

pub async fn post_json(app: &Router, path: &str, body: Value) -> (StatusCode, Value) {
    call(app, post(path, &body)).await
}

/// The `data:` payloads of an SSE body, in order.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.trim_start().to_string())
        .collect()
}

/// An SSE response's events as JSON (`[DONE]` kept as a string).
pub async fn events(app: &Router, path: &str, body: Value) -> Vec<Value> {
    let response = send(app, post(path, &body)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()[header::CONTENT_TYPE]
        .to_str()
        .unwrap_or("")
        .to_string();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    sse_data(&text(response).await)
        .into_iter()
        .map(|d| serde_json::from_str(&d).unwrap_or(Value::String(d)))
        .collect()
}

/// A TGI body for the prompt "Hi".
pub fn gen(parameters: Value) -> Value {
    serde_json::json!({"inputs": "Hi", "parameters": parameters})
}

pub fn len(v: &Value) -> usize {
    v.as_array().map_or(0, Vec::len)
}

pub fn error_text(body: &Value) -> &str {
    body["error"].as_str().unwrap_or_default()
}

pub fn assert_error(status: StatusCode, body: &Value, want: StatusCode, error_type: &str) {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["error_type"], error_type, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{body}"
    );
}
