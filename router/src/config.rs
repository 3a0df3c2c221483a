//! Flags → resolved configuration. The environment (`AIP_*`) is read here and nowhere
//! else; limits that depend on the model are resolved once the shard has answered `Info`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser};

use crate::http::HttpLimits;
use crate::scheduler::BatchingConfig;
use crate::validation::ValidationLimits;
pub use sonde_common::flags::LimitArgs;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "sonde-router",
    version,
    about = "Sonde's HTTP router: TGI, Vertex AI and OpenAI APIs over the shards"
)]
pub struct RouterArgs {
    /// The model the shards serve (`.gguf` file or Hugging Face folder): the router reads
    /// its tokenizer and chat template.
    #[arg(long)]
    pub model: PathBuf,
    /// Name served in `/info`, `/v1/models` and OpenAI answers (default: the file name).
    #[arg(long)]
    pub model_id: Option<String>,
    /// Shard `r` listens on `<prefix>-<r>`.
    #[arg(long, default_value = sonde_proto::DEFAULT_SHARD_UDS_PREFIX)]
    pub shard_uds_path: PathBuf,
    #[arg(long, default_value_t = 1)]
    pub num_shard: usize,
    #[arg(long, default_value = "0.0.0.0")]
    pub hostname: String,
    /// HTTP port; `AIP_HTTP_PORT` (set by Vertex AI) wins over it.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Serve on this inherited, already listening TCP socket instead of binding
    /// --hostname/--port: the launcher hands over the port it answered 503 on while the
    /// model loaded, so the port never refuses a connection.
    #[arg(long, hide = true)]
    pub listen_fd: Option<i32>,
    /// Require `Authorization: Bearer <key>` on inference routes.
    #[arg(long, env = "API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Log as JSON lines.
    #[arg(long)]
    pub json_output: bool,
    /// Seconds in-flight requests get to finish after SIGTERM (health is 503 meanwhile).
    #[arg(long, default_value_t = 90)]
    pub graceful_termination_timeout: u64,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub batching: BatchingArgs,
}

#[derive(Args, Debug, Clone)]
pub struct BatchingArgs {
    /// Prompt tokens in one prefill (default: 4096, or max input tokens if larger).
    #[arg(long)]
    pub max_batch_prefill_tokens: Option<u32>,
    /// KV tokens over all running requests (default: what the shard reports).
    #[arg(long)]
    pub max_batch_total_tokens: Option<u32>,
    /// Interrupt the running batch for a prefill only if the waiting requests number at
    /// least this ratio of the running ones...
    #[arg(long, default_value_t = 0.3)]
    pub waiting_served_ratio: f32,
    /// ...or they have waited this many decode steps.
    #[arg(long, default_value_t = 20)]
    pub max_waiting_tokens: u32,
    /// Seconds a shard may take for one batch step before its requests fail with 424.
    #[arg(long, default_value_t = 120)]
    pub shard_step_timeout: u64,
    /// Seconds to wait for the shards to come up and warm.
    #[arg(long, default_value_t = 600)]
    pub shard_startup_timeout: u64,
}

/// Everything the router runs with, resolved once from its flags and the environment.
/// What depends on the model is settled by [`input_limits`] and [`serving`] once the
/// shard has answered.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    pub server: ServerConfig,
    pub shards: ShardsConfig,
    pub limits: LimitArgs,
    pub batching: BatchingArgs,
}

/// Where the shards are and how long they may take to come up.
#[derive(Debug, Clone)]
pub struct ShardsConfig {
    pub uds_prefix: PathBuf,
    pub num_shard: usize,
    pub startup_timeout: Duration,
}

