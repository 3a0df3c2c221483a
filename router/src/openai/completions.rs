//! `/v1/completions`.

use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::future::try_join_all;
use futures::StreamExt;
use sonde_tokenizer::ModelTokenizer;
use tokio::sync::OwnedSemaphorePermit;

use super::types::{
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, Usage,
};
use super::{
    choice_request, finish_reason, merge_choices, new_id, now, openai_names, usage, ChoiceStream,
    Shared,
};
use crate::error::{ApiError, ErrorBody};
use crate::generation::{collect, json_logprob, steps, Step, TextTracker};
use crate::infer::TokenScore;
use crate::invalid;
use crate::json::ApiJson;
use crate::sse::{json_event, sse};
use crate::state::{AppState, Ready};
use crate::validation::ValidGenerate;

/// OpenAI completions, with `logprobs` (top-N per position) and `echo` (prompt scores).
#[utoipa::path(post, path = "/v1/completions", tag = "OpenAI", request_body = CompletionRequest,
    responses((status = 200, description = "the answer, or with `stream: true` a text/event-stream of CompletionResponse chunks",
               content((CompletionResponse = "application/json"), (CompletionResponse = "text/event-stream"))),
              (status = 422, body = ErrorBody)))]
pub async fn completions(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    let streamed = req.stream;
    let prepared = prepare(ready, req).await?;
    if streamed {
        let permit = state.permit(prepared.choices())?;
        return stream(ready, prepared, permit);
    }
    let _permit = state.permit(prepared.choices())?;
    Ok(Json(run(ready, prepared).await?).into_response())
}

/// A completion without streaming (also a Vertex `prompt` instance).
pub async fn complete(
    ready: &Ready,
    req: CompletionRequest,
) -> Result<CompletionResponse, ApiError> {
    if req.stream {
        return Err(invalid!("`stream` is not available here"));
    }
    let prepared = prepare(ready, req).await?;
    run(ready, prepared).await
}

struct Prepared {
    prompts: Vec<(String, ValidGenerate)>,
    n: u32,
    echo: bool,
    /// `logprobs`: None = no scores, Some(k) = chosen token + k alternatives.
    logprobs: Option<u32>,
    include_usage: bool,
}

impl Prepared {
    fn choices(&self) -> u32 {
        self.prompts.len() as u32 * self.n
    }
}

async fn prepare(ready: &Ready, req: CompletionRequest) -> Result<Prepared, ApiError> {
    let limits = ready.validator.limits();
    let shared = Shared {
        temperature: req.temperature,
        top_p: req.top_p,
        n: req.n,
        stop: req.stop,
        seed: req.seed,
        frequency_penalty: req.frequency_penalty,
        presence_penalty: req.presence_penalty,
        logit_bias: req.logit_bias,
    };
    let n = shared.check(limits)?;
    if req.best_of.is_some_and(|b| b != 1) {
        return Err(invalid!(
            "`best_of` is not supported on /v1/completions (only 1); use `n`"
        ));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(invalid!("`suffix` is not supported"));
    }
    let logprobs = match req.logprobs {
        None => None,
        Some(k) if k < 0 || k > limits.max_top_n_tokens as i64 => {
            return Err(invalid!(
                "`logprobs` must be between 0 and {} (--max-top-n-tokens), got {k}",
                limits.max_top_n_tokens
            ))
        }
        Some(k) => Some(k as u32),
    };
    let max_tokens = req.max_tokens.unwrap_or(16);
    if max_tokens < 0 {
        return Err(invalid!("`max_tokens` must be >= 0, got {max_tokens}"));
    }
    let prompt_scores = req.echo && logprobs.is_some();
    if prompt_scores && !limits.enable_prefill_logprobs {
        return Err(invalid!("`echo` with `logprobs` (prompt logprobs) needs the server started with --enable-prefill-logprobs"));
    }
    if max_tokens == 0 && !prompt_scores {
        return Err(invalid!(
            "`max_tokens` 0 is only allowed with `echo` and `logprobs` (scoring the prompt)"
        ));
    }
    if req.stream && prompt_scores {
        return Err(invalid!("`echo` with `logprobs` cannot be streamed"));
    }
    let prompts = req.prompt.into_vec();
    if prompts.is_empty() {
        return Err(invalid!("`prompt` must not be an empty list"));
    }
    let mut params = shared.parameters(Some(max_tokens));
    params.details = logprobs.is_some();
    params.top_n_tokens = logprobs.filter(|&k| k > 0).map(i64::from);
    params.decoder_input_details = prompt_scores;
    let multi = prompts.len() > 1;
    let mut valid = Vec::with_capacity(prompts.len());
    for (i, prompt) in prompts.into_iter().enumerate() {
        let v = ready
            .validator
            .validate(prompt.clone(), &params, true)
            .await;
        let v = v
            .map_err(|e| openai_names(e, "prompt", "logprobs"))
            .map_err(|e| {
                if multi {
                    e.context(&format!("prompt[{i}]"))
                } else {
                    e
                }
            })?;
        valid.push((prompt, v));
    }
    Ok(Prepared {
        prompts: valid,
        n,
        echo: req.echo,
        logprobs,
        include_usage: req.stream_options.is_some_and(|o| o.include_usage),
    })
}

