//! The weight tiles the kernel reads: one ggml block (or K-quant super-block) of each of
//! 16 adjacent columns at the same inputs, interleaved so that one vector op unpacks one
//! input of all 16 columns (lane `c` = column `c`); dense f32 / f16 / bf16 weights in the
//! same shape.
//!
//! # Pairs, parts and the input order
//!
//! A tile covers [`Tile::INPUTS`] inputs of its columns (32, or 256 for the K-quants),
//! walked as *pairs*: pair `j` of part `p` is the inputs `i = first_input(p) + j` and
//! `i + SPAN`, the two a ggml block keeps in one byte or at the same offset (Q4_0: byte
//! `j` holds inputs `j` and `j + 16`; Q4_K: byte `l` of a 32-byte run, inputs `l` and
//! `l + 32` of its 64; Q6_K: `ql` byte `j` of a 64-byte run, inputs `j` and `j + 64` of its
//! 128). The inputs fall into groups of `2 SPAN`; a group is walked `j = 0..SPAN`, taking
//! `(j, j + SPAN)` — the order in which every output's fused multiply-adds go (module
//! docs of `cpu_matmul`). A *part* is a run of [`Tile::PAIRS`] pairs whose first inputs
//! (its *low half*) share one scale and offset, and whose second inputs (its *high half*)
//! share one too.
//!
//! # Quants and factors
//!
//! Every format's weight is `w = a · q + b`: `q` an integer (the quant, with any fixed
//! offset such as Q4_0's `- 8` already applied), `a` and `b` the same for a whole half of
//! a part ([`Factors`]; `b` is zero where the format has none, [`Tile::OFFSET`]). The
//! kernel multiplies the activations by the quants, which are exact in f32, and applies
//! `a` and `b` once per half: `Σ w x = a · Σ q x + b · Σ x`. [`Tile::quants`] returns a
//! pair's quants for the 16 columns; [`Tile::factors`] a part's factors, computed once per
//! part. [`Tile::weights`] puts them together, bit for bit as candle's `to_float` computes
//! the weights (each format says why its operations round the same), for weight rows.
//! Scales stay as stored (f16, 6-bit packed, i8) and are widened in registers, because the
//! bytes a decode step streams from memory are its cost. Columns past the end of the
//! matrix are all-zero weights, computed and never stored. Dense weights are their own
//! quants, with `a = 1`.

use half::f16;

use super::simd::Simd;
use super::LANES;

mod dense;
mod kquant;
mod legacy;
mod wide;

