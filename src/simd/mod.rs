//! SIMD: one lane trait, two instruction sets, chosen at run time.
//!
//! Every kernel body that does arithmetic on rows is written once, generic
//! over [`Lanes`] (a vector of `f32` lanes, eight or sixteen, and the few
//! operations the kernels need), and runs through [`Isa::run`], which picks
//! the registers:
//!
//! * **AVX** (`avx.rs`), where the CPU reports AVX2, FMA and F16C (Intel's
//!   Core CPUs since 2013, AMD's since 2015): the body is instantiated with
//!   an x86 lane type inside a function compiled with
//!   `#[target_feature(enable = ...)]`, so every load, add, compare, fused
//!   multiply-add and decode of a reduced-precision row in it is one vector
//!   instruction. Two such
//!   wrappers, as PyTorch and FBGEMM have: AVX2, with eight lanes of a
//!   `__m256` (sixteen registers holding 128 columns), and AVX-512F, with
//!   sixteen lanes of a `__m512`: half the instructions a row, and 32
//!   registers, so a block's accumulators and a decode's temporaries all
//!   stay in registers.
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

/// The most lanes a vector of any lane type holds: buffers that take one
/// vector of any type are this long.
pub(crate) const MAX_LANES: usize = 16;

/// A vector of `f32` lanes and what the kernels do with them. Each
/// operation is the IEEE operation of one lane, rounded as a scalar one
/// would be.
///
/// Vectors move to and from memory through slices: a slice handed to a
/// method holds at least [`Lanes::WIDTH`] values (or bytes, or halves, as
/// each method says), and only the first `WIDTH` are read or written. The
/// kernels cut their rows with `chunks_exact(V::WIDTH)`, a constant once the
/// body is compiled for `V`, so the length checks fold away.
pub(crate) trait Lanes: Copy + Send + Sync + 'static {
    /// Lanes per vector: 8 (256-bit AVX, `wide::f32x8`) or 16 (AVX-512).
    const WIDTH: usize;
    /// How many vectors of this type a column block keeps in registers
    /// (sixteen for AVX's sixteen 256-bit registers and for AVX-512's 32
    /// 512-bit ones, which then also hold a decode's temporaries; eight
    /// `f32x8`, which are sixteen 128-bit halves, for SSE2). A bag sum may
    /// go wider: [`SUM_BLOCK`](Self::SUM_BLOCK).
    const REGISTERS: usize;
    /// The widest column block a bag sum keeps in registers, in vectors:
    /// [`REGISTERS`](Self::REGISTERS), but 24 on AVX-512, whose 32
    /// registers then keep 8 for a decode's temporaries and the row's scale
    /// and bias. Read by the sums of `f32` and packed rows only (see
    /// `kernels::bag::sum`).
    const SUM_BLOCK: usize = Self::REGISTERS;
    /// The widest column block of a bag sum over half or packed rows that
    /// take more than one block anyway: [`SUM_BLOCK`](Self::SUM_BLOCK), but
    /// 12 with AVX, where sixteen accumulators and a decode's temporaries
    /// (and a packed row's scale and bias) do not fit the sixteen registers
    /// and the block spills to the stack. A row of one block keeps the
    /// wider one: its one pass is worth the spills.
    const DECODE_BLOCK: usize = Self::SUM_BLOCK;
    /// Whether these lanes are the target's fallback: on x86-64 the
    /// portable lanes run only on a CPU without AVX2 and FMA, when forced,
    /// and for ids of tables past 2^32 rows. A kernel compiles the fewest
    /// variants it can for them (the block ladder starts at four vectors,
    /// not eight), to keep the library's build small. A block of two stays:
    /// a row of one cache line of `f32`s is one.
    const FALLBACK: bool = false;

    /// `WIDTH` copies of `x`.
    fn splat(x: f32) -> Self;
    /// The first `WIDTH` values of `from`.
    fn load(from: &[f32]) -> Self;
    /// The lanes to the first `WIDTH` values of `to`.
    fn store(self, to: &mut [f32]);
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
    /// `if_true` where `self` (a mask of [`Lanes::greater`], whose lanes
    /// are all ones or all zeros: no other lanes are allowed) is set,
    /// `if_false` elsewhere, bit for bit.
    fn select(self, if_true: Self, if_false: Self) -> Self;
    /// The first `WIDTH` bytes of `bytes` as lanes (`0.0..=255.0`), the
    /// first byte in lane 0.
    fn from_u8(bytes: &[u8]) -> Self;
    /// `WIDTH` levels of `BITS` bits (4 or 2) packed in `word`, lowest bits
    /// first, as lanes: lane `j` is `(word >> j·BITS) & (2^BITS - 1)`.
    fn from_packed<const BITS: u32>(word: u64) -> Self;
    /// `2·WIDTH` 4-bit levels, two a byte (the even column in the low
    /// nibble), from the first `WIDTH` bytes of `bytes`, dealt out to two
    /// vectors by column parity: lane `i` of the first is byte `i`'s low
    /// nibble (column `2i`), lane `i` of the second its high nibble (column
    /// `2i + 1`). One widening load for two vectors; [`Lanes::interleave`]
    /// puts the pair back in column order.
    fn from_nibble_pairs(bytes: &[u8]) -> (Self, Self);
    /// A pair dealt out by column parity (lane `i` of `even` is column `2i`
    /// of `2·WIDTH`, of `odd` column `2i + 1`) in column order: the first
    /// `WIDTH` columns, then the next. Moves bits only.
    fn interleave(even: Self, odd: Self) -> (Self, Self);
    /// The first `WIDTH` `f16`s (their bits) of `halves` as lanes, exactly.
    fn from_f16(halves: &[u16]) -> Self;
    /// The first `WIDTH` `bf16`s (their bits) of `halves` as lanes, exactly.
    fn from_bf16(halves: &[u16]) -> Self;
    /// `dst = src`, or zeros when `src` is `None`, with non-temporal stores
    /// where `dst` is aligned for this register (see [`stream`]).
    fn stream(dst: &mut [f32], src: Option<&[f32]>);
    /// `body` run with this lane type, compiled as a function of its own
    /// (never inlined into its caller) with this lane type's instruction
    /// set: for the AVX types a function with the features of its level,
    /// called from code that already runs with those lanes (see `avx.rs`),
    /// so it needs no proof of its own. What a large kernel uses to keep
    /// LLVM's work on it in pieces (the bags' column blocks).
    fn apart<B: Body>(body: B) -> B::Output;
}

