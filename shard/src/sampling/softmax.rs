//! Log-softmax in f32 with an f64 normaliser.

use crate::fastmath::exp_le0;

/// Replaces `out` with the log-softmax of `logits` (same length), reusing its allocation.
pub fn log_softmax_into(logits: &[f32], out: &mut Vec<f32>) {
    out.clear();
    out.extend_from_slice(logits);
    log_softmax_in_place(out);
}

/// Log-softmax of `values`, in place: each value replaced by [`Normalizer::logprob`] of it.
pub fn log_softmax_in_place(values: &mut [f32]) {
    let norm = Normalizer::of(values);
    for v in values.iter_mut() {
        *v = norm.logprob(*v);
    }
}

/// What turns a row's logits into its logprobs: its maximum and the log of its softmax
/// denominator. Computing it reads the row twice and writes nothing, so the logprobs of a
/// few tokens (the chosen one, labels) cost no pass that writes the whole vocabulary.
///
/// The normaliser is summed in f64: over a 49k vocabulary an f32 sum loses low-order bits,
/// and logprobs are the product. Each term `e^(x - max)` is computed in f32 by
/// [`exp_le0`] (within 2 ulp, a relative 2.4e-7, so the sum and its logarithm move by at
/// most that much too: a tenth of an f32 ulp of a typical logprob), and the terms are added
/// in f64, in a fixed order. Each logprob is rounded to f32 once, from `(x - max) - ln(sum)`
/// evaluated in f64. (The f64 `exp` of every logit this replaced was most of a step's
/// scoring time: a 512-token prompt scored 0.3 s slower.)
///
/// Degenerate rows never panic: -inf stays -inf (probability 0); a NaN stays NaN and is left
/// out of the sum, so one broken logit does not poison the rest of the row; a row with no
/// finite maximum (empty, all -inf/NaN) comes out all -inf/NaN; a +inf logit makes the whole
/// row NaN.
#[derive(Debug, Clone, Copy)]
pub struct Normalizer {
    max: f32,
    ln_sum: f64,
}

impl Normalizer {
    pub fn of(values: &[f32]) -> Self {
        // f32::max ignores NaN.
        let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let ln_sum = if max == f32::NEG_INFINITY {
            f64::NEG_INFINITY
        } else {
            sum_exp(values, max).ln()
        };
        Normalizer { max, ln_sum }
    }

    /// The logprob of a token whose logit is `x`, bit for bit the same for every `x` of
    /// the row whether it is asked for alone or with the whole row.
    #[inline]
    pub fn logprob(&self, x: f32) -> f32 {
        if self.max == f32::NEG_INFINITY {
            // No finite maximum: every number is -inf (probability 0); NaN stays NaN.
            return if x.is_nan() { x } else { f32::NEG_INFINITY };
        }
        (f64::from(x - self.max) - self.ln_sum) as f32
    }
}

/// Terms summed at a time: lane `i % LANES` of `Σ e^(x_i - max)` gets term `i`, and the
/// lanes are added in order at the end. A fixed order, so the same row always gives the same
/// bits; several lanes, so the additions are independent and vectorize.
const LANES: usize = 8;
/// Terms computed into a buffer at a time (a multiple of `LANES`): two simple loops, one
/// computing `e^x` and one adding, vectorize where one loop doing both did not.
const CHUNK: usize = 256;

/// `Σ e^(x - max)` over the values that are not NaN, in f64.
fn sum_exp(values: &[f32], max: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above).
        return unsafe { sum_exp_avx2(values, max) };
    }
    sum_exp_lanes(values, max)
}

/// [`sum_exp_lanes`] compiled for AVX2: 8 exponentials per instruction where the baseline
/// (SSE2) does 4. The same operations in the same order, so the same bits; over Gemma 3's
/// 262k vocabulary this is most of a row's scoring.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sum_exp_avx2(values: &[f32], max: f32) -> f64 {
    sum_exp_lanes(values, max)
}

