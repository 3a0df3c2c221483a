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

#[cfg(target_arch = "x86_64")]
mod avx512;
mod group;
mod kernels;
#[cfg(target_arch = "x86_64")]
mod x86;

use group::{group_attention, GroupRows, HeadKv};
pub(super) use kernels::dot;

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
/// (`spans[i]` of the packed rows is sequence `i`'s), the rows that query
/// (`queries[i]` of the packed queries and outputs: the last `queries[i].len` rows of
/// `spans[i]`, all of them but in a last layer that returns fewer), their caches
/// (`caches[i]` is sequence `i`'s) and the layer's index in them.
pub struct AttnStep<'s, 'c> {
    pub spans: &'s [SeqSpan],
    pub queries: &'s [SeqSpan],
    pub caches: &'s mut [&'c mut SeqCache],
    pub layer: usize,
}

impl AttnStep<'_, '_> {
    /// Checks that each sequence's queries are some of its rows; returns the packed
    /// query rows.
    pub(super) fn query_rows(&self) -> Result<usize> {
        let fits = self.queries.len() == self.spans.len()
            && self
                .queries
                .iter()
                .zip(self.spans)
                .all(|(q, s)| q.len <= s.len);
        if !fits {
            candle_core::bail!("attention: the queries are not rows of the step's sequences");
        }
        Ok(self
            .queries
            .iter()
            .map(|q| q.start + q.len)
            .max()
            .unwrap_or(0))
    }
}

