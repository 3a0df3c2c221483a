//! Startup: load the tokenizer, wait for the shards, read the model facts, warm up,
//! resolve the limits, start the scheduler. The HTTP port is already serving 503s.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use sonde_proto::FlagValue;
use sonde_tokenizer::ModelTokenizer;

use crate::client::ShardClients;
use crate::config::{input_limits, serving, RouterConfig, Serving, ShardFacts, ShardsConfig};
use crate::scheduler::{Handshake, Scheduler};
use crate::shard::Shard;
use crate::state::{AppState, Info, Ready};
use crate::validation::Validator;

/// Prompt tokens of the warmup batch.
const WARMUP_TOKENS: u32 = 64;

pub async fn start(config: &RouterConfig, state: &AppState) -> anyhow::Result<()> {
    let model = config.server.model_path.clone();
    let tokenizer = tokio::task::spawn_blocking(move || load_tokenizer(&model))
        .await
        .context("the tokenizer task failed")??;
    let client = connect(&config.shards).await?;
    let info = client
        .info()
        .await
        .context("asking the shard for the model's facts")?;
    let shard_info = info.clone();
    let facts = ShardFacts {
        max_context: info.max_context,
        vocab_size: info.vocab_size,
        max_label_tokens: info.max_label_tokens,
    };
    let input = input_limits(config, &facts).map_err(anyhow::Error::msg)?;
    // The shard allocates KV caches per request as it admits them, so a full-size warmup
    // batch would preallocate nothing; on a CPU it would only cost a minute of startup
    // (quadratic attention over a 4k prompt). A short one runs every kernel once.
    let warm = WARMUP_TOKENS.min(input.max_input_tokens);
    let shard_kv_budget = client.warmup(warm).await.context("warming up the shard")?;
    let Serving { limits, batching } = serving(config, &facts, input, shard_kv_budget);
    tracing::info!(
        model = %info.model_id,
        max_input_tokens = limits.max_input_tokens,
        max_total_tokens = limits.max_total_tokens,
        max_batch_prefill_tokens = batching.max_batch_prefill_tokens,
        max_batch_total_tokens = batching.max_batch_total_tokens,
        "shards warm; serving"
    );
    let cfg = &state.config;
    let num_shard = client.num_shard();
    let info = Info {
        model_id: cfg.model_id.clone(),
        model_dtype: info.dtype,
        model_device_type: info.device,
        architecture: info.architecture,
        weights_format: info.weights_format,
        vocab_size: info.vocab_size,
        max_context: info.max_context,
        max_input_tokens: limits.max_input_tokens,
        max_total_tokens: limits.max_total_tokens,
        max_concurrent_requests: cfg.max_concurrent_requests,
        max_best_of: limits.max_best_of,
        max_stop_sequences: limits.max_stop_sequences,
        max_top_n_tokens: limits.max_top_n_tokens,
        max_label_tokens: limits.max_label_tokens,
        max_batch_prefill_tokens: batching.max_batch_prefill_tokens,
        max_batch_total_tokens: batching.max_batch_total_tokens,
        waiting_served_ratio: batching.waiting_served_ratio,
        max_waiting_tokens: batching.max_waiting_tokens,
        enable_prefill_logprobs: limits.enable_prefill_logprobs,
        prefix_caching: info.prefix_caching,
        prefix_block_tokens: info.prefix_block_tokens,
        logprobs_mode: limits.default_logprobs_mode.flag_value(),
        max_vertex_instances: cfg.max_vertex_instances,
        max_score_items: cfg.max_score_items,
        max_response_bytes: cfg.max_response_bytes,
        payload_limit: cfg.payload_limit,
        http: (&cfg.http).into(),
        num_shard,
        router: "sonde-router".to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
    };
    let handshake = Handshake {
        info: shard_info,
        warmup_tokens: warm,
    };
    let scheduler = Scheduler::spawn(client, batching, state.health_cell(), handshake);
    state.set_ready(Ready {
        validator: Validator::new(Arc::new(tokenizer), limits),
        backend: Arc::new(scheduler),
        info,
    });
    Ok(())
}

fn load_tokenizer(model: &Path) -> anyhow::Result<ModelTokenizer> {
    let tokenizer = if model.is_dir() {
        ModelTokenizer::from_hf_dir(model)
    } else {
        ModelTokenizer::from_gguf_file(model)
    };
    tokenizer.with_context(|| format!("loading the tokenizer of {}", model.display()))
}

/// The shards start at the same time as the router: retry until their sockets answer.
async fn connect(shards: &ShardsConfig) -> anyhow::Result<ShardClients> {
    let deadline = Instant::now() + shards.startup_timeout;
    let mut last_error = None;
    while Instant::now() < deadline {
        match ShardClients::connect(&shards.uds_prefix, shards.num_shard).await {
            Ok(client) => match client.health().await {
                Ok(()) => return Ok(client),
                Err(e) => last_error = Some(e.to_string()),
            },
            Err(e) => last_error = Some(e.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(anyhow!(
        "no shard answered at {} within --shard-startup-timeout ({} s): {}",
        sonde_proto::shard_socket(&shards.uds_prefix, 0).display(),
        shards.startup_timeout.as_secs(),
        last_error.unwrap_or_default()
    ))
}
