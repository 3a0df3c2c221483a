//! The OpenAPI document, generated from the handlers and wire types, and a page that
//! renders it with nothing fetched from elsewhere.

use axum::response::{Html, IntoResponse, Response};
use serde_json::{json, Value};
use utoipa::openapi::response::{Response as ApiResponse, ResponseBuilder};
use utoipa::openapi::{Content, Ref, RefOr};
use utoipa::{Modify, OpenApi};

use crate::error::ErrorBody;
use crate::openai::types as oai;
use crate::tgi::types as tgi;
use crate::{ops, state, tokens, vertex};

#[derive(OpenApi)]
#[openapi(
    info(title = "Sonde", description = "LLM serving with token scores you can trust: TGI, Vertex AI and OpenAI APIs."),
    paths(
        crate::tgi::generate, crate::tgi::generate_stream, crate::tgi::compat,
        crate::vertex::predict,
        crate::openai::completions, crate::openai::chat_completions, crate::openai::models,
        crate::score::score,
        ops::health, ops::info, ops::metrics, tokens::tokenize, tokens::detokenize,
        tokens::tokenizer_info,
    ),
    components(schemas(
        ErrorBody, tgi::GenerateRequest, tgi::GenerateParameters, tgi::GenerateResponse, tgi::Details,
        tgi::Token, tgi::PrefillToken, tgi::TopToken, tgi::LabelLogprob, tgi::StreamResponse,
        tgi::StreamDetails, tgi::BestOfSequence, vertex::PredictRequest, vertex::PredictResponse,
        oai::CompletionRequest, oai::CompletionResponse, oai::ChatRequest, oai::ChatResponse,
        oai::ChatChunk, oai::ModelList, state::Info, tokens::TokenizeRequest, tokens::SimpleToken,
        tokens::TokenizeResponse, tokens::TokenizeAnswer, tokens::DetokenizeRequest, tokens::DetokenizeResponse,
        tokens::TokenizerInfo, crate::score::ScoringRequest, crate::score::ScoringResponse,
    )),
    tags((name = "TGI"), (name = "Vertex AI"), (name = "OpenAI"), (name = "Scoring"), (name = "Ops")),
    modifiers(&SharedAnswers)
)]
pub struct ApiDoc;

/// Answers every route of a kind gives, listed here once so the handlers' annotations
/// carry only their own success: the JSON body extractor and validation (400, 413, 415,
/// 422), the API key (401), readiness (503), the concurrency limit (429) and a failed
/// shard (424).
struct SharedAnswers;

const BODY: [(u16, &str); 4] = [
    (400, "malformed_json: the body is not valid JSON"),
    (
        413,
        "payload_too_large: the body is over --payload-limit; response_too_large (Vertex \
         predict): the answer would be over --max-response-bytes",
    ),
    (
        415,
        "unsupported_media_type: the body is not sent as application/json",
    ),
    (
        422,
        "validation: a field is missing, of the wrong shape or out of its range; the message \
         names it",
    ),
];
const AUTH: (u16, &str) = (
    401,
    "unauthorized: --api-key is set and the request lacks it",
);
const NOT_READY: (u16, &str) = (
    503,
    "healthcheck: the model is loading, the server is draining, or a shard is down; retry",
);
const BUSY: (u16, &str) = (
    429,
    "overloaded: --max-concurrent-requests are in flight; retry",
);
const SHARD: (u16, &str) = (424, "generation: the shard failed while generating");

/// The shared answers a route can give (`post`: it reads a JSON body).
fn shared_answers(path: &str, post: bool) -> Vec<(u16, &'static str)> {
    let mut out = if post { BODY.to_vec() } else { Vec::new() };
    match path {
        "/health" | "/info" | "/metrics" | "/api-doc/openapi.json" | "/docs" => {}
        "/v1/models" => out.push(AUTH),
        "/tokenize" | "/detokenize" | "/tokenizer_info" => out.extend([AUTH, NOT_READY]),
        // A failure after the stream started is its last event, inside the 200.
        "/generate_stream" => out.extend([AUTH, NOT_READY, BUSY]),
        _ => out.extend([AUTH, NOT_READY, BUSY, SHARD]),
    }
    out
}

impl Modify for SharedAnswers {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (path, item) in openapi.paths.paths.iter_mut() {
            for (op, post) in [(item.get.as_mut(), false), (item.post.as_mut(), true)] {
                let Some(op) = op else { continue };
                for (status, description) in shared_answers(path, post) {
                    op.responses
                        .responses
                        .entry(status.to_string())
                        .or_insert_with(|| error_response(description));
                }
            }
        }
    }
}

