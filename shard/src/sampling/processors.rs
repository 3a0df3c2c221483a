//! The logits processors: penalties, temperature, top-k, top-p, typical-p.

use std::collections::HashMap;

use super::order::{fill_keys, key_desc, key_id, sort_key, walk_sorted};
use super::params::SamplingParams;
use super::softmax::log_softmax_in_place;
use super::Scratch;

/// How often each token occurs in a sequence's history (prompt + generated tokens): the
/// input of both penalties.
///
/// A map rather than a vocabulary-sized array: a sequence holds a few thousand distinct
/// tokens at most, and the penalties then touch only those.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenCounts {
    counts: HashMap<u32, u32>,
}

impl TokenCounts {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn from_ids(ids: &[u32]) -> Self {
        let mut counts = Self::new();
        for &id in ids {
            counts.push(id);
        }
        counts
    }

    pub fn push(&mut self, id: u32) {
        *self.counts.entry(id).or_insert(0) += 1;
    }

    pub fn count(&self, id: u32) -> u32 {
        self.counts.get(&id).copied().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Distinct tokens with their counts, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.counts.iter().map(|(&id, &n)| (id, n))
    }
}

/// Processed logprobs of one row: `None` when no processor is active, meaning the processed
/// distribution is the raw one, which the caller already has or can compute without a copy.
///
/// For scoring prompt positions in processed mode: the row at position i predicts token
/// i + 1, so `history` must hold the prompt up to and including token i.
pub fn processed_logprobs<'s>(
    params: &SamplingParams,
    history: &TokenCounts,
    raw_logits: &[f32],
    scratch: &'s mut Scratch,
) -> Option<&'s [f32]> {
    if !params.has_processors() {
        return None;
    }
    process_logits_into(params, history, raw_logits, scratch);
    let values = &mut scratch.values;
    log_softmax_in_place(values);
    Some(values)
}

/// Replaces `scratch.values` with the processed logits of one row (not yet normalised):
/// every processor of `params` applied to a copy of `raw_logits`, in the contract's order.
/// Tokens outside the support end up -inf.
///
/// Greedy choice is made on these, before the log-softmax, because rounding in the
/// log-softmax could turn two nearly equal logits into a tie.
pub(crate) fn process_logits_into(
    params: &SamplingParams,
    history: &TokenCounts,
    raw_logits: &[f32],
    scratch: &mut Scratch,
) {
    let Scratch {
        values: out, keys, ..
    } = scratch;
    out.clear();
    out.extend_from_slice(raw_logits);
    if params.repetition_penalty != 1.0 {
        repetition_penalty(out, history, params.repetition_penalty);
    }
    if params.frequency_penalty != 0.0 {
        frequency_penalty(out, history, params.frequency_penalty);
    }
    if params.temperature != 1.0 {
        temperature(out, params.temperature);
    }
    if params.top_k != 0 {
        top_k(out, params.top_k, keys);
    }
    if params.top_p < 1.0 {
        top_p(out, params.top_p, keys);
    }
    if params.typical_p < 1.0 {
        typical_p(out, params.typical_p, keys);
    }
}

/// HF/TGI semantics: once per distinct history token, however often it occurred. Ids
/// outside the row are ignored rather than trusted.
pub(crate) fn repetition_penalty(logits: &mut [f32], history: &TokenCounts, penalty: f32) {
    for (id, _) in history.iter() {
        if let Some(x) = logits.get_mut(id as usize) {
            *x = if *x > 0.0 { *x / penalty } else { *x * penalty };
        }
    }
}

/// Proportional to the raw count over prompt + generated tokens (the proto's contract).
pub(crate) fn frequency_penalty(logits: &mut [f32], history: &TokenCounts, penalty: f32) {
    for (id, n) in history.iter() {
        if let Some(x) = logits.get_mut(id as usize) {
            *x -= penalty * n as f32;
        }
    }
}

/// Divides by the temperature after shifting the maximum to 0.
///
/// The shift leaves the distribution unchanged (softmax ignores a constant) but keeps a
/// small temperature from overflowing a large logit to +inf, which would turn the row
/// into NaN.
pub(crate) fn temperature(logits: &mut [f32], t: f32) {
    let max = finite_max(logits);
    if max == f32::NEG_INFINITY {
        return;
    }
    for x in logits.iter_mut() {
        *x = (*x - max) / t;
    }
}

/// Keeps the `k` best tokens by the shared order, so a tie across the k-th place keeps the
/// smaller ids and exactly k tokens survive.
pub(crate) fn top_k(logits: &mut [f32], k: u32, keys: &mut Vec<u64>) {
    let k = k as usize;
    if k == 0 || k >= logits.len() {
        return;
    }
    fill_keys(keys, logits);
    keys.select_nth_unstable_by(k - 1, key_desc);
    for &key in &keys[k..] {
        logits[key_id(key) as usize] = f32::NEG_INFINITY;
    }
}

