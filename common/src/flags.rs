//! The request limits' flags, declared once: the router parses them, the launcher parses
//! the same struct (so a container sets them with TGI's environment variables) and hands
//! them on with [`LimitArgs::to_args`]. A flag added here reaches both, and the router's
//! command line built from it is parsed by the router's own parser in the launcher's tests.

use clap::Args;
use sonde_proto::{FlagValue, LogprobsMode};

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
    /// Open HTTP connections at most; one more is answered 503 and closed.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,
    /// Seconds a client has to send a request's headers, from the connection's start or
    /// from the first byte after an idle time; the connection is closed after (slowloris).
    #[arg(long, env = "HTTP_HEADER_TIMEOUT", default_value_t = 20)]
    pub http_header_timeout: u64,
    /// Seconds a client has to send a request's whole body once its headers arrived; 408
    /// after.
    #[arg(long, env = "HTTP_BODY_TIMEOUT", default_value_t = 60)]
    pub http_body_timeout: u64,
    /// Seconds a keep-alive connection may stay idle between two requests.
    #[arg(long, env = "HTTP_IDLE_TIMEOUT", default_value_t = 75)]
    pub http_idle_timeout: u64,
    /// Seconds an answer may stay blocked on a client that reads nothing (its socket
    /// buffers full); the connection is then dropped and its request cancelled, so its
    /// slot is freed.
    #[arg(long, env = "HTTP_WRITE_TIMEOUT", default_value_t = 60)]
    pub http_write_timeout: u64,
}

impl LimitArgs {
    /// The flags that reproduce these values on another process's command line.
    pub fn to_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        let mut flag = |name: &str, value: String| {
            a.push(format!("--{name}"));
            a.push(value);
        };
        flag(
            "max-concurrent-requests",
            self.max_concurrent_requests.to_string(),
        );
        flag("max-best-of", self.max_best_of.to_string());
        flag("max-stop-sequences", self.max_stop_sequences.to_string());
        flag("max-top-n-tokens", self.max_top_n_tokens.to_string());
        if let Some(v) = self.max_input_tokens {
            flag("max-input-tokens", v.to_string());
        }
        if let Some(v) = self.max_total_tokens {
            flag("max-total-tokens", v.to_string());
        }
        flag(
            "default-max-new-tokens",
            self.default_max_new_tokens.to_string(),
        );
        flag("logprobs-mode", self.logprobs_mode.flag_value());
        flag(
            "max-vertex-instances",
            self.max_vertex_instances.to_string(),
        );
        flag("max-score-items", self.max_score_items.to_string());
        flag("max-response-bytes", self.max_response_bytes.to_string());
        flag("payload-limit", self.payload_limit.to_string());
        flag("max-connections", self.max_connections.to_string());
        flag("http-header-timeout", self.http_header_timeout.to_string());
        flag("http-body-timeout", self.http_body_timeout.to_string());
        flag("http-idle-timeout", self.http_idle_timeout.to_string());
        flag("http-write-timeout", self.http_write_timeout.to_string());
        if self.enable_prefill_logprobs {
            a.push("--enable-prefill-logprobs".to_string());
        }
        a
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        limits: LimitArgs,
    }

    fn parse(args: &[String]) -> LimitArgs {
        Cli::try_parse_from(std::iter::once("cli".to_string()).chain(args.iter().cloned()))
            .unwrap()
            .limits
    }

    #[test]
    fn to_args_reproduces_every_value() {
        let set: Vec<String> = [
            "--max-concurrent-requests=3",
            "--max-best-of=4",
            "--max-stop-sequences=5",
            "--max-top-n-tokens=6",
            "--max-input-tokens=7",
            "--max-total-tokens=8",
            "--default-max-new-tokens=9",
            "--enable-prefill-logprobs",
            "--logprobs-mode=processed",
            "--max-vertex-instances=10",
            "--max-score-items=11",
            "--max-response-bytes=12",
            "--payload-limit=13",
            "--max-connections=14",
            "--http-header-timeout=15",
            "--http-body-timeout=16",
            "--http-idle-timeout=17",
            "--http-write-timeout=18",
        ]
        .map(String::from)
        .to_vec();
        let limits = parse(&set);
        let again = parse(&limits.to_args());
        assert_eq!(format!("{again:?}"), format!("{limits:?}"));
        let defaults = parse(&[]);
        assert_eq!(
            format!("{:?}", parse(&defaults.to_args())),
            format!("{defaults:?}")
        );
        assert_ne!(format!("{limits:?}"), format!("{defaults:?}"));
    }
}
