//! 16-lane f32 vectors for the kernel, one implementation per instruction set.
//!
//! A [`Simd`] value is a *token*: holding one proves the CPU runs that implementation's
//! instructions (the x86 tokens are only built by `detect`, after asking the CPU), which
//! is what makes the safe methods below sound. Every implementation computes the same
//! bits: each lane does its own correctly rounded `mul` / fused `mul_add`, exactly what
//! the portable one does with `f32::mul_add`, and the byte operations are integer
//! operations with one defined result; only the speed differs.
//!
//! Besides f32 vectors (`V`) a token has 32-byte vectors (`B`) in the *pair layout*: byte
//! `c` belongs to column `c`'s first input of a pair and byte `16 + c` to its second (see
//! `blocks`). The formats build their quants in bytes (nibbles, 5th and 6th bits, offsets)
//! and widen them to f32 once.
//!
//! # Inlining
//!
//! The intrinsics carry `#[target_feature]`, and LLVM never inlines a function into one
//! with fewer target features: an intrinsic reached through any ordinary function that
//! is not itself inlined becomes a call (and its vectors go through memory) inside the
//! hot loop. So every method and helper here is `#[inline(always)]`, taking no closures
//! and calling no `array::map` / `from_fn` on vectors: the whole chain then inlines into
//! the kernel's `#[target_feature]` entry function, where the intrinsics inline too.

use super::{Half, LANES};

#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
pub(super) use x86::{Avx2, Avx512};

/// 32 bytes in the pair layout (see the module docs).
pub(super) type Bytes = [u8; 2 * LANES];

/// The operations the kernel needs on 16 f32 lanes and on 32 bytes.
pub(super) trait Simd: Copy + Send + Sync {
    /// 16 f32 lanes, in registers where the instruction set allows.
    type V: Copy;
    /// 32 bytes, in registers where the instruction set allows.
    type B: Copy;
    fn zero(self) -> Self::V;
    fn splat(self, v: f32) -> Self::V;
    fn load(self, h: &Half) -> Self::V;
    fn store(self, v: Self::V, h: &mut Half);
    /// `a * b + c`, rounded once.
    fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    /// `sums[c] = fma(x, splat(q[c]), sums[c])` for each `c < C` (`q.len() >= C`): the
    /// step of the kernel that puts rows in lanes.
    #[inline(always)]
    fn mul_add_each<const C: usize>(self, x: Self::V, q: &[f32], sums: &mut [Self::V; C]) {
        mul_add_each(self, x, q, sums)
    }
    /// The low nibbles of `q` (lanes 0..16) and the high nibbles, as f32 in 0..=15.
    fn nibbles(self, q: &[u8; 16]) -> [Self::V; 2];
    /// `q` read as i8: bytes 0..16 and 16..32, as f32.
    fn signed_bytes(self, q: &Bytes) -> [Self::V; 2];
    /// 16 f16 (as bits) widened to f32, exactly.
    fn f16s(self, h: &[u16; 16]) -> Self::V;
    /// 16 bf16 (as bits) widened to f32, exactly (`bits << 16`: NaNs are quieted when
    /// the tiles are built, see `blocks::dense`).
    fn bf16s(self, h: &[u16; 16]) -> Self::V;

    fn bytes(self, q: &Bytes) -> Self::B;
    fn store_bytes(self, b: Self::B, out: &mut Bytes);
    fn splat_bytes(self, v: u8) -> Self::B;
    /// Bytes 0..16: the low nibbles of `q`; bytes 16..32: its high nibbles.
    fn nibble_bytes(self, q: &[u8; 16]) -> Self::B;
    /// Byte `i` is `0xFF` where bit `i` of `h` is set, else `0`.
    fn bits(self, h: &u32) -> Self::B;
    fn and(self, a: Self::B, b: Self::B) -> Self::B;
    fn or(self, a: Self::B, b: Self::B) -> Self::B;
    /// `!a & b`.
    fn and_not(self, a: Self::B, b: Self::B) -> Self::B;
    /// Bytewise `a - b`, wrapping.
    fn sub_bytes(self, a: Self::B, b: Self::B) -> Self::B;
    /// Each little-endian u16 (bytes `2i`, `2i + 1`) shifted left by `n` (`n < 16`): bits
    /// cross from a byte into the next; callers mask them off.
    fn shl16(self, a: Self::B, n: u32) -> Self::B;
    /// As [`Simd::shl16`], shifted right.
    fn shr16(self, a: Self::B, n: u32) -> Self::B;
    /// The 32 bytes as u8, widened to f32: `[bytes 0..16, bytes 16..32]`.
    fn widen_unsigned(self, b: Self::B) -> [Self::V; 2];
    /// The 32 bytes as i8, widened to f32.
    fn widen_signed(self, b: Self::B) -> [Self::V; 2];
}

