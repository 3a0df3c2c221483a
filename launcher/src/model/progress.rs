//! Download progress: an indicatif bar on a terminal, or `tracing` lines for log collectors
//! (a bar's carriage returns are noise in Cloud Logging). Both show bytes done/total and MB/s.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget};

use super::ProgressStyle;

/// Log a line at least this often, and at every 10%.
const LOG_EVERY: Duration = Duration::from_secs(5);

pub(crate) struct Reporter {
    label: String,
    total: u64,
    done: u64,
    started: Instant,
    last_line: Instant,
    last_tenth: u64,
    bar: Option<ProgressBar>,
}

impl Reporter {
    pub fn start(style: ProgressStyle, label: &str, total: u64) -> Self {
        let bar = match style {
            ProgressStyle::Terminal => Some(terminal_bar(label, total)),
            ProgressStyle::Log => None,
        };
        tracing::info!("downloading {label}: {}", mb(total));
        let now = Instant::now();
        Self {
            label: label.to_string(),
            total,
            done: 0,
            started: now,
            last_line: now,
            last_tenth: 0,
            bar,
        }
    }

    pub fn advance(&mut self, bytes: u64) {
        self.done += bytes;
        if let Some(bar) = &self.bar {
            bar.set_position(self.done);
            return;
        }
        let tenth = self
            .done
            .saturating_mul(10)
            .checked_div(self.total)
            .unwrap_or(10);
        if tenth > self.last_tenth || self.last_line.elapsed() >= LOG_EVERY {
            self.last_tenth = tenth;
            self.last_line = Instant::now();
            tracing::info!("downloading {}: {}", self.label, self.line());
        }
    }

    pub fn finish(self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        let secs = self.started.elapsed().as_secs_f64();
        tracing::info!(
            "downloaded {}: {} in {secs:.1} s ({:.1} MB/s)",
            self.label,
            mb(self.done),
            rate(self.done, secs)
        );
    }

    /// A failed download: the bar goes, the log says how far it got.
    pub fn abandon(self) {
        if let Some(bar) = &self.bar {
            bar.abandon();
        }
        tracing::warn!("download of {} stopped at {}", self.label, self.line());
    }

    fn line(&self) -> String {
        let pct = (self.done * 100).checked_div(self.total).unwrap_or(100);
        let secs = self.started.elapsed().as_secs_f64();
        format!(
            "{} of {} ({pct}%), {:.1} MB/s",
            mb(self.done),
            mb(self.total),
            rate(self.done, secs)
        )
    }
}

fn terminal_bar(label: &str, total: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let template =
        "{msg} [{bar:30}] {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} eta {eta}";
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(label.to_string());
    bar
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

fn rate(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 / 1e6 / secs
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_reports_bytes_percent_and_rate() {
        let mut r = Reporter::start(ProgressStyle::Log, "gs://b/m", 2_000_000);
        r.advance(500_000);
        let line = r.line();
        assert!(line.starts_with("0.5 MB of 2.0 MB (25%), "), "{line}");
        assert!(line.ends_with("MB/s"), "{line}");
        r.finish();
        // An empty object must not divide by zero.
        let mut empty = Reporter::start(ProgressStyle::Log, "gs://b/e", 0);
        empty.advance(0);
        assert!(empty.line().contains("(100%)"));
    }
}
