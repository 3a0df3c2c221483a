//! OpenAI-compatible routes: `/v1/completions`, `/v1/chat/completions`, `/v1/models`.
//!
//! Both endpoints turn their request into a `GenerationSpec` and run through the same
//! validation, scheduler and text tracking as `/generate`; only the wire shapes and the
//! field names differ.

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
use crate::infer::FinishReason;
use crate::invalid;
use crate::request::{Field, FieldNames, GenerationSpec, Prompt, SamplingSpec};
use crate::sse::{done_event, json_event, sse_error};
use crate::state::AppState;
use types::{Header, Model, ModelList, PromptTokensDetails, StringOrList, Usage};

/// Declares one of the two OpenAI generation routes. Both answer the same way and differ
/// only in their types: check and prepare the request (the module's `prepare`), take one
/// concurrency permit per choice, then stream chunks (`stream`) or answer once (`run`).
macro_rules! generation_route {
    ($(#[$doc:meta])* $name:ident, $path:tt, $request:ty, $described:tt, $answer:ty, $chunk:ty) => {
        $(#[$doc])*
        #[utoipa::path(post, path = $path, tag = "OpenAI", request_body = $request,
            responses((status = 200, description = $described,
                       content(($answer = "application/json"), ($chunk = "text/event-stream")))))]
        pub async fn $name(
            State(state): State<AppState>,
            ApiJson(req): ApiJson<$request>,
        ) -> Result<Response, ApiError> {
            let ready = state.ready()?;
            let streamed = req.stream;
            let prepared = prepare(ready, req).await?;
            let permit = state.permit(prepared.generations())?;
            if streamed {
                return stream(ready, prepared, permit);
            }
            let answer = run(ready, prepared).await?;
            drop(permit);
            Ok(Json(answer).into_response())
        }
    };
}
pub(crate) use generation_route;

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
    /// The rules only OpenAI has.
    pub fn check(&self) -> Result<(), ApiError> {
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
        Ok(())
    }

    /// Sonde's request: `n` choices of `prompt`. Temperature 0 is greedy; unset is
    /// OpenAI's 1.0, which samples.
    pub fn to_spec(&self, prompt: Prompt, max_new_tokens: Option<i64>) -> GenerationSpec {
        let temperature = self.temperature.unwrap_or(1.0);
        let sampling = SamplingSpec {
            do_sample: temperature > 0.0,
            temperature: (temperature > 0.0 && temperature != 1.0).then_some(temperature),
            top_p: if temperature > 0.0 { self.top_p } else { None },
            seed: self.seed,
            ..SamplingSpec::default()
        };
        GenerationSpec {
            max_new_tokens,
            sampling,
            frequency_penalty: self.frequency_penalty,
            stop: self
                .stop
                .clone()
                .map(StringOrList::into_vec)
                .unwrap_or_default(),
            generations: self.n,
            ..GenerationSpec::new(prompt)
        }
    }
}

/// `/v1/completions`' names for the fields it has.
pub struct CompletionNames;

impl FieldNames for CompletionNames {
    fn name(&self, field: Field) -> Option<&'static str> {
        openai_name(field, "prompt", "logprobs", Some("echo"))
    }
}

/// `/v1/chat/completions`' names for the fields it has.
pub struct ChatNames;

impl FieldNames for ChatNames {
    fn name(&self, field: Field) -> Option<&'static str> {
        openai_name(field, "messages", "top_logprobs", None)
    }
}

/// The names both endpoints share; `prefill` is what asks for prompt scores, if anything.
fn openai_name(
    field: Field,
    prompt: &'static str,
    top_n_tokens: &'static str,
    prefill: Option<&'static str>,
) -> Option<&'static str> {
    match field {
        Field::Prompt => Some(prompt),
        Field::TopNTokens => Some(top_n_tokens),
        Field::MaxNewTokens => Some("max_tokens"),
        Field::Generations => Some("n"),
        Field::PrefillLogprobs => prefill,
        Field::Temperature | Field::TopP | Field::FrequencyPenalty | Field::Stop => {
            Some(field.neutral_name())
        }
        Field::TopK
        | Field::TypicalP
        | Field::RepetitionPenalty
        | Field::Truncate
        | Field::LabelIds => None,
    }
}

