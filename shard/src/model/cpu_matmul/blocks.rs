//! The weight tiles the kernel reads: the ggml blocks (Q4_0, Q4_1, Q8_0) of 16 adjacent
//! columns at the same 32 inputs, interleaved so that one vector op dequantizes one input
//! of all 16 columns; and dense f32 weights in the same shape.
//!
//! A ggml block stores input `j` and `j + 16` of one column in byte `j` (Q4: low and high
//! nibble) or bytes `j` and `j + 16` (Q8_0). A tile puts byte `j` of its 16 columns' blocks
//! side by side, so [`Tile::pair`] turns 16 (or 32) bytes into the weights of inputs `j`
//! and `j + 16` for lanes = columns 0..16. The scales become vectors too (lane `c`: column
//! `c`'s), kept as f16 (the bytes a decode step streams from memory are its cost) and
//! widened to f32 once per tile by [`Tile::scales`] (lossless).
//!
//! `pair` reproduces candle's `to_float` bit for bit: `q * d` is exact in f32 (|q| ≤ 128
//! has at most 8 significant bits, an f16 scale at most 11), so the only rounding is
//! Q4_1's `+ m`, and a fused `q * d + m` rounds that same exact sum once (signed zeros
//! included). Columns past the end of the matrix are all-zero weights, computed and
//! never stored.

use half::f16;

use super::simd::Simd;
use super::{Half, LANES};

/// Columns per tile: one per vector lane.
pub(super) const TILE: usize = LANES;

/// 16 columns × 32 inputs of one format.
pub(super) trait Tile: Copy + Send + Sync {
    /// Bytes of one column's block in the GGUF / candle layout.
    const RAW_BYTES: usize;
    /// The tile of 16 all-zero columns.
    const ZERO: Self;
    /// Puts column `c`'s raw block (`raw.len() == RAW_BYTES`) into lane `c`.
    fn set_column(&mut self, c: usize, raw: &[u8]);
    /// The tile's scales as f32 vectors, for [`Tile::pair`]: computed once per tile, not
    /// once per input. (`#[inline(always)]` in every impl: see `simd`, "Inlining".)
    fn scales<S: Simd>(&self, s: S) -> [S::V; 2];
    /// The weights of inputs `j` and `j + 16` (`j < 16`), lane `c` = column `c`.
    fn pair<S: Simd>(&self, s: S, scales: &[S::V; 2], j: usize) -> [S::V; 2];
}

fn f16_at(raw: &[u8], at: usize) -> u16 {
    f16::from_le_bytes([raw[at], raw[at + 1]]).to_bits()
}

/// 16 f16 scales, one per column.
type Scales = [u16; TILE];

/// Q4_0: `{d: f16, qs: [u8; 16]}` per column, `w = d * (nibble - 8)`.
#[derive(Clone, Copy)]
pub(super) struct Q4_0 {
    d: Scales,
    /// `qs[j][c]`: column `c`'s byte `j` (inputs `j` and `j + 16`).
    qs: [[u8; TILE]; 16],
}

impl Tile for Q4_0 {
    const RAW_BYTES: usize = 18;
    const ZERO: Self = Q4_0 {
        d: [0; TILE],
        qs: [[0; TILE]; 16],
    };
    fn set_column(&mut self, c: usize, raw: &[u8]) {
        self.d[c] = f16_at(raw, 0);
        for (j, q) in self.qs.iter_mut().enumerate() {
            q[c] = raw[2 + j];
        }
    }
    #[inline(always)]
    fn scales<S: Simd>(&self, s: S) -> [S::V; 2] {
        [s.f16s(&self.d), s.splat(-8.0)]
    }
    #[inline(always)]
    fn pair<S: Simd>(&self, s: S, scales: &[S::V; 2], j: usize) -> [S::V; 2] {
        // `(nibble - 8) * d`, both steps exact; not `nibble * d - 8 * d`, which would
        // give +0.0 where candle gives -0.0 (nibble 8, negative d).
        let [d, minus8] = *scales;
        let [lo, hi] = s.nibbles(&self.qs[j]);
        [s.mul(s.add(lo, minus8), d), s.mul(s.add(hi, minus8), d)]
    }
}

