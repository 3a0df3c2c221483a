//! Exact speculative decoding with prompt-lookup drafts.
//!
//! A decode step feeds each sequence its last token and, after it, a draft: a guess of the
//! tokens that come next, copied from where the sequence's latest tokens occurred before
//! in its own prompt and output. The guess needs no model of its own and is often right
//! where text repeats itself (quoting, extraction, code, lists, a small model's loops).
//! The step computes a row of logits per fed token, and the sequence's tokens are sampled
//! from those rows in order for as long as the draft agrees with them (`take_verified`).
//!
//! Whether the guess is right changes nothing but speed. Every token is sampled from a row
//! whose inputs are all tokens the sequence really generated, and a row's values never
//! depend on the other rows of its step (the kernels' batch invariance, tested bit for
//! bit), so the tokens, their scores and the sampler's random draws are those of one
//! token per step.
//!
//! A wrong guess costs its rows' arithmetic. At one stream the step is bound by reading
//! the weights, which the extra rows share, but not entirely: on a 2-core AVX2 machine a
//! SmolLM2 step of 2 rows took 1.2x one of 1 row, 4 rows 1.6x. So a sequence's drafts are
//! as long as the run its last draft verified, plus one: a draft that held grows by a
//! token a step. After one that failed at once, the next is a single token, and only
//! where at least the last 2 tokens occurred before.

use super::rows::Rows;
use super::scoring::Scorer;
use super::sequence::Sequence;
use super::step::generate;
use super::types::Generation;
use crate::error::EngineError;

/// How much a decode step may guess.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speculation {
    /// Draft tokens per sequence and step; 0 turns speculation off.
    pub draft_tokens: usize,
    /// Rows a step may have, drafts included: drafts are made only while the batch is
    /// small, where the weights' reading dominates a step and extra rows come cheap.
    pub max_step_rows: usize,
}

impl Default for Speculation {
    fn default() -> Self {
        // 6 rows: one row group of the AVX2 kernel (4 + 2 on AVX-512), and a small share
        // of a step's cost once a few streams run.
        Speculation {
            draft_tokens: 5,
            max_step_rows: 6,
        }
    }
}

/// Draft tokens fed and taken since the engine started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpeculationStats {
    pub drafted_tokens: u64,
    /// Draft tokens that were the token sampled at their position.
    pub accepted_tokens: u64,
}

impl Speculation {
    pub const OFF: Speculation = Speculation {
        draft_tokens: 0,
        max_step_rows: 0,
    };

    /// Each sequence's draft for the next step, in order, within the step's row budget
    /// and the tokens the sequence may still generate (a step's last token needs no
    /// draft after it, so a sequence's drafts and fed token always fit its reservation).
    pub fn drafts(&self, seqs: &[Sequence]) -> Vec<Vec<u32>> {
        let mut rows = seqs.len();
        seqs.iter()
            .map(|seq| {
                let left = seq.stopping.max_new_tokens.saturating_sub(seq.generated);
                // `draft_len` is 0 after a draft that failed at once.
                let min_ngram = if seq.draft_len == 0 {
                    MIN_NGRAM_AFTER_MISS
                } else {
                    1
                };
                let max = self
                    .draft_tokens
                    .min(seq.draft_len.max(1))
                    .min(self.max_step_rows.saturating_sub(rows))
                    .min(left.saturating_sub(1));
                let draft = propose(&seq.history, max, min_ngram);
                rows += draft.len();
                draft
            })
            .collect()
    }
}

/// One sequence's part of a decode step's results.
pub struct Verify<'a> {
    pub seq: &'a mut Sequence,
    /// Its rows, one per fed token: row 0 follows its last token, row j follows draft
    /// token j-1.
    pub rows: Rows<'a>,
    pub draft: &'a [u32],
}

