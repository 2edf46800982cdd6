//! [`Lanes`] for AVX registers, and the wrappers that run a [`Body`]
//! compiled with AVX enabled.
//!
//! Two levels, each a wrapper compiled with its own target features, as
//! PyTorch and FBGEMM build theirs:
//!
//! | level | features | lanes |
//! | --- | --- | --- |
//! | `Level::Avx2` | `avx,avx2,fma,f16c` | eight, a `__m256` ([`Avx256`]): packed rows decode in registers (bytes widened by `vpmovzxbd`, nibbles shifted apart by `vpsrlvd`, halves converted by `vcvtph2ps`), the fused multiply-add one instruction |
//! | `Level::Avx512` | `Avx2`'s and `avx512f,avx512vl` | sixteen, a `__m512` ([`Avx512`]): half the instructions a row, and 32 registers, so no accumulator is spilled beside a decode's temporaries |
//!
//! A CPU with AVX but not AVX2, FMA and F16C (Sandy Bridge, Ivy Bridge)
//! runs the portable lanes: a level of its own would compile every kernel
//! body once more for CPUs that went out of production in 2013.
//!
//! Soundness rests on one rule: the lane types, [`Avx256`] and [`Avx512`],
//! are private to this file, and the only code that names them is [`run`],
//! which takes an [`Avx`], a proof that the CPU has the level's features,
//! and the wrappers of [`Lanes::apart`] ([`apart_avx2`], [`apart_avx512`]),
//! which only the lane types' own methods call. So every instruction below
//! runs on a CPU that has it, though the trait's methods are safe.

#![cfg(target_arch = "x86_64")]
#![allow(unsafe_code)]

use super::{Body, EIGHT, Lanes, first};
use core::arch::x86_64::{
    __m128i, __m256, __m256i, __m512, _CMP_GT_OQ, _mm256_add_ps, _mm256_and_si256,
    _mm256_blendv_ps, _mm256_castsi256_ps, _mm256_cmp_ps, _mm256_cvtepi32_ps, _mm256_cvtepu8_epi32,
    _mm256_cvtepu16_epi32, _mm256_cvtph_ps, _mm256_div_ps, _mm256_fmadd_ps, _mm256_mul_ps,
    _mm256_permute2f128_ps, _mm256_set1_epi32, _mm256_set1_ps, _mm256_setr_epi32,
    _mm256_slli_epi32, _mm256_srli_epi32, _mm256_srlv_epi32, _mm256_stream_ps, _mm256_unpackhi_ps,
    _mm256_unpacklo_ps, _mm512_add_ps, _mm512_and_si512, _mm512_castps_si512,
    _mm512_castsi256_si512, _mm512_castsi512_ps, _mm512_cmp_ps_mask, _mm512_cvtepi32_ps,
    _mm512_cvtepu8_epi32, _mm512_cvtepu16_epi32, _mm512_cvtph_ps, _mm512_div_ps, _mm512_fmadd_ps,
    _mm512_inserti64x4, _mm512_mask_blend_ps, _mm512_maskz_mov_epi32, _mm512_mul_ps,
    _mm512_permutex2var_ps, _mm512_set1_epi32, _mm512_set1_ps, _mm512_setr_epi32,
    _mm512_slli_epi32, _mm512_srli_epi32, _mm512_srlv_epi32, _mm512_test_epi32_mask,
};

/// What an [`Avx`] proves the CPU has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    /// AVX, AVX2, FMA and F16C (every x86-64 CPU with AVX2 so far).
    Avx2,
    /// `Avx2`'s features, AVX-512F and AVX-512VL: sixteen lanes, 32
    /// registers.
    Avx512,
}

/// Proof that this CPU has AVX2, FMA and F16C, and whether AVX-512 too:
/// only [`Avx::detect`] makes one (and [`Avx::at`] one that claims less).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Avx {
    level: Level,
}

impl Avx {
    /// An `Avx` where this CPU has the features of `Level::Avx2`, at the
    /// highest level it has.
    #[inline]
    pub(crate) fn detect() -> Option<Avx> {
        use std::arch::is_x86_feature_detected as has;
        if !(has!("avx") && has!("avx2") && has!("fma") && has!("f16c")) {
            return None;
        }
        let level = if has!("avx512f") && has!("avx512vl") {
            Level::Avx512
        } else {
            Level::Avx2
        };
        Some(Avx { level })
    }

    /// The same proof claiming `level` (a cap set by
    /// `EMBEDDING_KERNELS_ISA`, or a test running the lower wrappers beside
    /// the highest); `None` above what this proof holds.
    pub(crate) fn at(self, level: Level) -> Option<Avx> {
        (level <= self.level).then_some(Avx { level })
    }

