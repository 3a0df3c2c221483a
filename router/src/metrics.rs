//! Prometheus metrics: names in one place, the recorder installed once per process.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Counter `{route, method, status}` of answered HTTP requests.
pub const REQUEST_COUNT: &str = "sonde_request_count";
/// Histogram `{route}` of whole-request latency.
pub const REQUEST_DURATION: &str = "sonde_request_duration_seconds";
/// Gauge: requests waiting to be prefilled.
pub const QUEUE_SIZE: &str = "sonde_queue_size";
/// Gauge: requests in the running batch.
pub const BATCH_SIZE: &str = "sonde_batch_current_size";
/// Gauge: KV tokens the running batch reserves.
pub const BATCH_RESERVED_TOKENS: &str = "sonde_batch_reserved_tokens";
/// Histogram: from queueing to the first generated token.
pub const TIME_TO_FIRST_TOKEN: &str = "sonde_request_time_to_first_token_seconds";
/// Histogram: between two tokens of one request.
pub const INTER_TOKEN_LATENCY: &str = "sonde_request_inter_token_latency_seconds";
/// Histogram `{method="prefill"|"decode"}`: one shard call, as the router sees it.
pub const STEP_DURATION: &str = "sonde_batch_step_duration_seconds";
/// Histogram `{method}`: the forward pass inside the shard.
pub const FORWARD_DURATION: &str = "sonde_batch_forward_duration_seconds";
/// Counter: prompt tokens admitted.
pub const INPUT_TOKENS: &str = "sonde_request_input_tokens_total";
/// Counter: tokens generated.
pub const GENERATED_TOKENS: &str = "sonde_request_generated_tokens_total";
/// Counter: prompt tokens the shard's prefix cache supplied instead of computing them.
pub const PREFIX_CACHE_HIT_TOKENS: &str = "sonde_prefix_cache_hit_tokens_total";
/// Counter: tokens evicted from the prefix cache (least recently used first).
pub const PREFIX_CACHE_EVICTED_TOKENS: &str = "sonde_prefix_cache_evicted_tokens_total";
/// Gauge: tokens in the prefix cache.
pub const PREFIX_CACHE_TOKENS: &str = "sonde_prefix_cache_tokens";
/// Counter: draft tokens the shard fed to decode steps (speculative decoding).
pub const SPECULATIVE_DRAFTED_TOKENS: &str = "sonde_speculative_drafted_tokens_total";
/// Counter: draft tokens that were the token generated at their position.
pub const SPECULATIVE_ACCEPTED_TOKENS: &str = "sonde_speculative_accepted_tokens_total";
/// Gauge: open HTTP connections.
pub const HTTP_CONNECTIONS: &str = "sonde_http_connections";
/// Counter: connections refused because `--max-connections` were open.
pub const HTTP_CONNECTIONS_REFUSED: &str = "sonde_http_connections_refused_total";
/// Counter `{kind="header"|"body"|"idle"|"write"}`: connections or requests ended by an
/// HTTP time limit.
pub const HTTP_TIMEOUTS: &str = "sonde_http_timeouts_total";
/// Counter `{reason}`: requests that ended with an error inside the scheduler.
pub const FAILED_REQUESTS: &str = "sonde_request_failure_total";

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process's recorder, installed on first call. The metrics facade is global by
/// design, so every server in one process (tests start several) shares it.
pub fn handle() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new();
            // Only fails for an empty bucket list, which LATENCY_BUCKETS is not.
            let builder = match builder
                .set_buckets_for_metric(Matcher::Suffix("_seconds".to_string()), LATENCY_BUCKETS)
            {
                Ok(b) => b,
                Err(_) => PrometheusBuilder::new(),
            };
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("another metrics recorder is installed; /metrics will be empty");
            }
            spawn_upkeep(handle.clone());
            handle
        })
        .clone()
}

/// How often recorded histogram samples are folded into their buckets.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// A recorder from `build_recorder` keeps every histogram sample until something drains
/// it: a scrape of /metrics, or this upkeep (what `install_recorder` would run). Without
/// it a server nobody scrapes (Vertex AI) grows by 8 bytes per sample, several per
/// generated token: ~0.3 MB a minute in the soak (docs/RELIABILITY.md).
fn spawn_upkeep(handle: PrometheusHandle) {
    let spawned = std::thread::Builder::new()
        .name("metrics-upkeep".to_string())
        .spawn(move || loop {
            std::thread::sleep(UPKEEP_INTERVAL);
            handle.run_upkeep();
        });
    if let Err(e) = spawned {
        tracing::warn!("could not start the metrics upkeep thread ({e}); histograms are drained only when /metrics is read");
    }
}
