//! Layers around the routes: API-key auth and per-route request metrics.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::metrics as m;
use crate::state::AppState;

/// Requires `Authorization: Bearer <--api-key>` when a key is set. The comparison takes
/// the same time wherever the keys differ, so the key cannot be guessed byte by byte.
pub async fn require_api_key(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(expected) = state.config.api_key.as_deref() else {
        return next.run(request).await;
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    match given {
        Some(key) if bool::from(key.as_bytes().ct_eq(expected.as_bytes())) => {
            next.run(request).await
        }
        Some(_) => ApiError::Unauthorized("the API key is not valid".to_string()).into_response(),
        None => ApiError::Unauthorized(
            "this server needs an API key: send `Authorization: Bearer <key>`".to_string(),
        )
        .into_response(),
    }
}

/// Counts every answered request by route template (not raw path, so cardinality stays
/// bounded) and status, and times it.
pub async fn track(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let method = request.method().to_string();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!(m::REQUEST_COUNT, "route" => route.clone(), "method" => method, "status" => status).increment(1);
    metrics::histogram!(m::REQUEST_DURATION, "route" => route)
        .record(started.elapsed().as_secs_f64());
    response
}
