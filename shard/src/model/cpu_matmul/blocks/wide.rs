//! The 4- and 5-bit legacy blocks (Q4_0, Q4_1, Q5_0, Q5_1) with each quant widened to a
//! byte: a second copy of a matrix, which products of several rows read instead.
//!
//! Unpacking nibbles (and fifth bits) into f32 takes a handful of vector ops per pair for
//! every group of rows; a byte widens with one instruction per 8 lanes (Q8_0's quants
//! do), which the ports beside the FMAs' have room for. On one thread at 4 rows, Q4_1 ran
//! 54 GFLOP/s from its packed tiles and 74 from these; at 16 rows 67 and 76
//! (`cpu_matmul::tests::bench`, AVX2, the matrices in cache). But a decode step reads
//! its weights from memory, and these are 1.8 times the bytes of Q4_1's: with SmolLM2's
//! layers from memory (`tests::bench::step_from_memory`, AVX-512, one thread), the wide
//! copy took 1.20x the packed tiles' time at 2 rows, 1.18x at 4, 1.07x at 8, 0.99x at 10
//! and 0.82x at 12 (two threads: 1.26x at 2, 1.19x at 4, 1.07x at 8, 0.96x at 16). So
//! products of fewer than `WIDE_MIN_ROWS` (10) keep the packed tiles.
//!
//! The quants and factors are the packed format's, copied exactly (every quant of these
//! formats is within -16..=31, every factor an f16), and [`Tile::weights`] and `dot` use
//! them in the same order, so a product from either copy has the same bits.

use std::marker::PhantomData;

use half::f16;

use super::super::simd::{Bytes, Portable, Simd};
use super::{At, Factors, Scales, Tile, TILE};

/// Tile `T`'s quants as bytes, laid out as Q8_0's (`qs[j][c]`: column `c`'s input `j`,
/// `qs[j][16 + c]` its input `j + 16`), and its factors `a` and `b` as the f16 they were
/// stored as.
pub(in super::super) struct Wide<T> {
    a: Scales,
    b: Scales,
    qs: [Bytes; 16],
    format: PhantomData<T>,
}

// By hand: a derive would require `T: Copy` of the marker's type too.
impl<T> Clone for Wide<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Wide<T> {}

impl<T: Tile> Wide<T> {
    /// The wide copy of one packed tile.
    pub(in super::super) fn of(packed: &T) -> Self {
        // One part of 16 pairs, and a format that gives its quants as bytes (every one
        // that unpacks once does, see `Tile::quant_bytes`).
        const {
            assert!(T::PARTS == 1 && T::PAIRS == 16 && T::SPAN == 16 && !T::SPLIT);
            assert!(T::UNPACK_ONCE);
        }
        let mut wide = Self::ZERO;
        let f = packed.factors(Portable, 0);
        for c in 0..TILE {
            // Exact: the values were widened from these f16.
            wide.a[c] = f16::from_f32(f.a[0][c]).to_bits();
            wide.b[c] = f16::from_f32(f.b[0][c]).to_bits();
        }
        for (j, q) in wide.qs.iter_mut().enumerate() {
            // The packed format's own bytes, in this layout already.
            if let Some(bytes) = packed.quant_bytes(Portable, At { part: 0, pair: j }) {
                *q = bytes;
            }
        }
        wide
    }
}

impl<T: Tile> Tile for Wide<T> {
    const RAW_BYTES: usize = T::RAW_BYTES;
    const PARTS: usize = 1;
    const PAIRS: usize = 16;
    const SPAN: usize = 16;
    const OFFSET: bool = T::OFFSET;
    const UNPACK_ONCE: bool = false;
    const ZERO: Self = Wide {
        a: [0; TILE],
        b: [0; TILE],
        qs: [[0; 2 * TILE]; 16],
        format: PhantomData,
    };
    fn set_column(&mut self, c: usize, raw: &[u8]) {
        let mut packed = T::ZERO;
        packed.set_column(0, raw);
        let column = Self::of(&packed);
        self.a[c] = column.a[0];
        self.b[c] = column.b[0];
        for (q, from) in self.qs.iter_mut().zip(&column.qs) {
            q[c] = from[0];
            q[TILE + c] = from[TILE];
        }
    }
    #[inline(always)]
    fn factors<S: Simd>(&self, s: S, _: usize) -> Factors<S::V> {
        let a = s.f16s(&self.a);
        if T::OFFSET {
            let b = s.f16s(&self.b);
            Factors {
                a: [a, a],
                b: [b, b],
            }
        } else {
            Factors::scale(a, s.zero())
        }
    }
    #[inline(always)]
    fn quants<S: Simd>(&self, s: S, at: At) -> [S::V; 2] {
        s.signed_bytes(&self.qs[at.pair])
    }
}
