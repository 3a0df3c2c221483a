//! The query-key products of `dot` on AVX: 8 keys side by side, each with its
//! own 8-lane accumulator, multiplied and added exactly as the portable loop does (a
//! rounded product, then a rounded sum: Rust never fuses them), and folded by the same
//! `fold`. So the scores are the same bits; only the speed differs. One key at a
//! time, each key's 8 dependent additions wait on each other's latency (the query-key
//! products were a quarter of a 512-token prompt's prefill); 8 keys overlap.

use std::arch::x86_64::{
    __m256, _mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_setzero_ps, _mm256_storeu_ps,
};

use super::{fold, LANES};

/// Keys per call of [`dots8`].
pub(super) const KEYS: usize = 8;

/// Whether this CPU runs [`dots8`].
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
    let mut out = [0f32; KEYS];
    for ((o, a), row) in out.iter_mut().zip(&acc).zip(&rows) {
        let mut lanes = [0f32; LANES];
        // SAFETY: `lanes` is 8 f32.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), *a) };
        let mut tail = 0f32;
        for (x, y) in qt.iter().zip(&row[qc.len() * LANES..]) {
            tail += x * y;
        }
        *o = fold(lanes, tail);
    }
    out
}
