//! What the differential fuzz targets in `fuzz_targets/` share: turning the
//! fuzzer's bytes into one call ([`Case`]), running it on a local rayon pool
//! of 1 to [`MAX_THREADS`] threads, and comparing the call with the one-hot
//! reference bit for bit.
//!
//! A target implements [`Target`] (how to make each [`Call`] of its
//! operation) and hands its bytes to [`run`].
//!
//! # From bytes to a call
//!
//! A short header, read with [`arbitrary::Unstructured`], picks, in this
//! order, the id type, the thread count, the entry point (plain, `_with`
//! each [`Parallelism`], or the scalar baseline), the row count,
//! `dim`, the id count, a shape fault (a wrong table or per-id buffer
//! length, or a `dim` so large that `ids.len() × dim` overflows), up to
//! [`MAX_PLANTS`] planted ids, how the other ids are filled, the kind of
//! float values, the scale and a seed. Past the end of the input every read
//! is 0.
//!
//! The bulk, up to 3000 ids and (in the rare giant-output cases) 3 million
//! floats, comes from a SplitMix64 stream seeded by the header, so a short
//! input reaches every driver: serial, split across the pool, and the
//! large calls that the default `Auto` splits (2 MiB of output for the
//! gathers, 8 MiB of gradient for the scatter-add). What the
//! checks care about most, the edge ids (`rows - 1`, `rows`, -1, `i64::MIN`,
//! `u64::MAX`, the type's own extremes) and where they sit (first, last, on
//! the 1024-id boundaries of the id scan), comes from the bytes themselves,
//! so the fuzzer steers it directly.
//!
//! # Running
//!
//! On the stable toolchain, from the repository root (`.ci/run` does this
//! for a bounded time):
//!
//! ```text
//! cargo install cargo-fuzz --locked
//! cargo fuzz run -s none --no-trace-compares gather          # until stopped
//! cargo fuzz run -s none --no-trace-compares scatter_add -- -max_total_time=60
//! cargo fuzz run -s none --no-trace-compares gather fuzz/artifacts/gather/crash-…
//! ```
//!
//! `-s none` builds without a sanitizer, which needs no nightly flag.
//! `--no-trace-compares` doubles the throughput (most of the time goes to
//! the one-hot reference, a long instrumented loop); plain
//! `cargo fuzz run -s none TARGET` works too.
//!
//! # The reference
//!
//! The one-hot reference, on a copy of the same buffer. It costs
//! `ids × rows` time and memory, so cases with many ids have few rows.

use arbitrary::Unstructured;
use embedding_kernels::{EmbeddingError, Index, Parallelism};
use rayon::{ThreadPool, ThreadPoolBuilder};
use std::sync::OnceLock;

/// The largest thread count a case runs with.
pub const MAX_THREADS: usize = 4;

/// The most ids one case overwrites with a value chosen by the bytes.
pub const MAX_PLANTS: usize = 4;

/// The largest id count of a case.
pub const MAX_IDS: usize = 3000;

/// The smallest id count of the "many ids" cases: a few dozen parallel
/// tasks of the gathers, long runs of repeated ids for the scatter-add.
const MANY_IDS: u64 = 1024;

/// Row counts of the large-table mode: both sides of 2^11, 2^12 and 2^13.
const LARGE_ROWS: [usize; 8] = [2047, 2048, 2049, 4095, 4096, 4097, 8191, 8193];

/// Id count cap in the large-table mode, so the one-hot matrix stays at
/// about four million entries.
const LARGE_ROWS_MAX_IDS: usize = 512;

/// How many floats of a buffer are drawn one by one; the rest repeat them.
/// A prime, so the repeats do not line up with rows.
const FRESH_FLOATS: usize = 65_521;

