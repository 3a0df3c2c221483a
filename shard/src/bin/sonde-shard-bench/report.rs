//! Summaries of the runs: medians, the table and the JSON.

use std::time::Duration;

use serde_json::json;
use sonde_proto as pb;

use crate::Args;

/// One run of one batch size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    pub(crate) prefill: Duration,
    pub(crate) prefill_forward: Duration,
    pub(crate) decode: Duration,
    pub(crate) decode_forward: Duration,
    pub(crate) decode_tokens: u64,
    pub(crate) decode_steps: u64,
}

/// The medians over the runs of one batch size.
pub(crate) struct Summary {
    batch: usize,
    prefill_tok_s: f64,
    prefill_ms: f64,
    prefill_forward_share: f64,
    /// None when no Decode call was needed (--new-tokens 1, or 0 with prompt logprobs).
    decode_tok_s: Option<f64>,
    decode_ms_per_step: Option<f64>,
    decode_forward_share: Option<f64>,
    decode_steps: u64,
}

pub(crate) fn summarize(batch: usize, prompt_tokens: usize, runs: &[Run]) -> Summary {
    let prefill_tokens = (batch * prompt_tokens) as f64;
    let med = |f: &dyn Fn(&Run) -> f64| median(runs.iter().map(f).collect());
    let decoded = runs.iter().all(|r| r.decode_steps > 0);
    Summary {
        batch,
        prefill_tok_s: med(&|r| prefill_tokens / r.prefill.as_secs_f64()),
        prefill_ms: med(&|r| ms(r.prefill)),
        prefill_forward_share: med(&|r| share(r.prefill_forward, r.prefill)),
        decode_tok_s: decoded.then(|| med(&|r| r.decode_tokens as f64 / r.decode.as_secs_f64())),
        decode_ms_per_step: decoded.then(|| med(&|r| ms(r.decode) / r.decode_steps as f64)),
        decode_forward_share: decoded.then(|| med(&|r| share(r.decode_forward, r.decode))),
        decode_steps: runs.iter().map(|r| r.decode_steps).max().unwrap_or(0),
    }
}

pub(crate) fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub(crate) fn share(part: Duration, whole: Duration) -> f64 {
    if whole.is_zero() {
        0.0
    } else {
        part.as_secs_f64() / whole.as_secs_f64()
    }
}

pub(crate) fn print_table(rows: &[Summary]) {
    let opt = |x: Option<f64>, prec: usize| match x {
        Some(x) => format!("{x:.prec$}"),
        None => "-".to_string(),
    };
    println!(
        "{:>5}  {:>13}  {:>10}  {:>9}  {:>12}  {:>11}  {:>9}",
        "batch", "prefill tok/s", "prefill ms", "fwd %", "decode tok/s", "ms / step", "fwd %"
    );
    for s in rows {
        println!(
            "{:>5}  {:>13.1}  {:>10.1}  {:>9.1}  {:>12}  {:>11}  {:>9}",
            s.batch,
            s.prefill_tok_s,
            s.prefill_ms,
            100.0 * s.prefill_forward_share,
            opt(s.decode_tok_s, 1),
            opt(s.decode_ms_per_step, 2),
            opt(s.decode_forward_share.map(|x| 100.0 * x), 1),
        );
    }
}

pub(crate) fn print_json(
    args: &Args,
    info: &pb::InfoResponse,
    rows: &[Summary],
) -> anyhow::Result<()> {
    let results: Vec<_> = rows
        .iter()
        .map(|s| {
            json!({
                "batch_size": s.batch,
                "prefill_tokens_per_s": s.prefill_tok_s,
                "prefill_ms": s.prefill_ms,
                "prefill_forward_share": s.prefill_forward_share,
                "decode_tokens_per_s": s.decode_tok_s,
                "decode_ms_per_step": s.decode_ms_per_step,
                "decode_forward_share": s.decode_forward_share,
                "decode_steps": s.decode_steps,
            })
        })
        .collect();
    let doc = json!({
        "model_id": info.model_id,
        "architecture": info.architecture,
        "dtype": info.dtype,
        "device": info.device,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "runs": args.runs,
        "prefill_logprobs": args.prefill_logprobs,
        "unscored": args.unscored,
        "statistic": "median",
        "results": results,
    });
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}
