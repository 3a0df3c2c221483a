//! What a connection is doing, and when it has waited too long for its client.
//!
//! A connection is either *busy* (a request is being served: its body read by the handler,
//! its answer written, each under its own limit) or *waiting* for the next request's
//! headers. While waiting, two clocks can run: the idle clock, from the end of the last
//! answer until the next request's first byte (`--http-idle-timeout`), and the header
//! clock, from that first byte — or from the connection's start — until the headers are
//! whole (`--http-header-timeout`). The header clock runs from the *first* byte, so a
//! client that trickles one header line every few seconds is closed all the same.
//!
//! The I/O wrapper reports bytes read, the service wrapper the start and end of each
//! request; [`Activity::expired`] resolves once the running clock passes its limit.

use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::HttpLimits;

/// Why a connection was closed for its client's silence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// The headers did not arrive in time.
    Header,
    /// Nothing arrived after the last answer.
    Idle,
}

impl Expiry {
    pub fn label(self) -> &'static str {
        match self {
            Expiry::Header => "header",
            Expiry::Idle => "idle",
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Waiting {
        /// When the last answer ended; `None` on a new connection, whose first request is
        /// timed from the start as headers.
        idle_since: Option<Instant>,
        /// When the first byte of the next request's headers arrived.
        head_since: Option<Instant>,
    },
    Busy {
        requests: usize,
    },
}

/// One connection's phase, shared by its I/O, its service and its watchdog.
#[derive(Debug)]
pub struct Activity {
    phase: Mutex<Phase>,
    changed: Notify,
}

impl Activity {
    pub fn new() -> Self {
        Self {
            phase: Mutex::new(Phase::Waiting {
                idle_since: None,
                head_since: Some(Instant::now()),
            }),
            changed: Notify::new(),
        }
    }

    fn phase(&self) -> MutexGuard<'_, Phase> {
        // The phase is plain data, valid whatever a panicking holder was doing.
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes arrived from the client.
    pub fn read_some(&self) {
        let mut phase = self.phase();
        if let Phase::Waiting {
            head_since: head @ None,
            ..
        } = &mut *phase
        {
            *head = Some(Instant::now());
            drop(phase);
            self.changed.notify_one();
        }
    }

    /// A request's headers are whole: it is being served.
    pub fn request_started(&self) {
        let mut phase = self.phase();
        *phase = match *phase {
            Phase::Busy { requests } => Phase::Busy {
                requests: requests + 1,
            },
            Phase::Waiting { .. } => Phase::Busy { requests: 1 },
        };
        drop(phase);
        self.changed.notify_one();
    }

    /// A request's answer has been written (or abandoned).
    pub fn request_ended(&self) {
        let mut phase = self.phase();
        if let Phase::Busy { requests } = *phase {
            *phase = if requests > 1 {
                Phase::Busy {
                    requests: requests - 1,
                }
            } else {
                Phase::Waiting {
                    idle_since: Some(Instant::now()),
                    head_since: None,
                }
            };
        }
        drop(phase);
        self.changed.notify_one();
    }

    /// The running clock's deadline, if one runs.
    fn deadline(&self, limits: &HttpLimits) -> Option<(Instant, Expiry)> {
        match *self.phase() {
            Phase::Busy { .. } => None,
            Phase::Waiting {
                head_since: Some(head),
                ..
            } => Some((head + limits.header_timeout, Expiry::Header)),
            Phase::Waiting {
                idle_since: Some(idle),
                head_since: None,
            } => Some((idle + limits.idle_timeout, Expiry::Idle)),
            Phase::Waiting {
                idle_since: None,
                head_since: None,
            } => None,
        }
    }

    /// Resolves when the client has made the connection wait past a limit.
    pub async fn expired(&self, limits: &HttpLimits) -> Expiry {
        loop {
            // `notify_one` keeps a permit when nobody waits, so a change between reading
            // the deadline and waiting is not lost.
            match self.deadline(limits) {
                None => self.changed.notified().await,
                Some((at, why)) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {
                            if self.deadline(limits).is_some_and(|(now_at, _)| now_at <= Instant::now()) {
                                return why;
                            }
                        }
                        () = self.changed.notified() => {}
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const LIMITS: HttpLimits = HttpLimits {
        max_connections: 1,
        header_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(100),
        write_timeout: Duration::from_secs(10),
    };

    async fn expires_after(a: &Activity) -> Option<(Duration, Expiry)> {
        let started = Instant::now();
        let why = tokio::time::timeout(Duration::from_secs(1000), a.expired(&LIMITS))
            .await
            .ok()?;
        Some((started.elapsed(), why))
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_connection_has_the_header_time_for_its_first_request() {
        let a = Activity::new();
        // Bytes do not restart the clock: it runs from the connection's start.
        a.read_some();
        assert_eq!(
            expires_after(&a).await,
            Some((LIMITS.header_timeout, Expiry::Header))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_served_request_stops_the_clock_until_it_ends() {
        let a = Activity::new();
        a.request_started();
        assert_eq!(expires_after(&a).await, None);
        a.request_ended();
        assert_eq!(
            expires_after(&a).await,
            Some((LIMITS.idle_timeout, Expiry::Idle))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn after_an_idle_time_the_first_byte_starts_the_header_clock() {
        let a = Activity::new();
        a.request_started();
        a.request_ended();
        tokio::time::advance(Duration::from_secs(30)).await;
        a.read_some();
        tokio::time::advance(Duration::from_secs(5)).await;
        // A trickle of further bytes does not move it.
        a.read_some();
        assert_eq!(
            expires_after(&a).await,
            Some((Duration::from_secs(5), Expiry::Header))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pipelined_requests_keep_the_connection_busy_until_the_last_ends() {
        let a = Activity::new();
        a.request_started();
        a.request_started();
        a.request_ended();
        assert_eq!(expires_after(&a).await, None);
        a.request_ended();
        assert_eq!(
            expires_after(&a).await,
            Some((LIMITS.idle_timeout, Expiry::Idle))
        );
    }
}
