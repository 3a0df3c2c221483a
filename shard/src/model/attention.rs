//! Causal attention of a ragged batch on the CPU, straight over host memory, with an
//! optional sliding window and score softcap per layer.
//!
//! Running attention as candle ops costs a dozen small ops per sequence and layer, whose
//! dispatch dwarfs the arithmetic when a decode step has one token per sequence. Here one
//! call handles every sequence of the step. Each query row of each head is computed by one
//! thread with a fixed order of operations (`kernels.rs`, and the same bits on AVX,
//! `x86.rs`), so a sequence's result never depends on the others, on how its rows are
//! split into tasks, or on scheduling.

use std::ops::Range;
use std::sync::OnceLock;

use candle_core::Result;

use crate::team::Team;

use super::decoder::SeqSpan;
use super::kv_cache::SeqCache;

mod kernels;
#[cfg(target_arch = "x86_64")]
mod x86;

pub(super) use kernels::dot;
use kernels::softmax_numerators;

/// Below this many multiply-adds per step, threads cost more than they save.
const PARALLEL_MIN_MACS: usize = 1 << 16;
/// Query rows per task at most: a long prompt's head splits into several tasks, so the
/// threads stay busy to the end (a single prompt has as few tasks as heads otherwise, 9
/// for 2 threads on SmolLM2).
const TASK_ROWS: usize = 32;
/// Tasks per thread that keep the threads evenly busy when tasks differ in size.
const TASKS_PER_THREAD: usize = 4;

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

    // Read phase: on the compute team, each task some rows of one sequence for some heads.
    let tasks = tasks(spans, params.shape);
    let outs: Vec<OnceLock<Vec<f32>>> = tasks.iter().map(|_| OnceLock::new()).collect();
    let run = |i: usize| {
        let Task { seq, heads, rows } = tasks[i].clone();
        let span = spans[seq];
        let (k, v, past, capacity) = layers[seq];
        let mut out = vec![0f32; heads.len() * rows.len() * d];
        for (head, out) in heads.zip(out.chunks_exact_mut(rows.len() * d)) {
            let g = head / n_rep;
            let kv = HeadKv {
                keys: &k[g * capacity * d..],
                values: &v[g * capacity * d..],
                past,
            };
            let rows = HeadRows {
                index: rows.clone(),
                out,
            };
            head_attention(
                &params,
                |t| &qkv.q[((span.start + t) * num_heads + head) * d..][..d],
                kv,
                rows,
            );
        }
        // Each task's cell is set once, by the task alone.
        let _ = outs[i].set(out);
    };
    let work: usize = spans
        .iter()
        .zip(&layers)
        .map(|(s, l)| s.len * (l.2 + s.len))
        .sum::<usize>()
        * d
        * num_heads;
    if work >= PARALLEL_MIN_MACS && tasks.len() > 1 {
        Team::global().run(tasks.len(), &run);
    } else {
        (0..tasks.len()).for_each(run);
    }

    let mut out = vec![0f32; tokens * num_heads * d];
    for (task, o) in tasks.iter().zip(&outs) {
        let Some(o) = o.get() else {
            candle_core::bail!("attention: a task left no output");
        };
        let start = spans[task.seq].start;
        let mut rows = o.chunks_exact(d);
        for head in task.heads.clone() {
            for (t, row) in task.rows.clone().zip(&mut rows) {
                let dst = ((start + t) * num_heads + head) * d;
                out[dst..dst + d].copy_from_slice(row);
            }
        }
    }
    Ok(out)
}

/// One task of a layer's attention: some of one sequence's new rows (indices into its
/// span), for some of its query heads, all of one KV head.
#[derive(Clone)]
struct Task {
    seq: usize,
    heads: Range<usize>,
    rows: Range<usize>,
}

