//! The 32-input ggml blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0. One part of 16 pairs, pair `j`
//! = inputs `j` and `j + 16` (byte `j` holds both in Q4/Q5; Q8_0 keeps them 16 bytes
//! apart).
//!
//! The quants are the integers candle scales (`q - 8`, `q5 - 16`, the nibble, the i8), the
//! factors `a = d` and, for Q4_1 and Q5_1, `b = m`; one scale for the whole block, so no
//! split. Why the weights equal candle's `to_float` bit for bit: `q * d` is exact in f32
//! (|q| ≤ 128 has at most 8 significant bits, an f16 scale at most 11), so the only
//! rounding is Q4_1's and Q5_1's `+ m`, and a fused `q * d + m` rounds that same exact sum
//! once (signed zeros included). The fixed offsets (`- 8`, `- 16`) are applied to the
//! integer before it is scaled, as candle does, never as `q * d - 8 * d` (which gives +0.0
//! where candle gives -0.0 for a negative `d`).

use super::super::simd::{Bytes, Simd};
use super::{f16_at, set_bit, set_lane_bytes, At, Factors, Scales, Tile, TILE};

/// Q4_0: `{d: f16, qs: [u8; 16]}` per column, `w = (nibble - 8) * d`.
#[derive(Clone, Copy)]
pub(in super::super) struct Q4_0 {
    d: Scales,
    /// `qs[j][c]`: column `c`'s byte `j` (inputs `j` and `j + 16`).
    qs: [[u8; TILE]; 16],
}

impl Tile for Q4_0 {
    const RAW_BYTES: usize = 18;
    const PARTS: usize = 1;
    const PAIRS: usize = 16;
    const SPAN: usize = 16;
    const ZERO: Self = Q4_0 {
        d: [0; TILE],
        qs: [[0; TILE]; 16],
    };
    fn set_column(&mut self, c: usize, raw: &[u8]) {
        self.d[c] = f16_at(raw, 0);
        set_lane_bytes(&mut self.qs, c, &raw[2..18]);
    }
    #[inline(always)]
    fn factors<S: Simd>(&self, s: S, _: usize) -> Factors<S::V> {
        Factors::scale(s.f16s(&self.d), s.zero())
    }
    #[inline(always)]
    fn quants<S: Simd>(&self, s: S, at: At) -> [S::V; 2] {
        s.widen_signed(self.signed(s, at.pair))
    }
    #[inline(always)]
    fn quant_bytes<S: Simd>(&self, s: S, at: At) -> Option<S::B> {
        Some(self.signed(s, at.pair))
    }
}

impl Q4_0 {
    /// Pair `j`'s `nibble - 8`, as i8.
    #[inline(always)]
    fn signed<S: Simd>(&self, s: S, j: usize) -> S::B {
        s.sub_bytes(s.nibble_bytes(&self.qs[j]), s.splat_bytes(8))
    }
}

/// Q4_1: `{d: f16, m: f16, qs: [u8; 16]}` per column, `w = nibble * d + m`.
#[derive(Clone, Copy)]
pub(in super::super) struct Q4_1 {
    d: Scales,
    m: Scales,
    qs: [[u8; TILE]; 16],
}

impl Tile for Q4_1 {
    const RAW_BYTES: usize = 20;
    const PARTS: usize = 1;
    const PAIRS: usize = 16;
    const SPAN: usize = 16;
    const ZERO: Self = Q4_1 {
        d: [0; TILE],
        m: [0; TILE],
        qs: [[0; TILE]; 16],
    };
    const OFFSET: bool = true;
    fn set_column(&mut self, c: usize, raw: &[u8]) {
        self.d[c] = f16_at(raw, 0);
        self.m[c] = f16_at(raw, 2);
        set_lane_bytes(&mut self.qs, c, &raw[4..20]);
    }
    #[inline(always)]
    fn factors<S: Simd>(&self, s: S, _: usize) -> Factors<S::V> {
        let (d, m) = (s.f16s(&self.d), s.f16s(&self.m));
        Factors {
            a: [d, d],
            b: [m, m],
        }
    }
    #[inline(always)]
    fn quants<S: Simd>(&self, s: S, at: At) -> [S::V; 2] {
        s.nibbles(&self.qs[at.pair])
    }
    #[inline(always)]
    fn quant_bytes<S: Simd>(&self, s: S, at: At) -> Option<S::B> {
        Some(s.nibble_bytes(&self.qs[at.pair]))
    }
}

/// The 5th bits of a Q5 block, re-laid as bit planes: `qh[j]` bit `c` is column `c`'s
/// bit `j` (input `j`), bit `16 + c` its bit `j + 16` — the same 4 bytes per column.
fn set_fifth_bits(qh: &mut [u32; 16], c: usize, raw: &[u8]) {
    let h = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
    for (j, q) in qh.iter_mut().enumerate() {
        set_bit(q, c, (h >> j) & 1 == 1);
        set_bit(q, TILE + c, (h >> (j + 16)) & 1 == 1);
    }
}

/// Q5_0: `{d: f16, qh: u32, qs: [u8; 16]}` per column, `w = (q5 - 16) * d` with `q5` a
/// nibble and its 5th bit from `qh`.
#[derive(Clone, Copy)]
pub(in super::super) struct Q5_0 {
    d: Scales,
    qh: [u32; 16],
    qs: [[u8; TILE]; 16],
}