/// One choice's tokens, tagged with the choice's index.
pub(crate) type ChoiceStream = BoxStream<'static, (u32, Result<Step, ApiError>)>;

/// A choice's steps, tagged with its index. A prompt's tokens count once in `usage`
/// however many choices it has, so only its first choice reports what the prefix cache
/// supplied.
pub(crate) fn choice_stream(
    index: u32,
    steps: impl Stream<Item = Result<Step, ApiError>> + Send + 'static,
    first_of_prompt: bool,
) -> ChoiceStream {
    steps
        .map(move |s| {
            let s = s.map(|mut step| {
                if !first_of_prompt {
                    step.cached_prompt_tokens = 0;
                }
                step
            });
            (index, s)
        })
        .boxed()
}

/// Tokens an answer used beyond its prompt's, for its `usage`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counts {
    pub completion: u32,
    /// Prompt tokens the prefix cache supplied.
    pub cached: u32,
}

/// The stream's closing chunk, which carries `usage`, given the counts at the end.
pub(crate) type UsageChunk = Box<dyn FnOnce(Counts) -> Event + Send>;

/// The closing chunk when the client asked for it (`stream_options.include_usage`):
/// `response` makes a chunk with no choices around the usage.
pub(crate) fn usage_chunk<R: serde::Serialize>(
    include_usage: bool,
    prompt_tokens: u32,
    response: impl FnOnce(Option<Usage>) -> R + Send + 'static,
) -> Option<UsageChunk> {
    let chunk = move |counts| json_event(&response(Some(usage(prompt_tokens, counts))));
    include_usage.then(|| Box::new(chunk) as UsageChunk)
}

/// Merges the choices of one request into one SSE stream: `chunk` writes each token's
/// event; the first error becomes an error event (the other choices failed alike); then
/// the usage chunk when asked for (`usage_chunk` gets the counts) and
/// `[DONE]`. The permit is held until the stream ends or the client leaves.
pub(crate) fn merge_choices(
    choices: Vec<ChoiceStream>,
    mut chunk: impl FnMut(u32, Step) -> Event + Send + 'static,
    usage_chunk: Option<UsageChunk>,
    permit: OwnedSemaphorePermit,
) -> impl Stream<Item = Event> + Send {
    let generated = Arc::new(AtomicU32::new(0));
    let cached = Arc::new(AtomicU32::new(0));
    let (counted, cached_counted) = (generated.clone(), cached.clone());
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
                cached_counted.fetch_add(step.cached_prompt_tokens, Ordering::Relaxed);
                Some(chunk(index, step))
            }
        };
        futures::future::ready(event)
    });
    let tail = futures::stream::once(async move {
        let mut tail = Vec::new();
        if let Some(usage_chunk) = usage_chunk {
            tail.push(usage_chunk(Counts {
                completion: generated.load(Ordering::Relaxed),
                cached: cached.load(Ordering::Relaxed),
            }));
        }
        tail.push(done_event());
        futures::stream::iter(tail)
    })
    .flatten();
    events.chain(tail)
}

pub(crate) fn usage(prompt_tokens: u32, counts: Counts) -> Usage {
    Usage {
        prompt_tokens,
        completion_tokens: counts.completion,
        total_tokens: prompt_tokens + counts.completion,
        prompt_tokens_details: PromptTokensDetails {
            cached_tokens: counts.cached,
        },
    }
}

pub(crate) fn finish_reason(f: FinishReason) -> String {
    match f {
        FinishReason::Length => "length",
        FinishReason::EosToken | FinishReason::StopSequence => "stop",
    }
    .to_string()
}

/// A new answer's header: a fresh `id` with `prefix`, the time, the served model.
pub(crate) fn header(prefix: &str, object: &str, model: &str) -> Header {
    Header {
        id: format!("{prefix}-{:032x}", rand::random::<u128>()),
        object: object.to_string(),
        created: now(),
        model: model.to_string(),
    }
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