/// What the HTTP server itself needs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub hostname: String,
    pub port: u16,
    /// An inherited listening socket to serve on instead of binding hostname:port.
    pub listen_fd: Option<i32>,
    pub predict_route: String,
    pub health_route: String,
    pub api_key: Option<String>,
    pub payload_limit: usize,
    pub max_concurrent_requests: usize,
    pub max_vertex_instances: usize,
    pub max_score_items: usize,
    pub max_response_bytes: usize,
    pub model_path: PathBuf,
    pub model_id: String,
    /// How long a drain waits for in-flight requests.
    pub drain_timeout: Duration,
    /// Connections and their time limits.
    pub http: HttpLimits,
}

/// The environment variables Vertex AI sets, read once.
#[derive(Debug, Clone, Default)]
pub struct VertexEnv {
    pub http_port: Option<String>,
    pub predict_route: Option<String>,
    pub health_route: Option<String>,
}

impl VertexEnv {
    pub fn from_process() -> Self {
        Self {
            http_port: std::env::var("AIP_HTTP_PORT").ok(),
            predict_route: std::env::var("AIP_PREDICT_ROUTE").ok(),
            health_route: std::env::var("AIP_HEALTH_ROUTE").ok(),
        }
    }
}

impl RouterArgs {
    /// The configuration these flags and `env` make; the error names the bad value.
    pub fn resolve(&self, env: &VertexEnv) -> Result<RouterConfig, String> {
        Ok(RouterConfig {
            server: self.server_config(env)?,
            shards: ShardsConfig {
                uds_prefix: self.shard_uds_path.clone(),
                num_shard: self.num_shard,
                startup_timeout: Duration::from_secs(self.batching.shard_startup_timeout),
            },
            limits: self.limits.clone(),
            batching: self.batching.clone(),
        })
    }

    fn server_config(&self, env: &VertexEnv) -> Result<ServerConfig, String> {
        let port = match env.http_port.as_deref().filter(|p| !p.is_empty()) {
            Some(p) => p
                .parse()
                .map_err(|_| format!("AIP_HTTP_PORT must be a port number, got {p:?}"))?,
            None => self.port,
        };
        let route = |value: &Option<String>, default: &str, var: &str| -> Result<String, String> {
            let r = value
                .clone()
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| default.to_string());
            // axum reads `{…}`, `*` and a segment starting with `:` as captures.
            if !r.starts_with('/') || r.contains(['{', '}', '*']) || r.contains("/:") {
                return Err(format!(
                    "{var} must be a plain path starting with '/', got {r:?}"
                ));
            }
            Ok(r)
        };
        let model_id = self.model_id.clone().unwrap_or_else(|| {
            let stem = self.model.file_stem().or(self.model.file_name());
            stem.map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".to_string())
        });
        Ok(ServerConfig {
            hostname: self.hostname.clone(),
            port,
            listen_fd: self.listen_fd,
            predict_route: route(&env.predict_route, "/predict", "AIP_PREDICT_ROUTE")?,
            health_route: route(&env.health_route, "/health", "AIP_HEALTH_ROUTE")?,
            api_key: self.api_key.clone().filter(|k| !k.is_empty()),
            payload_limit: self.limits.payload_limit,
            max_concurrent_requests: self.limits.max_concurrent_requests,
            max_vertex_instances: self.limits.max_vertex_instances,
            max_score_items: self.limits.max_score_items,
            max_response_bytes: self.limits.max_response_bytes,
            model_path: self.model.clone(),
            model_id,
            drain_timeout: Duration::from_secs(self.graceful_termination_timeout),
            http: self.http_limits()?,
        })
    }

    fn http_limits(&self) -> Result<HttpLimits, String> {
        let l = &self.limits;
        let seconds = |value: u64, flag: &str| {
            if value == 0 {
                Err(format!("--{flag} must be at least 1 second"))
            } else {
                Ok(Duration::from_secs(value))
            }
        };
        if l.max_connections == 0 {
            return Err("--max-connections must be at least 1".to_string());
        }
        Ok(HttpLimits {
            max_connections: l.max_connections,
            header_timeout: seconds(l.http_header_timeout, "http-header-timeout")?,
            body_timeout: seconds(l.http_body_timeout, "http-body-timeout")?,
            idle_timeout: seconds(l.http_idle_timeout, "http-idle-timeout")?,
            write_timeout: seconds(l.http_write_timeout, "http-write-timeout")?,
        })
    }
}

