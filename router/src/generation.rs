//! Consuming a request's events: detokenization, stop sequences, and collecting a whole
//! generation. Shared by every API, streamed or not, so they all agree on text and stops.

use std::sync::Arc;

use sonde_tokenizer::{ModelTokenizer, StreamDecoder};

use crate::error::ApiError;
use crate::infer::{EventReceiver, FinishReason, InferEvent, TokenScore};

/// JSON has no -inf: a token outside the sampler's support (processed mode) reports this.
pub const LOGPROB_FLOOR: f32 = -9999.0;

/// A logprob as JSON can carry it.
pub fn json_logprob(x: f32) -> f32 {
    if x.is_finite() {
        x
    } else {
        LOGPROB_FLOOR
    }
}

/// Text of the generated tokens, and where a stop sequence matched.
pub struct TextTracker {
    tokenizer: Arc<ModelTokenizer>,
    decoder: StreamDecoder,
    stops: Vec<String>,
    text: String,
    /// Bytes of `text` already handed out by `push`.
    emitted: usize,
    /// Byte offset in `text` where the matched stop sequence starts.
    stop_at: Option<usize>,
}

impl TextTracker {
    pub fn new(tokenizer: Arc<ModelTokenizer>, stops: Vec<String>) -> Self {
        Self {
            tokenizer,
            decoder: StreamDecoder::new(),
            stops,
            text: String::new(),
            emitted: 0,
            stop_at: None,
        }
    }

    /// Adds a generated token. Returns the text that became safe to show: whole
    /// characters, never the start of a possible stop sequence, never the stop itself.
    pub fn push(&mut self, id: u32) -> String {
        if self.stop_at.is_some() {
            return String::new();
        }
        // Special tokens (eos, chat markers) are not part of the text, as with
        // `skip_special_tokens`.
        if !self.tokenizer.is_special(id) {
            if let Some(bytes) = self.tokenizer.token_bytes(id) {
                let before = self.text.len();
                let chunk = self.decoder.push(bytes);
                self.text.push_str(&chunk);
                self.find_stop(before);
            }
        }
        let safe_end = match self.stop_at {
            Some(at) => at,
            None => self.text.len() - self.held_back(),
        };
        self.take(safe_end)
    }

    /// Whether a stop sequence has matched.
    pub fn stopped(&self) -> bool {
        self.stop_at.is_some()
    }

    /// Ends the generation: what is still held back (a partial stop or character).
    pub fn flush(&mut self) -> String {
        if self.stop_at.is_none() {
            let tail = self.decoder.finish();
            self.text.push_str(&tail);
        }
        let end = self.stop_at.unwrap_or(self.text.len());
        self.take(end)
    }

    /// All generated text, stop sequence included (TGI's `generated_text`).
    pub fn full_text(&self) -> &str {
        &self.text
    }

    /// The text before the stop sequence (OpenAI's).
    pub fn text_before_stop(&self) -> &str {
        &self.text[..self.stop_at.unwrap_or(self.text.len())]
    }

    fn take(&mut self, end: usize) -> String {
        if end <= self.emitted {
            return String::new();
        }
        let out = self.text[self.emitted..end].to_string();
        self.emitted = end;
        out
    }

    /// A stop can only end inside the new chunk, so look back at most its length.
    fn find_stop(&mut self, chunk_start: usize) {
        let mut best: Option<usize> = None;
        for stop in &self.stops {
            let mut from = chunk_start.saturating_sub(stop.len().saturating_sub(1));
            while !self.text.is_char_boundary(from) {
                from -= 1;
            }
            if let Some(pos) = self.text[from..].find(stop.as_str()) {
                let at = from + pos;
                best = Some(best.map_or(at, |b| b.min(at)));
            }
        }
        self.stop_at = best;
    }

    /// Bytes at the end of the unshown text that could begin a stop sequence.
    fn held_back(&self) -> usize {
        let tail = &self.text[self.emitted..];
        let mut hold = 0;
        for stop in &self.stops {
            for (k, _) in stop.char_indices().skip(1) {
                if k > hold && tail.ends_with(&stop[..k]) {
                    hold = k;
                }
            }
        }
        hold
    }
}

