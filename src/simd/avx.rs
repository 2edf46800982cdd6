//! [`Lanes`] for 256-bit AVX registers, and the wrappers that run a
//! [`Body`] compiled with AVX enabled.
//!
//! Three levels, each a wrapper compiled with its own target features:
//!
//! | level | features | what it adds |
//! | --- | --- | --- |
//! | `Level::Avx` | `avx` | 256-bit loads, adds, multiplies, compares |
//! | `Level::Fma` | `avx,fma` | the fused multiply-add as one instruction |
//! | `Level::Avx2` | `avx,avx2,fma,f16c` | packed tables decoded in registers: bytes widened (`vpmovzxbd`), nibbles shifted apart (`vpsrlvd`), `f16` converted (`vcvtph2ps`) |
//! | `Level::Avx512` | `Avx2`'s and `avx512f,avx512vl` | the same 256-bit instructions, with 32 registers instead of 16: wider column blocks, and no accumulator spilled beside a decode's temporaries |
//!
//! Below `Avx2` the decoders widen each value on its own, then load the
//! eight as a vector: the same numbers (every decode is exact), more
//! instructions.
//!
//! Soundness rests on one rule: the lane type, [`Avx256`], is private to
//! this file, and the only code that names it is [`run`], which takes an
//! [`Avx`], a proof that the CPU has the level's features. So every
//! instruction below runs on a CPU that has it, though the trait's methods
//! are safe.

#![cfg(target_arch = "x86_64")]
#![allow(unsafe_code)]

use super::{Body, Lanes, LANES};
use core::arch::x86_64::{
    __m128i, __m256, _mm256_add_ps, _mm256_and_si256, _mm256_blendv_ps, _mm256_castsi256_ps,
    _mm256_cmp_ps, _mm256_cvtepi32_ps, _mm256_cvtepu16_epi32, _mm256_cvtepu8_epi32,
    _mm256_cvtph_ps, _mm256_div_ps, _mm256_fmadd_ps, _mm256_mul_ps, _mm256_permute2f128_ps,
    _mm256_set1_epi32, _mm256_set1_ps, _mm256_setr_epi32, _mm256_slli_epi32, _mm256_srli_epi32,
    _mm256_srlv_epi32, _mm256_stream_ps, _mm256_unpackhi_ps, _mm256_unpacklo_ps, _CMP_GT_OQ,
};

/// What an [`Avx`] proves the CPU has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    /// AVX.
    Avx,
    /// AVX and FMA.
    Fma,
    /// AVX, AVX2, FMA and F16C (every x86-64 CPU with AVX2 so far).
    Avx2,
    /// `Avx2`'s features, AVX-512F and AVX-512VL: the 256-bit instructions
    /// encoded so that they reach 32 registers.
    Avx512,
}

/// Proof that this CPU has AVX, and how much more: only [`Avx::detect`]
/// makes one (and, in tests, [`Avx::at`] one that claims less).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Avx {
    level: Level,
}

impl Avx {
    /// An `Avx` where this CPU has AVX, at the highest level it has.
    #[inline]
    pub(crate) fn detect() -> Option<Avx> {
        use std::arch::is_x86_feature_detected as has;
        if !has!("avx") {
            return None;
        }
        let avx2 = has!("avx2") && has!("fma") && has!("f16c");
        let level = if avx2 && has!("avx512f") && has!("avx512vl") {
            Level::Avx512
        } else if avx2 {
            Level::Avx2
        } else if has!("fma") {
            Level::Fma
        } else {
            Level::Avx
        };
        Some(Avx { level })
    }

    /// The same proof claiming `level` (tests: the lower wrappers run beside
    /// the highest); `None` above what this proof holds.
    #[cfg(test)]
    pub(crate) fn at(self, level: Level) -> Option<Avx> {
        (level <= self.level).then_some(Avx { level })
    }
}

/// Runs `body` with 256-bit lanes, compiled with the features of the
/// proof's level.
#[inline(always)]
pub(super) fn run<B: Body>(proof: Avx, body: B) -> B::Output {
    match proof.level {
        // SAFETY (each arm): the wrapper needs a CPU with its level's
        // features, and `proof` claims that level, which only
        // `Avx::detect` makes (or `Avx::at` lowers), after the CPU reported
        // those features.
        Level::Avx => unsafe { run_avx(body) },
        Level::Fma => unsafe { run_fma(body) },
        Level::Avx2 => unsafe { run_avx2(body) },
        Level::Avx512 => unsafe { run_avx512(body) },
    }
}