/// Row widths of the giant-output mode: with [`MAX_IDS`] ids each makes
/// more than 8 MiB of output, past the 2 MiB (gathers) and 8 MiB
/// (scatter-add) from which the plain kernels
/// (`Parallelism::Auto`) split across the pool; odd widths put rows
/// at every 16-byte misalignment.
const GIANT_DIMS: [usize; 8] = [700, 701, 702, 703, 704, 705, 767, 1025];

/// Values of `dim` for which `ids.len() × dim` overflows or is absurd.
const HUGE_DIMS: [usize; 5] = [
    usize::MAX,
    usize::MAX / 2 + 1,
    usize::MAX / 3,
    1 << 62,
    1 << 32,
];

/// The id scan of the crate works in blocks of this many ids; planted ids
/// like to sit next to a block boundary.
const SCAN_BLOCK: usize = 1024;

/// An id type of the crate, with what the decoder needs to build its values.
pub trait Id: Index {
    /// The type's name, for failure messages.
    const NAME: &'static str;
    /// The type's smallest value.
    const MIN: i128;
    /// The type's largest value.
    const MAX: i128;
    /// `v` cast to the type with `as` (two's-complement truncation), the way
    /// a caller converting ids would get it.
    fn wrap(v: i128) -> Self;
}

macro_rules! impl_id {
    ($($t:ty),*) => {$(
        impl Id for $t {
            const NAME: &'static str = stringify!($t);
            const MIN: i128 = <$t>::MIN as i128;
            const MAX: i128 = <$t>::MAX as i128;
            fn wrap(v: i128) -> Self {
                v as $t
            }
        }
    )*};
}

impl_id!(u32, i32, u64, i64, usize);

/// Which float values an operand may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Values {
    /// Anything but NaN: eighths, values of widely spread exponents (so
    /// sums round and their order shows), ±0, ±inf, subnormals, ±`f32::MAX`.
    /// NaNs that arithmetic makes from these are the machine's default NaN,
    /// the same bits on both sides.
    NoNan,
    /// Any bit pattern, quiet and signalling NaNs with payloads included.
    /// Only for values that are copied, never combined with another NaN.
    AnyBits,
}

/// How a case's floats are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fill {
    /// `k / 8` for `k` in -128..128: every sum of a few thousand is exact.
    Eighths,
    /// `k / 8 × 2^e` for `e` in -20..=20: sums round, so order matters.
    WideExponents,
    /// Eighths with one value in 16 from [`SPECIALS`].
    WithSpecials,
    /// Raw bit patterns (one in 256 a NaN).
    Bits,
    /// Eighths with one value in 16 from [`SPECIALS`] or [`NANS`].
    WithNans,
    /// One NaN canary everywhere.
    Canary,
}

const FILLS_NO_NAN: [Fill; 3] = [Fill::WideExponents, Fill::Eighths, Fill::WithSpecials];
const FILLS_ANY: [Fill; 6] = [
    Fill::WideExponents,
    Fill::Eighths,
    Fill::WithSpecials,
    Fill::Bits,
    Fill::WithNans,
    Fill::Canary,
];

/// Non-NaN values at the edges of `f32`.
const SPECIALS: [f32; 12] = [
    0.0,
    -0.0,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::MAX,
    f32::MIN,
    f32::MIN_POSITIVE,
    f32::from_bits(1),           // the smallest subnormal
    f32::from_bits(0x8000_0001), // its negative
    1e30,
    -1e30,
    0.1,
];

/// NaNs: quiet and signalling, both signs, with payloads.
const NANS: [u32; 6] = [
    0x7fc0_0000,
    0x7f80_0001,
    0xff80_0002,
    0xffc0_1234,
    0x7fff_ffff,
    0x7fa0_beef,
];

/// The canary a [`Fill::Canary`] buffer holds: a quiet NaN with a payload.
const CANARY: u32 = 0x7fc0_0bad;

/// Scales a case may use; more come as raw bits.
const SCALES: [f32; 14] = [
    22.627_417, // sqrt(512), a transformer's embedding scale
    1.0,
    0.0,
    -0.0,
    -1.0,
    0.5,
    8.0,
    3.0,
    1e-30,
    f32::MAX,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::from_bits(1),
    f32::NAN,
];

