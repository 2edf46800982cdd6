//! The dense gradient: every row of the gradient table written once, a
//! touched row's sum or an untouched row's zeros.
//!
//! [`dense`] chooses how. A gradient table under
//! [`STREAM_MIN_BYTES`] fits the caches: it is zeroed and every kept
//! position's row is added in position order, the gradient read front to
//! back ([`InCache`]). A larger one is swept once in row order from the
//! grouping, each task writing its span of rows with streaming stores
//! ([`Sweep`], tricks 2 and 3 of the folder's notes). Both make the same
//! additions in the same order, so both give the same bits.

use super::plan::{Space, Task, TaskBody, carve, plan, run};
use super::{Groups, PerPosition, Source, check_padding, sum_positions};
use crate::error::{EmbeddingError, Operand};
use crate::index::{AnyValidIds, Index, RowId, ValidIds, each_row_type, run_rows};
use crate::kernels::tuning::{
    PARALLEL_MIN_BYTES, STREAM_MIN_BYTES, SWEEP_TASK_BYTES, prefetch_ahead,
};
use crate::parallel::Parallelism;
use crate::shape::{check_len, rows_len, table_rows};
use crate::simd::{Body, Isa, Lanes, row, stream};
use core::ops::Range;

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
///
/// # Errors
/// As [`dense_backward`].
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
    dense_backward_valid(
        par,
        grad_output,
        dim,
        ids.by_row(),
        padding_idx,
        scale_grad_by_freq,
        grad_table,
    )
}

/// [`dense_backward_with`] once every argument is checked: a layer checks
/// the ids against its own row count (which a table of width 0 cannot
/// tell), then calls this. Fails only when the allocator refuses its
/// workspace, before any write. Not generic ([`ByRow`](crate::index::ByRow)): compiled here, once.
pub(crate) fn dense_backward_valid(
    par: Parallelism,
    grad_output: &[f32],
    dim: usize,
    ids: AnyValidIds<'_>,
    padding_idx: Option<usize>,
    scale_grad_by_freq: bool,
    grad_table: &mut [f32],
) -> Result<(), EmbeddingError> {
    let source = PerPosition { grad_output, dim };
    let keep = |_, r| Some(r) != padding_idx;
    let divide = scale_grad_by_freq;
    each_row_type!(ids, |ids| dense(
        par, ids, keep, &source, dim, divide, grad_table
    ))
}

/// The dense gradient of any [`Source`], **overwriting** `grad_table` (whole
/// rows of `dim`): the positions `p` (with row `r`) for which `keep(p, r)`
/// add their rows, in position order; every other row is zeros. Summed in
/// the caches or swept (the module notes); the arguments are checked. Fails
/// only for a workspace the allocator refuses, before `grad_table` is
/// written.
pub(crate) fn dense<I: RowId, S: Source>(
    par: Parallelism,
    ids: ValidIds<'_, I>,
    keep: impl Fn(usize, usize) -> bool,
    source: &S,
    dim: usize,
    divide_by_count: bool,
    grad_table: &mut [f32],
) -> Result<(), EmbeddingError> {
    if dim == 0 {
        return Ok(());
    }
    let bytes = core::mem::size_of_val(grad_table);
    if bytes < STREAM_MIN_BYTES {
        run_rows::<I, _>(
            Isa::detect(),
            InCache {
                ids,
                keep,
                source,
                dim,
                divide_by_count,
                grad_table,
            },
        );
        return Ok(());
    }
    let groups = Groups::new_kept(ids, keep)?;
    let rows = grad_table.len() / dim;
    let tasks = plan(
        &groups,
        dim,
        Space::Rows(Some(rows)),
        true,
        SWEEP_TASK_BYTES / 4,
    );
    let parts = carve(&tasks, grad_table, dim, dim);
    let none = tasks.iter().map(|_| Default::default()).collect();
    let sweep = Sweep {
        groups: &groups,
        source,
        dim,
        divide_by_count,
    };
    let split = par.splits(bytes, PARALLEL_MIN_BYTES);
    run(split, &tasks, parts, none, &sweep);
    Ok(())
}