/// The body instantiated with [`Avx256`]; everything it calls is
/// `#[inline(always)]`, so it all compiles here, with AVX.
#[target_feature(enable = "avx")]
fn run_avx<B: Body>(body: B) -> B::Output {
    body.run::<Avx256<AVX>>()
}

/// [`run_avx`] with FMA as well: the fused multiply-add is one instruction.
#[target_feature(enable = "avx,fma")]
fn run_fma<B: Body>(body: B) -> B::Output {
    body.run::<Avx256<FMA>>()
}

/// [`run_fma`] with AVX2 and F16C: packed rows decode in registers.
#[target_feature(enable = "avx,avx2,fma,f16c")]
fn run_avx2<B: Body>(body: B) -> B::Output {
    body.run::<Avx256<AVX2>>()
}

/// [`run_avx2`] with AVX-512F and AVX-512VL: the same instructions, which
/// the compiler may now give any of 32 registers.
#[target_feature(enable = "avx,avx2,fma,f16c,avx512f,avx512vl")]
fn run_avx512<B: Body>(body: B) -> B::Output {
    body.run::<Avx256<AVX512>>()
}

/// [`Level`]s as the lane type's parameter.
const AVX: u8 = 0;
const FMA: u8 = 1;
const AVX2: u8 = 2;
const AVX512: u8 = 3;

/// One 256-bit register of eight `f32`s, on a CPU at level `L` (one of
/// [`AVX`], [`FMA`], [`AVX2`], [`AVX512`]). Private: see the module notes.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Avx256<const L: u8>(__m256);

// The SAFETY of every `unsafe` block below: the intrinsic needs AVX (and,
// where the block tests `L`, the features of that level), and an
// `Avx256<L>` is only reachable through the wrapper of level `L`, which
// `run` calls only with an `Avx` proving that level (the module notes);
// the intrinsics touch no memory.
impl<const L: u8> Lanes for Avx256<L> {
    // Sixteen at every level: with 32 registers (`Level::Avx512`), blocks of
    // 32 vectors were 5-25 % slower on 768-wide rows than blocks of 16,
    // which then no longer spill (docs/design.md, "AVX-512VL").
    const REGISTERS: usize = 16;

    #[inline(always)]
    fn splat(x: f32) -> Self {
        // SAFETY: see above the impl.
        Avx256(unsafe { _mm256_set1_ps(x) })
    }

    #[inline(always)]
    fn load(from: &[f32; LANES]) -> Self {
        Avx256(bytemuck::cast(*from))
    }

    #[inline(always)]
    fn store(self, to: &mut [f32; LANES]) {
        *to = bytemuck::cast(self.0);
    }

    #[inline(always)]
    fn add(self, other: Self) -> Self {
        // SAFETY: see above the impl.
        Avx256(unsafe { _mm256_add_ps(self.0, other.0) })
    }

    #[inline(always)]
    fn mul(self, other: Self) -> Self {
        // SAFETY: see above the impl.
        Avx256(unsafe { _mm256_mul_ps(self.0, other.0) })
    }

    #[inline(always)]
    fn div(self, other: Self) -> Self {
        // SAFETY: see above the impl.
        Avx256(unsafe { _mm256_div_ps(self.0, other.0) })
    }

    #[inline(always)]
    fn mul_add(self, b: Self, c: Self) -> Self {
        if L >= FMA {
            // SAFETY: see above the impl (FMA at this level).
            Avx256(unsafe { _mm256_fmadd_ps(self.0, b.0, c.0) })
        } else {
            Avx256(bytemuck::cast(super::fused_lanes(
                bytemuck::cast(self.0),
                bytemuck::cast(b.0),
                bytemuck::cast(c.0),
            )))
        }
    }

    #[inline(always)]
    fn greater(self, other: Self) -> Self {
        // SAFETY: see above the impl.
        Avx256(unsafe { _mm256_cmp_ps::<_CMP_GT_OQ>(self.0, other.0) })
    }

    #[inline(always)]
    fn select(self, if_true: Self, if_false: Self) -> Self {
        // SAFETY: see above the impl.
        Avx256(unsafe { _mm256_blendv_ps(if_false.0, if_true.0, self.0) })
    }

