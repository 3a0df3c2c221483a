//! Causal attention of a ragged batch on the CPU, straight over host memory, with an
//! optional sliding window and score softcap per layer.
//!
//! Running attention as candle ops costs a dozen small ops per sequence and layer, whose
//! dispatch dwarfs the arithmetic when a decode step has one token per sequence. Here one
//! call handles every sequence of the step. Each (sequence, head) is computed by one
//! thread with a fixed order of operations, so a sequence's result never depends on the
//! others or on scheduling.

use candle_core::Result;
use rayon::prelude::*;

use super::decoder::SeqSpan;
use super::kv_cache::SeqCache;

#[cfg(target_arch = "x86_64")]
mod x86;

/// Below this many multiply-adds per step, threads cost more than they save.
const PARALLEL_MIN_MACS: usize = 1 << 16;
/// Accumulator lanes of a dot product: element i goes to lane i % LANES.
const LANES: usize = 8;

#[derive(Debug, Clone, Copy)]
pub struct HeadShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

/// What one layer's attention computes beyond the shapes.
#[derive(Debug, Clone, Copy)]
pub struct AttnParams {
    pub shape: HeadShape,
    /// Scores are `q·k * scale`.
    pub scale: f32,
    /// Scores become `cap * tanh(score / cap)`.
    pub softcap: Option<f32>,
    /// A query at position p sees keys p - window < j <= p.
    pub window: Option<usize>,
}

/// The step's rows, packed: `q` is `[tokens, num_heads, head_dim]`, `k` and `v` are
/// `[tokens, num_kv_heads, head_dim]` (rotary already applied to q and k).
pub struct StepQkv<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
}

/// One layer of a step, as both attention kernels see it: the sequences' rows
/// (`spans[i]` of the packed rows is sequence `i`'s), their caches (`caches[i]` is
/// sequence `i`'s) and the layer's index in them.
pub struct AttnStep<'s, 'c> {
    pub spans: &'s [SeqSpan],
    pub caches: &'s mut [&'c mut SeqCache],
    pub layer: usize,
}

/// Appends the step's keys and values to each sequence's cache of the layer (the model
/// checked that they fit), then returns the attention output
/// `[tokens, num_heads * head_dim]`.
pub fn host_attention(params: AttnParams, qkv: &StepQkv, step: AttnStep) -> Result<Vec<f32>> {
    let AttnStep {
        spans,
        caches,
        layer,
    } = step;
    let HeadShape {
        num_heads,
        num_kv_heads,
        head_dim: d,
    } = params.shape;
    let n_rep = num_heads / num_kv_heads;
    let tokens = spans.iter().map(|s| s.start + s.len).max().unwrap_or(0);
    if qkv.q.len() != tokens * num_heads * d || qkv.k.len() != tokens * num_kv_heads * d {
        candle_core::bail!("attention: q/k/v do not match the step's {tokens} tokens");
    }

    // Write phase: the new keys and values after each sequence's past.
    let mut layers = Vec::with_capacity(spans.len());
    for (span, cache) in spans.iter().zip(caches.iter_mut()) {
        let Some(store) = cache.host_layer(layer) else {
            candle_core::bail!("attention: layer {layer} of the cache is not in host memory");
        };
        for t in 0..span.len {
            for g in 0..num_kv_heads {
                let src = ((span.start + t) * num_kv_heads + g) * d;
                let dst = (g * store.capacity + store.past + t) * d;
                store.k[dst..dst + d].copy_from_slice(&qkv.k[src..src + d]);
                store.v[dst..dst + d].copy_from_slice(&qkv.v[src..src + d]);
            }
        }
        layers.push((&*store.k, &*store.v, store.past, store.capacity));
    }

    // Read phase: one task per (sequence, head).
    let tasks: Vec<(usize, usize)> = (0..spans.len())
        .flat_map(|s| (0..num_heads).map(move |h| (s, h)))
        .collect();
    let run = |&(s, h): &(usize, usize)| {
        let span = spans[s];
        let (k, v, past, capacity) = layers[s];
        let g = h / n_rep;
        let kv = HeadKv {
            keys: &k[g * capacity * d..],
            values: &v[g * capacity * d..],
            past,
        };
        head_attention(
            &params,
            span,
            |t| &qkv.q[((span.start + t) * num_heads + h) * d..][..d],
            kv,
        )
    };
    let work: usize = spans
        .iter()
        .zip(&layers)
        .map(|(s, l)| s.len * (l.2 + s.len))
        .sum::<usize>()
        * d
        * num_heads;
    let outs: Vec<Vec<f32>> = if work >= PARALLEL_MIN_MACS && tasks.len() > 1 {
        tasks.par_iter().map(run).collect()
    } else {
        tasks.iter().map(run).collect()
    };

    let mut out = vec![0f32; tokens * num_heads * d];
    for (&(s, h), o) in tasks.iter().zip(&outs) {
        let span = spans[s];
        for t in 0..span.len {
            let dst = ((span.start + t) * num_heads + h) * d;
            out[dst..dst + d].copy_from_slice(&o[t * d..(t + 1) * d]);
        }
    }
    Ok(out)
}

