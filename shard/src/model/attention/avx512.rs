//! The kernels of `x86.rs` with AVX-512's 32 registers, the same bits. The AVX kernels
//! ran a Gemma 3 prompt's attention at about half the multiply and add ports' peak, bound
//! by issuing loads, broadcasts and bookkeeping rather than arithmetic.
//!
//! - [`dots`] keeps 16 accumulators of 8 lanes where `x86::dots` has room for 8: each
//!   chunk of a query or key loaded feeds twice the products (4 queries by 4 keys). It is
//!   `x86::dots_in`, the AVX kernel's body, compiled with AVX-512's registers. (Two keys in
//!   one 16-lane register instead, with the same bits, ran slower: on an AMD Zen 4 a
//!   16-lane operation takes the 8-lane units twice, and putting the halves together
//!   costs a shuffle per chunk.)
//! - [`weighted_sums`] keeps 16 columns a register and 4 registers a row; each column is
//!   its own chain, so the width changes nothing.
//!
//! On a Zen 4, one thread, alternated in one process: a 512-token prompt's attention for
//! one KV head of Gemma 3's (4 heads of 256) ran 1.17–1.21x as fast as with the AVX
//! kernels, 1.24x at 1024 tokens, SmolLM2's shape (3 heads of 64) 1.08x; the kernels
//! alone (`bench` below), scores 1.10–1.14x and weighted sums 1.44–1.52x.

use std::arch::x86_64::{
    __m512, _mm512_add_ps, _mm512_loadu_ps, _mm512_mul_ps, _mm512_set1_ps, _mm512_setzero_ps,
    _mm512_storeu_ps,
};

use super::kernels::weighted_sum_from;
use super::x86::{dots_in, PAIRS};

/// f32 lanes of a register.
const WIDE: usize = 16;

/// Whether this CPU runs the functions here (the standard library caches the answer).
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// `x86::dots` with 16 accumulators, `H * K` = 16 (4 queries by 4 keys, 2 by 8, 1 by
/// 16): AVX-512's 32 registers hold them beside the chunks loaded, so each chunk feeds
/// twice the products. Callers check [`available`] first.
#[target_feature(enable = "avx512f,avx512vl")]
pub(super) fn dots<const H: usize, const K: usize>(
    qs: &[&[f32]; H],
    keys: &[f32],
) -> [[f32; K]; H] {
    const { assert!(H * K == 2 * PAIRS) };
    dots_in(qs, keys)
}

/// `kernels::weighted_sum` for each of `H` weight rows over the same `values`: row `h`
/// of `out` (`H` rows of `values`' width) from `weights[h]`, the same bits as alone, `N`
/// registers of 16 columns a pass over the keys. Callers check [`available`] first.
#[target_feature(enable = "avx512f")]
pub(super) fn weighted_sums<const H: usize, const N: usize>(
    out: &mut [f32],
    weights: &[&[f32]; H],
    values: &[f32],
) {
    let d = out.len() / H;
    let keys = weights[0].len();
    let mut start = 0;
    if values.len() >= keys * d && weights.iter().all(|w| w.len() == keys) {
        while start + N * WIDE <= d {
            columns::<H, N>(out, start, weights, values);
            start += N * WIDE;
        }
        while start + WIDE <= d {
            columns::<H, 1>(out, start, weights, values);
            start += WIDE;
        }
    }
    // Columns past the last whole register (none for head sizes a multiple of 16).
    for (row, w) in out.chunks_exact_mut(d.max(1)).zip(weights) {
        weighted_sum_from(row, start, w, values);
    }
}

