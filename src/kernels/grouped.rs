//! Backward by row: group the positions by id, then visit each touched row
//! once. The dense backward, the coalesced sparse gradient and the fused
//! optimiser updates of [`Embedding`](crate::Embedding) all run here.
//!
//! ```text
//! check grad_output length, every id                       (nothing written)
//! keys  = sort [(row, position) for every position, row != padding_idx]
//! groups = runs of equal rows in keys: (row, positions in order)
//! plan tasks over the groups (and, dense, over the untouched rows too)
//! each task, in parallel:
//!     for each group in its range:
//!         sum = 0 + grad_output[p0] + grad_output[p1] + ...   (position order)
//!         sum /= count                             (scale_grad_by_freq only)
//!         dense:     grad_table[row] = sum;  untouched rows = 0
//!         coalesced: values[group]   = sum
//!         fused:     rule(weight[row], sum, state[row])
//! ```
//!
//! 1. **One sort, no table-sized scratch.** The positions are sorted by row
//!    with a stable LSD radix sort, 11 bits of the row per pass (two passes
//!    for a million rows), so each row's positions stay in order. The cost
//!    is `O(n)` per pass and does not grow with `num_embeddings` beyond its
//!    bit count, which is what lets a sparse gradient and a fused update skip
//!    the 488 MiB of an untouched recsys table. (A comparison sort of
//!    `row · n + p` keys came first; on narrow's 262 144 ids it took several
//!    milliseconds.)
//! 2. **Exact sums.** Each row is summed in position order starting from
//!    `+0.0`, the same additions as `scatter_add` into a zeroed gradient, so
//!    the dense, the coalesced and the reference gradient have the same bits,
//!    for every thread count.
//! 3. **Each row written once.** The dense backward writes a touched row's sum
//!    or an untouched row's zeros in one sweep over the table: there is no
//!    zeroing pass before the scatter. From 8 MiB of table on, the sweep uses
//!    non-temporal (streaming) stores, which send whole lines to memory
//!    without first reading them into the cache: a plain store reads every
//!    line it writes, doubling the traffic. On recsys (488 MiB, two threads)
//!    this took the dense backward from 39 to 22 ms, against 12 ms for a
//!    memset of the same table.
//! 4. **Tasks own disjoint rows.** Groups are sorted by row, so a run of
//!    groups covers a contiguous range of table rows, and the table (and an
//!    optimiser's state) is carved into those ranges with `split_at_mut`.
//!    No atomics, no locks, no `unsafe`.
//! 5. **Hot rows are split by columns.** A row holding more than a task's
//!    share of the positions (say 90 % of a batch) would serialise the call;
//!    such a row becomes several tasks over disjoint column blocks of whole
//!    cache lines, each summing its columns in position order. Rules that
//!    need the whole row at once (row-wise Adagrad) keep the row whole.
//! 6. **Prefetch.** In the grouped order the positions jump about
//!    `grad_output` at random, so each task walks a cursor about 16 KiB of
//!    rows ahead through its positions and prefetches their gradient rows
//!    (and, for a fused update, the weight and state rows of the group as
//!    far ahead). Prefetching only each group's first row left most rows of
//!    narrow's many small groups to miss: its dense backward took 26 ms.

use super::{prefetch_ahead, row, spare, PARALLEL_MIN_BYTES};
use crate::error::{EmbeddingError, Operand};
use crate::index::{Index, ValidIds};
use crate::optim::RowRule;
use crate::parallel::Parallelism;
use crate::shape::{check_len, rows_len, table_rows};
use crate::sparse_grad::SparseGrad;
use core::ops::Range;
use rayon::prelude::*;

/// A task's share of the work, in floats read or written.
const TASK_FLOATS: usize = 32 * 1024;

/// A dense sweep task's share, in floats written: larger than
/// [`TASK_FLOATS`], since most of a sweep is zeros and a task's fixed cost
/// (its plan entry, its slice, rayon's hand-off) would otherwise be paid
/// about 4 000 times over recsys's 488 MiB.
const SWEEP_TASK_FLOATS: usize = 256 * 1024;

/// Bits of the row sorted per pass of the grouping's radix sort.
const RADIX_BITS: u32 = 11;

/// Buckets per pass.
const RADIX: usize = 1 << RADIX_BITS;

/// From this many bytes of gradient table on, the dense backward writes
/// with streaming stores (trick 3). Below, the table fits the caches that a
/// streaming store would bypass, and plain stores are faster: on `tiny`
/// (256 KiB) streaming took about twice as long as a memset and a scatter.
const STREAM_MIN_BYTES: usize = 8 * 1024 * 1024;

/// Floats per 64-byte cache line: hot-row column blocks are whole lines.
const LINE: usize = 16;

/// The positions of a batch grouped by row, rows ascending, each row's
/// positions ascending.
#[derive(Clone, Debug, Default)]
pub(crate) struct Groups {
    /// The distinct rows, ascending.
    pub(crate) rows: Vec<usize>,
    /// `starts[g]..starts[g + 1]` indexes `positions` for group `g`.
    pub(crate) starts: Vec<usize>,
    /// Every kept position, grouped by row.
    pub(crate) positions: Vec<usize>,
}

