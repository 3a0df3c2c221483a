//! The kernel: which instruction set, and the loops over rows, tiles and inputs.

use std::sync::OnceLock;

use super::blocks::{Tile, TILE};
#[cfg(target_arch = "x86_64")]
use super::simd::{Avx2, Avx512};
use super::simd::{Portable, Simd};
use super::{Half, QK};

/// Bytes of activation rows swept over one group of tiles before the next group: they
/// stay in L2 while the group's weights stay in L1. Speed only.
const PIECE_BYTES: usize = 256 << 10;

/// The kernel variant, fixed once per process. Every variant computes the same bits
/// (see the module docs); they differ in speed only. The x86 variants carry the token
/// that proves their instructions exist.
#[derive(Clone, Copy)]
pub(super) enum Isa {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2(Avx2),
    #[cfg(target_arch = "x86_64")]
    Avx512(Avx512),
}

impl std::fmt::Debug for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Isa::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2(_) => "avx2",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512(_) => "avx512",
        })
    }
}

pub(super) fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(t) = Avx512::detect() {
                return Isa::Avx512(t);
            }
            if let Some(t) = Avx2::detect() {
                return Isa::Avx2(t);
            }
        }
        Isa::Portable
    })
}

/// The tile columns `tiles.len() / nb` (`nb` tiles each) for the rows `x` (`32 * nb`
/// f32 each) into `out`: one piece per row, one sum per column (the last tile may cover
/// fewer columns than 16), with the kernel for `isa`.
pub(super) fn columns<T: Tile>(
    tiles: &[T],
    nb: usize,
    x: &[f32],
    out: &mut [&mut [f32]],
    isa: Isa,
) {
    match isa {
        Isa::Portable => columns_portable(Portable, tiles, nb, x, out),
        // SAFETY: the token `t` exists only if the CPU has the features these
        // functions enable (see `simd`).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(t) => unsafe { columns_avx2(t, tiles, nb, x, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512(t) => unsafe { columns_avx512(t, tiles, nb, x, out) },
    }
}

/// The portable kernel (no `#[target_feature]`: it needs none).
fn columns_portable<T: Tile>(
    t: Portable,
    tiles: &[T],
    nb: usize,
    x: &[f32],
    out: &mut [&mut [f32]],
) {
    sweep::<_, T, 4, 1, 2>(t, tiles, nb, x, out)
}

