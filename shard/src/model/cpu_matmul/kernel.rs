//! The kernel: which instruction set, and the loops over columns, rows and blocks.

use std::sync::OnceLock;

use super::blocks::Block;
#[cfg(target_arch = "x86_64")]
use super::simd::{Avx2, Avx512};
use super::simd::{Portable, Simd};
use super::{Half, LANES};

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

/// Columns `blocks.len() / nb` into the tile `out` (`[m][cols]`), with the kernel for
/// `isa`.
pub(super) fn columns<B: Block>(
    blocks: &[B],
    nb: usize,
    x: &[Half],
    m: usize,
    out: &mut [f32],
    isa: Isa,
) {
    match isa {
        Isa::Portable => columns_kernel::<_, B, 4, 1>(Portable, blocks, nb, x, m, out),
        // SAFETY: the token `t` exists only if the CPU has the features these
        // functions enable (see `simd`).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(t) => unsafe { columns_avx2(t, blocks, nb, x, m, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512(t) => unsafe { columns_avx512(t, blocks, nb, x, m, out) },
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn columns_avx2<B: Block>(t: Avx2, blocks: &[B], nb: usize, x: &[Half], m: usize, out: &mut [f32]) {
    // 4 columns x 2 ymm of lanes = 8 accumulators: as many FMA chains as two FMA
    // ports with 4-cycle latency need, leaving registers for x and w.
    columns_kernel::<_, B, 4, 1>(t, blocks, nb, x, m, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn columns_avx512<B: Block>(
    t: Avx512,
    blocks: &[B],
    nb: usize,
    x: &[Half],
    m: usize,
    out: &mut [f32],
) {
    // 2 rows x 8 columns x 1 zmm of lanes = 16 accumulators of the 32 registers:
    // each weight load feeds two FMAs.
    columns_kernel::<_, B, 8, 2>(t, blocks, nb, x, m, out);
}

/// Walks the columns `C` at a time: dequantize the group once into `w`, then run the
/// rows over it `R` at a time (one row alone skips the buffer). `x`: `m` rows of
/// `2 * nb` [`Half`]s; `out`: `[m][cols]`. Every path below performs, for each output,
/// the same per-lane `mul_add`s in the same order; only the loop nesting differs.
#[inline(always)]
fn columns_kernel<S: Simd, B: Block, const C: usize, const R: usize>(
    s: S,
    blocks: &[B],
    nb: usize,
    x: &[Half],
    m: usize,
    out: &mut [f32],
) {
    if m == 1 {
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
        return;
    }
    // `w[2*b + h][c]`: half `h` of block `b` of column `c`.
    let mut w: Vec<[Half; C]> = vec![[[0.0; LANES]; C]; 2 * nb];
    let tc = blocks.len() / nb;
    for (g, group) in blocks.chunks(C * nb).enumerate() {
        let ncols = group.len() / nb;
        for c in 0..C {
            match group.get(c * nb..(c + 1) * nb) {
                Some(col) => {
                    for (b, pair) in col.iter().zip(w.chunks_exact_mut(2)) {
                        let [lo, hi] = b.dequantize(s);
                        s.store(lo, &mut pair[0][c]);
                        s.store(hi, &mut pair[1][c]);
                    }
                }
                // Past the last column: zeros, computed and thrown away.
                None => w.iter_mut().for_each(|h| h[c] = [0.0; LANES]),
            }
        }
        let mut r = 0;
        while r < m {
            if r + R <= m {
                let sums = rows_over_buffer::<S, C, R>(s, &x[r * 2 * nb..], &w);
                scatter(&sums, &mut out[r * tc + g * C..], tc, ncols);
                r += R;
            } else {
                let sums = rows_over_buffer::<S, C, 1>(s, &x[r * 2 * nb..], &w);
                scatter(&sums, &mut out[r * tc + g * C..], tc, ncols);
                r += 1;
            }
        }
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
    let rows: [&[Half]; R] = std::array::from_fn(|i| &x[i * len..(i + 1) * len]);
    let mut acc = [[s.zero(); C]; R];
    for (i, wh) in w.iter().enumerate() {
        for (ar, row) in acc.iter_mut().zip(rows) {
            let xv = s.load(&row[i]);
            for (a, wc) in ar.iter_mut().zip(wh) {
                *a = s.mul_add(xv, s.load(wc), *a);
            }
        }
    }
    acc.map(|ar| ar.map(|a| fold(s, a)))
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
        *o = fold(s, a);
    }
}

/// Writes `R` rows of `ncols` sums to `out`, whose rows are `stride` apart.
#[inline(always)]
fn scatter<const C: usize, const R: usize>(
    sums: &[[f32; C]; R],
    out: &mut [f32],
    stride: usize,
    ncols: usize,
) {
    for (i, row) in sums.iter().enumerate() {
        out[i * stride..i * stride + ncols].copy_from_slice(&row[..ncols]);
    }
}

#[inline(always)]
fn fold<S: Simd>(s: S, a: S::V) -> f32 {
    let mut lanes = [0.0; LANES];
    s.store(a, &mut lanes);
    fold_lanes(lanes)
}

/// The fixed lane reduction: 16 → 8 → 4 → 2 → 1 by `v[l] += v[l + width]`.
#[inline(always)]
pub(super) fn fold_lanes(mut v: Half) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            v[l] += v[l + width];
        }
        width /= 2;
    }
    v[0]
}