#[inline(always)]
fn sum_exp_lanes(values: &[f32], max: f32) -> f64 {
    let mut lanes = [0f64; LANES];
    let mut terms = [0f32; CHUNK];
    for chunk in values.chunks(CHUNK) {
        // Past the end of a short last chunk the terms are 0, which adds nothing.
        terms.fill(0.0);
        for (t, &x) in terms.iter_mut().zip(chunk) {
            *t = exp_le0(x - max);
        }
        for group in terms.chunks_exact(LANES) {
            for (lane, &t) in lanes.iter_mut().zip(group) {
                *lane += f64::from(t);
            }
        }
    }
    let mut sum = 0.0;
    for lane in lanes {
        sum += lane;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::test_util::{log_softmax_f64, logits};

    fn check(xs: &[f32]) {
        let mut out = Vec::new();
        log_softmax_into(xs, &mut out);
        let want = log_softmax_f64(xs);
        assert_eq!(out.len(), xs.len());
        for (i, (&got, &want)) in out.iter().zip(&want).enumerate() {
            // One f32 rounding of the result plus one of (x - max).
            let tol = 2.0 * f64::from(f32::EPSILON) * (want.abs() + 1.0);
            assert!(
                (f64::from(got) - want).abs() <= tol,
                "token {i}: got {got}, want {want}"
            );
        }
        let total: f64 = out.iter().map(|&l| f64::from(l).exp()).sum();
        assert!((total - 1.0).abs() < 1e-5, "sum {total}");
    }

    #[test]
    fn matches_f64_math() {
        check(&[1.0, 2.0, 3.0, -1.5, 0.0]);
        check(&[0.0]);
        check(&[5.0, 5.0, 5.0, 5.0]);
        // Large values: naive exp would overflow.
        check(&[1000.0, 1001.0, 999.5]);
        check(&[-1000.0, -1001.0, -999.5]);
        check(&logits(1, 49152, 20.0, 0.0));
    }

    /// The AVX2 build of the sum is the baseline's, bit for bit.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_sum_is_the_baseline_sum() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return; // the baseline is all such a CPU runs
        }
        for n in [1, 7, 300, 49152] {
            let xs = logits(1, n, 20.0, 0.0);
            let max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            // SAFETY: AVX2 is available (checked above).
            let avx2 = unsafe { sum_exp_avx2(&xs, max) };
            assert_eq!(avx2.to_bits(), sum_exp_lanes(&xs, max).to_bits(), "n={n}");
        }
    }

    #[test]
    fn hand_values() {
        let mut v = vec![0.0, 0.0];
        log_softmax_in_place(&mut v);
        assert_eq!(v, vec![-std::f32::consts::LN_2; 2]);
    }

    #[test]
    fn minus_infinity_is_probability_zero() {
        let mut v = vec![f32::NEG_INFINITY, 1.0, f32::NEG_INFINITY, 1.0];
        log_softmax_in_place(&mut v);
        assert_eq!(v[0], f32::NEG_INFINITY);
        assert_eq!(v[2], f32::NEG_INFINITY);
        assert_eq!(v[1], -std::f32::consts::LN_2);
        assert_eq!(v[3], -std::f32::consts::LN_2);
    }

    #[test]
    fn degenerate_rows_do_not_panic() {
        let mut v = vec![f32::NEG_INFINITY; 3];
        log_softmax_in_place(&mut v);
        assert!(v.iter().all(|&x| x == f32::NEG_INFINITY));

        let mut v = vec![f32::NAN, 0.0, 0.0];
        log_softmax_in_place(&mut v);
        assert!(v[0].is_nan());
        assert_eq!(v[1], -std::f32::consts::LN_2);

        let mut v = vec![f32::INFINITY, 0.0];
        log_softmax_in_place(&mut v);
        assert!(v.iter().all(|x| x.is_nan()));

        let mut v: Vec<f32> = vec![];
        log_softmax_in_place(&mut v);
    }
}
