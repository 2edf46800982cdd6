//! The bag forward's driver: tasks of whole bags across threads, each bag a
//! column block at a time ([`sum`](mod@super::sum) or [`max`](mod@super::max)), and
//! the loop over a bag's rows that both share ([`Rows::blocks`]).

use super::{max, sum};
use crate::bags::Bags;
use crate::error::{EmbeddingError, Operand};
use crate::formats::TableRef;
use crate::index::{
    AnyValidIds, ByRow, IdsWindow, RowId, UncheckedIds, ValidIds, each_row_type, run_rows,
};
use crate::kernels::blocks::Cols;
use crate::kernels::row_format::{F32Rows, OnRows, RowFormat, RowSpan, dispatch};
use crate::kernels::slot::Slot;
use crate::kernels::tuning::{
    PARALLEL_MIN_BYTES, PREFETCH_MIN_TABLE_BYTES, WHOLE_ROW_HINT_MAX_BYTES, bag_ahead,
    bags_per_task,
};
use crate::parallel::{Parallelism, for_each_chunk, for_each_chunk_pair};
use crate::pooling::{Mode, Pooling};
use crate::simd::prefetch::BagHints;
use crate::simd::{Body, Isa, Lanes};
use core::mem::MaybeUninit;
use core::ops::Range;
use core::sync::atomic::{AtomicBool, Ordering};

/// The forward after [`check_forward`](super::check_forward), on an `f32`
/// table: it cannot fail. Not generic ([`ByRow`](crate::index::ByRow)): compiled here, once.
// `bag_forward_with`'s arguments, with the ids checked.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_valid(
    par: Parallelism,
    table: &[f32],
    dim: usize,
    ids: AnyValidIds<'_>,
    bags: &Bags,
    pooling: &Pooling<'_>,
    out: &mut [f32],
    max_indices: &mut [i64],
) {
    let isa = Isa::detect();
    let table = F32Rows { table, dim };
    each_row_type!(ids, |ids| {
        let ids = CallIds::Checked(ids);
        forward_into(isa, par, table, ids, bags, pooling, out, dim, max_indices);
    })
}

/// [`forward_valid`] on a table of any format, bag `b`'s row at
/// `out[b * stride..][..dim]` (`stride >= dim`; the values between rows are
/// left as they are).
// `forward_valid`'s arguments, and the rows' stride.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_table(
    par: Parallelism,
    table: &TableRef<'_>,
    ids: AnyValidIds<'_>,
    bags: &Bags,
    pooling: &Pooling<'_>,
    out: &mut [f32],
    stride: usize,
    max_indices: &mut [i64],
) {
    let isa = Isa::detect();
    each_row_type!(ids, |ids| {
        let op = Forward {
            isa,
            par,
            ids,
            bags,
            pooling,
            out,
            stride,
            max_indices,
        };
        dispatch(table, op)
    })
}

/// The ids of a bag forward: checked before the call, or checked by its
/// tasks.
#[derive(Clone, Copy)]
pub(crate) enum CallIds<'i, I: RowId> {
    /// Every id checked, by [`UncheckedIds::check`].
    Checked(ValidIds<'i, I>),
    /// Not checked yet: each task checks the positions it reads (its bags'
    /// and the `ahead` after them) before it reads a row, and writes nothing
    /// if one is not a row of `num_embeddings` (nor once another task found
    /// one). Only for an output nobody sees until the call succeeds
    /// ([`forward_fresh`]); the ids outside every bag, which no task reads,
    /// are the caller's to check ([`forward_fresh`] does).
    InTasks {
        ids: UncheckedIds<'i, I>,
        num_embeddings: usize,
    },
}

/// The ids of a bag forward, of either row type.
pub(crate) type AnyCallIds<'i> = ByRow<CallIds<'i, u32>, CallIds<'i, u64>>;

