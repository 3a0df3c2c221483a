//! Turns a `GenerationSpec` into a `ValidGenerate`, once, for every API: each rule broken
//! is a `Violation` naming the field, the value and the limit.

use std::sync::Arc;

use sonde_tokenizer::ModelTokenizer;

use sonde_proto::LogprobsMode;

use crate::infer::{Sampling, ScoreRequest, ValidRequest};
use crate::request::{Field, GenerationSpec, Prompt, SamplingSpec, SpecError, Violation};

/// Longest stop sequence accepted, in bytes: matching looks back this far after each token.
pub const MAX_STOP_SEQUENCE_BYTES: usize = 1024;

/// The limits a request is checked against, resolved at startup from flags and the shard.
#[derive(Debug, Clone)]
pub struct ValidationLimits {
    pub max_input_tokens: u32,
    pub max_total_tokens: u32,
    pub max_top_n_tokens: u32,
    pub max_best_of: u32,
    pub max_stop_sequences: usize,
    pub max_label_tokens: u32,
    pub enable_prefill_logprobs: bool,
    pub default_logprobs_mode: LogprobsMode,
    /// `max_new_tokens` when the request gives none (capped by what the context leaves).
    pub default_max_new_tokens: u32,
    pub vocab_size: u32,
    /// The shard's KV budget: a request reserving more could never be scheduled.
    pub max_batch_total_tokens: u32,
}

/// A request after validation, with what every API needs to answer it.
#[derive(Debug, Clone)]
pub struct ValidGenerate {
    pub request: ValidRequest,
    pub stop: Vec<String>,
    /// How many generations to run (TGI `best_of`, OpenAI `n`); see `generation`.
    pub generations: u32,
}

impl ValidGenerate {
    /// Generation `i` of the request. The one seeding rule of every API: generation `i`
    /// samples with the request's seed + `i`, so a seeded request with `n: 3` is
    /// reproducible and its choices still differ.
    pub fn generation(&self, i: u32) -> ValidRequest {
        let mut request = self.request.clone();
        if let Sampling::Sample { seed, .. } = &mut request.sampling {
            *seed = seed.wrapping_add(i as u64);
        }
        request
    }
}

#[derive(Clone)]
pub struct Validator {
    tokenizer: Arc<ModelTokenizer>,
    limits: ValidationLimits,
}

impl Validator {
    pub fn new(tokenizer: Arc<ModelTokenizer>, limits: ValidationLimits) -> Self {
        Self { tokenizer, limits }
    }

    pub fn limits(&self) -> &ValidationLimits {
        &self.limits
    }

    pub fn tokenizer(&self) -> &Arc<ModelTokenizer> {
        &self.tokenizer
    }

