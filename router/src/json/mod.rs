//! A JSON body extractor whose failures use the one error envelope.
//!
//! axum's own `Json` answers rejections in plain text; this wrapper maps them: not JSON →
//! 400, wrong types or unknown fields → 422 (with the field's path, from
//! serde_path_to_error inside axum), no JSON content type → 415, over the body limit → 413.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::Json;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;

pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(map_rejection(rejection, state.config.payload_limit)),
        }
    }
}

fn map_rejection(rejection: JsonRejection, payload_limit: usize) -> ApiError {
    match rejection {
        JsonRejection::JsonDataError(e) => ApiError::Validation(name_the_body(strip_prefix(e.body_text()))),
        JsonRejection::JsonSyntaxError(e) => {
            ApiError::MalformedJson(format!("the body is not valid JSON: {}", strip_prefix(e.body_text())))
        }
        JsonRejection::MissingJsonContentType(_) => ApiError::UnsupportedMediaType(
            "the body must be JSON sent with `Content-Type: application/json`".to_string(),
        ),
        JsonRejection::BytesRejection(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            ApiError::PayloadTooLarge(format!(
                "the request body is larger than the server's --payload-limit of {payload_limit} bytes"
            ))
        }
        other => ApiError::MalformedJson(format!("could not read the body: {}", other.body_text())),
    }
}

/// axum prefixes every message with a generic sentence; keep only the useful part
/// (`parameters.max_new_tokens: invalid type: …`).
fn strip_prefix(text: String) -> String {
    for prefix in [
        "Failed to deserialize the JSON body into the target type: ",
        "Failed to parse the request body as JSON: ",
    ] {
        if let Some(rest) = text.strip_prefix(prefix) {
            return rest.to_string();
        }
    }
    text
}

/// serde names no field when the body itself has the wrong shape (`null`, `5`, `[]`); say
/// that it is the body (found by tests/props.rs).
fn name_the_body(text: String) -> String {
    let has_path = text.split_once(": ").is_some_and(|(p, _)| {
        !p.is_empty() && p.chars().all(|c| c.is_alphanumeric() || "_.[]".contains(c))
    });
    if !has_path && text.contains("expected struct") {
        format!("the request body must be a JSON object: {text}")
    } else {
        text
    }
}
