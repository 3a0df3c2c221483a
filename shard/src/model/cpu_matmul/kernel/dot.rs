//! The arithmetic of one output: [`dot`], and where it takes the weights from.

use super::super::blocks::{first_input, At, Factors, Tile, TileColumns};
use super::super::input::half_sum;
use super::super::simd::Simd;
use super::super::{Half, LANES};
use super::ahead::{Next, RowGroup};

/// Some tile columns of a matrix, as [`dot`] takes them: where it takes a tile's factors
/// and quants from (the tiles themselves, unpacked as it goes, [`Packed`]; or a buffer
/// the columns were unpacked into once, `unpacked`), which columns they are, and which
/// come next. Both sources give the same values, so the source changes speed only.
pub(super) trait Source<S: Simd, T: Tile> {
    /// One tile (or its unpacked values), found once per tile.
    type Block<'a>: Copy
    where
        Self: 'a;
    /// Tiles per tile column.
    fn nb(&self) -> usize;
    /// The matrix's index of the first of these tile columns.
    fn column(&self) -> usize;
    /// The tile columns to prefetch while these are worked on.
    fn next(&self) -> Next<'_, T>;
    /// Tile `b` of the `c`-th tile column.
    fn block(&self, c: usize, b: usize) -> Self::Block<'_>;
    /// Part `p`'s factors.
    fn factors(s: S, block: Self::Block<'_>, p: usize) -> Factors<S::V>;
    /// The quants of pair `at`.
    fn quants(s: S, block: Self::Block<'_>, at: At) -> [S::V; 2];
}

/// Tile columns' tiles (column after column, `nb` each), unpacked as [`dot`] goes.
pub(super) struct Packed<'a, T> {
    tiles: &'a [T],
    nb: usize,
    g: usize,
    next: Next<'a, T>,
}

impl<'a, T: Tile> Packed<'a, T> {
    /// The `count` tile columns of `m` from `g` on.
    #[inline(always)]
    pub fn at(m: TileColumns<'a, T>, g: usize, count: usize) -> Self {
        Packed {
            tiles: m.group(g, count),
            nb: m.nb,
            g,
            next: Next::after(m, g, count),
        }
    }
}

impl<S: Simd, T: Tile> Source<S, T> for Packed<'_, T> {
    type Block<'a>
        = &'a T
    where
        Self: 'a;
    #[inline(always)]
    fn nb(&self) -> usize {
        self.nb
    }
    #[inline(always)]
    fn column(&self) -> usize {
        self.g
    }
    #[inline(always)]
    fn next(&self) -> Next<'_, T> {
        self.next
    }
    #[inline(always)]
    fn block(&self, c: usize, b: usize) -> &T {
        &self.tiles[c * self.nb + b]
    }
    #[inline(always)]
    fn factors(s: S, block: &T, p: usize) -> Factors<S::V> {
        block.factors(s, p)
    }
    #[inline(always)]
    fn quants(s: S, block: &T, at: At) -> [S::V; 2] {
        block.quants(s, at)
    }
}

