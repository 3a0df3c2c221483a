//! The body of a step: packing the batch, running the model, and turning rows of logits
//! into tokens and scores.

use std::ops::Range;

use candle_core::{Storage, Tensor};

use super::prefix::{BlockRows, LoadedPrefix, Prompt, BLOCK_TOKENS};
use super::rows::{Row, RowPlan};
use super::scoring::{first_prompt_token, Scorer};
use super::sequence::Sequence;
use super::speculation::{take_verified, Verify};
use super::types::{FinishReason, Generation, TokenScore};
use super::{auto_logits_chunk, Engine};
use crate::error::EngineError;
use crate::model::layers::host_f32;
use crate::model::{Model, SeqCache, SeqSpan, StepInput};

impl Engine {
    /// One prefill forward pass: each sequence first loads its prompt's cached prefix,
    /// the pass computes the rest, and the whole blocks it computed are cached. A
    /// sequence that does not score its prompt gets back its last position's row alone.
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
            .map(|(seq, p)| {
                let prompt = cache_view(seq, p);
                self.prefix.load(prompt, p.len() - 1, &mut seq.cache)
            })
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
        let (returned, out) = returned_rows(seqs, &spans);
        let hidden = run_model(
            &self.model,
            seqs,
            StepInput {
                tokens: &tokens,
                spans: &spans,
                returned: Some(&returned),
            },
        )?;
        let rows = PromptRows {
            step: &hidden,
            spans: seqs
                .iter()
                .zip(&out)
                .map(|(seq, span)| seq.scores.prefill_logprobs.then_some(*span))
                .collect(),
            loaded: &loaded,
            hidden_size: self.model.spec().hidden_size,
        };

