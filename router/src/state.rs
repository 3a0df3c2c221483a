//! The state every handler shares: configuration, health, and — once the shards are warm —
//! the validator and the backend.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use utoipa::ToSchema;

use crate::config::ServerConfig;
use crate::error::ApiError;
use crate::http::HttpLimits;
use crate::infer::Backend;
use crate::validation::Validator;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Health {
    Starting = 0,
    Ready = 1,
    Draining = 2,
    ShardFailed = 3,
    /// A restarted shard does not serve what the router was started for: the router stops
    /// (and the launcher with it) rather than serve it.
    Failed = 4,
}

/// What only exists once the shards answered Info and Warmup.
pub struct Ready {
    pub validator: Validator,
    pub backend: Arc<dyn Backend>,
    pub info: Info,
}

/// `GET /info`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Info {
    pub model_id: String,
    pub model_dtype: String,
    pub model_device_type: String,
    pub architecture: String,
    pub weights_format: String,
    pub vocab_size: u32,
    pub max_context: u32,
    pub max_input_tokens: u32,
    pub max_total_tokens: u32,
    pub max_concurrent_requests: usize,
    pub max_best_of: u32,
    pub max_stop_sequences: usize,
    pub max_top_n_tokens: u32,
    pub max_label_tokens: u32,
    pub max_batch_prefill_tokens: u32,
    pub max_batch_total_tokens: u32,
    pub waiting_served_ratio: f32,
    pub max_waiting_tokens: u32,
    pub enable_prefill_logprobs: bool,
    /// Whether the shard's automatic prefix cache is on (`PREFIX_CACHING`).
    pub prefix_caching: bool,
    /// Prompt tokens per cached block: prefixes are reused in whole blocks.
    pub prefix_block_tokens: u32,
    /// `raw` or `processed`: what `logprob` means when a request does not say.
    pub logprobs_mode: String,
    pub max_vertex_instances: usize,
    pub max_score_items: usize,
    pub max_response_bytes: usize,
    pub payload_limit: usize,
    #[serde(flatten)]
    pub http: HttpInfo,
    pub num_shard: usize,
    pub router: String,
    pub version: String,
}

/// The connection limits in force, in `/info`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HttpInfo {
    /// Open HTTP connections at most (`--max-connections`, within the open-files limit).
    pub max_connections: usize,
    /// Seconds a request's headers may take (`--http-header-timeout`).
    pub http_header_timeout: u64,
    /// Seconds a request's body may take (`--http-body-timeout`).
    pub http_body_timeout: u64,
    /// Seconds a keep-alive connection may stay idle (`--http-idle-timeout`).
    pub http_idle_timeout: u64,
    /// Seconds an answer may stay blocked on a client that reads nothing
    /// (`--http-write-timeout`).
    pub http_write_timeout: u64,
}

impl From<&HttpLimits> for HttpInfo {
    fn from(l: &HttpLimits) -> Self {
        Self {
            max_connections: l.max_connections,
            http_header_timeout: l.header_timeout.as_secs(),
            http_body_timeout: l.body_timeout.as_secs(),
            http_idle_timeout: l.idle_timeout.as_secs(),
            http_write_timeout: l.write_timeout.as_secs(),
        }
    }
}

/// The server's health, shared by the handlers and the scheduler (which sees a shard
/// fail and come back, or come back as something else).
#[derive(Clone, Debug)]
pub struct HealthCell(Arc<HealthInner>);

#[derive(Debug)]
struct HealthInner {
    state: AtomicU8,
    /// Why the server failed for good, once it has.
    failure: Mutex<Option<String>>,
    failed: Notify,
}

impl HealthCell {
    pub fn new() -> Self {
        Self(Arc::new(HealthInner {
            state: AtomicU8::new(Health::Starting as u8),
            failure: Mutex::new(None),
            failed: Notify::new(),
        }))
    }

    pub fn get(&self) -> Health {
        match self.0.state.load(Ordering::Acquire) {
            1 => Health::Ready,
            2 => Health::Draining,
            3 => Health::ShardFailed,
            4 => Health::Failed,
            _ => Health::Starting,
        }
    }

