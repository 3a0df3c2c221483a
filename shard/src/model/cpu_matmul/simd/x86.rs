//! The x86-64 implementations: AVX2 + FMA (two `__m256` per vector) and AVX-512F (one
//! `__m512`). Both keep bytes in one `__m256i` and share the AVX2 byte operations (an
//! AVX-512 token implies AVX2), so the only AVX-512-specific steps are the widenings.

use std::arch::x86_64::*;

use super::{Bytes, Half, Simd};

/// Token for AVX2 + FMA + F16C: lanes 0..8 and 8..16 in two `__m256`.
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

// SAFETY (every `unsafe` block in the `Avx2` impls): an `Avx2` exists only if `detect`
// saw AVX2, FMA and F16C on this CPU, so the intrinsics' instructions are available;
// every pointer is derived from a reference to an array long enough for the access (8
// f32 at offset 0 or 8 of a 16-f32 array; 8 u16 at offset 0 or 8 of a 16-u16 array; 32,
// 16 or 8 bytes of an array at least that long), and the `loadu`/`storeu` forms need no
// alignment.
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

    /// Bytes 0..8 and 8..16 of `b`, sign-extended, as f32.
    #[inline(always)]
    fn i8x16(self, b: __m128i) -> [__m256; 2] {
        unsafe {
            [
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(b))),
            ]
        }
    }

    /// `q` read as i8, as f32.
    #[inline(always)]
    fn i8x8(self, q: &[u8; 8]) -> __m256 {
        unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q.as_ptr().cast()))) }
    }

    /// 8 bf16 (the low halves of `h`'s 16-bit lanes) as f32.
    #[inline(always)]
    fn bf16x8(self, h: __m128i) -> __m256 {
        unsafe { _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h))) }
    }
}

impl Simd for Avx2 {
    type V = [__m256; 2];
    type B = __m256i;
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
    fn signed_bytes(self, q: &Bytes) -> [Self::V; 2] {
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
    #[inline(always)]
    fn bf16s(self, h: &[u16; 16]) -> Self::V {
        unsafe {
            [
                self.bf16x8(_mm_loadu_si128(h.as_ptr().cast())),
                self.bf16x8(_mm_loadu_si128(h.as_ptr().add(8).cast())),
            ]
        }
    }

    #[inline(always)]
    fn bytes(self, q: &Bytes) -> __m256i {
        unsafe { _mm256_loadu_si256(q.as_ptr().cast()) }
    }
    #[inline(always)]
    fn store_bytes(self, b: __m256i, out: &mut Bytes) {
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), b) }
    }
    #[inline(always)]
    fn splat_bytes(self, v: u8) -> __m256i {
        unsafe { _mm256_set1_epi8(v as i8) }
    }
    #[inline(always)]
    fn nibble_bytes(self, q: &[u8; 16]) -> __m256i {
        unsafe {
            // `q` in both 128-bit halves, the upper one shifted down by a nibble.
            let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(q.as_ptr().cast()));
            let v = _mm256_srlv_epi64(v, _mm256_set_epi64x(4, 4, 0, 0));
            _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
        }
    }
    #[inline(always)]
    fn bits(self, h: &u32) -> __m256i {
        unsafe {
            // Byte `i` gets byte `i / 8` of `h` (each 128-bit half holds all of `h`), then
            // the bit `i % 8` of it is tested.
            let v = _mm256_set1_epi32(*h as i32);
            let idx = _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                3, 3, 3, 3,
            );
            let select = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
            let v = _mm256_and_si256(_mm256_shuffle_epi8(v, idx), select);
            _mm256_cmpeq_epi8(v, select)
        }
    }
    #[inline(always)]
    fn and(self, a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_and_si256(a, b) }
    }
    #[inline(always)]
    fn or(self, a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_or_si256(a, b) }
    }
    #[inline(always)]
    fn and_not(self, a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_andnot_si256(a, b) }
    }
    #[inline(always)]
    fn sub_bytes(self, a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_sub_epi8(a, b) }
    }
    #[inline(always)]
    fn shl16(self, a: __m256i, n: u32) -> __m256i {
        unsafe { _mm256_sll_epi16(a, _mm_cvtsi32_si128(n as i32)) }
    }
    #[inline(always)]
    fn shr16(self, a: __m256i, n: u32) -> __m256i {
        unsafe { _mm256_srl_epi16(a, _mm_cvtsi32_si128(n as i32)) }
    }
    #[inline(always)]
    fn widen_unsigned(self, b: __m256i) -> [Self::V; 2] {
        unsafe {
            [
                self.u8x16(_mm256_castsi256_si128(b)),
                self.u8x16(_mm256_extracti128_si256::<1>(b)),
            ]
        }
    }
    #[inline(always)]
    fn widen_signed(self, b: __m256i) -> [Self::V; 2] {
        unsafe {
            [
                self.i8x16(_mm256_castsi256_si128(b)),
                self.i8x16(_mm256_extracti128_si256::<1>(b)),
            ]
        }
    }
}

