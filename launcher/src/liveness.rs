//! Liveness of running shards. A shard that hangs (stopped with SIGSTOP, deadlocked, stuck
//! in the kernel) never exits, so waiting for its exit would never restart it: the
//! supervisor also asks each shard for its gRPC `Health` every second, and a shard that
//! misses `MAX_MISSED` checks in a row is killed, which takes the ordinary restart path.
//!
//! The shard answers `Health` on its async runtime, apart from the engine thread that runs
//! the forward passes, so a busy shard still answers within milliseconds: only a shard
//! that is really stuck misses three checks of two seconds each.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Time between two rounds of checks.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Time one check may take before it counts as missed.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Checks missed in a row that make a shard stuck.
pub const MAX_MISSED: u32 = 3;

/// Counts each shard's missed checks in a row. Its state lives outside the future that
/// probes, so the supervisor's `select!` may drop that future at any point and poll a new
/// one without losing count.
pub struct Liveness {
    sockets: Vec<PathBuf>,
    missed: Vec<u32>,
    interval: Duration,
    timeout: Duration,
}

impl Liveness {
    pub fn new(sockets: Vec<PathBuf>) -> Self {
        Self::with_timing(sockets, PROBE_INTERVAL, PROBE_TIMEOUT)
    }

    /// Other timings, for tests.
    pub fn with_timing(sockets: Vec<PathBuf>, interval: Duration, timeout: Duration) -> Self {
        let missed = vec![0; sockets.len()];
        Self {
            sockets,
            missed,
            interval,
            timeout,
        }
    }

    /// Records one check of shard `i`; true when it has now missed `MAX_MISSED` in a row.
    pub fn record(&mut self, i: usize, alive: bool) -> bool {
        let Some(missed) = self.missed.get_mut(i) else {
            return false;
        };
        *missed = if alive { 0 } else { *missed + 1 };
        *missed >= MAX_MISSED
    }

    /// Forgets shard `i`'s misses (it was restarted).
    pub fn reset(&mut self, i: usize) {
        if let Some(missed) = self.missed.get_mut(i) {
            *missed = 0;
        }
    }

    pub fn missed(&self, i: usize) -> u32 {
        self.missed.get(i).copied().unwrap_or(0)
    }

    /// Checks every shard each interval until one is stuck; returns its index.
    pub async fn next_stuck(&mut self) -> usize {
        if self.sockets.is_empty() {
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep(self.interval).await;
            for i in 0..self.sockets.len() {
                let alive = healthy(&self.sockets[i], self.timeout).await;
                if self.record(i, alive) {
                    return i;
                }
            }
        }
    }
}

/// Whether the shard on `socket` answers its gRPC health check within `timeout`.
pub async fn healthy(socket: &Path, timeout: Duration) -> bool {
    let check = async {
        let mut client = sonde_proto::connect_uds(socket).await.ok()?;
        client.health(sonde_proto::HealthRequest {}).await.ok()
    };
    matches!(tokio::time::timeout(timeout, check).await, Ok(Some(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_consecutive_misses_make_a_shard_stuck() {
        let mut l = Liveness::new(vec![PathBuf::from("/a"), PathBuf::from("/b")]);
        assert!(!l.record(0, false));
        assert!(!l.record(0, false));
        // One answer in between forgives the misses before it.
        assert!(!l.record(0, true));
        assert!(!l.record(0, false));
        assert!(!l.record(0, false));
        assert!(l.record(0, false));
        // Shards are counted apart.
        assert_eq!(l.missed(1), 0);
        l.reset(0);
        assert_eq!(l.missed(0), 0);
        assert!(!l.record(5, false));
    }

    #[tokio::test]
    async fn a_shard_that_accepts_but_never_answers_is_stuck_after_three_checks() {
        // A bound socket nobody accepts on: the kernel queues the connection and the
        // gRPC handshake waits forever, exactly what a shard stopped with SIGSTOP does.
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("silent-0");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let (interval, timeout) = (Duration::from_millis(20), Duration::from_millis(100));
        let mut l = Liveness::with_timing(vec![socket], interval, timeout);
        let started = std::time::Instant::now();
        assert_eq!(l.next_stuck().await, 0);
        assert!(started.elapsed() >= (interval + timeout) * MAX_MISSED);
        assert_eq!(l.missed(0), MAX_MISSED);
    }
}