    /// Tokenizes off the async workers: a 2 MB prompt takes long enough to stall them.
    pub async fn tokenize(
        &self,
        text: String,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, SpecError> {
        let tokenizer = self.tokenizer.clone();
        tokio::task::spawn_blocking(move || tokenizer.encode(&text, add_special_tokens))
            .await
            .map_err(|e| SpecError::Internal(format!("tokenizer task failed: {e}")))?
            .map_err(|e| Violation::Untokenizable(e.to_string()).into())
    }

    /// Checks `spec` and makes the request the shard runs.
    pub async fn validate(&self, spec: GenerationSpec) -> Result<ValidGenerate, SpecError> {
        // Cheap checks first, so a bad parameter is not preceded by tokenizing 2 MB.
        check_options(&spec, &self.limits)?;
        let ids = match &spec.prompt {
            Prompt::Text {
                text,
                add_special_tokens,
            } => self.tokenize(text.clone(), *add_special_tokens).await?,
            Prompt::Ids(ids) => check_ids(Field::Prompt, ids, self.limits.vocab_size)?,
        };
        Ok(self.build(ids, spec)?)
    }

    /// The checks that need the prompt's tokens, and the request they make.
    fn build(&self, mut ids: Vec<u32>, spec: GenerationSpec) -> Result<ValidGenerate, Violation> {
        let l = &self.limits;
        if let Some(truncate) = spec.truncate {
            let keep = truncate as usize;
            if ids.len() > keep {
                ids.drain(..ids.len() - keep);
            }
        }
        if ids.is_empty() {
            return Err(Violation::EmptyPrompt);
        }
        let input_len = ids.len() as u32;
        if input_len > l.max_input_tokens {
            return Err(Violation::PromptTooLong {
                max: l.max_input_tokens,
                got: input_len,
            });
        }
        let room = l.max_total_tokens.saturating_sub(input_len);
        let max_new_tokens = match spec.max_new_tokens {
            None => {
                let kv_room = l.max_batch_total_tokens.saturating_sub(input_len);
                l.default_max_new_tokens.min(room).min(kv_room)
            }
            Some(n) => n as u32,
        };
        if input_len + max_new_tokens > l.max_total_tokens {
            return Err(Violation::OverTotalTokens {
                max: l.max_total_tokens,
                prompt: input_len,
                new: max_new_tokens,
            });
        }
        if input_len + max_new_tokens > l.max_batch_total_tokens {
            return Err(Violation::OverKvBudget {
                max: l.max_batch_total_tokens,
                prompt: input_len,
                new: max_new_tokens,
            });
        }
        let scores = spec.scores;
        if max_new_tokens == 0 && !scores.prefill_logprobs {
            return Err(Violation::NothingToDo);
        }
        let request = ValidRequest {
            input_ids: ids,
            max_new_tokens,
            sampling: spec.sampling.resolve(),
            repetition_penalty: spec.repetition_penalty.map(|x| x as f32),
            frequency_penalty: spec
                .frequency_penalty
                .filter(|&x| x != 0.0)
                .map(|x| x as f32),
            scores: ScoreRequest {
                top_n_tokens: scores.top_n_tokens.unwrap_or(0) as u32,
                prefill_logprobs: scores.prefill_logprobs,
                mode: scores.mode.unwrap_or(l.default_logprobs_mode),
                return_logits: scores.return_logits,
                label_ids: scores.label_ids.iter().map(|&id| id as u32).collect(),
                skip_token_logprobs: scores.skip_token_logprobs,
            },
        };
        Ok(ValidGenerate {
            request,
            stop: spec.stop,
            generations: spec.generations.unwrap_or(1) as u32,
        })
    }
}

/// Every rule that needs no tokens.
fn check_options(spec: &GenerationSpec, l: &ValidationLimits) -> Result<(), Violation> {
    let int_range = |field, value: Option<i64>, min: i64, max: u32, flag| match value {
        Some(got) if got < min || got > max as i64 => Err(Violation::IntRange {
            field,
            min,
            max: max as i64,
            flag: Some(flag),
            got,
        }),
        _ => Ok(()),
    };
    int_range(
        Field::MaxNewTokens,
        spec.max_new_tokens,
        0,
        l.max_total_tokens,
        "--max-total-tokens",
    )?;
    check_sampling(&spec.sampling)?;
    if let Some(got) = spec.repetition_penalty {
        if !positive_f32(got) {
            let field = Field::RepetitionPenalty;
            return Err(Violation::NotPositiveF32 { field, got });
        }
    }
    if let Some(got) = spec.frequency_penalty {
        if !(-2.0..=2.0).contains(&got) {
            return Err(Violation::FloatRange {
                field: Field::FrequencyPenalty,
                min: -2.0,
                max: 2.0,
                got,
            });
        }
    }
    check_stop(&spec.stop, l)?;
    let truncate = spec.truncate;
    int_range(
        Field::Truncate,
        truncate,
        1,
        l.max_input_tokens,
        "--max-input-tokens",
    )?;
    let top_n_tokens = spec.scores.top_n_tokens;
    int_range(
        Field::TopNTokens,
        top_n_tokens,
        0,
        l.max_top_n_tokens,
        "--max-top-n-tokens",
    )?;
    let generations = spec.generations;
    int_range(
        Field::Generations,
        generations,
        1,
        l.max_best_of,
        "--max-best-of",
    )?;
    if spec.scores.prefill_logprobs && !l.enable_prefill_logprobs {
        return Err(Violation::PrefillNotEnabled);
    }
    check_labels(&spec.scores.label_ids, l)
}

/// The shard samples in f32, so each value is checked as it will arrive there (found by
/// tests/props.rs).
fn check_sampling(s: &SamplingSpec) -> Result<(), Violation> {
    if let Some(got) = s.temperature {
        if !positive_f32(got) {
            let field = Field::Temperature;
            return Err(Violation::NotPositiveF32 { field, got });
        }
    }
    if let Some(got) = s.top_k {
        if got <= 0 || got > u32::MAX as i64 {
            return Err(Violation::NotPositive {
                field: Field::TopK,
                got,
            });
        }
    }
    for (field, value) in [(Field::TopP, s.top_p), (Field::TypicalP, s.typical_p)] {
        if let Some(got) = value {
            if !(positive_f32(got) && got <= 1.0) {
                return Err(Violation::NotProbability { field, got });
            }
        }
    }
    Ok(())
}

/// Whether `x` is still a finite number above 0 once the shard receives it as an f32.
fn positive_f32(x: f64) -> bool {
    let x = x as f32;
    x.is_finite() && x > 0.0
}

fn check_stop(stop: &[String], l: &ValidationLimits) -> Result<(), Violation> {
    let field = Field::Stop;
    if stop.len() > l.max_stop_sequences {
        return Err(Violation::TooMany {
            field,
            max: l.max_stop_sequences,
            unit: "sequences",
            flag: Some("--max-stop-sequences"),
            got: stop.len(),
        });
    }
    for (index, s) in stop.iter().enumerate() {
        if s.is_empty() {
            return Err(Violation::EmptyItem { field, index });
        }
        if s.len() > MAX_STOP_SEQUENCE_BYTES {
            return Err(Violation::ItemTooLong {
                field,
                index,
                max_bytes: MAX_STOP_SEQUENCE_BYTES,
                got: s.len(),
            });
        }
    }
    Ok(())
}

fn check_labels(ids: &[i64], l: &ValidationLimits) -> Result<(), Violation> {
    if ids.len() > l.max_label_tokens as usize {
        return Err(Violation::TooMany {
            field: Field::LabelIds,
            max: l.max_label_tokens as usize,
            unit: "ids",
            flag: None,
            got: ids.len(),
        });
    }
    check_ids(Field::LabelIds, ids, l.vocab_size).map(drop)
}

/// Token ids as the client sent them, each checked against the vocabulary.
fn check_ids(field: Field, ids: &[i64], vocab: u32) -> Result<Vec<u32>, Violation> {
    ids.iter()
        .map(|&id| match u32::try_from(id) {
            Ok(ok) if ok < vocab => Ok(ok),
            _ => Err(Violation::OutsideVocabulary { field, id, vocab }),
        })
        .collect()
}