impl Groups {
    /// Groups `ids` by row, leaving out every position whose row is `skip`
    /// (the padding row).
    pub(crate) fn new<I: Index>(ids: ValidIds<'_, I>, skip: Option<usize>) -> Groups {
        Groups::new_kept(ids, |_, r| Some(r) != skip)
    }

    /// Groups the positions `p` (with row `r`) for which `keep(p, r)`.
    pub(crate) fn new_kept<I: Index>(
        ids: ValidIds<'_, I>,
        keep: impl Fn(usize, usize) -> bool,
    ) -> Groups {
        let bits = usize::BITS - ids.num_embeddings().saturating_sub(1).leading_zeros();
        #[cfg(target_pointer_width = "64")]
        if bits <= 32 && u32::try_from(ids.len()).is_ok() {
            return Groups::new_packed(ids, keep, bits);
        }
        Groups::new_wide(ids, keep, bits)
    }

    /// [`Groups::new_kept`] for any row and position, `bits` the width of
    /// the largest row.
    fn new_wide<I: Index>(
        ids: ValidIds<'_, I>,
        keep: impl Fn(usize, usize) -> bool,
        bits: u32,
    ) -> Groups {
        // Trick 1: a stable LSD radix sort of the kept positions by row,
        // RADIX_BITS of the row per pass. The positions go in ascending, and
        // a stable sort keeps them so within each row.
        let (mut rows, mut positions) =
            (Vec::with_capacity(ids.len()), Vec::with_capacity(ids.len()));
        for (p, r) in ids.rows().enumerate() {
            if keep(p, r) {
                rows.push(r);
                positions.push(p);
            }
        }
        let (mut rows_to, mut positions_to) = (vec![0; rows.len()], vec![0; rows.len()]);
        let mut shift = 0;
        while shift < bits {
            let digit = |r: usize| (r >> shift) & (RADIX - 1);
            let mut starts = [0usize; RADIX];
            for &r in &rows {
                starts[digit(r)] += 1;
            }
            if starts.contains(&rows.len()) {
                // Every row has this digit: the pass would change nothing.
                shift += RADIX_BITS;
                continue;
            }
            let mut sum = 0;
            for s in starts.iter_mut() {
                (*s, sum) = (sum, sum + *s);
            }
            for (&r, &p) in rows.iter().zip(&positions) {
                let at = &mut starts[digit(r)];
                rows_to[*at] = r;
                positions_to[*at] = p;
                *at += 1;
            }
            core::mem::swap(&mut rows, &mut rows_to);
            core::mem::swap(&mut positions, &mut positions_to);
            shift += RADIX_BITS;
        }
        let mut groups = Groups {
            positions,
            rows: Vec::new(),
            starts: Vec::new(),
        };
        groups.find_runs(rows.into_iter());
        groups
    }

    /// [`Groups::new_kept`] when rows and positions fit 32 bits each (and
    /// `usize` has 64): one key per position, `row << 32 | position`, so
    /// each pass moves one array instead of two, and one read of the keys
    /// counts the digits of every pass. The vectors come from (and go back
    /// to) the thread's [`spare`] ones.
    #[cfg(target_pointer_width = "64")]
    fn new_packed<I: Index>(
        ids: ValidIds<'_, I>,
        keep: impl Fn(usize, usize) -> bool,
        bits: u32,
    ) -> Groups {
        const MAX_PASSES: usize = 32usize.div_ceil(RADIX_BITS as usize);
        let passes = bits.div_ceil(RADIX_BITS) as usize;
        let digit =
            |key: usize, pass: usize| (key >> (32 + pass * RADIX_BITS as usize)) & (RADIX - 1);
        let mut keys = spare::take(ids.len());
        keys.extend(
            ids.rows()
                .enumerate()
                .filter(|&(p, r)| keep(p, r))
                .map(|(p, r)| r << 32 | p),
        );
        let mut counts = [[0usize; RADIX]; MAX_PASSES];
        for &key in &keys {
            for (pass, count) in counts[..passes].iter_mut().enumerate() {
                count[digit(key, pass)] += 1;
            }
        }
        let mut to = spare::take(keys.len());
        to.resize(keys.len(), 0);
        for (pass, count) in counts[..passes].iter_mut().enumerate() {
            if count.contains(&keys.len()) {
                continue; // every key has this digit: nothing would move
            }
            let mut sum = 0;
            for c in count.iter_mut() {
                (*c, sum) = (sum, sum + *c);
            }
            for &key in &keys {
                let at = &mut count[digit(key, pass)];
                to[*at] = key;
                *at += 1;
            }
            core::mem::swap(&mut keys, &mut to);
        }
        spare::give(to);
        let mut groups = Groups {
            rows: spare::take(keys.len()),
            starts: spare::take(keys.len() + 1),
            positions: keys,
        };
        groups.find_runs_packed();
        groups
    }

    /// The packed keys of [`Groups::new_packed`], sorted, in `positions`:
    /// fills `rows` and `starts` and leaves the positions alone.
    #[cfg(target_pointer_width = "64")]
    fn find_runs_packed(&mut self) {
        for (i, key) in self.positions.iter_mut().enumerate() {
            let r = *key >> 32;
            if self.rows.last() != Some(&r) {
                self.rows.push(r);
                self.starts.push(i);
            }
            *key &= u32::MAX as usize;
        }
        self.starts.push(self.positions.len());
    }

