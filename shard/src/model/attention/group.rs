//! One KV head's query heads over some new rows of a sequence: for each row, the heads
//! that share the KV head are scored and weighted together (on AVX), so each chunk of a
//! key or a value is loaded once for up to [`MAX_GROUP`] heads rather than once per head.
//! At a long context the keys and values come from L2, and the loads, not the arithmetic,
//! set the pace (Gemma 3 has 4 query heads per KV head, Llama 3 and Mistral 4, SmolLM2 3).
//! Each row of each head is still computed alone, in the same order, so the bits do not
//! depend on which heads go together (the tests check it).

use std::ops::Range;

use super::kernels::{dot, softmax_numerators, weighted_sum};
#[cfg(target_arch = "x86_64")]
use super::{avx512, x86};
use super::{score, AttnParams};

/// Heads computed together at most: [`x86::dots`] then takes 2 keys a call, and
/// [`avx512::dots`] 4.
const MAX_GROUP: usize = 4;

/// One KV head of one sequence's cache: `past` positions before the step's, then the
/// step's, `head_dim` values each.
#[derive(Clone, Copy)]
pub(super) struct HeadKv<'a> {
    pub keys: &'a [f32],
    pub values: &'a [f32],
    pub past: usize,
}

/// Some of a sequence's new rows (their indices in its span) for some query heads of one
/// KV head, and where their outputs go: head after head, each its rows' `head_dim` values.
pub(super) struct GroupRows<'o> {
    pub heads: Range<usize>,
    pub index: Range<usize>,
    pub out: &'o mut [f32],
}

/// For each new row t of `rows` (position p = past + t) and each of its heads: softmax over
/// the scaled (and capped) scores of the keys it sees, then the weighted sum of their
/// values: `Σ e^(s_j - max) v_j`, divided by `Σ e^(s_j - max)` once at the end.
/// `query(head, t)` is a head's query of row t.
pub(super) fn group_attention<'q>(
    params: &AttnParams,
    query: impl Fn(usize, usize) -> &'q [f32],
    kv: HeadKv,
    rows: GroupRows,
) {
    let HeadKv { keys, values, past } = kv;
    let GroupRows {
        heads,
        index: rows,
        out,
    } = rows;
    let d = params.shape.head_dim;
    let n = rows.len();
    let mut scores: [Vec<f32>; MAX_GROUP] =
        std::array::from_fn(|_| Vec::with_capacity(past + rows.end));
    let mut sums = vec![0f32; MAX_GROUP * d];
    let avx = avx();
    for (r, t) in rows.enumerate() {
        let end = past + t + 1;
        let first = params.window.map_or(0, |w| end.saturating_sub(w));
        let mut h0 = heads.start;
        while h0 < heads.end {
            let group = group_size(heads.end - h0, avx);
            let mut qs: [&[f32]; MAX_GROUP] = [&[]; MAX_GROUP];
            for (q, head) in qs.iter_mut().zip(h0..h0 + group) {
                *q = query(head, t);
            }
            let (qs, scores) = (&qs[..group], &mut scores[..group]);
            for s in scores.iter_mut() {
                s.clear();
            }
            let seen = Seen {
                keys: &keys[..end * d],
                first,
            };
            score_keys(params, qs, seen, scores);
            let mut denominators = [0f32; MAX_GROUP];
            for (den, s) in denominators.iter_mut().zip(scores.iter_mut()) {
                *den = softmax_numerators(s);
            }
            let weighted = &mut sums[..group * d];
            weigh(scores, &values[first * d..end * d], weighted);
            for (i, (src, den)) in weighted.chunks_exact(d).zip(denominators).enumerate() {
                let head = h0 - heads.start + i;
                let dst = &mut out[(head * n + r) * d..][..d];
                for (o, &x) in dst.iter_mut().zip(src) {
                    *o = x / den;
                }
            }
            h0 += group;
        }
    }
}

/// Whether the AVX kernels run here (a cached check: each kernel's caller asks it).
fn avx() -> bool {
    #[cfg(target_arch = "x86_64")]
    return x86::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the AVX-512 kernels run here (a cached check, as [`avx`]).
fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    return avx512::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Heads to take together of `left`: a size [`x86::dots`] takes (4, 2 or 1), or one at a
/// time for the portable loops.
fn group_size(left: usize, avx: bool) -> usize {
    match left {
        _ if !avx => 1,
        4.. => 4,
        2 | 3 => 2,
        _ => 1,
    }
}

/// The keys a row sees: from key `first` to the end of `keys` (`head_dim` values each).
#[derive(Clone, Copy)]
struct Seen<'a> {
    keys: &'a [f32],
    first: usize,
}

