//! [`Lanes`] for `wide::f32x8`: the instruction set the build targets.

use super::{first, Lanes, EIGHT};
use wide::f32x8;

impl Lanes for f32x8 {
    const WIDTH: usize = EIGHT;
    const REGISTERS: usize = 8;

    #[inline(always)]
    fn splat(x: f32) -> Self {
        f32x8::splat(x)
    }

    #[inline(always)]
    fn load(from: &[f32]) -> Self {
        f32x8::new(first::<_, EIGHT>(from))
    }

    #[inline(always)]
    fn store(self, to: &mut [f32]) {
        to[..EIGHT].copy_from_slice(&self.to_array());
    }

    #[inline(always)]
    fn add(self, other: Self) -> Self {
        self + other
    }

    #[inline(always)]
    fn mul(self, other: Self) -> Self {
        self * other
    }

    #[inline(always)]
    fn div(self, other: Self) -> Self {
        self / other
    }

    #[inline(always)]
    fn mul_add(self, b: Self, c: Self) -> Self {
        bytemuck::cast(super::fused_lanes(
            bytemuck::cast(self),
            bytemuck::cast(b),
            bytemuck::cast(c),
        ))
    }

    #[inline(always)]
    fn greater(self, other: Self) -> Self {
        self.simd_gt(other)
    }

    #[inline(always)]
    fn select(self, if_true: Self, if_false: Self) -> Self {
        self.bitselect(if_true, if_false)
    }

    #[inline(always)]
    fn from_u8(bytes: &[u8]) -> Self {
        Self::load(&super::widen_u8(bytes))
    }

    #[inline(always)]
    fn from_packed<const BITS: u32>(word: u64) -> Self {
        Self::load(&super::widen_packed::<BITS>(word))
    }

    #[inline(always)]
    fn from_nibble_pairs(bytes: &[u8]) -> (Self, Self) {
        let (even, odd) = super::widen_nibble_pairs(bytes);
        (Self::load(&even), Self::load(&odd))
    }

    #[inline(always)]
    fn interleave(even: Self, odd: Self) -> (Self, Self) {
        let (first, second) = super::interleave_lanes(even.to_array(), odd.to_array());
        (Self::load(&first), Self::load(&second))
    }

    #[inline(always)]
    fn from_f16(halves: &[u16]) -> Self {
        Self::load(&super::widen_f16(halves))
    }

    #[inline(always)]
    fn from_bf16(halves: &[u16]) -> Self {
        Self::load(&super::widen_bf16(halves))
    }

    #[inline(always)]
    fn stream(dst: &mut [f32], src: Option<&[f32]>) {
        super::stream::sse(dst, src);
    }
}
