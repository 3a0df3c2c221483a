//! What every Sonde process (launcher, router, shard) does the same way.

pub mod flags;
pub mod http;

/// What a client hears while the model loads (503, `error_type` `healthcheck`), whichever
/// process answers: the launcher before the router starts, the router until it is warm.
pub const LOADING_MESSAGE: &str = "the model is still loading; retry when /health answers 200";

/// Logs to stderr (the launcher copies its children's output there too), filtered by
/// `RUST_LOG` (default `info`), as JSON lines with `json`.
pub fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Resolves on SIGTERM (how Vertex, Kubernetes and `docker stop` end a container) or
/// SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
