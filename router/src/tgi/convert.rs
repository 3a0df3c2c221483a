//! TGI parameters into Sonde's request, and TGI's names for its fields.

use super::types::{GenerateParameters, GenerateRequest};
use crate::error::ApiError;
use crate::invalid;
use crate::request::{Field, FieldNames, GenerationSpec, Prompt, SamplingSpec, ScoreSpec};
use crate::state::Ready;
use crate::validation::ValidGenerate;

/// TGI's field names are the neutral ones (Sonde's docs are written in them).
pub struct TgiNames;

impl FieldNames for TgiNames {
    fn name(&self, field: Field) -> Option<&'static str> {
        Some(field.neutral_name())
    }
}

impl GenerateParameters {
    /// Sonde's request for `prompt`, after the rules only TGI has; `streamed`: answered
    /// as a stream, whose every event shows its token's logprob.
    pub fn to_spec(&self, prompt: Prompt, streamed: bool) -> Result<GenerationSpec, ApiError> {
        let sampling = SamplingSpec {
            do_sample: self.do_sample,
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            typical_p: self.typical_p,
            seed: self.seed,
        };
        // TGI's best_of picks the likeliest of several samples: greedy candidates would all
        // be the same, and one seed would make them so.
        if self.best_of.is_some_and(|b| b > 1) {
            if !sampling.samples() {
                return Err(invalid!("`best_of` > 1 needs sampling: set `do_sample`, `temperature`, `top_k` or `top_p`"));
            }
            if self.seed.is_some() {
                return Err(invalid!(
                    "`seed` must not be set when `best_of` > 1: each candidate gets its own"
                ));
            }
        }
        if self.grammar.as_ref().is_some_and(|g| !g.is_null()) {
            return Err(invalid!("`grammar` is not supported by this server"));
        }
        if self.adapter_id.is_some() {
            return Err(invalid!(
                "`adapter_id` is not supported by this server (no LoRA adapters)"
            ));
        }
        Ok(GenerationSpec {
            prompt,
            max_new_tokens: self.max_new_tokens,
            sampling,
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            stop: self.stop.clone(),
            truncate: self.truncate,
            scores: ScoreSpec {
                top_n_tokens: self.top_n_tokens,
                prefill_logprobs: self.decoder_input_details,
                mode: self.logprobs_mode,
                return_logits: self.return_logits,
                label_ids: self.logprob_token_ids.clone(),
                // A plain answer is the text; best_of ranks its candidates by their
                // tokens' logprobs.
                skip_token_logprobs: !streamed
                    && !self.wants_scores()
                    && self.best_of.is_none_or(|b| b <= 1),
            },
            generations: self.best_of,
        })
    }

    /// Whether any score was asked for: the answer then carries `details` (Vertex answers
    /// plain text otherwise). Computing scores and dropping them would be the silent kind
    /// of failure this server avoids.
    pub fn wants_scores(&self) -> bool {
        self.details
            || self.decoder_input_details
            || self.top_n_tokens.is_some_and(|n| n > 0)
            || self.return_logits
            || !self.logprob_token_ids.is_empty()
    }
}

/// A validated TGI request and the shape of the answer it asked for.
pub struct Prepared {
    pub valid: ValidGenerate,
    pub inputs: String,
    pub params: GenerateParameters,
}

impl Prepared {
    /// Generations it runs, each holding one concurrency permit.
    pub fn generations(&self) -> u32 {
        self.valid.generations
    }
}

/// Validates a TGI request (also a Vertex `inputs` instance), to be answered as a stream
/// or not.
pub async fn prepare(
    ready: &Ready,
    req: GenerateRequest,
    streamed: bool,
) -> Result<Prepared, ApiError> {
    let prompt = Prompt::Text {
        text: req.inputs.clone(),
        add_special_tokens: true,
    };
    let spec = req.parameters.to_spec(prompt, streamed)?;
    let valid = ready
        .validator
        .validate(spec)
        .await
        .map_err(|e| e.in_words(&TgiNames))?;
    Ok(Prepared {
        valid,
        inputs: req.inputs,
        params: req.parameters,
    })
}
