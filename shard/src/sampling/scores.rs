//! Scores of one token at one position: generated tokens and prompt positions alike.

use sonde_proto::LogprobsMode;

use super::order::{rank, top_n_keys};
use super::softmax::{log_softmax_into, Normalizer};
use super::Scratch;

/// What to report besides the token's own logprob; the proto's `ScoreOptions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScoreOptions<'a> {
    /// Alternatives to report, best first.
    pub top_n_tokens: usize,
    /// Also report the raw logit and raw rank of the token.
    pub return_logits: bool,
    /// Tokens whose logprobs are reported at every position, in this order.
    pub label_ids: &'a [u32],
    /// Which distribution `logprob`, `top` and `labels` come from.
    pub mode: LogprobsMode,
}

/// The scores of one token at one position.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TokenScores {
    /// In the mode's distribution; -inf in processed mode for a token outside the support.
    pub logprob: f32,
    /// Raw logit, with `return_logits`.
    pub logit: Option<f32>,
    /// 1-based rank among the raw logits of the full vocabulary (ties to the smaller id),
    /// with `return_logits`.
    pub rank: Option<u32>,
    /// `min(top_n_tokens, vocabulary)` alternatives `(id, logprob)`, best first, ties to the
    /// smaller id. In processed mode entries past the support's size are -inf.
    pub top: Vec<(u32, f32)>,
    /// Logprob of each of `label_ids`, in order.
    pub labels: Vec<f32>,
}

/// A score request naming something the row cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ScoreError {
    #[error("token id {id} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("label token id {id} is outside the vocabulary of {vocab} tokens")]
    LabelOutOfRange { id: u32, vocab: usize },
    #[error("processed logprobs have {got} entries but the logits row has {vocab}")]
    LengthMismatch { vocab: usize, got: usize },
}

/// One position's raw logits, and the sampler's processed logprobs of it when a processor
/// was active.
#[derive(Clone, Copy)]
pub struct Logits<'a> {
    pub raw: &'a [f32],
    pub processed: Option<&'a [f32]>,
}

impl<'a> Logits<'a> {
    /// Raw logits alone (prompt positions, or no processor active).
    pub fn raw(raw: &'a [f32]) -> Self {
        Self {
            raw,
            processed: None,
        }
    }
}

/// Scores `token` against one row of raw logits.
///
/// `logits.processed` matters only in [`LogprobsMode::Processed`]; `None` there means no
/// processor is active, so the processed distribution is the raw one (exactly what
/// [`super::Choice::processed_logprobs`] and [`super::processed_logprobs`] return). In raw
/// mode the log-softmax is computed into `scratch`.
///
/// Logit and rank always come from the raw row, whatever the mode: they describe the
/// model, not the sampler.
pub fn score_token(
    logits: Logits<'_>,
    token: u32,
    opts: &ScoreOptions<'_>,
    scratch: &mut Scratch,
) -> Result<TokenScores, ScoreError> {
    let Logits {
        raw: raw_logits,
        processed: processed_logprobs,
    } = logits;
    let vocab = raw_logits.len();
    if token as usize >= vocab {
        return Err(ScoreError::TokenOutOfRange { id: token, vocab });
    }
    if let Some(&id) = opts.label_ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(ScoreError::LabelOutOfRange { id, vocab });
    }
    let Scratch { values, keys, .. } = scratch;
    let logprobs = match (opts.mode, processed_logprobs) {
        (LogprobsMode::Processed, Some(processed)) => {
            if processed.len() != vocab {
                return Err(ScoreError::LengthMismatch {
                    vocab,
                    got: processed.len(),
                });
            }
            Logprobs::Row(processed)
        }
        // No alternatives wanted: the few logprobs asked for come from the normaliser,
        // with no pass writing the whole vocabulary.
        _ if opts.top_n_tokens == 0 => Logprobs::Raw {
            logits: raw_logits,
            norm: Normalizer::of(raw_logits),
        },
        _ => {
            log_softmax_into(raw_logits, values);
            Logprobs::Row(values)
        }
    };
    let (logit, rank) = if opts.return_logits {
        (Some(raw_logits[token as usize]), rank(raw_logits, token))
    } else {
        (None, None)
    };
    Ok(TokenScores {
        logprob: logprobs.at(token),
        logit,
        rank,
        top: match logprobs {
            Logprobs::Row(row) => top_n_keys(row, opts.top_n_tokens, keys),
            Logprobs::Raw { .. } => Vec::new(),
        },
        labels: opts.label_ids.iter().map(|&id| logprobs.at(id)).collect(),
    })
}