pub(super) use dense::{Bf16, F16, F32};
pub(super) use kquant::{Q4K, Q5K, Q6K};
pub(super) use legacy::{Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
pub(super) use wide::Wide;

/// Columns per tile: one per vector lane.
pub(super) const TILE: usize = LANES;

/// 16 columns × [`Tile::INPUTS`] inputs of one format.
pub(super) trait Tile: Copy + Send + Sync {
    /// Bytes of one column's block in the GGUF / candle layout.
    const RAW_BYTES: usize;
    /// Runs of pairs with their own factors.
    const PARTS: usize;
    /// Pairs per part: a multiple of 16 that divides `SPAN`.
    const PAIRS: usize;
    /// The distance between a pair's two inputs.
    const SPAN: usize;
    /// Inputs per tile.
    const INPUTS: usize = 2 * Self::PARTS * Self::PAIRS;
    /// The tile of 16 all-zero columns.
    const ZERO: Self;
    /// Whether the weights have an offset `b` (Q4_1, Q5_1, Q4_K, Q5_K); without one, `b`
    /// is never added (`a · q`, as candle computes those weights).
    const OFFSET: bool = false;
    /// Whether a part's two halves have their own factors (the K-quants: the halves are
    /// different sub-blocks), so that each output keeps a sum per half.
    const SPLIT: bool = false;
    /// Whether a piece of many rows takes each tile column unpacked once into a buffer of
    /// bytes (`kernel::unpacked`): every format whose quants are packed smaller than a
    /// byte, each of which gives [`Tile::quant_bytes`]; not Q8_0 (bytes already) nor the
    /// dense weights. Speed only.
    const UNPACK_ONCE: bool = true;
    /// Puts column `c`'s raw block (`raw.len() == RAW_BYTES`) into lane `c`.
    fn set_column(&mut self, c: usize, raw: &[u8]);
    /// Part `p`'s factors. (`#[inline(always)]` in every impl: see `simd`, "Inlining".)
    fn factors<S: Simd>(&self, s: S, p: usize) -> Factors<S::V>;
    /// The quants of pair `at.pair < PAIRS` of part `at.part` (inputs `first_input(part)
    /// + pair` and `SPAN` further on, lane `c` = column `c`), exact in f32.
    fn quants<S: Simd>(&self, s: S, at: At) -> [S::V; 2];
    /// The quants of pair `at` as bytes (byte `c`: the low input of column `c`, byte
    /// `16 + c`: its high input), for the formats that unpack once ([`Tile::UNPACK_ONCE`]):
    /// all their quants fit an i8 (within -32..=31), and [`Tile::quants`] are these bytes
    /// widened. `None` for the others.
    #[inline(always)]
    fn quant_bytes<S: Simd>(&self, _s: S, _at: At) -> Option<S::B> {
        None
    }
    /// The weights of that pair, bit for bit as candle's `to_float`: `fma(q, a, b)` with
    /// an offset (exactly `a · q + b` rounded once: `a · q` is exact in every format that
    /// has one), `q · a` without.
    #[inline(always)]
    fn weights<S: Simd>(&self, s: S, f: &Factors<S::V>, at: At) -> [S::V; 2] {
        let [lo, hi] = self.quants(s, at);
        if Self::OFFSET {
            [s.mul_add(lo, f.a[0], f.b[0]), s.mul_add(hi, f.a[1], f.b[1])]
        } else {
            [s.mul(lo, f.a[0]), s.mul(hi, f.a[1])]
        }
    }
}

/// A part's factors, `[low half, high half]`: `w = a · q + b`. Without a split both
/// entries are the same; without an offset `b` is unused.
#[derive(Clone, Copy)]
pub(super) struct Factors<V> {
    pub a: [V; 2],
    pub b: [V; 2],
}

impl<V: Copy> Factors<V> {
    /// The factors `a` for both halves, no offset (`zero` fills `b`).
    #[inline(always)]
    pub fn scale(a: V, zero: V) -> Self {
        Factors {
            a: [a, a],
            b: [zero, zero],
        }
    }
}

/// Which pair of a tile: pair `pair` of part `part`.
#[derive(Clone, Copy)]
pub(super) struct At {
    pub part: usize,
    pub pair: usize,
}

/// The first input of part `p`'s first pair: the parts fill the groups of `2 SPAN`
/// inputs `SPAN / PAIRS` at a time.
#[inline(always)]
pub(super) const fn first_input<T: Tile>(p: usize) -> usize {
    let per_group = T::SPAN / T::PAIRS;
    (p / per_group) * 2 * T::SPAN + (p % per_group) * T::PAIRS
}

fn f16_at(raw: &[u8], at: usize) -> u16 {
    f16::from_le_bytes([raw[at], raw[at + 1]]).to_bits()
}

/// Puts column `c`'s bytes `raw` into lane `c` of the byte rows `rows` (byte `j` into
/// `rows[j][c]`).
fn set_lane_bytes(rows: &mut [[u8; TILE]], c: usize, raw: &[u8]) {
    for (row, &b) in rows.iter_mut().zip(raw) {
        row[c] = b;
    }
}

/// Sets bit `bit` of `word` to `on`.
fn set_bit(word: &mut u32, bit: usize, on: bool) {
    *word = (*word & !(1 << bit)) | (u32::from(on) << bit);
}

/// 16 f16 scales, one per column.
type Scales = [u16; TILE];

/// The tiles of an `[n, k]` matrix stored as `n` rows of `nb = k / INPUTS` raw blocks:
/// tile column `g` (matrix columns `16 g ..`) holds its `nb` tiles at `g * nb ..`. `None`
/// if `data` is not exactly that many blocks.
pub(super) fn tiles<T: Tile>(data: &[u8], n: usize, nb: usize) -> Option<Vec<T>> {
    if data.len() != n * nb * T::RAW_BYTES {
        return None;
    }
    let block = |col: usize, b: usize| {
        let at = (col * nb + b) * T::RAW_BYTES;
        &data[at..at + T::RAW_BYTES]
    };
    let mut out = Vec::with_capacity(n.div_ceil(TILE) * nb);
    for g in 0..n.div_ceil(TILE) {
        for b in 0..nb {
            let mut tile = T::ZERO;
            for c in 0..TILE.min(n - g * TILE) {
                tile.set_column(c, block(g * TILE + c, b));
            }
            out.push(tile);
        }
    }
    Some(out)
}

/// A matrix's tiles from tile column `from` on: tile column `g` (matrix columns `16 g ..`)
/// holds its `nb` tiles at `tiles[g * nb ..]`, as [`tiles`] lays them out.
#[derive(Clone, Copy)]
pub(super) struct TileColumns<'a, T> {
    pub tiles: &'a [T],
    /// Tiles per tile column: `k / T::INPUTS`.
    pub nb: usize,
    /// The first tile column meant.
    pub from: usize,
}

