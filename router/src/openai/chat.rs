//! `/v1/chat/completions`: messages rendered with the model's chat template.

use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::future::try_join_all;
use futures::StreamExt;
use serde_json::Value;
use sonde_tokenizer::{ChatInputs, ModelTokenizer};
use tokio::sync::OwnedSemaphorePermit;

use super::types::{
    ChatChoice, ChatChunk, ChatChunkChoice, ChatDelta, ChatLogprobs, ChatMessage, ChatRequest,
    ChatResponse, ChatTokenLogprob, TopLogprob, Usage,
};
use super::{
    choice_stream, finish_reason, generation_route, header, merge_choices, usage, usage_chunk,
    ChatNames, ChoiceStream, Counts,
};
use crate::error::ApiError;
use crate::generation::{collect, json_logprob, steps, Step, TextTracker};
use crate::infer::TokenScore;
use crate::invalid;
use crate::json::ApiJson;
use crate::request::Prompt;
use crate::sse::{json_event, sse};
use crate::state::{AppState, Ready};
use crate::validation::ValidGenerate;

generation_route! {
    /// OpenAI chat completions, with `logprobs` and `top_logprobs`.
    chat_completions, "/v1/chat/completions", ChatRequest,
    "the answer, or with `stream: true` a text/event-stream of ChatChunk",
    ChatResponse, ChatChunk
}

pub(crate) struct Prepared {
    /// Its `generations` are the `n` choices.
    valid: ValidGenerate,
    /// None: no logprobs; Some(k): chosen token + k alternatives.
    logprobs: Option<u32>,
    include_usage: bool,
}

impl Prepared {
    /// Choices, each holding one concurrency permit.
    pub fn generations(&self) -> u32 {
        self.valid.generations
    }
}

/// Checks and validates a request (also a Vertex instance, which must not stream).
pub(crate) async fn prepare(ready: &Ready, mut req: ChatRequest) -> Result<Prepared, ApiError> {
    let shared = req.take_shared();
    shared.check()?;
    if req.tools.as_ref().is_some_and(|t| !t.is_null())
        || req.tool_choice.as_ref().is_some_and(|t| !t.is_null())
    {
        return Err(invalid!("`tools` and `tool_choice` are not supported"));
    }
    if let Some(format) = &req.response_format {
        if !(format.is_null() || format.get("type").and_then(Value::as_str) == Some("text")) {
            return Err(invalid!(
                "`response_format` supports only {{\"type\": \"text\"}}"
            ));
        }
    }
    let top = req.top_logprobs.unwrap_or(0);
    if top > 0 && !req.logprobs {
        return Err(invalid!("`top_logprobs` needs `logprobs: true`"));
    }
    let max_tokens = req.max_completion_tokens.or(req.max_tokens);
    if let Some(m) = max_tokens {
        if m < 1 {
            return Err(invalid!("`max_tokens` must be >= 1, got {m}"));
        }
    }
    check_messages(&req.messages)?;
    let prompt = Prompt::Text {
        text: render(ready.validator.tokenizer(), &req.messages)?,
        // The template writes the special tokens (BOS included) itself.
        add_special_tokens: false,
    };
    let mut spec = shared.to_spec(prompt, max_tokens);
    spec.scores.top_n_tokens = req.top_logprobs;
    spec.scores.skip_token_logprobs = !req.logprobs;
    let valid = ready
        .validator
        .validate(spec)
        .await
        .map_err(|e| e.in_words(&ChatNames))?;
    Ok(Prepared {
        valid,
        // Validated: 0..=--max-top-n-tokens.
        logprobs: req.logprobs.then_some(top as u32),
        include_usage: req.stream_options.is_some_and(|o| o.include_usage),
    })
}

fn check_messages(messages: &[Value]) -> Result<(), ApiError> {
    if messages.is_empty() {
        return Err(invalid!("`messages` must not be empty"));
    }
    for (i, m) in messages.iter().enumerate() {
        if m.get("role").and_then(Value::as_str).is_none() {
            return Err(invalid!("`messages[{i}].role` must be a string"));
        }
        match m.get("content") {
            None | Some(Value::Null) | Some(Value::String(_)) | Some(Value::Array(_)) => {}
            Some(_) => {
                return Err(invalid!(
                    "`messages[{i}].content` must be a string, a list of parts or null"
                ))
            }
        }
    }
    Ok(())
}

fn render(tokenizer: &ModelTokenizer, messages: &[Value]) -> Result<String, ApiError> {
    let inputs = ChatInputs {
        messages,
        add_generation_prompt: true,
        tools: None,
    };
    tokenizer.apply_chat_template(&inputs).map_err(|e| {
        invalid!("`messages` could not be rendered with the model's chat template: {e}")
    })
}

