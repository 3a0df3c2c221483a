//! The launcher's flags. Names and environment variables follow text-generation-inference's
//! launcher, so a TGI deployment's configuration carries over; Sonde's own flags follow the
//! same style. No flag has a short form, so none can collide.

use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args, Parser};
use sonde_proto::{Device, LogprobsMode, WeightQuant};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "sonde-launcher",
    version,
    about = "Starts Sonde: resolves the model, runs the shard and the router, supervises them.",
    long_about = None
)]
pub struct LauncherArgs {
    /// The model: a local `.gguf` file or Hugging Face folder, `gs://bucket/prefix`
    /// (downloaded), or a Hugging Face Hub id (downloaded). Default: `AIP_STORAGE_URI` when
    /// Vertex AI sets it, else the default model that `scripts/fetch-data` put in place.
    /// Architectures: llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3; GGUF blocks Q4_0,
    /// Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16, F32, all served exactly. Anything
    /// else (other blocks, unused tensors, unimplemented rope scaling) is refused at start-up.
    #[arg(long, env = "MODEL_ID")]
    pub model_id: Option<String>,
    /// Hub revision (branch, tag or commit) of a Hub model.
    #[arg(long, env = "REVISION")]
    pub revision: Option<String>,
    /// Shards (tensor-parallel ranks). Only 1 exists today.
    #[arg(long, env = "NUM_SHARD", default_value_t = 1)]
    pub num_shard: usize,
    /// HTTP port; `AIP_HTTP_PORT` (set by Vertex AI) wins over it.
    #[arg(long, env = "PORT", default_value_t = 8080)]
    pub port: u16,
    /// Address to listen on. (The shell's `HOSTNAME` is the machine's name, so it is not read.)
    #[arg(long, default_value = "0.0.0.0")]
    pub hostname: String,
    /// Shard `r` listens on the Unix socket `<path>-<r>`.
    #[arg(long, env = "SHARD_UDS_PATH", default_value = sonde_proto::DEFAULT_SHARD_UDS_PREFIX)]
    pub shard_uds_path: PathBuf,
    /// Where downloaded models are kept (gs:// and Hub).
    #[arg(long, env = "SONDE_CACHE_DIR")]
    pub model_cache_dir: Option<PathBuf>,
    /// Weights as served: `auto` keeps the file's formats (exact scores for its weights);
    /// `q8_0` re-quantizes Q4/Q5 GGUF matrices to Q8_0 at load.
    #[arg(long, env = "DTYPE", value_enum, default_value_t = WeightQuant::Keep)]
    pub dtype: WeightQuant,
    /// Where the model runs (`cuda` needs a build with `--features cuda`).
    #[arg(long, env = "DEVICE", value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
    /// Require `Authorization: Bearer <key>` on the inference routes.
    #[arg(long, env = "API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Log as JSON lines (the launcher's own lines and its children's).
    #[arg(long, env = "JSON_OUTPUT")]
    pub json_output: bool,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub batching: BatchingArgs,
    #[command(flatten)]
    pub supervision: SupervisionArgs,
}