    /// Fills `rows` and `starts` from the row of every sorted position.
    fn find_runs(&mut self, sorted_rows: impl Iterator<Item = usize>) {
        let mut len = 0;
        for (i, r) in sorted_rows.enumerate() {
            if self.rows.last() != Some(&r) {
                self.rows.push(r);
                self.starts.push(i);
            }
            len = i + 1;
        }
        self.starts.push(len);
    }

    /// The rows of a coalesced gradient as groups of one position each
    /// (position `k` is values row `k`), so the fused updates can apply it.
    fn of_sparse(grad: &SparseGrad) -> Groups {
        let k = grad.indices().len();
        Groups {
            rows: grad.indices().to_vec(),
            starts: (0..=k).collect(),
            positions: (0..k).collect(),
        }
    }

    /// How many distinct rows.
    pub(crate) fn len(&self) -> usize {
        self.rows.len()
    }

    /// Asks the cache for the gradient rows (columns `cols`) of every
    /// position up to `ahead` positions past the end of group `g`, in the
    /// grouped order, continuing from `*cursor` (trick 6). Call it once per
    /// group, with the cursor starting at the task's first position.
    #[inline(always)]
    pub(crate) fn prefetch_through<S: Source>(
        &self,
        g: usize,
        ahead: usize,
        source: &S,
        cols: &Range<usize>,
        cursor: &mut usize,
    ) {
        let end = (self.starts[g + 1] + ahead).min(self.positions.len());
        while *cursor < end {
            row::prefetch(source.row(self.positions[*cursor], cols.clone()));
            *cursor += 1;
        }
    }

    /// The positions of group `g`, ascending.
    #[inline]
    pub(crate) fn positions(&self, g: usize) -> &[usize] {
        &self.positions[self.starts[g]..self.starts[g + 1]]
    }
}

impl Drop for Groups {
    /// Hands the vectors to the thread's [`spare`] ones for the next
    /// grouping.
    fn drop(&mut self) {
        spare::give(core::mem::take(&mut self.rows));
        spare::give(core::mem::take(&mut self.starts));
        spare::give(core::mem::take(&mut self.positions));
    }
}

/// Where the gradient of each position comes from: position `p` adds
/// `row(p) × scale(p)` to its table row (the embedding's own gradient
/// row, or a bag's gradient row times the sample's weight or `1 / len`).
pub(crate) trait Source: Sync {
    /// Columns `cols` of the gradient row of position `p`.
    fn row(&self, p: usize, cols: Range<usize>) -> &[f32];
    /// The factor for position `p`, or `None` to add the row as it is.
    fn scale(&self, p: usize) -> Option<f32>;
}

/// The plain embedding's source: row `p` of `grad_output`, unscaled.
#[derive(Clone, Copy)]
pub(crate) struct PerPosition<'a> {
    pub(crate) grad_output: &'a [f32],
    pub(crate) dim: usize,
}

impl Source for PerPosition<'_> {
    #[inline(always)]
    fn row(&self, p: usize, cols: Range<usize>) -> &[f32] {
        &self.grad_output[p * self.dim + cols.start..p * self.dim + cols.end]
    }

    #[inline(always)]
    fn scale(&self, _p: usize) -> Option<f32> {
        None
    }
}

/// `dst = (+0.0 + Σ row(p) × scale(p)) / count?` over `positions` in order,
/// where `dst` is already the `cols` of one row. Each product is rounded
/// before it is added (no fused multiply-add).
#[inline(always)]
pub(crate) fn sum_positions<S: Source>(
    source: &S,
    positions: &[usize],
    cols: Range<usize>,
    divide_by_count: bool,
    dst: &mut [f32],
) {
    dst.fill(0.0);
    for &p in positions {
        let src = source.row(p, cols.clone());
        match source.scale(p) {
            None => row::add(dst, src),
            Some(s) => row::add_scaled(dst, src, s),
        }
    }
    if divide_by_count && positions.len() > 1 {
        let count = positions.len() as f32;
        dst.iter_mut().for_each(|x| *x /= count);
    }
}

/// One task: groups `groups`, covering `span` (table rows, or group
/// indices for a coalesced gradient), columns `cols`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Task {
    pub(crate) groups: Range<usize>,
    pub(crate) span: Range<usize>,
    pub(crate) cols: Range<usize>,
}

/// What the tasks index: table rows (dense and fused) or groups (coalesced).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Space {
    /// Spans are table rows; with `Some(rows)`, every row of `0..rows` must
    /// be covered (the dense backward writes untouched rows too).
    Rows(Option<usize>),
    /// Spans are group indices (one output row per group).
    Groups,
}

