//! Choosing the next token and scoring tokens, over one row of raw f32 logits at a time.
//!
//! Everything here is plain slices so that the numbers Sonde reports do not depend on the
//! device, the batch or the tensor library: the shard copies one row of logits per sequence
//! to the host and the same code scores it whether the request ran alone or in a batch.
//!
//! Two distributions exist for every step (see the proto's `LogprobsMode`):
//! * **raw**: log-softmax of the model's logits, the model's own probability;
//! * **processed**: log-softmax after the request's penalties, temperature, top-k, top-p
//!   and typical-p, i.e. what the token was drawn from. Tokens outside the support are
//!   -inf.
//!
//! A logit's raw value and its rank are always reported from the raw row.
//!
//! One total order breaks every tie (greedy, top-N, rank, top-k, top-p): greater value
//! first, equal values by smaller token id, NaN below everything (see [`best_first`]).
//!
//! Typical use for one sequence and one step:
//! ```ignore
//! let choice = sampler.next_token(row, &mut sample_scratch)?;
//! let logits = Logits { raw: row, processed: choice.processed_logprobs };
//! let scores = score_token(logits, choice.token, &opts, &mut score_scratch)?;
//! sampler.push(choice.token);
//! ```

mod order;
mod params;
mod processors;
mod sampler;
mod scores;
mod softmax;

pub use order::{argmax, best_first, rank, top_n};
pub use params::{ParamsError, SamplingParams};
pub use processors::{processed_logprobs, TokenCounts};
pub use sampler::{Choice, SampleError, Sampler};
pub use scores::{score_token, Logits, ScoreError, ScoreOptions, TokenScores};
pub use softmax::{log_softmax_in_place, log_softmax_into};

/// Reusable buffers for work over one logits row, so a decode step does not allocate
/// vocabulary-sized vectors per sequence.
///
/// A scratch is only borrowed for the duration of one call, except that
/// [`Sampler::next_token`] lends its processed logprobs out in the returned [`Choice`];
/// scoring that choice therefore needs a second scratch. Keep one pair per worker thread
/// and reuse it across sequences and steps.
#[derive(Debug, Default, Clone)]
pub struct Scratch {
    pub(crate) values: Vec<f32>,
    pub(crate) keys: Vec<u64>,
    pub(crate) weights: Vec<f64>,
}

impl Scratch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reserves room for a vocabulary up front, so even the first step does not grow it.
    pub fn with_vocab(vocab_size: usize) -> Self {
        Self {
            values: Vec::with_capacity(vocab_size),
            keys: Vec::with_capacity(vocab_size),
            weights: Vec::with_capacity(vocab_size),
        }
    }
}

/// Deterministic pseudo-random logits rows for the tests.
#[cfg(test)]
pub(crate) mod test_util {
    use rand_chacha::rand_core::{RngCore, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Uniform values in [-scale, scale), rounded to `step` so that ties occur often.
    pub fn logits(seed: u64, n: usize, scale: f32, step: f32) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                let x = (u as f32 * 2.0 - 1.0) * scale;
                if step > 0.0 {
                    (x / step).round() * step
                } else {
                    x
                }
            })
            .collect()
    }

    /// Reference log-softmax in f64, written independently of the production code.
    pub fn log_softmax_f64(xs: &[f32]) -> Vec<f64> {
        let m = xs
            .iter()
            .map(|&x| f64::from(x))
            .fold(f64::NEG_INFINITY, f64::max);
        let lse = m + xs
            .iter()
            .map(|&x| (f64::from(x) - m).exp())
            .sum::<f64>()
            .ln();
        xs.iter().map(|&x| f64::from(x) - lse).collect()
    }
}