impl<'i, I: RowId> CallIds<'i, I> {
    /// These ids as their row type, as one type ([`ByRow`]).
    #[inline]
    pub(crate) fn by_row(self) -> AnyCallIds<'i> {
        match self {
            CallIds::Checked(ids) => ids.by_row().map(CallIds::Checked, CallIds::Checked),
            CallIds::InTasks {
                ids,
                num_embeddings,
            } => ids.by_row().map(
                |ids| CallIds::InTasks {
                    ids,
                    num_embeddings,
                },
                |ids| CallIds::InTasks {
                    ids,
                    num_embeddings,
                },
            ),
        }
    }
}

/// [`forward_valid`] into a fresh output: `values` (emptied, and reserved
/// here if the caller has not) gets the `bags × dim` values, each written
/// once (no zeroing first), in huge pages when it spans one.
///
/// With [`CallIds::InTasks`] the ids are checked inside the forward's tasks
/// rather than by a pass of their own before it: on a call of many ids
/// over narrow rows that pass, and the hand-off to the pool it needed, cost
/// more than the tasks' checks, which read the ids the tasks read anyway
/// (docs/design.md, "Threads"). The ids outside every bag are checked
/// first, on this thread.
///
/// # Errors
/// [`EmbeddingError::IndexOutOfRange`] for the first id that is not a row
/// (before [`EmbeddingError::AllocationFailed`], as if checked first), then
/// [`EmbeddingError::SizeOverflow`] or [`EmbeddingError::AllocationFailed`]
/// for the output; then `values` is empty.
// `forward_valid`'s arguments, the output a `Vec`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_fresh<I: RowId, T: RowFormat>(
    isa: Isa,
    par: Parallelism,
    table: T,
    ids: CallIds<'_, I>,
    bags: &Bags,
    pooling: &Pooling<'_>,
    values: &mut Vec<f32>,
    max_indices: &mut [i64],
) -> Result<(), EmbeddingError> {
    values.clear();
    if pooling.mode == Mode::Max {
        // Max's tasks pair runs of `values` with runs of `max_indices`:
        // one shorter than the other would leave values unwritten.
        let len = crate::shape::rows_len(bags.len(), table.dim())?;
        crate::shape::check_len(Operand::MaxIndices, len, max_indices.len())?;
    }
    if let CallIds::InTasks {
        ids,
        num_embeddings,
    } = ids
    {
        debug_assert_eq!(bags.num_ids(), ids.len(), "bags made for other ids");
        // Bags start at position 0, so the ids no task reads are those past
        // the last bag's end.
        let past_the_bags = bags.starts()[bags.len()]..ids.len();
        let untouched = table.dim() == 0 || bags.is_empty();
        if untouched || IdsWindow::check(ids, past_the_bags, num_embeddings).is_none() {
            // No task would check them, or one past the bags is bad: the
            // whole check finds the first bad one.
            let ids = CallIds::Checked(ids.check(par, num_embeddings)?);
            return forward_fresh(isa, par, table, ids, bags, pooling, values, max_indices);
        }
    }
    let fresh = crate::memory::fresh_floats(values, bags.len(), table.dim(), "output");
    let fresh = match ids {
        CallIds::InTasks {
            ids,
            num_embeddings,
        } => super::ids_first(par, ids, num_embeddings, fresh)?,
        CallIds::Checked(_) => fresh?,
    };
    let len = fresh.len();
    if forward_on(
        isa,
        par,
        table,
        ids,
        bags,
        pooling,
        fresh,
        table.dim(),
        max_indices,
    ) {
        // SAFETY: `forward_on` returned `true`, so it wrote all of
        // `spare_capacity_mut()[..len]`: with `dim == 0` or no bags `len` is
        // 0; otherwise its tasks split `fresh` into runs of whole bags and,
        // for each bag, `sum::pool` or `max::pool` stores every column block
        // of the row (`each_block` covers columns `0..dim`) or, for a bag
        // that kept no row, zeroes the whole row; for rows of one column
        // block (`sum::one_block`), `sum::pool_each` stores that block, the
        // whole row, of each bag of the run, or zeroes the row of a bag that
        // kept none; in max mode `max_indices` holds `len` values too
        // (checked above), so the paired runs cover both. A task returns
        // without writing only when its ids fail their check or another
        // task's did, and then `forward_on` returns `false`. It returns
        // after every task. The capacity is `len` or more
        // (`memory::fresh_floats` reserved `bags × dim`, `len`, values).
        #[allow(unsafe_code)]
        unsafe {
            values.set_len(len)
        };
        return Ok(());
    }
    // A task found an id that is not a row and wrote none of its bags: the
    // whole check reports the first. (Checked ids stop no task, so they are
    // never run again.)
    let ids = match ids {
        CallIds::InTasks {
            ids,
            num_embeddings,
        } => CallIds::Checked(ids.check(par, num_embeddings)?),
        checked => checked,
    };
    forward_fresh(isa, par, table, ids, bags, pooling, values, max_indices)
}