/// Cuts the groups (and, for a dense sweep, the untouched rows between
/// them) into tasks of about [`TASK_FLOATS`] each; a group heavier than that
/// becomes column-block tasks when `split_hot` and `dim` allow (trick 5).
///
/// Task spans never overlap, except the column blocks of one hot row, which
/// follow each other; for `Space::Rows(Some(rows))` they cover `0..rows`.
pub(crate) fn plan(
    groups: &Groups,
    dim: usize,
    space: Space,
    split_hot: bool,
    budget: usize,
) -> Vec<Task> {
    let budget = budget.max(dim);
    let (dense, total) = match space {
        Space::Rows(Some(rows)) => (true, rows),
        _ => (false, 0),
    };
    let unit = |g: usize| match space {
        Space::Rows(_) => groups.rows[g],
        Space::Groups => g,
    };
    let mut p = Planner {
        tasks: Vec::new(),
        dim,
        chunk: (budget / dim.max(1)).max(1),
        g0: 0,
        s0: 0,
        end: 0,
        cost: 0,
    };
    for g in 0..groups.len() {
        let u = unit(g);
        let weight = (groups.positions(g).len() + 1) * dim;
        if dense {
            let gap = (u - p.end) * dim;
            if p.g0 < g && p.cost + gap > budget {
                p.close(g);
            }
            if p.g0 == g && gap > budget {
                // A long stretch of untouched rows: zero-only tasks.
                p.zeros(u);
            }
            p.cost += (u - p.end) * dim;
        } else if p.g0 == g {
            p.s0 = u;
        }
        if split_hot && weight > budget && dim >= 2 * LINE {
            // Trick 5: the hot row alone, in column blocks of whole lines.
            if p.g0 < g {
                p.close(g);
            }
            if dense {
                p.zeros(u);
            }
            let blocks = (weight / budget).clamp(2, dim / LINE);
            let mut cut = 0;
            for k in 1..=blocks {
                let next = if k == blocks {
                    dim
                } else {
                    k * dim / blocks / LINE * LINE
                };
                if next > cut {
                    p.tasks.push(Task {
                        groups: g..g + 1,
                        span: u..u + 1,
                        cols: cut..next,
                    });
                    cut = next;
                }
            }
            (p.g0, p.s0, p.end, p.cost) = (g + 1, u + 1, u + 1, 0);
            continue;
        }
        p.cost += weight;
        p.end = u + 1;
        if p.cost >= budget {
            p.close(g + 1);
        }
    }
    if p.g0 < groups.len() {
        p.close(groups.len());
    }
    if dense {
        p.zeros(total);
    }
    p.tasks
}

/// The state of [`plan`]: the open run of groups `g0..` over span `s0..end`.
struct Planner {
    tasks: Vec<Task>,
    dim: usize,
    /// Units per zero-only task.
    chunk: usize,
    g0: usize,
    s0: usize,
    end: usize,
    cost: usize,
}

impl Planner {
    /// Ends the open run before group `g`.
    fn close(&mut self, g: usize) {
        self.tasks.push(Task {
            groups: self.g0..g,
            span: self.s0..self.end,
            cols: 0..self.dim,
        });
        (self.g0, self.s0, self.cost) = (g, self.end, 0);
    }

    /// Zero-only tasks from the open (empty) run's start up to `unit`.
    fn zeros(&mut self, unit: usize) {
        while self.s0 < unit {
            let end = (self.s0 + self.chunk).min(unit);
            self.tasks.push(Task {
                groups: self.g0..self.g0,
                span: self.s0..end,
                cols: 0..self.dim,
            });
            self.s0 = end;
        }
        (self.end, self.cost) = (unit, 0);
    }
}

/// Carves `buf` (`width` floats per span unit) into one slice per task, in
/// task order. Column-split tasks of one span share its unit, split by
/// columns when `width == dim`; a `width` of 0 gives empty slices.
pub(crate) fn carve<'a>(
    tasks: &[Task],
    buf: &'a mut [f32],
    width: usize,
    dim: usize,
) -> Vec<&'a mut [f32]> {
    let mut parts = Vec::with_capacity(tasks.len());
    let mut rest = buf;
    let mut at = 0; // the span unit `rest` starts at
    let mut i = 0;
    while i < tasks.len() {
        let t = &tasks[i];
        let skip = (t.span.start - at) * width;
        let take = t.span.len() * width;
        let (_, tail) = core::mem::take(&mut rest).split_at_mut(skip);
        let (mine, tail) = tail.split_at_mut(take);
        rest = tail;
        at = t.span.end;
        // The column-split tasks of this one span, if any.
        let mut j = i + 1;
        while j < tasks.len() && tasks[j].span == t.span && t.cols != (0..dim) {
            j += 1;
        }
        if j == i + 1 {
            parts.push(mine);
        } else if width == dim {
            let mut unit = mine;
            for task in &tasks[i..j] {
                let (piece, tail) = core::mem::take(&mut unit).split_at_mut(task.cols.len());
                parts.push(piece);
                unit = tail;
            }
        } else {
            // A width that does not follow the columns: only the first task
            // gets the unit (callers never split such rows).
            parts.push(mine);
            for _ in i + 1..j {
                parts.push(Default::default());
            }
        }
        i = j;
    }
    parts
}

/// Runs `body` on every task with its part of the table and of the state,
/// on the pool when `par`, else in order on the calling thread.
fn run<F>(par: bool, tasks: &[Task], table: Vec<&mut [f32]>, state: Vec<&mut [f32]>, body: F)
where
    F: Fn(&Task, &mut [f32], &mut [f32]) + Sync,
{
    let work = tasks.iter().zip(table).zip(state);
    if par {
        work.collect::<Vec<_>>()
            .into_par_iter()
            .for_each(|((t, a), b)| body(t, a, b));
    } else {
        work.for_each(|((t, a), b)| body(t, a, b));
    }
}

