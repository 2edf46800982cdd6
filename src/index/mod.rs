//! Ids of every integer type a caller holds, and the one-pass check that
//! makes them safe to use.
//!
//! PyTorch hands out `int64` ids (and accepts `int32`); Rust code tends to
//! hold `u32` or `usize`. [`Index`] covers all five. The kernels, though,
//! see only two: an id is read as the unsigned integer of its width (its
//! [row type](RowId), `u32` or `u64`), bits unchanged, so `i32` ids are read
//! as `u32` and `i64` and `usize` ids as `u64`, and each kernel is compiled
//! twice rather than five times. A negative id read that way is 2^31 or more
//! (2^63 for 64 bits), so the check bounds a signed type's ids by
//! `min(num_embeddings, 2^31)` (or 2^63), which no valid id of that type
//! reaches anyway: one unsigned comparison per id, `id < bound`, rejects
//! both the negative and the too-large ids, whatever `num_embeddings` is
//! (even past 2^63, a table no machine holds but a number a kernel may be
//! given). An error still reports the id as the caller wrote it (-1 stays
//! -1), from its bits and whether its type was signed.
//!
//! The comparison has no branch per id, and the scan is compiled like the
//! kernels, for the widest instruction set the CPU has, where the compiler
//! turns it into SIMD compares (the baseline x86-64 target has no 64-bit
//! compare).

use crate::error::EmbeddingError;
use crate::parallel::Parallelism;
use crate::simd::{Body, Isa, Lanes};

pub(crate) use sealed::{ByRow, RowId};

mod sealed {
    /// What the crate needs of an id type and keeps to itself.
    pub trait Sealed: Sized {
        /// The unsigned type of the same width, as which the kernels read
        /// ids of this type (the same bits).
        type Row: RowId;

        /// Whether the type is signed: its negative values read as
        /// [`Row`](Self::Row) are those from 2^(bits - 1) on.
        const SIGNED: bool;

        /// `ids` read as their row type (the same memory).
        fn as_rows(ids: &[Self]) -> &[Self::Row];
    }

    /// The two types the kernels read ids as, `u32` and `u64`.
    pub trait RowId: super::Index + bytemuck::Pod + Ord {
        /// The width in bits.
        const BITS: u32;

        /// `bound` as this type, or `None` when it is past the type's
        /// largest value (then every value is below it).
        fn narrow(bound: u64) -> Option<Self>;

        /// The id of this value's bits in its caller's type: a signed one
        /// (sign-extended) or an unsigned one.
        fn value(self, signed: bool) -> i128;

        /// The row of an id already checked to be one.
        fn checked_row(self) -> usize;

        /// `ids` as what they are, `u32`s or `u64`s.
        fn by_row(ids: &[Self]) -> ByRow<&[u32], &[u64]>;
    }

    /// A value made for one of the two row types, `A` for `u32` and `B`
    /// for `u64`: ids of either type as one type. The crate's kernel entry
    /// points take their ids so, and are not generic: each kernel is
    /// compiled in this crate, for both row types, rather than again in
    /// every crate that calls it (`each_row_type!` runs a body on either;
    /// docs/design.md, "The shape of a kernel", item 5). Declared here
    /// because [`RowId::by_row`], a method of a public trait, returns one.
    #[derive(Clone, Copy, Debug)]
    pub enum ByRow<A, B> {
        U32(A),
        U64(B),
    }
}

/// Checked ids of either row type: what the kernels' entry points take.
pub(crate) type AnyValidIds<'a> = ByRow<ValidIds<'a, u32>, ValidIds<'a, u64>>;

impl<A, B> ByRow<A, B> {
    /// `u32s` applied to a `U32`, `u64s` to a `U64` (two closures, since
    /// one closure cannot take both types; a variant's constructor, such as
    /// `CallIds::Checked`, serves as both).
    #[inline]
    pub(crate) fn map<C, D>(
        self,
        u32s: impl FnOnce(A) -> C,
        u64s: impl FnOnce(B) -> D,
    ) -> ByRow<C, D> {
        match self {
            ByRow::U32(a) => ByRow::U32(u32s(a)),
            ByRow::U64(b) => ByRow::U64(u64s(b)),
        }
    }
}