/// A finished generation.
#[derive(Debug, Clone)]
pub struct Generated {
    pub prompt: Vec<TokenScore>,
    /// Prompt tokens the shard's prefix cache supplied.
    pub cached_prompt_tokens: u32,
    pub tokens: Vec<TokenScore>,
    /// Every generated token decoded (stop sequence included).
    pub full_text: String,
    /// The text up to the stop sequence.
    pub text: String,
    pub finish: FinishReason,
}

/// Reads a request's events to the end. Returning drops the receiver, which cancels the
/// request in the scheduler when it stopped on a stop sequence.
pub async fn collect(
    mut rx: EventReceiver,
    mut tracker: TextTracker,
) -> Result<Generated, ApiError> {
    let mut prompt = Vec::new();
    let mut cached_prompt_tokens = 0;
    let mut tokens = Vec::new();
    let finish = loop {
        let Some(event) = rx.recv().await else {
            return Err(ApiError::Generation(
                "the request was dropped by the scheduler without an answer".into(),
            ));
        };
        match event? {
            InferEvent::Prompt {
                scores,
                cached_tokens,
            } => {
                prompt = scores;
                cached_prompt_tokens = cached_tokens;
            }
            InferEvent::Token { token, finish } => {
                tracker.push(token.id);
                tokens.push(token);
                if tracker.stopped() {
                    break FinishReason::StopSequence;
                }
                if let Some(finish) = finish {
                    break finish;
                }
            }
            InferEvent::End(finish) => break finish,
        }
    };
    tracker.flush();
    Ok(Generated {
        prompt,
        cached_prompt_tokens,
        tokens,
        full_text: tracker.full_text().to_string(),
        text: tracker.text_before_stop().to_string(),
        finish,
    })
}

/// One streamed token with the text it made safe to show.
#[derive(Debug, Clone)]
pub struct Step {
    /// 0-based position among the generated tokens.
    pub index: u32,
    /// Prompt tokens the prefix cache supplied; on the first step only, 0 after.
    pub cached_prompt_tokens: u32,
    pub token: TokenScore,
    pub delta: String,
    /// Set on the last token.
    pub last: Option<Last>,
}

#[derive(Debug, Clone)]
pub struct Last {
    pub finish: FinishReason,
    pub full_text: String,
    pub text: String,
    pub generated_tokens: u32,
}

struct StepState {
    rx: EventReceiver,
    tracker: TextTracker,
    index: u32,
    cached_prompt_tokens: u32,
    done: bool,
}

/// A request's tokens as a stream. The stream owns the receiver, so a client that goes
/// away (the HTTP body is dropped) cancels the request at once.
pub fn steps(
    rx: EventReceiver,
    tracker: TextTracker,
) -> impl futures::Stream<Item = Result<Step, ApiError>> {
    let state = StepState {
        rx,
        tracker,
        index: 0,
        cached_prompt_tokens: 0,
        done: false,
    };
    futures::stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        loop {
            let event = match s.rx.recv().await {
                Some(Ok(event)) => event,
                Some(Err(e)) => {
                    s.done = true;
                    return Some((Err(e), s));
                }
                None => {
                    s.done = true;
                    let e = ApiError::Generation(
                        "the request was dropped by the scheduler without an answer".into(),
                    );
                    return Some((Err(e), s));
                }
            };
            match event {
                InferEvent::Prompt { cached_tokens, .. } => {
                    s.cached_prompt_tokens = cached_tokens;
                    continue;
                }
                // Only pure scoring ends without a token, and it cannot be streamed.
                InferEvent::End(_) => return None,
                InferEvent::Token { token, finish } => {
                    let mut delta = s.tracker.push(token.id);
                    let finish = if s.tracker.stopped() {
                        Some(FinishReason::StopSequence)
                    } else {
                        finish
                    };
                    let index = s.index;
                    s.index += 1;
                    let last = finish.map(|finish| {
                        delta.push_str(&s.tracker.flush());
                        s.done = true;
                        Last {
                            finish,
                            full_text: s.tracker.full_text().to_string(),
                            text: s.tracker.text_before_stop().to_string(),
                            generated_tokens: s.index,
                        }
                    });
                    return Some((
                        Ok(Step {
                            index,
                            cached_prompt_tokens: std::mem::take(&mut s.cached_prompt_tokens),
                            token,
                            delta,
                            last,
                        }),
                        s,
                    ));
                }
            }
        }
    })
}

#[cfg(test)]
#[path = "generation_tests.rs"]
mod tests;
