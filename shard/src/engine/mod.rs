//! The engine: owns the model, the cached batches and the KV budget, and runs the
//! Prefill / Decode / FilterBatch / ClearCache protocol on one thread.

mod prefix;
mod rows;
mod scoring;
mod sequence;
mod speculation;
mod step;
pub mod types;

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use crate::error::EngineError;
use crate::loader::{LoadedModel, ModelFacts};
use crate::model::Model;
use crate::sampling::Sampler;
use prefix::{second_wave, PrefixStore, Prompt};
pub use prefix::{PrefixStats, BLOCK_TOKENS as PREFIX_BLOCK_TOKENS};
use scoring::Scorers;
pub use sequence::MAX_LABEL_TOKENS;
use sequence::{Sequence, ValidRequest};
pub use speculation::{Speculation, SpeculationStats};
use types::{Batch, CachedBatch, Generation, Request, StopOptions};

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// KV cache budget over all held requests, in tokens (prompt + max_new_tokens each).
    pub max_batch_total_tokens: usize,
    /// Prompt positions whose logits exist at once when scoring a prompt, so that
    /// positions × vocabulary never materialises in full; `None`: [`auto_logits_chunk`]
    /// of the model's vocabulary.
    pub prompt_logits_chunk: Option<usize>,
    /// The automatic prefix cache (`prefix.rs`), in the part of the budget no request
    /// reserves. It needs the host KV layout; elsewhere it stays off.
    pub prefix_cache: bool,
    /// Exact speculative decoding (`speculation.rs`). It needs the host attention kernel,
    /// whose rows are batch invariant; elsewhere it stays off.
    pub speculation: Speculation,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_batch_total_tokens: 16_384,
            prompt_logits_chunk: None,
            prefix_cache: true,
            speculation: Speculation::default(),
        }
    }
}

/// Bytes of logits a chunk of prompt positions may take (see [`auto_logits_chunk`]).
const PROMPT_LOGITS_BYTES: usize = 8 << 20;

/// Prompt positions scored at once by default: as many as keep their f32 logits within
/// [`PROMPT_LOGITS_BYTES`], from 16 to 32. The chunk's logits are written by the output
/// layer and read back by the scoring; kept in the last-level cache rather than streamed
/// through memory, a 512-token prompt with every position's logprobs took 2.4–2.8 s
/// instead of 3.0–3.1 s on Gemma 3 (262,144 tokens: 8 positions where it was 64), and
/// 1.19–1.26 s instead of 1.24–1.31 s on SmolLM2 (49,152: 32). At least 16: a product of
/// 16 rows reads the output layer (178 MB on Gemma 3) half as often as two of 8, and on
/// AVX-512 takes the kernel that puts rows in lanes; Gemma 3 scored such a prompt 1.13×
/// as fast with 16 as with 8 (median of 11 alternations, 0.66–1.37). Speed only: a row's
/// logits do not depend on the rows beside it.
pub fn auto_logits_chunk(vocab: usize) -> usize {
    (PROMPT_LOGITS_BYTES / (4 * vocab.max(1))).clamp(16, 32)
}

/// What one Prefill or Decode step produced.
pub struct StepOutput {
    pub generations: Vec<Generation>,
    /// The requests still running, under the step's batch id; none when all finished.
    pub batch: Option<CachedBatch>,
    pub forward_ns: u64,
    pub prefix: PrefixStats,
    pub speculation: SpeculationStats,
}

pub struct Engine {
    model: Model,
    facts: ModelFacts,
    cfg: EngineConfig,
    batches: HashMap<u64, Vec<Sequence>>,
    /// Sum of the held sequences' reservations.
    reserved: usize,
    /// A decode step's rows and a prompt's positions are scored in parallel with these.
    scorers: Scorers,
    prefix: PrefixStore,
    speculated: SpeculationStats,
}

impl Engine {
    pub fn new(loaded: LoadedModel, mut cfg: EngineConfig) -> Self {
        if !loaded.model.caches_on_host() {
            cfg.speculation = Speculation::OFF;
        }
        let spec = loaded.model.spec();
        let prefix = PrefixStore::new(
            cfg.prefix_cache && loaded.model.caches_on_host(),
            spec.hidden_size,
        );
        Engine {
            prefix,
            scorers: Scorers::new(loaded.facts.vocab_size),
            model: loaded.model,
            facts: loaded.facts,
            cfg,
            batches: HashMap::new(),
            reserved: 0,
            speculated: SpeculationStats::default(),
        }
    }

    /// Whether unscored greedy tokens are found without every logit
    /// (`Model::greedy_tokens`).
    pub fn output_layer_has_greedy_index(&self) -> bool {
        self.model.has_greedy_index()
    }