/// Appends to `scores[h]` the score of each key `seen` for query `qs[h]`:
/// `score(dot(q, key))`, the same bits however the keys are grouped.
fn score_keys(params: &AttnParams, qs: &[&[f32]], seen: Seen, scores: &mut [Vec<f32>]) {
    let d = params.shape.head_dim;
    let keys = seen.keys;
    // The AVX-512 kernel's blocks of keys, then the AVX kernel's smaller ones for the keys
    // left (a decode row at a short context leaves up to 15 of 16), then one at a time.
    // SAFETY (each kernel's call): `avx512()` or `avx()` said the CPU has the features
    // the kernel enables.
    #[cfg(target_arch = "x86_64")]
    let j = {
        let seen = match (qs, avx512()) {
            (&[a, b, c, e], true) => key_blocks(params, seen, scores, |k| unsafe {
                avx512::dots::<4, 4>(&[a, b, c, e], k)
            }),
            (&[a, b], true) => key_blocks(params, seen, scores, |k| unsafe {
                avx512::dots::<2, 8>(&[a, b], k)
            }),
            (&[a], true) => key_blocks(params, seen, scores, |k| unsafe {
                avx512::dots::<1, 16>(&[a], k)
            }),
            _ => seen,
        };
        match (qs, avx()) {
            (&[a, b, c, e], true) => key_blocks(params, seen, scores, |k| unsafe {
                x86::dots::<4, 2>(&[a, b, c, e], k)
            }),
            (&[a, b], true) => key_blocks(params, seen, scores, |k| unsafe {
                x86::dots::<2, 4>(&[a, b], k)
            }),
            (&[a], true) => key_blocks(params, seen, scores, |k| unsafe {
                x86::dots::<1, 8>(&[a], k)
            }),
            _ => seen,
        }
        .first
    };
    #[cfg(not(target_arch = "x86_64"))]
    let j = seen.first;
    let end = keys.len() / d;
    for (q, s) in qs.iter().zip(scores) {
        s.extend((j..end).map(|j| score(params, dot(q, &keys[j * d..(j + 1) * d]))));
    }
}

/// [`score_keys`] of the keys in whole blocks of `K`, `dots(block)` scoring a block for
/// each of `H` queries (`[h][k]`: query h, key k); returns the keys it left.
#[cfg(target_arch = "x86_64")]
fn key_blocks<'a, const H: usize, const K: usize>(
    params: &AttnParams,
    seen: Seen<'a>,
    scores: &mut [Vec<f32>],
    dots: impl Fn(&[f32]) -> [[f32; K]; H],
) -> Seen<'a> {
    let Seen { keys, first } = seen;
    let d = params.shape.head_dim;
    let end = keys.len() / d;
    let mut j = first;
    while j + K <= end {
        for (s, b) in scores.iter_mut().zip(dots(&keys[j * d..(j + K) * d])) {
            s.extend(b.map(|x| score(params, x)));
        }
        j += K;
    }
    Seen { keys, first: j }
}