/// One way to run an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// `gather`, `gather_scaled`, `scatter_add`.
    Plain,
    /// The `_with` form.
    With(Parallelism),
    /// `reference::loops`, the plain-loop baseline.
    Scalar,
    /// The one-hot `reference`.
    Reference,
}

/// The calls a case may test.
const KERNEL_CALLS: [Call; 5] = [
    Call::With(Parallelism::Rayon),
    Call::Plain,
    Call::With(Parallelism::Serial),
    Call::With(Parallelism::Auto),
    Call::Scalar,
];

/// An id chosen by the bytes, as a value relative to the row count.
#[derive(Clone, Copy, Debug)]
enum Special {
    LastValid,
    FirstInvalid,
    Beyond(u8),
    Zero,
    MinusOne,
    MinusRows,
    I64Min,
    U64Max,
    TypeMin,
    TypeMax,
    Pow32,
    Valid(u64),
    Raw(u64),
}

impl Special {
    fn decode(d: &mut Decoder<'_>) -> Special {
        match d.below(13) {
            0 => Special::LastValid,
            1 => Special::FirstInvalid,
            2 => Special::Beyond(d.byte()),
            3 => Special::Zero,
            4 => Special::MinusOne,
            5 => Special::MinusRows,
            6 => Special::I64Min,
            7 => Special::U64Max,
            8 => Special::TypeMin,
            9 => Special::TypeMax,
            10 => Special::Pow32,
            11 => Special::Valid(d.u64()),
            _ => Special::Raw(d.u64()),
        }
    }

    fn id<I: Id>(self, rows: usize) -> I {
        let rows = rows as i128;
        I::wrap(match self {
            Special::LastValid => rows - 1,
            Special::FirstInvalid => rows,
            Special::Beyond(k) => rows + 1 + i128::from(k),
            Special::Zero => 0,
            Special::MinusOne => -1,
            Special::MinusRows => -rows,
            Special::I64Min => i128::from(i64::MIN),
            Special::U64Max => i128::from(u64::MAX),
            Special::TypeMin => I::MIN,
            Special::TypeMax => I::MAX,
            Special::Pow32 => 1 << 32,
            Special::Valid(r) => valid(r, rows as usize) as i128,
            Special::Raw(bits) => i128::from(bits as i64),
        })
    }
}

/// A row below `rows` drawn from `r`, or 0 (itself out of range) if there
/// are no rows.
fn valid(r: u64, rows: usize) -> usize {
    if rows == 0 {
        0
    } else {
        (r % rows as u64) as usize
    }
}

/// Where a planted id goes.
#[derive(Clone, Copy, Debug)]
enum Position {
    First,
    Last,
    /// `k × 1024 + delta - 1`: just before, on or just after a scan block.
    Block(u8, u8),
    Anywhere(u64),
}

impl Position {
    fn decode(d: &mut Decoder<'_>) -> Position {
        match d.below(4) {
            0 => Position::First,
            1 => Position::Last,
            2 => Position::Block(d.byte() % 3, d.byte() % 3),
            _ => Position::Anywhere(d.u64()),
        }
    }

    /// The position in a call of `n > 0` ids.
    fn at(self, n: usize) -> usize {
        match self {
            Position::First => 0,
            Position::Last => n - 1,
            Position::Block(k, delta) => {
                ((usize::from(k) + 1) * SCAN_BLOCK + usize::from(delta) - 1).min(n - 1)
            }
            Position::Anywhere(r) => (r % n as u64) as usize,
        }
    }
}