/// Runs a prepared request to the end and builds the answer.
pub(crate) async fn run(ready: &Ready, p: Prepared) -> Result<ChatResponse, ApiError> {
    let tokenizer = ready.validator.tokenizer();
    let runs = (0..p.valid.generations).map(|i| {
        let request = p.valid.generation(i);
        let tracker = TextTracker::new(tokenizer.clone(), p.valid.stop.clone());
        async move { collect(ready.backend.schedule(request)?, tracker).await }
    });
    let results = try_join_all(runs).await?;
    let prompt_tokens = p.valid.request.input_ids.len() as u32;
    let counts = Counts {
        completion: results.iter().map(|g| g.tokens.len() as u32).sum(),
        // The prompt counts once: as its first choice found it.
        cached: results.first().map_or(0, |g| g.cached_prompt_tokens),
    };
    let choices = results
        .into_iter()
        .enumerate()
        .map(|(index, g)| ChatChoice {
            index: index as u32,
            message: ChatMessage {
                role: "assistant".to_string(),
                content: g.text.clone(),
            },
            logprobs: p.logprobs.map(|k| ChatLogprobs {
                content: content_logprobs(tokenizer, &g.tokens, k),
            }),
            finish_reason: finish_reason(g.finish),
        })
        .collect();
    Ok(ChatResponse {
        header: header("chatcmpl", "chat.completion", &ready.info.model_id),
        choices,
        usage: usage(prompt_tokens, counts),
    })
}

/// Logprobs of the content tokens. Special tokens (the end-of-turn marker) are not part
/// of `content`, so they are left out here too: the tokens then spell the content.
fn content_logprobs(
    tokenizer: &ModelTokenizer,
    tokens: &[TokenScore],
    k: u32,
) -> Vec<ChatTokenLogprob> {
    tokens
        .iter()
        .filter(|t| !tokenizer.is_special(t.id))
        .map(|t| ChatTokenLogprob {
            chosen: listed(tokenizer, t.id, t.logprob.unwrap_or(f32::NEG_INFINITY)),
            top_logprobs: t
                .top
                .iter()
                .take(k as usize)
                .map(|&(id, lp)| listed(tokenizer, id, lp))
                .collect(),
        })
        .collect()
}

/// A token as OpenAI lists it: its text, logprob and bytes (and Sonde's id).
fn listed(tokenizer: &ModelTokenizer, id: u32, logprob: f32) -> TopLogprob {
    TopLogprob {
        token: tokenizer.token_text(id).unwrap_or_default(),
        logprob: json_logprob(logprob),
        bytes: tokenizer.token_bytes(id).unwrap_or_default().to_vec(),
        id,
    }
}

fn stream(ready: &Ready, p: Prepared, permit: OwnedSemaphorePermit) -> Result<Response, ApiError> {
    let tokenizer = ready.validator.tokenizer().clone();
    let head = header("chatcmpl", "chat.completion.chunk", &ready.info.model_id);
    let prompt_tokens = p.valid.request.input_ids.len() as u32;
    let mut choices: Vec<ChoiceStream> = Vec::new();
    for i in 0..p.valid.generations {
        let rx = ready.backend.schedule(p.valid.generation(i))?;
        let tracker = TextTracker::new(tokenizer.clone(), p.valid.stop.clone());
        choices.push(choice_stream(i, steps(rx, tracker), i == 0));
    }
    let response = move |choices: Vec<ChatChunkChoice>, usage: Option<Usage>| ChatChunk {
        header: head.clone(),
        choices,
        usage,
    };
    // OpenAI opens each choice with a chunk that carries only the role.
    let opening: Vec<Event> = (0..p.valid.generations)
        .map(|index| {
            let delta = ChatDelta {
                role: Some("assistant".to_string()),
                content: Some(String::new()),
            };
            json_event(&response(
                vec![ChatChunkChoice {
                    index,
                    delta,
                    logprobs: None,
                    finish_reason: None,
                }],
                None,
            ))
        })
        .collect();
    let closing = response.clone();
    let usage_chunk = usage_chunk(p.include_usage, prompt_tokens, move |usage| {
        closing(Vec::new(), usage)
    });
    let logprobs = p.logprobs;
    let chunk = move |index: u32, step: Step| {
        let logprobs = logprobs.map(|k| ChatLogprobs {
            content: content_logprobs(&tokenizer, std::slice::from_ref(&step.token), k),
        });
        let finish_reason = step.last.as_ref().map(|l| finish_reason(l.finish));
        let delta = ChatDelta {
            role: None,
            content: Some(step.delta),
        };
        json_event(&response(
            vec![ChatChunkChoice {
                index,
                delta,
                logprobs,
                finish_reason,
            }],
            None,
        ))
    };
    let events = merge_choices(choices, chunk, usage_chunk, permit);
    Ok(sse(futures::stream::iter(opening).chain(events)))
}