/// Token for AVX-512F (plus AVX2, FMA and F16C): 16 lanes in one `__m512`.
#[derive(Clone, Copy)]
pub(in super::super) struct Avx512 {
    _checked: (),
}

impl Avx512 {
    pub(in super::super) fn detect() -> Option<Self> {
        (is_x86_feature_detected!("avx512f") && Avx2::detect().is_some())
            .then_some(Avx512 { _checked: () })
    }

    /// The AVX2 token, for the byte operations: `detect` checked its features too.
    #[inline(always)]
    fn avx2(self) -> Avx2 {
        Avx2 { _checked: () }
    }

    /// `q` read as i8, as f32.
    #[inline(always)]
    fn i8x16(self, q: __m128i) -> __m512 {
        // SAFETY: as in the `Simd` impl below.
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)) }
    }

    /// `q` read as u8, as f32.
    #[inline(always)]
    fn u8x16(self, q: __m128i) -> __m512 {
        // SAFETY: as in the `Simd` impl below.
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)) }
    }

    /// `q` loaded and read as i8, as f32.
    #[inline(always)]
    fn load_i8x16(self, q: &[u8; 16]) -> __m512 {
        // SAFETY: as in the `Simd` impl below.
        self.i8x16(unsafe { _mm_loadu_si128(q.as_ptr().cast()) })
    }
}

