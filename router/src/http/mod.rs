//! The HTTP server under the routes: it accepts connections up to `--max-connections` and
//! serves each with hyper under the time limits that keep a slow or silent client from
//! holding a connection, or a request slot, for ever.
//!
//! axum's own `serve` sets none: a client that sends half its headers and then one line
//! every few seconds (slowloris), an idle keep-alive connection, or a stream nobody reads
//! stayed open as long as the client liked (docs/RELIABILITY.md). Here:
//!
//! - a request's headers must arrive within `--http-header-timeout` of the connection's
//!   start, or of the first byte after an idle time ([`activity`]);
//! - a keep-alive connection may be idle `--http-idle-timeout` between requests;
//! - a body must arrive within `--http-body-timeout` of its headers (the JSON extractor,
//!   which answers 408);
//! - an answer whose writes stay blocked `--http-write-timeout` (a client that reads
//!   nothing, its socket buffers full) drops the connection, which cancels the request
//!   and frees its slot ([`io`]);
//! - one connection over `--max-connections` is answered 503 and closed ([`conn`]).

mod activity;
mod conn;
mod io;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::metrics as m;
pub use conn::BodyTimeout;

/// The connection limits, resolved from the flags.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
    pub write_timeout: Duration,
}

/// How long connections still open at shutdown get to finish (after the drain, which
/// already waited for in-flight requests).
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Serves `app` on `listener` until `shutdown` resolves; then stops accepting, lets each
/// connection finish its request in flight and closes it.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it was
                    // accepted: nothing to answer; give the process a moment (as axum does).
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        match slots.clone().try_acquire_owned() {
            Ok(slot) => {
                metrics::gauge!(m::HTTP_CONNECTIONS).increment(1.0);
                let (app, stop) = (app.clone(), stop_rx.clone());
                tokio::spawn(async move {
                    conn::serve(stream, app, limits, stop).await;
                    drop(slot);
                    metrics::gauge!(m::HTTP_CONNECTIONS).decrement(1.0);
                });
            }
            Err(_) => {
                metrics::counter!(m::HTTP_CONNECTIONS_REFUSED).increment(1);
                tokio::spawn(conn::refuse(stream, limits.max_connections));
            }
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection holds a slot until it ends.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(CLOSE_GRACE, slots.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!("connections still open {CLOSE_GRACE:?} after shutdown; closing them");
    }
}

/// Raises the process's open-file limit to its hard limit, so `--max-connections` is not
/// cut short by a low default (1024 on many systems), and returns the connections that
/// fit under it: `wanted`, or fewer with a warning, keeping room for the process's own
/// files (model, sockets to the shards, logs).
pub fn fit_max_connections(wanted: usize) -> usize {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    const RESERVED_FDS: u64 = 256;
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return wanted;
    };
    let soft = if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        hard
    } else {
        soft
    };
    let room = usize::try_from(soft.saturating_sub(RESERVED_FDS)).unwrap_or(usize::MAX);
    if wanted > room {
        tracing::warn!(
            max_connections = wanted,
            open_files_limit = soft,
            "--max-connections is over what the open-files limit allows; serving {room} at most"
        );
        return room.max(1);
    }
    wanted
}
