//! `sonde-bench`: a closed-loop load generator. C clients each send a request, wait for
//! its last token, and send the next, over a fixed prompt set with greedy decoding and a
//! fixed `max_tokens`, against Sonde's `/generate_stream` or any OpenAI-compatible
//! `/v1/completions`. Prints generated tokens/s, time to first token, inter-token latency
//! and request latency (p50/p99), and failures.

mod client;
mod report;
mod workload;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use clap::{Parser, ValueEnum};

use client::{Api, Client};
use report::Report;
use workload::Workload;

#[derive(Parser, Debug)]
#[command(name = "sonde-bench", version, about)]
struct Args {
    /// Server base URL, e.g. http://127.0.0.1:8080.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// `sonde` drives /generate_stream; `openai` drives /v1/completions (llama-server, vLLM…).
    #[arg(long, value_enum, default_value_t = ApiArg::Sonde)]
    api: ApiArg,
    /// Clients sending at once (closed loop: each waits for its answer before the next).
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Requests in all.
    #[arg(long, default_value_t = 16)]
    requests: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    /// Approximate prompt length in words (the prompts are fixed texts cut to this length).
    #[arg(long, default_value_t = 32)]
    prompt_words: usize,
    /// Exact prompt length in tokens of the model's tokenizer (needs --tokenizer; overrides
    /// --prompt-words): the same token count on every server.
    #[arg(long, requires = "tokenizer")]
    prompt_tokens: Option<usize>,
    /// The served model's GGUF file or Hugging Face folder, for --prompt-tokens.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Start every prompt with the same context of about this many words (a scoring
    /// workload for prefix caches: one passage, many endings).
    #[arg(long, conflicts_with = "prompt_tokens")]
    shared_prefix_words: Option<usize>,
    /// Sonde only: also score the prompt (`decoder_input_details`, non-streamed).
    #[arg(long)]
    prompt_logprobs: bool,
    /// Sonde only: each request is one `/v1/score` call of this many items (endings of
    /// the shared context, which is the query; needs --shared-prefix-words). The report
    /// counts items scored as its tokens.
    #[arg(long, requires = "shared_prefix_words")]
    score_items: Option<usize>,
    /// Requests sent first and left out of the figures.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Print the report as one JSON line instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ApiArg {
    Sonde,
    Openai,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let api = match (args.api, args.score_items) {
        (ApiArg::Sonde, Some(items)) => Api::Score { items },
        (ApiArg::Sonde, None) => Api::Sonde {
            prompt_logprobs: args.prompt_logprobs,
        },
        (ApiArg::Openai, Some(_)) => anyhow::bail!("--score-items needs --api sonde"),
        (ApiArg::Openai, None) => Api::OpenAi,
    };
    let client = Client::new(&args.url, api, Duration::from_secs(args.timeout))?;
    let workload = match (args.prompt_tokens, &args.tokenizer) {
        (Some(tokens), Some(path)) => Workload::new(2 * tokens, args.max_tokens).exact_tokens(
            &load_tokenizer(path)?,
            tokens,
            args.requests + args.warmup,
        )?,
        _ => Workload::new(args.prompt_words, args.max_tokens),
    };
    let workload = match args.shared_prefix_words {
        Some(words) => workload.shared_prefix(words),
        None => workload,
    };
    for i in 0..args.warmup {
        // Numbered after the measured requests, so none of them repeats a warmup prompt.
        let _ = workload.send(&client, args.requests + i).await;
    }
    let started = Instant::now();
    let results = workload::closed_loop(&client, &workload, args.concurrency, args.requests).await;
    let report = Report::new(&results, started.elapsed(), args.concurrency);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        report.print(&args.url);
    }
    Ok(())
}

fn load_tokenizer(path: &Path) -> anyhow::Result<sonde_tokenizer::ModelTokenizer> {
    let tokenizer = if path.is_dir() {
        sonde_tokenizer::ModelTokenizer::from_hf_dir(path)
    } else {
        sonde_tokenizer::ModelTokenizer::from_gguf_file(path)
    };
    tokenizer.with_context(|| format!("loading the tokenizer of {}", path.display()))
}