// SAFETY (every `unsafe` block in this impl): an `Avx512` exists only if `detect` saw
// AVX-512F, AVX2, FMA and F16C on this CPU; pointers come from references to arrays of
// at least the 64 bytes (16 f32), 32 bytes (16 u16) or 16 bytes read or written;
// `loadu`/`storeu` need no alignment.
impl Simd for Avx512 {
    type V = __m512;
    type B = __m256i;
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
    fn mul_add_each<const C: usize>(self, x: __m512, q: &[f32], sums: &mut [__m512; C]) {
        if (C != 8 && C != 16) || q.len() < C {
            return super::mul_add_each(self, x, q, sums);
        }
        let (sums, q) = (sums.as_mut_ptr(), q.as_ptr());
        // SAFETY: `sums` holds `C` vectors (8 or 16) and `q` at least `C` f32.
        unsafe {
            mul_add_8(&mut *sums.cast(), x, q);
            if C == 16 {
                mul_add_8(&mut *sums.add(8).cast(), x, q.add(8));
            }
        }
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
    fn signed_bytes(self, q: &Bytes) -> [Self::V; 2] {
        let (q, _) = q.as_chunks::<16>();
        [self.load_i8x16(&q[0]), self.load_i8x16(&q[1])]
    }
    #[inline(always)]
    fn f16s(self, h: &[u16; 16]) -> Self::V {
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(h.as_ptr().cast())) }
    }
    #[inline(always)]
    fn bf16s(self, h: &[u16; 16]) -> Self::V {
        unsafe {
            let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(h.as_ptr().cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w))
        }
    }

    #[inline(always)]
    fn bytes(self, q: &Bytes) -> __m256i {
        self.avx2().bytes(q)
    }
    #[inline(always)]
    fn store_bytes(self, b: __m256i, out: &mut Bytes) {
        self.avx2().store_bytes(b, out)
    }
    #[inline(always)]
    fn splat_bytes(self, v: u8) -> __m256i {
        self.avx2().splat_bytes(v)
    }
    #[inline(always)]
    fn nibble_bytes(self, q: &[u8; 16]) -> __m256i {
        self.avx2().nibble_bytes(q)
    }
    #[inline(always)]
    fn bits(self, h: &u32) -> __m256i {
        self.avx2().bits(h)
    }
    #[inline(always)]
    fn and(self, a: __m256i, b: __m256i) -> __m256i {
        self.avx2().and(a, b)
    }
    #[inline(always)]
    fn or(self, a: __m256i, b: __m256i) -> __m256i {
        self.avx2().or(a, b)
    }
    #[inline(always)]
    fn and_not(self, a: __m256i, b: __m256i) -> __m256i {
        self.avx2().and_not(a, b)
    }
    #[inline(always)]
    fn sub_bytes(self, a: __m256i, b: __m256i) -> __m256i {
        self.avx2().sub_bytes(a, b)
    }
    #[inline(always)]
    fn shl16(self, a: __m256i, n: u32) -> __m256i {
        self.avx2().shl16(a, n)
    }
    #[inline(always)]
    fn shr16(self, a: __m256i, n: u32) -> __m256i {
        self.avx2().shr16(a, n)
    }
    #[inline(always)]
    fn widen_unsigned(self, b: __m256i) -> [Self::V; 2] {
        unsafe {
            [
                self.u8x16(_mm256_castsi256_si128(b)),
                self.u8x16(_mm256_extracti128_si256::<1>(b)),
            ]
        }
    }
    #[inline(always)]
    fn widen_signed(self, b: __m256i) -> [Self::V; 2] {
        unsafe {
            [
                self.i8x16(_mm256_castsi256_si128(b)),
                self.i8x16(_mm256_extracti128_si256::<1>(b)),
            ]
        }
    }
}

/// `sums[c] = fma(x, splat(q[c]), sums[c])` for `c < 8`, each quant a broadcast operand of
/// its multiply-add at `q + 4c`: base plus displacement. Written with intrinsics, the same
/// loop came out of LLVM with every broadcast indexed by a register shared with the loop's
/// other arrays, and such an instruction is split in two on issue: in a C test of the
/// loop, 82–85 GFLOP/s on one thread against 124–135 with displacements.
///
/// # Safety
///
/// AVX-512F must be available, and `q` valid for reading 8 f32.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn mul_add_8(s: &mut [__m512; 8], x: __m512, q: *const f32) {
    // SAFETY: the caller's; the instructions read `q[0..8]` and nothing else.
    unsafe {
        std::arch::asm!(
            "vfmadd231ps {s0}, {x}, dword ptr [{q}]{{1to16}}",
            "vfmadd231ps {s1}, {x}, dword ptr [{q} + 4]{{1to16}}",
            "vfmadd231ps {s2}, {x}, dword ptr [{q} + 8]{{1to16}}",
            "vfmadd231ps {s3}, {x}, dword ptr [{q} + 12]{{1to16}}",
            "vfmadd231ps {s4}, {x}, dword ptr [{q} + 16]{{1to16}}",
            "vfmadd231ps {s5}, {x}, dword ptr [{q} + 20]{{1to16}}",
            "vfmadd231ps {s6}, {x}, dword ptr [{q} + 24]{{1to16}}",
            "vfmadd231ps {s7}, {x}, dword ptr [{q} + 28]{{1to16}}",
            q = in(reg) q,
            x = in(zmm_reg) x,
            s0 = inout(zmm_reg) s[0],
            s1 = inout(zmm_reg) s[1],
            s2 = inout(zmm_reg) s[2],
            s3 = inout(zmm_reg) s[3],
            s4 = inout(zmm_reg) s[4],
            s5 = inout(zmm_reg) s[5],
            s6 = inout(zmm_reg) s[6],
            s7 = inout(zmm_reg) s[7],
            options(pure, readonly, nostack, preserves_flags),
        );
    }
}
