//! Ids of every integer type a caller holds, and the one-pass check that
//! makes them safe to use.
//!
//! PyTorch hands out `int64` ids (and accepts `int32`); Rust code tends to
//! hold `u32` or `usize`. [`Index`] covers all five. Each id is mapped to a
//! `u64` *key*: an id that is not negative is its own key, and every negative
//! id becomes `u64::MAX`, which no row count (a `usize`) exceeds. So one
//! unsigned comparison, `key < num_embeddings`, rejects both the negative and
//! the too-large ids, whatever `num_embeddings` is (even past 2^63, a table
//! no machine holds but a number a kernel may be given). That comparison has
//! no branch per id, and the scan is compiled like the kernels, for the
//! widest instruction set the CPU has, where the compiler turns it into
//! 64-bit SIMD compares (the baseline x86-64 target has none).

use crate::error::EmbeddingError;
use crate::parallel::Parallelism;
use crate::simd::{Body, Isa, Lanes};

mod sealed {
    pub trait Sealed {
        /// The row of an id already checked to be in range: the plain
        /// conversion, without the mapping of negative values that
        /// [`Index::key`](super::Index::key) needs to reject them (one or two
        /// instructions fewer per id in the kernels' loops).
        fn checked_row(self) -> usize;
    }
}

/// An integer type usable as an embedding id: `u32`, `i32`, `u64`, `i64` or
/// `usize`.
///
/// The trait is sealed; its methods are what the kernels need and nothing
/// more.
pub trait Index: Copy + Send + Sync + core::fmt::Debug + sealed::Sealed + 'static {
    /// The id as a `u64` key: the value itself when it is not negative, and
    /// `u64::MAX` (out of range for every table) when it is.
    fn key(self) -> u64;

    /// The id as a signed value, for error messages (-1 stays -1, and
    /// `u64::MAX` stays 18446744073709551615).
    fn to_i128(self) -> i128;
}

macro_rules! impl_unsigned {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {
            #[inline(always)]
            fn checked_row(self) -> usize {
                self as usize
            }
        }
        impl Index for $t {
            #[inline(always)]
            fn key(self) -> u64 {
                self as u64
            }
            #[inline(always)]
            fn to_i128(self) -> i128 {
                self as i128
            }
        }
    )*};
}

macro_rules! impl_signed {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {
            #[inline(always)]
            fn checked_row(self) -> usize {
                self as usize
            }
        }
        impl Index for $t {
            #[inline(always)]
            fn key(self) -> u64 {
                // Sign-extend to 64 bits, then OR in the sign spread over all
                // 64 bits: a negative id becomes u64::MAX (not its two's
                // complement, which a table of 2^64 - 1 rows would accept),
                // and a positive one stays itself. No branch, so the scan
                // still vectorises.
                let wide = self as i64;
                (wide as u64) | ((wide >> 63) as u64)
            }
            #[inline(always)]
            fn to_i128(self) -> i128 {
                self as i128
            }
        }
    )*};
}

impl_unsigned!(u32, u64, usize);
impl_signed!(i32, i64);

/// Ids that have been checked against a row count: every one of them is a
/// valid row. Only [`ValidIds::new_with`] (and [`ValidIds::new`]) make one
/// from unchecked ids, so a kernel that takes this type cannot be handed an
/// unchecked id.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ValidIds<'a, I: Index> {
    ids: &'a [I],
    num_embeddings: usize,
}

/// Some of a call's ids, checked, under the positions they have among all
/// of them: what one task of a bag forward reads when the tasks check
/// their own ids ([`IdsWindow::check`]), or all of a call's checked ids
/// ([`IdsWindow::all`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct IdsWindow<'a, I: Index> {
    /// Position `base + k` of the call's ids is `ids`' `k`.
    ids: ValidIds<'a, I>,
    base: usize,
}

/// How many ids the vectorised scan checks before it looks for an early exit.
const CHECK_BLOCK: usize = 1024;

/// From this many bytes of ids on, `Auto` splits the check of the ids (the
/// first thing a call does) across the pool: a call with that many ids is
/// split next anyway, and the other threads would wait out a serial scan.
/// narrow's bag sum through `EmbeddingBag::forward` (262 144 `i64` ids, 2
/// MiB; that call now checks its ids in its tasks, as every bag forward
/// into a fresh output does), two threads, a test program alternating the
/// two builds four times (2026-11-24, medians of 2 s of calls): 294-351 µs
/// with the serial scan, 254-266 µs split.
const CHECK_PARALLEL_MIN_BYTES: usize = 1 << 20;