/// Checks a `padding_idx` that is already a row number.
fn check_padding(padding_idx: Option<usize>, rows: usize) -> Result<(), EmbeddingError> {
    match padding_idx {
        Some(p) if p >= rows => Err(EmbeddingError::PaddingIdxOutOfRange {
            padding_idx: i64::try_from(p).unwrap_or(i64::MAX),
            num_embeddings: rows,
        }),
        _ => Ok(()),
    }
}

/// The dense gradient of an embedding lookup, **overwriting** `grad_table`:
/// row `r` becomes the sum of `grad_output[p, :]` over the positions `p`
/// with `ids[p] == r`, in position order (divided by their count with
/// `scale_grad_by_freq`); untouched rows and `padding_idx` become zeros.
/// Every row is written once, in one sweep (no zeroing pass first).
///
/// The result has the bits of [`scatter_add`](crate::scatter_add) into a
/// zeroed gradient (without padding or scaling), on every thread count.
///
/// # Errors
/// A shape error, [`EmbeddingError::PaddingIdxOutOfRange`] or
/// [`EmbeddingError::IndexOutOfRange`]; then `grad_table` is untouched.
pub fn dense_backward<I: Index>(
    grad_output: &[f32],
    dim: usize,
    ids: &[I],
    padding_idx: Option<usize>,
    scale_grad_by_freq: bool,
    grad_table: &mut [f32],
) -> Result<(), EmbeddingError> {
    dense_backward_with(
        Parallelism::Auto,
        grad_output,
        dim,
        ids,
        padding_idx,
        scale_grad_by_freq,
        grad_table,
    )
}

/// [`dense_backward`] with an explicit [`Parallelism`].
pub fn dense_backward_with<I: Index>(
    par: Parallelism,
    grad_output: &[f32],
    dim: usize,
    ids: &[I],
    padding_idx: Option<usize>,
    scale_grad_by_freq: bool,
    grad_table: &mut [f32],
) -> Result<(), EmbeddingError> {
    let rows = table_rows(grad_table.len(), dim, Operand::GradTable)?;
    check_len(
        Operand::GradOutput,
        rows_len(ids.len(), dim)?,
        grad_output.len(),
    )?;
    check_padding(padding_idx, rows)?;
    let ids = ValidIds::new(ids, rows)?;
    if dim == 0 {
        return Ok(());
    }
    let split = par.splits(core::mem::size_of_val(grad_table), PARALLEL_MIN_BYTES);
    let source = PerPosition { grad_output, dim };
    let keep = |_, r| Some(r) != padding_idx;
    if fits_cache(grad_table) {
        dense_in_cache(ids, keep, &source, dim, scale_grad_by_freq, grad_table);
        return Ok(());
    }
    let groups = Groups::new_kept(ids, keep);
    dense_from(split, &groups, &source, dim, scale_grad_by_freq, grad_table);
    Ok(())
}

/// Whether a gradient table is small enough for [`dense_in_cache`].
#[inline]
pub(crate) fn fits_cache(grad_table: &[f32]) -> bool {
    core::mem::size_of_val(grad_table) < STREAM_MIN_BYTES
}

/// The dense gradient of a table that fits the caches (under 8 MiB): zero
/// it, then add each kept position's gradient row (times its scale) to its
/// row in position order, and divide by the counts at the end. The same
/// additions in the same order as the grouped sweep, so the same bits; the
/// zeroing happens in the cache, where it costs next to nothing, and the
/// gradient is read front to back instead of in row order. (On narrow,
/// 262 144 ids into a 6 MiB table, the grouped sweep took 17 ms on one
/// thread, most of it waiting on gradient rows read out of order.)
pub(crate) fn dense_in_cache<I: Index, S: Source>(
    ids: ValidIds<'_, I>,
    keep: impl Fn(usize, usize) -> bool,
    source: &S,
    dim: usize,
    divide_by_count: bool,
    grad_table: &mut [f32],
) {
    grad_table.fill(0.0);
    if dim == 0 {
        return;
    }
    let mut counts = vec![
        0u32;
        if divide_by_count {
            grad_table.len() / dim
        } else {
            0
        }
    ];
    for (p, r) in ids.rows().enumerate() {
        if !keep(p, r) {
            continue;
        }
        let dst = &mut grad_table[r * dim..(r + 1) * dim];
        let src = source.row(p, 0..dim);
        match source.scale(p) {
            None => row::add(dst, src),
            Some(s) => row::add_scaled(dst, src, s),
        }
        if divide_by_count {
            counts[r] += 1;
        }
    }
    for (r, &count) in counts.iter().enumerate() {
        if count > 1 {
            let count = count as f32;
            grad_table[r * dim..(r + 1) * dim]
                .iter_mut()
                .for_each(|x| *x /= count);
        }
    }
}

