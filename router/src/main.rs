//! `sonde-router`: parse flags → resolve config → bind → serve until SIGTERM/SIGINT.

use anyhow::Context;
use clap::Parser;
use sonde_router::config::{RouterArgs, VertexEnv};
use sonde_router::server;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = RouterArgs::parse();
    init_logging(args.json_output);
    let config = args
        .server_config(&VertexEnv::from_process())
        .map_err(anyhow::Error::msg)?;
    // Bound before the shards are ready, so health probes get 503 instead of a refusal.
    let listener = server::bind(&config)
        .await
        .with_context(|| format!("binding {}:{}", config.hostname, config.port))?;
    tracing::info!(address = %listener.local_addr()?, "listening");
    server::run(args, config, listener, shutdown_signal()).await
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutdown signal: draining");
}

fn init_logging(json: bool) {
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
