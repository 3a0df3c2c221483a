//! A request's sampling parameters and their validation.

/// How one request picks its tokens; mirrors the proto's `SamplingParameters`.
///
/// Each processor has an "off" value (below) at which it is skipped entirely, so a request
/// that sets nothing is scored and sampled from the raw distribution without building a
/// processed one. Processors apply in the order of the fields below, penalties first; that
/// order is part of the contract because the processed logprobs are reported.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// false: greedy, the argmax of the processed logits (ties to the smaller id).
    pub do_sample: bool,
    /// HF/TGI repetition penalty over the distinct tokens of prompt + generated tokens:
    /// a positive logit is divided by it, a negative one multiplied. 1.0 = off; > 0.
    pub repetition_penalty: f32,
    /// Subtracted from a logit once per occurrence of the token in prompt + generated
    /// tokens. 0.0 = off; in [-2, 2].
    pub frequency_penalty: f32,
    /// Logits are divided by it. 1.0 = off; > 0 and finite.
    pub temperature: f32,
    /// Keeps the k best tokens. 0 = off.
    pub top_k: u32,
    /// Keeps the smallest most-likely prefix whose probability reaches top_p. 1.0 = off;
    /// in (0, 1].
    pub top_p: f32,
    /// HF `TypicalLogitsWarper` mass. 1.0 = off; in (0, 1].
    pub typical_p: f32,
    /// Seeds the request's own RNG, so a seed replays the same tokens.
    pub seed: u64,
}

impl Default for SamplingParams {
    /// Greedy with every processor off.
    fn default() -> Self {
        Self {
            do_sample: false,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            typical_p: 1.0,
            seed: 0,
        }
    }
}

/// A sampling parameter out of range; the message names the field as the API does.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum ParamsError {
    #[error("temperature must be a finite number greater than 0, got {0}")]
    Temperature(f32),
    #[error("top_p must be greater than 0 and at most 1, got {0}")]
    TopP(f32),
    #[error("typical_p must be greater than 0 and at most 1, got {0}")]
    TypicalP(f32),
    #[error("repetition_penalty must be a finite number greater than 0, got {0}")]
    RepetitionPenalty(f32),
    #[error("frequency_penalty must be between -2 and 2, got {0}")]
    FrequencyPenalty(f32),
}

impl SamplingParams {
    /// Checks every field's range, so that the processors never see a value for which their
    /// output would be meaningless (NaN temperature, negative mass, ...).
    pub fn validate(&self) -> Result<(), ParamsError> {
        let t = self.temperature;
        if !(t.is_finite() && t > 0.0) {
            return Err(ParamsError::Temperature(t));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ParamsError::TopP(self.top_p));
        }
        if !(self.typical_p > 0.0 && self.typical_p <= 1.0) {
            return Err(ParamsError::TypicalP(self.typical_p));
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return Err(ParamsError::RepetitionPenalty(r));
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return Err(ParamsError::FrequencyPenalty(self.frequency_penalty));
        }
        Ok(())
    }

    /// Whether any processor changes the logits, i.e. whether the processed distribution
    /// can differ from the raw one.
    pub fn has_processors(&self) -> bool {
        self.has_penalties()
            || self.temperature != 1.0
            || self.top_k != 0
            || self.top_p < 1.0
            || self.typical_p < 1.0
    }

    pub(crate) fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0 || self.frequency_penalty != 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_off() {
        let p = SamplingParams::default();
        assert_eq!(p.validate(), Ok(()));
        assert!(!p.has_processors());
        assert!(!p.do_sample);
    }

    #[test]
    fn out_of_range_values_are_rejected() {
        let ok = SamplingParams::default();
        let cases = [
            (
                SamplingParams {
                    temperature: 0.0,
                    ..ok
                },
                ParamsError::Temperature(0.0),
            ),
            (
                SamplingParams {
                    temperature: -1.0,
                    ..ok
                },
                ParamsError::Temperature(-1.0),
            ),
            (
                SamplingParams {
                    temperature: f32::INFINITY,
                    ..ok
                },
                ParamsError::Temperature(f32::INFINITY),
            ),
            (SamplingParams { top_p: 0.0, ..ok }, ParamsError::TopP(0.0)),
            (SamplingParams { top_p: 1.5, ..ok }, ParamsError::TopP(1.5)),
            (
                SamplingParams {
                    typical_p: 0.0,
                    ..ok
                },
                ParamsError::TypicalP(0.0),
            ),
            (
                SamplingParams {
                    typical_p: 1.01,
                    ..ok
                },
                ParamsError::TypicalP(1.01),
            ),
            (
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..ok
                },
                ParamsError::RepetitionPenalty(0.0),
            ),
            (
                SamplingParams {
                    frequency_penalty: 2.5,
                    ..ok
                },
                ParamsError::FrequencyPenalty(2.5),
            ),
            (
                SamplingParams {
                    frequency_penalty: -2.5,
                    ..ok
                },
                ParamsError::FrequencyPenalty(-2.5),
            ),
        ];
        for (p, e) in cases {
            assert_eq!(p.validate(), Err(e));
        }
        // NaN fails every range check (compare the message: NaN != NaN).
        let nan = SamplingParams {
            temperature: f32::NAN,
            ..ok
        }
        .validate();
        assert!(matches!(nan, Err(ParamsError::Temperature(_))));
        for p in [
            SamplingParams {
                top_p: f32::NAN,
                ..ok
            },
            SamplingParams {
                typical_p: f32::NAN,
                ..ok
            },
            SamplingParams {
                repetition_penalty: f32::NAN,
                ..ok
            },
            SamplingParams {
                frequency_penalty: f32::NAN,
                ..ok
            },
        ] {
            assert!(p.validate().is_err());
        }
    }

    #[test]
    fn edge_values_are_accepted() {
        let ok = SamplingParams::default();
        for p in [
            SamplingParams {
                top_p: 1.0,
                typical_p: 1.0,
                ..ok
            },
            SamplingParams {
                top_p: 1e-6,
                typical_p: 1e-6,
                ..ok
            },
            SamplingParams {
                frequency_penalty: 2.0,
                ..ok
            },
            SamplingParams {
                frequency_penalty: -2.0,
                ..ok
            },
            SamplingParams {
                temperature: 1e-3,
                repetition_penalty: 10.0,
                ..ok
            },
            SamplingParams {
                top_k: u32::MAX,
                ..ok
            },
        ] {
            assert_eq!(p.validate(), Ok(()), "{p:?}");
            assert!(p.has_processors() || p == ok);
        }
        assert!(!SamplingParams {
            top_p: 1.0,
            typical_p: 1.0,
            ..ok
        }
        .has_processors());
    }
}
