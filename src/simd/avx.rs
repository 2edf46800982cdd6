//! [`Lanes`] for 256-bit AVX registers, and the one wrapper that runs a
//! [`Body`] compiled with AVX enabled.
//!
//! Soundness rests on one rule: the lane type, [`Avx256`], is private to
//! this file, and the only code that names it is [`run`], which takes an
//! [`Avx`], a proof that the CPU has AVX (and, for `Avx256<true>`, FMA). So
//! every AVX and FMA instruction below runs on a CPU that has it, though the
//! trait's methods are safe.

#![cfg(target_arch = "x86_64")]
#![allow(unsafe_code)]

use super::{Body, Lanes, LANES};
use core::arch::x86_64::{
    __m256, _mm256_add_ps, _mm256_blendv_ps, _mm256_cmp_ps, _mm256_div_ps, _mm256_fmadd_ps,
    _mm256_mul_ps, _mm256_set1_ps, _mm256_stream_ps, _CMP_GT_OQ,
};

/// Proof that this CPU has AVX, and whether it has FMA too: only
/// [`Avx::detect`] makes one (and, in tests, `Avx::without_fma` one that
/// claims less).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Avx {
    fma: bool,
}

impl Avx {
    /// An `Avx` where this CPU has AVX, with `fma` where it has FMA.
    #[inline]
    pub(crate) fn detect() -> Option<Avx> {
        std::arch::is_x86_feature_detected!("avx").then(|| Avx {
            fma: std::arch::is_x86_feature_detected!("fma"),
        })
    }

    /// The same proof without FMA (tests): the AVX wrapper whose fused
    /// multiply-add is `f32::mul_add` (the tests run it beside the other).
    #[cfg(test)]
    pub(crate) fn without_fma(self) -> Avx {
        Avx { fma: false }
    }

    /// Whether this proof includes FMA.
    #[cfg(test)]
    pub(crate) fn has_fma(self) -> bool {
        self.fma
    }
}

/// Runs `body` with 256-bit lanes, compiled with AVX (and FMA, where the
/// proof says the CPU has it) enabled.
#[inline(always)]
pub(super) fn run<B: Body>(proof: Avx, body: B) -> B::Output {
    if proof.fma {
        // SAFETY: `run_avx_fma` needs a CPU with AVX and FMA, and `proof`
        // is an `Avx` with `fma`, which only `Avx::detect` makes, after the
        // CPU reported both.
        unsafe { run_avx_fma(body) }
    } else {
        // SAFETY: `run_avx` needs a CPU with AVX, and `proof` is an `Avx`,
        // which only `Avx::detect` makes, after the CPU reported AVX.
        unsafe { run_avx(body) }
    }
}

/// The body instantiated with [`Avx256`]; everything it calls is
/// `#[inline(always)]`, so it all compiles here, with AVX.
#[target_feature(enable = "avx")]
fn run_avx<B: Body>(body: B) -> B::Output {
    body.run::<Avx256<false>>()
}

/// [`run_avx`] with FMA as well: the fused multiply-add is one instruction.
#[target_feature(enable = "avx,fma")]
fn run_avx_fma<B: Body>(body: B) -> B::Output {
    body.run::<Avx256<true>>()
}

/// One 256-bit register of eight `f32`s, on a CPU with FMA when `FMA`.
/// Private: see the module notes.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Avx256<const FMA: bool>(__m256);

// The SAFETY of every `unsafe` block below: the intrinsic needs AVX, and an
// `Avx256` is only reachable through `run_avx`, which `run` calls only with
// an `Avx`, made after the CPU reported AVX (the module notes); the
// intrinsics touch no memory.
impl<const FMA: bool> Lanes for Avx256<FMA> {
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
        if FMA {
            // SAFETY: see above the impl; an `Avx256<true>` is only
            // reachable through `run_avx_fma`, on a CPU with FMA.
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