/// Row `h` of `out` (`values`' width each) becomes `Σ_j weights[h][j] · values[j]`, as
/// `kernels::weighted_sum` computes it.
fn weigh(weights: &[Vec<f32>], values: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        let w = weights;
        // SAFETY: `avx512()` says the CPU has the feature `avx512::weighted_sums` enables.
        unsafe {
            match w.len() {
                4 => {
                    return avx512::weighted_sums::<4, 4>(
                        out,
                        &[&w[0], &w[1], &w[2], &w[3]],
                        values,
                    )
                }
                2 => return avx512::weighted_sums::<2, 4>(out, &[&w[0], &w[1]], values),
                1 => return avx512::weighted_sums::<1, 4>(out, &[&w[0]], values),
                _ => {}
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if avx() {
        let w = weights;
        // SAFETY: `avx()` says the CPU has the feature `x86::weighted_sums` enables.
        unsafe {
            match w.len() {
                4 => return x86::weighted_sums::<4, 2>(out, &[&w[0], &w[1], &w[2], &w[3]], values),
                2 => return x86::weighted_sums::<2, 4>(out, &[&w[0], &w[1]], values),
                1 => return x86::weighted_sums::<1, 8>(out, &[&w[0]], values),
                _ => {}
            }
        }
    }
    let d = out.len() / weights.len().max(1);
    for (row, w) in out.chunks_exact_mut(d.max(1)).zip(weights) {
        weighted_sum(row, w, values);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attention::HeadShape;

    use crate::model::attention::tests::values;

    /// Heads taken together give each head's bits alone: 7, 4 and 3 heads of a KV head
    /// (in groups of 4, 2 and 1) against each head by itself, over a past and new rows,
    /// with and without a window and a softcap.
    #[test]
    fn heads_together_are_heads_alone() {
        let (d, past, new) = (72, 21, 13);
        let keys = values((past + new) * d, 104_729);
        let vals = values((past + new) * d, 7_919);
        for (heads, window, softcap) in [(7, None, None), (4, Some(9), Some(30.0)), (3, None, None)]
        {
            let params = AttnParams {
                shape: HeadShape {
                    num_heads: heads,
                    num_kv_heads: 1,
                    head_dim: d,
                },
                scale: 0.125,
                softcap,
                window,
            };
            let q = values(new * heads * d, 15_485_863);
            let query = |head: usize, t: usize| &q[(t * heads + head) * d..][..d];
            let kv = HeadKv {
                keys: &keys,
                values: &vals,
                past,
            };
            let run = |range: Range<usize>| {
                let mut out = vec![f32::NAN; range.len() * new * d];
                let rows = GroupRows {
                    heads: range,
                    index: 0..new,
                    out: &mut out,
                };
                group_attention(&params, query, kv, rows);
                out
            };
            let together = run(0..heads);
            let alone: Vec<f32> = (0..heads).flat_map(|h| run(h..h + 1)).collect();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&together), bits(&alone), "{heads} heads");
            assert!(together.iter().all(|x| x.is_finite()), "{heads} heads");
        }
    }
}

/// Timing by hand: `cargo test -p sonde-shard --release --lib attention::group::bench --
/// --ignored --nocapture`.
#[cfg(test)]
mod bench {
    use std::time::Instant;

    use super::*;
    use crate::model::attention::tests::values;
    use crate::model::attention::HeadShape;

    /// A prompt's attention for one KV head, its query heads together against one at a
    /// time (Gemma 3 270M: 4 heads of 256; SmolLM2: 3 of 64), and one decode row at a long
    /// context; prints the median ratio of 9 alternations (alone over together).
    #[test]
    #[ignore]
    fn together_against_alone() {
        for (heads, d, past, new) in [
            (4, 256, 0, 512),
            (3, 64, 0, 512),
            (4, 256, 2000, 1),
            (3, 64, 2000, 1),
        ] {
            let n = past + new;
            let (keys, vals) = (values(n * d, 7919), values(n * d, 104_729));
            let q = values(new * heads * d, 31);
            let params = AttnParams {
                shape: HeadShape {
                    num_heads: heads,
                    num_kv_heads: 1,
                    head_dim: d,
                },
                scale: 0.0625,
                softcap: None,
                window: None,
            };
            let kv = HeadKv {
                keys: &keys,
                values: &vals,
                past,
            };
            let mut out = vec![0f32; heads * new * d];
            let mut run = |range: Range<usize>| {
                let len = range.len();
                let rows = GroupRows {
                    heads: range,
                    index: 0..new,
                    out: &mut out[..len * new * d],
                };
                group_attention(&params, |h, t| &q[(t * heads + h) * d..][..d], kv, rows);
            };
            let reps = if new == 1 { 200 } else { 3 };
            let mut time = |together: bool| {
                let start = Instant::now();
                for _ in 0..reps {
                    if together {
                        run(0..heads);
                    } else {
                        (0..heads).for_each(|h| run(h..h + 1));
                    }
                }
                start.elapsed().as_secs_f64()
            };
            let mut ratios: Vec<f64> = (0..9).map(|_| time(false) / time(true)).collect();
            ratios.sort_by(f64::total_cmp);
            println!("GROUP heads={heads} d={d} past={past} new={new}: alone / together {:.2} ({:.2}-{:.2})", ratios[4], ratios[0], ratios[8]);
        }
    }
}