/// Q4_1: `{d: f16, m: f16, qs: [u8; 16]}` per column, `w = d * nibble + m`.
#[derive(Clone, Copy)]
pub(super) struct Q4_1 {
    d: Scales,
    m: Scales,
    qs: [[u8; TILE]; 16],
}

impl Tile for Q4_1 {
    const RAW_BYTES: usize = 20;
    const ZERO: Self = Q4_1 {
        d: [0; TILE],
        m: [0; TILE],
        qs: [[0; TILE]; 16],
    };
    fn set_column(&mut self, c: usize, raw: &[u8]) {
        self.d[c] = f16_at(raw, 0);
        self.m[c] = f16_at(raw, 2);
        for (j, q) in self.qs.iter_mut().enumerate() {
            q[c] = raw[4 + j];
        }
    }
    #[inline(always)]
    fn scales<S: Simd>(&self, s: S) -> [S::V; 2] {
        [s.f16s(&self.d), s.f16s(&self.m)]
    }
    #[inline(always)]
    fn pair<S: Simd>(&self, s: S, scales: &[S::V; 2], j: usize) -> [S::V; 2] {
        let [d, m] = *scales;
        let [lo, hi] = s.nibbles(&self.qs[j]);
        [s.mul_add(lo, d, m), s.mul_add(hi, d, m)]
    }
}

/// Q8_0: `{d: f16, qs: [i8; 32]}` per column, `w = d * q`.
#[derive(Clone, Copy)]
pub(super) struct Q8_0 {
    d: Scales,
    /// `qs[j][c]`: column `c`'s input `j`; `qs[j][16 + c]`: its input `j + 16`.
    qs: [[u8; 2 * TILE]; 16],
}

impl Tile for Q8_0 {
    const RAW_BYTES: usize = 34;
    const ZERO: Self = Q8_0 {
        d: [0; TILE],
        qs: [[0; 2 * TILE]; 16],
    };
    fn set_column(&mut self, c: usize, raw: &[u8]) {
        self.d[c] = f16_at(raw, 0);
        for (j, q) in self.qs.iter_mut().enumerate() {
            q[c] = raw[2 + j];
            q[TILE + c] = raw[2 + 16 + j];
        }
    }
    #[inline(always)]
    fn scales<S: Simd>(&self, s: S) -> [S::V; 2] {
        let d = s.f16s(&self.d);
        [d, d]
    }
    #[inline(always)]
    fn pair<S: Simd>(&self, s: S, scales: &[S::V; 2], j: usize) -> [S::V; 2] {
        let d = scales[0];
        let [lo, hi] = s.signed_bytes(&self.qs[j]);
        [s.mul(lo, d), s.mul(hi, d)]
    }
}

/// Dense f32 weights (Hugging Face checkpoints) in the same shape: "dequantization" is a
/// plain load, so dense weights get the same fixed arithmetic per output, and hence the
/// same batch invariance. A column's raw block is its 32 weights, little-endian.
#[derive(Clone, Copy)]
pub(super) struct F32 {
    /// `w[j]`: inputs `j` and `j + 16` of the 16 columns.
    w: [[Half; 2]; 16],
}

impl Tile for F32 {
    const RAW_BYTES: usize = 128;
    const ZERO: Self = F32 {
        w: [[[0.0; LANES]; 2]; 16],
    };
    fn set_column(&mut self, c: usize, raw: &[u8]) {
        let at = |i: usize| {
            f32::from_le_bytes([raw[4 * i], raw[4 * i + 1], raw[4 * i + 2], raw[4 * i + 3]])
        };
        for (j, w) in self.w.iter_mut().enumerate() {
            w[0][c] = at(j);
            w[1][c] = at(j + 16);
        }
    }
    #[inline(always)]
    fn scales<S: Simd>(&self, s: S) -> [S::V; 2] {
        [s.zero(), s.zero()]
    }
    #[inline(always)]
    fn pair<S: Simd>(&self, s: S, _: &[S::V; 2], j: usize) -> [S::V; 2] {
        [s.load(&self.w[j][0]), s.load(&self.w[j][1])]
    }
}

/// The tiles of an `[n, k]` matrix stored as `n` rows of `k / 32` raw blocks: tile column
/// `g` (matrix columns `16 g ..`) holds its `nb = k / 32` tiles at `g * nb ..`. `None` if
/// `data` is not exactly that many blocks.
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
