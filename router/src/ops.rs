//! Health, info, metrics and tokenize.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::{ApiError, ErrorBody};
use crate::json::ApiJson;
use crate::state::{AppState, Health, Info};

/// 200 when every shard is warm; 503 while starting, draining or after a shard failed.
#[utoipa::path(get, path = "/health", tag = "Ops",
    responses((status = 200, description = "ready"), (status = 503, body = ErrorBody)))]
pub async fn health(State(state): State<AppState>) -> Response {
    let reason = match state.health() {
        Health::Ready => return StatusCode::OK.into_response(),
        Health::Starting => "the model is loading",
        Health::Draining => "the server is shutting down",
        Health::ShardFailed => "a shard failed; waiting for it to come back",
    };
    let body = ErrorBody {
        error: reason.to_string(),
        error_type: "healthcheck".to_string(),
    };
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

/// Model, limits, score semantics and version.
#[utoipa::path(get, path = "/info", tag = "Ops",
    responses((status = 200, body = Info), (status = 503, body = ErrorBody)))]
pub async fn info(State(state): State<AppState>) -> Result<Json<Info>, ApiError> {
    state.ready_info().cloned().map(Json).ok_or_else(|| {
        ApiError::NotReady("the model is still loading; retry when /health answers 200".into())
    })
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

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    pub inputs: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SimpleToken {
    pub id: u32,
    /// The piece of `inputs` the token covers.
    pub text: String,
    /// Byte offsets into `inputs`.
    pub start: usize,
    pub stop: usize,
}

/// The prompt's tokens as serving sees them (special tokens written in the text match).
#[utoipa::path(post, path = "/tokenize", tag = "Ops", request_body = TokenizeRequest,
    responses((status = 200, body = Vec<SimpleToken>), (status = 422, body = ErrorBody)))]
pub async fn tokenize(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<TokenizeRequest>,
) -> Result<Json<Vec<SimpleToken>>, ApiError> {
    let ready = state.ready()?;
    let tokenizer = ready.validator.tokenizer().clone();
    let inputs = req.inputs;
    let tokens = tokio::task::spawn_blocking(move || {
        let spans = tokenizer.encode_with_offsets(&inputs, true)?;
        Ok::<_, sonde_tokenizer::TokenizerError>(
            spans
                .into_iter()
                .map(|s| SimpleToken {
                    id: s.id,
                    text: inputs.get(s.start..s.stop).unwrap_or_default().to_string(),
                    start: s.start,
                    stop: s.stop,
                })
                .collect(),
        )
    })
    .await
    .map_err(|e| ApiError::Internal(format!("tokenizer task failed: {e}")))?
    .map_err(|e| ApiError::Validation(format!("`inputs` could not be tokenized: {e}")))?;
    Ok(Json(tokens))
}
