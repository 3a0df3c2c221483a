//! The logits processors: penalties, temperature, top-k, top-p, typical-p.

use std::collections::HashMap;

use super::order::{fill_ids, ids_best_first, walk_sorted};
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
    let Scratch { values, ids } = scratch;
    process_logits_into(params, history, raw_logits, values, ids);
    log_softmax_in_place(values);
    Some(values)
}

/// Replaces `out` with the processed logits of one row (not yet normalised): every
/// processor of `params` applied to a copy of `raw_logits`, in the contract's order.
/// Tokens outside the support end up -inf. `ids` is scratch space.
///
/// Greedy choice is made on these, before the log-softmax, because rounding in the
/// log-softmax could turn two nearly equal logits into a tie.
pub fn process_logits_into(
    params: &SamplingParams,
    history: &TokenCounts,
    raw_logits: &[f32],
    out: &mut Vec<f32>,
    ids: &mut Vec<u32>,
) {
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
        top_k(out, params.top_k, ids);
    }
    if params.top_p < 1.0 {
        top_p(out, params.top_p, ids);
    }
    if params.typical_p < 1.0 {
        typical_p(out, params.typical_p, ids);
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
pub(crate) fn top_k(logits: &mut [f32], k: u32, ids: &mut Vec<u32>) {
    let k = k as usize;
    if k == 0 || k >= logits.len() {
        return;
    }
    fill_ids(ids, logits.len());
    ids.select_nth_unstable_by(k - 1, |a, b| ids_best_first(logits, *a, *b));
    for &id in &ids[k..] {
        logits[id as usize] = f32::NEG_INFINITY;
    }
}

/// Nucleus: walks tokens from the most likely (ties to the smaller id) and keeps them until
/// the kept probability reaches `p`; the first token is always kept. Probabilities are in
/// f64 so the boundary does not move with f32 rounding of 49k small terms.
pub(crate) fn top_p(logits: &mut [f32], p: f32, ids: &mut Vec<u32>) {
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
    fill_ids(ids, logits.len());
    let mut cum = 0.0;
    let kept = walk_sorted(
        ids,
        |a, b| ids_best_first(logits, *a, *b),
        |id| {
            if cum >= target && cum > 0.0 {
                return false;
            }
            cum += weight(logits[id as usize]);
            true
        },
    );
    for &id in &ids[kept..] {
        logits[id as usize] = f32::NEG_INFINITY;
    }
}

/// HF `TypicalLogitsWarper`: ranks tokens by how far their surprise `-log p` is from the
/// entropy, closest first (ties to the smaller id), finds the first place where the
/// cumulative probability reaches `mass`, and keeps every token whose distance is at most
/// that place's distance (so tokens tying with the boundary are kept too, as in HF).
pub(crate) fn typical_p(logits: &mut [f32], mass: f32, ids: &mut Vec<u32>) {
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
    let distance = |id: u32| {
        let d = (logp(logits[id as usize]) + entropy).abs();
        // -inf logits give +inf; NaN logits sort with them, last.
        if d.is_nan() {
            f64::INFINITY
        } else {
            d
        }
    };
    let target = f64::from(mass);
    fill_ids(ids, logits.len());
    let mut cum = 0.0;
    let mut boundary: Option<f64> = None;
    let kept = walk_sorted(
        ids,
        |a, b| distance(*a).total_cmp(&distance(*b)).then(a.cmp(b)),
        |id| {
            let d = distance(id);
            if let Some(b) = boundary {
                if d > b {
                    return false;
                }
            }
            cum += nonneg(logp(logits[id as usize]).exp());
            if boundary.is_none() && cum >= target {
                boundary = Some(d);
            }
            true
        },
    );
    for &id in &ids[kept..] {
        logits[id as usize] = f32::NEG_INFINITY;
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
