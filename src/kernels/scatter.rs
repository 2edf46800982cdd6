//! Backward: scatter-add output gradients into the table's gradient.
//!
//! ```text
//! check grad_table shape, grad_output length, every id   (nothing written)
//! serial:   for p in 0..n:  grad_table[ids[p], :] += grad_output[p, :]
//! parallel: groups = positions grouped by id (IdGroups, stable)
//!           cut the groups into tasks of about equal positions
//!           each task, for each of its groups g, in position order:
//!               grad_table[id(g), cols] += grad_output[p, cols]
//! ```
//!
//! 1. **Determinism without atomics.** A row of `grad_table` is the sum of its
//!    starting value and its gradients *in position order*, whatever the
//!    thread count: the serial loop does exactly that, and in the parallel
//!    driver every row (or column block of a row) belongs to one task, which
//!    walks its positions ascending. So every path gives the bits of the
//!    sequential loop, which are also the bits of the one-hot reference.
//! 2. **Disjoint rows, safely.** The grouped ids are ascending, so
//!    `split_at_mut` peels the touched rows off `grad_table` one after
//!    another in a single walk. Tasks own disjoint runs of those row slices;
//!    there is no `unsafe` and no shared write.
//! 3. **Balance.** Tasks are cut by number of positions, not of rows, about
//!    `n / (8 · threads)` each, so skewed id distributions still spread.
//! 4. **Hot ids.** A single id holding more than a task's share of the
//!    positions (say 90 % of them) would serialise the call. Its row is cut
//!    into column blocks of whole cache lines (multiples of 16 floats), one
//!    task each; every block still sums its positions in order.
//! 5. **Prefetch.** Within a group the gradient rows are scattered through
//!    `grad_output`; the loop prefetches the row `AHEAD` positions on.
//! 6. **Small calls** (under [`PARALLEL_MIN_BYTES`] of gradient, or a
//!    one-thread pool) skip the grouping and run the serial loop.

use super::group::IdGroups;
use super::partition::Partition;
use super::{row, Parallelism, PARALLEL_MIN_BYTES};
use crate::error::{EmbeddingError, Operand};
use crate::index::{Index, ValidIds};
use crate::shape::{check_len, rows_len, table_rows};
use rayon::prelude::*;

/// How many positions ahead the loops prefetch gradient rows.
const AHEAD: usize = 8;

/// Column blocks of a split hot row are multiples of this many floats (one
/// 64-byte cache line), so two threads never write the same line.
const COL_BLOCK: usize = 16;

/// Tasks per thread in the parallel driver: a few, so a thread that drew
/// cheap rows picks up more.
const TASKS_PER_THREAD: usize = 1;

/// `grad_table[ids[i], :] += grad_output[i, :]` for every `i`, accumulating
/// into what `grad_table` already holds.
///
/// `grad_output` must hold `ids.len() × dim` values and `grad_table` a whole
/// number of rows. The result is bitwise identical to the sequential loop for
/// any thread count and any pattern of repeated ids.
///
/// # Errors
/// A shape error or [`EmbeddingError::IndexOutOfRange`]; then `grad_table`
/// is untouched.
///
/// # Example
/// ```
/// use embedding_kernels::scatter_add;
/// let mut grad = [0.0f32; 6]; // 3 rows of dim 2
/// scatter_add(&[1.0, 2.0, 10.0, 20.0, 100.0, 200.0], 2, &[2u32, 0, 2], &mut grad)?;
/// assert_eq!(grad, [10.0, 20.0, 0.0, 0.0, 101.0, 202.0]);
/// # Ok::<(), embedding_kernels::EmbeddingError>(())
/// ```
pub fn scatter_add<I: Index>(
    grad_output: &[f32],
    dim: usize,
    ids: &[I],
    grad_table: &mut [f32],
) -> Result<(), EmbeddingError> {
    scatter_add_with(Parallelism::Rayon, grad_output, dim, ids, grad_table)
}

