//! The kernel: which instruction set, and the loops over columns, rows and blocks.

use std::sync::OnceLock;

use super::blocks::Block;
#[cfg(target_arch = "x86_64")]
use super::simd::{Avx2, Avx512};
use super::simd::{Portable, Simd};
use super::{Half, LANES};

/// Bytes of dequantized weights, and of activation rows, that [`many_rows`] works on at
/// a time: the two together well inside a core's L2 cache. Speed only.
const PIECE_BYTES: usize = 128 << 10;

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

/// The columns `blocks.len() / nb` (`nb` blocks each) for the rows `x` (`2 * nb`
/// [`Half`]s each) into `out`: one piece per row, one sum per column, with the kernel
/// for `isa`.
pub(super) fn columns<B: Block>(
    blocks: &[B],
    nb: usize,
    x: &[Half],
    out: &mut [&mut [f32]],
    isa: Isa,
) {
    match isa {
        Isa::Portable => columns_portable(Portable, blocks, nb, x, out),
        // SAFETY: the token `t` exists only if the CPU has the features these
        // functions enable (see `simd`).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(t) => unsafe { columns_avx2(t, blocks, nb, x, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512(t) => unsafe { columns_avx512(t, blocks, nb, x, out) },
    }
}

/// The portable kernel (no `#[target_feature]`: it needs none).
fn columns_portable<B: Block>(
    t: Portable,
    blocks: &[B],
    nb: usize,
    x: &[Half],
    out: &mut [&mut [f32]],
) {
    match out {
        [row] => one_row::<_, B, 4>(t, blocks, nb, x, row),
        rows => many_rows::<_, B, 4, 1>(t, blocks, nb, x, rows),
    }
}