/// [`Simd::mul_add_each`] with the trait's other methods.
#[inline(always)]
fn mul_add_each<S: Simd, const C: usize>(s: S, x: S::V, q: &[f32], sums: &mut [S::V; C]) {
    for (sum, &q) in sums.iter_mut().zip(q) {
        *sum = s.mul_add(x, s.splat(q), *sum);
    }
}

/// Plain Rust, for any CPU. On x86 without FMA `f32::mul_add` is a (slow, correctly
/// rounded) libm call: the price of the same bits everywhere.
#[derive(Clone, Copy)]
pub(super) struct Portable;

impl Simd for Portable {
    type V = Half;
    type B = Bytes;
    #[inline(always)]
    fn zero(self) -> Half {
        [0.0; LANES]
    }
    #[inline(always)]
    fn splat(self, v: f32) -> Half {
        [v; LANES]
    }
    #[inline(always)]
    fn load(self, h: &Half) -> Half {
        *h
    }
    #[inline(always)]
    fn store(self, v: Half, h: &mut Half) {
        *h = v;
    }
    #[inline(always)]
    fn mul_add(self, a: Half, b: Half, c: Half) -> Half {
        std::array::from_fn(|l| a[l].mul_add(b[l], c[l]))
    }
    #[inline(always)]
    fn mul(self, a: Half, b: Half) -> Half {
        std::array::from_fn(|l| a[l] * b[l])
    }
    #[inline(always)]
    fn add(self, a: Half, b: Half) -> Half {
        std::array::from_fn(|l| a[l] + b[l])
    }
    #[inline(always)]
    fn nibbles(self, q: &[u8; 16]) -> [Half; 2] {
        self.widen_unsigned(self.nibble_bytes(q))
    }
    #[inline(always)]
    fn signed_bytes(self, q: &Bytes) -> [Half; 2] {
        self.widen_signed(*q)
    }
    #[inline(always)]
    fn f16s(self, h: &[u16; 16]) -> Half {
        std::array::from_fn(|l| half::f16::from_bits(h[l]).to_f32())
    }
    #[inline(always)]
    fn bf16s(self, h: &[u16; 16]) -> Half {
        std::array::from_fn(|l| f32::from_bits(u32::from(h[l]) << 16))
    }

    #[inline(always)]
    fn bytes(self, q: &Bytes) -> Bytes {
        *q
    }
    #[inline(always)]
    fn store_bytes(self, b: Bytes, out: &mut Bytes) {
        *out = b;
    }
    #[inline(always)]
    fn splat_bytes(self, v: u8) -> Bytes {
        [v; 2 * LANES]
    }
    #[inline(always)]
    fn nibble_bytes(self, q: &[u8; 16]) -> Bytes {
        std::array::from_fn(|i| {
            if i < LANES {
                q[i] & 0x0F
            } else {
                q[i - LANES] >> 4
            }
        })
    }
    #[inline(always)]
    fn bits(self, h: &u32) -> Bytes {
        std::array::from_fn(|i| if (h >> i) & 1 == 1 { 0xFF } else { 0 })
    }
    #[inline(always)]
    fn and(self, a: Bytes, b: Bytes) -> Bytes {
        std::array::from_fn(|i| a[i] & b[i])
    }
    #[inline(always)]
    fn or(self, a: Bytes, b: Bytes) -> Bytes {
        std::array::from_fn(|i| a[i] | b[i])
    }
    #[inline(always)]
    fn and_not(self, a: Bytes, b: Bytes) -> Bytes {
        std::array::from_fn(|i| !a[i] & b[i])
    }
    #[inline(always)]
    fn sub_bytes(self, a: Bytes, b: Bytes) -> Bytes {
        std::array::from_fn(|i| a[i].wrapping_sub(b[i]))
    }
    #[inline(always)]
    fn shl16(self, a: Bytes, n: u32) -> Bytes {
        shift16(a, |w| w << n)
    }
    #[inline(always)]
    fn shr16(self, a: Bytes, n: u32) -> Bytes {
        shift16(a, |w| w >> n)
    }
    #[inline(always)]
    fn widen_unsigned(self, b: Bytes) -> [Half; 2] {
        [
            std::array::from_fn(|l| f32::from(b[l])),
            std::array::from_fn(|l| f32::from(b[LANES + l])),
        ]
    }
    #[inline(always)]
    fn widen_signed(self, b: Bytes) -> [Half; 2] {
        [
            std::array::from_fn(|l| f32::from(b[l] as i8)),
            std::array::from_fn(|l| f32::from(b[LANES + l] as i8)),
        ]
    }
}

/// `a` as 16 little-endian u16, each replaced by `f(it)`.
#[inline(always)]
fn shift16(a: Bytes, f: impl Fn(u16) -> u16) -> Bytes {
    let mut out = [0u8; 2 * LANES];
    for (o, w) in out.chunks_exact_mut(2).zip(a.chunks_exact(2)) {
        o.copy_from_slice(&f(u16::from_le_bytes([w[0], w[1]])).to_le_bytes());
    }
    out
}
