//! The kernels of `kernels.rs` on AVX, the same bits: each product is rounded, then each
//! sum (Rust never fuses them), in the portable loops' order; only the speed differs.
//!
//! - [`dots8`] scores 8 keys side by side, each with its own 8-lane accumulator, folded
//!   as `fold` does. One key at a time, a key's 8 dependent additions wait on each
//!   other's latency (the query-key products were a quarter of a 512-token prompt's
//!   prefill); 8 keys overlap.
//! - [`weighted_sum`] keeps 64 output columns in 8 registers for a whole pass over the
//!   keys, where the portable loop keeps 16 (4 SSE2 registers).

use std::arch::x86_64::{
    __m256, _mm256_add_ps, _mm256_hadd_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_permute2f128_ps,
    _mm256_set1_ps, _mm256_setr_ps, _mm256_setzero_ps, _mm256_storeu_ps,
};

use super::kernels::{self, tail_dot, LANES};

/// Keys per call of [`dots8`].
pub(super) const KEYS: usize = 8;

/// Whether this CPU runs the functions here.
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx")
}

/// `dot(q, key)` for the 8 keys of `keys` (`8 * q.len()` values, key after key). Callers
/// check [`available`] first.
#[target_feature(enable = "avx")]
pub(super) fn dots8(q: &[f32], keys: &[f32]) -> [f32; KEYS] {
    let d = q.len();
    let (qc, qt) = q.as_chunks::<LANES>();
    let mut rows: [&[f32]; KEYS] = [&[]; KEYS];
    for (n, row) in rows.iter_mut().enumerate() {
        *row = &keys[n * d..(n + 1) * d];
    }
    let mut acc: [__m256; KEYS] = [_mm256_setzero_ps(); KEYS];
    for (c, x) in qc.iter().enumerate() {
        // SAFETY: `x` is 8 f32; the key chunk below is 8 f32 of a row of `d` (`c < d / 8`).
        let x = unsafe { _mm256_loadu_ps(x.as_ptr()) };
        for (a, row) in acc.iter_mut().zip(&rows) {
            let y = &row[c * LANES..(c + 1) * LANES];
            // SAFETY: `y` is 8 f32 (the slice above).
            let y = unsafe { _mm256_loadu_ps(y.as_ptr()) };
            *a = _mm256_add_ps(*a, _mm256_mul_ps(x, y));
        }
    }
    // A loop, not `rows.map`: the closure was not inlined (a call per 8 keys).
    let mut tails = [0f32; KEYS];
    for (tail, row) in tails.iter_mut().zip(&rows) {
        *tail = tail_dot(qt, &row[qc.len() * LANES..]);
    }
    fold8(acc, tails)
}

/// `fold(lanes, tail)` of 8 accumulators at once. `fold` sums lanes i and i + 4 (the two
/// halves of the register), then neighbouring pairs, then the two pairs, then the tail;
/// here the halves of two keys are added in one register, and two horizontal additions
/// do the pairs, leaving keys in the order 0, 2, 4, 6 | 1, 3, 5, 7.
#[target_feature(enable = "avx")]
fn fold8(acc: [__m256; KEYS], tails: [f32; KEYS]) -> [f32; KEYS] {
    let p01 = halves(acc[0], acc[1]);
    let p23 = halves(acc[2], acc[3]);
    let p45 = halves(acc[4], acc[5]);
    let p67 = halves(acc[6], acc[7]);
    let pairs = [_mm256_hadd_ps(p01, p23), _mm256_hadd_ps(p45, p67)];
    let sums = _mm256_hadd_ps(pairs[0], pairs[1]);
    let [t0, t1, t2, t3, t4, t5, t6, t7] = tails;
    let sums = _mm256_add_ps(sums, _mm256_setr_ps(t0, t2, t4, t6, t1, t3, t5, t7));
    let mut lanes = [0f32; KEYS];
    // SAFETY: `lanes` is 8 f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sums) };
    let [k0, k2, k4, k6, k1, k3, k5, k7] = lanes;
    [k0, k1, k2, k3, k4, k5, k6, k7]
}

/// `[a low, b low] + [a high, b high]`: lanes i and i + 4 of two keys.
#[target_feature(enable = "avx")]
#[inline]
fn halves(a: __m256, b: __m256) -> __m256 {
    _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(a, b),
        _mm256_permute2f128_ps::<0x31>(a, b),
    )
}

/// `kernels::weighted_sum`, the same bits. Callers check [`available`] first.
#[target_feature(enable = "avx")]
pub(super) fn weighted_sum(out: &mut [f32], weights: &[f32], values: &[f32]) {
    const WIDE: usize = 8;
    let d = out.len();
    let mut start = 0;
    while start + WIDE * LANES <= d {
        columns::<WIDE>(out, start, weights, values);
        start += WIDE * LANES;
    }
    while start + LANES <= d {
        columns::<1>(out, start, weights, values);
        start += LANES;
    }
    kernels::weighted_sum_from(out, start, weights, values);
}

/// The weighted sum of `N` registers' worth of columns from `start`.
#[target_feature(enable = "avx")]
#[inline]
fn columns<const N: usize>(out: &mut [f32], start: usize, weights: &[f32], values: &[f32]) {
    let d = out.len();
    let mut acc = [_mm256_setzero_ps(); N];
    for (j, &w) in weights.iter().enumerate() {
        let w = _mm256_set1_ps(w);
        let row = &values[j * d + start..][..N * LANES];
        for (n, a) in acc.iter_mut().enumerate() {
            // SAFETY: `row` holds N * 8 f32, so 8 from n * 8 are in it.
            let v = unsafe { _mm256_loadu_ps(row[n * LANES..].as_ptr()) };
            *a = _mm256_add_ps(*a, _mm256_mul_ps(w, v));
        }
    }
    let dst = &mut out[start..start + N * LANES];
    for (n, a) in acc.iter().enumerate() {
        // SAFETY: `dst` holds N * 8 f32, so 8 from n * 8 are in it.
        unsafe { _mm256_storeu_ps(dst[n * LANES..].as_mut_ptr(), *a) };
    }
}