/// Appends the step's keys and values to each sequence's cache of the layer (the model
/// checked that they fit), then returns the attention output of the query rows
/// `[queries, num_heads * head_dim]`.
pub fn host_attention(params: AttnParams, qkv: &StepQkv, step: AttnStep) -> Result<Vec<f32>> {
    let queries = step.query_rows()?;
    let AttnStep {
        spans,
        queries: query_spans,
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
    if qkv.q.len() != queries * num_heads * d || qkv.k.len() != tokens * num_kv_heads * d {
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
    let tasks = tasks(spans, query_spans, params.shape);
    let outs: Vec<OnceLock<Vec<f32>>> = tasks.iter().map(|_| OnceLock::new()).collect();
    // Row t of sequence i's span (one of its last `query_spans[i].len`) is this row of
    // the packed queries and outputs.
    let query_row =
        |i: usize, t: usize| query_spans[i].start + t - (spans[i].len - query_spans[i].len);
    let run = |i: usize| {
        let Task { seq, heads, rows } = tasks[i].clone();
        let (k, v, past, capacity) = layers[seq];
        let mut out = vec![0f32; heads.len() * rows.len() * d];
        // Every head of a task shares one KV head (see `tasks`).
        let g = heads.start / n_rep;
        let kv = HeadKv {
            keys: &k[g * capacity * d..],
            values: &v[g * capacity * d..],
            past,
        };
        let rows = GroupRows {
            heads,
            index: rows,
            out: &mut out,
        };
        group_attention(
            &params,
            |head, t| &qkv.q[(query_row(seq, t) * num_heads + head) * d..][..d],
            kv,
            rows,
        );
        // Each task's cell is set once, by the task alone.
        let _ = outs[i].set(out);
    };
    let work: usize = spans
        .iter()
        .zip(query_spans)
        .zip(&layers)
        .map(|((s, q), l)| q.len * (l.2 + s.len))
        .sum::<usize>()
        * d
        * num_heads;
    if work >= PARALLEL_MIN_MACS && tasks.len() > 1 {
        Team::global().run(tasks.len(), &run);
    } else {
        (0..tasks.len()).for_each(run);
    }

    let mut out = vec![0f32; queries * num_heads * d];
    for (task, o) in tasks.iter().zip(&outs) {
        let Some(o) = o.get() else {
            candle_core::bail!("attention: a task left no output");
        };
        let mut rows = o.chunks_exact(d);
        for head in task.heads.clone() {
            for (t, row) in task.rows.clone().zip(&mut rows) {
                let dst = (query_row(task.seq, t) * num_heads + head) * d;
                out[dst..dst + d].copy_from_slice(row);
            }
        }
    }
    Ok(out)
}

/// One task of a layer's attention: some of one sequence's query rows (indices into its
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
/// `TASK_ROWS`. Either way a task's heads share one KV head (`group_attention` takes them
/// together). None of this changes a result: each row of each head is computed alone.
fn tasks(spans: &[SeqSpan], queries: &[SeqSpan], shape: HeadShape) -> Vec<Task> {
    let n_rep = shape.num_heads / shape.num_kv_heads;
    let runs: usize = queries.iter().map(|q| q.len.div_ceil(TASK_ROWS)).sum();
    let per_task = if runs * shape.num_kv_heads >= TASKS_PER_THREAD * Team::global().threads() {
        n_rep
    } else {
        1
    };
    let mut tasks = Vec::new();
    for (seq, (span, query)) in spans.iter().zip(queries).enumerate() {
        for first in (0..shape.num_heads).step_by(per_task) {
            for row in (span.len - query.len..span.len).step_by(TASK_ROWS) {
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
    pub(super) fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * seed) % 1013) as f32 / 1009.0 - 0.5)
            .collect()
    }

    /// The AVX and AVX-512 scoring of several queries against several keys is the portable
    /// `dot` of each pair, bit for bit (on a CPU without them they never run).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn keys_side_by_side_score_as_alone() {
        use super::{avx512, x86};
        if x86::available() {
            dots_as_alone::<1, 8>(x86::dots::<1, 8>);
            dots_as_alone::<2, 4>(x86::dots::<2, 4>);
            dots_as_alone::<4, 2>(x86::dots::<4, 2>);
        }
        if avx512::available() {
            dots_as_alone::<1, 16>(avx512::dots::<1, 16>);
            dots_as_alone::<2, 8>(avx512::dots::<2, 8>);
            dots_as_alone::<4, 4>(avx512::dots::<4, 4>);
        }
    }

    /// An AVX kernel scoring `H` queries against `K` keys.
    #[cfg(target_arch = "x86_64")]
    type Dots<const H: usize, const K: usize> = unsafe fn(&[&[f32]; H], &[f32]) -> [[f32; K]; H];

    /// `dots` (an AVX kernel the CPU has) against `dot` of each pair.
    #[cfg(target_arch = "x86_64")]
    fn dots_as_alone<const H: usize, const K: usize>(dots: Dots<H, K>) {
        // A length with a tail, too.
        for d in [64, 67, 256] {
            let qs: Vec<Vec<f32>> = (0..H).map(|h| values(d, 7919 + 2 * h)).collect();
            let keys = values(K * d, 104_729);
            let refs: [&[f32]; H] = std::array::from_fn(|h| &qs[h][..]);
            // SAFETY: the caller checked that the CPU runs `dots`.
            let together = unsafe { dots(&refs, &keys) };
            for (h, row) in together.iter().enumerate() {
                for (k, got) in row.iter().enumerate() {
                    let alone = dot(&qs[h], &keys[k * d..(k + 1) * d]);
                    assert_eq!(
                        got.to_bits(),
                        alone.to_bits(),
                        "{H}x{K} d={d} q {h} key {k}"
                    );
                }
            }
        }
    }

    /// The AVX and AVX-512 weighted sums, of one row or several over the same values, are
    /// the portable one's, bit for bit.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx_weighted_sum_is_the_portable_one() {
        use super::{avx512, x86};
        if x86::available() {
            weighted_sums_as_portable::<1, 8>(x86::weighted_sums::<1, 8>);
            weighted_sums_as_portable::<2, 4>(x86::weighted_sums::<2, 4>);
            weighted_sums_as_portable::<4, 2>(x86::weighted_sums::<4, 2>);
        }
        if avx512::available() {
            weighted_sums_as_portable::<1, 4>(avx512::weighted_sums::<1, 4>);
            weighted_sums_as_portable::<2, 4>(avx512::weighted_sums::<2, 4>);
            weighted_sums_as_portable::<4, 4>(avx512::weighted_sums::<4, 4>);
        }
    }

    /// `sums` (an AVX kernel the CPU has) against the portable loop, row by row.
    #[cfg(target_arch = "x86_64")]
    fn weighted_sums_as_portable<const H: usize, const N: usize>(
        sums: unsafe fn(&mut [f32], &[&[f32]; H], &[f32]),
    ) {
        // Full blocks of columns, single registers and a scalar tail.
        for (d, keys) in [(64, 1), (256, 37), (67, 9), (5, 3), (136, 8), (96, 5)] {
            let weights: Vec<Vec<f32>> = (0..H).map(|h| values(keys, 7919 + 2 * h)).collect();
            let vals = values(keys * d, 104_729);
            let mut portable = vec![0f32; H * d];
            for (row, w) in portable.chunks_exact_mut(d).zip(&weights) {
                weighted_sum(row, w, &vals);
            }
            let mut avx = vec![f32::NAN; H * d];
            let refs: [&[f32]; H] = std::array::from_fn(|h| &weights[h][..]);
            // SAFETY: the caller checked that the CPU runs `sums`.
            unsafe { sums(&mut avx, &refs, &vals) };
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&avx), bits(&portable), "{H}x{N} d={d} keys={keys}");
        }
    }
}