    /// The level this proof claims.
    pub(crate) fn level(self) -> Level {
        self.level
    }
}

impl Level {
    /// The level a name gives (`avx2`, `avx512`), as
    /// `EMBEDDING_KERNELS_ISA` spells it.
    pub(crate) fn parse(name: &str) -> Option<Level> {
        Some(match name {
            "avx2" => Level::Avx2,
            "avx512" => Level::Avx512,
            _ => return None,
        })
    }

    /// Lanes per vector at this level.
    pub(crate) fn lanes(self) -> usize {
        match self {
            Level::Avx2 => Avx256::WIDTH,
            Level::Avx512 => Avx512::WIDTH,
        }
    }

    /// [`Level::parse`]'s name for this level.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
        }
    }
}

/// Runs `body` with the lanes of the proof's level, compiled with that
/// level's features.
#[inline(always)]
pub(super) fn run<B: Body>(proof: Avx, body: B) -> B::Output {
    match proof.level {
        // SAFETY (each arm): the wrapper needs a CPU with its level's
        // features, and `proof` claims that level, which only
        // `Avx::detect` makes (or `Avx::at` lowers), after the CPU reported
        // those features.
        Level::Avx2 => unsafe { run_avx2(body) },
        Level::Avx512 => unsafe { run_avx512(body) },
    }
}

/// The body instantiated with [`Avx256`]; everything it calls is
/// `#[inline(always)]`, so it all compiles here, with AVX2, FMA and F16C.
#[target_feature(enable = "avx,avx2,fma,f16c")]
fn run_avx2<B: Body>(body: B) -> B::Output {
    body.run::<Avx256>()
}

/// [`run_avx2`]'s features, AVX-512F and AVX-512VL, with sixteen lanes a
/// vector. The lanes need only AVX-512F; VL lets the compiler give the
/// code around them (the id check's compares, say) 256-bit AVX-512 forms.
#[target_feature(enable = "avx,avx2,fma,f16c,avx512f,avx512vl")]
fn run_avx512<B: Body>(body: B) -> B::Output {
    body.run::<Avx512>()
}

/// A body run with [`Avx256`] from code that already runs with them, as a
/// function of its own with the same features: see [`Lanes::apart`].
#[target_feature(enable = "avx,avx2,fma,f16c")]
#[inline(never)]
fn apart_avx2<B: Body>(body: B) -> B::Output {
    body.run::<Avx256>()
}

/// [`apart_avx2`] for [`run_avx512`]'s lanes and features.
#[target_feature(enable = "avx,avx2,fma,f16c,avx512f,avx512vl")]
#[inline(never)]
fn apart_avx512<B: Body>(body: B) -> B::Output {
    body.run::<Avx512>()
}

/// One 256-bit register of eight `f32`s, on a CPU with the features of
/// `Level::Avx2`. Private: see the module notes.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Avx256(__m256);

// The SAFETY of every `unsafe` block below: the intrinsic needs AVX, AVX2,
// FMA or F16C, and an `Avx256` is only reachable through `run_avx2`, which
// `run` calls only with an `Avx` proving those features (the module notes);
// the intrinsics touch no memory.
impl Lanes for Avx256 {
    const WIDTH: usize = EIGHT;
    const REGISTERS: usize = 16;
    // Twelve accumulators, the decoded vector, and a packed row's scale and
    // bias: 15 registers. Sixteen accumulators spill (the 8-bit sum's loop
    // loaded and stored accumulators on the stack every row).
    const DECODE_BLOCK: usize = 12;

    #[inline(always)]
    fn splat(x: f32) -> Self {
        // SAFETY: see above the impl.
        Avx256(unsafe { _mm256_set1_ps(x) })
    }

    #[inline(always)]
    fn load(from: &[f32]) -> Self {
        Avx256(bytemuck::cast(first::<_, EIGHT>(from)))
    }

    #[inline(always)]
    fn store(self, to: &mut [f32]) {
        let values: [f32; EIGHT] = bytemuck::cast(self.0);
        to[..EIGHT].copy_from_slice(&values);
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
        // SAFETY: see above the impl.
        Avx256(unsafe { _mm256_fmadd_ps(self.0, b.0, c.0) })
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
    fn from_u8(bytes: &[u8]) -> Self {
        let wide: __m128i = bytemuck::cast([first::<_, EIGHT>(bytes), [0; 8]]);
        // SAFETY: see above the impl.
        Avx256(unsafe { _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(wide)) })
    }

