//! The kernels of `kernels.rs` on AVX, the same bits: each product is rounded, then each
//! sum (Rust never fuses them), in the portable loops' order; only the speed differs.
//!
//! - [`dots`] scores several keys side by side, each with its own 8-lane accumulator,
//!   folded as `fold` does. One key at a time, a key's 8 dependent additions wait on each
//!   other's latency (the query-key products were a quarter of a 512-token prompt's
//!   prefill); 8 keys overlap. Up to 4 queries (heads of one KV head) share the keys.
//! - [`weighted_sums`] keeps 64 output columns in 8 registers for a whole pass over the
//!   keys, where the portable loop keeps 16 (4 SSE2 registers); several heads' rows share
//!   each value loaded.

use std::arch::x86_64::{
    __m256, _mm256_add_ps, _mm256_hadd_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_permute2f128_ps,
    _mm256_set1_ps, _mm256_setr_ps, _mm256_setzero_ps, _mm256_storeu_ps,
};

use super::kernels::{self, tail_dot, LANES};

/// Products a call of [`dots`] folds: queries times keys.
pub(super) const PAIRS: usize = 8;

/// Whether this CPU runs the functions here.
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx")
}

/// `dot(q, key)` for each query of `qs` and each of the `K` keys of `keys` (`K * d`
/// values, key after key, `d` the queries' length), `H * K` = [`PAIRS`]: `[h][k]` is query
/// `h` against key `k`. Several queries of one KV head (a row's heads that share it) take
/// each chunk of a key from one load: the keys come from L2 at a long context, and one
/// query a call read a key's chunk per 8 multiply-adds. Callers check [`available`] first.
#[target_feature(enable = "avx")]
pub(super) fn dots<const H: usize, const K: usize>(
    qs: &[&[f32]; H],
    keys: &[f32],
) -> [[f32; K]; H] {
    const { assert!(H * K == PAIRS) };
    dots_in(qs, keys)
}

/// [`dots`] with any multiple of [`PAIRS`] accumulators (`H * K`), inlined into the
/// caller's instruction set: AVX has registers for 8 beside the chunks loaded, AVX-512
/// for 16 (`avx512::dots`). Each accumulator is `kernels::dot`'s for its pair.
#[inline(always)]
pub(super) fn dots_in<const H: usize, const K: usize>(
    qs: &[&[f32]; H],
    keys: &[f32],
) -> [[f32; K]; H] {
    const { assert!((H * K).is_multiple_of(PAIRS)) };
    let d = qs[0].len();
    let mut rows: [&[f32]; K] = [&[]; K];
    for (n, row) in rows.iter_mut().enumerate() {
        *row = &keys[n * d..(n + 1) * d];
    }
    // SAFETY (every intrinsic here): the caller's `#[target_feature]` enables AVX, and
    // the loads read 8 f32 of a query or key of `d` at a chunk that ends by `d`.
    unsafe {
        // `acc[h][k]`: query h against key k.
        let mut acc = [[_mm256_setzero_ps(); K]; H];
        let chunks = d / LANES;
        for c in 0..chunks {
            let at = c * LANES..(c + 1) * LANES;
            let mut xs = [_mm256_setzero_ps(); H];
            for (x, q) in xs.iter_mut().zip(qs) {
                *x = _mm256_loadu_ps(q[at.clone()].as_ptr());
            }
            for (k, row) in rows.iter().enumerate() {
                let y = _mm256_loadu_ps(row[at.clone()].as_ptr());
                for (acc, x) in acc.iter_mut().zip(&xs) {
                    acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(*x, y));
                }
            }
        }
        // 8 pairs at a time through `fold8`, with their tails. Loops, not `map`s: the
        // closure was not inlined (a call per 8 keys).
        let mut out = [[0f32; K]; H];
        let mut lanes = [_mm256_setzero_ps(); PAIRS];
        let mut tails = [0f32; PAIRS];
        for n in (0..H * K).step_by(PAIRS) {
            for i in 0..PAIRS {
                let (h, k) = ((n + i) / K, (n + i) % K);
                lanes[i] = acc[h][k];
                tails[i] = tail_dot(&qs[h][chunks * LANES..], &rows[k][chunks * LANES..]);
            }
            for (i, v) in fold8(lanes, tails).into_iter().enumerate() {
                out[(n + i) / K][(n + i) % K] = v;
            }
        }
        out
    }
}