    pub fn facts(&self) -> &ModelFacts {
        &self.facts
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// KV cache tokens currently reserved by held requests.
    pub fn reserved_tokens(&self) -> usize {
        self.reserved
    }

    /// Whether the prefix cache is on.
    pub fn prefix_caching(&self) -> bool {
        self.prefix.enabled()
    }

    pub fn prefix_stats(&self) -> PrefixStats {
        self.prefix.stats()
    }

    pub fn speculation_stats(&self) -> SpeculationStats {
        self.speculated
    }

    /// Runs the prompts of a new batch and returns each request's first token.
    ///
    /// Requests that share a prefix with an earlier one of the same batch run in a second
    /// wave, after the first has cached it (`prefix::second_wave`).
    pub fn prefill(&mut self, batch: Batch) -> Result<StepOutput, EngineError> {
        let requests = self.admit(&batch)?;
        // The cache gives up the room this batch reserves: it never holds admission back.
        let needed: usize = requests.iter().map(ValidRequest::reservation).sum();
        self.prefix
            .evict_to(self.unreserved().saturating_sub(needed));
        let (requests, first_wave) = self.in_waves(requests);
        let mut seqs = Vec::with_capacity(requests.len());
        let mut prompts = Vec::with_capacity(requests.len());
        for req in requests {
            let cache = self.model.new_cache(req.reservation())?;
            let sampler = Sampler::new(req.sampling, &req.input_ids)
                .map_err(|e| EngineError::InvalidRequest(format!("request {}: {e}", req.id)))?;
            seqs.push(Sequence {
                id: req.id,
                cache,
                sampler,
                stopping: req.stopping,
                scores: req.scores,
                last_token: 0,
                generated: 0,
                history: req.input_ids.clone(),
                draft_len: 1,
            });
            prompts.push(req.input_ids);
        }
        self.reserved += seqs.iter().map(Sequence::reservation).sum::<usize>();
        self.run_step(batch.id, seqs, |engine, seqs| {
            engine.prefill_waves(seqs, &prompts, first_wave)
        })
    }

    /// Orders a batch's requests first wave first; returns them and the first wave's size.
    fn in_waves(&self, requests: Vec<ValidRequest>) -> (Vec<ValidRequest>, usize) {
        let prompts: Vec<Prompt> = requests
            .iter()
            .map(|r| Prompt {
                tokens: &r.input_ids,
                scored: r.scores.prefill_logprobs,
            })
            .collect();
        let wait = second_wave(&self.prefix, &prompts, |i| prompts[i].tokens.len() - 1);
        let (mut first, second): (Vec<_>, Vec<_>) =
            requests.into_iter().zip(wait).partition(|(_, wait)| !wait);
        let split = first.len();
        first.extend(second);
        (first.into_iter().map(|(r, _)| r).collect(), split)
    }

    fn prefill_waves(
        &mut self,
        seqs: &mut [Sequence],
        prompts: &[Vec<u32>],
        first_wave: usize,
    ) -> Result<Vec<Generation>, EngineError> {
        let (first, second) = seqs.split_at_mut(first_wave);
        let mut generations = self.prefill_step(first, &prompts[..first_wave])?;
        if !second.is_empty() {
            generations.extend(self.prefill_step(second, &prompts[first_wave..])?);
        }
        Ok(generations)
    }

    /// KV budget tokens no held request reserves: the prefix cache's room.
    fn unreserved(&self) -> usize {
        self.cfg
            .max_batch_total_tokens
            .saturating_sub(self.reserved)
    }

    /// Advances the given batches by one token; they continue as one batch under the
    /// first id.
    pub fn decode(&mut self, batch_ids: &[u64]) -> Result<StepOutput, EngineError> {
        let Some(&first) = batch_ids.first() else {
            return Err(EngineError::InvalidRequest("Decode names no batch".into()));
        };
        if let Some(&missing) = batch_ids.iter().find(|id| !self.batches.contains_key(id)) {
            return Err(EngineError::UnknownBatch(missing));
        }
        let distinct: HashSet<u64> = batch_ids.iter().copied().collect();
        if distinct.len() != batch_ids.len() {
            return Err(EngineError::InvalidRequest(format!(
                "Decode names a batch twice: {batch_ids:?}"
            )));
        }
        let mut seqs = Vec::new();
        for id in batch_ids {
            seqs.extend(self.batches.remove(id).unwrap_or_default());
        }
        self.run_step(first, seqs, Self::decode_step)
    }

    /// Keeps only `keep` of a held batch; the others' caches are freed.
    pub fn filter(&mut self, batch_id: u64, keep: &[u64]) -> Result<CachedBatch, EngineError> {
        let seqs = self
            .batches
            .remove(&batch_id)
            .ok_or(EngineError::UnknownBatch(batch_id))?;
        let keep: HashSet<u64> = keep.iter().copied().collect();
        let (kept, dropped): (Vec<_>, Vec<_>) =
            seqs.into_iter().partition(|s| keep.contains(&s.id));
        self.release(&dropped);
        let cached = cached_batch(batch_id, &kept);
        if !kept.is_empty() {
            self.batches.insert(batch_id, kept);
        }
        Ok(cached)
    }

    /// Frees one batch, or all of them.
    pub fn clear(&mut self, batch_id: Option<u64>) {
        match batch_id {
            Some(id) => {
                if let Some(seqs) = self.batches.remove(&id) {
                    self.release(&seqs);
                }
            }
            None => {
                self.batches.clear();
                self.reserved = 0;
            }
        }
    }

    /// Runs a prefill as large as the router will send, and one decode step, so the first
    /// real request finds its buffers and kernels ready; frees everything afterwards.
    /// Prompts are at most `max_input_tokens` long and `max_prefill_tokens` in all; returns
    /// the KV budget.
    pub fn warmup(
        &mut self,
        max_input_tokens: usize,
        max_prefill_tokens: usize,
    ) -> Result<usize, EngineError> {
        const NEW_TOKENS: usize = 2;
        let budget = self.cfg.max_batch_total_tokens;
        let input = max_input_tokens
            .min(self.facts.max_context.saturating_sub(NEW_TOKENS))
            .max(1);
        let mut left = max_prefill_tokens.min(budget).max(1);
        let mut requests = Vec::new();
        while left > 0 && (requests.len() + 1) * (input.min(left) + NEW_TOKENS) <= budget {
            let len = input.min(left);
            let id = u64::MAX - requests.len() as u64;
            requests.push(Request {
                id,
                input_ids: (0..len)
                    .map(|i| (i % self.facts.vocab_size) as u32)
                    .collect(),
                stopping: StopOptions {
                    max_new_tokens: NEW_TOKENS as u32,
                    ignore_eos_token: true,
                    ..Default::default()
                },
                ..Default::default()
            });
            left -= len;
        }
        // Warmup's prompts share their first tokens: with the cache on they would neither
        // run the whole prefill nor leave the cache clean.
        let prefix_cache = self.prefix.set_enabled(false);
        let result = self.warmup_steps(requests);
        self.prefix.set_enabled(prefix_cache);
        result?;
        Ok(budget)
    }

    fn warmup_steps(&mut self, requests: Vec<Request>) -> Result<(), EngineError> {
        let batch_id = u64::MAX;
        self.prefill(Batch {
            id: batch_id,
            requests,
        })?;
        if self.batches.contains_key(&batch_id) {
            self.decode(&[batch_id])?;
        }
        self.clear(Some(batch_id));
        Ok(())
    }

    /// Validates a new batch against the model and the budget; allocates nothing.
    fn admit(&self, batch: &Batch) -> Result<Vec<ValidRequest>, EngineError> {
        if self.batches.contains_key(&batch.id) {
            return Err(EngineError::InvalidRequest(format!(
                "batch {} is already cached; batch ids must be new",
                batch.id
            )));
        }
        if batch.requests.is_empty() {
            return Err(EngineError::InvalidRequest(format!(
                "batch {} has no requests",
                batch.id
            )));
        }
        let mut held: HashSet<u64> = self.batches.values().flatten().map(|s| s.id).collect();
        let mut valid = Vec::with_capacity(batch.requests.len());
        for req in &batch.requests {
            if !held.insert(req.id) {
                return Err(EngineError::InvalidRequest(format!(
                    "request id {} is already running on this shard",
                    req.id
                )));
            }
            valid.push(ValidRequest::validate(req.clone(), &self.facts)?);
        }
        let needed: usize = valid.iter().map(ValidRequest::reservation).sum();
        let budget = self.cfg.max_batch_total_tokens;
        let available = budget.saturating_sub(self.reserved);
        if needed > available {
            return Err(EngineError::OutOfBudget {
                needed,
                available,
                budget,
            });
        }
        Ok(valid)
    }

    /// Runs `forward` on `seqs`, timed; keeps the unfinished sequences under `batch_id`,
    /// or on error drops them all, since a failed step leaves their caches half written.
    fn run_step(
        &mut self,
        batch_id: u64,
        mut seqs: Vec<Sequence>,
        forward: impl FnOnce(&mut Self, &mut [Sequence]) -> Result<Vec<Generation>, EngineError>,
    ) -> Result<StepOutput, EngineError> {
        let started = Instant::now();
        let result = forward(self, &mut seqs);
        let forward_ns = started.elapsed().as_nanos() as u64;
        let generations = match result {
            Ok(g) => g,
            Err(e) => {
                self.release(&seqs);
                return Err(e);
            }
        };
        let finished: HashSet<u64> = generations
            .iter()
            .filter(|g| g.finish_reason.is_some())
            .map(|g| g.request_id)
            .collect();
        let (running, done): (Vec<_>, Vec<_>) =
            seqs.into_iter().partition(|s| !finished.contains(&s.id));
        self.release(&done);
        let batch = if running.is_empty() {
            None
        } else {
            let cached = cached_batch(batch_id, &running);
            self.batches.insert(batch_id, running);
            Some(cached)
        };
        Ok(StepOutput {
            generations,
            batch,
            forward_ns,
            prefix: self.prefix.stats(),
            speculation: self.speculated,
        })
    }

    fn release(&mut self, seqs: &[Sequence]) {
        let freed: usize = seqs.iter().map(Sequence::reservation).sum();
        self.reserved = self.reserved.saturating_sub(freed);
    }
}

fn cached_batch(id: u64, seqs: &[Sequence]) -> CachedBatch {
    CachedBatch {
        id,
        request_ids: seqs.iter().map(|s| s.id).collect(),
        reserved_tokens: seqs.iter().map(Sequence::reservation).sum(),
    }
}