#[derive(Args, Debug, Clone)]
pub struct LimitArgs {
    /// Requests in flight at once; more get 429.
    #[arg(long, env = "MAX_CONCURRENT_REQUESTS", default_value_t = 128)]
    pub max_concurrent_requests: usize,
    /// Largest `best_of` (and OpenAI `n`).
    #[arg(long, env = "MAX_BEST_OF", default_value_t = 2)]
    pub max_best_of: u32,
    /// Most stop sequences per request.
    #[arg(long, env = "MAX_STOP_SEQUENCES", default_value_t = 4)]
    pub max_stop_sequences: usize,
    /// Largest `top_n_tokens` (OpenAI `logprobs`/`top_logprobs`).
    #[arg(long, env = "MAX_TOP_N_TOKENS", default_value_t = 5)]
    pub max_top_n_tokens: u32,
    /// Most prompt tokens (default: max total tokens - 1).
    #[arg(long, env = "MAX_INPUT_TOKENS")]
    pub max_input_tokens: Option<u32>,
    /// Most prompt + generated tokens (default: the model's context, at most 4096).
    #[arg(long, env = "MAX_TOTAL_TOKENS")]
    pub max_total_tokens: Option<u32>,
    /// `max_new_tokens` of a request that sets none (capped by what the context leaves).
    #[arg(long, env = "DEFAULT_MAX_NEW_TOKENS", default_value_t = 256)]
    pub default_max_new_tokens: u32,
    /// Allow prompt logprobs (`decoder_input_details`, OpenAI `echo` with `logprobs`).
    #[arg(long, env = "ENABLE_PREFILL_LOGPROBS")]
    pub enable_prefill_logprobs: bool,
    /// What `logprob` means when a request does not say: `raw` (the model's distribution)
    /// or `processed` (after penalties and warpers: what was sampled from).
    #[arg(long, env = "LOGPROBS_MODE", value_enum, default_value_t = LogprobsMode::Raw)]
    pub logprobs_mode: LogprobsMode,
    /// Most instances in one Vertex AI predict call.
    #[arg(long, env = "MAX_VERTEX_INSTANCES", default_value_t = 128)]
    pub max_vertex_instances: usize,
    /// Most items in one `/v1/score` call.
    #[arg(long, env = "MAX_SCORE_ITEMS", default_value_t = 128)]
    pub max_score_items: usize,
    /// Largest Vertex AI predict answer in bytes (Vertex's shared endpoints allow 1.5 MB).
    #[arg(long, env = "MAX_RESPONSE_BYTES", default_value_t = 1_500_000)]
    pub max_response_bytes: usize,
    /// Largest request body in bytes.
    #[arg(long, env = "PAYLOAD_LIMIT", default_value_t = 2_000_000)]
    pub payload_limit: usize,
}

#[derive(Args, Debug, Clone)]
pub struct BatchingArgs {
    /// Prompt tokens in one prefill (default: 4096, or max input tokens if larger).
    #[arg(long, env = "MAX_BATCH_PREFILL_TOKENS")]
    pub max_batch_prefill_tokens: Option<u32>,
    /// KV-cache tokens over every running request: prompt + max_new_tokens each.
    #[arg(long, env = "MAX_BATCH_TOTAL_TOKENS", default_value_t = 16_384)]
    pub max_batch_total_tokens: u32,
    /// The automatic prefix cache (`true`/`false`, `1`/`0`): prompt tokens an earlier
    /// request computed are reused, with bit-identical scores, in the part of the KV budget
    /// no running request reserves.
    #[arg(long, env = "PREFIX_CACHING", default_value_t = true, action = ArgAction::Set,
          value_parser = BoolishValueParser::new())]
    pub prefix_caching: bool,
    /// A prefill interrupts running requests only if the waiting ones number at least
    /// this ratio of them...
    #[arg(long, env = "WAITING_SERVED_RATIO", default_value_t = 0.3)]
    pub waiting_served_ratio: f32,
    /// ...or they waited this many decode steps.
    #[arg(long, env = "MAX_WAITING_TOKENS", default_value_t = 20)]
    pub max_waiting_tokens: u32,
}

#[derive(Args, Debug, Clone)]
pub struct SupervisionArgs {
    /// Seconds a shard has to load the model and answer its health check.
    #[arg(long, env = "SHARD_STARTUP_TIMEOUT", default_value_t = 600)]
    pub shard_startup_timeout: u64,
    /// Seconds one batch step of a shard may take before its requests fail with 424 and
    /// the shard counts as stuck.
    #[arg(long, env = "SHARD_STEP_TIMEOUT", default_value_t = 120)]
    pub shard_step_timeout: u64,
    /// Seconds in-flight requests get to finish after SIGTERM/SIGINT.
    #[arg(long, env = "GRACEFUL_TERMINATION_TIMEOUT", default_value_t = 90)]
    pub graceful_termination_timeout: u64,
    /// Restarts of a shard that died, before the launcher gives up and exits non-zero
    /// (so the platform restarts the container).
    #[arg(long, env = "MAX_SHARD_RESTARTS", default_value_t = 5)]
    pub max_shard_restarts: u32,
}