/// How many blocks of [`CHECK_BLOCK`] ids a task of a split scan checks
/// (512 KiB of `i64`s).
const CHECK_TASK_BLOCKS: usize = 64;

/// The number of the first block of [`CHECK_BLOCK`] ids that holds an id
/// whose key is `bound` or more, by one scan or, when
/// [`ValidIds::splits`], by tasks of [`CHECK_TASK_BLOCKS`] blocks on the
/// pool (the least of their first bad blocks: the same answer).
fn first_bad_block<I: Index>(par: Parallelism, ids: &[I], bound: u64) -> Option<usize> {
    let isa = Isa::detect();
    if !ValidIds::splits(par, ids) {
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

/// The scan of [`ValidIds::new`]: the number of the first block of
/// [`CHECK_BLOCK`] ids that holds an id whose key is `bound` or more.
/// Compiled for the widest instruction set, like the kernels: the baseline
/// x86-64 target has no 64-bit compare, so there the scan is scalar and costs
/// a third of a narrow bag sum.
struct FirstBadBlock<'a, I> {
    ids: &'a [I],
    bound: u64,
}

impl<I: Index> Body for FirstBadBlock<'_, I> {
    type Output = Option<usize>;

    #[inline(always)]
    fn run<V: Lanes>(self) -> Option<usize> {
        let bound = self.bound;
        // A fold with `|` rather than `any`: no early exit inside a block,
        // so the compiler turns it into SIMD compares.
        self.ids.chunks(CHECK_BLOCK).position(|block| {
            block
                .iter()
                .fold(false, |acc, &id| acc | (id.key() >= bound))
        })
    }
}

impl<'a, I: Index> ValidIds<'a, I> {
    /// Checks every id against `num_embeddings`, first to last.
    ///
    /// # Errors
    /// [`EmbeddingError::IndexOutOfRange`] for the first id that is negative
    /// or not below `num_embeddings`, with its position and value.
    pub(crate) fn new(ids: &'a [I], num_embeddings: usize) -> Result<Self, EmbeddingError> {
        Self::new_with(Parallelism::Serial, ids, num_embeddings)
    }

    /// [`new`](Self::new), the scan split across the rayon pool when `par`
    /// would hand a call of the ids' bytes to it (under `Auto`, from
    /// [`CHECK_PARALLEL_MIN_BYTES`] of ids): a call with that many ids is
    /// usually split next (its output or rows read reach the kernels'
    /// threshold), and a serial scan would keep the other threads waiting.
    pub(crate) fn new_with(
        par: Parallelism,
        ids: &'a [I],
        num_embeddings: usize,
    ) -> Result<Self, EmbeddingError> {
        let bound = num_embeddings as u64;
        if let Some(block_no) = first_bad_block(par, ids, bound) {
            // The first bad id from that block on (in it, since the scan
            // found one there).
            let start = block_no * CHECK_BLOCK;
            let rest = ids.get(start..).unwrap_or_default();
            if let Some(offset) = rest.iter().position(|&id| id.key() >= bound) {
                return Err(EmbeddingError::IndexOutOfRange {
                    position: start + offset,
                    index: rest[offset].to_i128(),
                    num_embeddings,
                });
            }
        }
        Ok(ValidIds {
            ids,
            num_embeddings,
        })
    }

    /// Whether [`new_with`](Self::new_with) splits the check of `ids`
    /// under `par`.
    pub(crate) fn splits(par: Parallelism, ids: &[I]) -> bool {
        par.plan(core::mem::size_of_val(ids), CHECK_PARALLEL_MIN_BYTES)
            .is_pool()
            && ids.len() > CHECK_TASK_BLOCKS * CHECK_BLOCK
    }