    #[inline(always)]
    fn from_u8(bytes: [u8; LANES]) -> Self {
        if L >= AVX2 {
            let wide: __m128i = bytemuck::cast([bytes, [0; 8]]);
            // SAFETY: see above the impl (AVX2 at this level).
            Avx256(unsafe { _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(wide)) })
        } else {
            Self::load(&super::widen_u8(bytes))
        }
    }

    #[inline(always)]
    fn from_packed<const BITS: u32>(word: u32) -> Self {
        if L >= AVX2 {
            let b = BITS as i32;
            // SAFETY: see above the impl (AVX2 at this level).
            Avx256(unsafe {
                let shifts = _mm256_setr_epi32(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b);
                let mask = _mm256_set1_epi32((1 << BITS) - 1);
                let spread = _mm256_srlv_epi32(_mm256_set1_epi32(word as i32), shifts);
                _mm256_cvtepi32_ps(_mm256_and_si256(spread, mask))
            })
        } else {
            Self::load(&super::widen_packed::<BITS>(word))
        }
    }

    #[inline(always)]
    fn from_nibble_pairs(bytes: [u8; LANES]) -> (Self, Self) {
        if L >= AVX2 {
            let wide: __m128i = bytemuck::cast([bytes, [0; 8]]);
            // SAFETY: see above the impl (AVX2 at this level).
            unsafe {
                let codes = _mm256_cvtepu8_epi32(wide);
                let low = _mm256_and_si256(codes, _mm256_set1_epi32(0xf));
                let high = _mm256_srli_epi32::<4>(codes);
                (
                    Avx256(_mm256_cvtepi32_ps(low)),
                    Avx256(_mm256_cvtepi32_ps(high)),
                )
            }
        } else {
            let (even, odd) = super::widen_nibble_pairs(bytes);
            (Self::load(&even), Self::load(&odd))
        }
    }

    #[inline(always)]
    fn interleave(even: Self, odd: Self) -> (Self, Self) {
        // SAFETY: see above the impl.
        unsafe {
            // [e0 o0 e1 o1 | e4 o4 e5 o5] and [e2 o2 e3 o3 | e6 o6 e7 o7],
            // then their low halves and their high halves.
            let low = _mm256_unpacklo_ps(even.0, odd.0);
            let high = _mm256_unpackhi_ps(even.0, odd.0);
            (
                Avx256(_mm256_permute2f128_ps::<0x20>(low, high)),
                Avx256(_mm256_permute2f128_ps::<0x31>(low, high)),
            )
        }
    }

    #[inline(always)]
    fn from_f16(halves: [u16; LANES]) -> Self {
        if L >= AVX2 {
            let halves: __m128i = bytemuck::cast(halves);
            // SAFETY: see above the impl (F16C at this level).
            Avx256(unsafe { _mm256_cvtph_ps(halves) })
        } else {
            Self::load(&super::widen_f16(halves))
        }
    }

    #[inline(always)]
    fn from_bf16(halves: [u16; LANES]) -> Self {
        if L >= AVX2 {
            let halves: __m128i = bytemuck::cast(halves);
            // SAFETY: see above the impl (AVX2 at this level).
            Avx256(unsafe {
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(halves)))
            })
        } else {
            Self::load(&super::widen_bf16(halves))
        }
    }

    #[inline(always)]
    fn stream(dst: &mut [f32], src: Option<&[f32]>) {
        // SAFETY: see above the impl.
        unsafe { stream(dst, src) }
    }
}

/// [`Lanes::stream`] with 32-byte stores. A function of its own, compiled
/// with AVX, so that the closure inside it is too (a closure is compiled
/// apart from the function that calls it, and inherits only the target
/// features of the function that defines it).
#[target_feature(enable = "avx")]
fn stream(dst: &mut [f32], src: Option<&[f32]>) {
    super::stream::with::<__m256, LANES>(dst, src, |d, v| {
        // SAFETY: `d` is a live `&mut __m256` inside `dst`, so the pointer is
        // valid for 32 bytes and 32-byte aligned (what `pod_align_to_mut`
        // hands out), as `_mm256_stream_ps` requires; AVX is enabled here.
        unsafe { _mm256_stream_ps((d as *mut __m256).cast::<f32>(), v) }
    });
}
