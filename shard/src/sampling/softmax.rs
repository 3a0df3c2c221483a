//! Log-softmax in f32 with an f64 normaliser.

/// Replaces `out` with the log-softmax of `logits` (same length), reusing its allocation.
pub fn log_softmax_into(logits: &[f32], out: &mut Vec<f32>) {
    out.clear();
    out.extend_from_slice(logits);
    log_softmax_in_place(out);
}

/// Log-softmax of `values`, in place.
///
/// The normaliser is summed in f64: over a 49k vocabulary an f32 sum loses low-order bits,
/// and logprobs are the product. Each term `e^(x - max)` is computed in f32 by [`exp_le0`]
/// (within 2 ulp, a relative 2.4e-7, so the sum and its logarithm move by at most that much
/// too: a tenth of an f32 ulp of a typical logprob), and the terms are added in f64, in a
/// fixed order. Each result is rounded to f32 once, from `(x - max) - ln(sum)` evaluated in
/// f64. (The f64 `exp` of every logit this replaced was most of a step's scoring time: a
/// 512-token prompt scored 0.3 s slower.)
///
/// Degenerate rows never panic: -inf stays -inf (probability 0); a NaN stays NaN and is left
/// out of the sum, so one broken logit does not poison the rest of the row; a row with no
/// finite maximum (empty, all -inf/NaN) comes out all -inf/NaN; a +inf logit makes the whole
/// row NaN.
pub fn log_softmax_in_place(values: &mut [f32]) {
    // f32::max ignores NaN.
    let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        for v in values.iter_mut().filter(|v| !v.is_nan()) {
            *v = f32::NEG_INFINITY;
        }
        return;
    }
    let ln_sum = sum_exp(values, max).ln();
    for v in values.iter_mut() {
        *v = (f64::from(*v - max) - ln_sum) as f32;
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
    lanes.iter().sum()
}

/// `e^d` for `d ≤ 0`, within 2 ulp; 0 below -87 (where `e^d` < 1.7e-38: next to the maximum's
/// own term of 1 it cannot change an f64 sum of fewer than 10^20 terms) and for NaN. Cephes'
/// `expf`: `d = n ln 2 + r` with `|r| ≤ ln 2 / 2` (ln 2 in two parts, so `r` is exact), a
/// degree-7 polynomial for `e^r`, times `2^n` built from its bits. Plain multiplies and adds
/// (no FMA, which would be a library call on CPUs without it), so every CPU gives the same
/// bits, and the loop above vectorizes.
#[inline(always)]
fn exp_le0(d: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer (ties to even).
    const ROUND: f32 = 12_582_912.0;
    let x = d.max(-87.0);
    let shifted = x * LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_2e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5; // Cephes: 5.0000001201e-1, which rounds to 0.5 in f32
    let e = p * (r * r) + r + 1.0;
    // n is an integer in [-126, 0], so 2^n is a normal f32; `shifted` holds n + 2^22 in
    // its low mantissa bits (integer arithmetic, rather than a float-to-int conversion
    // that keeps the loop from vectorizing).
    let n_bits = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    let scale = f32::from_bits(n_bits.wrapping_add(127) << 23);
    if d >= -87.0 {
        e * scale
    } else {
        0.0
    }
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

    /// `exp_le0` against f64 `exp` over its whole range: within 2 ulp of the f32 result.
    #[test]
    fn exp_is_within_two_ulp() {
        let mut worst = 0f64;
        let mut d = 0f32;
        while d > -87.0 {
            let got = f64::from(exp_le0(d));
            let want = f64::from(d).exp();
            let ulp = f64::from(f32::EPSILON) * want;
            worst = worst.max((got - want).abs() / ulp);
            d = f32::from_bits(d.to_bits() + 997).min(d - 1e-4);
        }
        assert!(worst <= 2.0, "{worst} ulp");
        assert_eq!(exp_le0(0.0), 1.0);
        assert_eq!(exp_le0(-87.5), 0.0);
        assert_eq!(exp_le0(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_le0(f32::NAN), 0.0);
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