    /// How many ids there are.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
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
        // conversion is its row.
        sealed::Sealed::checked_row(self.ids[position])
    }

    /// The ids themselves.
    #[cfg(test)]
    pub(crate) fn as_slice(&self) -> &'a [I] {
        self.ids
    }

    /// The rows of all ids, in order.
    #[inline]
    pub(crate) fn rows(&self) -> impl ExactSizeIterator<Item = usize> + '_ {
        self.ids.iter().map(|&id| sealed::Sealed::checked_row(id))
    }

    /// The ids of `range`, still checked.
    #[inline]
    pub(crate) fn slice(&self, range: core::ops::Range<usize>) -> ValidIds<'a, I> {
        ValidIds {
            ids: &self.ids[range],
            num_embeddings: self.num_embeddings,
        }
    }
}

impl<'a, I: Index> IdsWindow<'a, I> {
    /// All of a call's checked ids.
    #[inline]
    pub(crate) fn all(ids: ValidIds<'a, I>) -> Self {
        IdsWindow { ids, base: 0 }
    }

    /// The ids at `positions` of `ids`, checked against `num_embeddings` by
    /// one scan on this thread (the thread's widest instruction set), or
    /// `None` if one of them is not a row, or `positions` does not lie in
    /// `ids`.
    pub(crate) fn check(
        ids: &'a [I],
        positions: core::ops::Range<usize>,
        num_embeddings: usize,
    ) -> Option<Self> {
        let base = positions.start;
        let ids = ids.get(positions)?;
        let bound = num_embeddings as u64;
        match Isa::detect().run(FirstBadBlock { ids, bound }) {
            Some(_) => None,
            None => Some(IdsWindow {
                ids: ValidIds {
                    ids,
                    num_embeddings,
                },
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
    pub(crate) fn slice(&self, range: core::ops::Range<usize>) -> ValidIds<'a, I> {
        let from = range.start.wrapping_sub(self.base);
        self.ids.slice(from..range.end.wrapping_sub(self.base))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_ids_map_above_every_row_count() {
        for key in [(-1i32).key(), i32::MIN.key(), (-1i64).key(), i64::MIN.key()] {
            assert_eq!(key, u64::MAX);
        }
        assert_eq!(7i32.key(), 7);
        assert_eq!(i32::MAX.key(), i32::MAX as u64);
        assert_eq!(i64::MAX.key(), i64::MAX as u64);
        assert_eq!(u64::MAX.key(), u64::MAX);
    }

    #[test]
    fn negative_ids_are_refused_by_the_largest_row_count() {
        let err = ValidIds::new(&[0i64, -2], usize::MAX).unwrap_err();
        assert_eq!(
            err,
            EmbeddingError::IndexOutOfRange {
                position: 1,
                index: -2,
                num_embeddings: usize::MAX
            }
        );
        assert!(ValidIds::new(&[i32::MIN], usize::MAX).is_err());
        // A large unsigned id is an id like any other.
        if usize::BITS == 64 {
            let big = 1u64 << 63;
            assert_eq!(
                ValidIds::new(&[big], usize::MAX).unwrap().row(0) as u64,
                big
            );
        }
    }

    #[test]
    fn first_bad_id_is_reported_even_past_a_block() {
        let mut ids = vec![3u32; 3 * CHECK_BLOCK];
        ids[CHECK_BLOCK + 5] = 10;
        ids[2 * CHECK_BLOCK] = 11;
        let err = ValidIds::new(&ids, 10).unwrap_err();
        assert_eq!(
            err,
            EmbeddingError::IndexOutOfRange {
                position: CHECK_BLOCK + 5,
                index: 10,
                num_embeddings: 10
            }
        );
    }

    #[test]
    fn a_split_scan_reports_the_first_bad_id_of_all_its_tasks() {
        let task = CHECK_TASK_BLOCKS * CHECK_BLOCK;
        let len = 3 * task + 77;
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build();
        let pool = pool.expect("a pool of two threads");
        // Each list of planted positions: the first must be reported,
        // whichever task holds it and whichever task finishes first.
        let plantings: [&[usize]; 7] = [
            &[0],
            &[task - 1, task],
            &[task, 2 * task + 3],
            &[2 * task + 5, task + 9],
            &[len - 1],
            &[task + CHECK_BLOCK - 1, len - 1, 0],
            &[],
        ];
        for par in [Parallelism::Auto, Parallelism::Rayon, Parallelism::Serial] {
            for planted in plantings {
                let mut ids = vec![5i64; len];
                for (k, &at) in planted.iter().enumerate() {
                    ids[at] = 100 + k as i64;
                }
                let want =
                    first_bad(&ids, 100).map(|(position, index)| EmbeddingError::IndexOutOfRange {
                        position,
                        index,
                        num_embeddings: 100,
                    });
                let got = pool.install(|| ValidIds::new_with(par, &ids, 100)).err();
                assert_eq!(got, want, "{par:?} {planted:?}");
                // The block itself, not only the error found from it (an
                // early block would still lead to the right id).
                let serial = first_bad_block(Parallelism::Serial, &ids, 100);
                let (split, block) = pool.install(|| {
                    let split = ValidIds::splits(par, &ids);
                    (split, first_bad_block(par, &ids, 100))
                });
                assert_eq!(block, serial, "{par:?} {planted:?}");
                assert_eq!(split, par != Parallelism::Serial, "{par:?}");
            }
        }
    }

    /// The first bad id of `ids` by a plain loop, as the scan must find it.
    fn first_bad<I: Index>(ids: &[I], rows: usize) -> Option<(usize, i128)> {
        let at = ids
            .iter()
            .position(|&id| id.to_i128() < 0 || id.to_i128() >= rows as i128)?;
        Some((at, ids[at].to_i128()))
    }

    /// Plants `bad` values at positions around the SIMD widths and the block
    /// edges, one or two at a time, and checks the scan of every instruction
    /// set reports the first of them.
    fn scan_finds_the_first_bad_id<I: Index>(good: I, bad: &[I], rows: usize) {
        let len = 2 * CHECK_BLOCK + 37;
        let spots = [
            0,
            1,
            3,
            4,
            7,
            8,
            15,
            31,
            CHECK_BLOCK - 1,
            CHECK_BLOCK,
            len - 1,
        ];
        for isa in Isa::all() {
            isa.force(|| {
                let ids = vec![good; len];
                assert!(ValidIds::new(&ids, rows).is_ok(), "{isa:?}");
                assert!(ValidIds::new(&ids[..0], 0).is_ok(), "{isa:?}");
                for &b in bad {
                    for &first in &spots {
                        for second in [None, Some(first + 1), Some(len - 1)] {
                            let mut ids = ids.clone();
                            ids[first] = b;
                            if let Some(s) = second.filter(|&s| s < len) {
                                ids[s] = b;
                            }
                            let want = first_bad(&ids, rows).map(|(position, index)| {
                                EmbeddingError::IndexOutOfRange {
                                    position,
                                    index,
                                    num_embeddings: rows,
                                }
                            });
                            let got = ValidIds::new(&ids, rows).err();
                            assert_eq!(got, want, "{isa:?} {b:?} at {first}");
                        }
                    }
                }
            });
        }
    }

    #[test]
    fn scan_finds_the_first_bad_id_of_every_type_on_every_isa() {
        let rows = 1000;
        scan_finds_the_first_bad_id(999u32, &[1000, 1001, u32::MAX], rows);
        scan_finds_the_first_bad_id(999i32, &[1000, -1, i32::MIN, i32::MAX], rows);
        scan_finds_the_first_bad_id(999u64, &[1000, 1 << 32, u64::MAX], rows);
        let big = [1000, -1, 1 << 32, -(1 << 32), i64::MIN, i64::MAX];
        scan_finds_the_first_bad_id(999i64, &big, rows);
        scan_finds_the_first_bad_id(999usize, &[1000, usize::MAX], rows);
        // Row counts past 2^32 and 2^63: only the negative ids are bad.
        scan_finds_the_first_bad_id(i64::MAX, &[-1, i64::MIN], usize::MAX);
        scan_finds_the_first_bad_id(u32::MAX - 1, &[u32::MAX], u32::MAX as usize);
    }

    #[test]
    fn signed_values_are_reported_signed() {
        let err = ValidIds::new(&[0i64, -1], 4).unwrap_err();
        assert_eq!(
            err,
            EmbeddingError::IndexOutOfRange {
                position: 1,
                index: -1,
                num_embeddings: 4
            }
        );
        let err = ValidIds::new(&[u64::MAX], 4).unwrap_err();
        assert!(
            matches!(err, EmbeddingError::IndexOutOfRange { index, .. } if index == u64::MAX as i128)
        );
    }
}
