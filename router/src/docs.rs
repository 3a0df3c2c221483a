//! The OpenAPI document, generated from the handlers and wire types, and a page that
//! renders it with nothing fetched from elsewhere.

use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use utoipa::OpenApi;

use crate::error::ErrorBody;
use crate::openai::types as oai;
use crate::tgi::types as tgi;
use crate::{ops, state, vertex};

#[derive(OpenApi)]
#[openapi(
    info(title = "Sonde", description = "LLM serving with token scores you can trust: TGI, Vertex AI and OpenAI APIs."),
    paths(
        crate::tgi::generate, crate::tgi::generate_stream, crate::tgi::compat,
        crate::vertex::predict,
        crate::openai::completions, crate::openai::chat_completions, crate::openai::models,
        ops::health, ops::info, ops::metrics, ops::tokenize,
    ),
    components(schemas(
        ErrorBody, tgi::GenerateRequest, tgi::GenerateParameters, tgi::GenerateResponse, tgi::Details,
        tgi::Token, tgi::PrefillToken, tgi::TopToken, tgi::LabelLogprob, tgi::StreamResponse,
        tgi::StreamDetails, tgi::BestOfSequence, vertex::PredictRequest, vertex::PredictResponse,
        oai::CompletionRequest, oai::CompletionResponse, oai::ChatRequest, oai::ChatResponse,
        oai::ChatChunk, oai::ModelList, state::Info, ops::TokenizeRequest, ops::SimpleToken,
    )),
    tags((name = "TGI"), (name = "Vertex AI"), (name = "OpenAI"), (name = "Ops"))
)]
pub struct ApiDoc;

/// `GET /api-doc/openapi.json`.
pub async fn spec() -> Response {
    match ApiDoc::openapi().to_json() {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(e) => crate::error::ApiError::Internal(format!("rendering the OpenAPI document: {e}"))
            .into_response(),
    }
}

/// `GET /docs`: a self-contained page (no CDN, no bundled UI) listing every route with
/// its request and response schemas, rendered from the spec by a few lines of script.
pub async fn page() -> Html<&'static str> {
    Html(include_str!("docs.html"))
}
