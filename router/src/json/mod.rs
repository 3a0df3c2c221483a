//! The JSON body extractor every route uses, whose failures use the one error envelope and
//! the API's own words: no JSON content type → 415; a body that does not arrive within
//! `--http-body-timeout` → 408; over `--payload-limit` → 413; not JSON → 400; not an
//! object, a wrong type or value, an unknown field → 422 naming the field's path and what
//! it must be ([`words`]).

mod words;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::ApiError;
use crate::http::BodyTimeout;
use crate::state::AppState;

pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        if !is_json(req.headers()) {
            return Err(ApiError::UnsupportedMediaType(
                "the body must be JSON sent with `Content-Type: application/json`".to_string(),
            ));
        }
        let limit = state.config.payload_limit;
        let timeout = req.extensions().get::<BodyTimeout>().copied();
        let read = Bytes::from_request(req, state);
        let bytes = match timeout {
            Some(BodyTimeout(within)) => {
                tokio::time::timeout(within, read).await.map_err(|_| {
                    metrics::counter!(crate::metrics::HTTP_TIMEOUTS, "kind" => "body").increment(1);
                    ApiError::RequestTimeout(format!(
                        "the request body did not arrive within --http-body-timeout ({} s)",
                        within.as_secs()
                    ))
                })?
            }
            None => read.await,
        };
        let bytes = bytes.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge(format!(
                    "the request body is larger than the server's --payload-limit of {limit} bytes"
                ))
            } else {
                ApiError::MalformedJson("the request body could not be read".to_string())
            }
        })?;
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::MalformedJson(format!("the body is not valid JSON: {}", syntax(&e)))
        })?;
        if !value.is_object() {
            return Err(ApiError::Validation(format!(
                "the request body must be a JSON object, got {}",
                kind(&value)
            )));
        }
        from_value(value).map(ApiJson)
    }
}

/// A JSON value (a body, or a Vertex instance) as a request type, its errors in words.
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| ApiError::Validation(words::describe(&e)))
}

/// `application/json`, or any `application/…+json`, with any parameters (`charset`).
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence
        .strip_prefix("application/")
        .is_some_and(|sub| sub == "json" || sub.ends_with("+json"))
}

/// A syntax error where it is: serde_json's message with "line L, character C" in place of
/// its own "at line L column C".
fn syntax(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let what = text
        .rsplit_once(" at line ")
        .map_or(text.as_str(), |(what, _)| what);
    // serde_json's "EOF while parsing a value": the body stops before the JSON does.
    let what = if e.is_eof() {
        "it ends before the JSON does"
    } else {
        what
    };
    format!("{what} (line {}, character {})", e.line(), e.column())
}

/// What a JSON value is, in a sentence.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "true or false",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn json_content_types() {
        let with = |ct: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, ct.parse().unwrap());
            is_json(&h)
        };
        assert!(with("application/json"));
        assert!(with("Application/JSON; charset=utf-8"));
        assert!(with("application/vnd.api+json"));
        assert!(!with("text/plain"));
        assert!(!with("application/jsonx"));
        assert!(!is_json(&HeaderMap::new()));
    }

    #[test]
    fn a_body_that_stops_early_says_so() {
        let e = serde_json::from_str::<Value>("{\"inputs\": \"x\",").unwrap_err();
        assert_eq!(
            syntax(&e),
            "it ends before the JSON does (line 1, character 15)"
        );
    }

    #[test]
    fn syntax_errors_say_where_without_the_librarys_words() {
        let e = serde_json::from_str::<Value>("{\"a\": 1,, }").unwrap_err();
        let said = syntax(&e);
        assert!(said.ends_with("(line 1, character 9)"), "{said}");
        assert!(
            !said.contains("column") && !said.contains("at line"),
            "{said}"
        );
    }
}
