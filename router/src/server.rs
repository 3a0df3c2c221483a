//! Assembles the routes and serves them: bind early, answer 503 until the shards are
//! warm, drain on shutdown.

use std::future::Future;
use std::os::fd::{FromRawFd, RawFd};

use axum::extract::{DefaultBodyLimit, Request};
use axum::routing::{get, post};
use axum::{middleware, Router};
use tokio::net::TcpListener;

use crate::config::{RouterConfig, ServerConfig};
use crate::error::ApiError;
use crate::state::{AppState, Health};
use crate::{docs, middleware as mw, openai, ops, score, startup, tgi, tokens, vertex};

/// Every route, once. Vertex's invoke routes forward `/invoke/<path>` unchanged, so the
/// same routes are mounted under `/invoke` too.
pub fn app(state: AppState) -> Result<Router, String> {
    let cfg = state.config.clone();
    let reserved = [
        "/generate",
        "/generate_stream",
        "/",
        "/vertex",
        "/tokenize",
        "/detokenize",
        "/tokenizer_info",
        "/info",
        "/metrics",
        "/docs",
        "/api-doc/openapi.json",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/v1/score",
    ];
    // Vertex's own routes look like `/v1/endpoints/E/deployedModels/M:predict`: only an
    // exact collision is a problem.
    if reserved.contains(&cfg.predict_route.as_str()) || cfg.predict_route.starts_with("/invoke/") {
        return Err(format!(
            "AIP_PREDICT_ROUTE {} collides with one of Sonde's own routes",
            cfg.predict_route
        ));
    }
    if cfg.health_route == cfg.predict_route || reserved.contains(&cfg.health_route.as_str()) {
        return Err(format!(
            "AIP_HEALTH_ROUTE {} collides with another route",
            cfg.health_route
        ));
    }
    let mut inference = Router::new()
        .route("/generate", post(tgi::generate))
        .route("/generate_stream", post(tgi::generate_stream))
        .route("/", post(tgi::compat))
        .route("/vertex", post(vertex::predict))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/models", get(openai::models))
        .route("/v1/score", post(score::score))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
        .route("/tokenizer_info", get(tokens::tokenizer_info));
    if cfg.predict_route != "/vertex" {
        inference = inference.route(&cfg.predict_route, post(vertex::predict));
    }
    let inference = inference.route_layer(middleware::from_fn_with_state(
        state.clone(),
        mw::require_api_key,
    ));
    let mut open = Router::new()
        .route("/health", get(ops::health))
        .route("/info", get(ops::info))
        .route("/metrics", get(ops::metrics))
        .route("/docs", get(docs::page))
        .route("/api-doc/openapi.json", get(docs::spec));
    if cfg.health_route != "/health" {
        open = open.route(&cfg.health_route, get(ops::health));
    }
    let routes: Router<AppState> = inference.merge(open);
    Ok(Router::new()
        .merge(routes.clone())
        // `nest` serves the compat route at `/invoke` but not at `/invoke/`.
        .route("/invoke/", post(tgi::compat))
        .nest("/invoke", routes)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn(mw::track))
        .layer(DefaultBodyLimit::max(cfg.payload_limit))
        .with_state(state))
}

/// A known path with another method: the same envelope as every other error.
async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::MethodNotAllowed(format!(
        "{} is not allowed on {}",
        request.method(),
        request.uri().path()
    ))
}

async fn not_found(request: Request) -> ApiError {
    ApiError::NotFound(format!(
        "no route for {} {}",
        request.method(),
        request.uri().path()
    ))
}

/// The HTTP socket: the one the launcher handed over (`--listen-fd`), else `config`'s
/// address, bound now.
pub async fn bind(config: &ServerConfig) -> std::io::Result<TcpListener> {
    match config.listen_fd {
        Some(fd) => inherited(fd),
        None => TcpListener::bind((config.hostname.as_str(), config.port)).await,
    }
}

/// Takes over a listening socket this process inherited across exec.
fn inherited(fd: RawFd) -> std::io::Result<TcpListener> {
    if fd <= 2 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("--listen-fd {fd} is a standard stream, not a socket"),
        ));
    }
    // SAFETY: the launcher opened this descriptor, kept it open across exec for this
    // process alone and named it with --listen-fd; nothing else here owns it, since it was
    // open before main ran and no descriptor this process opens can take its number.
    let listener = unsafe { std::net::TcpListener::from_raw_fd(fd) };
    // A descriptor that is no bound TCP socket fails here, before anything is served.
    listener.local_addr()?;
    listener.set_nonblocking(true)?;
    TcpListener::from_std(listener)
}

/// Serves until `shutdown` resolves, then drains: health turns 503, new requests are
/// refused, and in-flight ones finish (for at most `--graceful-termination-timeout`).
/// Startup (tokenizer, shards, warmup) runs in the background; if it fails the server
/// stops with its error.
pub async fn run(
    config: RouterConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = AppState::new(config.server.clone());
    let app = app(state.clone()).map_err(anyhow::Error::msg)?;
    let http_limits = config.server.http;
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<anyhow::Error>();
    let startup_state = state.clone();
    tokio::spawn(async move {
        if let Err(e) = startup::start(&config, &startup_state).await {
            let _ = failed_tx.send(e);
        }
    });
    let drain_state = state.clone();
    let health = state.health_cell();
    let stopping = async move {
        let outcome = tokio::select! {
            _ = shutdown => None,
            Ok(e) = failed_rx => Some(e),
            reason = health.failure() => Some(anyhow::Error::msg(reason)),
        };
        // Keep the port open while in-flight requests finish: probes see 503 and new
        // requests are refused with 503, instead of connections being refused.
        drain_state.set_health(Health::Draining);
        if outcome.is_none() {
            drain_state.wait_idle().await;
        }
        outcome
    };
    let (err_tx, err_rx) = tokio::sync::oneshot::channel();
    crate::http::serve(listener, app, http_limits, async move {
        let _ = err_tx.send(stopping.await);
    })
    .await;
    match err_rx.await {
        Ok(Some(e)) => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::os::fd::IntoRawFd;

    #[tokio::test]
    async fn serves_on_an_inherited_listening_socket() {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        let listener = super::inherited(socket.into_raw_fd()).unwrap();
        assert_eq!(listener.local_addr().unwrap(), addr);
        let (accepted, connected) =
            tokio::join!(listener.accept(), tokio::net::TcpStream::connect(addr));
        assert_eq!(
            accepted.unwrap().1,
            connected.unwrap().local_addr().unwrap()
        );
    }

    #[test]
    fn a_standard_stream_is_no_socket_to_serve_on() {
        let err = super::inherited(1).unwrap_err();
        assert!(err.to_string().contains("--listen-fd 1"), "{err}");
    }
}
