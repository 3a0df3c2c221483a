//! Vertex AI predict: `{"instances": [...], "parameters": {...}}` → `{"predictions": [...]}`.
//!
//! Every instance is a whole request of its own kind — `inputs` (TGI generate, every
//! parameter honoured), `messages` (OpenAI chat), `prompt` (OpenAI completion) or `query`
//! (`/v1/score`) — and
//! they all run at once, batching together. Top-level `parameters` are defaults for the
//! `inputs` instances' own `parameters`.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures::future::try_join_all;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::invalid;
use crate::json::{from_value, ApiJson};
use crate::openai::types::{ChatRequest, CompletionRequest};
use crate::state::{AppState, Ready};
use crate::tgi;
use crate::tgi::types::GenerateRequest;
use crate::{openai, score};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PredictRequest {
    /// Each: `{"inputs", "parameters"?}`, `{"messages", ...chat fields}` or
    /// `{"prompt", ...completion fields}`.
    #[schema(value_type = Vec<Object>)]
    pub instances: Vec<Value>,
    /// Defaults for every `inputs` instance's `parameters`.
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Value>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PredictResponse {
    /// In instance order: the generated text when the instance asked for no score, else
    /// the full generate answer; an OpenAI object for chat and completion instances.
    #[schema(value_type = Vec<Object>)]
    pub predictions: Vec<Value>,
}

/// Vertex AI's predict route (also `$AIP_PREDICT_ROUTE`).
#[utoipa::path(post, path = "/vertex", tag = "Vertex AI", request_body = PredictRequest,
    responses((status = 200, body = PredictResponse)))]
pub async fn predict(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<PredictRequest>,
) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    let max = state.config.max_vertex_instances;
    let max_score_items = state.config.max_score_items;
    if req.instances.is_empty() {
        return Err(invalid!("`instances` must not be empty"));
    }
    if req.instances.len() > max {
        return Err(invalid!(
            "`instances` has {} entries, more than --max-vertex-instances ({max})",
            req.instances.len()
        ));
    }
    let defaults = match req.parameters {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map,
        Some(_) => return Err(invalid!("`parameters` must be an object")),
    };
    let prepares = req.instances.into_iter().enumerate().map(|(i, instance)| {
        let defaults = &defaults;
        async move {
            prepare(ready, instance, defaults, max_score_items)
                .await
                .map_err(|e| e.context(&format!("instances[{i}]")))
        }
    });
    let instances = try_join_all(prepares).await?;
    // One permit per generation, as on every other route: an instance with `n: 2` runs two.
    let _permit = state.permit(instances.iter().map(Instance::generations).sum())?;
    let runs = instances
        .into_iter()
        .enumerate()
        .map(|(i, instance)| async move {
            run(ready, instance)
                .await
                .map_err(|e| e.context(&format!("instances[{i}]")))
        });
    let predictions = try_join_all(runs).await?;
    let body = serde_json::to_vec(&PredictResponse { predictions })
        .map_err(|e| ApiError::Internal(format!("serializing predictions: {e}")))?;
    let limit = state.config.max_response_bytes;
    if body.len() > limit {
        return Err(ApiError::ResponseTooLarge(format!(
            "the predictions take {} bytes, over --max-response-bytes ({limit}); ask for fewer instances, \
             fewer tokens (max_new_tokens) or fewer scores (top_n_tokens, decoder_input_details, details)",
            body.len()
        )));
    }
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// One instance, validated: a request of its own API.
enum Instance {
    // Boxed: TGI's parameters make it several times the size of the others.
    Generate(Box<tgi::convert::Prepared>),
    Chat(openai::chat::Prepared),
    Completion(openai::completions::Prepared),
    Score(score::Prepared),
}

impl Instance {
    fn generations(&self) -> u32 {
        match self {
            Instance::Generate(p) => p.generations(),
            Instance::Chat(p) => p.generations(),
            Instance::Completion(p) => p.generations(),
            Instance::Score(p) => p.generations(),
        }
    }
}

/// Reads an instance as the request its key names and validates it with that API's rules.
async fn prepare(
    ready: &Ready,
    instance: Value,
    defaults: &Map<String, Value>,
    max_score_items: usize,
) -> Result<Instance, ApiError> {
    let Value::Object(mut fields) = instance else {
        return Err(invalid!(
            "an instance must be an object with `inputs`, `messages`, `prompt` or `query`"
        ));
    };
    let not_streamed = |stream: bool| {
        if stream {
            Err(invalid!("`stream` is not available in Vertex predict"))
        } else {
            Ok(())
        }
    };
    if fields.contains_key("inputs") {
        let own = match fields.remove("parameters") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(map)) => map,
            Some(_) => return Err(invalid!("`parameters` must be an object")),
        };
        // Top-level `parameters` are defaults, key by key, for the instance's own.
        let mut merged = defaults.clone();
        merged.extend(own);
        fields.insert("parameters".to_string(), Value::Object(merged));
        let req: GenerateRequest = from_value(Value::Object(fields))?;
        not_streamed(req.stream)?;
        let prepared = tgi::convert::prepare(ready, req, false).await?;
        Ok(Instance::Generate(Box::new(prepared)))
    } else if fields.contains_key("messages") {
        let req: ChatRequest = from_value(Value::Object(fields))?;
        not_streamed(req.stream)?;
        Ok(Instance::Chat(openai::chat::prepare(ready, req).await?))
    } else if fields.contains_key("prompt") {
        let req: CompletionRequest = from_value(Value::Object(fields))?;
        not_streamed(req.stream)?;
        Ok(Instance::Completion(
            openai::completions::prepare(ready, req).await?,
        ))
    } else if fields.contains_key("query") {
        let req = from_value(Value::Object(fields))?;
        Ok(Instance::Score(
            score::prepare(ready, req, max_score_items).await?,
        ))
    } else {
        Err(invalid!(
            "an instance must have `inputs` (generate), `messages` (chat), `prompt` (completion) or `query` (score)"
        ))
    }
}

/// A generate instance answers its text alone when it asked for no score.
async fn run(ready: &Ready, instance: Instance) -> Result<Value, ApiError> {
    match instance {
        Instance::Generate(p) => {
            let answer = tgi::respond::generate(ready, &p).await?;
            if p.params.wants_scores() {
                to_value(&answer)
            } else {
                Ok(Value::String(answer.generated_text))
            }
        }
        Instance::Chat(p) => to_value(&openai::chat::run(ready, p).await?),
        Instance::Completion(p) => to_value(&openai::completions::run(ready, p).await?),
        Instance::Score(p) => to_value(&score::run(ready, p).await?),
    }
}

fn to_value<T: Serialize>(value: &T) -> Result<Value, ApiError> {
    serde_json::to_value(value)
        .map_err(|e| ApiError::Internal(format!("serializing a prediction: {e}")))
}