/// The weighted sums of `N` registers' worth of columns from `start`, for each of the `H`
/// rows of `out`. The caller checked that `values` holds a row of `d` per weight, every
/// weight row has the same length, and `start + 16 N <= d`.
#[target_feature(enable = "avx512f")]
#[inline]
fn columns<const H: usize, const N: usize>(
    out: &mut [f32],
    start: usize,
    weights: &[&[f32]; H],
    values: &[f32],
) {
    let d = out.len() / H;
    let keys = weights[0].len();
    let mut acc = [[_mm512_setzero_ps(); N]; H];
    for j in 0..keys {
        let mut vs = [_mm512_setzero_ps(); N];
        for (n, v) in vs.iter_mut().enumerate() {
            // SAFETY: `values` holds `keys` rows of `d` and `start + 16 N <= d` (the
            // caller's checks), so 16 f32 from `j d + start + 16 n` are in it.
            *v = unsafe { _mm512_loadu_ps(values.as_ptr().add(j * d + start + n * WIDE)) };
        }
        for (acc, w) in acc.iter_mut().zip(weights) {
            // SAFETY: every weight row holds `keys` values (the caller's check).
            let w: __m512 = _mm512_set1_ps(unsafe { *w.get_unchecked(j) });
            for (a, v) in acc.iter_mut().zip(&vs) {
                *a = _mm512_add_ps(*a, _mm512_mul_ps(w, *v));
            }
        }
    }
    for (acc, row) in acc.iter().zip(out.chunks_exact_mut(d)) {
        for (n, a) in acc.iter().enumerate() {
            let at = start + n * WIDE;
            // SAFETY: `row` holds `d` f32 and `at + 16 <= start + 16 N <= d`.
            unsafe { _mm512_storeu_ps(row[at..at + WIDE].as_mut_ptr(), *a) };
        }
    }
}

/// Timing by hand: `cargo test -p sonde-shard --release --lib attention::avx512::bench --
/// --ignored --nocapture`.
#[cfg(test)]
mod bench {
    use std::time::Instant;

    use super::super::tests::values;
    use super::super::x86;
    use super::*;

    /// One row of a Gemma 3 prompt's attention at 512 keys, 4 heads of 256: the scores,
    /// then the weighted sums, AVX over AVX-512 (the median of 9 alternations).
    #[test]
    #[ignore]
    fn against_avx() {
        if !available() {
            return; // nothing to compare on this CPU
        }
        let (d, n) = (256, 512);
        let keys = values(n * d, 7919);
        let qv: Vec<Vec<f32>> = (0..4).map(|h| values(d, 31 + h)).collect();
        let qs: [&[f32]; 4] = [&qv[0], &qv[1], &qv[2], &qv[3]];
        let wv: Vec<Vec<f32>> = (0..4).map(|h| values(n, 17 + h)).collect();
        let ws: [&[f32]; 4] = [&wv[0], &wv[1], &wv[2], &wv[3]];
        let mut out = vec![0f32; 4 * d];
        let time = |f: &mut dyn FnMut()| {
            let start = Instant::now();
            for _ in 0..200 {
                f();
            }
            start.elapsed().as_secs_f64()
        };
        let mut sink = 0f32;
        let (mut scores, mut sums) = (Vec::new(), Vec::new());
        for _ in 0..9 {
            // SAFETY (each kernel call): `available()` (AVX-512 implies AVX).
            let avx = time(&mut || {
                for block in keys.chunks_exact(2 * d) {
                    sink += unsafe { x86::dots::<4, 2>(&qs, block) }[0][0];
                }
            });
            let wide = time(&mut || {
                for block in keys.chunks_exact(4 * d) {
                    sink += unsafe { dots::<4, 4>(&qs, block) }[0][0];
                }
            });
            scores.push(avx / wide);
            let avx = time(&mut || unsafe { x86::weighted_sums::<4, 2>(&mut out, &ws, &keys) });
            let wide = time(&mut || unsafe { weighted_sums::<4, 4>(&mut out, &ws, &keys) });
            sums.push(avx / wide);
        }
        for v in [&mut scores, &mut sums] {
            v.sort_by(f64::total_cmp);
        }
        println!(
            "AVX512 scores {:.2} ({:.2}-{:.2}), weighted sums {:.2} ({:.2}-{:.2}) {sink}",
            scores[4], scores[0], scores[8], sums[4], sums[0], sums[8]
        );
    }
}