/// [`forward_into`]'s arguments but the table: the bag forward as an
/// operation over any [`RowFormat`].
pub(super) struct Forward<'a, 'i, I: RowId> {
    pub(super) isa: Isa,
    pub(super) par: Parallelism,
    pub(super) ids: ValidIds<'i, I>,
    pub(super) bags: &'a Bags,
    pub(super) pooling: &'a Pooling<'a>,
    pub(super) out: &'a mut [f32],
    /// How far apart the bags' rows are in `out`, in values.
    pub(super) stride: usize,
    pub(super) max_indices: &'a mut [i64],
}

/// [`forward_fresh`] as an operation over any [`RowFormat`].
pub(super) struct FreshForward<'a, 'i, I: RowId> {
    pub(super) isa: Isa,
    pub(super) par: Parallelism,
    pub(super) ids: CallIds<'i, I>,
    pub(super) bags: &'a Bags,
    pub(super) pooling: &'a Pooling<'a>,
    pub(super) values: &'a mut Vec<f32>,
    pub(super) max_indices: &'a mut [i64],
}

impl<I: RowId> OnRows for FreshForward<'_, '_, I> {
    type Output = Result<(), EmbeddingError>;

    fn on<T: RowFormat>(self, table: T) -> Self::Output {
        let FreshForward {
            isa,
            par,
            ids,
            bags,
            pooling,
            values,
            max_indices,
        } = self;
        forward_fresh(isa, par, table, ids, bags, pooling, values, max_indices)
    }
}

impl<I: RowId> OnRows for Forward<'_, '_, I> {
    type Output = ();

    fn on<T: RowFormat>(self, table: T) {
        let Forward {
            isa,
            par,
            ids,
            bags,
            pooling,
            out,
            stride,
            max_indices,
        } = self;
        let ids = CallIds::Checked(ids);
        forward_into(
            isa,
            par,
            table,
            ids,
            bags,
            pooling,
            out,
            stride,
            max_indices,
        );
    }
}

/// [`forward_on`] into a caller's `out`, through the same slots as a fresh
/// output (`MaybeUninit<f32>`), so that each bag loop is compiled once for
/// both kinds of output rather than once for each: a crate that called the
/// layers and the kernels compiled them twice, and unoptimised builds now
/// reuse the library's copies (docs/design.md, "The shape of a kernel").
// `forward_on`'s arguments.
#[allow(clippy::too_many_arguments)]
pub(super) fn forward_into<I: RowId, T: RowFormat>(
    isa: Isa,
    par: Parallelism,
    table: T,
    ids: CallIds<'_, I>,
    bags: &Bags,
    pooling: &Pooling<'_>,
    out: &mut [f32],
    stride: usize,
    max_indices: &mut [i64],
) -> bool {
    let len = out.len();
    // SAFETY: `MaybeUninit<f32>` has the size and alignment of `f32` and
    // looser validity rules, so the view covers exactly `out`'s values.
    // The one hazard of such a view, an uninitialised value written
    // through it, cannot happen: `forward_on` and everything below it are
    // generic over `S: Slot` and touch the output only through `Slot::put`
    // and `Slot::zero` (directly or in `Cols::store`), which write
    // `MaybeUninit::new` of an `f32`; the parallel drivers it hands runs of
    // the slice to only split and move them. That stays true while `Slot`
    // has no method that makes a value and `forward_on` stays generic over
    // it. Values it does not write keep the caller's.
    #[allow(unsafe_code)]
    let slots = unsafe {
        core::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<MaybeUninit<f32>>(), len)
    };
    forward_on(
        isa,
        par,
        table,
        ids,
        bags,
        pooling,
        slots,
        stride,
        max_indices,
    )
}

