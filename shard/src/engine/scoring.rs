//! Turns rows of logits into chosen tokens and their scores.

use super::sequence::{ScoreSpec, Sequence};
use super::types::{TokenScore, TopToken};
use crate::error::EngineError;
use sonde_proto::LogprobsMode;

use crate::sampling::{score_token, Logits, ScoreOptions, Scratch, TokenScores};
use rayon::prelude::*;

/// A [`Scorer`] per thread of the engine's pool, so that rows are sampled and scored in
/// parallel: over a 262k vocabulary a row's normaliser alone is ~0.5 ms, which on the
/// engine thread alone leaves the other CPUs idle. Each row's result is its own either way.
pub struct Scorers(Vec<Scorer>);

impl Scorers {
    /// As many scorers as the pool has threads (at least one).
    pub fn new(vocab_size: usize) -> Self {
        let threads = rayon::current_num_threads().max(1);
        Scorers((0..threads).map(|_| Scorer::new(vocab_size)).collect())
    }

    /// The scorer for work done on the engine thread alone.
    pub fn first(&mut self) -> &mut Scorer {
        &mut self.0[0]
    }

    /// Runs `f` on every job, the jobs split in runs of about equal length, one run per
    /// thread with its own scorer; `f` pushes a job's results, which come back in the
    /// jobs' order.
    pub fn run<J: Send, T: Send>(
        &mut self,
        jobs: &mut [J],
        f: impl Fn(&mut Scorer, &mut J, &mut Vec<T>) -> Result<(), EngineError> + Sync,
    ) -> Result<Vec<T>, EngineError> {
        let per_thread = jobs.len().div_ceil(self.0.len()).max(1);
        let runs: Vec<Result<Vec<T>, EngineError>> = self
            .0
            .par_iter_mut()
            .zip(jobs.par_chunks_mut(per_thread))
            .map(|(scorer, jobs)| {
                let mut out = Vec::with_capacity(jobs.len());
                for job in jobs {
                    f(scorer, job, &mut out)?;
                }
                Ok(out)
            })
            .collect();
        let mut out = Vec::with_capacity(jobs.len());
        for run in runs {
            out.extend(run?);
        }
        Ok(out)
    }
}

/// Reusable buffers for scoring rows, one thread at a time (see [`Scorers`]).
pub struct Scorer {
    sample: Scratch,
    score: Scratch,
}

impl Scorer {
    pub fn new(vocab_size: usize) -> Self {
        Scorer {
            sample: Scratch::with_vocab(vocab_size),
            score: Scratch::with_vocab(vocab_size),
        }
    }

    /// Chooses the sequence's next token from `row` and scores it in the request's mode.
    pub fn next_token(
        &mut self,
        seq: &mut Sequence,
        row: &[f32],
    ) -> Result<TokenScore, EngineError> {
        let choice = seq
            .sampler
            .next_token(row, &mut self.sample)
            .map_err(|e| EngineError::Scoring(e.to_string()))?;
        let token = choice.token;
        let opts = options(&seq.scores, seq.scores.mode);
        let logits = Logits {
            raw: row,
            processed: choice.processed_logprobs,
        };
        let scores = score_token(logits, token, &opts, &mut self.score)
            .map_err(|e| EngineError::Scoring(e.to_string()))?;
        seq.sampler.push(token);
        Ok(token_score(token, scores))
    }

    /// The sequence's next token when it is its raw logits' argmax, found without them
    /// (`Sequence::argmax_only`): no score, as none is shown.
    pub fn argmax_token(&mut self, seq: &mut Sequence, token: u32) -> TokenScore {
        seq.sampler.push(token);
        TokenScore {
            id: token,
            ..Default::default()
        }
    }

    /// Scores the prompt token that followed the position whose logits are `row`.
    /// Prompt tokens were not sampled, so their scores are always the raw distribution's.
    pub fn prompt_token(
        &mut self,
        spec: &ScoreSpec,
        row: &[f32],
        token: u32,
    ) -> Result<TokenScore, EngineError> {
        let opts = options(spec, LogprobsMode::Raw);
        let scores = score_token(Logits::raw(row), token, &opts, &mut self.score)
            .map_err(|e| EngineError::Scoring(e.to_string()))?;
        Ok(token_score(token, scores))
    }
}

/// The first prompt token: nothing precedes it, so it has an id and nothing else.
pub fn first_prompt_token(token: u32) -> TokenScore {
    TokenScore {
        id: token,
        ..Default::default()
    }
}

fn options(spec: &ScoreSpec, mode: LogprobsMode) -> ScoreOptions<'_> {
    ScoreOptions {
        top_n_tokens: spec.top_n_tokens,
        return_logits: spec.return_logits,
        label_ids: &spec.labels,
        mode,
    }
}

fn token_score(token: u32, s: TokenScores) -> TokenScore {
    let top_tokens = s
        .top
        .into_iter()
        .map(|(id, logprob)| TopToken { id, logprob });
    TokenScore {
        id: token,
        logprob: Some(s.logprob),
        logit: s.logit,
        rank: s.rank,
        top_tokens: top_tokens.collect(),
        label_logprobs: s.labels,
    }
}
