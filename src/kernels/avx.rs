//! Bag sums and maxima in 256-bit registers, for CPUs that have AVX, chosen
//! at run time ([`Avx::detect`]); the loops themselves are in `bag.rs`
//! (`Block::avx_sum`, `Block::avx_max`), compiled with AVX enabled, and use
//! the operations here.
//!
//! A default x86-64 build may only use SSE2, so `wide::f32x8` is two
//! 128-bit halves there and a block of 64 columns already fills the sixteen
//! registers. With AVX the sixteen registers hold 128 columns: a recsys row
//! (128 floats) is summed in one pass over its bag instead of two, each
//! addition reading its row straight from memory and no accumulator
//! spilled. Measured on recsys: a test program round-robin with a memcpy of
//! four times the rows (every call starts cold) ran the bag sum in 2.5-2.6
//! ms against 3.6-3.7 ms with the SSE2 blocks (the memcpy of the rows read:
//! 2.7 ms); in two alternating report runs the bag sum went from 84-88 % to
//! 90-113 % of a same-run memcpy of the rows, and gpt2's from 99-109 % to
//! 130-136 %.
//!
//! The arithmetic is the SSE2 path's, lane for lane: one rounded
//! multiplication (with a weight) and one rounded addition per term, never
//! a fused multiply-add, so both paths give the same bits (a unit test in
//! `bag.rs` runs both).

#[cfg(target_arch = "x86_64")]
use core::arch::x86_64::{
    __m256, _mm256_add_ps, _mm256_blendv_ps, _mm256_cmp_ps, _mm256_div_ps, _mm256_mul_ps,
    _mm256_set1_ps, _CMP_GT_OQ,
};

#[cfg(target_arch = "x86_64")]
use super::row::LANES;

/// Proof that this CPU has AVX, which everything here needs: only
/// [`Avx::detect`] makes one, so code holding an `Avx` may call the AVX
/// functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Avx(());

impl Avx {
    /// An `Avx` where this CPU has AVX (asked once, then cached by `std`).
    #[inline]
    pub(crate) fn detect() -> Option<Avx> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx") {
            return Some(Avx(()));
        }
        None
    }
}

/// A register of eight `-0.0`s, where a sum starts.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn neg_zero() -> __m256 {
    bytemuck::cast([-0.0f32; LANES])
}

/// Eight lanes from memory.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn load(x: &[f32; LANES]) -> __m256 {
    bytemuck::cast(*x)
}

/// The registers back to memory.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn store<const N: usize>(out: &mut [[f32; LANES]; N], acc: [__m256; N]) {
    for (o, a) in out.iter_mut().zip(acc) {
        *o = bytemuck::cast(a);
    }
}

/// `a + b`, lane by lane, each rounded.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
pub(crate) fn add(a: __m256, b: __m256) -> __m256 {
    _mm256_add_ps(a, b)
}

/// `a × b`, lane by lane, each rounded.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
pub(crate) fn mul(a: __m256, b: __m256) -> __m256 {
    _mm256_mul_ps(a, b)
}

/// `a / b`, lane by lane, each rounded (as a scalar division would be).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
pub(crate) fn div(a: __m256, b: __m256) -> __m256 {
    _mm256_div_ps(a, b)
}

/// Eight copies of `x`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
pub(crate) fn splat(x: f32) -> __m256 {
    _mm256_set1_ps(x)
}

/// All ones in the lanes where `a > b` (ordered: false if either is NaN),
/// zeros elsewhere.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
pub(crate) fn greater(a: __m256, b: __m256) -> __m256 {
    _mm256_cmp_ps::<_CMP_GT_OQ>(a, b)
}

/// `if_true` in the lanes where `mask` is set, `if_false` elsewhere.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
pub(crate) fn select(mask: __m256, if_true: __m256, if_false: __m256) -> __m256 {
    _mm256_blendv_ps(if_false, if_true, mask)
}

/// `dst = src`, or zeros, with 32-byte streaming stores wherever `dst` is
/// 32-byte aligned: [`row::stream`](super::row::stream) for CPUs with AVX.
/// Half the store instructions of the 16-byte form: the recsys dense
/// backward's sweep of zeros took 0.95-0.96 of a same-run memset with
/// these and 1.02-1.11 with 16-byte stores (three alternating runs of a
/// round-robin test program; the whole backward 1.11-1.18 against
/// 1.19-1.24).
///
/// Only for a CPU with AVX ([`Avx::detect`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[allow(unsafe_code)]
pub(crate) fn stream(dst: &mut [f32], src: Option<&[f32]>) {
    use core::arch::x86_64::_mm256_stream_ps;
    super::row::stream_with::<__m256, LANES>(dst, src, |d, v| {
        // SAFETY: `d` is a live `&mut __m256` inside `dst`, so the pointer
        // is valid for 32 bytes and 32-byte aligned (what
        // `pod_align_to_mut` hands out), as `_mm256_stream_ps` requires; the
        // function runs only where AVX is present.
        unsafe { _mm256_stream_ps((d as *mut __m256).cast::<f32>(), v) }
    });
}
