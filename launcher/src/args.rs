//! The launcher's flags. Names and environment variables follow text-generation-inference's
//! launcher, so a TGI deployment's configuration carries over; Sonde's own flags follow the
//! same style. No flag has a short form, so none can collide.

use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args, Parser};
pub use sonde_common::flags::LimitArgs;
use sonde_proto::{Device, WeightQuant};

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
    /// MiB of memory the CPU kernel may spend on a second copy of the Q4_0, Q4_1, Q5_0 and
    /// Q5_1 matrices with a byte per quant (about 1.1 bytes a weight), which batches of 10
    /// rows or more and prefills read faster than the packed nibbles; smaller batches and
    /// single streams (with their speculative drafts) keep reading the packed copy, the
    /// fewer bytes from memory. Matrices get one in load order while the memory lasts; 0
    /// turns it off. Scores are the same bits either way.
    #[arg(long, env = "WIDE_QUANTS_MIB", default_value_t = 1024)]
    pub wide_quants_mib: usize,
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
    /// Exact speculative decoding: each decode step may feed a request up to this many
    /// drafted tokens, copied from where its latest tokens occurred before in its prompt
    /// or output, and keeps those the model would have generated anyway. Tokens and scores
    /// are bit-identical to plain decoding; 0 turns it off. Only while a step has at most
    /// 6 rows (a few running requests), where the extra rows come cheap.
    #[arg(long, env = "SPECULATE", default_value_t = 5)]
    pub speculate: u32,
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