// The two entry functions below are the kernel's only `#[target_feature]` functions:
// everything they call is `#[inline(always)]` and inlines into them (see `simd`,
// "Inlining").

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn columns_avx2<T: Tile>(t: Avx2, tiles: &[T], nb: usize, x: &[f32], out: &mut [&mut [f32]]) {
    // A vector is 2 ymm: 2 rows x 2 tiles = 8 accumulators, as many FMA chains as two
    // FMA ports with 4-cycle latency need, leaving registers for the weights; one row
    // gets 4 tiles for the same 8 chains.
    sweep::<_, T, 2, 2, 4>(t, tiles, nb, x, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn columns_avx512<T: Tile>(t: Avx512, tiles: &[T], nb: usize, x: &[f32], out: &mut [&mut [f32]]) {
    // 8 rows x 2 tiles = 16 accumulators of the 32 registers: each dequantized weight
    // vector feeds 8 FMAs. One row: 8 tiles, 8 independent chains.
    sweep::<_, T, 8, 2, 8>(t, tiles, nb, x, out)
}

/// All rows of `out` against all tiles: rows `R` at a time against `C` tiles at a time,
/// the rows left over one by one against `C1` tiles at a time (then fewer, for the tiles
/// left over). Every output is the same chain of multiply-adds whichever path computes
/// it (see [`dot`]); the paths differ in speed only.
///
/// The rows go in pieces of about [`PIECE_BYTES`]; each piece is swept over every group
/// of tiles in turn, so a group's weights are read from memory once per piece and then
/// from L1, and the piece's rows from L2.
#[inline(always)]
fn sweep<S: Simd, T: Tile, const R: usize, const C: usize, const C1: usize>(
    s: S,
    tiles: &[T],
    nb: usize,
    x: &[f32],
    out: &mut [&mut [f32]],
) {
    let k = nb * QK;
    let rows_per_piece = (PIECE_BYTES / (4 * k)).max(R) / R * R;
    for (p, out) in out.chunks_mut(rows_per_piece).enumerate() {
        let x = &x[p * rows_per_piece * k..];
        let together = out.len() / R * R;
        let (batched, single) = out.split_at_mut(together);
        let g = span::<S, T, R, C>(s, tiles, nb, x, batched, 0);
        span::<S, T, R, 1>(s, tiles, nb, x, batched, g);
        let x = &x[together * k..];
        let g = span::<S, T, 1, C1>(s, tiles, nb, x, single, 0);
        let g = span::<S, T, 1, 4>(s, tiles, nb, x, single, g);
        let g = span::<S, T, 1, 2>(s, tiles, nb, x, single, g);
        span::<S, T, 1, 1>(s, tiles, nb, x, single, g);
    }
}

/// The tile columns from `g0` on, `C` at a time while `C` are left, for the rows of
/// `out` (`R` at a time; their count is a multiple of `R`); returns the first tile
/// column not done.
#[inline(always)]
fn span<S: Simd, T: Tile, const R: usize, const C: usize>(
    s: S,
    tiles: &[T],
    nb: usize,
    x: &[f32],
    out: &mut [&mut [f32]],
    g0: usize,
) -> usize {
    let k = nb * QK;
    let groups = tiles.len() / nb;
    let mut g = g0;
    while g + C <= groups {
        let group = &tiles[g * nb..(g + C) * nb];
        for (i, out) in out.chunks_exact_mut(R).enumerate() {
            let mut rows: [&[[f32; QK]]; R] = [&[]; R];
            for (r, row) in rows.iter_mut().enumerate() {
                let at = (i * R + r) * k;
                *row = x[at..at + k].as_chunks::<QK>().0;
            }
            let acc = dot::<S, T, R, C>(s, group, nb, &rows);
            for (row, acc) in out.iter_mut().zip(&acc) {
                for (c, v) in acc.iter().enumerate() {
                    store(s, *v, row, (g + c) * TILE);
                }
            }
        }
        g += C;
    }
    g
}

/// `R` rows against `C` tile columns (`group`: their tiles, column after column).
///
/// The arithmetic of one output, and only this: one f32 accumulator starts at `0.0`; for
/// each block `b` of 32 inputs in order, for `j = 0..16`, it takes
/// `fma(x[32b + j], w[32b + j], acc)` and then `fma(x[32b + 16 + j], w[32b + 16 + j],
/// acc)`. `R`, `C`, the other rows and columns and the instruction set change none of it:
/// lanes are columns, so no lane ever holds two rows' or two columns' sums.
#[inline(always)]
fn dot<S: Simd, T: Tile, const R: usize, const C: usize>(
    s: S,
    group: &[T],
    nb: usize,
    rows: &[&[[f32; QK]]; R],
) -> [[S::V; C]; R] {
    let mut acc = [[s.zero(); C]; R];
    for b in 0..nb {
        let mut xb: [&[f32; QK]; R] = [&[0.0; QK]; R];
        for (x, row) in xb.iter_mut().zip(rows) {
            *x = &row[b];
        }
        let mut tb: [&T; C] = [&group[b]; C];
        let mut scales = [[s.zero(); 2]; C];
        for (c, (t, sc)) in tb.iter_mut().zip(&mut scales).enumerate() {
            *t = &group[c * nb + b];
            *sc = t.scales(s);
        }
        for j in 0..QK / 2 {
            for (c, t) in tb.iter().enumerate() {
                let [lo, hi] = t.pair(s, &scales[c], j);
                for (a, x) in acc.iter_mut().zip(&xb) {
                    a[c] = s.mul_add(s.splat(x[j]), lo, a[c]);
                    a[c] = s.mul_add(s.splat(x[j + QK / 2]), hi, a[c]);
                }
            }
        }
    }
    acc
}

/// Writes the 16 sums `v` to `row[at..]`, as many as fit (the last tile of a matrix may
/// stand past its last column).
#[inline(always)]
fn store<S: Simd>(s: S, v: S::V, row: &mut [f32], at: usize) {
    match row.get_mut(at..).and_then(|r| r.first_chunk_mut::<TILE>()) {
        Some(dst) => s.store(v, dst),
        None => {
            let mut h: Half = [0.0; TILE];
            s.store(v, &mut h);
            store_part(&h, row.get_mut(at..).unwrap_or_default());
        }
    }
}

/// The sums of a last tile that fit in `dst`. Apart, so that LLVM does not merge the
/// fixed-size store above with this copy into a `memcpy` call in the hot loop.
#[cold]
#[inline(never)]
fn store_part(sum: &Half, dst: &mut [f32]) {
    let n = dst.len().min(TILE);
    dst[..n].copy_from_slice(&sum[..n]);
}
