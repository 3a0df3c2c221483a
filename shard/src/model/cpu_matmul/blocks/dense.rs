//! Dense weights (GGUF F32/F16/BF16 tensors, Hugging Face checkpoints) in the shape of the
//! 32-input blocks: pair `j` = inputs `j` and `j + 16` of each 32. The "quants" are the
//! weights themselves, loaded (f32) or widened exactly (f16, bf16: kept 2 bytes a weight),
//! and the factor is 1, so dense weights get the same fixed arithmetic per output, and
//! hence the same batch invariance. A column's raw block is its 32 weights, little-endian.
//!
//! NaN payloads: candle (the `half` crate) widens a signalling f16 / bf16 NaN to a quiet
//! f32 NaN. The tiles store such a NaN with its quiet bit already set, so that the plain
//! widening (`bits << 16` for bf16, F16C's conversion, which keeps a quiet NaN's payload)
//! gives candle's bits.

use super::super::simd::Simd;
use super::super::{Half, LANES};
use super::{At, Factors, Tile};

/// Dense f32 weights.
#[derive(Clone, Copy)]
pub(in super::super) struct F32 {
    /// `w[j]`: inputs `j` and `j + 16` of the 16 columns.
    w: [[Half; 2]; 16],
}

impl Tile for F32 {
    const RAW_BYTES: usize = 128;
    const PARTS: usize = 1;
    const PAIRS: usize = 16;
    const SPAN: usize = 16;
    const ZERO: Self = F32 {
        w: [[[0.0; LANES]; 2]; 16],
    };
    const UNPACK_ONCE: bool = false;
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
    fn factors<S: Simd>(&self, s: S, _: usize) -> Factors<S::V> {
        Factors::scale(s.splat(1.0), s.zero())
    }
    #[inline(always)]
    fn weights<S: Simd>(&self, s: S, _: &Factors<S::V>, at: At) -> [S::V; 2] {
        self.quants(s, at)
    }
    #[inline(always)]
    fn quants<S: Simd>(&self, s: S, at: At) -> [S::V; 2] {
        let j = at.pair;
        [s.load(&self.w[j][0]), s.load(&self.w[j][1])]
    }
}

/// 16-bit weights of 16 columns: `w[j]` = inputs `j` and `j + 16`.
type Halves = [[[u16; LANES]; 2]; 16];

/// Column `c` of 16-bit weights, NaNs given the quiet bit `quiet`.
fn set_halves(w: &mut Halves, c: usize, raw: &[u8], quiet: u16) {
    let at = |i: usize| {
        let h = u16::from_le_bytes([raw[2 * i], raw[2 * i + 1]]);
        // A NaN has all exponent bits and some mantissa bit set; `quiet` is the
        // mantissa's top bit, so `2 * quiet - 1` masks the mantissa.
        let (exponent, mantissa) = (!(2 * quiet - 1) & 0x7FFF, 2 * quiet - 1);
        if h & exponent == exponent && h & mantissa != 0 {
            h | quiet
        } else {
            h
        }
    };
    for (j, w) in w.iter_mut().enumerate() {
        w[0][c] = at(j);
        w[1][c] = at(j + 16);
    }
}

/// Dense f16 weights.
#[derive(Clone, Copy)]
pub(in super::super) struct F16 {
    w: Halves,
}

impl Tile for F16 {
    const RAW_BYTES: usize = 64;
    const PARTS: usize = 1;
    const PAIRS: usize = 16;
    const SPAN: usize = 16;
    const ZERO: Self = F16 {
        w: [[[0; LANES]; 2]; 16],
    };
    const UNPACK_ONCE: bool = false;
    fn set_column(&mut self, c: usize, raw: &[u8]) {
        set_halves(&mut self.w, c, raw, 0x0200);
    }
    #[inline(always)]
    fn factors<S: Simd>(&self, s: S, _: usize) -> Factors<S::V> {
        Factors::scale(s.splat(1.0), s.zero())
    }
    #[inline(always)]
    fn weights<S: Simd>(&self, s: S, _: &Factors<S::V>, at: At) -> [S::V; 2] {
        self.quants(s, at)
    }
    #[inline(always)]
    fn quants<S: Simd>(&self, s: S, at: At) -> [S::V; 2] {
        let j = at.pair;
        [s.f16s(&self.w[j][0]), s.f16s(&self.w[j][1])]
    }
}

/// Dense bf16 weights.
#[derive(Clone, Copy)]
pub(in super::super) struct Bf16 {
    w: Halves,
}

impl Tile for Bf16 {
    const RAW_BYTES: usize = 64;
    const PARTS: usize = 1;
    const PAIRS: usize = 16;
    const SPAN: usize = 16;
    const ZERO: Self = Bf16 {
        w: [[[0; LANES]; 2]; 16],
    };
    const UNPACK_ONCE: bool = false;
    fn set_column(&mut self, c: usize, raw: &[u8]) {
        set_halves(&mut self.w, c, raw, 0x0040);
    }
    #[inline(always)]
    fn factors<S: Simd>(&self, s: S, _: usize) -> Factors<S::V> {
        Factors::scale(s.splat(1.0), s.zero())
    }
    #[inline(always)]
    fn weights<S: Simd>(&self, s: S, _: &Factors<S::V>, at: At) -> [S::V; 2] {
        self.quants(s, at)
    }
    #[inline(always)]
    fn quants<S: Simd>(&self, s: S, at: At) -> [S::V; 2] {
        let j = at.pair;
        [s.bf16s(&self.w[j][0]), s.bf16s(&self.w[j][1])]
    }
}