impl Tile for Q5_0 {
    const RAW_BYTES: usize = 22;
    const PARTS: usize = 1;
    const PAIRS: usize = 16;
    const SPAN: usize = 16;
    const ZERO: Self = Q5_0 {
        d: [0; TILE],
        qh: [0; 16],
        qs: [[0; TILE]; 16],
    };
    fn set_column(&mut self, c: usize, raw: &[u8]) {
        self.d[c] = f16_at(raw, 0);
        set_fifth_bits(&mut self.qh, c, &raw[2..6]);
        set_lane_bytes(&mut self.qs, c, &raw[6..22]);
    }
    #[inline(always)]
    fn factors<S: Simd>(&self, s: S, _: usize) -> Factors<S::V> {
        Factors::scale(s.f16s(&self.d), s.zero())
    }
    #[inline(always)]
    fn quants<S: Simd>(&self, s: S, at: At) -> [S::V; 2] {
        s.widen_signed(self.signed(s, at.pair))
    }
    #[inline(always)]
    fn quant_bytes<S: Simd>(&self, s: S, at: At) -> Option<S::B> {
        Some(self.signed(s, at.pair))
    }
}

impl Q5_0 {
    /// Pair `j`'s `q5 - 16` as i8: the nibble where the 5th bit is set, else the nibble
    /// with its upper four bits set (`nibble | 0xF0` is `nibble - 16`).
    #[inline(always)]
    fn signed<S: Simd>(&self, s: S, j: usize) -> S::B {
        let fifth = s.bits(&self.qh[j]);
        s.or(
            s.nibble_bytes(&self.qs[j]),
            s.and_not(fifth, s.splat_bytes(0xF0)),
        )
    }
}

/// Q5_1: `{d: f16, m: f16, qh: u32, qs: [u8; 16]}` per column, `w = q5 * d + m`.
#[derive(Clone, Copy)]
pub(in super::super) struct Q5_1 {
    d: Scales,
    m: Scales,
    qh: [u32; 16],
    qs: [[u8; TILE]; 16],
}

impl Tile for Q5_1 {
    const RAW_BYTES: usize = 24;
    const PARTS: usize = 1;
    const PAIRS: usize = 16;
    const SPAN: usize = 16;
    const ZERO: Self = Q5_1 {
        d: [0; TILE],
        m: [0; TILE],
        qh: [0; 16],
        qs: [[0; TILE]; 16],
    };
    const OFFSET: bool = true;
    fn set_column(&mut self, c: usize, raw: &[u8]) {
        self.d[c] = f16_at(raw, 0);
        self.m[c] = f16_at(raw, 2);
        set_fifth_bits(&mut self.qh, c, &raw[4..8]);
        set_lane_bytes(&mut self.qs, c, &raw[8..24]);
    }
    #[inline(always)]
    fn factors<S: Simd>(&self, s: S, _: usize) -> Factors<S::V> {
        let (d, m) = (s.f16s(&self.d), s.f16s(&self.m));
        Factors {
            a: [d, d],
            b: [m, m],
        }
    }
    #[inline(always)]
    fn quants<S: Simd>(&self, s: S, at: At) -> [S::V; 2] {
        s.widen_unsigned(self.q5(s, at.pair))
    }
    #[inline(always)]
    fn quant_bytes<S: Simd>(&self, s: S, at: At) -> Option<S::B> {
        Some(self.q5(s, at.pair))
    }
}

impl Q5_1 {
    /// Pair `j`'s `q5`: the nibble and its 5th bit.
    #[inline(always)]
    fn q5<S: Simd>(&self, s: S, j: usize) -> S::B {
        let fifth = s.and(s.bits(&self.qh[j]), s.splat_bytes(0x10));
        s.or(s.nibble_bytes(&self.qs[j]), fifth)
    }
}

/// Q8_0: `{d: f16, qs: [i8; 32]}` per column, `w = q * d`.
#[derive(Clone, Copy)]
pub(in super::super) struct Q8_0 {
    d: Scales,
    /// `qs[j][c]`: column `c`'s input `j`; `qs[j][16 + c]`: its input `j + 16`.
    qs: [Bytes; 16],
}

impl Q8_0 {
    /// The 16 columns' scales `d`, as f16 bits.
    pub(in super::super) fn scale_bits(&self) -> &[u16; TILE] {
        &self.d
    }

    /// The quants, pair after pair: `[j][c]` column `c`'s input `j`, `[j][16 + c]` its
    /// input `j + 16` (512 bytes, one after the other).
    pub(in super::super) fn quant_bytes_all(&self) -> &[Bytes; 16] {
        &self.qs
    }
}

impl Tile for Q8_0 {
    const RAW_BYTES: usize = 34;
    const PARTS: usize = 1;
    const PAIRS: usize = 16;
    const SPAN: usize = 16;
    const UNPACK_ONCE: bool = false;
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
    fn factors<S: Simd>(&self, s: S, _: usize) -> Factors<S::V> {
        Factors::scale(s.f16s(&self.d), s.zero())
    }
    #[inline(always)]
    fn quants<S: Simd>(&self, s: S, at: At) -> [S::V; 2] {
        s.signed_bytes(&self.qs[at.pair])
    }
}
