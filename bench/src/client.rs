//! One request, timed token by token, against Sonde's TGI stream or an OpenAI stream.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

#[derive(Clone, Copy, Debug)]
pub enum Api {
    /// `/generate_stream`, or `/generate` with prompt logprobs (which cannot stream).
    Sonde { prompt_logprobs: bool },
    /// `/v1/completions` with `stream: true`.
    OpenAi,
    /// Sonde's `/v1/score`: each request scores this many items against one query.
    Score { items: usize },
}

pub struct Client {
    http: reqwest::Client,
    base: String,
    api: Api,
}

/// What one request measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub error: Option<String>,
    /// From sending to the first token (the whole answer when not streamed).
    pub ttft: Option<Duration>,
    /// Gaps between consecutive tokens.
    pub gaps: Vec<Duration>,
    pub latency: Duration,
    pub tokens: u32,
}

impl Client {
    pub fn new(url: &str, api: Api, timeout: Duration) -> anyhow::Result<Self> {
        // A fresh connection per request: llama-server closes idle keep-alive connections
        // in a way a pooled client only finds out about when its next request fails
        // ("error sending request"), which counted as failures against it. A loopback
        // connect costs both servers the same fraction of a millisecond.
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .pool_max_idle_per_host(0)
            .build()?;
        Ok(Self {
            http,
            base: url.trim_end_matches('/').to_string(),
            api,
        })
    }

    pub fn api(&self) -> Api {
        self.api
    }

    pub async fn run(&self, prompt: &str, max_tokens: u32) -> Outcome {
        let started = Instant::now();
        let mut outcome = match self.api {
            Api::Sonde {
                prompt_logprobs: true,
            } => self.scored(prompt, max_tokens, started).await,
            _ => self.streamed(prompt, max_tokens, started).await,
        }
        .unwrap_or_else(|e| Outcome {
            error: Some(e),
            ..Outcome::default()
        });
        outcome.latency = started.elapsed();
        outcome
    }

    fn request(&self, prompt: &str, max_tokens: u32) -> reqwest::RequestBuilder {
        match self.api {
            Api::Sonde { .. } => self
                .http
                .post(format!("{}/generate_stream", self.base))
                .json(&json!({
                    "inputs": prompt,
                    "parameters": {"max_new_tokens": max_tokens, "do_sample": false},
                })),
            Api::OpenAi | Api::Score { .. } => self
                .http
                .post(format!("{}/v1/completions", self.base))
                .json(&json!({
                    "model": "bench", "prompt": prompt, "max_tokens": max_tokens,
                    "temperature": 0, "stream": true,
                })),
        }
    }

    async fn streamed(
        &self,
        prompt: &str,
        max_tokens: u32,
        started: Instant,
    ) -> Result<Outcome, String> {
        let resp = self
            .request(prompt, max_tokens)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("HTTP {}", resp.status()));
        }
        let mut outcome = Outcome::default();
        let mut last: Option<Instant> = None;
        let mut buffer = Vec::new();
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            buffer.extend_from_slice(&chunk.map_err(|e| e.to_string())?);
            // Events end with a blank line; handle every complete one.
            while let Some(end) = find(&buffer, b"\n\n") {
                let event: Vec<u8> = buffer.drain(..end + 2).collect();
                if self.is_token(&event)? {
                    let now = Instant::now();
                    match last {
                        None => outcome.ttft = Some(now - started),
                        Some(prev) => outcome.gaps.push(now - prev),
                    }
                    last = Some(now);
                    outcome.tokens += 1;
                }
            }
        }
        Ok(outcome)
    }

    /// Whether an SSE event carries a token; an error event fails the request.
    fn is_token(&self, event: &[u8]) -> Result<bool, String> {
        let text = String::from_utf8_lossy(event);
        let Some(data) = text
            .lines()
            .find_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
        else {
            return Ok(false);
        };
        if data == "[DONE]" {
            return Ok(false);
        }
        let value: Value =
            serde_json::from_str(data).map_err(|e| format!("bad event {data:?}: {e}"))?;
        if let Some(error) = value.get("error") {
            return Err(format!("error event: {error}"));
        }
        Ok(match self.api {
            Api::Sonde { .. } => value.get("token").is_some(),
            // One chunk per token; the closing chunk of some servers has no text.
            Api::OpenAi | Api::Score { .. } => value["choices"][0]["text"]
                .as_str()
                .is_some_and(|t| !t.is_empty()),
        })
    }

    async fn scored(
        &self,
        prompt: &str,
        max_tokens: u32,
        started: Instant,
    ) -> Result<Outcome, String> {
        let body = json!({
            "inputs": prompt,
            "parameters": {"max_new_tokens": max_tokens, "do_sample": false, "decoder_input_details": true},
        });
        let value = self.post_json("/generate", &body).await?;
        let tokens = value["details"]["generated_tokens"].as_u64().unwrap_or(0) as u32;
        Ok(Outcome {
            ttft: Some(started.elapsed()),
            tokens,
            ..Outcome::default()
        })
    }

    /// One `/v1/score` call: `items` against `query`, two labels each; its outcome counts
    /// the items scored as its tokens.
    pub async fn score(&self, query: &str, items: &[String]) -> Outcome {
        let started = Instant::now();
        let body = json!({"query": query, "items": items, "label_token_ids": [1, 2]});
        let (error, tokens) = match self.post_json("/v1/score", &body).await {
            Ok(value) => (None, value["scores"].as_array().map_or(0, Vec::len) as u32),
            Err(e) => (Some(e), 0),
        };
        Outcome {
            error,
            ttft: Some(started.elapsed()),
            latency: started.elapsed(),
            tokens,
            ..Outcome::default()
        }
    }

    /// POSTs `body` to `path` and reads the JSON answer; a non-2xx status is an error.
    async fn post_json(&self, path: &str, body: &Value) -> Result<Value, String> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("HTTP {}", resp.status()));
        }
        resp.json().await.map_err(|e| e.to_string())
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
