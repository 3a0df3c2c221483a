//! `sonde-router`: parse flags → resolve config → bind → serve until SIGTERM/SIGINT.

use anyhow::Context;
use clap::Parser;
use sonde_router::config::{RouterArgs, VertexEnv};
use sonde_router::server;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = RouterArgs::parse();
    sonde_common::init_logging(args.json_output);
    let mut config = args
        .resolve(&VertexEnv::from_process())
        .map_err(anyhow::Error::msg)?;
    let http = &mut config.server.http;
    http.max_connections = sonde_router::http::fit_max_connections(http.max_connections);
    // Bound before the shards are ready, so health probes get 503 instead of a refusal.
    let (host, port) = (&config.server.hostname, config.server.port);
    let listener = server::bind(&config.server)
        .await
        .with_context(|| format!("binding {host}:{port}"))?;
    tracing::info!(address = %listener.local_addr()?, "listening");
    let shutdown = async {
        sonde_common::shutdown_signal().await;
        tracing::info!("shutdown signal: draining");
    };
    server::run(config, listener, shutdown).await
}