/// A row's logprobs: written out, or as its raw logits and their normaliser (the same
/// bits, see [`Normalizer::logprob`]). Ids are checked against the row by the caller.
enum Logprobs<'a> {
    Row(&'a [f32]),
    Raw { logits: &'a [f32], norm: Normalizer },
}

impl Logprobs<'_> {
    fn at(&self, id: u32) -> f32 {
        match self {
            Logprobs::Row(row) => row[id as usize],
            Logprobs::Raw { logits, norm } => norm.logprob(logits[id as usize]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::test_util::log_softmax_f64;
    use crate::sampling::{processed_logprobs, SamplingParams, TokenCounts};

    const NEG_INF: f32 = f32::NEG_INFINITY;

    fn close(a: f32, b: f64) -> bool {
        (f64::from(a) - b).abs() < 1e-6
    }

    #[test]
    fn raw_scores_match_f64_math() {
        let raw = [1.0f32, 3.0, 3.0, -2.0, 0.5, 3.0];
        let want = log_softmax_f64(&raw);
        let labels = [3, 1, 3];
        let opts = ScoreOptions {
            top_n_tokens: 4,
            return_logits: true,
            label_ids: &labels,
            mode: LogprobsMode::Raw,
        };
        let mut scratch = Scratch::new();
        let s = score_token(Logits::raw(&raw), 4, &opts, &mut scratch).unwrap();
        assert!(close(s.logprob, want[4]));
        assert_eq!(s.logit, Some(0.5));
        // Three 3.0s and the 1.0 rank above 0.5.
        assert_eq!(s.rank, Some(5));
        let top_ids: Vec<u32> = s.top.iter().map(|t| t.0).collect();
        assert_eq!(top_ids, vec![1, 2, 5, 0]);
        for &(id, lp) in &s.top {
            assert!(close(lp, want[id as usize]));
        }
        assert_eq!(s.labels.len(), 3);
        assert!(close(s.labels[0], want[3]) && close(s.labels[1], want[1]));
        assert_eq!(s.labels[0], s.labels[2]);

        // Ties: token 5 shares the top logit with 1 and 2 and ranks after them.
        let s = score_token(Logits::raw(&raw), 5, &opts, &mut scratch).unwrap();
        assert_eq!(s.rank, Some(3));
    }

    /// Without alternatives the logprobs come from the normaliser alone; they are the
    /// same bits as those of the written-out row, degenerate rows included.
    #[test]
    fn logprobs_without_top_n_equal_the_full_rows() {
        let rows = [
            crate::sampling::test_util::logits(5, 49152, 20.0, 0.0),
            vec![NEG_INF, 1.0, f32::NAN, 1.0],
            vec![NEG_INF, NEG_INF, f32::NAN],
            vec![f32::INFINITY, 0.0, 2.0],
        ];
        let labels = [0, 2, 1];
        for raw in &rows {
            let full = ScoreOptions {
                top_n_tokens: 3,
                label_ids: &labels,
                ..Default::default()
            };
            let alone = ScoreOptions {
                top_n_tokens: 0,
                ..full
            };
            let mut scratch = Scratch::new();
            for token in [0, 1, 2] {
                let a = score_token(Logits::raw(raw), token, &full, &mut scratch).unwrap();
                let b = score_token(Logits::raw(raw), token, &alone, &mut scratch).unwrap();
                assert_eq!(a.logprob.to_bits(), b.logprob.to_bits(), "token {token}");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a.labels), bits(&b.labels));
                assert!(b.top.is_empty());
            }
        }
    }

    #[test]
    fn logit_and_rank_only_on_request() {
        let opts = ScoreOptions::default();
        let mut scratch = Scratch::new();
        let s = score_token(Logits::raw(&[0.0, 1.0]), 0, &opts, &mut scratch).unwrap();
        assert_eq!((s.logit, s.rank), (None, None));
        assert!(s.top.is_empty() && s.labels.is_empty());
    }

    #[test]
    fn processed_mode_reports_the_processed_distribution_but_raw_logit_and_rank() {
        let raw = [1.0f32, 3.0, 2.0, 2.0, 0.0];
        let params = SamplingParams {
            top_k: 2,
            temperature: 0.5,
            ..Default::default()
        };
        let mut p_scratch = Scratch::new();
        let processed = processed_logprobs(&params, &TokenCounts::new(), &raw, &mut p_scratch);
        let processed = processed.unwrap();
        // Support {1, 2}: logits / 0.5 = 6 and 4.
        let want = log_softmax_f64(&[6.0, 4.0]);

        let labels = [0, 2];
        let opts = ScoreOptions {
            top_n_tokens: 4,
            return_logits: true,
            label_ids: &labels,
            mode: LogprobsMode::Processed,
        };
        let mut scratch = Scratch::new();
        let s = score_token(
            Logits {
                raw: &raw,
                processed: Some(processed),
            },
            3,
            &opts,
            &mut scratch,
        )
        .unwrap();
        // Token 3 ties token 2 but top-k kept the smaller id.
        assert_eq!(s.logprob, NEG_INF);
        assert_eq!(s.logit, Some(2.0));
        assert_eq!(s.rank, Some(3));
        assert_eq!(s.top.len(), 4);
        assert_eq!((s.top[0].0, s.top[1].0), (1, 2));
        assert!(close(s.top[0].1, want[0]) && close(s.top[1].1, want[1]));
        // Past the support: -inf, ties by id.
        assert_eq!(&s.top[2..], &[(0, NEG_INF), (3, NEG_INF)]);
        assert_eq!(s.labels[0], NEG_INF);
        assert!(close(s.labels[1], want[1]));

        // The same request in raw mode ignores the processed row.
        let raw_opts = ScoreOptions {
            mode: LogprobsMode::Raw,
            ..opts
        };
        let r = score_token(
            Logits {
                raw: &raw,
                processed: Some(processed),
            },
            3,
            &raw_opts,
            &mut scratch,
        )
        .unwrap();
        assert!(close(r.logprob, log_softmax_f64(&raw)[3]));
    }

    #[test]
    fn processed_mode_without_processors_is_raw() {
        let raw = [0.3f32, -1.0, 2.0];
        let opts = ScoreOptions {
            top_n_tokens: 3,
            mode: LogprobsMode::Processed,
            ..Default::default()
        };
        let raw_opts = ScoreOptions {
            mode: LogprobsMode::Raw,
            ..opts
        };
        let mut scratch = Scratch::new();
        let a = score_token(Logits::raw(&raw), 0, &opts, &mut scratch).unwrap();
        let b = score_token(Logits::raw(&raw), 0, &raw_opts, &mut scratch).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn out_of_range_ids_are_errors() {
        let raw = [0.0f32; 3];
        let mut scratch = Scratch::new();
        let opts = ScoreOptions::default();
        assert_eq!(
            score_token(Logits::raw(&raw), 3, &opts, &mut scratch),
            Err(ScoreError::TokenOutOfRange { id: 3, vocab: 3 })
        );
        let labels = [0, 7];
        let opts = ScoreOptions {
            label_ids: &labels,
            ..Default::default()
        };
        assert_eq!(
            score_token(Logits::raw(&raw), 0, &opts, &mut scratch),
            Err(ScoreError::LabelOutOfRange { id: 7, vocab: 3 })
        );
        let opts = ScoreOptions {
            mode: LogprobsMode::Processed,
            ..Default::default()
        };
        assert_eq!(
            score_token(
                Logits {
                    raw: &raw,
                    processed: Some(&[0.0])
                },
                0,
                &opts,
                &mut scratch
            ),
            Err(ScoreError::LengthMismatch { vocab: 3, got: 1 })
        );
    }

    #[test]
    fn full_vocabulary_top_n() {
        let raw = crate::sampling::test_util::logits(9, 49152, 12.0, 0.01);
        let opts = ScoreOptions {
            top_n_tokens: 20,
            return_logits: true,
            ..Default::default()
        };
        let mut scratch = Scratch::with_vocab(raw.len());
        let best = crate::sampling::argmax(&raw).unwrap();
        let s = score_token(Logits::raw(&raw), best, &opts, &mut scratch).unwrap();
        assert_eq!(s.rank, Some(1));
        assert_eq!(s.top.len(), 20);
        assert_eq!(s.top[0], (best, s.logprob));
        assert!(s
            .top
            .windows(2)
            .all(|w| w[0].1 > w[1].1 || (w[0].1 == w[1].1 && w[0].0 < w[1].0)));
    }
}
