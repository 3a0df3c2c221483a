//! The approximate product of one tile column (16 columns) with every row, and each
//! column's `[lo, hi]`, with AVX-512 VNNI: `vpdpbusd` multiplies 64 bytes by 64 bytes and
//! adds each lane's 4 products into its 32-bit sum.
//!
//! A Q8_0 tile keeps pair `j`'s quants as 16 bytes of input `j` then 16 of input `j + 16`
//! (lane `c` = column `c`), so 64 bytes are 4 inputs × 16 columns. One `vpermb` turns them
//! into 16 columns × 4 inputs, a VNNI lane's 4 bytes, and an xor makes them `q + 128`, the
//! instruction's unsigned operand; the row's 4 inputs of that chunk (`Quantized::bytes`,
//! signed) are its other operand, broadcast from memory by the instruction itself, and
//! each block's sums start from `Quantized::corr` (`-128 Σ r`), which takes the 128 off
//! again. Each block's integer sums then take their scale: `res = fma(Σ, d s, res)`; the
//! spread `E = fma(|d| Σ|q|, h, E)` is summed after, out of the loop's registers.
//!
//! The activations as the broadcast operand, rather than the quants: a separate broadcast
//! per row and chunk took as many instructions as the products (16 rows of SmolLM2's
//! output layer ran 1.32–1.37x the exact kernel's speed that way, 1.44–1.54x this way).

use std::arch::x86_64::{
    __m512, __m512i, _mm256_loadu_si256, _mm512_abs_ps, _mm512_add_ps, _mm512_cvtepi32_ps,
    _mm512_cvtph_ps, _mm512_dpbusd_epi32, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_loadu_si512,
    _mm512_mul_ps, _mm512_permutexvar_epi8, _mm512_set1_epi32, _mm512_set1_epi8, _mm512_set1_ps,
    _mm512_setzero_ps, _mm512_storeu_ps, _mm512_sub_ps, _mm512_xor_si512, _mm_prefetch,
    _MM_HINT_T0,
};

use super::super::blocks::Q8_0;
use super::{Column, Out, Quantized, Rows, CHUNKS};

/// A relative widening of `β` by `|Ã|`, for the f32 rounding of `Ã ∓ β` (2^-20: eight
/// times the two roundings it covers).
pub(super) const REL: f32 = 1.0 / (1 << 20) as f32;
/// An absolute widening, for products that fall below f32's normal range (each then
/// rounds by up to 2^-150 absolutely, not relatively).
pub(super) const TINY: f32 = 1e-30;

/// Proof that this CPU has the instructions the kernel uses.
#[derive(Clone, Copy)]
pub(super) struct Vnni(());

impl Vnni {
    pub(super) fn detect() -> Option<Self> {
        let all = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512vbmi");
        all.then_some(Vnni(()))
    }

    /// `rows` (at most [`super::GROUP`]) against `column`: row `rows.range.start + i`'s 16
    /// columns' bounds into `lo[i]` and `hi[i]`.
    pub(super) fn tile(self, column: Column, rows: Rows, out: Out) {
        let Rows { q, range: rows } = rows;
        let r0 = rows.start;
        // SAFETY: `detect` found the features (`self` is its proof).
        unsafe {
            match rows.len() {
                8 => group::<8>(column, q, r0, out),
                7 => group::<7>(column, q, r0, out),
                6 => group::<6>(column, q, r0, out),
                5 => group::<5>(column, q, r0, out),
                4 => group::<4>(column, q, r0, out),
                3 => group::<3>(column, q, r0, out),
                2 => group::<2>(column, q, r0, out),
                _ => group::<1>(column, q, r0, out),
            }
        }
    }
}

/// `vpermb`'s indices: byte `4c + t` of the result is byte `16 t + c` of 64 quant bytes
/// (input `t` of the chunk, column `c`).
const fn permutation() -> [u8; 64] {
    let mut p = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        p[i] = ((i % 4) * 16 + i / 4) as u8;
        i += 1;
    }
    p
}
static PERMUTATION: [u8; 64] = permutation();

