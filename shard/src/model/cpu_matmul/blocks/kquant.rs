//! The K-quant super-blocks of 256 inputs: Q4_K, Q5_K, Q6_K.
//!
//! Q4_K / Q5_K: eight sub-blocks of 32 inputs, each with its own 6-bit scale `sc` and min
//! `m`; `w = d1 * q - m1` with `d1 = d * sc`, `m1 = dmin * m` as candle computes them
//! (6-bit values times an f16: exact), and `d1 * q` exact too (≤ 17 + 5 significant
//! bits), so the fused `fma(q, d1, -m1)` rounds the same exact difference once, as
//! candle's `d1 * q - m1` does. ggml keeps inputs `64 g + l` and `64 g + 32 + l` (two
//! sub-blocks) in the low and high nibble of one byte; the tiles re-pair the nibbles at
//! load so that a part is one sub-block, as in Q4_1: part `p` = inputs `32 p ..`, pair `j`
//! = inputs `32 p + j` (low nibble) and `32 p + j + 16` (high nibble). Factors: `a = d1`,
//! `b = -m1`, one pair for the whole part, so these formats take the kernel's fast path.
//!
//! Q6_K: eight parts of 16 pairs (its scales change every 16 inputs), part `p` = half
//! `h = p / 4` (inputs `128 h ..`), pairs `j = 16 (p % 4) ..` of it, each the inputs
//! `128 h + j` (the low nibble of `ql` byte `j`) and `128 h + j + 64` (its high nibble).
//! `w = (d * sc) * q`: `d * sc` is exact (11 + 8 bits), the second product may round, and
//! is computed in that same order. The factors are `a = d * sc`, and a pair's two inputs
//! are different sub-blocks with their own (a split).

use super::super::simd::{Bytes, Simd};
use super::{f16_at, set_bit, set_lane_bytes, At, Factors, Scales, Tile, TILE};

/// The 12 packed scale bytes of 16 columns, two bytes a row: `sc[i][c]` is column `c`'s
/// byte `2 i`, `sc[i][16 + c]` its byte `2 i + 1`.
type PackedScales = [Bytes; 6];

fn set_packed_scales(sc: &mut PackedScales, c: usize, raw: &[u8]) {
    for (i, row) in sc.iter_mut().enumerate() {
        row[c] = raw[2 * i];
        row[TILE + c] = raw[2 * i + 1];
    }
}

/// Part `p`'s 6-bit scales and mins (ggml's `get_scale_min_k4` for sub-blocks `2 p` and
/// `2 p + 1`), in the pair layout: `(sc, m)`.
#[inline(always)]
fn scale_min<S: Simd>(s: S, sc: &PackedScales, p: usize) -> (S::B, S::B) {
    if p < 2 {
        let low6 = s.splat_bytes(63);
        (
            s.and(s.bytes(&sc[p]), low6),
            s.and(s.bytes(&sc[p + 2]), low6),
        )
    } else {
        // The low four bits from bytes `j + 4`, the top two from bits 6..8 of bytes
        // `j - 4` (scale) and `j` (min): `(x >> 6) << 4` is `(x >> 2) & 0x30`.
        let (low4, top2) = (s.splat_bytes(0x0F), s.splat_bytes(0x30));
        let base = s.bytes(&sc[p + 2]);
        let scale = s.or(
            s.and(base, low4),
            s.and(s.shr16(s.bytes(&sc[p - 2]), 2), top2),
        );
        let min = s.or(
            s.and(s.shr16(base, 4), low4),
            s.and(s.shr16(s.bytes(&sc[p]), 2), top2),
        );
        (scale, min)
    }
}

/// What Q4_K and Q5_K blocks start with, in the lanes of 16 columns: `{d: f16, dmin: f16,
/// scales: [u8; 12]}`.
#[derive(Clone, Copy)]
struct KScales {
    d: Scales,
    dmin: Scales,
    sc: PackedScales,
}

impl KScales {
    const ZERO: Self = KScales {
        d: [0; TILE],
        dmin: [0; TILE],
        sc: [[0; 2 * TILE]; 6],
    };

    /// Column `c`'s first 16 bytes, `raw`.
    fn set_column(&mut self, c: usize, raw: &[u8]) {
        self.d[c] = f16_at(raw, 0);
        self.dmin[c] = f16_at(raw, 2);
        set_packed_scales(&mut self.sc, c, &raw[4..16]);
    }

    /// Sub-block `p`'s factors: `a = d1`, `b = -m1`.
    #[inline(always)]
    fn part<S: Simd>(&self, s: S, p: usize) -> Factors<S::V> {
        let (scale, min) = scale_min(s, &self.sc, p / 2);
        let sc = s.widen_unsigned(scale)[p % 2];
        let m = s.widen_unsigned(min)[p % 2];
        let d = s.f16s(&self.d);
        // `(-dmin) * m` is `-(dmin * m)`, rounded alike (exactly).
        let minus_dmin = s.mul(s.f16s(&self.dmin), s.splat(-1.0));
        let (a, b) = (s.mul(d, sc), s.mul(minus_dmin, m));
        Factors {
            a: [a, a],
            b: [b, b],
        }
    }
}

