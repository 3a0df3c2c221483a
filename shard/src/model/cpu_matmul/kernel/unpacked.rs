//! Many rows at once (prefill, a large batch): each tile column's quants are unpacked once
//! into a buffer of bytes (and its factors into vectors), and every row of the piece
//! takes them from there.
//!
//! Streaming from the tiles, the kernel unpacks each quant once per group of rows (6 on
//! AVX2), and the unpacking is about a third of its time even then (a kernel that skips
//! it ran at 80 GFLOP/s on one thread against 56). A byte per quant ([`Tile::quant_bytes`],
//! every quant of these formats fits an i8) widens to f32 with one instruction per 8
//! lanes, which the ports beside the FMAs' have room for, and the buffer (16 bytes an
//! input a tile column: 9 KiB at 576 inputs; two columns on AVX-512, see
//! `kernel::stream_avx512`) stays in L1 or L2 while the piece's rows go by. The buffer
//! used to hold the quants as f32 (64 bytes an input, in L2): on one thread at 16 rows,
//! Q4_1 ran 67 GFLOP/s from it and 72 from bytes, Q4_K 64 and 69, Q6_K 44 and 50
//! (`cpu_matmul::tests::bench`). (The 4- and 5-bit legacy formats mostly skip this
//! buffer: their wide copy, `blocks::wide`, is bytes already.) [`dot`] is the same
//! function either way, so every output's arithmetic is the same.

use super::super::blocks::{At, Factors, Tile, TileColumns, TILE};
use super::super::input::Rows;
use super::super::simd::{Bytes, Simd};
use super::super::Out;
use super::ahead::Next;
use super::dot::Source;
use super::row_groups;

/// Rows of a piece from which the buffer pays: below, the streaming kernel's groups of
/// rows share the unpacking well enough. Speed only.
pub(super) const MIN_ROWS: usize = 12;

/// Some tile columns unpacked (`nb` tiles each): the quants of each tile's pairs as
/// bytes (part after part) and the factors of each tile's parts, tile after tile, column
/// after column. The first is the matrix's tile column `g`.
struct Unpacked<V> {
    quants: Vec<Bytes>,
    factors: Vec<Factors<V>>,
    nb: usize,
    g: usize,
}

impl<V: Copy> Unpacked<V> {
    /// A buffer for `columns` tile columns of `nb` tiles of `T`.
    #[inline(always)]
    fn new<S: Simd<V = V>, T: Tile>(s: S, nb: usize, columns: usize) -> Self {
        let zero = s.zero();
        Unpacked {
            quants: vec![[0; 2 * TILE]; columns * nb * T::PARTS * T::PAIRS],
            factors: vec![Factors::scale(zero, zero); columns * nb * T::PARTS],
            nb,
            g: 0,
        }
    }

    /// Unpacks `count` tile columns of `m` from `m.from` on (at most as many as the
    /// buffer was made for).
    #[inline(always)]
    fn fill<S: Simd<V = V>, T: Tile>(&mut self, s: S, m: TileColumns<T>, count: usize) {
        self.g = m.from;
        let columns = m.group(m.from, count);
        let mut quants = self.quants.iter_mut();
        let mut factors = self.factors.iter_mut();
        for tile in columns {
            for part in 0..T::PARTS {
                if let Some(f) = factors.next() {
                    *f = tile.factors(s, part);
                }
                for pair in 0..T::PAIRS {
                    let bytes = tile.quant_bytes(s, At { part, pair });
                    if let (Some(q), Some(bytes)) = (quants.next(), bytes) {
                        s.store_bytes(bytes, q);
                    }
                }
            }
        }
    }
}

/// The buffer's tile columns from `first` on, as [`dot`]'s source: its `c`-th column is
/// the buffer's `first + c`-th, the matrix's `buf.g + first + c`-th. `next`: the tile
/// columns the rows prefetch as they go.
struct Columns<'a, V, T> {
    buf: &'a Unpacked<V>,
    first: usize,
    next: Next<'a, T>,
}

impl<S: Simd, T: Tile> Source<S, T> for Columns<'_, S::V, T> {
    type Block<'a>
        = (&'a [Bytes], &'a [Factors<S::V>])
    where
        Self: 'a;
    #[inline(always)]
    fn nb(&self) -> usize {
        self.buf.nb
    }
    #[inline(always)]
    fn column(&self) -> usize {
        self.buf.g + self.first
    }
    #[inline(always)]
    fn next(&self) -> Next<'_, T> {
        self.next
    }
    #[inline(always)]
    fn block(&self, c: usize, b: usize) -> (&[Bytes], &[Factors<S::V>]) {
        let (pairs, parts) = (T::PARTS * T::PAIRS, T::PARTS);
        let b = (self.first + c) * self.buf.nb + b;
        (
            &self.buf.quants[b * pairs..(b + 1) * pairs],
            &self.buf.factors[b * parts..(b + 1) * parts],
        )
    }
    #[inline(always)]
    fn factors(_: S, block: (&[Bytes], &[Factors<S::V>]), p: usize) -> Factors<S::V> {
        block.1[p]
    }
    #[inline(always)]
    fn quants(s: S, block: (&[Bytes], &[Factors<S::V>]), at: At) -> [S::V; 2] {
        s.signed_bytes(&block.0[at.part * T::PAIRS + at.pair])
    }
}

/// The rows of `out` against every tile column of `m` (from `m.from` on), each column
/// unpacked once, `C` columns at a time while `C` are left (then one): `R` rows at a time
/// against all of them, then the rest column by column, `R2` at a time (if `2 < R2 < R`),
/// then 2, then one (those groups have registers for one tile only; see
/// `kernel::stream_avx512`).
#[inline(always)]
pub(super) fn sweep<S: Simd, T: Tile, const R: usize, const C: usize, const R2: usize>(
    s: S,
    m: TileColumns<T>,
    x: Rows,
    out: &mut [&mut [Out]],
) {
    let mut buf = Unpacked::new::<S, T>(s, m.nb, C);
    let mut g = m.from;
    while g < m.groups() {
        let count = if g + C <= m.groups() { C } else { 1 };
        buf.fill(s, m.from(g), count);
        let all = Columns {
            buf: &buf,
            first: 0,
            next: Next::after(m, g, count),
        };
        let done = if count == C {
            rows::<S, T, R, C>(s, &all, x, out)
        } else {
            rows::<S, T, R, 1>(s, &all, x, out)
        };
        for first in 0..count {
            let column = Columns {
                buf: &buf,
                first,
                next: Next::none(),
            };
            let mut more = done;
            if 2 < R2 && R2 < R {
                more += rows::<S, T, R2, 1>(s, &column, x.from(more), &mut out[more..]);
            }
            if R > 2 {
                more += rows::<S, T, 2, 1>(s, &column, x.from(more), &mut out[more..]);
            }
            rows::<S, T, 1, 1>(s, &column, x.from(more), &mut out[more..]);
        }
        g += count;
    }
}

/// The first rows of `out`, as many as make whole groups of `R`, against the first `C`
/// tile columns of `src`; returns how many rows that was.
#[inline(always)]
fn rows<S: Simd, T: Tile, const R: usize, const C: usize>(
    s: S,
    src: &Columns<'_, S::V, T>,
    x: Rows,
    out: &mut [&mut [Out]],
) -> usize {
    let together = out.len() / R * R;
    row_groups::<S, T, _, R, C>(s, src, x, &mut out[..together]);
    together
}
