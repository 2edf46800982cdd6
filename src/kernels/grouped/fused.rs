//! Sparse optimiser updates fused into the backward: each touched row's
//! gradient is summed and handed to the optimiser's [`RowRule`] at once, so
//! no gradient is ever materialised.

use super::plan::{Space, Task, TaskBody, carve, plan, run};
use super::{Groups, PerPosition, Source, check_padding, sum_positions};
use crate::error::{EmbeddingError, Operand};
use crate::index::{Index, ValidIds};
use crate::kernels::tuning::{GROUP_TASK_BYTES, PARALLEL_MIN_BYTES, prefetch_ahead};
use crate::optim::SparseOptimizer;
use crate::parallel::Parallelism;
use crate::shape::{check_len, rows_len, table_rows};
use crate::simd::Lanes;
use crate::simd::prefetch::{self, L1};
use crate::sparse_grad::SparseGrad;

mod sealed {
    /// One optimiser step on one row: what the fused updates apply. The
    /// optimisers of [`optim`](crate::optim) implement it.
    pub trait RowRule: Sync {
        /// Floats of state per row: 0 (SGD), 1 (row-wise Adagrad) or `dim`
        /// (Adagrad).
        fn state_width(&self, dim: usize) -> usize;
        /// Applies the update to `weight` (the row's columns), given `grad`
        /// (the same columns' summed gradient) and the row's `state` (of
        /// `state_width` floats, or the same columns when that is `dim`).
        fn update(&self, weight: &mut [f32], grad: &[f32], state: &mut [f32]);
    }
}

pub(crate) use sealed::RowRule;

/// One sparse training step on a table the caller holds: the lookup's
/// gradient rows summed per touched row (less `padding_idx`, divided by
/// the id's count with `scale_grad_by_freq`) and handed at once to
/// `optimizer`'s rule, so no gradient is stored and untouched rows are not
/// read. [`sparse_step_with`] with [`Parallelism::Auto`].
///
/// # Errors
/// As [`sparse_step_with`].
pub fn sparse_step<I: Index, O: SparseOptimizer>(
    table: &mut [f32],
    dim: usize,
    grad_output: &[f32],
    ids: &[I],
    padding_idx: Option<usize>,
    scale_grad_by_freq: bool,
    optimizer: &mut O,
) -> Result<(), EmbeddingError> {
    sparse_step_with(
        Parallelism::Auto,
        table,
        dim,
        grad_output,
        ids,
        padding_idx,
        scale_grad_by_freq,
        optimizer,
    )
}

/// [`sparse_step`] with an explicit [`Parallelism`]: the step of
/// [`Embedding::sparse_step`](crate::Embedding::sparse_step), with the same
/// bits on every thread count, on a table of `table.len() / dim` rows that
/// the caller owns (a NumPy array, a framework's tensor). An optimiser with
/// state ([`Adagrad`](crate::Adagrad), [`RowWiseAdagrad`](crate::RowWiseAdagrad))
/// makes it for this table's shape on its first step and refuses a table
/// of another shape afterwards.
///
/// # Errors
/// In this order: [`EmbeddingError::ZeroDimWithData`] or
/// [`EmbeddingError::NotMultipleOfDim`] for the table,
/// [`EmbeddingError::LengthMismatch`] for `grad_output` (`ids.len() × dim`),
/// [`EmbeddingError::PaddingIdxOutOfRange`],
/// [`EmbeddingError::IndexOutOfRange`] for the first bad id, the
/// optimiser's own errors (a bad hyper-parameter, a state made for another
/// shape), then [`EmbeddingError::AllocationFailed`] for the workspace or a
/// first step's state. On any error the table and the optimiser (its
/// state and step count) are as they were.
#[allow(clippy::too_many_arguments)]
pub fn sparse_step_with<I: Index, O: SparseOptimizer>(
    par: Parallelism,
    table: &mut [f32],
    dim: usize,
    grad_output: &[f32],
    ids: &[I],
    padding_idx: Option<usize>,
    scale_grad_by_freq: bool,
    optimizer: &mut O,
) -> Result<(), EmbeddingError> {
    let rows = table_rows(table.len(), dim, Operand::Table)?;
    check_len(
        Operand::GradOutput,
        rows_len(ids.len(), dim)?,
        grad_output.len(),
    )?;
    check_padding(padding_idx, rows)?;
    let valid = ValidIds::new(ids, rows)?;
    optimizer.check_step(rows, dim)?;
    let groups = Groups::new(valid, padding_idx)?;
    let (rule, state) = optimizer.begin_step(rows, dim)?;
    let target = Target {
        weight: table,
        dim,
        state,
    };
    fused_update(par, grad_output, &groups, scale_grad_by_freq, target, &rule);
    Ok(())
}

/// The table side of a fused update, checked: the weight, its row width and
/// the optimiser state. (The row that never changes is left out of the
/// groups.)
pub(crate) struct Target<'a> {
    pub(crate) weight: &'a mut [f32],
    pub(crate) dim: usize,
    pub(crate) state: &'a mut [f32],
}