/// How the bulk of the ids is drawn (all valid when there are rows).
#[derive(Clone, Debug)]
enum Pattern {
    /// Uniform over the rows.
    Uniform,
    /// One id holding about `share`/16 of the positions, the rest uniform:
    /// a hot row, summed many times over.
    Hot(u8),
    /// Uniform over the first `k` rows only: many repeats.
    Few(u8),
    /// `0, 1, 2, …` modulo the rows.
    Ascending,
    /// The listed ids over and over; a short call is exactly the list.
    Listed(Vec<Special>),
}

impl Pattern {
    fn decode(d: &mut Decoder<'_>) -> Pattern {
        match d.below(5) {
            0 => Pattern::Uniform,
            1 => Pattern::Hot(d.byte() % 17),
            2 => Pattern::Few(d.byte()),
            3 => Pattern::Ascending,
            _ => {
                let len = 1 + d.below(16) as usize;
                Pattern::Listed((0..len).map(|_| Special::decode(d)).collect())
            }
        }
    }
}

/// A small deterministic generator for the bulk of a case (targets draw
/// from it too).
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 bits of the stream.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// `len` values of kind `fill`. Each value takes 16 bits of the stream
    /// (32 for raw bits); past [`FRESH_FLOATS`] the values repeat, which
    /// keeps the giant outputs cheap.
    fn floats(&mut self, len: usize, fill: Fill) -> Vec<f32> {
        let fresh = len.min(FRESH_FLOATS);
        let mut out = Vec::with_capacity(len);
        while out.len() < fresh {
            let word = self.next_u64();
            let halves = [word as u32, (word >> 32) as u32];
            let quarters = [
                word as u16,
                (word >> 16) as u16,
                (word >> 32) as u16,
                (word >> 48) as u16,
            ];
            if fill == Fill::Bits {
                out.extend(halves.map(f32::from_bits));
            } else {
                out.extend(quarters.map(|q| float(q, fill)));
            }
        }
        out.truncate(fresh);
        while out.len() < len {
            let more = (len - out.len()).min(out.len());
            out.extend_from_within(..more);
        }
        out
    }
}

/// The value of kind `fill` that 16 random bits pick (not for [`Fill::Bits`]).
fn float(bits: u16, fill: Fill) -> f32 {
    let [k, sel] = bits.to_le_bytes();
    let eighth = (i32::from(k) - 128) as f32 / 8.0;
    match fill {
        Fill::Eighths => eighth,
        Fill::WideExponents => {
            // 2^e for e in -20..=20, built from its exponent bits: exact.
            let e = i32::from(sel % 41) - 20;
            eighth * f32::from_bits(((127 + e) as u32) << 23)
        }
        Fill::WithSpecials | Fill::WithNans if sel % 16 == 0 => {
            let kinds = if fill == Fill::WithNans { 18 } else { 12 };
            let pick = usize::from(k) % kinds;
            SPECIALS
                .get(pick)
                .copied()
                .unwrap_or_else(|| f32::from_bits(NANS[pick - SPECIALS.len()]))
        }
        Fill::WithSpecials | Fill::WithNans => eighth,
        Fill::Canary => f32::from_bits(CANARY),
        Fill::Bits => unreachable!("raw bits take 32 bits each"),
    }
}

/// Reads the header; past the end of the bytes every read is 0.
struct Decoder<'a>(Unstructured<'a>);

impl Decoder<'_> {
    fn byte(&mut self) -> u8 {
        self.0.arbitrary().unwrap_or(0)
    }

    fn u32(&mut self) -> u32 {
        self.0.arbitrary().unwrap_or(0)
    }

    fn u64(&mut self) -> u64 {
        self.0.arbitrary().unwrap_or(0)
    }

    /// A number below `n` (which must be at least 1).
    fn below(&mut self, n: u64) -> u64 {
        self.0.int_in_range(0..=n - 1).unwrap_or(0)
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len() as u64) as usize]
    }

    /// `len` moved by a nonzero amount of at most 16 either way.
    fn wrong(&mut self, len: usize) -> usize {
        let delta = self.below(32) as isize - 16;
        len.saturating_add_signed(if delta == 0 { 1 } else { delta })
    }
}

