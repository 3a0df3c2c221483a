//! The router's types to and from protobuf.

use sonde_proto as pb;

use crate::infer::{FinishReason, Sampling, TokenScore, ValidRequest};
use crate::shard::{
    CachedBatch, Generation, NewBatch, PrefixCacheStats, ShardInfo, SpeculationStats, StepOutput,
};

pub(super) fn batch(b: &NewBatch) -> pb::Batch {
    pb::Batch {
        id: b.id,
        requests: b.requests.iter().map(|(id, r)| request(*id, r)).collect(),
    }
}

pub(super) fn info(i: pb::InfoResponse) -> ShardInfo {
    ShardInfo {
        model_id: i.model_id,
        architecture: i.architecture,
        weights_format: i.weights_format,
        dtype: i.dtype,
        device: i.device,
        vocab_size: i.vocab_size,
        eos_token_ids: i.eos_token_ids,
        bos_token_id: i.bos_token_id,
        max_context: i.max_context,
        max_label_tokens: i.max_label_tokens,
        prefix_caching: i.prefix_caching,
        prefix_block_tokens: i.prefix_block_tokens,
    }
}

pub(super) fn cached(b: pb::CachedBatch) -> CachedBatch {
    CachedBatch {
        id: b.id,
        request_ids: b.request_ids,
        reserved_tokens: b.reserved_tokens,
    }
}

pub(super) fn cached_to_proto(b: CachedBatch) -> pb::CachedBatch {
    pb::CachedBatch {
        id: b.id,
        request_ids: b.request_ids,
        reserved_tokens: b.reserved_tokens,
    }
}

pub(super) fn step(s: pb::StepResponse) -> StepOutput {
    StepOutput {
        generations: s.generations.into_iter().map(generation).collect(),
        batch: s.batch.map(cached),
        forward_ns: s.forward_ns,
        prefix_cache: s.prefix_cache.map(prefix_cache),
        speculation: s.speculation.map(|s| SpeculationStats {
            drafted_tokens: s.drafted_tokens,
            accepted_tokens: s.accepted_tokens,
        }),
    }
}

fn prefix_cache(s: pb::PrefixCacheStats) -> PrefixCacheStats {
    PrefixCacheStats {
        hit_tokens: s.hit_tokens,
        evicted_tokens: s.evicted_tokens,
        cached_tokens: s.cached_tokens,
    }
}

fn generation(g: pb::Generation) -> Generation {
    Generation {
        request_id: g.request_id,
        prefill: g.prefill.into_iter().map(token_score).collect(),
        token: g.token.map(token_score),
        finish: g.finish_reason.and_then(finish_reason),
        cached_prompt_tokens: g.cached_prompt_tokens,
    }
}

/// The protobuf form of a validated request.
fn request(id: u64, r: &ValidRequest) -> pb::Request {
    let mut sampling = pb::SamplingParameters {
        repetition_penalty: r.repetition_penalty.unwrap_or(1.0),
        frequency_penalty: r.frequency_penalty.unwrap_or(0.0),
        ..Default::default()
    };
    if let Sampling::Sample {
        temperature,
        top_k,
        top_p,
        typical_p,
        seed,
    } = r.sampling
    {
        sampling.do_sample = true;
        sampling.temperature = temperature;
        sampling.top_k = top_k.unwrap_or(0);
        sampling.top_p = top_p.unwrap_or(1.0);
        sampling.typical_p = typical_p.unwrap_or(1.0);
        sampling.seed = seed;
    }
    pb::Request {
        id,
        input_ids: r.input_ids.clone(),
        sampling: Some(sampling),
        stopping: Some(pb::StoppingParameters {
            max_new_tokens: r.max_new_tokens,
            stop_token_ids: Vec::new(),
            ignore_eos_token: false,
        }),
        scores: Some(pb::ScoreOptions {
            top_n_tokens: r.scores.top_n_tokens,
            prefill_logprobs: r.scores.prefill_logprobs,
            logprobs_mode: r.scores.mode as i32,
            return_logits: r.scores.return_logits,
            logprob_token_ids: r.scores.label_ids.clone(),
            skip_token_logprobs: r.scores.skip_token_logprobs,
        }),
    }
}

fn token_score(t: pb::TokenScores) -> TokenScore {
    TokenScore {
        id: t.id,
        logprob: t.logprob,
        logit: t.logit,
        rank: t.rank,
        top: t
            .top_tokens
            .into_iter()
            .map(|t| (t.id, t.logprob))
            .collect(),
        labels: t.label_logprobs,
    }
}

fn finish_reason(raw: i32) -> Option<FinishReason> {
    match pb::FinishReason::try_from(raw).ok()? {
        pb::FinishReason::Unspecified => None,
        pb::FinishReason::Length => Some(FinishReason::Length),
        pb::FinishReason::EosToken => Some(FinishReason::EosToken),
        pb::FinishReason::StopToken => Some(FinishReason::StopSequence),
    }
}
