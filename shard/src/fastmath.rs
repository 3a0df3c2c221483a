//! Elementwise functions in f32 that every CPU computes to the same bits and that
//! vectorize: plain multiplies, adds and selects, no libm calls (whose results and speed
//! vary by CPU and library version).

/// `e^d` for `d ≤ 0`, within 2 ulp; 0 below -87 (where `e^d` < 1.7e-38: next to the maximum's
/// own term of 1 it cannot change an f64 sum of fewer than 10^20 terms) and for NaN. Cephes'
/// `expf`: `d = n ln 2 + r` with `|r| ≤ ln 2 / 2` (ln 2 in two parts, so `r` is exact), a
/// degree-7 polynomial for `e^r`, times `2^n` built from its bits. Plain multiplies and adds
/// (no FMA, which would be a library call on CPUs without it), so every CPU gives the same
/// bits, and loops over it vectorize.
#[inline(always)]
pub(crate) fn exp_le0(d: f32) -> f32 {
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

/// `x · sigmoid(z)`, within a few ulp. The exponential is only ever taken of `-|z|`, so
/// `e` is at most 1 and nothing overflows or cancels: `sigmoid(z) = 1 / (1 + e^-z)` for
/// `z ≥ 0` and `e^z / (1 + e^z)` below. A NaN `x` or `z` gives NaN.
#[inline(always)]
fn times_sigmoid(x: f32, z: f32) -> f32 {
    let e = exp_le0(-z.abs());
    let numerator = if z >= 0.0 { 1.0 } else { e };
    // NaN `z`: `exp_le0` gives 0 and so does `numerator`; keep the NaN.
    let numerator = if z.is_nan() { z } else { numerator };
    x * numerator / (1.0 + e)
}

/// SiLU, `x · sigmoid(x)` (SwiGLU's activation).
#[inline(always)]
pub(crate) fn silu(x: f32) -> f32 {
    times_sigmoid(x, x)
}

/// GELU with the tanh approximation (`gelu_pytorch_tanh`), `0.5 x (1 + tanh(u))` with
/// `u = sqrt(2/π) (x + 0.044715 x³)`, computed as the equal `x · sigmoid(2u)`: for
/// negative `x`, `1 + tanh(u)` in f32 loses digits to cancellation (candle's formula is
/// 1e-5 off at `x = -3` and gives 0 from about `x = -5.3`, where the value is still
/// -3e-8), while `sigmoid(2u)` keeps them.
#[inline(always)]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let u = SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x);
    times_sigmoid(x, 2.0 * u)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Relative error of `got` from `want` in f32 ulps of `want` (absolute below the
    /// smallest normal, where relative error means nothing for an activation).
    fn ulps(got: f32, want: f64) -> f64 {
        let scale = want.abs().max(f64::from(f32::MIN_POSITIVE));
        (f64::from(got) - want).abs() / (scale * f64::from(f32::EPSILON))
    }

    /// Inputs across the range activations see: dense near 0, sparse far out.
    fn inputs() -> impl Iterator<Item = f32> {
        (-40_000..=40_000).map(|i| {
            let t = i as f32 / 1000.0;
            t * t.abs()
        })
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

    /// `f` against `want` (f64): within `ulp_bound(x)` ulp from `low` up; below `low`,
    /// where the true values are tiny, within 1e-9 absolutely.
    fn check(f: fn(f32) -> f32, want: fn(f64) -> f64, low: f32, ulp_bound: fn(f32) -> f64) {
        for x in inputs() {
            let (got, want) = (f(x), want(f64::from(x)));
            if x >= low {
                let err = ulps(got, want);
                assert!(err <= ulp_bound(x), "x = {x}: {got} vs {want}, {err} ulp");
            } else {
                assert!(
                    (f64::from(got) - want).abs() <= 1e-9,
                    "x = {x}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn silu_matches_f64() {
        check(silu, |x| x / (1.0 + (-x).exp()), -80.0, |_| 4.0);
    }

    /// A few ulp where `x ≥ -1`. Further down the rounding of `u` (1 or 2 ulp) is
    /// amplified by `2|u|` in the exponent: about 30 ulp at `x = -5`, where the value is
    /// 1.5e-5 (and under 1e-30 by `x = -10`).
    #[test]
    fn gelu_tanh_matches_f64() {
        let want = |x: f64| {
            let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            // `0.5 x (1 + tanh(u))`, without its cancellation.
            x / (1.0 + (-2.0 * u).exp())
        };
        let bound = |x: f32| {
            let u = 0.8 * x * (1.0 + 0.045 * x * x);
            6.0 + f64::from(4.0 * u.abs())
        };
        check(gelu_tanh, want, -5.0, bound);
    }

    #[test]
    fn activations_at_the_edges() {
        for f in [silu, gelu_tanh] {
            assert_eq!(f(0.0), 0.0);
            assert_eq!(f(f32::INFINITY), f32::INFINITY);
            assert!(f(f32::NAN).is_nan());
            assert_eq!(f(-200.0), 0.0);
            assert_eq!(f(200.0), 200.0);
        }
    }
}