// The two entry functions below are the kernel's only `#[target_feature]` functions:
// everything they call is `#[inline(always)]` and inlines into them (see `simd`,
// "Inlining").

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn columns_avx2<B: Block>(t: Avx2, blocks: &[B], nb: usize, x: &[Half], out: &mut [&mut [f32]]) {
    // 4 columns x 2 ymm of lanes = 8 accumulators: as many FMA chains as two FMA
    // ports with 4-cycle latency need, leaving registers for x and w.
    match out {
        [row] => one_row::<_, B, 4>(t, blocks, nb, x, row),
        rows => many_rows::<_, B, 4, 1>(t, blocks, nb, x, rows),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn columns_avx512<B: Block>(
    t: Avx512,
    blocks: &[B],
    nb: usize,
    x: &[Half],
    out: &mut [&mut [f32]],
) {
    match out {
        // 8 columns: 8 accumulators, and registers to spare for dequantizing.
        [row] => one_row::<_, B, 8>(t, blocks, nb, x, row),
        // 4 rows x 4 columns x 1 zmm of lanes = 16 accumulators of the 32 registers:
        // each weight load feeds 4 FMAs, each activation load 4. (Fewer loads per FMA
        // than 2 x 8, and the buffer of 4 columns stays in L1 for larger k.)
        rows => many_rows::<_, B, 4, 4>(t, blocks, nb, x, rows),
    }
}

/// A single row (decode): the columns `C` at a time, each block dequantized straight
/// into registers, as there is no other row to share a buffer with. `x`: `2 * nb`
/// [`Half`]s; `out`: one sum per column.
#[inline(always)]
fn one_row<S: Simd, B: Block, const C: usize>(
    s: S,
    blocks: &[B],
    nb: usize,
    x: &[Half],
    out: &mut [f32],
) {
    let mut groups = blocks.chunks_exact(C * nb);
    let mut outs = out.chunks_exact_mut(C);
    for (group, out) in (&mut groups).zip(&mut outs) {
        row_in_registers::<S, B, C>(s, group, x, out);
    }
    for (col, out) in groups
        .remainder()
        .chunks_exact(nb)
        .zip(outs.into_remainder())
    {
        row_in_registers::<S, B, 1>(s, col, x, std::slice::from_mut(out));
    }
}

/// Several rows: the columns `C` at a time, each group dequantized once into a buffer
/// that the rows then run over, `R` at a time. `x`: the rows, `2 * nb` [`Half`]s each;
/// `out`: a piece per row, a sum per column. This and [`one_row`] perform, for each
/// output, the same per-lane `mul_add`s in the same order; only the loop nesting
/// differs.
///
/// For many rows (a long prompt) the work goes in pieces that stay in the L2 cache: the
/// groups of about [`PIECE_BYTES`] of dequantized columns at a time, swept by about as
/// many bytes of rows at a time, so the rows are read from memory once per piece of
/// columns rather than once per group.
#[inline(always)]
fn many_rows<S: Simd, B: Block, const C: usize, const R: usize>(
    s: S,
    blocks: &[B],
    nb: usize,
    x: &[Half],
    out: &mut [&mut [f32]],
) {
    let row_bytes = 2 * nb * std::mem::size_of::<Half>();
    let groups_per_piece = (PIECE_BYTES / (C * row_bytes)).max(1);
    let rows_per_piece = (PIECE_BYTES / row_bytes).next_multiple_of(R);
    // `w[g]`: group `g` of the piece; `w[g][2*b + h][c]`: half `h` of block `b` of its
    // column `c`.
    let groups = (blocks.len() / nb).div_ceil(C);
    let mut w: Vec<Vec<[Half; C]>> =
        vec![vec![[[0.0; LANES]; C]; 2 * nb]; groups.min(groups_per_piece)];
    for (p, piece) in blocks.chunks(groups_per_piece * C * nb).enumerate() {
        let filled = piece.len().div_ceil(C * nb);
        for (group, w) in piece.chunks(C * nb).zip(&mut w) {
            dequantize_group(s, group, nb, w);
        }
        let xs = x.chunks(rows_per_piece * 2 * nb);
        for (x, out) in xs.zip(out.chunks_mut(rows_per_piece)) {
            for (g, w) in w[..filled].iter().enumerate() {
                group_over_rows::<S, C, R>(s, w, x, out, (p * groups_per_piece + g) * C);
            }
        }
    }
}

/// The `C` columns `group` (`nb` blocks each, fewer columns at the end of the matrix)
/// into `w`, zeros past the last column (computed and thrown away).
#[inline(always)]
fn dequantize_group<S: Simd, B: Block, const C: usize>(
    s: S,
    group: &[B],
    nb: usize,
    w: &mut [[Half; C]],
) {
    for c in 0..C {
        match group.get(c * nb..(c + 1) * nb) {
            Some(col) => {
                for (b, pair) in col.iter().zip(w.chunks_exact_mut(2)) {
                    let [lo, hi] = b.dequantize(s);
                    s.store(lo, &mut pair[0][c]);
                    s.store(hi, &mut pair[1][c]);
                }
            }
            None => w.iter_mut().for_each(|h| h[c] = [0.0; LANES]),
        }
    }
}

/// The rows `x` over one buffered group `w`, `R` rows at a time and any left one by
/// one; the sums go to the columns `at ..` of `out`.
#[inline(always)]
fn group_over_rows<S: Simd, const C: usize, const R: usize>(
    s: S,
    w: &[[Half; C]],
    x: &[Half],
    out: &mut [&mut [f32]],
    at: usize,
) {
    let len = w.len();
    let done = out.len() / R * R;
    let (full, rest) = out.split_at_mut(done);
    for (r, out) in full.chunks_exact_mut(R).enumerate() {
        let sums = rows_over_buffer::<S, C, R>(s, &x[r * R * len..], w);
        scatter(&sums, out, at);
    }
    for (r, out) in rest.chunks_exact_mut(1).enumerate() {
        let sums = rows_over_buffer::<S, C, 1>(s, &x[(done + r) * len..], w);
        scatter(&sums, out, at);
    }
}

/// `R` rows (from the start of `x`) against the `C` buffered columns `w`.
#[inline(always)]
fn rows_over_buffer<S: Simd, const C: usize, const R: usize>(
    s: S,
    x: &[Half],
    w: &[[Half; C]],
) -> [[f32; C]; R] {
    let len = w.len();
    let rows: [&[Half]; R] = std::array::from_fn(|r| &x[r * len..][..len]);
    let mut acc = [[s.zero(); C]; R];
    for (i, wh) in w.iter().enumerate() {
        let mut xv = [s.zero(); R];
        for (v, row) in xv.iter_mut().zip(rows) {
            *v = s.load(&row[i]);
        }
        // Each weight load feeds all `R` rows.
        for (c, wc) in wh.iter().enumerate() {
            let wv = s.load(wc);
            for (ar, xr) in acc.iter_mut().zip(&xv) {
                ar[c] = s.mul_add(*xr, wv, ar[c]);
            }
        }
    }
    // Loops, not `array::map` with a closure: see `simd`, "Inlining".
    let mut sums = [[0.0; C]; R];
    for (sr, ar) in sums.iter_mut().zip(&acc) {
        for (sum, a) in sr.iter_mut().zip(ar) {
            *sum = s.fold(*a);
        }
    }
    sums
}

/// One row against `C` columns (`group`: their blocks, column after column), each
/// block dequantized straight into registers: with a single row there is nothing to
/// share a buffer with.
#[inline(always)]
fn row_in_registers<S: Simd, B: Block, const C: usize>(
    s: S,
    group: &[B],
    x: &[Half],
    out: &mut [f32],
) {
    let nb = group.len() / C;
    let cols: [&[B]; C] = std::array::from_fn(|c| &group[c * nb..(c + 1) * nb]);
    let x = &x[..2 * nb];
    let mut acc = [s.zero(); C];
    for b in 0..nb {
        let (lo, hi) = (s.load(&x[2 * b]), s.load(&x[2 * b + 1]));
        for (a, col) in acc.iter_mut().zip(cols) {
            let [wl, wh] = col[b].dequantize(s);
            *a = s.mul_add(lo, wl, *a);
            *a = s.mul_add(hi, wh, *a);
        }
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = s.fold(a);
    }
}

/// Writes `R` rows of `C` sums to the `R` rows `out` from column `at` on, as many as
/// fit (a last group may stand past the last column).
#[inline(always)]
fn scatter<const C: usize, const R: usize>(
    sums: &[[f32; C]; R],
    out: &mut [&mut [f32]],
    at: usize,
) {
    for (row, sum) in out.iter_mut().zip(sums) {
        match row[at..].first_chunk_mut::<C>() {
            Some(dst) => *dst = *sum,
            None => scatter_part(sum, &mut row[at..]),
        }
    }
}

/// The sums of a last group that fit in `dst`. Apart, so that LLVM does not merge the
/// fixed-size copy above with this one into a `memcpy` call in the hot loop.
#[cold]
#[inline(never)]
fn scatter_part(sum: &[f32], dst: &mut [f32]) {
    let n = dst.len();
    dst.copy_from_slice(&sum[..n]);
}