/// Everything about a case except its ids, which need the id type.
struct Header {
    id_type: u64,
    threads: usize,
    call: Call,
    rows: usize,
    dim: usize,
    n: usize,
    table_len: usize,
    per_id_len: usize,
    table_fill: Fill,
    per_id_fill: Fill,
    scale: f32,
    seed: u64,
    pattern: Pattern,
    plants: Vec<(Position, Special)>,
}

impl Header {
    fn decode<T: Target>(d: &mut Decoder<'_>) -> Header {
        // An all-zero input is a useful case: 1024 u32 ids over 16 rows of
        // dim 16, split across a pool of 2 threads, no fault, summed values
        // of spread exponents, scale 22.6. libFuzzer starts with short
        // inputs, and past their end every read is 0.
        let id_type = d.below(5);
        let threads = [2, 1, 3, 4][d.below(4) as usize];
        let call = d.pick(&KERNEL_CALLS);
        let rows_byte = d.byte();
        let dim_byte = d.byte();
        let mut n = match d.below(4) {
            1 => d.below(17),
            2 => d.below(301),
            _ => MANY_IDS + d.below(MAX_IDS as u64 - MANY_IDS + 1),
        } as usize;
        let (rows, mut dim) = match rows_byte {
            0..=0xef => (
                (usize::from(rows_byte) + 16) % 65,
                (usize::from(dim_byte) + 16) % 41,
            ),
            0xf0..=0xfb => {
                n = n.min(LARGE_ROWS_MAX_IDS);
                (
                    LARGE_ROWS[usize::from(rows_byte % 8)],
                    usize::from(dim_byte) % 41,
                )
            }
            _ => {
                n = MAX_IDS;
                (
                    usize::from(rows_byte % 4) + 1,
                    GIANT_DIMS[usize::from(dim_byte % 8)],
                )
            }
        };
        let (mut table_len, mut per_id_len) = (rows * dim, n * dim);
        match d.below(8) {
            4 => table_len = d.wrong(table_len),
            5 => per_id_len = d.wrong(per_id_len),
            6 => (table_len, per_id_len) = (d.wrong(table_len), d.wrong(per_id_len)),
            7 => {
                // Nothing this large can be allocated: the call must fail
                // (or have no ids) before it looks at a single value.
                dim = d.pick(&HUGE_DIMS);
                table_len = d.below(3) as usize;
                per_id_len = d.below(3) as usize;
            }
            _ => {}
        }
        // The planted ids come early, so short inputs have them too.
        let planted = [0, 0, 0, 1, 1, 2, 3, MAX_PLANTS][d.below(8) as usize];
        let plants = (0..planted)
            .map(|_| (Position::decode(d), Special::decode(d)))
            .collect();
        let pattern = Pattern::decode(d);
        let fills = |values| match values {
            Values::NoNan => &FILLS_NO_NAN[..],
            Values::AnyBits => &FILLS_ANY[..],
        };
        let table_fill = d.pick(fills(T::TABLE));
        let per_id_fill = d.pick(fills(T::PER_ID));
        let scale = if d.below(4) == 3 {
            f32::from_bits(d.u32())
        } else {
            d.pick(&SCALES)
        };
        let seed = d.u64();
        Header {
            id_type,
            threads,
            call,
            rows,
            dim,
            n,
            table_len,
            per_id_len,
            table_fill,
            per_id_fill,
            scale,
            seed,
            pattern,
            plants,
        }
    }
}

/// One call, decoded from the fuzzer's bytes.
#[derive(Debug)]
pub struct Case<I> {
    /// The row count the shape was drawn for (a shape fault may make the
    /// table disagree with it).
    pub rows: usize,
    /// `embedding_dim`.
    pub dim: usize,
    /// The ids.
    pub ids: Vec<I>,
    /// The `rows × dim` operand: `table` of a forward call, the starting
    /// `grad_table` of a backward one.
    pub table: Vec<f32>,
    /// The `ids × dim` operand: the pre-filled `out` of a forward call,
    /// `grad_output` of a backward one.
    pub per_id: Vec<f32>,
    /// The scale of `gather_scaled`.
    pub scale: f32,
    /// The call under test.
    pub call: Call,
    /// The size of the pool the call runs in.
    pub threads: usize,
}