/// [`forward_valid`] on a chosen instruction set and table format; the
/// tests run each. Returns whether every bag was written: `false` when the
/// ids were [`CallIds::InTasks`] and a task found one that is not a row
/// (that task, and those that started after, wrote nothing; others may have
/// written theirs). With [`CallIds::InTasks`] the ids outside every bag are
/// not checked here. Bag `b`'s row is `out[b * stride..][..dim]`: `out`
/// holds `(bags - 1) * stride + dim` values (`bags * dim` for rows side by
/// side); `max_indices`, in max mode, `bags * dim` whatever the stride.
#[allow(clippy::too_many_arguments)]
fn forward_on<I: RowId, T: RowFormat, S: Slot>(
    isa: Isa,
    par: Parallelism,
    table: T,
    ids: CallIds<'_, I>,
    bags: &Bags,
    pooling: &Pooling<'_>,
    out: &mut [S],
    stride: usize,
    max_indices: &mut [i64],
) -> bool {
    let is_max = pooling.mode == Mode::Max;
    let dim = table.dim();
    if dim == 0 || bags.is_empty() {
        return true;
    }
    // No hints for a table that sits in the caches (see tuning.rs).
    let ahead = if table.bytes() < PREFETCH_MIN_TABLE_BYTES {
        0
    } else {
        bag_ahead(table.row_bytes(), T::PACKED, table.bytes(), isa.lanes())
    };
    let (padding_idx, hints) = (pooling.padding_idx, table.bag_hints());
    let limit = bags.starts()[bags.len()];
    let stopped = AtomicBool::new(false);
    let task = |first_bag: usize, out: &mut [S], max_indices: &mut [i64]| {
        let ids = match ids {
            CallIds::Checked(valid) => IdsWindow::all(valid),
            // The call is lost: no need to read more.
            CallIds::InTasks { .. } if stopped.load(Ordering::Relaxed) => return,
            CallIds::InTasks {
                ids,
                num_embeddings,
            } => {
                // The positions the task reads: its bags' and the rows
                // hinted `ahead` after them (up to the call's last).
                let first = bags.starts()[first_bag];
                let end = bags.starts()[first_bag + (out.len() + stride - dim) / stride];
                let window = first..limit.min(end.saturating_add(ahead));
                match IdsWindow::check(ids, window, num_embeddings) {
                    Some(valid) => valid,
                    None => {
                        stopped.store(true, Ordering::Relaxed);
                        return;
                    }
                }
            }
        };
        // `u64` ids of a table of at most 2^32 rows are read as `u32`s
        // (`ValidIds::by_row`), so the task's body is compiled for `u32`
        // ids on every instruction set, for `u64` ids once.
        let rows = Rows {
            table,
            dim,
            ids,
            padding_idx,
            ahead,
            hints,
        };
        let (first, args) = (first_bag, max_indices);
        let out = (out, stride);
        match rows.ids.by_row() {
            ByRow::U32(ids) => run_task(isa, rows.with(ids), bags, pooling, first, out, args),
            ByRow::U64(ids) => run_task(isa, rows.with(ids), bags, pooling, first, out, args),
        }
    };
    // The work of a call is its values pooled, counted as the bytes of
    // their `f32`s (a packed or half row costs more to decode than its
    // stored bytes say). The pool's threshold counts at most the table's
    // size (a table in cache is read at cache speed however many ids there
    // are); whether a smaller call is worth sharing (or too long to share:
    // `SHARE_MAX_BYTES`), the whole work.
    let count = match ids {
        CallIds::Checked(valid) => valid.len(),
        CallIds::InTasks { ids, .. } => ids.len(),
    };
    let work = count.saturating_mul(dim).saturating_mul(4);
    let plan = par.plan_sized(table.bytes().min(work), work, PARALLEL_MIN_BYTES);
    let bags_per_task = bags_per_task(plan, bags.len(), dim, work);
    // Runs of whole bags: a run's last row ends at its `dim`-th value, the
    // next run starts at its first bag's row.
    let (chunk, indices_chunk) = (bags_per_task * stride, bags_per_task * dim);
    if is_max {
        for_each_chunk_pair(
            plan,
            (out, chunk),
            (max_indices, indices_chunk),
            |k, o, m| task(k * bags_per_task, o, m),
        );
    } else {
        for_each_chunk(plan, out, chunk, |k, o| task(k * bags_per_task, o, &mut []));
    }
    !stopped.into_inner()
}

