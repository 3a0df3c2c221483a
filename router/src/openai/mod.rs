//! OpenAI-compatible routes: `/v1/completions`, `/v1/chat/completions`, `/v1/models`.
//!
//! Both endpoints turn their request into TGI generate parameters and run through the same
//! validation, scheduler and text tracking as `/generate`; only the wire shapes differ.

pub mod chat;
pub mod completions;
pub mod types;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::response::sse::Event;
use axum::Json;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use serde_json::Value;
use tokio::sync::OwnedSemaphorePermit;

pub use chat::{__path_chat_completions, chat_completions};
pub use completions::{__path_completions, completions};

use crate::error::ApiError;
use crate::generation::Step;
use crate::infer::{FinishReason, Sampling, ValidRequest};
use crate::invalid;
use crate::sse::{done_event, sse_error};
use crate::state::AppState;
use crate::tgi::types::GenerateParameters;
use crate::validation::ValidationLimits;
use types::{Model, ModelList, StringOrList, Usage};

/// The fields completions and chat share, checked with OpenAI's names.
pub(crate) struct Shared {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub n: Option<i64>,
    pub stop: Option<StringOrList>,
    pub seed: Option<u64>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub logit_bias: Option<Value>,
}

impl Shared {
    /// Checks the OpenAI-only rules; returns the number of choices.
    pub fn check(&self, limits: &ValidationLimits) -> Result<u32, ApiError> {
        if let Some(t) = self.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(invalid!("`temperature` must be between 0 and 2, got {t}"));
            }
        }
        if self.presence_penalty.is_some_and(|p| p != 0.0) {
            return Err(invalid!(
                "`presence_penalty` is not supported (only 0); `frequency_penalty` is"
            ));
        }
        let bias_empty = match &self.logit_bias {
            None | Some(Value::Null) => true,
            Some(Value::Object(m)) => m.is_empty(),
            Some(_) => false,
        };
        if !bias_empty {
            return Err(invalid!("`logit_bias` is not supported"));
        }
        let n = self.n.unwrap_or(1);
        if n < 1 || n > limits.max_best_of as i64 {
            return Err(invalid!(
                "`n` must be between 1 and {} (--max-best-of), got {n}",
                limits.max_best_of
            ));
        }
        Ok(n as u32)
    }

    /// TGI parameters for one choice. Temperature 0 is greedy; unset is OpenAI's 1.0,
    /// which samples.
    pub fn parameters(&self, max_new_tokens: Option<i64>) -> GenerateParameters {
        let temperature = self.temperature.unwrap_or(1.0);
        GenerateParameters {
            max_new_tokens,
            do_sample: temperature > 0.0,
            temperature: (temperature > 0.0 && temperature != 1.0).then_some(temperature),
            top_p: if temperature > 0.0 { self.top_p } else { None },
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            stop: self
                .stop
                .clone()
                .map(StringOrList::into_vec)
                .unwrap_or_default(),
            ..Default::default()
        }
    }
}

/// Validation speaks TGI's field names; an OpenAI client should read its own.
pub(crate) fn openai_names(error: ApiError, prompt_field: &str, top_field: &str) -> ApiError {
    match error {
        ApiError::Validation(m) => ApiError::Validation(
            m.replace("`max_new_tokens`", "`max_tokens`")
                .replace("`inputs`", &format!("`{prompt_field}`"))
                .replace("`top_n_tokens`", &format!("`{top_field}`"))
                .replace("`decoder_input_details`", "`echo` with `logprobs`"),
        ),
        other => other,
    }
}

/// Choice `i` of a request: sampled choices get distinct seeds derived from the request's.
pub(crate) fn choice_request(request: &ValidRequest, i: u32) -> ValidRequest {
    let mut request = request.clone();
    if let Sampling::Sample { seed, .. } = &mut request.sampling {
        *seed = seed.wrapping_add(i as u64);
    }
    request
}

/// One choice's tokens, tagged with the choice's index.
pub(crate) type ChoiceStream = BoxStream<'static, (u32, Result<Step, ApiError>)>;

/// Merges the choices of one request into one SSE stream: `chunk` writes each token's
/// event; the first error becomes an error event (the other choices failed alike); then
/// the usage chunk when asked for (`usage_chunk` gets the generated token count) and
/// `[DONE]`. The permit is held until the stream ends or the client leaves.
pub(crate) fn merge_choices(
    choices: Vec<ChoiceStream>,
    mut chunk: impl FnMut(u32, Step) -> Event + Send + 'static,
    usage_chunk: Option<Box<dyn FnOnce(u32) -> Event + Send>>,
    permit: OwnedSemaphorePermit,
) -> impl Stream<Item = Event> + Send {
    let generated = Arc::new(AtomicU32::new(0));
    let counted = generated.clone();
    let mut failed = false;
    let events = futures::stream::select_all(choices).filter_map(move |(index, step)| {
        let _held = &permit;
        let event = match step {
            Err(e) if !failed => {
                failed = true;
                Some(sse_error(&e))
            }
            Err(_) => None,
            Ok(step) => {
                counted.fetch_add(1, Ordering::Relaxed);
                Some(chunk(index, step))
            }
        };
        futures::future::ready(event)
    });
    let tail = futures::stream::once(async move {
        let mut tail = Vec::new();
        if let Some(usage_chunk) = usage_chunk {
            tail.push(usage_chunk(generated.load(Ordering::Relaxed)));
        }
        tail.push(done_event());
        futures::stream::iter(tail)
    })
    .flatten();
    events.chain(tail)
}

pub(crate) fn usage(prompt_tokens: u32, completion_tokens: u32) -> Usage {
    Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
    }
}

pub(crate) fn finish_reason(f: FinishReason) -> String {
    match f {
        FinishReason::Length => "length",
        FinishReason::EosToken | FinishReason::StopSequence => "stop",
    }
    .to_string()
}

pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}

pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The served model.
#[utoipa::path(get, path = "/v1/models", tag = "OpenAI", responses((status = 200, body = ModelList)))]
pub async fn models(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list".to_string(),
        data: vec![Model {
            id: state.config.model_id.clone(),
            object: "model".to_string(),
            created: now(),
            owned_by: "sonde".to_string(),
        }],
    })
}