impl<I: Id> Case<I> {
    fn build(h: &Header) -> Case<I> {
        let mut rng = SplitMix64(h.seed);
        let rows = h.rows;
        let mut ids: Vec<I> = (0..h.n)
            .map(|i| {
                let row = match &h.pattern {
                    Pattern::Uniform => valid(rng.next_u64(), rows),
                    Pattern::Hot(share) => {
                        if rng.below(16) < u64::from(*share) {
                            valid(h.seed, rows)
                        } else {
                            valid(rng.next_u64(), rows)
                        }
                    }
                    Pattern::Few(k) => valid(rng.next_u64(), rows.min(usize::from(*k) + 1)),
                    Pattern::Ascending => valid(i as u64, rows),
                    Pattern::Listed(list) => return list[i % list.len()].id(rows),
                };
                I::wrap(row as i128)
            })
            .collect();
        if !ids.is_empty() {
            for &(position, special) in &h.plants {
                let at = position.at(ids.len());
                ids[at] = special.id(rows);
            }
        }
        Case {
            rows,
            dim: h.dim,
            ids,
            table: rng.floats(h.table_len, h.table_fill),
            per_id: rng.floats(h.per_id_len, h.per_id_fill),
            scale: h.scale,
            call: h.call,
            threads: h.threads,
        }
    }

    /// A one-line summary for failure messages (the ids and floats can be
    /// thousands long; rerun the artifact to see them).
    pub fn summary(&self) -> String {
        format!(
            "{:?} on {} thread(s): {} ids of type {}, rows {}, dim {}, table len {}, per-id len {}, scale {:?} ({:#010x}); first ids {:?}",
            self.call,
            self.threads,
            self.ids.len(),
            I::NAME,
            self.rows,
            self.dim,
            self.table.len(),
            self.per_id.len(),
            self.scale,
            self.scale.to_bits(),
            &self.ids[..self.ids.len().min(8)],
        )
    }

    /// Runs the call and the reference on two copies of the operand `T`
    /// writes and asserts that they agree: the same `Ok` or the same error,
    /// the same bits in every element (as far as [`Target::AGREEMENT`]
    /// asks), and on an error both buffers exactly as they started. Then
    /// runs the target's own [`Target::check_output`] on a success.
    ///
    /// # Panics
    /// On any disagreement, with a summary of the case: that is the finding.
    fn check<T: Target>(&self) {
        let start = match T::WRITES {
            Writes::PerId => &self.per_id,
            Writes::Table => &self.table,
        };
        let mut got = start.clone();
        let got_result = T::call(self, self.call, &mut got);
        let mut want = start.clone();
        let want_result = T::call(self, Call::Reference, &mut want);
        assert_eq!(
            got_result,
            want_result,
            "the call and the reference disagree on the result\n{}",
            self.summary()
        );
        let canonical = match T::AGREEMENT {
            Agreement::Exact => |bits| bits,
            Agreement::UpToQuieting => quieted,
        };
        compare("the call", &got, "the reference", &want, canonical, self);
        if got_result.is_err() {
            assert_same_bits("the call, after an error,", &got, "the start", start, self);
            assert_same_bits(
                "the reference, after an error,",
                &want,
                "the start",
                start,
                self,
            );
        } else {
            T::check_output(self, &got);
        }
    }
}

