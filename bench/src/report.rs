//! Figures from the outcomes: throughput and latency percentiles.

use std::time::Duration;

use serde::Serialize;

use crate::client::Outcome;

#[derive(Debug, Serialize)]
pub struct Report {
    pub concurrency: usize,
    pub requests: usize,
    pub failures: usize,
    pub first_error: Option<String>,
    pub wall_s: f64,
    pub generated_tokens: u64,
    /// Generated tokens of successful requests per second of wall time.
    pub tokens_per_s: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub itl_p50_ms: f64,
    pub itl_p99_ms: f64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
}

impl Report {
    pub fn new(outcomes: &[Outcome], wall: Duration, concurrency: usize) -> Self {
        let ok: Vec<&Outcome> = outcomes.iter().filter(|o| o.error.is_none()).collect();
        let tokens: u64 = ok.iter().map(|o| o.tokens as u64).sum();
        let ttft: Vec<Duration> = ok.iter().filter_map(|o| o.ttft).collect();
        let gaps: Vec<Duration> = ok.iter().flat_map(|o| o.gaps.iter().copied()).collect();
        let latency: Vec<Duration> = ok.iter().map(|o| o.latency).collect();
        Self {
            concurrency,
            requests: outcomes.len(),
            failures: outcomes.len() - ok.len(),
            first_error: outcomes.iter().find_map(|o| o.error.clone()),
            wall_s: wall.as_secs_f64(),
            generated_tokens: tokens,
            tokens_per_s: tokens as f64 / wall.as_secs_f64().max(1e-9),
            ttft_p50_ms: percentile_ms(&ttft, 50.0),
            ttft_p99_ms: percentile_ms(&ttft, 99.0),
            itl_p50_ms: percentile_ms(&gaps, 50.0),
            itl_p99_ms: percentile_ms(&gaps, 99.0),
            latency_p50_ms: percentile_ms(&latency, 50.0),
            latency_p99_ms: percentile_ms(&latency, 99.0),
        }
    }

    pub fn print(&self, url: &str) {
        println!(
            "{url}: {} requests at concurrency {}, {:.1} s",
            self.requests, self.concurrency, self.wall_s
        );
        println!(
            "  generated tokens/s   {:10.1}   ({} tokens)",
            self.tokens_per_s, self.generated_tokens
        );
        println!(
            "  time to first token  p50 {:8.1} ms   p99 {:8.1} ms",
            self.ttft_p50_ms, self.ttft_p99_ms
        );
        println!(
            "  inter-token latency  p50 {:8.1} ms   p99 {:8.1} ms",
            self.itl_p50_ms, self.itl_p99_ms
        );
        println!(
            "  request latency      p50 {:8.1} ms   p99 {:8.1} ms",
            self.latency_p50_ms, self.latency_p99_ms
        );
        println!(
            "  failures             {}{}",
            self.failures,
            self.first_error
                .as_ref()
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default()
        );
    }
}

/// Nearest-rank percentile in milliseconds; 0 when there is nothing to measure.
fn percentile_ms(values: &[Duration], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted: Vec<f64> = values.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let ms: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile_ms(&ms, 50.0), 50.0);
        assert_eq!(percentile_ms(&ms, 99.0), 99.0);
        assert_eq!(percentile_ms(&ms[..1], 99.0), 1.0);
        assert_eq!(percentile_ms(&[], 50.0), 0.0);
    }
}