/// Nucleus: walks tokens from the most likely (ties to the smaller id) and keeps them until
/// the kept probability reaches `p`; the first token is always kept. Probabilities are in
/// f64 so the boundary does not move with f32 rounding of 49k small terms.
///
/// Only tokens that can be in the nucleus are sorted. Those with weight below
/// `(1 - p) * total / (2V)` hold less than half the excluded mass `(1 - p) * total`
/// between them, so the walk reaches `p` before any of them, by a margin far above f64
/// rounding; they are dropped in the first pass. On a peaked distribution that leaves a
/// handful of candidates out of 49k.
pub(crate) fn top_p(logits: &mut [f32], p: f32, keys: &mut Vec<u64>) {
    if p >= 1.0 || p.is_nan() {
        return;
    }
    let max = finite_max(logits);
    if max == f32::NEG_INFINITY {
        return;
    }
    let weight = |x: f32| nonneg(f64::from(x - max).exp());
    let total: f64 = logits.iter().map(|&x| weight(x)).sum();
    let target = f64::from(p) * total;
    let ln_floor = ((1.0 - f64::from(p)) * total / (2.0 * logits.len() as f64)).ln();
    keys.clear();
    for (id, x) in logits.iter_mut().enumerate() {
        // NaN fails the comparison and is dropped too.
        if f64::from(*x - max) >= ln_floor {
            keys.push(sort_key(id as u32, *x));
        } else {
            *x = f32::NEG_INFINITY;
        }
    }
    let mut cum = 0.0;
    let kept = walk_sorted(keys, key_desc, |key| {
        if cum >= target && cum > 0.0 {
            return false;
        }
        cum += weight(logits[key_id(key) as usize]);
        true
    });
    for &key in &keys[kept..] {
        logits[key_id(key) as usize] = f32::NEG_INFINITY;
    }
}

/// HF `TypicalLogitsWarper`: ranks tokens by how far their surprise `-log p` is from the
/// entropy, closest first (ties to the smaller id), finds the first place where the
/// cumulative probability reaches `mass`, and keeps every token whose distance is at most
/// that place's distance (so tokens tying with the boundary are kept too, as in HF).
///
/// Probabilities and the entropy are computed in f64; distances are then rounded to f32,
/// the precision HF compares them in, so that they pack with the id into one integer sort
/// key.
pub(crate) fn typical_p(logits: &mut [f32], mass: f32, keys: &mut Vec<u64>) {
    if mass >= 1.0 || mass.is_nan() {
        return;
    }
    let max = finite_max(logits);
    if max == f32::NEG_INFINITY {
        return;
    }
    let total: f64 = logits
        .iter()
        .map(|&x| nonneg(f64::from(x - max).exp()))
        .sum();
    let ln_total = total.ln();
    let logp = |x: f32| f64::from(x - max) - ln_total;
    // Tokens with probability 0 add nothing (HF's nansum over 0 * -inf).
    let entropy: f64 = -logits
        .iter()
        .map(|&x| {
            let lp = logp(x);
            let p = nonneg(lp.exp());
            if p > 0.0 {
                p * lp
            } else {
                0.0
            }
        })
        .sum::<f64>();
    // Ascending key order = distance ascending, then id ascending. A distance is >= 0, so
    // its f32 bits grow with it; -inf logits give +inf and NaN logits join them, last.
    keys.clear();
    keys.extend(logits.iter().enumerate().map(|(id, &x)| {
        let d = (logp(x) + entropy).abs() as f32;
        let d = if d.is_nan() { f32::INFINITY } else { d };
        (u64::from(d.to_bits()) << 32) | id as u64
    }));
    let target = f64::from(mass);
    let mut cum = 0.0;
    let mut boundary: Option<u64> = None;
    let kept = walk_sorted(keys, u64::cmp, |key| {
        let d = key >> 32;
        if let Some(b) = boundary {
            if d > b {
                return false;
            }
        }
        cum += nonneg(logp(logits[key as u32 as usize]).exp());
        if boundary.is_none() && cum >= target {
            boundary = Some(d);
        }
        true
    });
    for &key in &keys[kept..] {
        logits[key as u32 as usize] = f32::NEG_INFINITY;
    }
}

/// The greatest non-NaN value, -inf for a row without one.
fn finite_max(values: &[f32]) -> f32 {
    values.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// A probability weight with NaN (from a NaN logit) read as 0.
fn nonneg(w: f64) -> f64 {
    if w.is_nan() {
        0.0
    } else {
        w
    }
}

#[cfg(test)]
mod tests;
