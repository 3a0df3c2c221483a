//! The body of a step: packing the batch, running the model, and turning rows of logits
//! into tokens and scores.

use candle_core::{Tensor, D};
use sonde_proto as pb;

use super::scoring::first_prompt_token;
use super::sequence::Sequence;
use super::Engine;
use crate::error::EngineError;
use crate::model::{Model, SeqCache, SeqSpan, StepInput};

impl Engine {
    pub(super) fn prefill_step(
        &mut self,
        seqs: &mut [Sequence],
        prompts: &[Vec<u32>],
    ) -> Result<Vec<pb::Generation>, EngineError> {
        let device = self.model.device().clone();
        let mut spans = Vec::with_capacity(seqs.len());
        let mut start = 0;
        for p in prompts {
            spans.push(SeqSpan {
                start,
                len: p.len(),
            });
            start += p.len();
        }
        let tokens = prompts.concat();
        let hidden = run_model(&self.model, seqs, &tokens, &spans)?;

        // Last positions of the requests that did not ask for prompt scores, in one product.
        let plain: Vec<usize> = (0..seqs.len())
            .filter(|&i| !seqs[i].scores.prefill_logprobs)
            .collect();
        let last_rows: Vec<u32> = plain
            .iter()
            .map(|&i| (spans[i].start + spans[i].len - 1) as u32)
            .collect();
        let plain_logits = if last_rows.is_empty() {
            Vec::new()
        } else {
            let rows = hidden.index_select(&Tensor::new(last_rows, &device)?, 0)?;
            logits_rows(&self.model, &rows)?
        };
        let vocab = self.facts.vocab_size;

        let mut generations = Vec::with_capacity(seqs.len());
        for (i, seq) in seqs.iter_mut().enumerate() {
            let prompt = &prompts[i];
            let (prefill, last_row) = if seq.scores.prefill_logprobs {
                let hidden = hidden.narrow(0, spans[i].start, spans[i].len)?;
                self.score_prompt(seq, &hidden, prompt)?
            } else {
                let k = plain.iter().position(|&j| j == i).unwrap_or_default();
                let row = plain_logits
                    .get(k * vocab..(k + 1) * vocab)
                    .ok_or_else(|| {
                        EngineError::Scoring(format!("no logits row for request {}", seq.id))
                    })?;
                (Vec::new(), row.to_vec())
            };
            generations.push(self.generate(seq, &last_row, prefill)?);
        }
        Ok(generations)
    }

    /// Scores every prompt position of one sequence, a chunk of positions at a time, and
    /// returns the scores and the logits row of the last position.
    fn score_prompt(
        &mut self,
        seq: &Sequence,
        hidden: &Tensor,
        prompt: &[u32],
    ) -> Result<(Vec<pb::TokenScores>, Vec<f32>), EngineError> {
        let vocab = self.facts.vocab_size;
        let mut scores = Vec::with_capacity(prompt.len());
        scores.extend(prompt.first().map(|&t| first_prompt_token(t)));
        let mut last = Vec::new();
        let chunk = self.cfg.prompt_logits_chunk.max(1);
        let mut begin = 0;
        while begin < prompt.len() {
            let len = chunk.min(prompt.len() - begin);
            let logits = logits_rows(&self.model, &hidden.narrow(0, begin, len)?)?;
            for (r, row) in logits.chunks_exact(vocab).enumerate() {
                let pos = begin + r;
                match prompt.get(pos + 1) {
                    Some(&next) => scores.push(self.scorer.prompt_token(&seq.scores, row, next)?),
                    None => last = row.to_vec(),
                }
            }
            begin += len;
        }
        Ok((scores, last))
    }

    pub(super) fn decode_step(
        &mut self,
        seqs: &mut [Sequence],
    ) -> Result<Vec<pb::Generation>, EngineError> {
        let tokens: Vec<u32> = seqs.iter().map(|s| s.last_token).collect();
        let spans: Vec<SeqSpan> = (0..seqs.len())
            .map(|i| SeqSpan { start: i, len: 1 })
            .collect();
        let hidden = run_model(&self.model, seqs, &tokens, &spans)?;
        let logits = logits_rows(&self.model, &hidden)?;
        let vocab = self.facts.vocab_size;
        seqs.iter_mut()
            .zip(logits.chunks_exact(vocab))
            .map(|(seq, row)| self.generate(seq, row, Vec::new()))
            .collect()
    }

    /// Samples and scores a sequence's next token from its logits row.
    fn generate(
        &mut self,
        seq: &mut Sequence,
        row: &[f32],
        prefill: Vec<pb::TokenScores>,
    ) -> Result<pb::Generation, EngineError> {
        if seq.stopping.max_new_tokens == 0 {
            return Ok(pb::Generation {
                request_id: seq.id,
                prefill,
                token: None,
                finish_reason: Some(pb::FinishReason::Length as i32),
                generated_tokens: 0,
            });
        }
        let token = self.scorer.next_token(seq, row)?;
        seq.generated += 1;
        seq.last_token = token.id;
        let finish = seq.stopping.finish_reason(token.id, seq.generated);
        Ok(pb::Generation {
            request_id: seq.id,
            prefill,
            token: Some(token),
            finish_reason: finish.map(|f| f as i32),
            generated_tokens: seq.generated as u32,
        })
    }
}

/// One forward pass of the packed step; each sequence's cache receives its span.
fn run_model(
    model: &Model,
    seqs: &mut [Sequence],
    tokens: &[u32],
    spans: &[SeqSpan],
) -> Result<Tensor, EngineError> {
    let mut caches: Vec<&mut SeqCache> = seqs.iter_mut().map(|s| &mut s.cache).collect();
    Ok(model.forward(&StepInput { tokens, spans }, &mut caches)?)
}

/// Logits of hidden rows, flattened row-major (\[rows × vocab\]) on the host.
fn logits_rows(model: &Model, hidden: &Tensor) -> Result<Vec<f32>, EngineError> {
    let logits = model.logits(hidden)?;
    debug_assert_eq!(logits.dim(D::Minus1).ok(), Some(model.spec().vocab_size));
    Ok(logits.flatten_all()?.to_vec1::<f32>()?)
}