/// Samples a sequence's tokens from its rows of a decode step. Row j's inputs are right
/// while every draft token before it is the token sampled before it, so tokens are taken
/// until one differs from the draft (that token is still right: its row's inputs were) or
/// the sequence finishes. The cache, which the step advanced past every fed token, then
/// forgets the positions of the draft tokens not taken.
pub fn take_verified(
    scorer: &mut Scorer,
    job: &mut Verify,
) -> Result<Vec<Generation>, EngineError> {
    let Verify { seq, rows, draft } = job;
    let (draft, rows) = (*draft, *rows);
    let vocab = match rows {
        Rows::Logits(all) => all.len() / (draft.len() + 1),
        Rows::Argmax(_) => 0,
    };
    let mut taken = Vec::with_capacity(draft.len() + 1);
    for j in 0..=draft.len() {
        let Some(row) = rows.get(j, vocab) else {
            break;
        };
        let generation = generate(scorer, seq, row, Vec::new())?;
        let agrees = generation.finish_reason.is_none()
            && generation.token.as_ref().map(|t| t.id) == draft.get(j).copied();
        taken.push(generation);
        if !agrees {
            break;
        }
    }
    // Fed were the last token and the draft (the step's last positions of the cache); the
    // first `taken.len()` of them were right.
    let fed = draft.len() + 1;
    seq.cache.truncate(seq.cache.len() - fed + taken.len());
    if !draft.is_empty() {
        // The draft tokens that held, plus one; 0 if none held.
        seq.draft_len = if taken.len() > 1 { taken.len() } else { 0 };
    }
    Ok(taken)
}

/// The longest suffix of the history looked up; longer matches are tried first, as they
/// predict the continuation best.
const MAX_NGRAM: usize = 3;
/// The shortest suffix looked up after a draft that failed at once: a single token's
/// last occurrence is a weak guess, and on text that does not repeat a row that fails
/// every step would cost more than the drafts that hold save.
const MIN_NGRAM_AFTER_MISS: usize = 2;

/// `max` tokens copied from after the most recent earlier occurrence of the history's last
/// `n` tokens, for the largest `n` in `min_ngram..=MAX_NGRAM` that occurred before; empty
/// if none did.
///
/// The copy may run past the end of the history into the draft itself (as an LZ77 copy
/// does): text that repeats with period p is drafted as continuing to repeat, where a
/// copy cut at the end of the history would draft at most p tokens.
pub fn propose(history: &[u32], max: usize, min_ngram: usize) -> Vec<u32> {
    let len = history.len();
    let mut draft = Vec::new();
    if max == 0 {
        return draft;
    }
    for n in (min_ngram.max(1)..=MAX_NGRAM.min(len.saturating_sub(1))).rev() {
        let tail = &history[len - n..];
        // Starts before `len - n`, so at least one token of the history follows the match.
        if let Some(start) = (0..len - n).rev().find(|&i| &history[i..i + n] == tail) {
            draft.reserve(max);
            for i in start + n..start + n + max {
                let token = match history.get(i) {
                    Some(&t) => t,
                    None => draft[i - len],
                };
                draft.push(token);
            }
            break;
        }
    }
    draft
}

#[cfg(test)]
mod tests {
    use super::propose;

    #[test]
    fn the_longest_suffix_that_occurred_before_picks_the_draft() {
        // "7 8 9" occurred at 1..4 and was followed by 4 5; "8 9" alone also at 6..8.
        let h = [1, 7, 8, 9, 4, 5, 8, 9, 6, 0, 7, 8, 9];
        assert_eq!(propose(&h, 2, 1), [4, 5]);
        // Past the end of the history, the copy goes on from its own first tokens.
        assert_eq!(propose(&h, 10, 1), [4, 5, 8, 9, 6, 0, 7, 8, 9, 4]);
    }

    #[test]
    fn the_most_recent_occurrence_wins_among_equal_lengths() {
        let h = [5, 1, 2, 5, 3, 4, 5];
        // "4 5" and "3 4 5" never occurred before; "5" last occurred at 3, followed by 3 4.
        assert_eq!(propose(&h, 2, 1), [3, 4]);
        // Asked for a match of 2 tokens or more, there is none.
        assert!(propose(&h, 2, 2).is_empty());
        assert_eq!(propose(&[1, 7, 8, 9, 4, 5, 8, 9], 1, 2), [4]);
    }

    #[test]
    fn a_repeating_history_is_drafted_as_repeating_on() {
        // The latest earlier "9 9 9" is followed by one 9 of the history, then the draft's.
        assert_eq!(propose(&[9, 9, 9, 9], 4, 1), [9, 9, 9, 9]);
        assert_eq!(propose(&[0, 1, 2, 3, 1, 2, 3], 5, 1), [1, 2, 3, 1, 2]);
    }

    #[test]
    fn nothing_is_proposed_without_an_earlier_occurrence_or_room() {
        assert!(propose(&[1, 2, 3, 4], 4, 1).is_empty());
        assert!(propose(&[1], 4, 1).is_empty());
        assert!(propose(&[], 4, 1).is_empty());
        assert!(propose(&[3, 3], 0, 1).is_empty());
        assert_eq!(propose(&[3, 3], 3, 1), [3, 3, 3]);
    }
}
