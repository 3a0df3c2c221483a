//! Helpers shared by the shard's integration tests: the real model, requests, and a
//! driver that runs batches to completion the way the router would.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use sonde_proto::WeightQuant;
use sonde_shard::engine::types::{
    Batch, FinishReason, Generation, Request, ScoreOptions, TokenScore,
};
use sonde_shard::engine::{Engine, EngineConfig, Speculation};
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
        prompt_logits_chunk: Some(16),
        prefix_cache: true,
        speculation: Speculation::default(),
    }
}

/// Two engines on the same model and budget, the first with the prefix cache and the
/// second without.
pub fn warm_and_cold(path: &Path, budget: usize) -> (Engine, Engine) {
    let opts = LoadOptions::cpu(WeightQuant::default());
    let warm = engine_config(path, &opts, config(budget));
    let mut cold_cfg = config(budget);
    cold_cfg.prefix_cache = false;
    let cold = engine_config(path, &opts, cold_cfg);
    assert!(warm.prefix_caching() && !cold.prefix_caching());
    (warm, cold)
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

/// Prefills `requests` as one batch and decodes until every request finished.
pub fn run_batch(engine: &mut Engine, batch_id: u64, requests: Vec<Req>) -> HashMap<u64, Outcome> {
    run_batch_counting(engine, batch_id, requests).0
}

/// [`run_batch`], also returning the number of decode steps it took.
pub fn run_batch_counting(
    engine: &mut Engine,
    batch_id: u64,
    requests: Vec<Req>,
) -> (HashMap<u64, Outcome>, usize) {
    let mut out = HashMap::new();
    let step = engine
        .prefill(Batch {
            id: batch_id,
            requests: requests.into_iter().map(|r| r.0).collect(),
        })
        .unwrap();
    absorb(&mut out, step.generations);
    let mut batch = step.batch;
    let mut steps = 0;
    while let Some(b) = batch {
        let step = engine.decode(&[b.id]).unwrap();
        steps += 1;
        absorb(&mut out, step.generations);
        batch = step.batch;
    }
    (out, steps)
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

/// The generated tokens of `prompts` and every score of them, requested with prompt
/// scores and without: a step that does not score a prompt computes its last layer at
/// the last position alone (`StepInput::returned`), which must change no bit. The
/// reference is every prompt scored in one batch, on an engine without the prefix cache.
/// Then, on one with it, half the prompts score in a batch and the other half in the
/// next, so each batch mixes both kinds and the second meets the blocks the first cached,
/// with and without hidden rows.
pub fn assert_prompt_scores_change_no_token(path: &Path, prompts: &[Vec<u32>]) {
    let req = |i: usize, scored: bool| {
        Req::new(i as u64, &prompts[i], 8).ignore_eos().scores(|s| {
            s.prefill_logprobs = scored;
            s.top_n_tokens = 3;
            s.return_logits = true;
            s.logprob_token_ids = vec![0, 1];
        })
    };
    let n = prompts.len();
    let (mut warm, mut cold) = warm_and_cold(path, 16_384);
    let every = run_batch(&mut cold, 1, (0..n).map(|i| req(i, true)).collect());
    let even = run_batch(&mut warm, 1, (0..n).map(|i| req(i, i % 2 == 0)).collect());
    let odd = run_batch(&mut warm, 2, (0..n).map(|i| req(i, i % 2 == 1)).collect());
    for i in 0..n as u64 {
        let want = &every[&i];
        assert_eq!(want.tokens.len(), 8, "prompt {i}");
        assert_eq!(want.prefill.len(), prompts[i as usize].len(), "prompt {i}");
        for (mixed, what) in [(&even[&i], "even"), (&odd[&i], "odd")] {
            let scored = (i % 2 == 0) == (what == "even");
            assert_eq!(
                mixed.tokens, want.tokens,
                "prompt {i}, {what} prompts scored"
            );
            if scored {
                assert_eq!(mixed.prefill, want.prefill, "prompt {i}, {what} scored");
            } else {
                assert!(mixed.prefill.is_empty(), "prompt {i}");
            }
        }
    }
}

/// The greedy tokens of `prompts` are the same whether the answer shows their logprobs or
/// not: a request that shows none has each token found as the argmax alone, without most
/// of the output layer (`Model::greedy_tokens`), which must give the token the full row
/// gives. The reference is every prompt with its logprobs; then one batch mixes both kinds
/// (even prompts unscored), 24 tokens each, drafts included where text repeats.
pub fn assert_unscored_tokens_are_the_scored_ones(path: &Path, prompts: &[Vec<u32>]) {
    let req = |i: usize, unscored: bool| {
        Req::new(i as u64, &prompts[i], 24)
            .ignore_eos()
            .scores(|s| s.skip_token_logprobs = unscored)
    };
    let n = prompts.len();
    let mut e = engine(path, 16_384);
    let scored = run_batch(&mut e, 1, (0..n).map(|i| req(i, false)).collect());
    let mixed = run_batch(&mut e, 2, (0..n).map(|i| req(i, i % 2 == 0)).collect());
    // Where the output layer has its index (Q8_0, on a CPU with AVX-512 VNNI), the
    // unscored tokens have no logprob: they came from the argmax path.
    let argmax_path = e.output_layer_has_greedy_index();
    for i in 0..n as u64 {
        let (want, got) = (&scored[&i], &mixed[&i]);
        assert_eq!(got.ids(), want.ids(), "prompt {i}");
        if i % 2 == 1 {
            assert_eq!(got.tokens, want.tokens, "prompt {i}, scored in both");
        } else if argmax_path {
            // The first token comes from the prefill, which computes its logits.
            assert!(
                got.tokens[1..].iter().all(|t| t.logprob.is_none()),
                "prompt {i}: an unscored token has a logprob"
            );
        }
    }
}
