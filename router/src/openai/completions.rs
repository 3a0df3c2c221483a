//! `/v1/completions`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::future::try_join_all;
use sonde_tokenizer::ModelTokenizer;
use tokio::sync::OwnedSemaphorePermit;

use super::types::{
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, PromptInput, Usage,
};
use super::{
    choice_stream, finish_reason, generation_route, header, merge_choices, usage, usage_chunk,
    ChoiceStream, CompletionNames, Counts,
};
use crate::error::ApiError;
use crate::generation::{collect, json_logprob, steps, Step, TextTracker};
use crate::infer::TokenScore;
use crate::invalid;
use crate::json::ApiJson;
use crate::request::{GenerationSpec, Prompt};
use crate::sse::{json_event, sse};
use crate::state::{AppState, Ready};
use crate::validation::ValidGenerate;

generation_route! {
    /// OpenAI completions, with `logprobs` (top-N per position) and `echo` (prompt scores).
    completions, "/v1/completions", CompletionRequest,
    "the answer, or with `stream: true` a text/event-stream of CompletionResponse chunks",
    CompletionResponse, CompletionResponse
}

pub(crate) struct Prepared {
    /// Each prompt with its request, whose `generations` are the `n` choices.
    prompts: Vec<(String, ValidGenerate)>,
    echo: bool,
    /// `logprobs`: None = no scores, Some(k) = chosen token + k alternatives.
    logprobs: Option<u32>,
    include_usage: bool,
}

impl Prepared {
    /// Choices over all prompts, each holding one concurrency permit.
    pub fn generations(&self) -> u32 {
        self.prompts.iter().map(|(_, v)| v.generations).sum()
    }
}

/// Checks and validates a request (also a Vertex instance, which must not stream).
pub(crate) async fn prepare(
    ready: &Ready,
    mut req: CompletionRequest,
) -> Result<Prepared, ApiError> {
    let max_tokens = check(&req, ready.validator.limits().enable_prefill_logprobs)?;
    let shared = req.take_shared();
    shared.check()?;
    let prompts: Vec<Prompt> = match req.prompt {
        PromptInput::Texts(texts) => texts
            .into_iter()
            .map(|text| Prompt::Text {
                text,
                add_special_tokens: true,
            })
            .collect(),
        PromptInput::TokenIds(lists) => lists.into_iter().map(Prompt::Ids).collect(),
    };
    if prompts.is_empty() {
        return Err(invalid!("`prompt` must not be an empty list"));
    }
    let multi = prompts.len() > 1;
    let mut valid = Vec::with_capacity(prompts.len());
    for (i, prompt) in prompts.into_iter().enumerate() {
        let mut spec = shared.to_spec(prompt, Some(max_tokens));
        spec.scores.top_n_tokens = req.logprobs;
        spec.scores.prefill_logprobs = req.echo && req.logprobs.is_some();
        spec.scores.skip_token_logprobs = req.logprobs.is_none();
        let named = |e: ApiError| {
            if multi {
                e.context(&format!("prompt[{i}]"))
            } else {
                e
            }
        };
        valid.push(validate(ready, spec).await.map_err(named)?);
    }
    Ok(Prepared {
        prompts: valid,
        // Validated: 0..=--max-top-n-tokens.
        logprobs: req.logprobs.map(|k| k as u32),
        echo: req.echo,
        include_usage: req.stream_options.is_some_and(|o| o.include_usage),
    })
}

