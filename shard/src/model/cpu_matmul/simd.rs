//! 16-lane f32 vectors for the kernel, one implementation per instruction set.
//!
//! A [`Simd`] value is a *token*: holding one proves the CPU runs that implementation's
//! instructions (the x86 tokens are only built by `detect`, after asking the CPU), which
//! is what makes the safe methods below sound. Every implementation computes the same
//! bits: each lane does its own correctly rounded `mul` / fused `mul_add`, exactly what
//! the portable one does with `f32::mul_add`; only the speed differs.
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

/// The operations the kernel needs on 16 f32 lanes.
pub(super) trait Simd: Copy + Send + Sync {
    /// 16 lanes, in registers where the instruction set allows.
    type V: Copy;
    fn zero(self) -> Self::V;
    fn splat(self, v: f32) -> Self::V;
    fn load(self, h: &Half) -> Self::V;
    fn store(self, v: Self::V, h: &mut Half);
    /// `a * b + c`, rounded once.
    fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    /// The low nibbles of `q` (lanes 0..16) and the high nibbles, as f32 in 0..=15.
    fn nibbles(self, q: &[u8; 16]) -> [Self::V; 2];
    /// `q` read as i8: bytes 0..16 and 16..32, as f32.
    fn signed_bytes(self, q: &[u8; 32]) -> [Self::V; 2];
    /// 16 f16 (as bits) widened to f32, exactly.
    fn f16s(self, h: &[u16; 16]) -> Self::V;
}

/// Plain Rust, for any CPU. On x86 without FMA `f32::mul_add` is a (slow, correctly
/// rounded) libm call: the price of the same bits everywhere.
#[derive(Clone, Copy)]
pub(super) struct Portable;