    #[inline(always)]
    fn from_packed<const BITS: u32>(word: u64) -> Self {
        // Eight levels of at most 4 bits: the low 32 bits hold them.
        let word = word as u32;
        let b = BITS as i32;
        // SAFETY: see above the impl.
        Avx256(unsafe {
            let shifts = _mm256_setr_epi32(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b);
            let mask = _mm256_set1_epi32((1 << BITS) - 1);
            let spread = _mm256_srlv_epi32(_mm256_set1_epi32(word as i32), shifts);
            _mm256_cvtepi32_ps(_mm256_and_si256(spread, mask))
        })
    }

    #[inline(always)]
    fn from_nibble_pairs(bytes: &[u8]) -> (Self, Self) {
        let wide: __m128i = bytemuck::cast([first::<_, EIGHT>(bytes), [0; 8]]);
        // SAFETY: see above the impl.
        unsafe {
            let codes = _mm256_cvtepu8_epi32(wide);
            let low = _mm256_and_si256(codes, _mm256_set1_epi32(0xf));
            let high = _mm256_srli_epi32::<4>(codes);
            (
                Avx256(_mm256_cvtepi32_ps(low)),
                Avx256(_mm256_cvtepi32_ps(high)),
            )
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
    fn from_f16(halves: &[u16]) -> Self {
        let halves: __m128i = bytemuck::cast(first::<_, EIGHT>(halves));
        // SAFETY: see above the impl.
        Avx256(unsafe { _mm256_cvtph_ps(halves) })
    }

    #[inline(always)]
    fn from_bf16(halves: &[u16]) -> Self {
        let halves: __m128i = bytemuck::cast(first::<_, EIGHT>(halves));
        // SAFETY: see above the impl.
        Avx256(unsafe {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(halves)))
        })
    }

    #[inline(always)]
    fn stream(dst: &mut [f32], src: Option<&[f32]>) {
        // SAFETY: see above the impl.
        unsafe { stream(dst, src) }
    }

    #[inline(always)]
    fn apart<B: Body>(body: B) -> B::Output {
        // SAFETY: see above the impl; the function needs the same features.
        unsafe { apart_avx2(body) }
    }
}

/// One 512-bit register of sixteen `f32`s, on a CPU with AVX-512F (and the
/// features of `Level::Avx2`). Private: see the module notes.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Avx512(__m512);

/// Lanes per [`Avx512`] vector.
const SIXTEEN: usize = 16;

// The SAFETY of every `unsafe` block below: the intrinsic needs AVX-512F or
// AVX, and an `Avx512` is only reachable through `run_avx512`, which `run`
// calls only with an `Avx` proving `Level::Avx512` (AVX, AVX2, FMA, F16C,
// AVX-512F and AVX-512VL; the module notes); the intrinsics touch no
// memory.
impl Lanes for Avx512 {
    const WIDTH: usize = SIXTEEN;
    // Sixteen vectors a block (the lookup, the maxima, sums of half rows), as
    // with eight lanes: 256 columns, the half of the 32 registers that
    // leaves the rest to a decode.
    const REGISTERS: usize = 16;
    // A sum of 384 columns (minilm's rows) in one pass over its bag rather
    // than two, 768 (gpt2's) in two rather than three.
    const SUM_BLOCK: usize = 24;

    #[inline(always)]
    fn splat(x: f32) -> Self {
        // SAFETY: see above the impl.
        Avx512(unsafe { _mm512_set1_ps(x) })
    }

    #[inline(always)]
    fn load(from: &[f32]) -> Self {
        Avx512(bytemuck::cast(first::<_, SIXTEEN>(from)))
    }

    #[inline(always)]
    fn store(self, to: &mut [f32]) {
        let values: [f32; SIXTEEN] = bytemuck::cast(self.0);
        to[..SIXTEEN].copy_from_slice(&values);
    }

    #[inline(always)]
    fn add(self, other: Self) -> Self {
        // SAFETY: see above the impl.
        Avx512(unsafe { _mm512_add_ps(self.0, other.0) })
    }

    #[inline(always)]
    fn mul(self, other: Self) -> Self {
        // SAFETY: see above the impl.
        Avx512(unsafe { _mm512_mul_ps(self.0, other.0) })
    }

    #[inline(always)]
    fn div(self, other: Self) -> Self {
        // SAFETY: see above the impl.
        Avx512(unsafe { _mm512_div_ps(self.0, other.0) })
    }

    #[inline(always)]
    fn mul_add(self, b: Self, c: Self) -> Self {
        // SAFETY: see above the impl.
        Avx512(unsafe { _mm512_fmadd_ps(self.0, b.0, c.0) })
    }

    #[inline(always)]
    fn greater(self, other: Self) -> Self {
        // SAFETY: see above the impl.
        Avx512(unsafe {
            let mask = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(self.0, other.0);
            _mm512_castsi512_ps(_mm512_maskz_mov_epi32(mask, _mm512_set1_epi32(-1)))
        })
    }

