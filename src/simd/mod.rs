//! SIMD: one lane trait, two instruction sets, chosen at run time.
//!
//! Every kernel body that does arithmetic on rows is written once, generic
//! over [`Lanes`] (eight `f32` lanes and the few operations the kernels
//! need), and runs through [`Isa::run`], which picks the registers:
//!
//! * **AVX** (`avx.rs`), where the CPU reports it: the body is instantiated
//!   with a `__m256` lane type inside a function compiled with
//!   `#[target_feature(enable = ...)]`, so every load, add and compare in
//!   it is a 256-bit instruction and sixteen registers hold 128 columns.
//!   Four such wrappers, one per level the CPU may have: AVX; AVX and FMA;
//!   AVX2, FMA and F16C, where reduced-precision rows decode in registers;
//!   and those with AVX-512F and AVX-512VL, where the same instructions
//!   reach 32 registers, so a block's accumulators and a decode's
//!   temporaries all stay in registers.
//! * **Portable** (`portable.rs`): `wide::f32x8`, which picks its
//!   instructions when the crate is compiled: two SSE2 halves in a default
//!   x86-64 build, one AVX register with `-C target-cpu=native`, NEON pairs
//!   on aarch64.
//!
//! `wide` decides its width at compile time, so run-time detection around
//! `wide` code alone could never reach AVX in a default build; this module is
//! how a default build still gets it. Every lane type does the same IEEE
//! operation per lane (one rounded add, multiply or divide; a fused
//! multiply-add only where asked for, as the instruction or as
//! `f32::mul_add`; an ordered compare; a bitwise select; exact decodes of
//! bytes, levels and halves), so all give the same bits, and the tests run
//! every kernel on each (`kernels/isa_tests.rs` runs each public kernel
//! under `Isa::force`, a test-only switch).
//!
//! The rest of the folder: [`row`] (whole-row operations over any lane
//! type), [`prefetch`] (cache hints), [`stream`] (non-temporal stores).

pub(crate) mod avx;
mod portable;
pub(crate) mod prefetch;
pub(crate) mod row;
pub(crate) mod stream;

/// Lanes per vector: every lane type holds eight `f32`s.
pub(crate) const LANES: usize = 8;

/// Eight `f32` lanes and what the kernels do with them. Each operation is the
/// IEEE operation of one lane, rounded as a scalar one would be.
pub(crate) trait Lanes: Copy + Send + Sync + 'static {
    /// How many vectors of this type the kernels keep in registers at once
    /// (sixteen 256-bit registers for AVX; eight `f32x8`, which are sixteen
    /// 128-bit halves, for SSE2).
    const REGISTERS: usize;

    /// Eight copies of `x`.
    fn splat(x: f32) -> Self;
    /// Eight lanes from memory.
    fn load(from: &[f32; LANES]) -> Self;
    /// The lanes to memory.
    fn store(self, to: &mut [f32; LANES]);
    /// `self + other`, lane by lane.
    fn add(self, other: Self) -> Self;
    /// `self × other`, lane by lane.
    fn mul(self, other: Self) -> Self;
    /// `self / other`, lane by lane.
    fn div(self, other: Self) -> Self;
    /// `self × b + c`, lane by lane, rounded once (a fused multiply-add: the
    /// instruction where the CPU has FMA, else `f32::mul_add`, which gives
    /// the same bits). Only the packed-table sums use it.
    fn mul_add(self, b: Self, c: Self) -> Self;
    /// All ones where `self > other` (ordered: false if either is NaN),
    /// zeros elsewhere.
    fn greater(self, other: Self) -> Self;
    /// `if_true` where `self` (a mask of [`Lanes::greater`]) is set,
    /// `if_false` elsewhere, bit for bit.
    fn select(self, if_true: Self, if_false: Self) -> Self;
    /// Eight bytes as eight lanes (`0.0..=255.0`), the first byte in lane 0.
    fn from_u8(bytes: [u8; LANES]) -> Self;
    /// Eight `BITS`-bit levels (4 or 2 bits) packed in `word`, lowest bits
    /// first, as eight lanes: lane `j` is `(word >> j·BITS) & (2^BITS - 1)`.
    fn from_packed<const BITS: u32>(word: u32) -> Self;
    /// Sixteen 4-bit levels, two a byte (the even column in the low
    /// nibble), dealt out to two vectors by column parity: lane `i` of the
    /// first is byte `i`'s low nibble (column `2i`), lane `i` of the second
    /// its high nibble (column `2i + 1`). One widening load for two vectors;
    /// [`Lanes::interleave`] puts the pair back in column order.
    fn from_nibble_pairs(bytes: [u8; LANES]) -> (Self, Self);
    /// A pair dealt out by column parity (lane `i` of `even` is column `2i`
    /// of sixteen, of `odd` column `2i + 1`) in column order: columns 0-7,
    /// then 8-15. Moves bits only.
    fn interleave(even: Self, odd: Self) -> (Self, Self);
    /// Eight `f16`s (their bits) as eight lanes, exactly.
    fn from_f16(halves: [u16; LANES]) -> Self;
    /// Eight `bf16`s (their bits) as eight lanes, exactly.
    fn from_bf16(halves: [u16; LANES]) -> Self;
    /// `dst = src`, or zeros when `src` is `None`, with non-temporal stores
    /// where `dst` is aligned for this register (see [`stream`]).
    fn stream(dst: &mut [f32], src: Option<&[f32]>);
}

