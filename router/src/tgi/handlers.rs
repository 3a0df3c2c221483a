//! Handlers of TGI's routes.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;

use super::convert;
use super::respond::{self, Scorer};
use super::types::{GenerateRequest, GenerateResponse, StreamResponse};
use crate::error::ApiError;
use crate::generation::{steps, TextTracker};
use crate::invalid;
use crate::json::ApiJson;
use crate::sse::{json_event, sse, sse_error};
use crate::state::AppState;

/// Generate tokens, with their scores when asked.
#[utoipa::path(post, path = "/generate", tag = "TGI", request_body = GenerateRequest,
    responses((status = 200, body = GenerateResponse)))]
pub async fn generate(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<GenerateRequest>,
) -> Result<Json<GenerateResponse>, ApiError> {
    generate_json(&state, req).await.map(Json)
}

async fn generate_json(
    state: &AppState,
    req: GenerateRequest,
) -> Result<GenerateResponse, ApiError> {
    let ready = state.ready()?;
    let prepared = convert::prepare(ready, req, false).await?;
    let _permit = state.permit(prepared.generations())?;
    respond::generate(ready, &prepared).await
}

/// Generate tokens as Server-Sent Events, one per token; the last carries the text.
#[utoipa::path(post, path = "/generate_stream", tag = "TGI", request_body = GenerateRequest,
    responses((status = 200, description = "text/event-stream of StreamResponse", body = StreamResponse,
               content_type = "text/event-stream")))]
pub async fn generate_stream(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<GenerateRequest>,
) -> Result<Response, ApiError> {
    stream(state, req).await
}

/// TGI's compat route: `stream: true` streams, else a JSON array with one answer.
#[utoipa::path(post, path = "/", tag = "TGI", request_body = GenerateRequest,
    responses((status = 200, description = "one answer in an array, or with `stream: true` a text/event-stream of StreamResponse",
               content((Vec<GenerateResponse> = "application/json"), (StreamResponse = "text/event-stream")))))]
pub async fn compat(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<GenerateRequest>,
) -> Result<Response, ApiError> {
    if req.stream {
        return stream(state, req).await;
    }
    let answer = generate_json(&state, req).await?;
    Ok(Json(vec![answer]).into_response())
}

async fn stream(state: AppState, req: GenerateRequest) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    if req.parameters.decoder_input_details {
        return Err(invalid!(
            "`decoder_input_details` cannot be streamed; use /generate"
        ));
    }
    if req.parameters.best_of.is_some_and(|b| b > 1) {
        return Err(invalid!("`best_of` > 1 cannot be streamed; use /generate"));
    }
    let prepared = convert::prepare(ready, req, true).await?;
    let permit = state.permit(prepared.generations())?;
    let tokenizer = ready.validator.tokenizer().clone();
    let rx = ready.backend.schedule(prepared.valid.generation(0))?;
    let tracker = TextTracker::new(tokenizer.clone(), prepared.valid.stop.clone());
    let events = steps(rx, tracker).map(move |step| {
        // The permit lives as long as the stream.
        let _held = &permit;
        let scorer = Scorer {
            tokenizer: &tokenizer,
            label_ids: &prepared.valid.request.scores.label_ids,
        };
        match step {
            Ok(step) => json_event(&respond::stream_event(&scorer, &prepared, &step)),
            Err(e) => sse_error(&e),
        }
    });
    Ok(sse(events))
}
