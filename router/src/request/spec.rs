//! The API-neutral request every API converts into before validation.

use sonde_proto::LogprobsMode;

use crate::infer::Sampling;

/// The prompt as the client sent it.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text the server tokenizes. `add_special_tokens` is false when a chat template has
    /// already written them (BOS included).
    Text {
        text: String,
        add_special_tokens: bool,
    },
    /// Token ids as sent: each is checked against the vocabulary.
    Ids(Vec<i64>),
}

/// Sampling as asked. Numbers stay as wide as the wire sent them, so validation can name
/// an out-of-range value instead of a type error.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingSpec {
    pub do_sample: bool,
    pub temperature: Option<f64>,
    pub top_k: Option<i64>,
    pub top_p: Option<f64>,
    pub typical_p: Option<f64>,
    pub seed: Option<u64>,
}

impl SamplingSpec {
    /// `top_p` / `typical_p` of 1.0 keep every token: they are "off", not a reason to sample.
    fn top_p(&self) -> Option<f64> {
        self.top_p.filter(|&x| x < 1.0)
    }

    fn typical_p(&self) -> Option<f64> {
        self.typical_p.filter(|&x| x < 1.0)
    }

    /// Sampling turns on with `do_sample` or any parameter that only means something when
    /// sampling (API.md); temperature 1.0 alone is the model's distribution, argmax'd.
    pub fn samples(&self) -> bool {
        self.do_sample
            || self.temperature.is_some_and(|t| t != 1.0)
            || self.top_k.is_some()
            || self.top_p().is_some()
            || self.typical_p().is_some()
    }

    /// What the shard runs; a missing seed gets a random one, reported back to the client.
    /// Call after validation: the values are narrowed to what the shard takes.
    pub fn resolve(&self) -> Sampling {
        if !self.samples() {
            return Sampling::Greedy;
        }
        Sampling::Sample {
            temperature: self.temperature.unwrap_or(1.0) as f32,
            top_k: self.top_k.map(|k| k as u32),
            top_p: self.top_p().map(|x| x as f32),
            typical_p: self.typical_p().map(|x| x as f32),
            seed: self.seed.unwrap_or_else(rand::random),
        }
    }
}

/// The scores asked for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScoreSpec {
    /// Alternatives per position.
    pub top_n_tokens: Option<i64>,
    /// Scores of the prompt's own tokens.
    pub prefill_logprobs: bool,
    /// None: the server's `--logprobs-mode`.
    pub mode: Option<LogprobsMode>,
    pub return_logits: bool,
    /// Ids whose logprobs are reported at every position.
    pub label_ids: Vec<i64>,
    /// The answer shows no generated token's logprob, so the shard may leave it out (and
    /// find a greedy token without every logit). False by default: only an API that
    /// knows its answer will not show it sets it.
    pub skip_token_logprobs: bool,
}

/// One request of any API, before validation.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationSpec {
    pub prompt: Prompt,
    /// None: the server's `--default-max-new-tokens`, capped by the room the prompt leaves.
    pub max_new_tokens: Option<i64>,
    pub sampling: SamplingSpec,
    pub repetition_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub stop: Vec<String>,
    /// Keep only the last N prompt tokens.
    pub truncate: Option<i64>,
    pub scores: ScoreSpec,
    /// Generations of this one request (TGI's `best_of` candidates, OpenAI's `n`
    /// choices); None is 1.
    pub generations: Option<i64>,
}

impl GenerationSpec {
    /// A request for `prompt` with every option at its default.
    pub fn new(prompt: Prompt) -> Self {
        Self {
            prompt,
            max_new_tokens: None,
            sampling: SamplingSpec::default(),
            repetition_penalty: None,
            frequency_penalty: None,
            stop: Vec::new(),
            truncate: None,
            scores: ScoreSpec::default(),
            generations: None,
        }
    }
}
