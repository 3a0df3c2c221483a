//! Server-Sent Events shared by every streaming route.

use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};

use crate::error::ApiError;

/// An SSE response; comments keep idle connections open through proxies during a long
/// prefill.
pub fn sse(events: impl Stream<Item = Event> + Send + 'static) -> Response {
    Sse::new(events.map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::default())
        .into_response()
}

pub fn json_event<T: serde::Serialize>(value: &T) -> Event {
    Event::default()
        .json_data(value)
        .unwrap_or_else(|e| sse_error(&ApiError::Internal(format!("serializing an event: {e}"))))
}

/// An error after the stream started: an event `{"error", "error_type"}`.
pub fn sse_error(error: &ApiError) -> Event {
    json_event_infallible(&error.body())
}

fn json_event_infallible(body: &crate::error::ErrorBody) -> Event {
    let data = serde_json::json!({"error": body.error, "error_type": body.error_type});
    Event::default().data(data.to_string())
}

/// OpenAI's end of stream.
pub fn done_event() -> Event {
    Event::default().data("[DONE]")
}
