//! One request's token chooser: its parameters, its RNG and its history.

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::order::argmax;
use super::params::{ParamsError, SamplingParams};
use super::processors::{process_logits_into, TokenCounts};
use super::softmax::log_softmax_in_place;
use super::Scratch;

/// No token could be chosen from a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SampleError {
    #[error("the logits row is empty")]
    EmptyRow,
    /// Every logit is -inf or NaN, or one is +inf: the model's output is broken, and
    /// choosing a token anyway would hide it.
    #[error("no token has a finite probability in the logits row")]
    NoSupport,
}

/// The token chosen at one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice<'s> {
    pub token: u32,
    /// The processed logprobs the token was chosen from, for processed-mode scores; `None`
    /// when no processor is active, i.e. the processed distribution is the raw one.
    pub processed_logprobs: Option<&'s [f32]>,
}

/// Chooses the tokens of one request.
///
/// Each request owns its RNG, seeded from its own seed, and draws exactly one number per
/// sampled step (none when greedy), so its tokens depend only on its seed and its logits:
/// never on the batch it shares or on other requests' draws.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    history: TokenCounts,
}

impl Sampler {
    /// Validates `params` and starts the history with the prompt, which the penalties
    /// count as TGI does.
    pub fn new(params: SamplingParams, prompt_ids: &[u32]) -> Result<Self, ParamsError> {
        params.validate()?;
        Ok(Self {
            params,
            rng: ChaCha8Rng::seed_from_u64(params.seed),
            history: TokenCounts::from_ids(prompt_ids),
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Prompt + generated tokens so far, as the penalties see them.
    pub fn history(&self) -> &TokenCounts {
        &self.history
    }

    /// Records the token the sequence actually continued with; call once per step, after
    /// [`Sampler::next_token`].
    pub fn push(&mut self, token: u32) {
        self.history.push(token);
    }

    /// Chooses the next token from one row of raw logits. Does not record it: call
    /// [`Sampler::push`] with the token the sequence continues with.
    ///
    /// With no processor active the choice is made on the raw row directly and nothing is
    /// copied; otherwise `scratch` receives the processed logprobs, which the returned
    /// [`Choice`] lends out for scoring.
    pub fn next_token<'s>(
        &mut self,
        raw_logits: &[f32],
        scratch: &'s mut Scratch,
    ) -> Result<Choice<'s>, SampleError> {
        if raw_logits.is_empty() {
            return Err(SampleError::EmptyRow);
        }
        if !self.params.has_processors() {
            let token = self.choose(raw_logits, &mut scratch.weights)?;
            return Ok(Choice {
                token,
                processed_logprobs: None,
            });
        }
        process_logits_into(&self.params, &self.history, raw_logits, scratch);
        let Scratch {
            values, weights, ..
        } = scratch;
        let token = self.choose(values, weights)?;
        log_softmax_in_place(values);
        let processed: &'s [f32] = values;
        Ok(Choice {
            token,
            processed_logprobs: Some(processed),
        })
    }

    /// Greedy or sampled choice over (processed) logits.
    fn choose(&mut self, logits: &[f32], weights: &mut Vec<f64>) -> Result<u32, SampleError> {
        if self.params.do_sample {
            let u = uniform(&mut self.rng);
            draw(logits, u, weights).ok_or(SampleError::NoSupport)
        } else {
            let token = argmax(logits).ok_or(SampleError::EmptyRow)?;
            let best = logits[token as usize];
            if !best.is_finite() {
                return Err(SampleError::NoSupport);
            }
            Ok(token)
        }
    }
}

/// A uniform f64 in [0, 1) from the top 53 bits of one `next_u64`.
///
/// Done by hand rather than through rand's distributions, whose algorithms may change
/// between rand versions: a seed must keep replaying the same tokens.
pub(crate) fn uniform(rng: &mut ChaCha8Rng) -> f64 {
    const SCALE: f64 = 1.0 / (1u64 << 53) as f64;
    (rng.next_u64() >> 11) as f64 * SCALE
}

/// Inverse-CDF draw from unnormalised log-weights (logits or logprobs) with `u` in [0, 1).
///
/// The walk goes over ids in ascending order, in f64, so the result depends only on the
/// row and `u`, not on a sort's tie handling. Weights are `exp(x - max)`; a zero weight
/// (-inf, underflow) or NaN can never be chosen. `None` when no weight is positive.
/// `weights` is scratch space: each exp is computed once, for the total and the walk.
pub(crate) fn draw(log_weights: &[f32], u: f64, weights: &mut Vec<f64>) -> Option<u32> {
    let max = log_weights
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return None;
    }
    let weight = |x: f32| {
        let w = f64::from(x - max).exp();
        if w.is_nan() {
            0.0
        } else {
            w
        }
    };
    weights.clear();
    weights.extend(log_weights.iter().map(|&x| weight(x)));
    let total: f64 = weights.iter().sum();
    let target = u * total;
    let mut cum = 0.0;
    let mut last = None;
    for (id, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            cum += w;
            last = Some(id as u32);
            if cum > target {
                return last;
            }
        }
    }
    // Only reachable when u * total rounds up to total (u just below 1): the walk adds
    // the same terms in the same order as the total, so it ends exactly at the total.
    last
}

#[cfg(test)]
mod tests;