/// [`scatter_add`] with an explicit [`Parallelism`].
pub fn scatter_add_with<I: Index>(
    par: Parallelism,
    grad_output: &[f32],
    dim: usize,
    ids: &[I],
    grad_table: &mut [f32],
) -> Result<(), EmbeddingError> {
    let ids = check(grad_output, dim, ids, grad_table)?;
    if dim == 0 || ids.is_empty() {
        return Ok(());
    }
    if par.splits(core::mem::size_of_val(grad_output), PARALLEL_MIN_BYTES) {
        parallel(grad_output, dim, ids, grad_table);
    } else {
        serial(grad_output, dim, ids, grad_table);
    }
    Ok(())
}

/// The front door: every check, in the crate's order, before any write.
pub(crate) fn check<'a, I: Index>(
    grad_output: &[f32],
    dim: usize,
    ids: &'a [I],
    grad_table: &[f32],
) -> Result<ValidIds<'a, I>, EmbeddingError> {
    let rows = table_rows(grad_table.len(), dim, Operand::GradTable)?;
    let len = rows_len(ids.len(), dim)?;
    check_len(Operand::GradOutput, len, grad_output.len())?;
    ValidIds::new(ids, rows)
}

/// The sequential loop, in position order.
fn serial<I: Index>(grad_output: &[f32], dim: usize, ids: ValidIds<'_, I>, grad_table: &mut [f32]) {
    let n = ids.len();
    for (p, src) in grad_output.chunks_exact(dim).enumerate() {
        if p + AHEAD < n {
            let ahead = ids.row(p + AHEAD) * dim;
            row::prefetch(&grad_table[ahead..ahead + dim]);
        }
        let start = ids.row(p) * dim;
        row::add(&mut grad_table[start..start + dim], src);
    }
}

/// One unit of parallel work.
enum Task<'a> {
    /// Whole rows `lo..`: `rows` holds them, `positions` touch only them.
    Rows {
        lo: usize,
        positions: &'a [usize],
        rows: &'a mut [f32],
    },
    /// Columns `col..col + cols.len()` of the one row all `positions` touch.
    Cols {
        col: usize,
        positions: &'a [usize],
        cols: &'a mut [f32],
    },
}

fn parallel<I: Index>(
    grad_output: &[f32],
    dim: usize,
    ids: ValidIds<'_, I>,
    grad_table: &mut [f32],
) {
    let share = ids
        .len()
        .div_ceil(rayon::current_num_threads() * TASKS_PER_THREAD)
        .max(1);
    let part = Partition::new(&ids, share);

    // Hand each list its own rows (trick 2) and, for a hot row, its own
    // column blocks (trick 4).
    let mut tasks: Vec<Task<'_>> = Vec::with_capacity(part.lists.len());
    let mut rest = grad_table;
    let mut rest_lo = 0;
    for list in &part.lists {
        let (_, tail) = core::mem::take(&mut rest).split_at_mut((list.lo - rest_lo) * dim);
        let (rows, tail) = tail.split_at_mut((list.hi - list.lo) * dim);
        rest = tail;
        rest_lo = list.hi;
        let positions = &part.positions[list.start..list.end];
        let count = positions.len();
        if count == 0 {
            continue;
        }
        if count > share && list.hi - list.lo == 1 && dim >= 2 * COL_BLOCK {
            let blocks = count.div_ceil(share).min(dim / COL_BLOCK);
            let width = (dim / blocks).next_multiple_of(COL_BLOCK);
            for (b, cols) in rows.chunks_mut(width).enumerate() {
                tasks.push(Task::Cols {
                    col: b * width,
                    positions,
                    cols,
                });
            }
        } else {
            tasks.push(Task::Rows {
                lo: list.lo,
                positions,
                rows,
            });
        }
    }

    tasks.into_par_iter().for_each(|task| match task {
        Task::Rows {
            lo,
            positions,
            rows,
        } => {
            for (k, &p) in positions.iter().enumerate() {
                if let Some(&ahead) = positions.get(k + AHEAD) {
                    // Both streams are sparse here: prefetch both.
                    let start = (ids.row(ahead) - lo) * dim;
                    row::prefetch(&rows[start..start + dim]);
                    row::prefetch(&grad_output[ahead * dim..(ahead + 1) * dim]);
                }
                let start = (ids.row(p) - lo) * dim;
                row::add(
                    &mut rows[start..start + dim],
                    &grad_output[p * dim..(p + 1) * dim],
                );
            }
        }
        Task::Cols {
            col,
            positions,
            cols,
        } => {
            let width = cols.len();
            for (k, &p) in positions.iter().enumerate() {
                if let Some(&ahead) = positions.get(k + AHEAD) {
                    let start = ahead * dim + col;
                    row::prefetch(&grad_output[start..start + width]);
                }
                let start = p * dim + col;
                row::add(cols, &grad_output[start..start + width]);
            }
        }
    });
}

