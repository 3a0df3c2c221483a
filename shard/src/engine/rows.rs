//! What a decode step's rows become: logits, or for a sequence that needs no score of its
//! greedy tokens, the argmax alone (`Model::greedy_tokens`, which skips most of the
//! output layer and finds the same token).

use candle_core::Tensor;

use super::sequence::Sequence;
use crate::error::EngineError;
use crate::model::{Model, SeqSpan};

/// A sequence's rows of one step, as the sampler takes them.
#[derive(Clone, Copy)]
pub enum Rows<'a> {
    /// Its rows of raw logits, `vocab` each.
    Logits(&'a [f32]),
    /// Each row's argmax of the raw logits.
    Argmax(&'a [u32]),
}

/// One row of [`Rows`].
#[derive(Clone, Copy)]
pub enum Row<'a> {
    Logits(&'a [f32]),
    Argmax(u32),
}

impl<'a> Rows<'a> {
    /// Row `j` (of rows of `vocab` logits), if there is one.
    pub fn get(self, j: usize, vocab: usize) -> Option<Row<'a>> {
        match self {
            Rows::Logits(all) => all.chunks_exact(vocab.max(1)).nth(j).map(Row::Logits),
            Rows::Argmax(ids) => ids.get(j).copied().map(Row::Argmax),
        }
    }
}

/// Where each sequence's rows of a step went: the argmax rows' tokens, and the rows whose
/// logits are computed.
pub struct RowPlan {
    /// Per sequence: its rows in `tokens`, or in the logits (a span of rows each).
    places: Vec<Place>,
    tokens: Vec<u32>,
    /// The step's rows that need logits, in order; all of them when `None`.
    logit_rows: Option<Vec<u32>>,
}

#[derive(Clone, Copy)]
enum Place {
    Argmax(SeqSpan),
    Logits(SeqSpan),
}

impl RowPlan {
    /// Finds the argmax of the rows of the sequences that need nothing else
    /// ([`Sequence::argmax_only`]); if the model cannot (or leaves a row to the full
    /// product), every row gets its logits.
    pub fn new(
        model: &Model,
        seqs: &[Sequence],
        spans: &[SeqSpan],
        hidden: &Tensor,
    ) -> Result<Self, EngineError> {
        let argmax: Vec<bool> = seqs.iter().map(Sequence::argmax_only).collect();
        if model.has_greedy_index() && argmax.iter().any(|&a| a) {
            let rows = |want: bool| -> Vec<u32> {
                spans
                    .iter()
                    .zip(&argmax)
                    .filter(|&(_, &a)| a == want)
                    .flat_map(|(s, _)| (s.start..s.start + s.len).map(|r| r as u32))
                    .collect()
            };
            let (mine, others) = (rows(true), rows(false));
            let selected = if others.is_empty() {
                hidden.clone()
            } else {
                hidden.index_select(&Tensor::new(mine, hidden.device())?, 0)?
            };
            if let Some(tokens) = model.greedy_tokens(&selected)? {
                return Ok(Self::split(spans, &argmax, tokens, others));
            }
        }
        let places = spans.iter().map(|&s| Place::Logits(s)).collect();
        Ok(RowPlan {
            places,
            tokens: Vec::new(),
            logit_rows: None,
        })
    }

    /// The plan once the argmax rows have their `tokens` and `others` are the rest.
    fn split(spans: &[SeqSpan], argmax: &[bool], tokens: Vec<u32>, others: Vec<u32>) -> Self {
        let (mut in_tokens, mut in_logits) = (0, 0);
        let places = spans
            .iter()
            .zip(argmax)
            .map(|(s, &a)| {
                let at = if a { &mut in_tokens } else { &mut in_logits };
                let span = SeqSpan {
                    start: *at,
                    len: s.len,
                };
                *at += s.len;
                if a {
                    Place::Argmax(span)
                } else {
                    Place::Logits(span)
                }
            })
            .collect();
        RowPlan {
            places,
            tokens,
            logit_rows: Some(others),
        }
    }

    /// How many rows need logits (of the step's `all`).
    pub fn logit_rows(&self, all: usize) -> usize {
        self.logit_rows.as_ref().map_or(all, Vec::len)
    }

    /// The hidden rows whose logits are needed: all of `hidden`, some, or none.
    pub fn logit_hidden(&self, hidden: &Tensor) -> Result<Option<Tensor>, EngineError> {
        Ok(match &self.logit_rows {
            None => Some(hidden.clone()),
            Some(rows) if rows.is_empty() => None,
            Some(rows) => {
                Some(hidden.index_select(&Tensor::new(rows.as_slice(), hidden.device())?, 0)?)
            }
        })
    }

    /// Sequence `i`'s rows, its logits taken from `logits` (the needed rows' only).
    pub fn rows<'a>(
        &'a self,
        i: usize,
        logits: &'a [f32],
        vocab: usize,
    ) -> Result<Rows<'a>, EngineError> {
        let rows = match self.places.get(i) {
            Some(Place::Argmax(s)) => self.tokens.get(s.start..s.start + s.len).map(Rows::Argmax),
            Some(Place::Logits(s)) => logits
                .get(s.start * vocab..(s.start + s.len) * vocab)
                .map(Rows::Logits),
            None => None,
        };
        rows.ok_or_else(|| EngineError::Scoring(format!("the step has no rows for sequence {i}")))
    }
}
