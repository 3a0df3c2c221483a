//! Health, info and metrics.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::{ApiError, ErrorBody};
use crate::state::{AppState, Health, Info};

/// 200 when every shard is warm; 503 while starting, draining or after a shard failed.
#[utoipa::path(get, path = "/health", tag = "Ops",
    responses((status = 200, description = "ready"), (status = 503, body = ErrorBody)))]
pub async fn health(State(state): State<AppState>) -> Response {
    let reason = match state.health() {
        Health::Ready => return StatusCode::OK.into_response(),
        Health::Starting => "the model is loading".to_string(),
        Health::Draining => "the server is shutting down".to_string(),
        Health::ShardFailed => "a shard failed; waiting for it to come back".to_string(),
        Health::Failed => format!(
            "the server is stopping: {}",
            state.health_cell().reason().unwrap_or_default()
        ),
    };
    let body = ErrorBody {
        error: reason,
        error_type: "healthcheck".to_string(),
    };
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

/// Model, limits, score semantics and version.
#[utoipa::path(get, path = "/info", tag = "Ops",
    responses((status = 200, body = Info), (status = 503, body = ErrorBody)))]
pub async fn info(State(state): State<AppState>) -> Result<Json<Info>, ApiError> {
    state
        .ready_info()
        .cloned()
        .map(Json)
        .ok_or_else(|| ApiError::NotReady(sonde_common::LOADING_MESSAGE.into()))
}

/// Prometheus text exposition.
#[utoipa::path(get, path = "/metrics", tag = "Ops", responses((status = 200, body = String)))]
pub async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}
