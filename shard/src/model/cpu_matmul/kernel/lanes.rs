//! Many rows: the vector lanes hold 16 rows of one column, not 16 columns of one row.
//!
//! The other kernels give each lane a column: every quant vector they unpack is widened
//! to f32 (two instructions for 16 quants) and feeds one multiply-add per row of a group,
//! 8 at most, so on AVX-512 a fifth of the vector instructions are widening, not
//! arithmetic, and the products ran at 55–70% of the FMA ports' peak. Here a tile column
//! is widened once (a chunk at a time) into a buffer of f32 (`Column`), and each
//! multiply-add takes one quant from it as a broadcast operand of the instruction itself
//! (a load, no arithmetic) against one input of 16 rows (`input::Lanes`): nothing but
//! multiply-adds in the loop, and the widening, once per tile column and piece of rows,
//! costs 2 instructions per 16 multiply-adds at 16 rows and less with more. The
//! multiply-adds are `Simd::mul_add_each` (inline assembly on AVX-512: see there why).
//!
//! The arithmetic is [`super::dot`]'s, output by output: each lane's sums take the same
//! multiply-adds in the same order, then the same factors and offsets, so every output
//! has the same bits whichever kernel computes it (the tests check it).

use std::ops::Range;

use super::super::blocks::{first_input, At, Tile, TileColumns, TILE};
use super::super::input::{half_sum_lanes, Lanes};
use super::super::simd::Simd;
use super::super::{Line, Out, LANES};
use super::ahead::prefetch;
use super::PIECE_BYTES;

/// Some tiles of a tile column widened to f32: each pair's quants (`[low input, high
/// input]`, lane `c` = column `c`), tile after tile, part after part; each part's factors
/// (`a` of the low and high halves, then `b` of each). Lines of their own, so that no
/// vector straddles two.
struct Column {
    quants: Vec<[Line; 2]>,
    factors: Vec<[Line; 4]>,
}

impl Column {
    /// A buffer for `tiles` tiles of `T`.
    fn new<T: Tile>(tiles: usize) -> Self {
        Column {
            quants: vec![[Line::ZERO; 2]; tiles * T::PARTS * T::PAIRS],
            factors: vec![[Line::ZERO; 4]; tiles * T::PARTS],
        }
    }

    /// Widens `tiles` (at most as many as the buffer was made for) into it.
    #[inline(always)]
    fn fill<S: Simd, T: Tile>(&mut self, s: S, tiles: &[T]) {
        let mut quants = self.quants.iter_mut();
        let mut factors = self.factors.iter_mut();
        for tile in tiles {
            for part in 0..T::PARTS {
                let f = tile.factors(s, part);
                if let Some(out) = factors.next() {
                    for (v, out) in [f.a[0], f.a[1], f.b[0], f.b[1]].into_iter().zip(out) {
                        s.store(v, &mut out.0);
                    }
                }
                for pair in 0..T::PAIRS {
                    let [lo, hi] = tile.quants(s, At { part, pair });
                    if let Some([l, h]) = quants.next() {
                        s.store(lo, &mut l.0);
                        s.store(hi, &mut h.0);
                    }
                }
            }
        }
    }
}

/// Inputs a tile column is widened for at a time (whole tiles; one K-quant tile): 16 KiB
/// of quants, and 16 KiB of a group's inputs that stay in L1 while every tile column of
/// the task goes by. Widening whole columns (36 KiB at 576 inputs, 96 KiB at 1536), the
/// inputs came from L2 and 16 rows ran 0.80–0.91x the other kernels' speed. Speed only.
const CHUNK_INPUTS: usize = 256;

/// The rows of `x` (in lanes; `out` has one row per row they hold) against every tile
/// column of `m` from `m.from` on, `C` columns of a tile at a time (`C` divides 16).
///
/// The inputs go in chunks of [`CHUNK_INPUTS`], and the rows in pieces whose activations
/// of one chunk are about `PIECE_BYTES` (256 rows): for each piece and chunk, each tile
/// column's chunk is widened once, every group of 16 rows takes it from the buffer (their
/// chunk of inputs from L2), and the sums wait in `acc` for the next chunk. Chunk after
/// chunk in order, so each output's arithmetic is unchanged. (Pieces of `PIECE_BYTES` of
/// whole rows, as the other kernels take, held 2 groups at 2048 inputs, and each widened
/// chunk fed only those: at 512 rows the down projections ran 4–6% slower, the others
/// 1–3%.)
#[inline(always)]
pub(super) fn sweep<S: Simd, T: Tile, const C: usize>(
    s: S,
    m: TileColumns<T>,
    x: Lanes,
    out: &mut [&mut [Out]],
) {
    let k = m.k();
    let groups = x.rows.div_ceil(LANES);
    let chunk = (CHUNK_INPUTS / T::INPUTS).max(1);
    let per_piece = (PIECE_BYTES / ((chunk * T::INPUTS).min(k) * size_of::<Line>())).max(1);
    let columns = m.groups() - m.from;
    let mut column = Column::new::<T>(chunk);
    // Group `i` of the piece, tile column `g`: its 16 sums (one per column, lane = row).
    let mut acc = vec![Line::ZERO; per_piece.min(groups) * columns * TILE];
    for first in (0..groups).step_by(per_piece) {
        let piece = first..(first + per_piece).min(groups);
        acc.fill(Line::ZERO);
        for b0 in (0..m.nb).step_by(chunk) {
            let tiles = chunk.min(m.nb - b0);
            let chunk_of = |g: usize| &m.group(g, 1)[b0..b0 + tiles];
            for g in m.from..m.groups() {
                column.fill(s, chunk_of(g));
                // The next tile column's chunk, asked for from memory while the first
                // group works on this one.
                let next = if g + 1 < m.groups() {
                    chunk_of(g + 1)
                } else {
                    &[]
                };
                for group in piece.clone() {
                    let xs = &x.x[group * k..(group + 1) * k];
                    let sums = x.sums.get(group * k / LANES..(group + 1) * k / LANES);
                    let at = ((group - first) * columns + g - m.from) * TILE;
                    for c0 in (0..TILE).step_by(C) {
                        let block = Block {
                            column: &column,
                            tiles,
                            b0,
                            c0,
                            next: if group == first && c0 == 0 { next } else { &[] },
                        };
                        let rows = Group {
                            x: xs,
                            sums: sums.unwrap_or(&[]),
                            acc: &mut acc[at + c0..at + c0 + C],
                        };
                        dot::<S, T, C>(s, block, rows);
                    }
                }
            }
        }
        let end = (piece.end * LANES).min(out.len());
        let rows = &mut out[first * LANES..end];
        write_sums(&acc, m.from..m.from + columns, rows);
    }
}

