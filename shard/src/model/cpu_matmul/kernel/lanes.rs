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
#[derive(Default)]
struct Column {
    quants: Vec<[Line; 2]>,
    factors: Vec<[Line; 4]>,
}

impl Column {
    /// Makes room for `tiles` tiles of `T` (what was there stays: every tile is widened
    /// before it is read).
    fn fit<T: Tile>(&mut self, tiles: usize) {
        let (quants, factors) = (tiles * T::PARTS * T::PAIRS, tiles * T::PARTS);
        if self.quants.len() < quants {
            self.quants.resize(quants, [Line::ZERO; 2]);
        }
        if self.factors.len() < factors {
            self.factors.resize(factors, [Line::ZERO; 4]);
        }
    }

    /// Widens `tiles` (at most as many as the buffer was made for) into it.
    #[inline(always)]
    fn fill<S: Simd, T: Tile>(&mut self, s: S, tiles: &[T]) {
        for (b, tile) in tiles.iter().enumerate() {
            let slot = Slot { tile, b };
            for part in 0..T::PARTS {
                self.fill_factors(s, slot, part);
                for pair in 0..T::PAIRS {
                    self.fill_pair(s, slot, At { part, pair });
                }
            }
        }
    }

    /// Widens the factors of part `part` of `at`.
    #[inline(always)]
    fn fill_factors<S: Simd, T: Tile>(&mut self, s: S, at: Slot<T>, part: usize) {
        let f = at.tile.factors(s, part);
        if let Some(out) = self.factors.get_mut(at.b * T::PARTS + part) {
            for (v, out) in [f.a[0], f.a[1], f.b[0], f.b[1]].into_iter().zip(out) {
                s.store(v, &mut out.0);
            }
        }
    }

    /// Widens the quants of pair `pair` of `at`.
    #[inline(always)]
    fn fill_pair<S: Simd, T: Tile>(&mut self, s: S, at: Slot<T>, pair: At) {
        let [lo, hi] = at.tile.quants(s, pair);
        if let Some([l, h]) = self
            .quants
            .get_mut((at.b * T::PARTS + pair.part) * T::PAIRS + pair.pair)
        {
            s.store(lo, &mut l.0);
            s.store(hi, &mut h.0);
        }
    }
}

/// A tile, `tile`, to widen into a [`Column`] as its tile `b`.
#[derive(Clone, Copy)]
struct Slot<'a, T> {
    tile: &'a T,
    b: usize,
}

/// A thread's buffers for [`sweep`], kept from one call to the next: allocating and
/// zeroing them took 2% of 16-row products' time (a task is tens of microseconds). They
/// keep the largest size a task asked for: the sums of a piece of an output layer's task,
/// a few MB at most (16 groups of rows by a few hundred tile columns).
#[derive(Default)]
struct Scratch {
    /// The two steps' widened chunks.
    buffers: [Column; 2],
    /// The piece's sums.
    acc: Vec<Line>,
}