/// The dense sweep of [`dense_backward_with`] for any [`Source`]: every row
/// of `grad_table` (whole rows of `dim`) written once, sums or zeros.
pub(crate) fn dense_from<S: Source>(
    split: bool,
    groups: &Groups,
    source: &S,
    dim: usize,
    divide_by_count: bool,
    grad_table: &mut [f32],
) {
    if dim == 0 {
        return;
    }
    let rows = grad_table.len() / dim;
    let streaming = core::mem::size_of_val(grad_table) >= STREAM_MIN_BYTES;
    let tasks = plan(
        groups,
        dim,
        Space::Rows(Some(rows)),
        true,
        SWEEP_TASK_FLOATS,
    );
    let parts = carve(&tasks, grad_table, dim, dim);
    let none = tasks.iter().map(|_| Default::default()).collect();
    run(split, &tasks, parts, none, |t, part, _| {
        if t.cols != (0..dim) {
            // A column block of a hot row: summed in place.
            let positions = groups.positions(t.groups.start);
            sum_positions(source, positions, t.cols.clone(), divide_by_count, part);
            return;
        }
        // Trick 3: one sweep over the span, every row written once;
        // streamed past the caches when the table is larger than they are.
        let write = |dst: &mut [f32], src: Option<&[f32]>| match (streaming, src) {
            (true, _) => row::stream(dst, src),
            (false, Some(src)) => dst.copy_from_slice(src),
            (false, None) => dst.fill(0.0),
        };
        let mut sum = vec![0.0; dim];
        let mut next = 0; // the first row of `part` not yet written
        let ahead = prefetch_ahead(dim);
        let mut cursor = groups.starts[t.groups.start];
        for g in t.groups.clone() {
            groups.prefetch_through(g, ahead, source, &t.cols, &mut cursor);
            let r = groups.rows[g] - t.span.start;
            write(&mut part[next * dim..r * dim], None);
            let positions = groups.positions(g);
            sum_positions(source, positions, 0..dim, divide_by_count, &mut sum);
            write(&mut part[r * dim..(r + 1) * dim], Some(&sum));
            next = r + 1;
        }
        write(&mut part[next * dim..], None);
        if streaming {
            row::stream_fence();
        }
    });
}

/// The coalesced gradient of an embedding lookup: [`sparse_backward_with`]
/// with [`Parallelism::Auto`].
///
/// # Errors
/// As [`sparse_backward_with`].
pub fn sparse_backward<I: Index>(
    grad_output: &[f32],
    dim: usize,
    ids: &[I],
    num_embeddings: usize,
    padding_idx: Option<usize>,
    scale_grad_by_freq: bool,
) -> Result<SparseGrad, EmbeddingError> {
    sparse_backward_with(
        Parallelism::Auto,
        grad_output,
        dim,
        ids,
        num_embeddings,
        padding_idx,
        scale_grad_by_freq,
    )
}

/// The coalesced gradient of an embedding lookup into a table of
/// `num_embeddings` rows: the distinct ids of the batch (less
/// `padding_idx`), ascending, with their summed gradient rows (divided by
/// their count with `scale_grad_by_freq`). Costs `O(n log n + n · dim)` for
/// `n` ids, whatever `num_embeddings` is. Bits as [`dense_backward`]'s rows.
///
/// # Errors
/// A shape error, [`EmbeddingError::PaddingIdxOutOfRange`] or
/// [`EmbeddingError::IndexOutOfRange`].
pub fn sparse_backward_with<I: Index>(
    par: Parallelism,
    grad_output: &[f32],
    dim: usize,
    ids: &[I],
    num_embeddings: usize,
    padding_idx: Option<usize>,
    scale_grad_by_freq: bool,
) -> Result<SparseGrad, EmbeddingError> {
    check_len(
        Operand::GradOutput,
        rows_len(ids.len(), dim)?,
        grad_output.len(),
    )?;
    check_padding(padding_idx, num_embeddings)?;
    let ids = ValidIds::new(ids, num_embeddings)?;
    let split = par.splits(core::mem::size_of_val(grad_output), PARALLEL_MIN_BYTES);
    let groups = Groups::new(ids, padding_idx);
    let source = PerPosition { grad_output, dim };
    let values = coalesce_from(split, &groups, &source, dim, scale_grad_by_freq);
    // A copy: `rows` is one of the thread's spare vectors, sized for every
    // id; the caller's gradient gets one just large enough.
    Ok(SparseGrad::from_parts(
        groups.rows.clone(),
        values,
        num_embeddings,
        dim,
    ))
}

/// The summed rows of every group, in group order, for any [`Source`].
pub(crate) fn coalesce_from<S: Source>(
    split: bool,
    groups: &Groups,
    source: &S,
    dim: usize,
    divide_by_count: bool,
) -> Vec<f32> {
    let mut values = crate::memory::zeroed_table(groups.len() * dim);
    if dim == 0 {
        return values;
    }
    let tasks = plan(groups, dim, Space::Groups, true, TASK_FLOATS);
    let parts = carve(&tasks, &mut values, dim, dim);
    let none = tasks.iter().map(|_| Default::default()).collect();
    run(split, &tasks, parts, none, |t, part, _| {
        let ahead = prefetch_ahead(t.cols.len());
        let mut cursor = groups.starts[t.groups.start];
        for g in t.groups.clone() {
            groups.prefetch_through(g, ahead, source, &t.cols, &mut cursor);
            let at = (g - t.span.start) * t.cols.len();
            let dst = &mut part[at..at + t.cols.len()];
            sum_positions(
                source,
                groups.positions(g),
                t.cols.clone(),
                divide_by_count,
                dst,
            );
        }
    });
    values
}