/// The 4-bit quant of a Q4_K / Q5_K column's input `i` (of 256), from its 128 `qs` bytes.
fn k_nibble(qs: &[u8], i: usize) -> u8 {
    let (g, r) = (i / 64, i % 64);
    (qs[32 * g + r % 32] >> (4 * (r / 32))) & 0x0F
}

/// Re-pairs a column's 128 `qs` bytes into lane `c` of `out`: byte `16 p + j` gets the
/// quants of inputs `32 p + j` (low nibble) and `32 p + j + 16` (high nibble).
fn set_paired_nibbles(out: &mut [[u8; TILE]; 128], c: usize, qs: &[u8]) {
    for (b, row) in out.iter_mut().enumerate() {
        let (p, j) = (b / 16, b % 16);
        row[c] = k_nibble(qs, 32 * p + j) | (k_nibble(qs, 32 * p + j + 16) << 4);
    }
}

/// Q4_K: `{d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]}` per column.
#[derive(Clone, Copy)]
pub(in super::super) struct Q4K {
    head: KScales,
    /// `qs[16 p + j][c]`: column `c`'s quants of inputs `32 p + j` (low nibble) and
    /// `32 p + j + 16` (high nibble).
    qs: [[u8; TILE]; 128],
}

impl Tile for Q4K {
    const RAW_BYTES: usize = 144;
    const PARTS: usize = 8;
    const PAIRS: usize = 16;
    const SPAN: usize = 16;
    const ZERO: Self = Q4K {
        head: KScales::ZERO,
        qs: [[0; TILE]; 128],
    };
    const OFFSET: bool = true;
    fn set_column(&mut self, c: usize, raw: &[u8]) {
        self.head.set_column(c, raw);
        set_paired_nibbles(&mut self.qs, c, &raw[16..144]);
    }
    #[inline(always)]
    fn factors<S: Simd>(&self, s: S, p: usize) -> Factors<S::V> {
        self.head.part(s, p)
    }
    #[inline(always)]
    fn quants<S: Simd>(&self, s: S, at: At) -> [S::V; 2] {
        s.nibbles(&self.qs[16 * at.part + at.pair])
    }
    #[inline(always)]
    fn quant_bytes<S: Simd>(&self, s: S, at: At) -> Option<S::B> {
        Some(s.nibble_bytes(&self.qs[16 * at.part + at.pair]))
    }
}

/// Q5_K: `{d, dmin, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]}` per column; input
/// `64 g + l` has its 5th bit in bit `2 g` of `qh[l]`, input `64 g + 32 + l` in bit `2 g + 1`.
#[derive(Clone, Copy)]
pub(in super::super) struct Q5K {
    head: KScales,
    /// Bit planes: `qh[p][j]` bit `c` is the 5th bit of column `c`'s input `32 p + j`, bit
    /// `16 + c` that of its input `32 p + j + 16` (the same 32 bytes per column).
    qh: [[u32; 16]; 8],
    /// As Q4_K's.
    qs: [[u8; TILE]; 128],
}

impl Tile for Q5K {
    const RAW_BYTES: usize = 176;
    const PARTS: usize = 8;
    const PAIRS: usize = 16;
    const SPAN: usize = 16;
    const ZERO: Self = Q5K {
        head: KScales::ZERO,
        qh: [[0; 16]; 8],
        qs: [[0; TILE]; 128],
    };
    const OFFSET: bool = true;
    fn set_column(&mut self, c: usize, raw: &[u8]) {
        self.head.set_column(c, raw);
        let fifth = |i: usize| (raw[16 + i % 32] >> (2 * (i / 64) + (i % 64) / 32)) & 1 == 1;
        for (p, planes) in self.qh.iter_mut().enumerate() {
            for (j, plane) in planes.iter_mut().enumerate() {
                set_bit(plane, c, fifth(32 * p + j));
                set_bit(plane, TILE + c, fifth(32 * p + j + 16));
            }
        }
        set_paired_nibbles(&mut self.qs, c, &raw[48..176]);
    }
    #[inline(always)]
    fn factors<S: Simd>(&self, s: S, p: usize) -> Factors<S::V> {
        self.head.part(s, p)
    }
    #[inline(always)]
    fn quants<S: Simd>(&self, s: S, at: At) -> [S::V; 2] {
        s.widen_unsigned(self.q5(s, at))
    }
    #[inline(always)]
    fn quant_bytes<S: Simd>(&self, s: S, at: At) -> Option<S::B> {
        Some(self.q5(s, at))
    }
}