/// `$body` with `$x` bound to the value of the [`ByRow`] `$value`, whichever
/// row type it was made for: the body is pasted into both arms of a
/// `match`, so it is compiled for both, and a `?` or `return` in it acts on
/// the enclosing function.
macro_rules! each_row_type {
    ($value:expr, |$x:ident| $body:expr) => {
        match $value {
            $crate::index::ByRow::U32($x) => $body,
            $crate::index::ByRow::U64($x) => $body,
        }
    };
}
pub(crate) use each_row_type;

/// An integer type usable as an embedding id: `u32`, `i32`, `u64`, `i64` or
/// `usize`.
///
/// The trait is sealed. [`key`](Index::key) and
/// [`to_i128`](Index::to_i128) are for callers (and the crate's reference
/// loops); the kernels read ids through the crate's own row types.
pub trait Index: Copy + Send + Sync + core::fmt::Debug + sealed::Sealed + 'static {
    /// The id as a `u64` key: the value itself when it is not negative, and
    /// `u64::MAX` (out of range for every table) when it is.
    fn key(self) -> u64;

    /// The id as a signed value, for error messages (-1 stays -1, and
    /// `u64::MAX` stays 18446744073709551615).
    fn to_i128(self) -> i128;
}

macro_rules! impl_index {
    ($($t:ty => $row:ty, $signed:literal;)*) => {$(
        impl sealed::Sealed for $t {
            type Row = $row;
            const SIGNED: bool = $signed;

            #[inline(always)]
            fn as_rows(ids: &[$t]) -> &[$row] {
                // The same size and alignment, checked when compiled.
                bytemuck::must_cast_slice(ids)
            }
        }
        impl Index for $t {
            #[inline(always)]
            fn key(self) -> u64 {
                if self as i128 >= 0 {
                    self as u64
                } else {
                    u64::MAX
                }
            }
            #[inline(always)]
            fn to_i128(self) -> i128 {
                self as i128
            }
        }
    )*};
}

macro_rules! impl_row_id {
    ($($t:ty => $signed:ty, $variant:ident;)*) => {$(
        impl sealed::RowId for $t {
            const BITS: u32 = <$t>::BITS;

            #[inline(always)]
            fn narrow(bound: u64) -> Option<$t> {
                <$t>::try_from(bound).ok()
            }
            #[inline(always)]
            fn value(self, signed: bool) -> i128 {
                if signed {
                    self as $signed as i128
                } else {
                    self as i128
                }
            }
            #[inline(always)]
            fn checked_row(self) -> usize {
                self as usize
            }
            #[inline(always)]
            fn by_row(ids: &[$t]) -> ByRow<&[u32], &[u64]> {
                ByRow::$variant(ids)
            }
        }
    )*};
}

/// The row type `usize` ids are read as: the unsigned type of its size.
#[cfg(target_pointer_width = "64")]
type UsizeRow = u64;
#[cfg(target_pointer_width = "32")]
type UsizeRow = u32;
#[cfg(not(any(target_pointer_width = "32", target_pointer_width = "64")))]
compile_error!(
    "embedding-kernels supports 32- and 64-bit targets only (usize ids are read as u32 or u64)"
);

impl_index! {
    u32 => u32, false;
    i32 => u32, true;
    u64 => u64, false;
    i64 => u64, true;
    usize => UsizeRow, false;
}
impl_row_id! {
    u32 => i32, U32;
    u64 => i64, U64;
}

/// A caller's ids as the kernels read them, not checked yet: their bits as
/// the row type `R`, and whether their type was signed (which the check
/// and its error need).
#[derive(Clone, Copy, Debug)]
pub(crate) struct UncheckedIds<'a, R: RowId> {
    ids: &'a [R],
    signed: bool,
}

impl<'a, R: RowId> UncheckedIds<'a, R> {
    /// `ids`, read as their row type.
    #[inline]
    pub(crate) fn of<I: Index<Row = R>>(ids: &'a [I]) -> Self {
        UncheckedIds {
            ids: I::as_rows(ids),
            signed: I::SIGNED,
        }
    }

    /// How many ids there are.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// These ids as their row type, as one type ([`ByRow`]).
    #[inline]
    pub(crate) fn by_row(self) -> ByRow<UncheckedIds<'a, u32>, UncheckedIds<'a, u64>> {
        let signed = self.signed;
        R::by_row(self.ids).map(
            |ids| UncheckedIds { ids, signed },
            |ids| UncheckedIds { ids, signed },
        )
    }