/// The table side of a fused update, checked: the weight, its row width, the
/// optimiser state and which row never changes.
pub(crate) struct Target<'a> {
    pub(crate) weight: &'a mut [f32],
    pub(crate) dim: usize,
    pub(crate) state: &'a mut [f32],
    pub(crate) padding_idx: Option<usize>,
}

/// The fused sparse update: groups `ids`, sums each touched row's gradient
/// (position order, divided by the count with `scale_grad_by_freq`), and
/// applies `rule` to the row straight away. No gradient is materialised.
/// The caller has checked `target`, `grad_output` and the ids.
pub(crate) fn fused_update<I: Index, R: RowRule>(
    par: Parallelism,
    grad_output: &[f32],
    ids: ValidIds<'_, I>,
    scale_grad_by_freq: bool,
    target: Target<'_>,
    rule: &R,
) {
    let split = par.splits(core::mem::size_of_val(grad_output), PARALLEL_MIN_BYTES);
    let groups = Groups::new(ids, target.padding_idx);
    let dim = target.dim;
    let source = PerPosition { grad_output, dim };
    apply_groups(split, &groups, &source, scale_grad_by_freq, target, rule);
}

/// Applies a coalesced gradient with `rule` (its padding row, if it holds
/// one, is skipped). The caller has checked that `grad` fits `target`.
pub(crate) fn apply_sparse<R: RowRule>(
    par: Parallelism,
    grad: &SparseGrad,
    target: Target<'_>,
    rule: &R,
) {
    let split = par.splits(core::mem::size_of_val(grad.values()), PARALLEL_MIN_BYTES);
    let mut groups = Groups::of_sparse(grad);
    if let Some(skip) = target.padding_idx {
        if let Ok(k) = groups.rows.binary_search(&skip) {
            groups.rows.remove(k);
            groups.positions.remove(k);
            groups.starts.pop();
        }
    }
    let source = PerPosition {
        grad_output: grad.values(),
        dim: target.dim,
    };
    apply_groups(split, &groups, &source, false, target, rule);
}

/// Calls `f` once on each row of `weight` that `groups` touch, on the pool
/// when `par` (rows are disjoint, so the order does not matter).
pub(crate) fn for_each_row<F>(par: bool, groups: &Groups, weight: &mut [f32], dim: usize, f: F)
where
    F: Fn(&mut [f32]) + Sync,
{
    if dim == 0 || groups.len() == 0 {
        return;
    }
    let tasks = plan(groups, dim, Space::Rows(None), false, TASK_FLOATS);
    let parts = carve(&tasks, weight, dim, dim);
    let none = tasks.iter().map(|_| Default::default()).collect();
    run(par, &tasks, parts, none, |t, part, _| {
        for g in t.groups.clone() {
            let r = groups.rows[g] - t.span.start;
            f(&mut part[r * dim..(r + 1) * dim]);
        }
    });
}