/// Writes a piece's sums `acc` over the tile columns `tiles` (group `i` of the piece, tile
/// column `tiles.start + g`: at `(i * tiles.len() + g) * 16`) into its rows `out`.
fn write_sums(acc: &[Line], tiles: Range<usize>, out: &mut [&mut [Out]]) {
    let (from, columns) = (tiles.start, tiles.len());
    for (group, rows) in out.chunks_mut(LANES).enumerate() {
        for g in 0..columns {
            let sums = &acc[(group * columns + g) * TILE..][..TILE];
            let col = (from + g) * TILE;
            for (r, row) in rows.iter_mut().enumerate() {
                // The last tile of a matrix may stand past its last column.
                let end = (col + TILE).min(row.len());
                for (o, sum) in row[col..end].iter_mut().zip(sums) {
                    o.write(sum.0[r]);
                }
            }
        }
    }
}

/// What [`dot`] works on: the widened chunk `column` of a tile column (`tiles` tiles, the
/// matrix's from tile `b0` on), its columns `c0 .. c0 + C`; and the tiles to prefetch
/// meanwhile, `next`.
struct Block<'a, T> {
    column: &'a Column,
    tiles: usize,
    b0: usize,
    c0: usize,
    next: &'a [T],
}

/// A group of 16 rows in lanes for [`dot`]: their inputs `x` and run sums `sums`, and their
/// sums so far `acc` (lane `r` of sum `c`: output (row `r`, column `c0 + c`)).
struct Group<'a> {
    x: &'a [Line],
    sums: &'a [Line],
    acc: &'a mut [Line],
}

/// Adds the block `at` into the group's sums, each exactly as [`super::dot`] computes it,
/// prefetching `at.next` as it goes.
#[inline(always)]
fn dot<S: Simd, T: Tile, const C: usize>(s: S, at: Block<T>, rows: Group) {
    let Group { x, sums, acc } = rows;
    let col = at.column;
    let hi_sum = usize::from(T::SPLIT);
    let c0 = at.c0;
    for b in 0..at.tiles {
        if let Some(t) = at.next.get(b) {
            prefetch(t);
        }
        for p in 0..T::PARTS {
            let first = (at.b0 + b) * T::INPUTS + first_input::<T>(p);
            let start = (b * T::PARTS + p) * T::PAIRS;
            let quants = &col.quants[start..start + T::PAIRS];
            // The sums of the part's halves: `part[0]` ([`Tile::SPLIT`]: the low half's,
            // and `part[1]` the high half's).
            let mut part = [[s.zero(); C]; 2];
            let lows = &x[first..first + T::PAIRS];
            let highs = &x[first + T::SPAN..first + T::SPAN + T::PAIRS];
            for ((q, xl), xh) in quants.iter().zip(lows).zip(highs) {
                // Every column's low input, then every column's high one: each sum takes
                // them in that order.
                s.mul_add_each(s.load(&xl.0), &q[0].0[c0..c0 + C], &mut part[0]);
                s.mul_add_each(s.load(&xh.0), &q[1].0[c0..c0 + C], &mut part[hi_sum]);
            }
            let halves = if T::OFFSET {
                let lo = half_sum_lanes(s, sums, first, T::PAIRS);
                let hi = half_sum_lanes(s, sums, first + T::SPAN, T::PAIRS);
                if T::SPLIT {
                    [lo, hi]
                } else {
                    [s.add(lo, hi), s.zero()]
                }
            } else {
                [s.zero(); 2]
            };
            let f = &col.factors[b * T::PARTS + p];
            for (c, slot) in acc.iter_mut().take(C).enumerate() {
                let mut a = s.load(&slot.0);
                for h in 0..=hi_sum {
                    a = s.mul_add(s.splat(f[h].0[c0 + c]), part[h][c], a);
                    if T::OFFSET {
                        a = s.mul_add(s.splat(f[2 + h].0[c0 + c]), halves[h], a);
                    }
                }
                s.store(a, &mut slot.0);
            }
        }
    }
}
