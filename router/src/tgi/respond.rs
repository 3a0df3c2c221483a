//! Building TGI answers from generations; Vertex `inputs` instances use the same.

use futures::future::try_join_all;
use sonde_tokenizer::ModelTokenizer;

use super::convert::Prepared;
use super::types::{
    BestOfSequence, Details, ExtraScores, GenerateResponse, LabelLogprob, PrefillToken,
    StreamDetails, StreamResponse, Token, TopToken,
};
use crate::error::ApiError;
use crate::generation::{collect, json_logprob, Generated, Step, TextTracker};
use crate::infer::TokenScore;
use crate::state::Ready;
use crate::validation::ValidGenerate;

/// Turns scores into wire tokens for one request.
pub struct Scorer<'a> {
    pub tokenizer: &'a ModelTokenizer,
    pub label_ids: &'a [u32],
}

impl Scorer<'_> {
    fn text(&self, id: u32) -> String {
        self.tokenizer.token_text(id).unwrap_or_default()
    }

    fn labels(&self, t: &TokenScore) -> Option<Vec<LabelLogprob>> {
        if self.label_ids.is_empty() {
            return None;
        }
        let labels = self.label_ids.iter().zip(&t.labels);
        Some(
            labels
                .map(|(&id, &lp)| LabelLogprob {
                    id,
                    text: self.text(id),
                    logprob: json_logprob(lp),
                })
                .collect(),
        )
    }

    pub fn token(&self, t: &TokenScore) -> Token {
        Token {
            id: t.id,
            text: self.text(t.id),
            logprob: json_logprob(t.logprob.unwrap_or(f32::NEG_INFINITY)),
            special: self.tokenizer.is_special(t.id),
            extra: self.extra(t),
        }
    }

    pub fn prefill(&self, t: &TokenScore) -> PrefillToken {
        PrefillToken {
            id: t.id,
            text: self.text(t.id),
            logprob: t.logprob.map(json_logprob),
            extra: self.extra(t),
        }
    }

    fn extra(&self, t: &TokenScore) -> ExtraScores {
        ExtraScores {
            logit: t.logit,
            rank: t.rank,
            label_logprobs: self.labels(t),
        }
    }

    pub fn top(&self, t: &TokenScore) -> Vec<TopToken> {
        t.top
            .iter()
            .map(|&(id, lp)| TopToken {
                id,
                text: self.text(id),
                logprob: json_logprob(lp),
                special: self.tokenizer.is_special(id),
            })
            .collect()
    }
}

/// Runs one generate request (and its `best_of` candidates) to the end.
pub async fn generate(ready: &Ready, p: &Prepared) -> Result<GenerateResponse, ApiError> {
    let tokenizer = ready.validator.tokenizer();
    let valid = &p.valid;
    let candidates = (0..valid.generations).map(|i| {
        let request = valid.generation(i);
        let tracker = TextTracker::new(tokenizer.clone(), valid.stop.clone());
        async move {
            let seed = request.sampling.seed();
            let rx = ready.backend.schedule(request)?;
            collect(rx, tracker).await.map(|g| (g, seed))
        }
    });
    let mut results = try_join_all(candidates).await?;
    // The best candidate is the most likely generation under the model.
    let best = (0..results.len())
        .max_by(|&a, &b| sum_logprob(&results[a].0).total_cmp(&sum_logprob(&results[b].0)))
        .unwrap_or(0);
    let (generated, seed) = results.swap_remove(best);
    let scorer = Scorer {
        tokenizer,
        label_ids: &valid.request.scores.label_ids,
    };
    let text = full_text(p, &generated.full_text);
    if !p.params.wants_scores() {
        return Ok(GenerateResponse {
            generated_text: text,
            details: None,
        });
    }
    let best_of_sequences = (valid.generations > 1).then(|| {
        results
            .iter()
            .map(|(g, seed)| BestOfSequence {
                generated_text: full_text(p, &g.full_text),
                finish_reason: g.finish,
                generated_tokens: g.tokens.len() as u32,
                seed: *seed,
                prefill: prefill(&scorer, p, g),
                tokens: g.tokens.iter().map(|t| scorer.token(t)).collect(),
                top_tokens: top_tokens(&scorer, valid, g),
            })
            .collect()
    });
    Ok(GenerateResponse {
        generated_text: text,
        details: Some(Details {
            finish_reason: generated.finish,
            generated_tokens: generated.tokens.len() as u32,
            seed,
            input_length: valid.request.input_ids.len() as u32,
            prefill: prefill(&scorer, p, &generated),
            tokens: generated.tokens.iter().map(|t| scorer.token(t)).collect(),
            top_tokens: top_tokens(&scorer, valid, &generated),
            best_of_sequences,
        }),
    })
}

fn sum_logprob(g: &Generated) -> f32 {
    g.tokens.iter().filter_map(|t| t.logprob).sum()
}

fn full_text(p: &Prepared, generated: &str) -> String {
    if p.params.return_full_text {
        format!("{}{generated}", p.inputs)
    } else {
        generated.to_string()
    }
}

fn prefill(scorer: &Scorer<'_>, p: &Prepared, g: &Generated) -> Vec<PrefillToken> {
    if p.params.decoder_input_details {
        g.prompt.iter().map(|t| scorer.prefill(t)).collect()
    } else {
        Vec::new()
    }
}

fn top_tokens(scorer: &Scorer<'_>, valid: &ValidGenerate, g: &Generated) -> Vec<Vec<TopToken>> {
    if valid.request.scores.top_n_tokens == 0 {
        return Vec::new();
    }
    g.tokens.iter().map(|t| scorer.top(t)).collect()
}

/// One SSE event of `/generate_stream`.
pub fn stream_event(scorer: &Scorer<'_>, p: &Prepared, step: &Step) -> StreamResponse {
    let valid = &p.valid;
    let (generated_text, details) = match &step.last {
        None => (None, None),
        Some(last) => (
            Some(full_text(p, &last.full_text)),
            p.params.details.then(|| StreamDetails {
                finish_reason: last.finish,
                generated_tokens: last.generated_tokens,
                seed: valid.request.sampling.seed(),
                input_length: valid.request.input_ids.len() as u32,
            }),
        ),
    };
    StreamResponse {
        // 1-based, as TGI numbers stream events.
        index: step.index + 1,
        token: scorer.token(&step.token),
        top_tokens: scorer.top(&step.token),
        generated_text,
        details,
    }
}