/// [`BagTask`] of `rows` on `isa` ([`run_rows`]: `u64` ids on the portable
/// lanes alone).
// `BagTask`'s fields and the instruction set.
#[allow(clippy::too_many_arguments)]
fn run_task<I: RowId, T: RowFormat, S: Slot>(
    isa: Isa,
    rows: Rows<'_, I, T>,
    bags: &Bags,
    pooling: &Pooling<'_>,
    first_bag: usize,
    (out, stride): (&mut [S], usize),
    max_indices: &mut [i64],
) {
    let task = BagTask {
        rows,
        bags,
        pooling,
        first_bag,
        out,
        stride,
        max_indices,
    };
    run_rows::<I, _>(isa, task);
}

/// What every block of every bag reads: the table, the checked ids, the
/// padding row, the prefetch distance and how to hint.
#[derive(Clone, Copy)]
pub(super) struct Rows<'i, I: RowId, T> {
    pub(super) table: T,
    pub(super) dim: usize,
    pub(super) ids: IdsWindow<'i, I>,
    pub(super) padding_idx: Option<usize>,
    /// How many positions ahead rows are prefetched; 0 for none.
    pub(super) ahead: usize,
    /// How the rows ahead are hinted ([`RowFormat::bag_hints`]).
    pub(super) hints: BagHints,
}