impl Q5K {
    /// Pair `at`'s `q5`: the nibble and its 5th bit.
    #[inline(always)]
    fn q5<S: Simd>(&self, s: S, at: At) -> S::B {
        let (p, j) = (at.part, at.pair);
        let fifth = s.and(s.bits(&self.qh[p][j]), s.splat_bytes(0x10));
        s.or(s.nibble_bytes(&self.qs[16 * p + j]), fifth)
    }
}

/// Q6_K: `{ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16}` per column, `w = (d *
/// sc) * (q6 - 32)`.
#[derive(Clone, Copy)]
pub(in super::super) struct Q6K {
    d: Scales,
    /// `sc[p]`: the scales of part `p`'s two inputs of a pair (`scales[8 h + p % 4]` in
    /// bytes 0..16, `scales[8 h + p % 4 + 4]` in 16..32), as i8.
    sc: [Bytes; 8],
    /// `ql[64 h + j][c]`: column `c`'s `ql` byte `64 h + j`.
    ql: [[u8; TILE]; 128],
    /// The two upper bits, re-laid in the pair layout: `qh[16 h + t]` byte `c` holds, in
    /// bits `2 i ..= 2 i + 1`, those of column `c`'s input `128 h + 16 i + t` (pair `t` of
    /// part `4 h + i`), byte `16 + c` those of its input 64 further on. The same 64 bytes
    /// per column, arranged so that a part takes them with one shift.
    qh: [Bytes; 32],
}

/// The two upper bits of Q6_K input `128 h + i` of a column with `qh` bytes `raw` (ggml:
/// byte `l` holds inputs `l`, `l + 32`, `l + 64`, `l + 96` of a half at bits 0, 2, 4, 6).
fn q6_upper(raw: &[u8], h: usize, i: usize) -> u8 {
    (raw[32 * h + i % 32] >> (2 * (i / 32))) & 3
}

impl Tile for Q6K {
    const RAW_BYTES: usize = 210;
    const PARTS: usize = 8;
    const PAIRS: usize = 16;
    const SPAN: usize = 64;
    const ZERO: Self = Q6K {
        d: [0; TILE],
        sc: [[0; 2 * TILE]; 8],
        ql: [[0; TILE]; 128],
        qh: [[0; 2 * TILE]; 32],
    };
    const SPLIT: bool = true;
    fn set_column(&mut self, c: usize, raw: &[u8]) {
        set_lane_bytes(&mut self.ql, c, &raw[0..128]);
        let qh = &raw[128..192];
        for (r, q) in self.qh.iter_mut().enumerate() {
            let (h, t) = (r / 16, r % 16);
            let (mut lo, mut hi) = (0, 0);
            for i in 0..4 {
                lo |= q6_upper(qh, h, 16 * i + t) << (2 * i);
                hi |= q6_upper(qh, h, 16 * i + t + 64) << (2 * i);
            }
            q[c] = lo;
            q[TILE + c] = hi;
        }
        for (p, sc) in self.sc.iter_mut().enumerate() {
            let (h, i) = (p / 4, p % 4);
            sc[c] = raw[192 + 8 * h + i];
            sc[TILE + c] = raw[192 + 8 * h + i + 4];
        }
        self.d[c] = f16_at(raw, 208);
    }
    #[inline(always)]
    fn factors<S: Simd>(&self, s: S, p: usize) -> Factors<S::V> {
        let d = s.f16s(&self.d);
        let [lo, hi] = s.widen_signed(s.bytes(&self.sc[p]));
        Factors {
            a: [s.mul(d, lo), s.mul(d, hi)],
            b: [s.zero(), s.zero()],
        }
    }
    #[inline(always)]
    fn quants<S: Simd>(&self, s: S, at: At) -> [S::V; 2] {
        s.widen_signed(self.signed(s, at))
    }
    #[inline(always)]
    fn quant_bytes<S: Simd>(&self, s: S, at: At) -> Option<S::B> {
        Some(self.signed(s, at))
    }
}

impl Q6K {
    /// Pair `at`'s `q6 - 32`, as i8.
    #[inline(always)]
    fn signed<S: Simd>(&self, s: S, at: At) -> S::B {
        let (p, t) = (at.part, at.pair);
        let (h, i) = (p / 4, p % 4);
        // Bits `2 i ..` of the re-laid `qh` to bits 4 and 5, beside the nibble.
        let upper = s.bytes(&self.qh[16 * h + t]);
        let upper = match i {
            3 => s.shr16(upper, 2),
            _ => s.shl16(upper, 4 - 2 * i as u32),
        };
        let q6 = s.or(
            s.nibble_bytes(&self.ql[64 * h + 16 * i + t]),
            s.and(upper, s.splat_bytes(0x30)),
        );
        s.sub_bytes(q6, s.splat_bytes(32))
    }
}