/// The fused sparse update of an embedding lookup: [`update`] with the
/// lookup's own gradient rows. `groups` are the checked ids grouped without
/// `padding_idx` (`Groups::new(ids, padding_idx)`), built before the
/// optimiser's step began, since building them can fail.
pub(crate) fn fused_update<R: RowRule>(
    par: Parallelism,
    grad_output: &[f32],
    groups: &Groups,
    scale_grad_by_freq: bool,
    target: Target<'_>,
    rule: &R,
) {
    let source = PerPosition {
        grad_output,
        dim: target.dim,
    };
    update(par, groups, &source, scale_grad_by_freq, target, rule);
}

/// The fused update for any [`Source`]: sums each group's gradient rows
/// (position order, divided by the count with `divide_by_count`), and
/// applies `rule` to the group's row straight away. The arguments are
/// checked.
pub(crate) fn update<S: Source, R: RowRule>(
    par: Parallelism,
    groups: &Groups,
    source: &S,
    divide_by_count: bool,
    target: Target<'_>,
    rule: &R,
) {
    let split = par.splits(source.bytes(), PARALLEL_MIN_BYTES);
    let rows = GradRows::Summed { divide_by_count };
    apply_groups(split, groups, source, rows, target, rule);
}

/// The rows of a coalesced gradient as groups for [`apply_sparse`], less
/// the padding row `skip` if it holds one.
///
/// Fails only when the allocator refuses the workspace.
pub(crate) fn sparse_groups(
    grad: &SparseGrad,
    skip: Option<usize>,
) -> Result<Groups, EmbeddingError> {
    let mut groups = Groups::of_sparse(grad)?;
    if let Some(skip) = skip
        && let Ok(k) = groups.rows.binary_search(&skip)
    {
        groups.rows.remove(k);
        groups.positions.remove(k);
        groups.starts.pop();
    }
    Ok(groups)
}

/// Applies a coalesced gradient with `rule`, over its
/// [`sparse_groups`]. The caller has checked that `grad` fits `target`.
pub(crate) fn apply_sparse<R: RowRule>(
    par: Parallelism,
    grad: &SparseGrad,
    groups: &Groups,
    target: Target<'_>,
    rule: &R,
) {
    let source = PerPosition {
        grad_output: grad.values(),
        dim: target.dim,
    };
    let split = par.splits(source.bytes(), PARALLEL_MIN_BYTES);
    apply_groups(split, groups, &source, GradRows::AsGiven, target, rule);
}

/// How a group's gradient row is made from its positions' rows.
#[derive(Clone, Copy)]
enum GradRows {
    /// Summed in position order from `+0.0` (divided by the count with
    /// `divide_by_count`): the backward of a batch.
    Summed { divide_by_count: bool },
    /// The group's one row as it is: a coalesced gradient the caller made,
    /// whose `-0.0`s a sum from `+0.0` would turn into `+0.0`.
    AsGiven,
}

/// The shared body of the fused updates: tasks of disjoint rows, each row's
/// gradient summed and applied.
fn apply_groups<S: Source, R: RowRule>(
    split: bool,
    groups: &Groups,
    source: &S,
    grad_rows: GradRows,
    target: Target<'_>,
    rule: &R,
) {
    let dim = target.dim;
    if dim == 0 || groups.len() == 0 {
        return;
    }
    let width = rule.state_width(dim);
    let split_hot = width == dim || width == 0;
    let tasks = plan(
        groups,
        dim,
        Space::Rows(None),
        split_hot,
        GROUP_TASK_BYTES / 4,
    );
    let weights = carve(&tasks, target.weight, dim, dim);
    let states = carve(&tasks, target.state, width, dim);
    let body = Apply {
        groups,
        source,
        grad_rows,
        dim,
        width,
        rule,
    };
    run(split, &tasks, weights, states, &body);
}

/// One task of [`apply_groups`].
struct Apply<'a, S, R> {
    groups: &'a Groups,
    source: &'a S,
    grad_rows: GradRows,
    dim: usize,
    /// Floats of optimiser state per row.
    width: usize,
    rule: &'a R,
}

impl<S: Source, R: RowRule> TaskBody for Apply<'_, S, R> {
    #[inline(always)]
    fn task<V: Lanes>(&self, t: &Task, weight: &mut [f32], state: &mut [f32]) {
        let (groups, dim, width) = (self.groups, self.dim, self.width);
        let mut sum = vec![0.0; t.cols.len()];
        let whole = t.cols == (0..dim);
        let ahead = prefetch_ahead(t.cols.len());
        let mut cursor = groups.starts[t.groups.start];
        for g in t.groups.clone() {
            groups.prefetch_through(g, ahead, self.source, &t.cols, &mut cursor);
            if whole && g + ahead < t.groups.end {
                let next = groups.rows[g + ahead] - t.span.start;
                prefetch::row::<L1>(&weight[next * dim..(next + 1) * dim]);
                prefetch::row::<L1>(&state[next * width..(next + 1) * width]);
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
            match (self.grad_rows, positions) {
                (GradRows::AsGiven, &[p]) => {
                    sum.copy_from_slice(self.source.row(p, t.cols.clone()));
                }
                (rows, _) => {
                    let divide_by_count = matches!(
                        rows,
                        GradRows::Summed {
                            divide_by_count: true
                        }
                    );
                    sum_positions::<V, S, _>(
                        self.source,
                        positions,
                        t.cols.clone(),
                        divide_by_count,
                        &mut sum,
                    );
                }
            }
            self.rule.update(w, &sum, s);
        }
    }
}