/// The read phase's tasks. A task takes every query head of a KV head, so one thread
/// reads those keys and values from memory and the heads after the first find them in its
/// cache (at 16 decode streams attention is bound by reading the cache: split head by
/// head across threads, both read it). With too few such tasks to keep the threads busy
/// (a few decode rows), a task takes one query head instead. Rows split into runs of
/// `TASK_ROWS`. None of this changes a result: each row of each head is computed alone.
fn tasks(spans: &[SeqSpan], shape: HeadShape) -> Vec<Task> {
    let n_rep = shape.num_heads / shape.num_kv_heads;
    let runs: usize = spans.iter().map(|s| s.len.div_ceil(TASK_ROWS)).sum();
    let per_task = if runs * shape.num_kv_heads >= TASKS_PER_THREAD * Team::global().threads() {
        n_rep
    } else {
        1
    };
    let mut tasks = Vec::new();
    for (seq, span) in spans.iter().enumerate() {
        for first in (0..shape.num_heads).step_by(per_task) {
            for row in (0..span.len).step_by(TASK_ROWS) {
                tasks.push(Task {
                    seq,
                    heads: first..first + per_task,
                    rows: row..(row + TASK_ROWS).min(span.len),
                });
            }
        }
    }
    tasks
}

/// One KV head of one sequence's cache: `past` positions before the step's, then the
/// step's, `head_dim` values each.
#[derive(Clone, Copy)]
struct HeadKv<'a> {
    keys: &'a [f32],
    values: &'a [f32],
    past: usize,
}

/// Some of a sequence's new rows for one head: their indices in its span, and where their
/// outputs go (`head_dim` values each).
struct HeadRows<'o> {
    index: Range<usize>,
    out: &'o mut [f32],
}

/// One head of one sequence: for each new row t of `rows` (position p = past + t),
/// softmax over the scaled (and capped) scores of the keys it sees, then the weighted sum
/// of their values: `Σ e^(s_j - max) v_j`, divided by `Σ e^(s_j - max)` once at the end.
fn head_attention<'q>(
    params: &AttnParams,
    query: impl Fn(usize) -> &'q [f32],
    kv: HeadKv,
    rows: HeadRows,
) {
    let HeadKv { keys, values, past } = kv;
    let HeadRows { index: rows, out } = rows;
    let d = params.shape.head_dim;
    let mut scores = Vec::with_capacity(past + rows.end);
    #[cfg(target_arch = "x86_64")]
    let avx = x86::available();
    for (row, t) in out.chunks_exact_mut(d).zip(rows) {
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
        let sum = softmax_numerators(&mut scores);
        let seen = &values[first * d..end * d];
        #[cfg(target_arch = "x86_64")]
        if avx {
            // SAFETY: `avx` says the CPU has the feature `weighted_sum` enables.
            unsafe { x86::weighted_sum(row, &scores, seen) };
        } else {
            kernels::weighted_sum(row, &scores, seen);
        }
        #[cfg(not(target_arch = "x86_64"))]
        kernels::weighted_sum(row, &scores, seen);
        for o in row.iter_mut() {
            *o /= sum;
        }
    }
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

#[cfg(test)]
mod tests {
    use super::kernels::{dot, weighted_sum};

    /// Values that round (not integers).
    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * seed) % 1013) as f32 / 1009.0 - 0.5)
            .collect()
    }

    /// The AVX scoring of 8 keys is the portable `dot` of each, bit for bit (on a CPU
    /// without AVX it never runs).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn keys_side_by_side_score_as_alone() {
        if !super::x86::available() {
            return; // the portable `dot` is all such a CPU runs
        }
        // A length with a tail, too.
        for d in [64, 67, 256] {
            let a = values(d, 7919);
            let keys = values(8 * d, 104_729);
            // SAFETY: AVX is available (checked above).
            let together = unsafe { super::x86::dots8(&a, &keys) };
            for (n, got) in together.iter().enumerate() {
                let alone = dot(&a, &keys[n * d..(n + 1) * d]);
                assert_eq!(got.to_bits(), alone.to_bits(), "d={d} key {n}");
            }
        }
    }

    /// The AVX weighted sum is the portable one, bit for bit.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx_weighted_sum_is_the_portable_one() {
        if !super::x86::available() {
            return; // the portable loop is all such a CPU runs
        }
        // Full 64-column blocks, single registers and a scalar tail.
        for (d, keys) in [(64, 1), (256, 37), (67, 9), (5, 3), (136, 8)] {
            let weights = values(keys, 7919);
            let vals = values(keys * d, 104_729);
            let mut portable = vec![0f32; d];
            weighted_sum(&mut portable, &weights, &vals);
            let mut avx = vec![f32::NAN; d];
            // SAFETY: AVX is available (checked above).
            unsafe { super::x86::weighted_sum(&mut avx, &weights, &vals) };
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&avx), bits(&portable), "d={d} keys={keys}");
        }
    }
}