/// Rows `r0 .. r0 + R` of `q` against `column`. The spreads are summed after the
/// products, so that only the products' accumulators (2 `R`) hold registers in the loop.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi")]
fn group<const R: usize>(column: Column, q: &Quantized, r0: usize, out: Out) {
    let nb = q.nb;
    let rows = r0 * nb..(r0 + R) * nb;
    let (scale, half, corr) = (&q.scale[rows.clone()], &q.half[rows.clone()], &q.corr[rows]);
    let bytes = &q.bytes[r0 * nb * CHUNKS..(r0 + R) * nb * CHUNKS];
    // SAFETY (every load): each reads within the slice it is given — 64 bytes of a tile's
    // 512 quant bytes (chunk c < 8), its 16 f16 scales, a spread's 16 f32, `PERMUTATION`'s
    // 64 bytes; the unchecked indices are below `R nb` (`r < R`, `b < nb`), times
    // `CHUNKS` for the bytes, the lengths of the slices taken above.
    unsafe {
        let perm = _mm512_loadu_si512(PERMUTATION.as_ptr().cast());
        let flip = _mm512_set1_epi8(-128);
        let mut res = [_mm512_setzero_ps(); R];
        for (b, tile) in column.tiles.iter().take(nb).enumerate() {
            if let Some(next) = column.next.get(b) {
                prefetch(next);
            }
            let quants = tile.quant_bytes_all().as_ptr().cast::<u8>();
            let mut acc: [__m512i; R] =
                std::array::from_fn(|r| _mm512_set1_epi32(*corr.get_unchecked(r * nb + b)));
            for c in 0..CHUNKS {
                let w = _mm512_loadu_si512(quants.add(64 * c).cast());
                // q + 128: the unsigned operand.
                let w = _mm512_xor_si512(_mm512_permutexvar_epi8(perm, w), flip);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = *bytes.get_unchecked((r * nb + b) * CHUNKS + c);
                    *acc = _mm512_dpbusd_epi32(*acc, w, _mm512_set1_epi32(x as i32));
                }
            }
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(tile.scale_bits().as_ptr().cast()));
            for (r, (res, acc)) in res.iter_mut().zip(acc).enumerate() {
                let ds = _mm512_mul_ps(d, _mm512_set1_ps(*scale.get_unchecked(r * nb + b)));
                *res = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), ds, *res);
            }
        }
        for (r, res) in res.into_iter().enumerate() {
            let mut spread = _mm512_setzero_ps();
            for (b, e) in column.spread.iter().take(nb).enumerate() {
                let h = _mm512_set1_ps(*half.get_unchecked(r * nb + b));
                spread = _mm512_fmadd_ps(_mm512_loadu_ps(e.as_ptr()), h, spread);
            }
            let [lo, hi] = ends(res, spread, column.margin);
            _mm512_storeu_ps(out.lo[r].as_mut_ptr(), lo);
            _mm512_storeu_ps(out.hi[r].as_mut_ptr(), hi);
        }
    }
}

/// Asks memory for every cache line of `tile`. The hardware prefetcher alone left the
/// kernel waiting on the first line of every tile (40% of its time); the next column's
/// tile `b`, asked for with this column's, is about 10 KB ahead. Speed only.
#[target_feature(enable = "avx512f")]
fn prefetch(tile: &Q8_0) {
    let start = std::ptr::from_ref(tile).cast::<i8>();
    for at in (0..size_of::<Q8_0>())
        .step_by(64)
        .chain([size_of::<Q8_0>() - 1])
    {
        // SAFETY: `at` is within the tile; a prefetch reads nothing into the program.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(start.add(at)) };
    }
}

/// `Ã ∓ β`, `β = fma(E, margin, |Ã| REL) + TINY`, as [`ends_scalar`] computes it.
#[target_feature(enable = "avx512f")]
fn ends(res: __m512, spread: __m512, margin: f32) -> [__m512; 2] {
    let slack = _mm512_mul_ps(_mm512_abs_ps(res), _mm512_set1_ps(REL));
    let beta = _mm512_fmadd_ps(spread, _mm512_set1_ps(margin), slack);
    let beta = _mm512_add_ps(beta, _mm512_set1_ps(TINY));
    [_mm512_sub_ps(res, beta), _mm512_add_ps(res, beta)]
}

/// [`ends`] of one column, the same operations.
#[cfg(test)]
pub(super) fn ends_scalar(res: f32, spread: f32, margin: f32) -> [f32; 2] {
    let beta = spread.mul_add(margin, res.abs() * REL) + TINY;
    [res - beta, res + beta]
}