/// The former driver: positions grouped by id (kept for comparison).
#[doc(hidden)]
pub fn scatter_add_grouped<I: Index>(
    grad_output: &[f32],
    dim: usize,
    ids: &[I],
    grad_table: &mut [f32],
) -> Result<(), EmbeddingError> {
    let ids = check(grad_output, dim, ids, grad_table)?;
    if dim == 0 || ids.is_empty() {
        return Ok(());
    }
    parallel_grouped(grad_output, dim, &IdGroups::new(&ids), grad_table);
    Ok(())
}

/// One unit of parallel work.
enum GTask<'a, 'b> {
    /// Whole rows: `rows[k]` is the row of group `first + k`.
    Rows {
        first: usize,
        rows: &'a mut [&'b mut [f32]],
    },
    /// Columns `col..col + cols.len()` of the row of group `group`.
    Cols {
        group: usize,
        col: usize,
        cols: &'a mut [f32],
    },
}

fn parallel_grouped(grad_output: &[f32], dim: usize, groups: &IdGroups, grad_table: &mut [f32]) {
    // Peel the touched rows off the table, ids ascending (trick 2).
    let mut rows: Vec<&mut [f32]> = Vec::with_capacity(groups.len());
    let mut rest = grad_table;
    let mut rest_start = 0;
    for &id in groups.ids() {
        let (_, tail) = rest.split_at_mut((id - rest_start) * dim);
        let (row, tail) = tail.split_at_mut(dim);
        rows.push(row);
        rest = tail;
        rest_start = id + 1;
    }

    let n = grad_output.len() / dim;
    let share = n
        .div_ceil(rayon::current_num_threads() * TASKS_PER_THREAD)
        .max(1);
    let mut tasks: Vec<GTask<'_, '_>> = Vec::new();
    let mut rows_left: &mut [&mut [f32]] = &mut rows;
    let mut group = 0;
    while group < groups.len() {
        // Gather whole groups until the task holds about `share` positions.
        let first = group;
        let mut positions = 0;
        while group < groups.len() && (positions == 0 || positions + groups.count(group) <= share) {
            positions += groups.count(group);
            group += 1;
        }
        let hot = group - first == 1 && positions > share && dim >= 2 * COL_BLOCK;
        let (mine, later) = core::mem::take(&mut rows_left).split_at_mut(group - first);
        rows_left = later;
        if hot {
            // Trick 4: one task per column block of this row.
            let blocks = positions.div_ceil(share).min(dim / COL_BLOCK);
            let width = (dim / blocks).next_multiple_of(COL_BLOCK);
            let row: &mut [f32] = &mut *mine[0];
            for (b, cols) in row.chunks_mut(width).enumerate() {
                tasks.push(GTask::Cols {
                    group: first,
                    col: b * width,
                    cols,
                });
            }
        } else {
            tasks.push(GTask::Rows { first, rows: mine });
        }
    }

    tasks.into_par_iter().for_each(|task| match task {
        GTask::Rows { first, rows } => {
            for (k, dst) in rows.iter_mut().enumerate() {
                add_group(grad_output, dim, groups.positions(first + k), 0, dst);
            }
        }
        GTask::Cols { group, col, cols } => {
            add_group(grad_output, dim, groups.positions(group), col, cols)
        }
    });
}

/// `dst += grad_output[p, col..col + dst.len()]` for each `p`, in order.
#[inline(always)]
fn add_group(grad_output: &[f32], dim: usize, positions: &[usize], col: usize, dst: &mut [f32]) {
    let width = dst.len();
    for (k, &p) in positions.iter().enumerate() {
        if let Some(&ahead) = positions.get(k + AHEAD) {
            let start = ahead * dim + col;
            row::prefetch(&grad_output[start..start + width]);
        }
        let start = p * dim + col;
        row::add(dst, &grad_output[start..start + width]);
    }
}