impl<'i, I: RowId, T: RowFormat> Rows<'i, I, T> {
    /// The same rows read through `ids` (the same ids, narrowed).
    #[inline]
    fn with<J: RowId>(self, ids: IdsWindow<'i, J>) -> Rows<'i, J, T> {
        Rows {
            table: self.table,
            dim: self.dim,
            ids,
            padding_idx: self.padding_idx,
            ahead: self.ahead,
            hints: self.hints,
        }
    }

    /// Hands `f` columns `cols` of each kept row of `bag`, in order, and
    /// returns how many rows were kept. Before each position it prefetches
    /// the same block of the row `ahead` positions on.
    ///
    /// Most bags take the fast loop: no padding row, and the rows read ahead
    /// still among the call's ids (`bag.end + ahead <= limit`). It walks the
    /// bag's ids and the ids `ahead` on as two slices, so a position costs
    /// two id loads, the hints and the block: no clamp, no index check.
    /// Fewer instructions a row let more rows' loads be in flight at once,
    /// which is what a bag of narrow rows waits on. The other bags (near the
    /// call's end, with a padding row, or without hints) take the general
    /// loop.
    ///
    /// `ONE` says whether a row can be this one block (`dim ==
    /// N·V::WIDTH`, read from column 0): only the bodies that see rows of
    /// one block compile that case, a loop with the row's length and the
    /// hint a constant, so that a row's offset is a shift and every bound a
    /// constant away from it: fewer instructions a row, which paid on rows
    /// of 16 columns (docs/design.md, "Bags"). Every other case is one
    /// loop, the hints chosen in it ([`Hints`]).
    #[inline(always)]
    pub(super) fn blocks<V: Lanes, const N: usize, const ONE: bool, F: Visit<V, N>>(
        &self,
        bag: Range<usize>,
        limit: usize,
        cols: Cols<N>,
        f: &mut F,
    ) -> usize {
        if self.padding_idx.is_some() || self.ahead == 0 || bag.end + self.ahead > limit {
            return self.blocks_general(bag, limit, cols, f);
        }
        // A block from column 0 as wide as the row is the whole row (a
        // row's zero-padded tail block is narrower than one vector).
        let width = N * V::WIDTH;
        if ONE && cols.start == 0 && self.dim == width {
            let len = T::row_len(width);
            return match self.hints {
                BagHints::Line => self.fast_blocks(bag, len, cols, f, Hints::Block(BagHints::Line)),
                BagHints::L1 => self.fast_blocks(bag, len, cols, f, Hints::Block(BagHints::L1)),
                BagHints::L2 => self.fast_blocks(bag, len, cols, f, Hints::Block(BagHints::L2)),
            };
        }
        let hints =
            if self.hints == BagHints::L2 && self.table.row_bytes() <= WHOLE_ROW_HINT_MAX_BYTES {
                // A row of several blocks hinted into L2, and short: the whole
                // row in the pass over its first block, nothing in the others
                // (see `WHOLE_ROW_HINT_MAX_BYTES`).
                if cols.start == 0 {
                    Hints::Row
                } else {
                    Hints::None
                }
            } else {
                Hints::Block(self.hints)
            };
        self.fast_blocks(bag, T::row_len(self.dim), cols, f, hints)
    }

    /// The fast loop of [`blocks`](Self::blocks), its rows `row_len` units
    /// long and hinted as `hints` says (constants when the caller passes
    /// them). The caller checked that the rows read ahead lie in the ids
    /// (`bag.end + ahead <= limit`).
    #[inline(always)]
    fn fast_blocks<V: Lanes, const N: usize, F: Visit<V, N>>(
        &self,
        bag: Range<usize>,
        row_len: usize,
        cols: Cols<N>,
        f: &mut F,
        hints: Hints,
    ) -> usize {
        let (ahead, table) = (self.ahead, &self.table);
        let here = self.ids.slice(bag.clone());
        let next = self.ids.slice(bag.start + ahead..bag.end + ahead);
        for (k, r, n) in here.rows_beside(&next) {
            let p = bag.start + k;
            let ahead = RowSpan::of(n, row_len);
            match hints {
                Hints::Block(hints) => table.prefetch_block::<V, N>(ahead, cols, hints),
                Hints::Row => table.prefetch_row(ahead),
                Hints::None => {}
            }
            f.visit(p, table, RowSpan::of(r, row_len), cols);
        }
        bag.len()
    }

    /// [`blocks`](Self::blocks) for any bag: the row read ahead is clamped
    /// to the call's last position, `limit - 1` (a repeated hint costs next
    /// to nothing), and rows equal to `padding_idx` are skipped.
    #[inline(always)]
    fn blocks_general<V: Lanes, const N: usize, F: Visit<V, N>>(
        &self,
        bag: Range<usize>,
        limit: usize,
        cols: Cols<N>,
        f: &mut F,
    ) -> usize {
        // `limit` is 0 for a call whose bags hold no id; then no loop below
        // runs and `last` is never read. Without a padding row, no row is
        // `usize::MAX` (rows lie below the table's row count).
        let last = limit.saturating_sub(1);
        let padding = self.padding_idx.unwrap_or(usize::MAX);
        let mut kept = 0;
        for p in bag {
            self.prefetch_block::<V, N>(p, last, cols);
            let r = self.ids.row(p);
            if r != padding {
                f.visit(p, &self.table, self.table.row(r), cols);
                kept += 1;
            }
        }
        kept
    }

    /// Prefetches block `cols` of the row `ahead` positions after `p` (at
    /// most position `last`); nothing when `ahead` is 0.
    #[inline(always)]
    fn prefetch_block<V: Lanes, const N: usize>(&self, p: usize, last: usize, cols: Cols<N>) {
        if self.ahead == 0 {
            return;
        }
        let r = self.ids.row((p + self.ahead).min(last));
        self.table
            .prefetch_block::<V, N>(self.table.row(r), cols, self.hints);
    }
}

/// What a block body does with each kept row of a bag: the sum's and the
/// max's registers. A trait with `#[inline(always)]` methods rather than a
/// closure: a closure is compiled as a function of its own, without the AVX
/// of [`Isa::run`]'s wrapper, and calls each instruction it holds.
pub(super) trait Visit<V: Lanes, const N: usize> {
    /// Takes block `cols` of `row` of `table`, the row at position `p`,
    /// decoding it with [`RowFormat::decode`] into a sink of its own.
    fn visit<T: RowFormat>(&mut self, p: usize, table: &T, row: RowSpan, cols: Cols<N>);
}

/// What the fast loop hints of the row `ahead` positions on
/// ([`Rows::blocks`]).
#[derive(Clone, Copy)]
enum Hints {
    /// The pass's block, as [`RowFormat::prefetch_block`] says.
    Block(BagHints),
    /// The whole row ([`RowFormat::prefetch_row`]).
    Row,
    /// Nothing (a pass over a later block of a row hinted whole).
    None,
}

/// One task of the forward: the bags from `first_bag` whose rows `out` (and
/// `max_indices`, for max) hold, `stride` values apart in `out`.
struct BagTask<'a, 'i, I: RowId, T, S> {
    rows: Rows<'i, I, T>,
    bags: &'a Bags,
    pooling: &'a Pooling<'a>,
    first_bag: usize,
    out: &'a mut [S],
    stride: usize,
    max_indices: &'a mut [i64],
}

impl<I: RowId, T: RowFormat, S: Slot> Body for BagTask<'_, '_, I, T, S> {
    type Output = ();

