//! Helpers shared by the shard's integration tests: the real model, requests, and a
//! driver that runs batches to completion the way the router would.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::PathBuf;

use sonde_proto as pb;
use sonde_proto::WeightQuant;
use sonde_shard::engine::types::{
    Batch, FinishReason, Generation, Request, ScoreOptions, TokenScore, TopToken,
};
use sonde_shard::engine::{Engine, EngineConfig};
use sonde_shard::loader::{self, LoadOptions};
use sonde_shard::sampling::SamplingParams;

pub fn gguf_path() -> PathBuf {
    sonde_testdata::smollm2_gguf()
}

/// The GGUF dequantized to an f32 Hugging Face folder by `scripts/gguf_to_hf.py`.
pub fn hf_f32_path() -> PathBuf {
    sonde_testdata::path("models/smollm2-hf-f32")
}

pub fn engine(path: &std::path::Path, budget: usize) -> Engine {
    engine_with(path, budget, WeightQuant::default())
}

pub fn engine_with(path: &std::path::Path, budget: usize, policy: WeightQuant) -> Engine {
    engine_opts(path, budget, &LoadOptions::cpu(policy))
}

pub fn engine_opts(path: &std::path::Path, budget: usize, opts: &LoadOptions) -> Engine {
    engine_config(path, opts, config(budget))
}

/// The tests' engine settings: a small logits chunk, so prompts span several chunks.
pub fn config(budget: usize) -> EngineConfig {
    EngineConfig {
        max_batch_total_tokens: budget,
        prompt_logits_chunk: 16,
        prefix_cache: true,
    }
}

pub fn engine_config(path: &std::path::Path, opts: &LoadOptions, cfg: EngineConfig) -> Engine {
    let loaded = loader::load(path, opts)
        .unwrap_or_else(|e| panic!("{e} (run scripts/fetch-data and scripts/test)"));
    Engine::new(loaded, cfg)
}

/// A request builder with greedy defaults.
#[derive(Clone)]
pub struct Req(pub Request);

impl Req {
    pub fn new(id: u64, ids: &[u32], max_new_tokens: u32) -> Self {
        let mut req = Request {
            id,
            input_ids: ids.to_vec(),
            ..Default::default()
        };
        req.stopping.max_new_tokens = max_new_tokens;
        Req(req)
    }
    pub fn scores(mut self, f: impl FnOnce(&mut ScoreOptions)) -> Self {
        f(&mut self.0.scores);
        self
    }
    pub fn sampling(mut self, f: impl FnOnce(&mut SamplingParams)) -> Self {
        f(&mut self.0.sampling);
        self
    }
    pub fn ignore_eos(mut self) -> Self {
        self.0.stopping.ignore_eos_token = true;
        self
    }
}

/// Everything the shard said about one request, in order.
#[derive(Default, Debug, Clone)]
pub struct Outcome {
    pub prefill: Vec<TokenScore>,
    pub tokens: Vec<TokenScore>,
    pub finish_reason: Option<FinishReason>,
    /// Prompt tokens the prefix cache supplied.
    pub cached_prompt_tokens: u32,
}

impl Outcome {
    pub fn ids(&self) -> Vec<u32> {
        self.tokens.iter().map(|t| t.id).collect()
    }
}

/// Collects generations into per-request outcomes.
pub fn absorb(out: &mut HashMap<u64, Outcome>, generations: Vec<Generation>) {
    for g in generations {
        let o = out.entry(g.request_id).or_default();
        if !g.prefill.is_empty() {
            o.prefill = g.prefill;
        }
        o.cached_prompt_tokens = o.cached_prompt_tokens.max(g.cached_prompt_tokens);
        o.tokens.extend(g.token);
        if g.finish_reason.is_some() {
            o.finish_reason = g.finish_reason;
        }
    }
}

/// The protobuf form of a request, for the tests that drive the shard over gRPC (as the
/// router's client does).
pub fn to_proto(r: &Request) -> pb::Request {
    let s = &r.sampling;
    pb::Request {
        id: r.id,
        input_ids: r.input_ids.clone(),
        sampling: Some(pb::SamplingParameters {
            do_sample: s.do_sample,
            temperature: s.temperature,
            top_k: s.top_k,
            top_p: s.top_p,
            typical_p: s.typical_p,
            repetition_penalty: s.repetition_penalty,
            frequency_penalty: s.frequency_penalty,
            seed: s.seed,
        }),
        stopping: Some(pb::StoppingParameters {
            max_new_tokens: r.stopping.max_new_tokens,
            stop_token_ids: r.stopping.stop_token_ids.clone(),
            ignore_eos_token: r.stopping.ignore_eos_token,
        }),
        scores: Some(pb::ScoreOptions {
            top_n_tokens: r.scores.top_n_tokens,
            prefill_logprobs: r.scores.prefill_logprobs,
            logprobs_mode: r.scores.logprobs_mode as i32,
            return_logits: r.scores.return_logits,
            logprob_token_ids: r.scores.logprob_token_ids.clone(),
        }),
    }
}

/// Collects generations that came over gRPC into per-request outcomes.
pub fn absorb_proto(out: &mut HashMap<u64, Outcome>, generations: Vec<pb::Generation>) {
    let score = |t: pb::TokenScores| TokenScore {
        id: t.id,
        logprob: t.logprob,
        logit: t.logit,
        rank: t.rank,
        top_tokens: t
            .top_tokens
            .into_iter()
            .map(|t| TopToken {
                id: t.id,
                logprob: t.logprob,
            })
            .collect(),
        label_logprobs: t.label_logprobs,
    };
    let finish = |f: i32| match pb::FinishReason::try_from(f) {
        Ok(pb::FinishReason::Length) => Some(FinishReason::Length),
        Ok(pb::FinishReason::EosToken) => Some(FinishReason::EosToken),
        Ok(pb::FinishReason::StopToken) => Some(FinishReason::StopToken),
        _ => panic!("finish reason {f} is not one the shard sends"),
    };
    let generations = generations.into_iter().map(|g| Generation {
        request_id: g.request_id,
        prefill: g.prefill.into_iter().map(score).collect(),
        token: g.token.map(score),
        finish_reason: g.finish_reason.and_then(finish),
        generated_tokens: g.generated_tokens,
        cached_prompt_tokens: g.cached_prompt_tokens,
    });
    absorb(out, generations.collect());
}

/// Prefills `requests` as one batch and decodes until every request finished.
pub fn run_batch(engine: &mut Engine, batch_id: u64, requests: Vec<Req>) -> HashMap<u64, Outcome> {
    let mut out = HashMap::new();
    let step = engine
        .prefill(Batch {
            id: batch_id,
            requests: requests.into_iter().map(|r| r.0).collect(),
        })
        .unwrap();
    absorb(&mut out, step.generations);
    let mut batch = step.batch;
    while let Some(b) = batch {
        let step = engine.decode(&[b.id]).unwrap();
        absorb(&mut out, step.generations);
        batch = step.batch;
    }
    out
}

pub fn run_one(engine: &mut Engine, req: Req) -> Outcome {
    let id = req.0.id;
    run_batch(engine, 1_000_000 + id, vec![req])
        .remove(&id)
        .unwrap()
}

/// Gemma 3 270M Q4_K_M, the second real model (`scripts/fetch-data gemma`).
pub fn gemma3_path() -> PathBuf {
    sonde_testdata::path("models/gemma-3-270m-q4_k_m.gguf")
}