/// What the shard told us about the model (`Info`).
#[derive(Debug, Clone, Copy)]
pub struct ShardFacts {
    pub max_context: u32,
    pub vocab_size: u32,
    pub max_label_tokens: u32,
}

/// Prompt limits: what the model's context allows of what the flags ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputLimits {
    pub max_input_tokens: u32,
    pub max_total_tokens: u32,
    pub max_batch_prefill_tokens: u32,
}

/// TGI's defaults and consistency checks, against the model's context. Needed before
/// warmup, which runs a prompt within them.
pub fn input_limits(config: &RouterConfig, facts: &ShardFacts) -> Result<InputLimits, String> {
    let l = &config.limits;
    let max_total_tokens = l.max_total_tokens.unwrap_or(facts.max_context.min(4096));
    if max_total_tokens > facts.max_context {
        return Err(format!(
            "--max-total-tokens {max_total_tokens} is over the model's context of {} tokens",
            facts.max_context
        ));
    }
    let max_input_tokens = l
        .max_input_tokens
        .unwrap_or(max_total_tokens.saturating_sub(1));
    if max_input_tokens == 0 || max_input_tokens >= max_total_tokens {
        return Err(format!(
            "--max-input-tokens ({max_input_tokens}) must be at least 1 and below --max-total-tokens ({max_total_tokens})"
        ));
    }
    let prefill = config
        .batching
        .max_batch_prefill_tokens
        .unwrap_or(max_input_tokens.max(4096));
    if prefill < max_input_tokens {
        return Err(format!(
            "--max-batch-prefill-tokens ({prefill}) must be at least --max-input-tokens ({max_input_tokens}), \
             or the longest prompt could never be prefilled"
        ));
    }
    Ok(InputLimits {
        max_input_tokens,
        max_total_tokens,
        max_batch_prefill_tokens: prefill,
    })
}

/// What requests are validated against and how they are batched.
#[derive(Debug, Clone)]
pub struct Serving {
    pub limits: ValidationLimits,
    pub batching: BatchingConfig,
}

/// The flags, the model's facts and the shard's KV budget (its warmup answer) combined:
/// the KV budget is the shard's, or less if `--max-batch-total-tokens` asks for less.
pub fn serving(
    config: &RouterConfig,
    facts: &ShardFacts,
    input: InputLimits,
    shard_kv_budget: u32,
) -> Serving {
    let (l, b) = (&config.limits, &config.batching);
    let max_batch_total_tokens = b
        .max_batch_total_tokens
        .map_or(shard_kv_budget, |t| t.min(shard_kv_budget));
    Serving {
        limits: ValidationLimits {
            max_input_tokens: input.max_input_tokens,
            max_total_tokens: input.max_total_tokens,
            max_top_n_tokens: l.max_top_n_tokens,
            max_best_of: l.max_best_of.max(1),
            max_stop_sequences: l.max_stop_sequences,
            max_label_tokens: facts.max_label_tokens,
            enable_prefill_logprobs: l.enable_prefill_logprobs,
            default_logprobs_mode: l.logprobs_mode,
            default_max_new_tokens: l.default_max_new_tokens,
            vocab_size: facts.vocab_size,
            max_batch_total_tokens,
        },
        batching: BatchingConfig {
            max_batch_prefill_tokens: input.max_batch_prefill_tokens,
            max_batch_total_tokens,
            waiting_served_ratio: b.waiting_served_ratio,
            max_waiting_tokens: b.max_waiting_tokens,
            step_timeout: Duration::from_secs(b.shard_step_timeout.max(1)),
        },
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