    #[inline(always)]
    fn run<V: Lanes>(self) {
        let BagTask {
            rows,
            bags,
            pooling,
            first_bag,
            out,
            stride,
            max_indices,
        } = self;
        let dim = rows.dim;
        let first = bags.starts()[first_bag];
        // The rows read ahead may lie in the bags of the next task (the
        // call's last position bounds them): a thread mostly takes its tasks
        // in order, and the next one then starts with its rows on the way,
        // not cold (docs/design.md, "Bags"). Ids checked by the task cover
        // those positions.
        let limit = bags.starts()[bags.len()];
        // Warm the first rows: a task taken out of order starts cold.
        for p in first..limit.min(first + rows.ahead) {
            rows.table.prefetch_row(rows.table.row(rows.ids.row(p)));
        }
        let terms = sum::Terms {
            rows: &rows,
            weights: pooling.per_sample_weights,
            fused: pooling.padding_idx.is_none(),
            mean: pooling.mode == Mode::Mean,
            limit,
        };
        if matches!(pooling.mode, Mode::Sum | Mode::Mean) && sum::one_block::<V, T>(dim) {
            sum::pool_each::<V, I, T, S>(terms, bags, first_bag, out, stride);
            return;
        }
        for (k, row) in out.chunks_mut(stride).enumerate() {
            let (dst, bag) = (&mut row[..dim], bags.range(first_bag + k));
            match pooling.mode {
                Mode::Sum | Mode::Mean => sum::pool::<V, I, T, S>(terms, bag, dst),
                Mode::Max => {
                    let args = &mut max_indices[k * dim..(k + 1) * dim];
                    max::pool::<V, I, T, S>(&rows, bag, limit, dst, args);
                }
            }
        }
    }
}
