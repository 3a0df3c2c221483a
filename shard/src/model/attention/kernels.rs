//! The arithmetic of one head's attention row, portable: the query-key products, the
//! softmax weights and the weighted sum of the values. Each is written so that the AVX
//! versions in `x86.rs` compute the same bits: the products and sums happen in the same
//! order, a rounded product then a rounded sum (Rust never fuses them into an FMA), so
//! which one runs changes the speed and never a score.

use crate::fastmath::exp_le0;

/// Accumulator lanes of a dot product and of the weights' sum: element i goes to lane
/// i % LANES.
pub(super) const LANES: usize = 8;

/// `a · b` with LANES partial sums folded in a fixed order: the same bits every call (and
/// as `x86::dots` computes them). The RMS norm sums a row's squares with it too.
#[inline]
pub(in crate::model) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (ac, ar) = a.as_chunks::<LANES>();
    let (bc, br) = b.as_chunks::<LANES>();
    for (x, y) in ac.iter().zip(bc) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    fold(acc, tail_dot(ar, br))
}

/// The products past the last full chunk, summed in order.
#[inline]
pub(super) fn tail_dot(a: &[f32], b: &[f32]) -> f32 {
    let mut tail = 0f32;
    for (x, y) in a.iter().zip(b) {
        tail += x * y;
    }
    tail
}

/// A dot product's lanes and tail, summed in a fixed order.
#[inline]
pub(super) fn fold(lanes: [f32; LANES], tail: f32) -> f32 {
    let [a0, a1, a2, a3, a4, a5, a6, a7] = lanes;
    ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7)) + tail
}

/// Turns a row's scores into its softmax numerators `e^(s - max)` in place and returns
/// their sum (the denominator). The exponential is `exp_le0`, the same bits on every CPU
/// (a libm `expf` is not: its last bit varies by CPU and library version), and it
/// vectorizes where a libm call per score did not. A NaN score stays NaN (and so makes
/// the row NaN, as a broken model should show), where `exp_le0` alone would give it
/// weight 0. The sum uses LANES partial sums, folded like a dot product.
pub(super) fn softmax_numerators(scores: &mut [f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above).
        return unsafe { numerators_avx2(scores) };
    }
    numerators(scores)
}

/// [`numerators`] compiled for AVX2: 8 exponentials per instruction where the baseline
/// (SSE2) does 4. The same operations in the same order, so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn numerators_avx2(scores: &mut [f32]) -> f32 {
    numerators(scores)
}

#[inline(always)]
fn numerators(scores: &mut [f32]) -> f32 {
    let mut max = f32::NEG_INFINITY;
    for &s in scores.iter() {
        // f32::max ignores NaN.
        max = max.max(s);
    }
    for s in scores.iter_mut() {
        let x = *s - max;
        *s = if x.is_nan() { x } else { exp_le0(x) };
    }
    let (chunks, tail) = scores.as_chunks::<LANES>();
    let mut acc = [0f32; LANES];
    for c in chunks {
        for l in 0..LANES {
            acc[l] += c[l];
        }
    }
    let mut rest = 0f32;
    for &x in tail {
        rest += x;
    }
    fold(acc, rest)
}

/// `out[i] = Σ_j weights[j] · values[j][i]`, over the keys `j` in order, starting from 0;
/// `values` holds one row of `out.len()` values per weight. Each element is its own chain
/// of a rounded product then a rounded sum, so vectors of any width (`x86::weighted_sum`)
/// give the same bits as this loop.
pub(super) fn weighted_sum(out: &mut [f32], weights: &[f32], values: &[f32]) {
    weighted_sum_from(out, 0, weights, values);
}

/// Columns per pass over the keys: an accumulator small enough to stay in registers.
const BLOCK: usize = 16;

/// [`weighted_sum`] of the columns from `from` on (the rest of `out` is left as it is).
pub(super) fn weighted_sum_from(out: &mut [f32], from: usize, weights: &[f32], values: &[f32]) {
    let d = out.len();
    let mut start = from;
    while start < d {
        let width = BLOCK.min(d - start);
        let mut acc = [0f32; BLOCK];
        for (j, &w) in weights.iter().enumerate() {
            let row = &values[j * d + start..][..width];
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += w * v;
            }
        }
        out[start..start + width].copy_from_slice(&acc[..width]);
        start += width;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_is_exact_on_integers_and_handles_tails() {
        let a: Vec<f32> = (0..67).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..67).map(|i| (i % 5) as f32).collect();
        let want: f32 = (0..67).map(|i| (i * (i % 5)) as f32).sum();
        assert_eq!(dot(&a, &b), want);
    }

    #[test]
    fn softmax_numerators_match_f64() {
        let mut s: Vec<f32> = (0..37)
            .map(|i| ((i * 37) % 23) as f32 * 0.7 - 5.0)
            .collect();
        let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let want: Vec<f64> = s.iter().map(|&x| f64::from(x - max).exp()).collect();
        let sum = softmax_numerators(&mut s);
        for (got, want) in s.iter().zip(&want) {
            assert!(
                (f64::from(*got) - want).abs() <= 3e-7 * want,
                "{got} vs {want}"
            );
        }
        let want_sum: f64 = want.iter().sum();
        assert!((f64::from(sum) - want_sum).abs() <= 1e-6 * want_sum);
    }

    /// The AVX2 build of the numerators is the baseline's, bit for bit.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_numerators_are_the_baseline_ones() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return; // the baseline is all such a CPU runs
        }
        for n in [1, 7, 8, 300, 4099] {
            let scores: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) % 1013) as f32 / 50.0 - 10.0)
                .collect();
            let (mut a, mut b) = (scores.clone(), scores);
            // SAFETY: AVX2 is available (checked above).
            let sum_a = unsafe { numerators_avx2(&mut a) };
            let sum_b = numerators(&mut b);
            assert_eq!(sum_a.to_bits(), sum_b.to_bits(), "n={n}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "n={n}");
        }
    }

    #[test]
    fn nan_scores_stay_nan_and_minus_infinity_weighs_nothing() {
        let mut s = vec![1.0, f32::NEG_INFINITY, 1.0];
        assert_eq!(softmax_numerators(&mut s), 2.0);
        assert_eq!(s, vec![1.0, 0.0, 1.0]);
        let mut s = vec![1.0, f32::NAN, 0.5];
        assert!(softmax_numerators(&mut s).is_nan());
        assert!(s[1].is_nan());
    }

    #[test]
    fn weighted_sum_is_exact_on_small_integers() {
        // d = 37: two full blocks and a partial one.
        let d = 37;
        let weights = [1.0f32, 2.0, -3.0, 0.5];
        let values: Vec<f32> = (0..4 * d).map(|i| (i % 11) as f32).collect();
        let mut out = vec![f32::NAN; d];
        weighted_sum(&mut out, &weights, &values);
        for (i, &o) in out.iter().enumerate() {
            let want: f32 = (0..4).map(|j| weights[j] * values[j * d + i]).sum();
            assert_eq!(o, want, "column {i}");
        }
    }
}