/// `R` rows (each in chunks of 16 inputs, with its run sums) against `C` tile columns
/// (their factors and quants from `src`), prefetching row group `who`'s share of the
/// columns after them as it goes (`ahead`).
///
/// The arithmetic of one output, and only this: an f32 accumulator `acc` starts at `0.0`.
/// For each tile in order, for each part `p`: a sum per half of the part starts at `0.0`
/// (one sum for both halves without a split, [`Tile::SPLIT`]); for each pair `j` it takes
/// `fma(x[i], q[i], sum)` and then `fma(x[i + SPAN], q[i + SPAN], sum')` (`sum'` the high
/// half's sum, or the same one), `i` = the tile's first input + `first_input(p) + j`, `q`
/// the quants. Then, half after half (or once): `acc = fma(a, sum, acc)`, and with an
/// offset `acc = fma(b, X, acc)`, `a` and `b` the half's factors and `X` the activations'
/// sum over the half (`input::half_sum` of the run sums, the two halves' added for one
/// sum). `R`, `C`, the other rows and columns, the source and the instruction set change
/// none of it: lanes are columns, so no lane ever holds two rows' or two columns' sums.
#[inline(always)]
pub(super) fn dot<S: Simd, T: Tile, Src: Source<S, T>, const R: usize, const C: usize>(
    s: S,
    src: &Src,
    rows: &[(&[Half], &[f32]); R],
    who: RowGroup,
) -> [[S::V; C]; R] {
    let chunks = T::INPUTS / LANES;
    let mut ahead = src.next().share(who);
    // The outputs' accumulators, changed once per part. With several rows they do not
    // fit in registers beside the sums, and where a part ends in more than one
    // multiply-add per accumulator (an offset, a split) LLVM, keeping them as values,
    // spilled and shuffled them around every part. Kept in memory behind `black_box`
    // (opaque to the optimizer, so each update is one load, the multiply-adds and one
    // store) the AVX2 kernel ran 3–5% faster at 16 and 64 rows (Q4_1 packed and wide,
    // Q4_K), 8–10% (Q6_K); Q8_0's single multiply-add per part lost 2% that way, and one
    // row's few accumulators fit in registers. Speed only: the arithmetic is the same.
    let mut acc_memory: [[Half; C]; R] = [[[0.0; LANES]; C]; R];
    let accm = if R > 1 && (T::OFFSET || T::SPLIT) {
        std::hint::black_box(&mut acc_memory)
    } else {
        &mut acc_memory
    };
    for b in 0..src.nb() {
        ahead.step(b);
        let mut tb: [Src::Block<'_>; C] = [src.block(0, b); C];
        for (c, t) in tb.iter_mut().enumerate() {
            *t = src.block(c, b);
        }
        let mut xb: [&[Half]; R] = [&[]; R];
        for (x, row) in xb.iter_mut().zip(rows) {
            *x = &row.0[b * chunks..(b + 1) * chunks];
        }
        for p in 0..T::PARTS {
            let mut factors = [Src::factors(s, tb[0], p); C];
            for (f, t) in factors.iter_mut().zip(&tb).skip(1) {
                *f = Src::factors(s, *t, p);
            }
            let first = first_input::<T>(p) / LANES;
            let hi_sum = usize::from(T::SPLIT);
            let mut sums = [[[s.zero(); 2]; C]; R];
            for q in 0..T::PAIRS / LANES {
                // The 16 inputs of these 16 pairs, and their partners `SPAN` on.
                let (lo, hi) = (first + q, first + q + T::SPAN / LANES);
                let mut xl: [&Half; R] = [&xb[0][lo]; R];
                let mut xh: [&Half; R] = [&xb[0][hi]; R];
                for ((l, h), x) in xl.iter_mut().zip(&mut xh).zip(&xb) {
                    *l = &x[lo];
                    *h = &x[hi];
                }
                for t in 0..LANES {
                    let j = q * LANES + t;
                    for (c, tile) in tb.iter().enumerate() {
                        let [ql, qh] = Src::quants(s, *tile, At { part: p, pair: j });
                        for (sum, (l, h)) in sums.iter_mut().zip(xl.iter().zip(&xh)) {
                            let sum = &mut sum[c];
                            sum[0] = s.mul_add(s.splat(l[t]), ql, sum[0]);
                            sum[hi_sum] = s.mul_add(s.splat(h[t]), qh, sum[hi_sum]);
                        }
                    }
                }
            }
            let start = b * T::INPUTS + first_input::<T>(p);
            for ((row_acc, sums), row) in accm.iter_mut().zip(&sums).zip(rows) {
                let (lo, hi) = if T::OFFSET {
                    (
                        half_sum(row.1, start, T::PAIRS),
                        half_sum(row.1, start + T::SPAN, T::PAIRS),
                    )
                } else {
                    (0.0, 0.0)
                };
                let halves = if T::SPLIT { [lo, hi] } else { [lo + hi, 0.0] };
                for ((slot, sums), f) in row_acc.iter_mut().zip(sums).zip(&factors) {
                    let mut acc = s.load(slot);
                    for h in 0..=hi_sum {
                        acc = s.mul_add(f.a[h], sums[h], acc);
                        if T::OFFSET {
                            acc = s.mul_add(f.b[h], s.splat(halves[h]), acc);
                        }
                    }
                    s.store(acc, slot);
                }
            }
        }
    }
    let mut acc = [[s.zero(); C]; R];
    for (row_acc, row_memory) in acc.iter_mut().zip(accm.iter()) {
        for (acc, slot) in row_acc.iter_mut().zip(row_memory) {
            *acc = s.load(slot);
        }
    }
    acc
}