/// `a × b + c` lane by lane, each rounded once: the fused multiply-add of
/// lane types without an FMA instruction.
#[inline(always)]
fn fused_lanes(a: [f32; LANES], b: [f32; LANES], c: [f32; LANES]) -> [f32; LANES] {
    core::array::from_fn(|i| a[i].mul_add(b[i], c[i]))
}

/// [`Lanes::from_u8`] a value at a time.
#[inline(always)]
fn widen_u8(bytes: [u8; LANES]) -> [f32; LANES] {
    bytes.map(f32::from)
}

/// [`Lanes::from_packed`] a value at a time.
#[inline(always)]
fn widen_packed<const BITS: u32>(word: u32) -> [f32; LANES] {
    let mask = (1u32 << BITS) - 1;
    core::array::from_fn(|j| ((word >> (j as u32 * BITS)) & mask) as f32)
}

/// [`Lanes::from_nibble_pairs`] a value at a time.
#[inline(always)]
fn widen_nibble_pairs(bytes: [u8; LANES]) -> ([f32; LANES], [f32; LANES]) {
    (
        bytes.map(|b| f32::from(b & 0xf)),
        bytes.map(|b| f32::from(b >> 4)),
    )
}

/// [`Lanes::interleave`] a value at a time.
#[inline(always)]
fn interleave_lanes(even: [f32; LANES], odd: [f32; LANES]) -> ([f32; LANES], [f32; LANES]) {
    let mut out = [[0.0; LANES]; 2];
    for (i, (e, o)) in even.into_iter().zip(odd).enumerate() {
        out[i / 4][2 * (i % 4)] = e;
        out[i / 4][2 * (i % 4) + 1] = o;
    }
    (out[0], out[1])
}

/// [`Lanes::from_f16`] a value at a time.
#[inline(always)]
fn widen_f16(halves: [u16; LANES]) -> [f32; LANES] {
    halves.map(|h| half::f16::from_bits(h).to_f32())
}

/// [`Lanes::from_bf16`] a value at a time: a `bf16` is the top half of an
/// `f32`'s bits.
#[inline(always)]
fn widen_bf16(halves: [u16; LANES]) -> [f32; LANES] {
    halves.map(|h| f32::from_bits(u32::from(h) << 16))
}

/// A kernel body that runs on any lane type: what [`Isa::run`] calls.
pub(crate) trait Body {
    /// What the body returns.
    type Output;
    /// Runs the body with lanes of type `V`. Implementations are
    /// `#[inline(always)]`, so the body is compiled into the caller, and with
    /// AVX that caller is compiled with AVX enabled.
    fn run<V: Lanes>(self) -> Self::Output;
}

/// The instruction set a kernel runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// `wide::f32x8`, whatever the build targets.
    Portable,
    /// 256-bit AVX registers; holds the proof that the CPU has AVX.
    #[cfg(target_arch = "x86_64")]
    Avx(avx::Avx),
}

impl Isa {
    /// The widest instruction set this CPU has (asked once, then cached by
    /// `std`).
    #[inline]
    pub(crate) fn detect() -> Isa {
        #[cfg(test)]
        if let Some(isa) = FORCED.get() {
            return isa;
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(avx) = avx::Avx::detect() {
            return Isa::Avx(avx);
        }
        Isa::Portable
    }

    /// Every instruction set this CPU can run, the portable one first: what
    /// the tests run each kernel on.
    #[cfg(test)]
    pub(crate) fn all() -> Vec<Isa> {
        let mut all = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        if let Some(avx) = avx::Avx::detect() {
            use avx::Level;
            let levels = [Level::Avx, Level::Fma, Level::Avx2, Level::Avx512];
            all.extend(levels.into_iter().filter_map(|l| avx.at(l)).map(Isa::Avx));
        }
        all
    }

    /// Runs `f` with [`Isa::detect`] answering `self` on this thread: what
    /// the tests use to run whole kernels (with `Parallelism::Serial`, so
    /// every task stays on this thread) on each instruction set.
    #[cfg(test)]
    pub(crate) fn force<R>(self, f: impl FnOnce() -> R) -> R {
        let before = FORCED.replace(Some(self));
        let result = f();
        FORCED.set(before);
        result
    }

    /// Runs `body` with this instruction set's lanes.
    #[inline(always)]
    pub(crate) fn run<B: Body>(self, body: B) -> B::Output {
        match self {
            Isa::Portable => body.run::<wide::f32x8>(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx(avx) => avx::run(avx, body),
        }
    }
}

#[cfg(test)]
std::thread_local! {
    /// The instruction set [`Isa::force`] set for this thread, if any.
    static FORCED: core::cell::Cell<Option<Isa>> = const { core::cell::Cell::new(None) };
}