/// The shared body of the fused updates, for any [`Source`].
pub(crate) fn apply_groups<S: Source, R: RowRule>(
    split: bool,
    groups: &Groups,
    source: &S,
    divide_by_count: bool,
    target: Target<'_>,
    rule: &R,
) {
    let dim = target.dim;
    if dim == 0 || groups.len() == 0 {
        return;
    }
    let width = rule.state_width(dim);
    let tasks = plan(
        groups,
        dim,
        Space::Rows(None),
        width == dim || width == 0,
        TASK_FLOATS,
    );
    let weights = carve(&tasks, target.weight, dim, dim);
    let states = carve(&tasks, target.state, width, dim);
    run(split, &tasks, weights, states, |t, weight, state| {
        let mut sum = vec![0.0; t.cols.len()];
        let whole = t.cols == (0..dim);
        let ahead = prefetch_ahead(t.cols.len());
        let mut cursor = groups.starts[t.groups.start];
        for g in t.groups.clone() {
            groups.prefetch_through(g, ahead, source, &t.cols, &mut cursor);
            if whole && g + ahead < t.groups.end {
                let next = groups.rows[g + ahead] - t.span.start;
                row::prefetch(&weight[next * dim..(next + 1) * dim]);
                row::prefetch(&state[next * width..(next + 1) * width]);
            }
            let r = groups.rows[g] - t.span.start;
            let (w, s) = if whole {
                (
                    &mut weight[r * dim..(r + 1) * dim],
                    &mut state[r * width..(r + 1) * width],
                )
            } else {
                (&mut weight[..], &mut state[..])
            };
            let positions = groups.positions(g);
            sum_positions(source, positions, t.cols.clone(), divide_by_count, &mut sum);
            rule.update(w, &sum, s);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic stream of numbers for the cases below.
    fn mix(state: &mut u64) -> u64 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *state >> 33
    }

    fn groups_of(rows: usize, ids: &[usize]) -> Groups {
        Groups::new(ValidIds::new(ids, rows).unwrap(), None)
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn the_packed_sort_groups_as_the_wide_one_does() {
        let mut seed = 0x9e37;
        for case in 0..200 {
            let rows = 1 + mix(&mut seed) as usize % (1 << (case % 24));
            let n = mix(&mut seed) as usize % 3000;
            let ids: Vec<usize> = (0..n).map(|_| mix(&mut seed) as usize % rows).collect();
            let ids = ValidIds::new(&ids, rows).unwrap();
            let skip = mix(&mut seed) as usize % rows;
            let keep = |p: usize, r: usize| r != skip && p % 7 != 3;
            let bits = usize::BITS - (rows - 1).leading_zeros();
            let packed = Groups::new_packed(ids, keep, bits);
            let wide = Groups::new_wide(ids, keep, bits);
            assert_eq!(packed.rows, wide.rows, "rows {rows} n {n}");
            assert_eq!(packed.starts, wide.starts, "rows {rows} n {n}");
            assert_eq!(packed.positions, wide.positions, "rows {rows} n {n}");
        }
    }

    #[test]
    fn groups_sort_rows_and_keep_positions_in_order() {
        let g = groups_of(10, &[7, 2, 7, 0, 2, 7]);
        assert_eq!(g.rows, [0, 2, 7]);
        assert_eq!(g.positions(0), [3]);
        assert_eq!(g.positions(1), [1, 4]);
        assert_eq!(g.positions(2), [0, 2, 5]);
        let skipped = Groups::new(ValidIds::new(&[7usize, 2, 7], 10).unwrap(), Some(7));
        assert_eq!(skipped.rows, [2]);
        assert_eq!(skipped.positions(0), [1]);
    }

    /// Every plan, for many shapes and tiny budgets: spans are disjoint and
    /// ascending (column blocks of one row excepted, which tile the row),
    /// every group sits in exactly one task (or all of a row's blocks) inside
    /// its span, and a dense plan covers every row.
    #[test]
    fn plans_partition_the_work() {
        let mut seed = 1;
        for _ in 0..400 {
            let rows = 1 + mix(&mut seed) as usize % 200;
            let dim = 1 + mix(&mut seed) as usize % 80;
            let n = mix(&mut seed) as usize % 300;
            let hot = mix(&mut seed) as usize % rows;
            let ids: Vec<usize> = (0..n)
                .map(|_| {
                    if mix(&mut seed).is_multiple_of(3) {
                        hot
                    } else {
                        mix(&mut seed) as usize % rows
                    }
                })
                .collect();
            let groups = groups_of(rows, &ids);
            let budget = 1 + mix(&mut seed) as usize % 4000;
            for space in [Space::Rows(Some(rows)), Space::Rows(None), Space::Groups] {
                for split_hot in [false, true] {
                    let tasks = plan(&groups, dim, space, split_hot, budget);
                    let what = format!(
                        "rows {rows} dim {dim} n {n} budget {budget} {space:?} {split_hot}"
                    );
                    let mut seen = vec![0usize; groups.len()];
                    let mut covered = 0;
                    for (k, t) in tasks.iter().enumerate() {
                        assert!(
                            t.cols.start < t.cols.end && t.cols.end <= dim,
                            "{what}: {t:?}"
                        );
                        if t.cols != (0..dim) {
                            assert!(
                                split_hot && t.groups.len() == 1 && t.span.len() == 1,
                                "{what}"
                            );
                            assert_eq!(t.cols.start % LINE, 0, "{what}: blocks of whole lines");
                        }
                        let continues = k > 0 && tasks[k - 1].span == t.span && t.cols.start > 0;
                        if continues {
                            assert_eq!(tasks[k - 1].cols.end, t.cols.start, "{what}");
                        } else {
                            assert!(t.span.start >= covered, "{what}: {tasks:?}");
                            if space == Space::Rows(Some(rows)) {
                                assert_eq!(t.span.start, covered, "{what}: gap before {t:?}");
                            }
                            covered = t.span.end;
                        }
                        for g in t.groups.clone() {
                            let unit = match space {
                                Space::Groups => g,
                                Space::Rows(_) => groups.rows[g],
                            };
                            assert!(t.span.contains(&unit), "{what}: {t:?} {unit}");
                            if t.cols.start == 0 {
                                seen[g] += 1;
                            }
                        }
                    }
                    assert!(seen.iter().all(|&c| c == 1), "{what}: {seen:?}");
                    if space == Space::Rows(Some(rows)) {
                        assert_eq!(covered, rows, "{what}");
                    }
                }
            }
        }
    }

    #[test]
    fn carving_hands_each_task_its_own_rows() {
        let groups = groups_of(50, &[3, 3, 3, 3, 3, 3, 3, 3, 9, 10, 40]);
        let dim = 64;
        let tasks = plan(&groups, dim, Space::Rows(Some(50)), true, 64 * 4);
        let mut table: Vec<f32> = (0..50 * dim).map(|x| x as f32).collect();
        let parts = carve(&tasks, &mut table, dim, dim);
        assert_eq!(parts.len(), tasks.len());
        for (t, part) in tasks.iter().zip(parts) {
            let first = (t.span.start * dim + t.cols.start) as f32;
            assert_eq!(part.first().copied(), Some(first), "{t:?}");
            let len = if t.cols == (0..dim) {
                t.span.len() * dim
            } else {
                t.cols.len()
            };
            assert_eq!(part.len(), len, "{t:?}");
        }
    }
}
