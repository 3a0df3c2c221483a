//! The three ggml block formats, and dense f32 rows cut into blocks of 32, as the kernel
//! stores and dequantizes them.

use half::f16;

use super::simd::Simd;
use super::Half;

/// A ggml block with its f16 scale(s) widened to f32 once at load (lossless), so the
/// hot loop does no f16 conversion. The quants are kept exactly as stored.
///
/// `dequantize` reproduces candle's `to_float` bit for bit: `q * d` is exact in f32
/// (|q| ≤ 128 has at most 8 significant bits, an f16 scale at most 11), so the only
/// rounding is Q4_1's `+ m`, and a fused `q * d + m` rounds that same exact sum once
/// (signed zeros included).
pub(super) trait Block: Copy + Send + Sync {
    /// Bytes of one block in the GGUF / candle layout.
    const RAW_BYTES: usize;
    /// Parses one raw block (`raw.len() == RAW_BYTES`).
    fn parse(raw: &[u8]) -> Self;
    /// Weights 0..16 and 16..32 of the block. (`#[inline(always)]` in every impl, and
    /// the two halves written out rather than `array::map`ped: see `simd`, "Inlining".)
    fn dequantize<S: Simd>(&self, s: S) -> [S::V; 2];
}

fn f16_at(raw: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([raw[at], raw[at + 1]]).to_f32()
}

fn array_at<const N: usize>(raw: &[u8], at: usize) -> [u8; N] {
    std::array::from_fn(|i| raw[at + i])
}

/// Q4_0: `{d: f16, qs: [u8; 16]}`, `w = d * (nibble - 8)`; low nibbles are elements
/// 0..16, high nibbles 16..32.
#[derive(Clone, Copy)]
pub(super) struct Q4_0 {
    d: f32,
    qs: [u8; 16],
}

impl Block for Q4_0 {
    const RAW_BYTES: usize = 18;
    fn parse(raw: &[u8]) -> Self {
        Q4_0 {
            d: f16_at(raw, 0),
            qs: array_at(raw, 2),
        }
    }
    #[inline(always)]
    fn dequantize<S: Simd>(&self, s: S) -> [S::V; 2] {
        // `(nibble - 8) * d`, both steps exact; not `nibble * d - 8 * d`, which would
        // give +0.0 where candle gives -0.0 (nibble 8, negative d).
        let (d, minus8) = (s.splat(self.d), s.splat(-8.0));
        let [lo, hi] = s.nibbles(&self.qs);
        [s.mul(s.add(lo, minus8), d), s.mul(s.add(hi, minus8), d)]
    }
}

/// Q4_1: `{d: f16, m: f16, qs: [u8; 16]}`, `w = d * nibble + m`.
#[derive(Clone, Copy)]
pub(super) struct Q4_1 {
    d: f32,
    m: f32,
    qs: [u8; 16],
}

impl Block for Q4_1 {
    const RAW_BYTES: usize = 20;
    fn parse(raw: &[u8]) -> Self {
        Q4_1 {
            d: f16_at(raw, 0),
            m: f16_at(raw, 2),
            qs: array_at(raw, 4),
        }
    }
    #[inline(always)]
    fn dequantize<S: Simd>(&self, s: S) -> [S::V; 2] {
        let (d, m) = (s.splat(self.d), s.splat(self.m));
        let [lo, hi] = s.nibbles(&self.qs);
        [s.mul_add(lo, d, m), s.mul_add(hi, d, m)]
    }
}

/// Q8_0: `{d: f16, qs: [i8; 32]}`, `w = d * q`.
#[derive(Clone, Copy)]
pub(super) struct Q8_0 {
    d: f32,
    qs: [u8; 32],
}

impl Block for Q8_0 {
    const RAW_BYTES: usize = 34;
    fn parse(raw: &[u8]) -> Self {
        Q8_0 {
            d: f16_at(raw, 0),
            qs: array_at(raw, 2),
        }
    }
    #[inline(always)]
    fn dequantize<S: Simd>(&self, s: S) -> [S::V; 2] {
        let d = s.splat(self.d);
        let [lo, hi] = s.signed_bytes(&self.qs);
        [s.mul(lo, d), s.mul(hi, d)]
    }
}

/// 32 consecutive f32 weights of a dense matrix (Hugging Face checkpoints): the same
/// kernel, with "dequantization" a plain load, gives dense weights the same fixed
/// arithmetic per output and hence the same batch invariance.
#[derive(Clone, Copy)]
pub(super) struct F32x32 {
    w: [Half; 2],
}

impl F32x32 {
    pub(super) fn from_row_chunk(chunk: &[f32]) -> Self {
        F32x32 {
            w: [
                std::array::from_fn(|i| chunk[i]),
                std::array::from_fn(|i| chunk[16 + i]),
            ],
        }
    }
}

impl Block for F32x32 {
    const RAW_BYTES: usize = 128;
    fn parse(raw: &[u8]) -> Self {
        let at = |i: usize| {
            f32::from_le_bytes([raw[4 * i], raw[4 * i + 1], raw[4 * i + 2], raw[4 * i + 3]])
        };
        F32x32 {
            w: [std::array::from_fn(at), std::array::from_fn(|i| at(16 + i))],
        }
    }
    #[inline(always)]
    fn dequantize<S: Simd>(&self, s: S) -> [S::V; 2] {
        [s.load(&self.w[0]), s.load(&self.w[1])]
    }
}
