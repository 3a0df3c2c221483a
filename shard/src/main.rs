//! `sonde-shard`: loads a model and serves it over gRPC on a Unix socket.
//! Usually started by `sonde-launcher`; runnable alone for benchmarks and debugging.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use sonde_proto::{Device, WeightQuant};
use sonde_shard::engine::{Engine, EngineConfig, Speculation};
use sonde_shard::loader::{self, LoadOptions};
use sonde_shard::server::{self, ServeConfig};

#[derive(Parser, Debug)]
#[command(name = "sonde-shard", version, about)]
struct Args {
    /// A `.gguf` file, or a Hugging Face folder with config.json, *.safetensors and
    /// tokenizer files.
    #[arg(long)]
    model: PathBuf,
    /// Unix socket to serve gRPC on.
    #[arg(long, default_value_os_t = sonde_proto::default_shard_socket())]
    uds_path: PathBuf,
    /// KV cache budget in tokens over all running requests (prompt + max_new_tokens each).
    #[arg(long, default_value_t = 16_384)]
    max_batch_total_tokens: usize,
    /// Prompt positions whose logits are computed at once when scoring prompts (default:
    /// as many as keep their logits within 8 MiB, from 16 to 32).
    #[arg(long)]
    prompt_logits_chunk: Option<usize>,
    /// The automatic prefix cache: prompt positions an earlier request computed are
    /// loaded, not recomputed, with bit-identical scores. It lives in the part of the KV
    /// budget no running request reserves.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set,
          value_parser = clap::builder::BoolishValueParser::new())]
    prefix_caching: bool,
    /// Exact speculative decoding: drafted tokens per request and decode step (0: off),
    /// while a step has at most `--speculate-max-rows` rows.
    #[arg(long, default_value_t = Speculation::default().draft_tokens)]
    speculate: usize,
    /// The most rows a decode step may have with drafts among them.
    #[arg(long, default_value_t = Speculation::default().max_step_rows)]
    speculate_max_rows: usize,
    /// What to do with GGUF block formats at load.
    #[arg(long, value_enum, default_value_t = WeightQuant::Keep)]
    gguf_quant: WeightQuant,
    /// MiB of memory for wide copies of the Q4_0/Q4_1/Q5_0/Q5_1 matrices (a byte per
    /// quant), which batches of 10 rows or more and prefills read faster; 0: none.
    #[arg(long, default_value_t = loader::DEFAULT_WIDE_QUANTS_MIB)]
    wide_quants_mib: usize,
    /// Where the model runs.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
    /// Log as JSON lines.
    #[arg(long)]
    json_output: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    sonde_common::init_logging(args.json_output);
    let device = match args.device {
        Device::Cpu => candle_core::Device::Cpu,
        Device::Cuda => candle_core::Device::new_cuda(0)
            .context("--device cuda needs a GPU and a build with `--features cuda`")?,
    };
    let opts = LoadOptions {
        device,
        attention: None,
        quant_policy: args.gguf_quant,
        wide_quants_bytes: args.wide_quants_mib.saturating_mul(1 << 20),
    };
    // A load error is one line naming the file and the tensor or key (the launcher shows
    // it as the reason it exits).
    let loaded = loader::load(&args.model, &opts)?;
    let engine = Engine::new(
        loaded,
        EngineConfig {
            max_batch_total_tokens: args.max_batch_total_tokens,
            prompt_logits_chunk: args.prompt_logits_chunk,
            prefix_cache: args.prefix_caching,
            speculation: Speculation {
                draft_tokens: args.speculate,
                max_step_rows: args.speculate_max_rows,
            },
        },
    );
    server::serve(
        ServeConfig {
            uds_path: args.uds_path,
        },
        engine,
        async {
            sonde_common::shutdown_signal().await;
            tracing::info!("shard stopping");
        },
    )
    .await
}