async fn run(ready: &Ready, p: Prepared) -> Result<CompletionResponse, ApiError> {
    let tokenizer = ready.validator.tokenizer();
    let runs = p.prompts.iter().flat_map(|(prompt, valid)| {
        (0..p.n).map(move |i| {
            let request = choice_request(&valid.request, i);
            let tracker = TextTracker::new(tokenizer.clone(), valid.stop.clone());
            async move {
                let rx = ready.backend.schedule(request)?;
                let g = collect(rx, tracker).await?;
                Ok::<_, ApiError>((prompt, valid, g))
            }
        })
    });
    let results = try_join_all(runs).await?;
    let (mut prompt_tokens, mut completion_tokens) = (0, 0);
    let mut choices = Vec::with_capacity(results.len());
    for (index, (prompt, valid, g)) in results.into_iter().enumerate() {
        // A prompt counts once however many choices it has.
        if (index as u32).is_multiple_of(p.n) {
            prompt_tokens += valid.request.input_ids.len() as u32;
        }
        completion_tokens += g.tokens.len() as u32;
        let text = if p.echo {
            format!("{prompt}{}", g.text)
        } else {
            g.text.clone()
        };
        let logprobs = p.logprobs.map(|k| {
            let mut lp = CompletionLogprobs::default();
            // Offsets count characters from the start of the prompt, as OpenAI's do.
            let start = if p.echo {
                append(&mut lp, tokenizer, &g.prompt, k, 0)
            } else {
                prompt.chars().count() as u32
            };
            append(&mut lp, tokenizer, &g.tokens, k, start);
            lp
        });
        choices.push(CompletionChoice {
            index: index as u32,
            text,
            logprobs,
            finish_reason: Some(finish_reason(g.finish)),
        });
    }
    Ok(CompletionResponse {
        id: new_id("cmpl"),
        object: "text_completion".to_string(),
        created: now(),
        model: ready.info.model_id.clone(),
        choices,
        usage: Some(usage(prompt_tokens, completion_tokens)),
    })
}

/// Adds tokens to OpenAI's parallel lists, the first at character offset `start`;
/// returns the offset after the last.
fn append(
    lp: &mut CompletionLogprobs,
    tokenizer: &ModelTokenizer,
    tokens: &[TokenScore],
    k: u32,
    start: u32,
) -> u32 {
    let mut offset = start;
    for t in tokens {
        let text = tokenizer.token_text(t.id).unwrap_or_default();
        lp.text_offset.push(offset);
        offset += text.chars().count() as u32;
        lp.tokens.push(text);
        lp.token_logprobs.push(t.logprob.map(json_logprob));
        lp.top_logprobs
            .push(t.logprob.map(|_| top_map(tokenizer, t, k)));
    }
    offset
}

fn top_map(
    tokenizer: &ModelTokenizer,
    t: &TokenScore,
    k: u32,
) -> serde_json::Map<String, serde_json::Value> {
    let mut map = serde_json::Map::new();
    for &(id, lp) in t.top.iter().take(k as usize) {
        let text = tokenizer.token_text(id).unwrap_or_default();
        // Sorted descending: the first id with a given text is the more likely one.
        map.entry(text).or_insert(f32_value(json_logprob(lp)));
    }
    map
}

fn stream(ready: &Ready, p: Prepared, permit: OwnedSemaphorePermit) -> Result<Response, ApiError> {
    let tokenizer = ready.validator.tokenizer().clone();
    let (id, model, created) = (new_id("cmpl"), ready.info.model_id.clone(), now());
    let prompt_tokens: u32 = p
        .prompts
        .iter()
        .map(|(_, v)| v.request.input_ids.len() as u32)
        .sum();
    let mut choices: Vec<ChoiceStream> = Vec::new();
    // Per choice: the prompt to echo before its first token, and the character offset
    // of its next token.
    let mut echo = Vec::new();
    let mut offsets = Vec::new();
    for (pi, (prompt, valid)) in p.prompts.iter().enumerate() {
        for i in 0..p.n {
            let index = pi as u32 * p.n + i;
            let rx = ready.backend.schedule(choice_request(&valid.request, i))?;
            let tracker = TextTracker::new(tokenizer.clone(), valid.stop.clone());
            choices.push(steps(rx, tracker).map(move |s| (index, s)).boxed());
            echo.push(p.echo.then(|| prompt.clone()));
            offsets.push(prompt.chars().count() as u32);
        }
    }
    let response = move |choices: Vec<CompletionChoice>, usage: Option<Usage>| CompletionResponse {
        id: id.clone(),
        object: "text_completion".to_string(),
        created,
        model: model.clone(),
        choices,
        usage,
    };
    let usage_chunk = p.include_usage.then(|| {
        let response = response.clone();
        Box::new(move |generated| {
            json_event(&response(Vec::new(), Some(usage(prompt_tokens, generated))))
        }) as Box<dyn FnOnce(u32) -> Event + Send>
    });
    let logprobs = p.logprobs;
    let chunk = move |index: u32, step: Step| {
        let i = index as usize;
        let mut text = step.delta;
        if let Some(prompt) = echo[i].take() {
            text.insert_str(0, &prompt);
        }
        let logprobs = logprobs.map(|k| {
            let mut lp = CompletionLogprobs::default();
            offsets[i] = append(
                &mut lp,
                &tokenizer,
                std::slice::from_ref(&step.token),
                k,
                offsets[i],
            );
            lp
        });
        let finish_reason = step.last.as_ref().map(|l| finish_reason(l.finish));
        json_event(&response(
            vec![CompletionChoice {
                index,
                text,
                logprobs,
                finish_reason,
            }],
            None,
        ))
    };
    Ok(sse(merge_choices(choices, chunk, usage_chunk, permit)))
}

/// An f32 as JSON with its shortest digits (`-0.78488064`, not the f64 widening
/// `-0.7848806381225586`), like every other logprob the server writes.
fn f32_value(x: f32) -> serde_json::Value {
    x.to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(serde_json::Value::Null, serde_json::Value::Number)
}