        // Last positions of the requests that did not ask for prompt scores, in one product.
        let plain: Vec<usize> = (0..seqs.len())
            .filter(|&i| !seqs[i].scores.prefill_logprobs)
            .collect();
        let last_rows: Vec<u32> = plain.iter().map(|&i| out[i].start as u32).collect();
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
            let row = Row::Logits(&last_row);
            let mut generation = generate(self.scorers.first(), seq, row, prefill)?;
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
            self.prefix.store(cache_view(seq, prompt), room, |start| {
                Some(BlockRows {
                    kv: seq.cache.copy_rows(start, BLOCK_TOKENS)?,
                    hidden: rows.host_rows(i, &step, start..start + BLOCK_TOKENS),
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
            let rows = hidden.narrow(0, begin, len)?;
            with_logits(&self.model, &rows, |logits| {
                check_rows(logits, len, vocab)?;
                // Each position's row scores the prompt token after it; the prompt's last
                // position has none: its row is the one the first new token comes from.
                let next = prompt.get(begin + 1..).unwrap_or_default();
                let mut jobs: Vec<(&[f32], u32)> = logits
                    .chunks_exact(vocab)
                    .zip(next.iter().copied())
                    .collect();
                scores.extend(self.scorers.run(&mut jobs, |scorer, (row, token), out| {
                    out.push(scorer.prompt_token(&seq.scores, row, *token)?);
                    Ok(())
                })?);
                if begin + len == prompt.len() {
                    last = logits[(len - 1) * vocab..].to_vec();
                }
                Ok(())
            })?;
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
        let input = StepInput {
            tokens: &tokens,
            spans: &spans,
            returned: None,
        };
        let hidden = run_model(&self.model, seqs, input)?;
        let vocab = self.facts.vocab_size;
        let plan = RowPlan::new(&self.model, seqs, &spans, &hidden)?;
        let needed = plan.logit_hidden(&hidden)?;
        let generations = with_logits_of(&self.model, needed.as_ref(), |logits| {
            check_rows(logits, plan.logit_rows(tokens.len()), vocab)?;
            let mut jobs = Vec::with_capacity(seqs.len());
            for (i, (seq, draft)) in seqs.iter_mut().zip(&drafts).enumerate() {
                let rows = plan.rows(i, logits, vocab)?;
                jobs.push(Verify { seq, rows, draft });
            }
            self.scorers.run(&mut jobs, |scorer, job, out| {
                out.extend(take_verified(scorer, job)?);
                Ok(())
            })
        })?;
        // Each sequence took its row-0 token and then the draft tokens that held.
        self.speculated.drafted_tokens += (tokens.len() - seqs.len()) as u64;
        self.speculated.accepted_tokens += (generations.len() - seqs.len()) as u64;
        Ok(generations)
    }
}

/// Samples and scores a sequence's next token from its row (logits, or their argmax).
pub(super) fn generate(
    scorer: &mut Scorer,
    seq: &mut Sequence,
    row: Row,
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
    let token = match row {
        Row::Logits(logits) => scorer.next_token(seq, logits)?,
        Row::Argmax(id) => scorer.argmax_token(seq, id),
    };
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

/// The rows a prefill returns of each sequence's span (every computed row of a prompt to
/// score, else its last), and where they are in its output.
fn returned_rows(seqs: &[Sequence], spans: &[SeqSpan]) -> (Vec<usize>, Vec<SeqSpan>) {
    let mut out = Vec::with_capacity(spans.len());
    let mut start = 0;
    let returned = seqs
        .iter()
        .zip(spans)
        .map(|(seq, span)| {
            let len = if seq.scores.prefill_logprobs {
                span.len
            } else {
                1
            };
            out.push(SeqSpan { start, len });
            start += len;
            len
        })
        .collect();
    (returned, out)
}

/// A sequence's prompt as the prefix cache sees it.
fn cache_view<'p>(seq: &Sequence, prompt: &'p [u32]) -> Prompt<'p> {
    Prompt {
        tokens: prompt,
        scored: seq.scores.prefill_logprobs,
    }
}

/// Where each prompt position's final hidden row is: loaded from the cache, or computed
/// by this step.
struct PromptRows<'a> {
    step: &'a Tensor,
    /// Where each prompt's computed rows are in `step`; None for a prompt the step
    /// returned only the last row of.
    spans: Vec<Option<SeqSpan>>,
    loaded: &'a [LoadedPrefix],
    hidden_size: usize,
}

impl PromptRows<'_> {
    /// Every position of prompt `i`, \[prompt, hidden\].
    fn prompt(&self, i: usize) -> Result<Tensor, EngineError> {
        let Some(span) = self.spans.get(i).copied().flatten() else {
            return Err(EngineError::Scoring(format!(
                "the step kept no prompt rows of sequence {i}"
            )));
        };
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
    /// None if the prompt has no such positions or the step did not keep its rows.
    fn host_rows(&self, i: usize, step: &[f32], positions: Range<usize>) -> Option<Vec<f32>> {
        let h = self.hidden_size;
        let cached = self.loaded.get(i)?;
        let span = self.spans.get(i).copied().flatten()?;
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
    input: StepInput,
) -> Result<Tensor, EngineError> {
    let mut caches: Vec<&mut SeqCache> = seqs.iter_mut().map(|s| &mut s.cache).collect();
    Ok(model.forward(&input, &mut caches)?)
}

/// Logits of hidden rows, flattened row-major (\[rows × vocab\]) on the host.
fn logits_rows(model: &Model, hidden: &Tensor) -> Result<Vec<f32>, EngineError> {
    with_logits(model, hidden, |logits| Ok(logits.to_vec()))
}

/// Calls `f` with the logits of hidden rows, flattened row-major (\[rows × vocab\]): read
/// where the output layer wrote them when that is host memory, else copied from the
/// device. A chunk of prompt positions' logits is 16 MiB on Gemma 3 (`auto_logits_chunk`);
/// at 8 MiB, its copy was 2.4% of the CPU time of scoring every position of a prompt.
fn with_logits<T>(
    model: &Model,
    hidden: &Tensor,
    f: impl FnOnce(&[f32]) -> Result<T, EngineError>,
) -> Result<T, EngineError> {
    let logits = model.logits(hidden)?;
    let (storage, layout) = logits.storage_and_layout();
    if let Storage::Cpu(cpu) = &*storage {
        if let Ok(rows) = host_f32(cpu, layout, "logits") {
            return f(rows);
        }
    }
    drop(storage);
    f(&logits.flatten_all()?.to_vec1::<f32>()?)
}

/// [`with_logits`] of `hidden`, or `f(&[])` with no rows.
fn with_logits_of<T>(
    model: &Model,
    hidden: Option<&Tensor>,
    f: impl FnOnce(&[f32]) -> Result<T, EngineError>,
) -> Result<T, EngineError> {
    match hidden {
        Some(h) => with_logits(model, h, f),
        None => f(&[]),
    }
}

/// That `logits` holds `rows` rows of `vocab` (not 0), so that every position gets its row.
fn check_rows(logits: &[f32], rows: usize, vocab: usize) -> Result<(), EngineError> {
    if vocab > 0 && logits.len() == rows * vocab {
        Ok(())
    } else {
        Err(EngineError::Scoring(format!(
            "the output layer gave {} values for {rows} rows of {vocab}",
            logits.len()
        )))
    }
}