impl<'a, T: Tile> TileColumns<'a, T> {
    /// All of `tiles`' columns.
    pub fn all(tiles: &'a [T], nb: usize) -> Self {
        Self { tiles, nb, from: 0 }
    }

    /// Inputs per row.
    #[inline(always)]
    pub fn k(self) -> usize {
        self.nb * T::INPUTS
    }

    /// Tile columns in the matrix (those before `from` included).
    #[inline(always)]
    pub fn groups(self) -> usize {
        self.tiles.len() / self.nb
    }

    /// The same tiles from tile column `g` on.
    #[inline(always)]
    pub fn from(self, g: usize) -> Self {
        Self { from: g, ..self }
    }

    /// The tiles of tile columns `g .. g + count`, column after column.
    #[inline(always)]
    pub fn group(self, g: usize, count: usize) -> &'a [T] {
        &self.tiles[g * self.nb..(g + count) * self.nb]
    }
}

/// Lane `c` of one tile column (`column`: its tiles, `k = column.len() * INPUTS` weights)
/// dequantized into `out`, by the kernel's own operations: a weight row.
#[inline(always)]
pub(super) fn row<S: Simd, T: Tile>(s: S, column: &[T], c: usize, out: &mut [f32]) {
    let mut lanes = [0f32; LANES];
    for (t, out) in column.iter().zip(out.chunks_exact_mut(T::INPUTS)) {
        for p in 0..T::PARTS {
            let factors = t.factors(s, p);
            let first = first_input::<T>(p);
            for j in 0..T::PAIRS {
                let [lo, hi] = t.weights(s, &factors, At { part: p, pair: j });
                s.store(lo, &mut lanes);
                out[first + j] = lanes[c];
                s.store(hi, &mut lanes);
                out[first + j + T::SPAN] = lanes[c];
            }
        }
    }
}

/// Lane `c`'s offset `b` at each input of one tile column (`0.0` for formats without one):
/// the tests' error bound depends on it, since the kernel sums `a · Σ q x` and `b · Σ x`
/// apart.
#[cfg(test)]
pub(super) fn row_offsets<S: Simd, T: Tile>(s: S, column: &[T], c: usize, out: &mut [f32]) {
    let mut lanes = [0f32; LANES];
    for (t, out) in column.iter().zip(out.chunks_exact_mut(T::INPUTS)) {
        for p in 0..T::PARTS {
            let factors = t.factors(s, p);
            let first = first_input::<T>(p);
            for (h, b) in factors.b.iter().enumerate() {
                s.store(*b, &mut lanes);
                let b = if T::OFFSET { lanes[c] } else { 0.0 };
                for j in 0..T::PAIRS {
                    out[first + h * T::SPAN + j] = b;
                }
            }
        }
    }
}