/// How closely the call under test must match the reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Agreement {
    /// Every bit of every element.
    Exact,
    /// Every bit once signalling NaNs are made quiet on both sides. The
    /// one-hot reference computes `-0.0 + 1.0 × x`, and arithmetic may
    /// quiet a signalling NaN (x86-64 does), so the reference cannot return
    /// one. A target that feeds them checks the call against a plain bit
    /// copy as well, exactly ([`Target::check_output`]).
    UpToQuieting,
}

/// `bits` with a signalling NaN made quiet (its top mantissa bit set).
fn quieted(bits: u32) -> u32 {
    let nan = bits & 0x7f80_0000 == 0x7f80_0000 && bits & 0x007f_ffff != 0;
    if nan { bits | 0x0040_0000 } else { bits }
}

/// Asserts that two buffers hold the same bits, naming the first difference.
///
/// # Panics
/// If they differ in length or in any element's bits.
pub fn assert_same_bits<I: Id>(
    what: &str,
    got: &[f32],
    against: &str,
    want: &[f32],
    case: &Case<I>,
) {
    compare(what, got, against, want, |bits| bits, case);
}

/// [`assert_bits_as`] for a [`Case`]'s buffers of rows of `case.dim`.
fn compare<I: Id>(
    what: &str,
    got: &[f32],
    against: &str,
    want: &[f32],
    canonical: fn(u32) -> u32,
    case: &Case<I>,
) {
    assert_bits_as(what, got, against, want, canonical, case.dim, || {
        case.summary()
    });
}

/// Asserts that two buffers of rows of `dim` have the same length and the
/// same `canonical(bits)` in every element, naming the first difference by
/// element, row and column, then the case (`summary()`).
///
/// # Panics
/// If they differ in length or in any element's `canonical` bits.
pub fn assert_bits_as(
    what: &str,
    got: &[f32],
    against: &str,
    want: &[f32],
    canonical: fn(u32) -> u32,
    dim: usize,
    summary: impl Fn() -> String,
) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what} and {against} differ in length\n{}",
        summary()
    );
    // The common case first: every bit the same, one `memcmp`.
    if bytemuck::cast_slice::<f32, u32>(got) == bytemuck::cast_slice::<f32, u32>(want) {
        return;
    }
    let differs = |i: usize| canonical(got[i].to_bits()) != canonical(want[i].to_bits());
    if let Some(i) = (0..got.len()).find(|&i| differs(i)) {
        let dim = dim.max(1);
        panic!(
            "{what} and {against} differ at element {i} (row {}, column {}): {:?} ({:#010x}) vs {:?} ({:#010x})\n{}",
            i / dim,
            i % dim,
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits(),
            summary()
        );
    }
}

/// Where a bag case's `padding_idx` points; each target decodes its own.
#[derive(Clone, Copy, Debug)]
pub enum Padding {
    None,
    /// The row of the id at this position (modulo the ids), if it is one.
    IdAt(u8),
    /// The last row.
    Last,
    /// The row count (`false`) or `usize::MAX`: out of range.
    Bad(bool),
}

impl Padding {
    /// The `padding_idx` this is for a table of `rows` rows and these ids.
    pub fn row<I: Id>(self, rows: usize, ids: &[I]) -> Option<usize> {
        match self {
            Padding::None => None,
            Padding::IdAt(k) if !ids.is_empty() => {
                let id = ids[usize::from(k) % ids.len()].to_i128();
                (0..rows as i128).contains(&id).then_some(id as usize)
            }
            Padding::IdAt(_) => None,
            Padding::Last => Some(rows.saturating_sub(1)),
            Padding::Bad(false) => Some(rows),
            Padding::Bad(true) => Some(usize::MAX),
        }
    }
}

/// Which operand a call writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writes {
    /// The `ids × dim` one: a forward call's `out`.
    PerId,
    /// The `rows × dim` one: scatter-add's `grad_table`, accumulated into.
    Table,
}

/// One operation under test.
pub trait Target {
    /// The values its `rows × dim` operand may hold.
    const TABLE: Values;
    /// The values its `ids × dim` operand may hold.
    const PER_ID: Values;
    /// The operand its calls write.
    const WRITES: Writes;
    /// How closely the call under test must match the reference.
    const AGREEMENT: Agreement;