thread_local! {
    static SCRATCH: std::cell::Cell<Scratch> = std::cell::Cell::default();
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
///
/// A piece's steps (a chunk of one tile column) take turns in two buffers: while the
/// piece's first group multiplies one step's chunk, it widens the next step's into the
/// other buffer, pair by pair between its multiply-adds. The widening (loads, shuffles,
/// conversions, stores) then runs on the ports the multiply-adds leave idle, rather than
/// between them: at 16 rows, where every widened chunk feeds one group, it had been a
/// sixth of the kernel's time.
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
    // Step `i` of a piece: chunk `i / columns` (its first tile `b0`), tile column
    // `m.from + g`.
    let steps = m.nb.div_ceil(chunk) * columns;
    let step = |i: usize| (i / columns * chunk, i % columns);
    let tiles_of = |i: usize| -> &[T] {
        if i >= steps {
            return &[];
        }
        let (b0, g) = step(i);
        &m.group(m.from + g, 1)[b0..(b0 + chunk).min(m.nb)]
    };
    // Taken out of the thread's slot and put back at the end (only moves in the closures:
    // code in a closure would not have this function's target features).
    let Scratch {
        mut buffers,
        acc: mut sums_of_piece,
    } = SCRATCH.with(std::cell::Cell::take);
    for b in &mut buffers {
        b.fit::<T>(chunk);
    }
    // Group `i` of the piece, tile column `g`: its 16 sums (one per column, lane = row).
    sums_of_piece.resize(per_piece.min(groups) * columns * TILE, Line::ZERO);
    let acc = &mut sums_of_piece[..];
    for first in (0..groups).step_by(per_piece) {
        let piece = first..(first + per_piece).min(groups);
        acc.fill(Line::ZERO);
        buffers[0].fill(s, tiles_of(0));
        for i in 0..steps {
            let (b0, g) = step(i);
            let [even, odd] = &mut buffers;
            let (now, then): (&Column, &mut Column) =
                if i % 2 == 0 { (even, odd) } else { (odd, even) };
            let tiles = tiles_of(i).len();
            for group in piece.clone() {
                let xs = &x.x[group * k..(group + 1) * k];
                let sums = x.sums.get(group * k / LANES..(group + 1) * k / LANES);
                let at = ((group - first) * columns + g) * TILE;
                for c0 in (0..TILE).step_by(C) {
                    let lead = group == first && c0 == 0;
                    let block = Block {
                        column: now,
                        tiles,
                        b0,
                        c0,
                        // The step after next, asked for from memory now: the next one
                        // is read (and widened) meanwhile.
                        next: if lead { tiles_of(i + 2) } else { &[] },
                    };
                    let rows = Group {
                        x: xs,
                        sums: sums.unwrap_or(&[]),
                        acc: &mut acc[at + c0..at + c0 + C],
                    };
                    if lead {
                        // As many tiles as this step's or fewer: only a piece's last
                        // chunk is short, and the step after its last has none.
                        let fill = Fill {
                            column: &mut *then,
                            tiles: tiles_of(i + 1),
                        };
                        debug_assert!(fill.tiles.len() <= tiles);
                        dot::<S, T, C>(s, block, rows, Some(fill));
                    } else {
                        dot::<S, T, C>(s, block, rows, None);
                    }
                }
            }
        }
        let end = (piece.end * LANES).min(out.len());
        let rows = &mut out[first * LANES..end];
        write_sums(acc, m.from..m.from + columns, rows);
    }
    let scratch = Scratch {
        buffers,
        acc: sums_of_piece,
    };
    SCRATCH.with(|slot| slot.set(scratch));
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

/// The next step's chunk, `tiles` (as many as the step's or fewer), for [`dot`] to widen
/// into `column` as it goes.
struct Fill<'a, T> {
    column: &'a mut Column,
    tiles: &'a [T],
}

/// A group of 16 rows in lanes for [`dot`]: their inputs `x` and run sums `sums`, and their
/// sums so far `acc` (lane `r` of sum `c`: output (row `r`, column `c0 + c`)).
struct Group<'a> {
    x: &'a [Line],
    sums: &'a [Line],
    acc: &'a mut [Line],
}

/// Adds the block `at` into the group's sums, each exactly as [`super::dot`] computes it,
/// prefetching `at.next` and widening `fill` as it goes.
#[inline(always)]
fn dot<S: Simd, T: Tile, const C: usize>(
    s: S,
    at: Block<T>,
    rows: Group,
    mut fill: Option<Fill<T>>,
) {
    let Group { x, sums, acc } = rows;
    let col = at.column;
    let hi_sum = usize::from(T::SPLIT);
    let c0 = at.c0;
    for b in 0..at.tiles {
        if let Some(t) = at.next.get(b) {
            prefetch(t);
        }
        let mut widen = fill.as_mut().and_then(|f| {
            Some((
                Slot {
                    tile: f.tiles.get(b)?,
                    b,
                },
                &mut *f.column,
            ))
        });
        for p in 0..T::PARTS {
            if let Some((slot, column)) = widen.as_mut() {
                column.fill_factors(s, *slot, p);
            }
            let first = (at.b0 + b) * T::INPUTS + first_input::<T>(p);
            let start = (b * T::PARTS + p) * T::PAIRS;
            let quants = &col.quants[start..start + T::PAIRS];
            // The sums of the part's halves: `part[0]` ([`Tile::SPLIT`]: the low half's,
            // and `part[1]` the high half's).
            let mut part = [[s.zero(); C]; 2];
            let lows = &x[first..first + T::PAIRS];
            let highs = &x[first + T::SPAN..first + T::SPAN + T::PAIRS];
            for (pair, ((q, xl), xh)) in quants.iter().zip(lows).zip(highs).enumerate() {
                // Every column's low input, then every column's high one: each sum takes
                // them in that order.
                s.mul_add_each(s.load(&xl.0), &q[0].0[c0..c0 + C], &mut part[0]);
                s.mul_add_each(s.load(&xh.0), &q[1].0[c0..c0 + C], &mut part[hi_sum]);
                if let Some((slot, column)) = widen.as_mut() {
                    column.fill_pair(s, *slot, At { part: p, pair });
                }
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