/// Lanes per vector of the eight-lane types.
const EIGHT: usize = 8;

/// The first `N` values of `from` (a vector's worth), as an array.
#[inline(always)]
fn first<T: Copy, const N: usize>(from: &[T]) -> [T; N] {
    let mut out = [from[0]; N];
    out.copy_from_slice(&from[..N]);
    out
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
    /// AVX registers (256-bit, or 512-bit at the AVX-512 level); holds the
    /// proof that the CPU has the level's features.
    #[cfg(target_arch = "x86_64")]
    Avx(avx::Avx),
}

impl Isa {
    /// The instruction set the kernels run with: the widest this CPU has,
    /// or a lower one that `EMBEDDING_KERNELS_ISA` names (asked once).
    #[inline]
    pub(crate) fn detect() -> Isa {
        #[cfg(test)]
        if let Some(isa) = FORCED.get() {
            return isa;
        }
        static HERE: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *HERE.get_or_init(|| {
            let cap = std::env::var("EMBEDDING_KERNELS_ISA").ok();
            Isa::widest().capped(cap.as_deref())
        })
    }

    /// The widest instruction set this CPU has.
    fn widest() -> Isa {
        #[cfg(target_arch = "x86_64")]
        if let Some(avx) = avx::Avx::detect() {
            return Isa::Avx(avx);
        }
        Isa::Portable
    }

    /// This instruction set, or the lower one `cap` names (`portable`,
    /// `avx2`, `avx512`): a way to time or test a lower level's code on a
    /// CPU that has a higher one. A cap above this set, or one that names
    /// none (`default`, say), leaves it.
    pub(crate) fn capped(self, cap: Option<&str>) -> Isa {
        match (self, cap) {
            (_, Some("portable")) => Isa::Portable,
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx(avx), Some(name)) => match avx::Level::parse(name).and_then(|l| avx.at(l)) {
                Some(lower) => Isa::Avx(lower),
                None => self,
            },
            _ => self,
        }
    }

    /// The name [`Isa::capped`] takes for this instruction set.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx(avx) => avx.level().name(),
        }
    }

    /// Lanes per vector with this instruction set: 8, or 16 at the
    /// AVX-512 level.
    pub(crate) fn lanes(self) -> usize {
        match self {
            Isa::Portable => <wide::f32x8 as Lanes>::WIDTH,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx(avx) => avx.level().lanes(),
        }
    }

    /// Every instruction set this CPU can run, the portable one first: what
    /// the tests run each kernel on.
    #[cfg(test)]
    pub(crate) fn all() -> Vec<Isa> {
        let mut all = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        if let Some(avx) = avx::Avx::detect() {
            use avx::Level;
            let levels = [Level::Avx2, Level::Avx512];
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

    /// Runs `body` with the portable lanes, whatever the CPU has: compiled
    /// for those lanes alone.
    #[inline(always)]
    pub(crate) fn run_portable<B: Body>(body: B) -> B::Output {
        body.run::<wide::f32x8>()
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

#[cfg(test)]
mod tests {
    use super::Isa;

    /// A cap lowers the instruction set to the level it names and never
    /// raises it; a name that is no level leaves the widest.
    #[test]
    fn a_cap_only_lowers() {
        let widest = Isa::widest();
        assert_eq!(widest.capped(None), widest);
        assert_eq!(widest.capped(Some("sse9")), widest);
        assert_eq!(widest.capped(Some("")), widest);
        assert_eq!(widest.capped(Some("portable")), Isa::Portable);
        assert_eq!(Isa::Portable.capped(Some("avx512")), Isa::Portable);
        // Every level this CPU has, and only those, can be capped to; each
        // names itself back.
        for isa in Isa::all() {
            assert_eq!(widest.capped(Some(isa.name())), isa);
            assert_eq!(isa.capped(Some(widest.name())), isa);
        }
        assert_eq!(widest.capped(Some("default")), widest);
        for name in ["avx2", "avx512"] {
            let capped = widest.capped(Some(name));
            assert!(Isa::all().contains(&capped));
            let has = Isa::all().iter().any(|isa| isa.name() == name);
            assert_eq!(capped.name() == name, has, "{name}");
        }
    }
}
