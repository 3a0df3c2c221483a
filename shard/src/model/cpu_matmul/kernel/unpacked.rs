//! Many rows at once (prefill, a large batch): each tile column's quants are unpacked once
//! into a buffer of bytes (and its factors into vectors), and every row of the piece
//! takes them from there.
//!
//! Streaming from the tiles, the kernel unpacks each quant once per group of rows (6 on
//! AVX2), and the unpacking is about a third of its time even then (a kernel that skips
//! it ran at 80 GFLOP/s on one thread against 56). A byte per quant ([`Tile::quant_bytes`],
//! every quant of these formats fits an i8) widens to f32 with one instruction per 8
//! lanes, which the ports beside the FMAs' have room for, and the buffer (one tile
//! column: 16 bytes an input, 9 KiB at 576 inputs) stays in L1 while the piece's rows go
//! by. The buffer used to hold the quants as f32 (64 bytes an input, in L2): on one
//! thread at 16 rows, Q4_1 ran 67 GFLOP/s from it and 72 from bytes, Q4_K 64 and 69, Q6_K
//! 44 and 50 (`cpu_matmul::tests::bench`). (The 4- and 5-bit legacy formats mostly skip
//! this buffer: their wide copy, `blocks::wide`, is bytes already.) [`dot`] is the same
//! function either way, so every output's arithmetic is the same.

use super::super::blocks::{At, Factors, Tile, TileColumns, TILE};
use super::super::input::Rows;
use super::super::simd::{Bytes, Simd};
use super::super::{Half, Out};
use super::dot::{dot, Source};
use super::store;

/// Rows of a piece from which the buffer pays: below, the streaming kernel's groups of
/// rows share the unpacking well enough. Speed only.
pub(super) const MIN_ROWS: usize = 12;

/// One tile column unpacked: the quants of each tile's pairs as bytes (part after part)
/// and the factors of each tile's parts, tile after tile.
struct Unpacked<V> {
    quants: Vec<Bytes>,
    factors: Vec<Factors<V>>,
}

impl<V: Copy> Unpacked<V> {
    /// A buffer for tile columns of `nb` tiles of `T`.
    #[inline(always)]
    fn new<S: Simd<V = V>, T: Tile>(s: S, nb: usize) -> Self {
        let zero = s.zero();
        Unpacked {
            quants: vec![[0; 2 * TILE]; nb * T::PARTS * T::PAIRS],
            factors: vec![Factors::scale(zero, zero); nb * T::PARTS],
        }
    }

    /// Unpacks the tiles of one tile column.
    #[inline(always)]
    fn fill<S: Simd<V = V>, T: Tile>(&mut self, s: S, column: &[T]) {
        let mut quants = self.quants.iter_mut();
        let mut factors = self.factors.iter_mut();
        for tile in column {
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

impl<S: Simd, T: Tile> Source<S, T> for Unpacked<S::V> {
    type Block<'a>
        = (&'a [Bytes], &'a [Factors<S::V>])
    where
        Self: 'a;
    #[inline(always)]
    fn block(&self, _: usize, b: usize) -> Self::Block<'_> {
        let (pairs, parts) = (T::PARTS * T::PAIRS, T::PARTS);
        (
            &self.quants[b * pairs..(b + 1) * pairs],
            &self.factors[b * parts..(b + 1) * parts],
        )
    }
    #[inline(always)]
    fn factors(_: S, block: Self::Block<'_>, p: usize) -> Factors<S::V> {
        block.1[p]
    }
    #[inline(always)]
    fn quants(s: S, block: Self::Block<'_>, at: At) -> [S::V; 2] {
        s.signed_bytes(&block.0[at.part * T::PAIRS + at.pair])
    }
}

/// The rows of `out` against every tile column of `m` (from `m.from` on), each column
/// unpacked once: `R` rows at a time, the rest `R2` at a time (if `2 < R2 < R`), then 2,
/// then one.
#[inline(always)]
pub(super) fn sweep<S: Simd, T: Tile, const R: usize, const R2: usize>(
    s: S,
    m: TileColumns<T>,
    x: Rows,
    out: &mut [&mut [Out]],
) {
    let mut buf = Unpacked::new::<S, T>(s, m.nb);
    for g in m.from..m.groups() {
        buf.fill(s, m.group(g, 1));
        let column = Column {
            buf: &buf,
            nb: m.nb,
            g,
        };
        let mut done = column.rows::<S, T, R>(s, x, out);
        if 2 < R2 && R2 < R {
            done += column.rows::<S, T, R2>(s, x.from(done), &mut out[done..]);
        }
        if R > 2 {
            done += column.rows::<S, T, 2>(s, x.from(done), &mut out[done..]);
        }
        column.rows::<S, T, 1>(s, x.from(done), &mut out[done..]);
    }
}

/// Tile column `g`, unpacked into `buf` (`nb` tiles).
struct Column<'a, V> {
    buf: &'a Unpacked<V>,
    nb: usize,
    g: usize,
}

impl<V: Copy> Column<'_, V> {
    /// The first rows of `out`, as many as make whole groups of `R`, against this
    /// column; returns how many rows that was.
    #[inline(always)]
    fn rows<S: Simd<V = V>, T: Tile, const R: usize>(
        &self,
        s: S,
        x: Rows,
        out: &mut [&mut [Out]],
    ) -> usize {
        let together = out.len() / R * R;
        for (i, out) in out[..together].chunks_exact_mut(R).enumerate() {
            let mut rows: [(&[Half], &[f32]); R] = [(&[], &[]); R];
            for (r, row) in rows.iter_mut().enumerate() {
                *row = x.row(i * R + r);
            }
            let acc = dot::<S, T, _, R, 1>(s, self.buf, self.nb, &rows);
            for (row, acc) in out.iter_mut().zip(&acc) {
                store(s, acc[0], row, self.g * TILE);
            }
        }
        together
    }
}
