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
    /// The sum of the lanes by the fixed tree of [`fold_lanes`], bit for bit.
    fn fold(self, v: Self::V) -> f32;
}

/// The fixed lane reduction: 16 → 8 → 4 → 2 → 1 by `v[l] += v[l + width]`.
#[inline(always)]
pub(super) fn fold_lanes(mut v: Half) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            v[l] += v[l + width];
        }
        width /= 2;
    }
    v[0]
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
    fn fold(self, v: Half) -> f32 {
        fold_lanes(v)
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
            (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
                .then_some(Avx2 { _checked: () })
        }
    }

    // SAFETY (every `unsafe` block in the `Avx2` impls): an `Avx2` exists only if
    // `detect` saw AVX2 and FMA on this CPU (or an `Avx512`, which implies them, made
    // it), so the intrinsics' instructions are available; every pointer is derived from
    // a reference to an array long enough for the access (8 f32 at offset 0 or 8 of a
    // 16-f32 array; 16 or 8 bytes of a 16- or 8-byte array), and the `loadu`/`storeu`
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

        /// The last three levels of the fixed tree (8 → 4 → 2 → 1), `v[l] + v[l + w]`
        /// as [`super::fold_lanes`] adds them.
        #[inline(always)]
        fn fold8(self, v: __m256) -> f32 {
            unsafe {
                let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
                let v = _mm_add_ss(v, _mm_movehdup_ps(v));
                _mm_cvtss_f32(v)
            }
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
        fn fold(self, v: Self::V) -> f32 {
            // 16 → 8: lane `l` of the low half plus lane `l` of the high half.
            self.fold8(unsafe { _mm256_add_ps(v[0], v[1]) })
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

        /// `detect` checked AVX2 and FMA too.
        #[inline(always)]
        fn avx2(self) -> Avx2 {
            Avx2 { _checked: () }
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
    // of at least the 64 bytes (16 f32) or 16 bytes read or written; `loadu`/`storeu`
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
        fn fold(self, v: Self::V) -> f32 {
            // 16 → 8: lanes 0..8 plus lanes 8..16 (moved down by a 128-bit shuffle).
            // With 512-bit instructions, not a 256-bit extract: only AVX-512VL could
            // extract from registers 16..31, and the accumulators must be free to use
            // all 32 (without it, the register allocator spills them in the hot loop).
            let v = unsafe {
                let hi = _mm512_shuffle_f32x4::<0b11_10_11_10>(v, v);
                _mm512_castps512_ps256(_mm512_add_ps(v, hi))
            };
            self.avx2().fold8(v)
        }
    }
}