/// The rules only `/v1/completions` has; returns `max_tokens` (OpenAI's default 16).
fn check(req: &CompletionRequest, prefill_enabled: bool) -> Result<i64, ApiError> {
    if req.best_of.is_some_and(|b| b != 1) {
        return Err(invalid!(
            "`best_of` is not supported on /v1/completions (only 1); use `n`"
        ));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(invalid!("`suffix` is not supported"));
    }
    let max_tokens = req.max_tokens.unwrap_or(16);
    if max_tokens < 0 {
        return Err(invalid!("`max_tokens` must be >= 0, got {max_tokens}"));
    }
    let prompt_scores = req.echo && req.logprobs.is_some();
    if prompt_scores && !prefill_enabled {
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
    Ok(max_tokens)
}

/// One prompt's request, with the text `echo` shows: the prompt's own, or for token ids
/// the text they decode to.
async fn validate(
    ready: &Ready,
    spec: GenerationSpec,
) -> Result<(String, ValidGenerate), ApiError> {
    let text = match &spec.prompt {
        Prompt::Text { text, .. } => Some(text.clone()),
        Prompt::Ids(_) => None,
    };
    let valid = ready.validator.validate(spec).await;
    let valid = valid.map_err(|e| e.in_words(&CompletionNames))?;
    let text = match text {
        Some(text) => text,
        None => ready
            .validator
            .tokenizer()
            .decode(&valid.request.input_ids, false)
            .map_err(|e| ApiError::Internal(format!("decoding a token-id prompt: {e}")))?,
    };
    Ok((text, valid))
}

/// Runs a prepared request to the end and builds the answer.
pub(crate) async fn run(ready: &Ready, p: Prepared) -> Result<CompletionResponse, ApiError> {
    let tokenizer = ready.validator.tokenizer();
    let runs = p.prompts.iter().flat_map(|(prompt, valid)| {
        (0..valid.generations).map(move |i| {
            let request = valid.generation(i);
            let tracker = TextTracker::new(tokenizer.clone(), valid.stop.clone());
            async move {
                let rx = ready.backend.schedule(request)?;
                let g = collect(rx, tracker).await?;
                Ok::<_, ApiError>((prompt, i, g))
            }
        })
    });
    let results = try_join_all(runs).await?;
    // A prompt counts once however many choices it has.
    let prompt_tokens = prompt_tokens(&p);
    let mut counts = Counts::default();
    let mut choices = Vec::with_capacity(results.len());
    for (index, (prompt, generation, g)) in results.into_iter().enumerate() {
        counts.completion += g.tokens.len() as u32;
        // A prompt counts once: as its first choice found it.
        if generation == 0 {
            counts.cached += g.cached_prompt_tokens;
        }
        let text = if p.echo {
            format!("{prompt}{}", g.text)
        } else {
            g.text.clone()
        };
        let logprobs = p.logprobs.map(|k| {
            let mut lp = CompletionLogprobs::default();
            let listing = Listing { tokenizer, k };
            // Offsets count characters from the start of the prompt, as OpenAI's do.
            let start = if p.echo {
                listing.append(&mut lp, &g.prompt, 0)
            } else {
                prompt.chars().count() as u32
            };
            listing.append(&mut lp, &g.tokens, start);
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
        header: header("cmpl", "text_completion", &ready.info.model_id),
        choices,
        usage: Some(usage(prompt_tokens, counts)),
    })
}

fn prompt_tokens(p: &Prepared) -> u32 {
    p.prompts
        .iter()
        .map(|(_, v)| v.request.input_ids.len() as u32)
        .sum()
}

/// How a choice's tokens are listed: by their text, with `k` alternatives each.
#[derive(Clone, Copy)]
struct Listing<'a> {
    tokenizer: &'a ModelTokenizer,
    k: u32,
}

impl Listing<'_> {
    /// Adds tokens to OpenAI's parallel lists, the first at character offset `start`;
    /// returns the offset after the last.
    fn append(self, lp: &mut CompletionLogprobs, tokens: &[TokenScore], start: u32) -> u32 {
        let mut offset = start;
        for t in tokens {
            let text = self.tokenizer.token_text(t.id).unwrap_or_default();
            lp.text_offset.push(offset);
            offset += text.chars().count() as u32;
            lp.tokens.push(text);
            lp.token_logprobs.push(t.logprob.map(json_logprob));
            lp.top_logprobs.push(t.logprob.map(|_| self.top_map(t)));
        }
        offset
    }

    fn top_map(self, t: &TokenScore) -> serde_json::Map<String, serde_json::Value> {
        let mut map = serde_json::Map::new();
        for &(id, lp) in t.top.iter().take(self.k as usize) {
            let text = self.tokenizer.token_text(id).unwrap_or_default();
            // Sorted descending: the first id with a given text is the more likely one.
            map.entry(text).or_insert(f32_value(json_logprob(lp)));
        }
        map
    }
}

fn stream(ready: &Ready, p: Prepared, permit: OwnedSemaphorePermit) -> Result<Response, ApiError> {
    let tokenizer = ready.validator.tokenizer().clone();
    let head = header("cmpl", "text_completion", &ready.info.model_id);
    let prompt_tokens = prompt_tokens(&p);
    let mut choices: Vec<ChoiceStream> = Vec::new();
    // Per choice: the prompt to echo before its first token, and the character offset
    // of its next token.
    let mut echo = Vec::new();
    let mut offsets = Vec::new();
    for (prompt, valid) in &p.prompts {
        for i in 0..valid.generations {
            let index = choices.len() as u32;
            let rx = ready.backend.schedule(valid.generation(i))?;
            let tracker = TextTracker::new(tokenizer.clone(), valid.stop.clone());
            choices.push(choice_stream(index, steps(rx, tracker), i == 0));
            echo.push(p.echo.then(|| prompt.clone()));
            offsets.push(prompt.chars().count() as u32);
        }
    }
    let response = move |choices: Vec<CompletionChoice>, usage: Option<Usage>| CompletionResponse {
        header: head.clone(),
        choices,
        usage,
    };
    let closing = response.clone();
    let usage_chunk = usage_chunk(p.include_usage, prompt_tokens, move |usage| {
        closing(Vec::new(), usage)
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
            let listing = Listing {
                tokenizer: &tokenizer,
                k,
            };
            offsets[i] = listing.append(&mut lp, std::slice::from_ref(&step.token), offsets[i]);
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