fn error_response(description: &str) -> RefOr<ApiResponse> {
    let body = Content::new(Some(Ref::from_schema_name("ErrorBody")));
    RefOr::T(
        ResponseBuilder::new()
            .description(description)
            .content("application/json", body)
            .build(),
    )
}

/// The OpenAPI document as served.
pub fn document() -> Result<Value, serde_json::Error> {
    let mut doc = serde_json::to_value(ApiDoc::openapi())?;
    describe_event_streams(&mut doc);
    Ok(doc)
}

/// A `text/event-stream` answer is a sequence of events, which OpenAPI 3.2 describes with
/// `itemSchema`: the schema of one event, whose `data` is the JSON of one chunk, or of the
/// error that ended the stream, or OpenAI's closing `[DONE]`. utoipa writes the chunk's
/// type as the stream's `schema`; this moves it there.
fn describe_event_streams(doc: &mut Value) {
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        let openai = path.starts_with("/v1/");
        let ops = item
            .as_object_mut()
            .into_iter()
            .flat_map(|m| m.values_mut());
        for response in ops.filter_map(|op| op.get_mut("responses").and_then(Value::as_object_mut))
        {
            for answer in response.values_mut() {
                let Some(media) = answer
                    .pointer_mut("/content/text~1event-stream")
                    .and_then(Value::as_object_mut)
                else {
                    continue;
                };
                let Some(chunk) = media.remove("schema") else {
                    continue;
                };
                let error = json!({"$ref": "#/components/schemas/ErrorBody"});
                let mut data = json!({"type": "string", "contentMediaType": "application/json",
                                      "contentSchema": {"anyOf": [chunk, error]}});
                if openai {
                    data = json!({"anyOf": [{"const": "[DONE]"}, data]});
                }
                media.insert(
                    "itemSchema".to_string(),
                    json!({"type": "object", "required": ["data"], "properties": {"data": data}}),
                );
            }
        }
    }
}

/// `GET /api-doc/openapi.json`.
pub async fn spec() -> Response {
    match document() {
        Ok(doc) => axum::Json(doc).into_response(),
        Err(e) => crate::error::ApiError::Internal(format!("rendering the OpenAPI document: {e}"))
            .into_response(),
    }
}

/// `GET /docs`: a self-contained page (no CDN, no bundled UI) listing every route with
/// its request and response schemas, rendered from the spec by a few lines of script.
pub async fn page() -> Html<&'static str> {
    Html(include_str!("docs.html"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_documents_the_answers_of_the_shared_layers() {
        let spec = document().unwrap();
        let status = |path: &str, method: &str, code: &str| {
            spec["paths"][path][method]["responses"].get(code).is_some()
        };
        for path in [
            "/generate",
            "/",
            "/vertex",
            "/v1/completions",
            "/v1/chat/completions",
        ] {
            for code in ["400", "401", "413", "415", "422", "424", "429", "503"] {
                assert!(status(path, "post", code), "{path} lacks {code}");
            }
        }
        for code in ["400", "401", "413", "415", "422", "429", "503"] {
            assert!(
                status("/generate_stream", "post", code),
                "/generate_stream lacks {code}"
            );
            assert!(status("/tokenize", "post", code) || code == "429");
        }
        assert!(status("/v1/models", "get", "401"));
        assert!(!status("/health", "get", "401") && !status("/metrics", "get", "401"));
        // Streams: one event's schema, its `data` the JSON of a chunk (or of the error).
        let stream = &spec["paths"]["/generate_stream"]["post"]["responses"]["200"]["content"];
        assert!(stream.get("application/json").is_none(), "{stream}");
        let data = &stream["text/event-stream"]["itemSchema"]["properties"]["data"];
        assert_eq!(data["contentMediaType"], "application/json", "{stream}");
        let chunk = &data["contentSchema"]["anyOf"][0]["$ref"];
        assert_eq!(chunk, "#/components/schemas/StreamResponse", "{stream}");
        for path in ["/", "/v1/completions", "/v1/chat/completions"] {
            let ok = &spec["paths"][path]["post"]["responses"]["200"]["content"];
            assert!(ok["application/json"]["schema"].is_object(), "{path}: {ok}");
            assert!(
                ok["text/event-stream"]["itemSchema"].is_object(),
                "{path}: {ok}"
            );
            assert!(
                ok["text/event-stream"].get("schema").is_none(),
                "{path}: {ok}"
            );
        }
    }
}