impl Simd for Portable {
    type V = Half;
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
        [
            std::array::from_fn(|l| f32::from(q[l] & 0x0F)),
            std::array::from_fn(|l| f32::from(q[l] >> 4)),
        ]
    }
    #[inline(always)]
    fn signed_bytes(self, q: &[u8; 32]) -> [Half; 2] {
        [
            std::array::from_fn(|l| f32::from(q[l] as i8)),
            std::array::from_fn(|l| f32::from(q[l + 16] as i8)),
        ]
    }
    #[inline(always)]
    fn f16s(self, h: &[u16; 16]) -> Half {
        std::array::from_fn(|l| half::f16::from_bits(h[l]).to_f32())
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) use x86::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Half, Simd};

    /// Token for AVX2 + FMA: lanes 0..8 and 8..16 in two `__m256`.
    #[derive(Clone, Copy)]
    pub(in super::super) struct Avx2 {
        _checked: (),
    }

    impl Avx2 {
        pub(in super::super) fn detect() -> Option<Self> {
            (is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c"))
            .then_some(Avx2 { _checked: () })
        }
    }

    // SAFETY (every `unsafe` block in the `Avx2` impls): an `Avx2` exists only if
    // `detect` saw AVX2, FMA and F16C on this CPU, so the intrinsics' instructions are
    // available; every pointer is derived from a reference to an array long enough for
    // the access (8 f32 at offset 0 or 8 of a 16-f32 array; 8 u16 at offset 0 or 8 of a
    // 16-u16 array; 16 or 8 bytes of a 16- or 8-byte array), and the `loadu`/`storeu`
    // forms need no alignment.
    impl Avx2 {
        /// Bytes 0..8 and 8..16 of `b`, zero-extended, as f32.
        #[inline(always)]
        fn u8x16(self, b: __m128i) -> [__m256; 2] {
            unsafe {
                [
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)),
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(b))),
                ]
            }
        }

        /// `q` read as i8, as f32.
        #[inline(always)]
        fn i8x8(self, q: &[u8; 8]) -> __m256 {
            unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q.as_ptr().cast()))) }
        }
    }

    impl Simd for Avx2 {
        type V = [__m256; 2];
        #[inline(always)]
        fn zero(self) -> Self::V {
            unsafe { [_mm256_setzero_ps(); 2] }
        }
        #[inline(always)]
        fn splat(self, v: f32) -> Self::V {
            unsafe { [_mm256_set1_ps(v); 2] }
        }
        #[inline(always)]
        fn load(self, h: &Half) -> Self::V {
            unsafe {
                [
                    _mm256_loadu_ps(h.as_ptr()),
                    _mm256_loadu_ps(h.as_ptr().add(8)),
                ]
            }
        }
        #[inline(always)]
        fn store(self, v: Self::V, h: &mut Half) {
            unsafe {
                _mm256_storeu_ps(h.as_mut_ptr(), v[0]);
                _mm256_storeu_ps(h.as_mut_ptr().add(8), v[1]);
            }
        }
        #[inline(always)]
        fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V {
            unsafe {
                [
                    _mm256_fmadd_ps(a[0], b[0], c[0]),
                    _mm256_fmadd_ps(a[1], b[1], c[1]),
                ]
            }
        }
        #[inline(always)]
        fn mul(self, a: Self::V, b: Self::V) -> Self::V {
            unsafe { [_mm256_mul_ps(a[0], b[0]), _mm256_mul_ps(a[1], b[1])] }
        }
        #[inline(always)]
        fn add(self, a: Self::V, b: Self::V) -> Self::V {
            unsafe { [_mm256_add_ps(a[0], b[0]), _mm256_add_ps(a[1], b[1])] }
        }
        #[inline(always)]
        fn nibbles(self, q: &[u8; 16]) -> [Self::V; 2] {
            unsafe {
                let v = _mm_loadu_si128(q.as_ptr().cast());
                let mask = _mm_set1_epi8(0x0F);
                let lo = _mm_and_si128(v, mask);
                let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), mask);
                [self.u8x16(lo), self.u8x16(hi)]
            }
        }
        #[inline(always)]
        fn signed_bytes(self, q: &[u8; 32]) -> [Self::V; 2] {
            let (q, _) = q.as_chunks::<8>();
            [
                [self.i8x8(&q[0]), self.i8x8(&q[1])],
                [self.i8x8(&q[2]), self.i8x8(&q[3])],
            ]
        }
        #[inline(always)]
        fn f16s(self, h: &[u16; 16]) -> Self::V {
            unsafe {
                [
                    _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().cast())),
                    _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().add(8).cast())),
                ]
            }
        }
    }

    /// Token for AVX-512F (plus AVX2 and FMA): 16 lanes in one `__m512`.
    #[derive(Clone, Copy)]
    pub(in super::super) struct Avx512 {
        _checked: (),
    }

    impl Avx512 {
        pub(in super::super) fn detect() -> Option<Self> {
            (is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma"))
            .then_some(Avx512 { _checked: () })
        }

        /// `q` read as i8, as f32.
        #[inline(always)]
        fn i8x16(self, q: &[u8; 16]) -> __m512 {
            // SAFETY: as in the `Simd` impl below.
            unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q.as_ptr().cast()))) }
        }
    }

    // SAFETY (every `unsafe` block in this impl): an `Avx512` exists only if `detect`
    // saw AVX-512F, AVX2 and FMA on this CPU; pointers come from references to arrays
    // of at least the 64 bytes (16 f32), 32 bytes (16 u16) or 16 bytes read or written; `loadu`/`storeu`
    // need no alignment.
    impl Simd for Avx512 {
        type V = __m512;
        #[inline(always)]
        fn zero(self) -> Self::V {
            unsafe { _mm512_setzero_ps() }
        }
        #[inline(always)]
        fn splat(self, v: f32) -> Self::V {
            unsafe { _mm512_set1_ps(v) }
        }
        #[inline(always)]
        fn load(self, h: &Half) -> Self::V {
            unsafe { _mm512_loadu_ps(h.as_ptr()) }
        }
        #[inline(always)]
        fn store(self, v: Self::V, h: &mut Half) {
            unsafe { _mm512_storeu_ps(h.as_mut_ptr(), v) }
        }
        #[inline(always)]
        fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V {
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        fn mul(self, a: Self::V, b: Self::V) -> Self::V {
            unsafe { _mm512_mul_ps(a, b) }
        }
        #[inline(always)]
        fn add(self, a: Self::V, b: Self::V) -> Self::V {
            unsafe { _mm512_add_ps(a, b) }
        }
        #[inline(always)]
        fn nibbles(self, q: &[u8; 16]) -> [Self::V; 2] {
            unsafe {
                let v = _mm_loadu_si128(q.as_ptr().cast());
                let mask = _mm_set1_epi8(0x0F);
                let lo = _mm_and_si128(v, mask);
                let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), mask);
                [
                    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)),
                    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)),
                ]
            }
        }
        #[inline(always)]
        fn signed_bytes(self, q: &[u8; 32]) -> [Self::V; 2] {
            let (q, _) = q.as_chunks::<16>();
            [self.i8x16(&q[0]), self.i8x16(&q[1])]
        }
        #[inline(always)]
        fn f16s(self, h: &[u16; 16]) -> Self::V {
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(h.as_ptr().cast())) }
        }
    }
}
