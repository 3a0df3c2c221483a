//! The body of a step: packing the batch, running the model, and turning rows of logits
//! into tokens and scores.

use std::ops::Range;

use candle_core::{Tensor, D};
use rayon::prelude::*;

use super::prefix::{BlockRows, LoadedPrefix, BLOCK_TOKENS};
use super::scoring::{first_prompt_token, Scorer};
use super::sequence::Sequence;
use super::speculation::{take_verified, Verify};
use super::types::{FinishReason, Generation, TokenScore};
use super::{auto_logits_chunk, Engine};
use crate::error::EngineError;
use crate::model::{Model, SeqCache, SeqSpan, StepInput};

impl Engine {
    /// One prefill forward pass: each sequence first loads its prompt's cached prefix,
    /// the pass computes the rest, and the whole blocks it computed are cached.
    pub(super) fn prefill_step(
        &mut self,
        seqs: &mut [Sequence],
        prompts: &[Vec<u32>],
    ) -> Result<Vec<Generation>, EngineError> {
        let device = self.model.device().clone();
        // At most all but the last token: the pass must compute a row to sample from.
        let loaded = seqs
            .iter_mut()
            .zip(prompts)
            .map(|(seq, p)| self.prefix.load(p, p.len() - 1, &mut seq.cache))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let mut spans = Vec::with_capacity(seqs.len());
        let mut tokens = Vec::new();
        for (p, cached) in prompts.iter().zip(&loaded) {
            let computed = &p[cached.tokens..];
            spans.push(SeqSpan {
                start: tokens.len(),
                len: computed.len(),
            });
            tokens.extend_from_slice(computed);
        }
        let hidden = run_model(&self.model, seqs, &tokens, &spans)?;
        let rows = PromptRows {
            step: &hidden,
            spans: &spans,
            loaded: &loaded,
            hidden_size: self.model.spec().hidden_size,
        };

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
                self.score_prompt(seq, &rows.prompt(i)?, prompt)?
            } else {
                let k = plain.iter().position(|&j| j == i).unwrap_or_default();
                let row = plain_logits
                    .get(k * vocab..(k + 1) * vocab)
                    .ok_or_else(|| {
                        EngineError::Scoring(format!("no logits row for request {}", seq.id))
                    })?;
                (Vec::new(), row.to_vec())
            };
            let mut generation = generate(self.scorer(), seq, &last_row, prefill)?;
            generation.cached_prompt_tokens = loaded[i].tokens as u32;
            generations.push(generation);
        }
        self.cache_prompts(seqs, prompts, &rows)?;
        Ok(generations)
    }

    /// Offers the whole blocks of each prompt to the prefix cache.
    fn cache_prompts(
        &mut self,
        seqs: &[Sequence],
        prompts: &[Vec<u32>],
        rows: &PromptRows,
    ) -> Result<(), EngineError> {
        if !self.prefix.enabled() {
            return Ok(());
        }
        let step: Vec<f32> = rows.step.flatten_all()?.to_vec1()?;
        for (i, (seq, prompt)) in seqs.iter().zip(prompts).enumerate() {
            let room = self.unreserved();
            self.prefix.store(prompt, room, |start| {
                Some(BlockRows {
                    kv: seq.cache.copy_rows(start, BLOCK_TOKENS)?,
                    hidden: rows.host_rows(i, &step, start..start + BLOCK_TOKENS)?,
                })
            });
        }
        Ok(())
    }

    /// Scores every prompt position of one sequence, a chunk of positions at a time, and
    /// returns the scores and the logits row of the last position.
    fn score_prompt(
        &mut self,
        seq: &Sequence,
        hidden: &Tensor,
        prompt: &[u32],
    ) -> Result<(Vec<TokenScore>, Vec<f32>), EngineError> {
        let vocab = self.facts.vocab_size;
        let mut scores = Vec::with_capacity(prompt.len());
        scores.extend(prompt.first().map(|&t| first_prompt_token(t)));
        let mut last = Vec::new();
        let chunk = self
            .cfg
            .prompt_logits_chunk
            .unwrap_or_else(|| auto_logits_chunk(vocab))
            .max(1);
        let mut begin = 0;
        while begin < prompt.len() {
            let len = chunk.min(prompt.len() - begin);
            let logits = logits_rows(&self.model, &hidden.narrow(0, begin, len)?)?;
            for (r, row) in logits.chunks_exact(vocab).enumerate() {
                let pos = begin + r;
                match prompt.get(pos + 1) {
                    Some(&next) => {
                        scores.push(self.scorer().prompt_token(&seq.scores, row, next)?)
                    }
                    None => last = row.to_vec(),
                }
            }
            begin += len;
        }
        Ok((scores, last))
    }

    /// Feeds each sequence its last token and its draft (`speculation.rs`), and returns
    /// the tokens each one takes: one, or more where its draft was right, in order.
    pub(super) fn decode_step(
        &mut self,
        seqs: &mut [Sequence],
    ) -> Result<Vec<Generation>, EngineError> {
        let drafts = self.cfg.speculation.drafts(seqs);
        let mut tokens =
            Vec::with_capacity(seqs.len() + drafts.iter().map(Vec::len).sum::<usize>());
        let mut spans = Vec::with_capacity(seqs.len());
        for (seq, draft) in seqs.iter().zip(&drafts) {
            spans.push(SeqSpan {
                start: tokens.len(),
                len: 1 + draft.len(),
            });
            tokens.push(seq.last_token);
            tokens.extend_from_slice(draft);
        }
        let hidden = run_model(&self.model, seqs, &tokens, &spans)?;
        let logits = logits_rows(&self.model, &hidden)?;
        let vocab = self.facts.vocab_size;
        let mut jobs = Vec::with_capacity(seqs.len());
        for ((seq, span), draft) in seqs.iter_mut().zip(&spans).zip(&drafts) {
            let rows = logits
                .get(span.start * vocab..(span.start + span.len) * vocab)
                .ok_or_else(|| {
                    EngineError::Scoring(format!("no logits rows for request {}", seq.id))
                })?;
            jobs.push(Verify { seq, rows, draft });
        }
        // Each thread samples and scores a run of the sequences with its own scratch: over
        // a 262k vocabulary a row's argmax and normaliser are ~0.5 ms, serial on the engine
        // thread while the other CPUs idle. Each row's result is its own either way.
        let per_thread = jobs.len().div_ceil(self.scorers.len().max(1)).max(1);
        let runs: Vec<Result<Vec<Generation>, EngineError>> = self
            .scorers
            .par_iter_mut()
            .zip(jobs.par_chunks_mut(per_thread))
            .map(|(scorer, jobs)| {
                let mut out = Vec::with_capacity(jobs.len());
                for job in jobs {
                    out.extend(take_verified(scorer, job)?);
                }
                Ok(out)
            })
            .collect();
        let mut generations = Vec::with_capacity(seqs.len());
        for run in runs {
            generations.extend(run?);
        }
        // Each sequence took its row-0 token and then the draft tokens that held.
        self.speculated.drafted_tokens += (tokens.len() - seqs.len()) as u64;
        self.speculated.accepted_tokens += (generations.len() - seqs.len()) as u64;
        Ok(generations)
    }

    /// The scorer for work done on the engine thread alone (prefill).
    fn scorer(&mut self) -> &mut Scorer {
        if self.scorers.is_empty() {
            self.scorers.push(Scorer::new(self.facts.vocab_size));
        }
        &mut self.scorers[0]
    }
}