    /// Runs `call` on `case`, writing `buf`, a copy of the operand
    /// [`Self::WRITES`] names.
    ///
    /// # Errors
    /// Whatever the call returns.
    fn call<I: Id>(case: &Case<I>, call: Call, buf: &mut [f32]) -> Result<(), EmbeddingError>;

    /// Checks of the target's own on the output of a successful call.
    fn check_output<I: Id>(_case: &Case<I>, _out: &[f32]) {}
}

/// The pool of `threads` threads (1 to [`MAX_THREADS`]), built once per
/// process: local pools, never the global one, so what a kernel sees is
/// `threads`.
///
/// # Panics
/// If `threads` is 0 or more than [`MAX_THREADS`].
pub fn pool(threads: usize) -> &'static ThreadPool {
    static POOLS: OnceLock<Vec<ThreadPool>> = OnceLock::new();
    let pools = POOLS.get_or_init(|| {
        (1..=MAX_THREADS)
            .map(|k| {
                ThreadPoolBuilder::new()
                    .num_threads(k)
                    .thread_name(move |i| format!("fuzz-pool{k}-{i}"))
                    .build()
                    .expect("cannot build a rayon pool")
            })
            .collect()
    });
    &pools[threads - 1]
}

/// Decodes a case from `data` and checks it with `T` in its pool.
pub fn run<T: Target>(data: &[u8]) {
    let mut d = Decoder(Unstructured::new(data));
    let header = Header::decode::<T>(&mut d);
    match header.id_type {
        0 => run_typed::<T, u32>(&header),
        1 => run_typed::<T, i32>(&header),
        2 => run_typed::<T, u64>(&header),
        3 => run_typed::<T, i64>(&header),
        _ => run_typed::<T, usize>(&header),
    }
}

fn run_typed<T: Target, I: Id>(header: &Header) {
    let case = Case::<I>::build(header);
    pool(case.threads).install(|| case.check::<T>());
}

/// A byte reader for the layer targets' headers and call lists: every read
/// past the end of the input is 0, so a short input is a valid case.
pub struct Bytes<'a>(pub Unstructured<'a>);

impl<'a> Bytes<'a> {
    /// A reader over `data`.
    pub fn new(data: &'a [u8]) -> Bytes<'a> {
        Bytes(Unstructured::new(data))
    }

    /// The next byte.
    pub fn byte(&mut self) -> u8 {
        self.0.arbitrary().unwrap_or(0)
    }

    /// The next 8 bytes.
    pub fn u64(&mut self) -> u64 {
        self.0.arbitrary().unwrap_or(0)
    }

    /// A number below `n` (which must be at least 1).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.int_in_range(0..=n - 1).unwrap_or(0)
    }

    /// One bit.
    pub fn flag(&mut self) -> bool {
        self.below(2) == 1
    }

    /// One of `from` (which must not be empty).
    pub fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len() as u64) as usize]
    }

    /// Whether the input is used up.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// `bits` with every NaN replaced by one quiet NaN, for comparing a crate
/// result with an oracle's. Which NaN an operation returns when two NaNs
/// meet is not fixed by Rust (LLVM commutes an `fadd`, and x86 returns its
/// first operand's NaN), so an oracle can only promise "a NaN" there; results
/// of the same code on different thread counts are still compared bit for
/// bit.
pub fn nan_blind(bits: &[u32]) -> Vec<u32> {
    bits.iter().map(|&b| one_nan(b)).collect()
}

/// `bits`, or one quiet NaN if `bits` is any NaN: [`nan_blind`] for one value
/// (a `canonical` for [`assert_bits_as`]).
pub fn one_nan(bits: u32) -> u32 {
    if f32::from_bits(bits).is_nan() {
        0x7fc0_0000
    } else {
        bits
    }
}
