//! The engine's types to and from protobuf: the only place the shard reads or writes the
//! wire's conventions (0 for an unset float, enums as integers, optional sub-messages).

use std::time::Duration;

use sonde_proto as pb;

use crate::engine::types::{
    Batch, CachedBatch, FinishReason, Generation, Request, ScoreOptions, StopOptions, TokenScore,
};
use crate::engine::{Engine, PrefixStats, StepOutput, MAX_LABEL_TOKENS, PREFIX_BLOCK_TOKENS};
use crate::error::EngineError;
use crate::sampling::SamplingParams;

pub fn batch(b: pb::Batch) -> Result<Batch, EngineError> {
    Ok(Batch {
        id: b.id,
        requests: b
            .requests
            .into_iter()
            .map(request)
            .collect::<Result<_, _>>()?,
    })
}

fn request(r: pb::Request) -> Result<Request, EngineError> {
    let s = r.sampling.unwrap_or_default();
    // proto3 cannot tell an unset float from 0; 0 means "off" for these (see the proto).
    let or_off = |x: f32| if x == 0.0 { 1.0 } else { x };
    let sampling = SamplingParams {
        do_sample: s.do_sample,
        temperature: or_off(s.temperature),
        top_k: s.top_k,
        top_p: or_off(s.top_p),
        typical_p: or_off(s.typical_p),
        repetition_penalty: or_off(s.repetition_penalty),
        frequency_penalty: s.frequency_penalty,
        seed: s.seed,
    };
    let stop = r.stopping.unwrap_or_default();
    let scores = r.scores.unwrap_or_default();
    let logprobs_mode = pb::LogprobsMode::try_from(scores.logprobs_mode).map_err(|_| {
        EngineError::InvalidRequest(format!(
            "request {}: scores.logprobs_mode {} is not a known mode",
            r.id, scores.logprobs_mode
        ))
    })?;
    Ok(Request {
        id: r.id,
        input_ids: r.input_ids,
        sampling,
        stopping: StopOptions {
            max_new_tokens: stop.max_new_tokens,
            stop_token_ids: stop.stop_token_ids,
            ignore_eos_token: stop.ignore_eos_token,
        },
        scores: ScoreOptions {
            top_n_tokens: scores.top_n_tokens,
            prefill_logprobs: scores.prefill_logprobs,
            logprobs_mode,
            return_logits: scores.return_logits,
            logprob_token_ids: scores.logprob_token_ids,
            skip_token_logprobs: scores.skip_token_logprobs,
        },
    })
}

pub fn cached(b: CachedBatch) -> pb::CachedBatch {
    pb::CachedBatch {
        id: b.id,
        request_ids: b.request_ids,
        reserved_tokens: b.reserved_tokens as u32,
    }
}

/// A step's generations, the batch that goes on, and how long the call took.
pub fn step(out: StepOutput, total: Duration) -> pb::StepResponse {
    pb::StepResponse {
        generations: out.generations.into_iter().map(generation).collect(),
        batch: out.batch.map(cached),
        forward_ns: out.forward_ns,
        total_ns: total.as_nanos() as u64,
        prefix_cache: Some(prefix_stats(out.prefix)),
        speculation: Some(pb::SpeculationStats {
            drafted_tokens: out.speculation.drafted_tokens,
            accepted_tokens: out.speculation.accepted_tokens,
        }),
    }
}

fn generation(g: Generation) -> pb::Generation {
    pb::Generation {
        request_id: g.request_id,
        prefill: g.prefill.into_iter().map(token_score).collect(),
        token: g.token.map(token_score),
        finish_reason: g.finish_reason.map(|f| finish_reason(f) as i32),
        generated_tokens: g.generated_tokens,
        cached_prompt_tokens: g.cached_prompt_tokens,
    }
}

fn token_score(t: TokenScore) -> pb::TokenScores {
    pb::TokenScores {
        id: t.id,
        logprob: t.logprob,
        logit: t.logit,
        rank: t.rank,
        top_tokens: t
            .top_tokens
            .into_iter()
            .map(|t| pb::TopToken {
                id: t.id,
                logprob: t.logprob,
            })
            .collect(),
        label_logprobs: t.label_logprobs,
    }
}

fn finish_reason(f: FinishReason) -> pb::FinishReason {
    match f {
        FinishReason::Length => pb::FinishReason::Length,
        FinishReason::EosToken => pb::FinishReason::EosToken,
        FinishReason::StopToken => pb::FinishReason::StopToken,
    }
}

pub fn info(engine: &Engine) -> pb::InfoResponse {
    let f = engine.facts();
    pb::InfoResponse {
        model_id: f.model_id.clone(),
        architecture: f.architecture.clone(),
        weights_format: f.weights_format.clone(),
        dtype: f.dtype.clone(),
        device: f.device.clone(),
        vocab_size: f.vocab_size as u32,
        eos_token_ids: f.eos_token_ids.clone(),
        bos_token_id: f.bos_token_id,
        max_context: f.max_context as u32,
        max_batch_total_tokens: engine.config().max_batch_total_tokens as u32,
        max_label_tokens: MAX_LABEL_TOKENS as u32,
        prefix_caching: engine.prefix_caching(),
        prefix_block_tokens: PREFIX_BLOCK_TOKENS as u32,
    }
}

pub fn prefix_stats(s: PrefixStats) -> pb::PrefixCacheStats {
    pb::PrefixCacheStats {
        hit_tokens: s.hit_tokens,
        evicted_tokens: s.evicted_tokens,
        cached_tokens: s.cached_tokens,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn unset_proto_floats_are_the_processors_off_values() {
        let r = request(pb::Request {
            id: 1,
            input_ids: vec![1],
            ..Default::default()
        })
        .unwrap();
        assert_eq!(r.sampling, SamplingParams::default());
        assert_eq!(r.scores.logprobs_mode, pb::LogprobsMode::Raw);
        let r = request(pb::Request {
            sampling: Some(pb::SamplingParameters {
                temperature: 0.5,
                frequency_penalty: 0.25,
                ..Default::default()
            }),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            (r.sampling.temperature, r.sampling.frequency_penalty),
            (0.5, 0.25)
        );
    }

    #[test]
    fn an_unknown_logprobs_mode_is_refused_naming_the_field() {
        let err = request(pb::Request {
            id: 9,
            scores: Some(pb::ScoreOptions {
                logprobs_mode: 7,
                ..Default::default()
            }),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "request 9: scores.logprobs_mode 7 is not a known mode"
        );
    }

    #[test]
    fn finish_reasons_keep_their_meaning_on_the_wire() {
        let g = generation(Generation {
            request_id: 3,
            prefill: Vec::new(),
            token: None,
            finish_reason: Some(FinishReason::StopToken),
            generated_tokens: 2,
            cached_prompt_tokens: 16,
        });
        assert_eq!(g.finish_reason, Some(pb::FinishReason::StopToken as i32));
        assert_eq!(g.cached_prompt_tokens, 16);
    }
}
