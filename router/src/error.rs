//! The one error type of the HTTP layer and its one mapping to a response.
//!
//! Every route (JSON, SSE, Vertex, OpenAI) answers failures with
//! `{"error": "<sentence>", "error_type": "<stable tag>"}` and the status below, so a
//! client can branch on `error_type` and a person can read `error`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// A request that breaks a rule or a limit: 422.
    #[error("{0}")]
    Validation(String),
    /// A body that is not JSON: 400.
    #[error("{0}")]
    MalformedJson(String),
    /// A body sent without `Content-Type: application/json`: 415.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// A body that did not arrive within `--http-body-timeout`: 408.
    #[error("{0}")]
    RequestTimeout(String),
    /// A body over `--payload-limit`: 413.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// An answer that would be over `--max-response-bytes`: 413.
    #[error("{0}")]
    ResponseTooLarge(String),
    /// Missing or wrong API key: 401.
    #[error("{0}")]
    Unauthorized(String),
    /// More than `--max-concurrent-requests` in flight: 429.
    #[error("{0}")]
    Overloaded(String),
    /// Starting, draining, or a shard failed: 503.
    #[error("{0}")]
    NotReady(String),
    /// The shard failed while running the request: 424.
    #[error("{0}")]
    Generation(String),
    /// An unknown route: 404.
    #[error("{0}")]
    NotFound(String),
    /// A known route with another method: 405.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// A bug of ours, never a client's mistake: 500.
    #[error("{0}")]
    Internal(String),
}

/// The error body every route uses.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// A sentence naming the field, the value and the limit where there is one.
    pub error: String,
    /// `validation`, `generation`, `overloaded`, `healthcheck`, `unauthorized`,
    /// `malformed_json`, `unsupported_media_type`, `request_timeout`, `payload_too_large`,
    /// `response_too_large`, `not_found`, `method_not_allowed` or `internal`.
    pub error_type: String,
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::MalformedJson(_) => StatusCode::BAD_REQUEST,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::PayloadTooLarge(_) | ApiError::ResponseTooLarge(_) => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Overloaded(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Generation(_) => StatusCode::FAILED_DEPENDENCY,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn error_type(&self) -> &'static str {
        match self {
            ApiError::Validation(_) => "validation",
            ApiError::MalformedJson(_) => "malformed_json",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::RequestTimeout(_) => "request_timeout",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::ResponseTooLarge(_) => "response_too_large",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Overloaded(_) => "overloaded",
            ApiError::NotReady(_) => "healthcheck",
            ApiError::Generation(_) => "generation",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::Internal(_) => "internal",
        }
    }

    /// The same error with its message prefixed, e.g. by a Vertex instance's index.
    pub fn context(mut self, prefix: &str) -> ApiError {
        let message = self.message_mut();
        *message = format!("{prefix}: {message}");
        self
    }

    fn message_mut(&mut self) -> &mut String {
        match self {
            ApiError::Validation(m)
            | ApiError::MalformedJson(m)
            | ApiError::UnsupportedMediaType(m)
            | ApiError::RequestTimeout(m)
            | ApiError::PayloadTooLarge(m)
            | ApiError::ResponseTooLarge(m)
            | ApiError::Unauthorized(m)
            | ApiError::Overloaded(m)
            | ApiError::NotReady(m)
            | ApiError::Generation(m)
            | ApiError::NotFound(m)
            | ApiError::MethodNotAllowed(m)
            | ApiError::Internal(m) => m,
        }
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: self.to_string(),
            error_type: self.error_type().to_string(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if matches!(self, ApiError::Internal(_)) {
            tracing::error!(error = %self, "internal error");
        }
        (self.status(), Json(self.body())).into_response()
    }
}

/// Shorthand for a 422 with a formatted sentence.
#[macro_export]
macro_rules! invalid {
    ($($arg:tt)*) => { $crate::error::ApiError::Validation(format!($($arg)*)) };
}