/// Samples and scores a sequence's next token from its logits row.
pub(super) fn generate(
    scorer: &mut Scorer,
    seq: &mut Sequence,
    row: &[f32],
    prefill: Vec<TokenScore>,
) -> Result<Generation, EngineError> {
    if seq.stopping.max_new_tokens == 0 {
        return Ok(Generation {
            request_id: seq.id,
            prefill,
            token: None,
            finish_reason: Some(FinishReason::Length),
            generated_tokens: 0,
            cached_prompt_tokens: 0,
        });
    }
    let token = scorer.next_token(seq, row)?;
    seq.generated += 1;
    seq.last_token = token.id;
    seq.history.push(token.id);
    let finish = seq.stopping.finish_reason(token.id, seq.generated);
    Ok(Generation {
        request_id: seq.id,
        prefill,
        token: Some(token),
        finish_reason: finish,
        generated_tokens: seq.generated as u32,
        cached_prompt_tokens: 0,
    })
}

/// Where each prompt position's final hidden row is: loaded from the cache, or computed
/// by this step.
struct PromptRows<'a> {
    step: &'a Tensor,
    spans: &'a [SeqSpan],
    loaded: &'a [LoadedPrefix],
    hidden_size: usize,
}

impl PromptRows<'_> {
    /// Every position of prompt `i`, \[prompt, hidden\].
    fn prompt(&self, i: usize) -> Result<Tensor, EngineError> {
        let span = self.spans[i];
        let computed = self.step.narrow(0, span.start, span.len)?;
        let cached = &self.loaded[i];
        if cached.tokens == 0 {
            return Ok(computed);
        }
        let loaded = Tensor::from_slice(
            &cached.hidden,
            (cached.tokens, self.hidden_size),
            self.step.device(),
        )?;
        Ok(Tensor::cat(&[&loaded, &computed], 0)?)
    }

    /// Positions `positions` of prompt `i` from the host copy `step` of the step's rows;
    /// None if the prompt has no such positions.
    fn host_rows(&self, i: usize, step: &[f32], positions: Range<usize>) -> Option<Vec<f32>> {
        let h = self.hidden_size;
        let cached = self.loaded.get(i)?;
        let span = self.spans.get(i)?;
        let mut out = Vec::with_capacity(positions.len() * h);
        for pos in positions {
            let row = match pos.checked_sub(cached.tokens) {
                None => cached.hidden.get(pos * h..(pos + 1) * h)?,
                Some(t) if t < span.len => {
                    step.get((span.start + t) * h..(span.start + t + 1) * h)?
                }
                Some(_) => return None,
            };
            out.extend_from_slice(row);
        }
        Some(out)
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