    #[inline(always)]
    fn select(self, if_true: Self, if_false: Self) -> Self {
        // SAFETY: see above the impl.
        Avx512(unsafe {
            // The mask's lanes are all ones or all zeros (`greater`): any
            // set bit marks a lane.
            let bits = _mm512_castps_si512(self.0);
            let mask = _mm512_test_epi32_mask(bits, bits);
            _mm512_mask_blend_ps(mask, if_false.0, if_true.0)
        })
    }

    #[inline(always)]
    fn from_u8(bytes: &[u8]) -> Self {
        let bytes: __m128i = bytemuck::cast(first::<_, SIXTEEN>(bytes));
        // SAFETY: see above the impl.
        Avx512(unsafe { _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)) })
    }

    #[inline(always)]
    fn from_packed<const BITS: u32>(word: u64) -> Self {
        let b = BITS as i32;
        // SAFETY: see above the impl.
        Avx512(unsafe {
            // Lanes 0-7 shift the low 32 bits of the word, lanes 8-15 the
            // bits from 8·BITS on (for 2-bit levels the same word, shifted
            // on by 16): each lane's shift stays below 32.
            let (low, high) = (word as u32, (word >> (8 * BITS)) as u32);
            let words = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_set1_epi32(low as i32)),
                _mm256_set1_epi32(high as i32),
            );
            let shifts = _mm512_setr_epi32(
                0,
                b,
                2 * b,
                3 * b,
                4 * b,
                5 * b,
                6 * b,
                7 * b,
                0,
                b,
                2 * b,
                3 * b,
                4 * b,
                5 * b,
                6 * b,
                7 * b,
            );
            let mask = _mm512_set1_epi32((1 << BITS) - 1);
            let spread = _mm512_srlv_epi32(words, shifts);
            _mm512_cvtepi32_ps(_mm512_and_si512(spread, mask))
        })
    }

    #[inline(always)]
    fn from_nibble_pairs(bytes: &[u8]) -> (Self, Self) {
        let bytes: __m128i = bytemuck::cast(first::<_, SIXTEEN>(bytes));
        // SAFETY: see above the impl.
        unsafe {
            let codes = _mm512_cvtepu8_epi32(bytes);
            let low = _mm512_and_si512(codes, _mm512_set1_epi32(0xf));
            let high = _mm512_srli_epi32::<4>(codes);
            (
                Avx512(_mm512_cvtepi32_ps(low)),
                Avx512(_mm512_cvtepi32_ps(high)),
            )
        }
    }

    #[inline(always)]
    fn interleave(even: Self, odd: Self) -> (Self, Self) {
        // SAFETY: see above the impl.
        unsafe {
            // Index `i` picks lane `i` of `even`, `16 + i` lane `i` of `odd`.
            let first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
            let second =
                _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
            (
                Avx512(_mm512_permutex2var_ps(even.0, first, odd.0)),
                Avx512(_mm512_permutex2var_ps(even.0, second, odd.0)),
            )
        }
    }

    #[inline(always)]
    fn from_f16(halves: &[u16]) -> Self {
        let halves: __m256i = bytemuck::cast(first::<_, SIXTEEN>(halves));
        // SAFETY: see above the impl.
        Avx512(unsafe { _mm512_cvtph_ps(halves) })
    }

    #[inline(always)]
    fn from_bf16(halves: &[u16]) -> Self {
        let halves: __m256i = bytemuck::cast(first::<_, SIXTEEN>(halves));
        // SAFETY: see above the impl.
        Avx512(unsafe {
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(halves)))
        })
    }

    #[inline(always)]
    fn stream(dst: &mut [f32], src: Option<&[f32]>) {
        // 32-byte streaming stores: a whole line is written either way.
        // SAFETY: see above the impl (AVX at this level).
        unsafe { stream(dst, src) }
    }

    #[inline(always)]
    fn apart<B: Body>(body: B) -> B::Output {
        // SAFETY: see above the impl; the function needs the same features.
        unsafe { apart_avx512(body) }
    }
}

/// [`Lanes::stream`] with 32-byte stores. A function of its own, compiled
/// with AVX, so that the closure inside it is too (a closure is compiled
/// apart from the function that calls it, and inherits only the target
/// features of the function that defines it).
#[target_feature(enable = "avx")]
fn stream(dst: &mut [f32], src: Option<&[f32]>) {
    super::stream::with::<__m256, EIGHT>(dst, src, |d, v| {
        // SAFETY: `d` is a live `&mut __m256` inside `dst`, so the pointer is
        // valid for 32 bytes and 32-byte aligned (what `pod_align_to_mut`
        // hands out), as `_mm256_stream_ps` requires; AVX is enabled here.
        unsafe { _mm256_stream_ps((d as *mut __m256).cast::<f32>(), v) }
    });
}