/// `fold(lanes, tail)` of 8 accumulators at once, each on its own. `fold` sums lanes i
/// and i + 4 (the two halves of the register), then neighbouring pairs, then the two
/// pairs, then the tail; here the halves of two accumulators are added in one register,
/// and two horizontal additions do the pairs, leaving them in the order 0, 2, 4, 6 | 1,
/// 3, 5, 7.
#[target_feature(enable = "avx")]
fn fold8(acc: [__m256; PAIRS], tails: [f32; PAIRS]) -> [f32; PAIRS] {
    let p01 = halves(acc[0], acc[1]);
    let p23 = halves(acc[2], acc[3]);
    let p45 = halves(acc[4], acc[5]);
    let p67 = halves(acc[6], acc[7]);
    let pairs = [_mm256_hadd_ps(p01, p23), _mm256_hadd_ps(p45, p67)];
    let sums = _mm256_hadd_ps(pairs[0], pairs[1]);
    let [t0, t1, t2, t3, t4, t5, t6, t7] = tails;
    let sums = _mm256_add_ps(sums, _mm256_setr_ps(t0, t2, t4, t6, t1, t3, t5, t7));
    let mut lanes = [0f32; PAIRS];
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

/// `kernels::weighted_sum` for each of `H` weight rows over the same `values`: row `h`
/// of `out` (`H` rows of `values`' width) from `weights[h]`, the same bits as alone. The
/// heads of a row that share a KV head take each value from one load, as [`dots`] does;
/// `N` registers of columns per pass, `H * N` accumulators. Callers check [`available`]
/// first.
#[target_feature(enable = "avx")]
pub(super) fn weighted_sums<const H: usize, const N: usize>(
    out: &mut [f32],
    weights: &[&[f32]; H],
    values: &[f32],
) {
    let d = out.len() / H;
    let mut start = 0;
    while start + N * LANES <= d {
        columns::<H, N>(out, start, weights, values);
        start += N * LANES;
    }
    while start + LANES <= d {
        columns::<H, 1>(out, start, weights, values);
        start += LANES;
    }
    for (row, w) in out.chunks_exact_mut(d).zip(weights) {
        kernels::weighted_sum_from(row, start, w, values);
    }
}

/// The weighted sums of `N` registers' worth of columns from `start`, for each of the `H`
/// rows of `out`.
#[target_feature(enable = "avx")]
#[inline]
fn columns<const H: usize, const N: usize>(
    out: &mut [f32],
    start: usize,
    weights: &[&[f32]; H],
    values: &[f32],
) {
    let d = out.len() / H;
    let mut acc = [[_mm256_setzero_ps(); N]; H];
    let keys = weights[0].len();
    for j in 0..keys {
        let row = &values[j * d + start..][..N * LANES];
        let mut vs = [_mm256_setzero_ps(); N];
        for (n, v) in vs.iter_mut().enumerate() {
            // SAFETY: `row` holds N * 8 f32, so 8 from n * 8 are in it.
            *v = unsafe { _mm256_loadu_ps(row[n * LANES..].as_ptr()) };
        }
        for (acc, w) in acc.iter_mut().zip(weights) {
            let w = _mm256_set1_ps(w[j]);
            for (a, v) in acc.iter_mut().zip(&vs) {
                *a = _mm256_add_ps(*a, _mm256_mul_ps(w, *v));
            }
        }
    }
    for (acc, row) in acc.iter().zip(out.chunks_exact_mut(d)) {
        let dst = &mut row[start..start + N * LANES];
        for (n, a) in acc.iter().enumerate() {
            // SAFETY: `dst` holds N * 8 f32, so 8 from n * 8 are in it.
            unsafe { _mm256_storeu_ps(dst[n * LANES..].as_mut_ptr(), *a) };
        }
    }
}
