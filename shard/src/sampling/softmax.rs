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
/// and logprobs are the product. Each result is rounded to f32 once, from
/// `(x - max) - ln(sum)` evaluated in f64.
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
    let sum: f64 = values
        .iter()
        .map(|&x| f64::from(x - max).exp())
        .filter(|e| !e.is_nan())
        .sum();
    let ln_sum = sum.ln();
    for v in values.iter_mut() {
        *v = (f64::from(*v - max) - ln_sum) as f32;
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
