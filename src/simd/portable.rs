//! [`Lanes`] for `wide::f32x8`: the instruction set the build targets.

use super::{Body, EIGHT, Lanes, first};
use wide::f32x8;

impl Lanes for f32x8 {
    const WIDTH: usize = EIGHT;
    const REGISTERS: usize = 8;
    const FALLBACK: bool = cfg!(target_arch = "x86_64");

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
        bytemuck::cast(fused_lanes(
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
        Self::load(&widen_u8(bytes))
    }

    #[inline(always)]
    fn from_packed<const BITS: u32>(word: u64) -> Self {
        Self::load(&widen_packed::<BITS>(word))
    }

    #[inline(always)]
    fn from_nibble_pairs(bytes: &[u8]) -> (Self, Self) {
        let (even, odd) = widen_nibble_pairs(bytes);
        (Self::load(&even), Self::load(&odd))
    }

    #[inline(always)]
    fn interleave(even: Self, odd: Self) -> (Self, Self) {
        let (first, second) = interleave_lanes(even.to_array(), odd.to_array());
        (Self::load(&first), Self::load(&second))
    }

    #[inline(always)]
    fn from_f16(halves: &[u16]) -> Self {
        Self::load(&widen_f16(halves))
    }

    #[inline(always)]
    fn from_bf16(halves: &[u16]) -> Self {
        Self::load(&widen_bf16(halves))
    }

    #[inline(always)]
    fn stream(dst: &mut [f32], src: Option<&[f32]>) {
        super::stream::sse(dst, src);
    }

    #[inline(never)]
    fn apart<B: Body>(body: B) -> B::Output {
        body.run::<f32x8>()
    }
}

// The decodes and the fused multiply-add a value at a time: `wide` has no
// widening loads, no half conversions and no fused multiply-add of its own.

/// `a × b + c` lane by lane, each rounded once: the fused multiply-add
/// without an FMA instruction (`f32::mul_add` is then the C library's
/// `fmaf`).
#[inline(always)]
fn fused_lanes(a: [f32; EIGHT], b: [f32; EIGHT], c: [f32; EIGHT]) -> [f32; EIGHT] {
    core::array::from_fn(|i| a[i].mul_add(b[i], c[i]))
}

/// [`Lanes::from_u8`] a value at a time.
#[inline(always)]
fn widen_u8(bytes: &[u8]) -> [f32; EIGHT] {
    first::<_, EIGHT>(bytes).map(f32::from)
}

/// [`Lanes::from_packed`] a value at a time.
#[inline(always)]
fn widen_packed<const BITS: u32>(word: u64) -> [f32; EIGHT] {
    let mask = (1u64 << BITS) - 1;
    core::array::from_fn(|j| ((word >> (j as u32 * BITS)) & mask) as f32)
}

/// [`Lanes::from_nibble_pairs`] a value at a time.
#[inline(always)]
fn widen_nibble_pairs(bytes: &[u8]) -> ([f32; EIGHT], [f32; EIGHT]) {
    let bytes = first::<_, EIGHT>(bytes);
    (
        bytes.map(|b| f32::from(b & 0xf)),
        bytes.map(|b| f32::from(b >> 4)),
    )
}

/// [`Lanes::interleave`] a value at a time.
#[inline(always)]
fn interleave_lanes(even: [f32; EIGHT], odd: [f32; EIGHT]) -> ([f32; EIGHT], [f32; EIGHT]) {
    let mut out = [[0.0; EIGHT]; 2];
    for (i, (e, o)) in even.into_iter().zip(odd).enumerate() {
        out[i / 4][2 * (i % 4)] = e;
        out[i / 4][2 * (i % 4) + 1] = o;
    }
    (out[0], out[1])
}

/// [`Lanes::from_f16`] a value at a time.
#[inline(always)]
fn widen_f16(halves: &[u16]) -> [f32; EIGHT] {
    first::<_, EIGHT>(halves).map(|h| half::f16::from_bits(h).to_f32())
}

/// [`Lanes::from_bf16`] a value at a time: a `bf16` is the top half of an
/// `f32`'s bits.
#[inline(always)]
fn widen_bf16(halves: &[u16]) -> [f32; EIGHT] {
    first::<_, EIGHT>(halves).map(|h| f32::from_bits(u32::from(h) << 16))
}