/// One KV head of one sequence's cache: `past` positions before the step's, then the
/// step's, `head_dim` values each.
#[derive(Clone, Copy)]
struct HeadKv<'a> {
    keys: &'a [f32],
    values: &'a [f32],
    past: usize,
}

/// One head of one sequence: for each new row t (position p = past + t), softmax over
/// the scaled (and capped) scores of the keys it sees, then the weighted sum of their
/// values.
fn head_attention<'q>(
    params: &AttnParams,
    span: SeqSpan,
    query: impl Fn(usize) -> &'q [f32],
    kv: HeadKv,
) -> Vec<f32> {
    let HeadKv { keys, values, past } = kv;
    let d = params.shape.head_dim;
    let mut out = vec![0f32; span.len * d];
    let mut scores = Vec::with_capacity(past + span.len);
    #[cfg(target_arch = "x86_64")]
    let avx = x86::available();
    for t in 0..span.len {
        let q = query(t);
        let end = past + t + 1;
        let first = params.window.map_or(0, |w| end.saturating_sub(w));
        scores.clear();
        let mut j = first;
        #[cfg(target_arch = "x86_64")]
        if avx {
            while j + x86::KEYS <= end {
                // SAFETY: `avx` says the CPU has the feature `dots8` enables.
                let block = unsafe { x86::dots8(q, &keys[j * d..(j + x86::KEYS) * d]) };
                scores.extend(block.map(|s| score(params, s)));
                j += x86::KEYS;
            }
        }
        scores.extend((j..end).map(|j| score(params, dot(q, &keys[j * d..(j + 1) * d]))));
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        let row = &mut out[t * d..(t + 1) * d];
        for (j, &w) in (first..end).zip(scores.iter()) {
            let p = w / sum;
            for (o, &x) in row.iter_mut().zip(&values[j * d..(j + 1) * d]) {
                *o += p * x;
            }
        }
    }
    out
}

/// A dot product `s` as a score: `s * scale`, then capped.
#[inline]
fn score(params: &AttnParams, s: f32) -> f32 {
    let s = s * params.scale;
    match params.softcap {
        Some(cap) => cap * (s / cap).tanh(),
        None => s,
    }
}

/// `a · b` with LANES partial sums folded in a fixed order: the same bits every call (and
/// as `x86::dots8` computes them).
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (ac, ar) = a.as_chunks::<LANES>();
    let (bc, br) = b.as_chunks::<LANES>();
    for (x, y) in ac.iter().zip(bc) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ar.iter().zip(br) {
        tail += x * y;
    }
    fold(acc, tail)
}

/// A dot product's lanes and tail, summed in a fixed order.
#[inline]
fn fold(lanes: [f32; LANES], tail: f32) -> f32 {
    let [a0, a1, a2, a3, a4, a5, a6, a7] = lanes;
    ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7)) + tail
}

#[cfg(test)]
mod tests {
    use super::dot;

    #[test]
    fn dot_is_exact_on_integers_and_handles_tails() {
        let a: Vec<f32> = (0..67).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..67).map(|i| (i % 5) as f32).collect();
        let want: f32 = (0..67).map(|i| (i * (i % 5)) as f32).sum();
        assert_eq!(dot(&a, &b), want);
    }

    /// The AVX scoring of 8 keys is the portable `dot` of each, bit for bit (on a CPU
    /// without AVX it never runs).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn keys_side_by_side_score_as_alone() {
        if !super::x86::available() {
            return; // the portable `dot` is all such a CPU runs
        }
        // Values that round (not integers), and a length with a tail.
        for d in [64, 67, 256] {
            let a: Vec<f32> = (0..d)
                .map(|i| ((i * 7919) % 1000) as f32 / 997.0 - 0.5)
                .collect();
            let keys: Vec<f32> = (0..8 * d)
                .map(|i| ((i * 104_729) % 1013) as f32 / 1009.0 - 0.5)
                .collect();
            // SAFETY: AVX is available (checked above).
            let together = unsafe { super::x86::dots8(&a, &keys) };
            for (n, got) in together.iter().enumerate() {
                let alone = dot(&a, &keys[n * d..(n + 1) * d]);
                assert_eq!(got.to_bits(), alone.to_bits(), "d={d} key {n}");
            }
        }
    }
}