    /// The least value that is not a row of a table of `num_embeddings`
    /// rows, or `None` when every value of `R` is one: `num_embeddings`, or
    /// for a signed type at most 2^(bits - 1), where its negative values
    /// start.
    #[inline]
    fn bound(&self, num_embeddings: usize) -> Option<R> {
        let rows = num_embeddings as u64;
        let bound = if self.signed {
            rows.min(1 << (R::BITS - 1))
        } else {
            rows
        };
        R::narrow(bound)
    }

    /// Checks every id against `num_embeddings`, first to last, the scan
    /// split across the rayon pool when `par` would hand a call of the ids'
    /// bytes to it (under `Auto`, from [`CHECK_PARALLEL_MIN_BYTES`] of ids):
    /// a call with that many ids is usually split next (its output or rows
    /// read reach the kernels' threshold), and a serial scan would keep the
    /// other threads waiting.
    ///
    /// # Errors
    /// [`EmbeddingError::IndexOutOfRange`] for the first id that is negative
    /// or not below `num_embeddings`, with its position and its value in the
    /// caller's type.
    pub(crate) fn check(
        self,
        par: Parallelism,
        num_embeddings: usize,
    ) -> Result<ValidIds<'a, R>, EmbeddingError> {
        if let Some(bound) = self.bound(num_embeddings)
            && let Some(block_no) = first_bad_block(par, self.ids, bound)
        {
            // The first bad id from that block on (in it, since the
            // scan found one there).
            let start = block_no * CHECK_BLOCK;
            let rest = self.ids.get(start..).unwrap_or_default();
            if let Some(offset) = rest.iter().position(|&id| id >= bound) {
                return Err(EmbeddingError::IndexOutOfRange {
                    position: start + offset,
                    index: rest[offset].value(self.signed),
                    num_embeddings,
                });
            }
        }
        Ok(ValidIds::whole(self.ids, num_embeddings))
    }
}

/// Ids that have been checked against a row count: every one of them is a
/// valid row. Only [`UncheckedIds::check`] (and [`ValidIds::new_with`],
/// [`ValidIds::new`], which call it) and [`IdsWindow::check`] make one from
/// unchecked ids, so a kernel that takes
/// this type cannot be handed an unchecked id.
///
/// Id `k` is `ids[k << shift]`, and `ids` holds `len << shift` values:
/// `shift` is 0 but for `u64` ids narrowed to `u32`s ([`ValidIds::by_row`]),
/// each id's two halves, its row in the first.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ValidIds<'a, R: RowId> {
    ids: &'a [R],
    shift: u32,
    num_embeddings: usize,
}

/// Some of a call's ids, checked, under the positions they have among all
/// of them: what one task of a bag forward reads when the tasks check
/// their own ids ([`IdsWindow::check`]), or all of a call's checked ids
/// ([`IdsWindow::all`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct IdsWindow<'a, R: RowId> {
    /// Position `base + k` of the call's ids is `ids`' `k`.
    ids: ValidIds<'a, R>,
    base: usize,
}

/// How many ids the vectorised scan checks before it looks for an early exit.
const CHECK_BLOCK: usize = 1024;

/// From this many bytes of ids on, `Auto` splits the check of the ids (the
/// first thing a call does) across the pool: a call with that many ids is
/// split next anyway, and the other threads would wait out a serial scan
/// (measured on narrow's bag sum: docs/design.md, "The shape of a
/// kernel").
const CHECK_PARALLEL_MIN_BYTES: usize = 1 << 20;

/// How many blocks of [`CHECK_BLOCK`] ids a task of a split scan checks
/// (512 KiB of `i64`s).
const CHECK_TASK_BLOCKS: usize = 64;

/// Whether the check of `ids` ([`UncheckedIds::check`], [`ValidIds::new_with`]) is
/// split across the pool under `par`.
pub(crate) fn check_splits<T>(par: Parallelism, ids: &[T]) -> bool {
    par.plan(core::mem::size_of_val(ids), CHECK_PARALLEL_MIN_BYTES)
        .is_pool()
        && ids.len() > CHECK_TASK_BLOCKS * CHECK_BLOCK
}