    pub fn set(&self, health: Health) {
        // Draining and Failed are final: a shard coming back must not undo them.
        let _ = self
            .0
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                let fin = now == Health::Draining as u8 || now == Health::Failed as u8;
                (!fin).then_some(health as u8)
            });
    }

    /// Fails the server for good: health 503 with `reason`, and [`HealthCell::failure`]
    /// resolves, which stops the server with it.
    pub fn fail(&self, reason: String) {
        // The reason first: whoever sees Failed can read it.
        *self.0.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
        self.set(Health::Failed);
        self.0.failed.notify_one();
    }

    /// Why the server failed for good, once it has.
    pub async fn failure(&self) -> String {
        loop {
            let reason = self.reason();
            if let Some(reason) = reason {
                return reason;
            }
            self.0.failed.notified().await;
        }
    }

    pub fn reason(&self) -> Option<String> {
        self.0
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Default for HealthCell {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Clone)]
pub struct AppState {
    pub config: Arc<ServerConfig>,
    health: HealthCell,
    ready: Arc<OnceLock<Ready>>,
    limiter: Arc<Semaphore>,
    pub metrics: PrometheusHandle,
}

impl AppState {
    pub fn new(config: ServerConfig) -> Self {
        let limiter = Arc::new(Semaphore::new(config.max_concurrent_requests));
        Self {
            config: Arc::new(config),
            health: HealthCell::new(),
            ready: Arc::new(OnceLock::new()),
            limiter,
            metrics: crate::metrics::handle(),
        }
    }

    pub fn health(&self) -> Health {
        self.health.get()
    }

    pub fn set_health(&self, health: Health) {
        self.health.set(health);
    }

    /// The cell the scheduler reports shard failures and recoveries to.
    pub fn health_cell(&self) -> HealthCell {
        self.health.clone()
    }

    /// Makes the server ready (once).
    pub fn set_ready(&self, ready: Ready) {
        if self.ready.set(ready).is_ok() {
            self.set_health(Health::Ready);
        }
    }

    /// The backend, or 503 while starting or draining.
    pub fn ready(&self) -> Result<&Ready, ApiError> {
        match (self.health(), self.ready.get()) {
            (Health::Draining, _) => Err(ApiError::NotReady(
                "the server is shutting down".to_string(),
            )),
            (Health::ShardFailed, _) => Err(ApiError::NotReady(
                "a shard failed and is coming back; retry shortly".into(),
            )),
            (Health::Failed, _) => Err(ApiError::NotReady(format!(
                "the server is stopping: {}",
                self.health.reason().unwrap_or_default()
            ))),
            (_, Some(ready)) => Ok(ready),
            (_, None) => Err(ApiError::NotReady(sonde_common::LOADING_MESSAGE.into())),
        }
    }

    /// The backend if ready, whatever the health (for `/info`).
    pub fn ready_info(&self) -> Option<&Info> {
        self.ready.get().map(|r| &r.info)
    }

    /// Waits until no request is in flight, or the drain timeout passed.
    pub async fn wait_idle(&self) {
        let deadline = tokio::time::Instant::now() + self.config.drain_timeout;
        let all = self.config.max_concurrent_requests;
        while self.limiter.available_permits() < all && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let left = all - self.limiter.available_permits();
        if left > 0 {
            tracing::warn!(
                in_flight = left,
                "drain timeout: stopping with requests still in flight"
            );
        }
    }

    /// A slot for `n` concurrent generations, or 429.
    pub fn permit(&self, n: u32) -> Result<OwnedSemaphorePermit, ApiError> {
        let max = self.config.max_concurrent_requests;
        if n as usize > max {
            return Err(ApiError::Validation(format!(
                "the request needs {n} concurrent generations, more than --max-concurrent-requests ({max})"
            )));
        }
        self.limiter.clone().try_acquire_many_owned(n).map_err(|_| {
            ApiError::Overloaded(format!(
                "the server already has --max-concurrent-requests ({max}) requests in flight; retry later"
            ))
        })
    }
}