/// The dense gradient of a table that fits the caches: zero it, then add
/// each kept position's gradient row (times its scale) to its row in
/// position order, and divide by the counts at the end. The same additions
/// in the same order as the sweep, so the same bits; the zeroing happens in
/// the cache, where it costs next to nothing, and the gradient is read front
/// to back instead of in row order. (On narrow, 262 144 ids into a 6 MiB
/// table, the sweep spent most of its time waiting on gradient rows read
/// out of order.)
struct InCache<'a, 'i, I: RowId, K, S> {
    ids: ValidIds<'i, I>,
    keep: K,
    source: &'a S,
    dim: usize,
    divide_by_count: bool,
    grad_table: &'a mut [f32],
}

impl<I: RowId, K: Fn(usize, usize) -> bool, S: Source> Body for InCache<'_, '_, I, K, S> {
    type Output = ();

    #[inline(always)]
    fn run<V: Lanes>(self) {
        let InCache {
            ids,
            keep,
            source,
            dim,
            divide_by_count,
            grad_table,
        } = self;
        grad_table.fill(0.0);
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
            add_position::<V, S>(source, p, 0..dim, &mut grad_table[r * dim..(r + 1) * dim]);
            if divide_by_count {
                counts[r] += 1;
            }
        }
        for (r, &count) in counts.iter().enumerate() {
            divide(&mut grad_table[r * dim..(r + 1) * dim], count as usize);
        }
    }
}

/// One sweep task: its span of rows written once, sums or zeros, streamed
/// past the caches (trick 3); or, for a column block of a hot row, that
/// block's sum (`sum_positions`) stored in place.
struct Sweep<'a, S> {
    groups: &'a Groups,
    source: &'a S,
    dim: usize,
    divide_by_count: bool,
}

impl<S: Source> TaskBody for Sweep<'_, S> {
    #[inline(always)]
    fn task<V: Lanes>(&self, t: &Task, part: &mut [f32], _state: &mut [f32]) {
        let (groups, source, dim) = (self.groups, self.source, self.dim);
        if t.cols != (0..dim) {
            let positions = groups.positions(t.groups.start);
            sum_positions::<V, S, _>(
                source,
                positions,
                t.cols.clone(),
                self.divide_by_count,
                part,
            );
            return;
        }
        let mut sum = vec![0.0; dim];
        let mut next = 0; // the first row of `part` not yet written
        let ahead = prefetch_ahead(dim);
        let mut cursor = groups.starts[t.groups.start];
        for g in t.groups.clone() {
            groups.prefetch_through(g, ahead, source, &t.cols, &mut cursor);
            let r = groups.rows[g] - t.span.start;
            V::stream(&mut part[next * dim..r * dim], None);
            let positions = groups.positions(g);
            add_positions::<V, S>(source, positions, dim, self.divide_by_count, &mut sum);
            V::stream(&mut part[r * dim..(r + 1) * dim], Some(&sum));
            next = r + 1;
        }
        V::stream(&mut part[next * dim..], None);
        stream::fence();
    }
}

/// The sweep's sum of a group: `sum` zeroed, then each position's row
/// added in place, divided by the count for `scale_grad_by_freq`: the bits
/// of [`sum_positions`], through a buffer in L1 rather than in registers.
/// The sweep then streams `sum` to the table at once; summed in registers
/// and stored just before that, recsys's dense backward was slower, where
/// the sparse and fused sums gained (docs/design.md, "The grouped
/// backward").
#[inline(always)]
fn add_positions<V: Lanes, S: Source>(
    source: &S,
    positions: &[usize],
    dim: usize,
    divide_by_count: bool,
    sum: &mut [f32],
) {
    sum.fill(0.0);
    for &p in positions {
        add_position::<V, S>(source, p, 0..dim, sum);
    }
    if divide_by_count {
        divide(sum, positions.len());
    }
}

/// `sum /= count` where more than one position was summed
/// (`scale_grad_by_freq`; a sum of one is already its mean).
#[inline(always)]
fn divide(sum: &mut [f32], count: usize) {
    if count > 1 {
        let count = count as f32;
        sum.iter_mut().for_each(|x| *x /= count);
    }
}

/// `dst += row(p) × scale(p)` for one position, the product rounded first.
#[inline(always)]
fn add_position<V: Lanes, S: Source>(source: &S, p: usize, cols: Range<usize>, dst: &mut [f32]) {
    let src = source.row(p, cols);
    match source.scale(p) {
        None => row::add::<V>(dst, src),
        Some(s) => row::add_scaled::<V>(dst, src, s),
    }
}