/// The number of the first block of [`CHECK_BLOCK`] ids that holds an id
/// of `bound` or more, by one scan or, when [`check_splits`], by tasks of
/// [`CHECK_TASK_BLOCKS`] blocks on the pool (the least of their first bad
/// blocks: the same answer).
fn first_bad_block<R: RowId>(par: Parallelism, ids: &[R], bound: R) -> Option<usize> {
    let isa = Isa::detect();
    if !check_splits(par, ids) {
        return isa.run(FirstBadBlock { ids, bound });
    }
    let tasks = ids.chunks(CHECK_TASK_BLOCKS * CHECK_BLOCK).collect();
    crate::executor::map_parts(tasks, |task, ids| {
        let block = isa.run(FirstBadBlock { ids, bound })?;
        Some(task * CHECK_TASK_BLOCKS + block)
    })
    .into_iter()
    .flatten()
    .min()
}

/// The scan of [`UncheckedIds::check`]: the number of the first block of
/// [`CHECK_BLOCK`] ids that holds an id of `bound` or more. Compiled for
/// the widest instruction set, like the kernels: the baseline x86-64
/// target has no 64-bit compare, so there the scan of 64-bit ids is scalar,
/// and it held a large share of a narrow bag sum's time (docs/design.md,
/// "The shape of a kernel").
struct FirstBadBlock<'a, R> {
    ids: &'a [R],
    bound: R,
}

impl<R: RowId> Body for FirstBadBlock<'_, R> {
    type Output = Option<usize>;

    #[inline(always)]
    fn run<V: Lanes>(self) -> Option<usize> {
        let bound = self.bound;
        // A fold with `|` rather than `any`: no early exit inside a block,
        // so the compiler turns it into SIMD compares.
        self.ids
            .chunks(CHECK_BLOCK)
            .position(|block| block.iter().fold(false, |acc, &id| acc | (id >= bound)))
    }
}

impl<'a, R: RowId> ValidIds<'a, R> {
    /// Checks every id of `ids` against `num_embeddings`, first to last, on
    /// this thread.
    ///
    /// # Errors
    /// As [`UncheckedIds::check`].
    pub(crate) fn new<I: Index<Row = R>>(
        ids: &'a [I],
        num_embeddings: usize,
    ) -> Result<Self, EmbeddingError> {
        UncheckedIds::of(ids).check(Parallelism::Serial, num_embeddings)
    }

    /// [`new`](Self::new), the scan split across the pool as
    /// [`UncheckedIds::check`] says.
    ///
    /// # Errors
    /// As [`UncheckedIds::check`].
    #[inline]
    pub(crate) fn new_with<I: Index<Row = R>>(
        par: Parallelism,
        ids: &'a [I],
        num_embeddings: usize,
    ) -> Result<Self, EmbeddingError> {
        UncheckedIds::of(ids).check(par, num_embeddings)
    }

    /// `ids`, each one checked against `num_embeddings`.
    #[inline]
    fn whole(ids: &'a [R], num_embeddings: usize) -> Self {
        ValidIds {
            ids,
            shift: 0,
            num_embeddings,
        }
    }

    /// How many ids there are.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.ids.len() >> self.shift
    }

    /// These ids as the row type the kernels read, as one type ([`ByRow`]):
    /// `u32`s as they are, and `u64`s as `u32`s where the table has at most
    /// 2^32 rows (every id then fits the low half of its `u64`, which the
    /// kernels read, every other `u32` of the ids' memory), so that every
    /// kernel but those of larger tables runs on `u32` ids (see
    /// [`run_rows`]).
    #[inline]
    pub(crate) fn by_row(self) -> AnyValidIds<'a> {
        let (shift, num_embeddings) = (self.shift, self.num_embeddings);
        match R::by_row(self.ids) {
            ByRow::U32(ids) => ByRow::U32(ValidIds {
                ids,
                shift,
                num_embeddings,
            }),
            ByRow::U64(ids) => match narrow(ids, num_embeddings) {
                Some(ids) => ByRow::U32(ValidIds {
                    ids,
                    shift: shift + 1,
                    num_embeddings,
                }),
                None => ByRow::U64(ValidIds {
                    ids,
                    shift,
                    num_embeddings,
                }),
            },
        }
    }

    /// Whether there are no ids.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The row count the ids were checked against.
    #[inline]
    pub(crate) fn num_embeddings(&self) -> usize {
        self.num_embeddings
    }

    /// The row of id number `position`.
    ///
    /// # Panics
    /// If `position >= self.len()`, like slice indexing.
    #[inline(always)]
    pub(crate) fn row(&self, position: usize) -> usize {
        // Every id was checked to lie in `0..num_embeddings`, so its plain
        // conversion (of its low half, narrowed) is its row. A position of
        // `len` or more lies past `ids` (its `len << shift` values), unless
        // the shift wraps it round, which only a position past any slice
        // can.
        self.ids[position << self.shift].checked_row()
    }

    /// The ids themselves, where they are not narrowed.
    #[cfg(test)]
    pub(crate) fn as_slice(&self) -> &'a [R] {
        assert_eq!(self.shift, 0, "narrowed ids");
        self.ids
    }

    /// The rows of all ids, in order.
    #[inline]
    pub(crate) fn rows(&self) -> Rows<'a, R> {
        Rows::new(self.ids, self.shift)
    }

    /// The rows of these ids beside those of `other`, as many: `(k, row k
    /// here, row k there)`, for a loop over a bag's rows and the rows
    /// hinted ahead of them. One count for both, where two zipped
    /// iterators would test each.
    ///
    /// # Panics
    /// If `other` holds another number of ids.
    #[inline]
    pub(crate) fn rows_beside(&self, other: &ValidIds<'a, R>) -> RowPairs<'a, R> {
        assert_eq!(self.len(), other.len(), "ids beside ids");
        RowPairs {
            here: self.rows(),
            there: other.rows(),
            k: 0,
        }
    }

    /// The ids of `range`, still checked.
    ///
    /// # Panics
    /// If `range` does not lie in `0..self.len()`, like slice indexing.
    #[inline]
    pub(crate) fn slice(&self, range: core::ops::Range<usize>) -> ValidIds<'a, R> {
        let shift = self.shift;
        ValidIds {
            ids: &self.ids[range.start << shift..range.end << shift],
            shift,
            num_embeddings: self.num_embeddings,
        }
    }
}

/// The rows of checked ids ([`ValidIds::rows`]): every `1 << shift`-th
/// value of their slice, a pointer stepped along it. The kernels' loops over
/// a bag's rows read two ids a row (the row and the one hinted ahead); an
/// iterator with a test of its own a step (`step_by`, or an index checked
/// against the slice) made the bags of narrow rows measurably slower than a
/// slice iterator (docs/design.md, "The shape of a kernel"), which this one
/// matches: one count and one add a step.
pub(crate) struct Rows<'a, R> {
    /// The next id's value.
    next: *const R,
    /// Values from one id to the next.
    step: usize,
    /// Ids left.
    left: usize,
    ids: core::marker::PhantomData<&'a [R]>,
}

impl<'a, R: RowId> Rows<'a, R> {
    /// The ids at `0, 1 << shift, 2 << shift, …` of `ids`, as many as
    /// start in it.
    #[inline]
    fn new(ids: &'a [R], shift: u32) -> Self {
        Rows {
            next: ids.as_ptr(),
            step: 1 << shift,
            // The ids that start in the slice, `len.div_ceil(step)` by a
            // shift: a division by a step known only at run time would
            // cost a divide a call (one of the slowest integer
            // instructions, for each bag).
            left: (ids.len() + (1 << shift) - 1) >> shift,
            ids: core::marker::PhantomData,
        }
    }
}

impl<R: RowId> Iterator for Rows<'_, R> {
    type Item = usize;

    #[inline(always)]
    fn next(&mut self) -> Option<usize> {
        (self.left > 0).then(|| self.take_row())
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl<R: RowId> ExactSizeIterator for Rows<'_, R> {}

impl<R: RowId> Rows<'_, R> {
    /// The next row, for a caller that knows one is left.
    #[inline(always)]
    fn take_row(&mut self) -> usize {
        debug_assert!(self.left > 0, "a row past the ids");
        // SAFETY: the slice `Rows::new` was made from (borrowed for `'a`,
        // so still alive and unchanged) holds a value at `k · step` for
        // every `k` below the starting `left` (`len.div_ceil(step)`, so
        // `k · step < len`); each call reads the value at `next`, then
        // moves `next` one step on and counts it off, so with `left` ids
        // left, `next` is the position of the `(start - left)`-th. Every
        // caller saw `left > 0`: `next`, and `RowPairs::next`, whose two
        // `Rows` count the same ids.
        #[allow(unsafe_code)]
        let id = unsafe { *self.next };
        self.next = self.next.wrapping_add(self.step);
        self.left -= 1;
        id.checked_row()
    }
}

/// The rows of two runs of as many ids, side by side
/// ([`ValidIds::rows_beside`]).
pub(crate) struct RowPairs<'a, R> {
    here: Rows<'a, R>,
    there: Rows<'a, R>,
    k: usize,
}

impl<R: RowId> Iterator for RowPairs<'_, R> {
    type Item = (usize, usize, usize);

    #[inline(always)]
    fn next(&mut self) -> Option<(usize, usize, usize)> {
        if self.here.left == 0 {
            return None;
        }
        // `rows_beside` made both of as many ids, and each step takes one
        // of each: `there` has one left too.
        let k = self.k;
        self.k += 1;
        Some((k, self.here.take_row(), self.there.take_row()))
    }
}

/// Checked `u64` ids as the `u32` halves of their memory where a table of
/// `num_embeddings` rows has at most 2^32 of them: each id's row is its low
/// half (its high half is zero), the first of its two on a little-endian
/// target. A big-endian target keeps its `u64`s.
#[inline]
fn narrow(ids: &[u64], num_embeddings: usize) -> Option<&[u32]> {
    (cfg!(target_endian = "little") && num_embeddings as u64 <= 1 << 32)
        .then(|| bytemuck::cast_slice(ids))
}

/// Runs `body`, which reads ids of type `R`, on `isa`: on `u32` ids with
/// the instruction set's lanes, on `u64` ids (a table of more than 2^32
/// rows, whose ids [`ValidIds::by_row`] cannot narrow) with the portable
/// lanes alone. Such a table is 16 GiB or more, so its rows come from
/// memory and a kernel on it waits on memory, whatever its lanes; and its
/// kernels are then compiled once, not for every instruction set.
#[inline(always)]
pub(crate) fn run_rows<R: RowId, B: Body>(isa: Isa, body: B) -> B::Output {
    if const { R::BITS == 64 } {
        Isa::run_portable(body)
    } else {
        isa.run(body)
    }
}

impl<'a, R: RowId> IdsWindow<'a, R> {
    /// The window as the row type the kernels read, as one type: its ids
    /// narrowed as [`ValidIds::by_row`] narrows them.
    #[inline]
    pub(crate) fn by_row(self) -> ByRow<IdsWindow<'a, u32>, IdsWindow<'a, u64>> {
        let base = self.base;
        self.ids
            .by_row()
            .map(|ids| IdsWindow { ids, base }, |ids| IdsWindow { ids, base })
    }

    /// All of a call's checked ids.
    #[inline]
    pub(crate) fn all(ids: ValidIds<'a, R>) -> Self {
        IdsWindow { ids, base: 0 }
    }

    /// The ids at `positions` of `ids`, checked against `num_embeddings` by
    /// one scan on this thread (the thread's widest instruction set), or
    /// `None` if one of them is not a row, or `positions` does not lie in
    /// `ids`.
    pub(crate) fn check(
        ids: UncheckedIds<'a, R>,
        positions: core::ops::Range<usize>,
        num_embeddings: usize,
    ) -> Option<Self> {
        let base = positions.start;
        let bound = ids.bound(num_embeddings);
        let ids = ids.ids.get(positions)?;
        let bad = bound.and_then(|bound| Isa::detect().run(FirstBadBlock { ids, bound }));
        match bad {
            Some(_) => None,
            None => Some(IdsWindow {
                ids: ValidIds::whole(ids, num_embeddings),
                base,
            }),
        }
    }

    /// The row of the id at `position` (of the call's ids).
    ///
    /// # Panics
    /// If `position` is not in the window, like slice indexing (a position
    /// before it wraps past every index).
    #[inline(always)]
    pub(crate) fn row(&self, position: usize) -> usize {
        self.ids.row(position.wrapping_sub(self.base))
    }

    /// The ids at positions `range` (of the call's ids), still checked, as
    /// ids of their own (positions from 0).
    ///
    /// # Panics
    /// If `range` does not lie in the window, like slice indexing.
    #[inline]
    pub(crate) fn slice(&self, range: core::ops::Range<usize>) -> ValidIds<'a, R> {
        let from = range.start.wrapping_sub(self.base);
        self.ids.slice(from..range.end.wrapping_sub(self.base))
    }
}

#[cfg(test)]
mod tests;
