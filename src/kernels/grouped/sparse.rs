//! The coalesced sparse gradient: the distinct rows a batch touched, each
//! with its summed gradient row, in a [`SparseGrad`] whose size depends on
//! the batch, never on the table.

use super::plan::{Space, Task, TaskBody, carve, plan, run};
use super::{Groups, PerPosition, Source, check_padding, sum_positions};
use crate::buffer::copied;
use crate::error::{EmbeddingError, Operand};
use crate::index::{AnyValidIds, Index, RowId, ValidIds, each_row_type};
use crate::kernels::slot::Slot;
use crate::kernels::tuning::{GROUP_TASK_BYTES, PARALLEL_MIN_BYTES, prefetch_ahead};
use crate::parallel::Parallelism;
use crate::shape::{check_len, rows_len};
use crate::simd::Lanes;
use crate::sparse_grad::SparseGrad;

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
/// their count with `scale_grad_by_freq`). Costs `O(n + n · dim)` for `n`
/// ids, whatever `num_embeddings` is. Bits as
/// [`dense_backward`](crate::dense_backward)'s rows.
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
    let ids = ValidIds::new_with(par, ids, num_embeddings)?;
    sparse_valid(
        par,
        grad_output,
        dim,
        ids.by_row(),
        padding_idx,
        scale_grad_by_freq,
    )
}

/// [`sparse_backward_with`] after its checks. Not generic ([`ByRow`](crate::index::ByRow)): compiled here, once.
fn sparse_valid(
    par: Parallelism,
    grad_output: &[f32],
    dim: usize,
    ids: AnyValidIds<'_>,
    padding_idx: Option<usize>,
    scale_grad_by_freq: bool,
) -> Result<SparseGrad, EmbeddingError> {
    let source = PerPosition { grad_output, dim };
    let keep = |_, r| Some(r) != padding_idx;
    let divide = scale_grad_by_freq;
    each_row_type!(ids, |ids| coalesce(par, ids, keep, &source, dim, divide))
}

/// The coalesced gradient of any [`Source`]: the positions `p` (with row
/// `r`) for which `keep(p, r)`, grouped by row, each group's rows summed in
/// position order. The arguments are checked.
pub(crate) fn coalesce<I: RowId, S: Source>(
    par: Parallelism,
    ids: ValidIds<'_, I>,
    keep: impl Fn(usize, usize) -> bool,
    source: &S,
    dim: usize,
    divide_by_count: bool,
) -> Result<SparseGrad, EmbeddingError> {
    let num_embeddings = ids.num_embeddings();
    let groups = Groups::new_kept(ids, keep)?;
    // At most one row per id, and `ids.len() × dim` was checked.
    let mut values = Vec::new();
    let fresh = crate::memory::fresh_floats(&mut values, groups.len(), dim, "gradient")?;
    let len = fresh.len();
    let split = par.splits(source.bytes(), PARALLEL_MIN_BYTES);
    sum_groups(
        split,
        &groups,
        source,
        dim,
        divide_by_count,
        GROUP_TASK_BYTES / 4,
        fresh,
    );
    // SAFETY: `sum_groups` wrote every one of the `len` values (capacity
    // reserved by `fresh_floats`, `groups × dim`): see there.
    #[allow(unsafe_code)]
    unsafe {
        values.set_len(len)
    };
    // A copy: `rows` is one of the thread's spare vectors, sized for every
    // id; the caller's gradient gets one just large enough.
    let rows = copied(&groups.rows, "gradient")?;
    Ok(SparseGrad::from_parts(rows, values, num_embeddings, dim))
}

/// Each group's summed row into `values` (`groups × dim` of them, group
/// `g`'s row at `g × dim`), in tasks of about `budget` floats, on the pool
/// when `split`.
///
/// Writes every value of `values`, which [`coalesce`]'s `set_len` relies
/// on: with `dim == 0` or no groups there are none. Otherwise `plan` in
/// `Space::Groups` gives each task a span equal to its range of groups, the
/// ranges one after another from group 0 to the last, or one hot group as
/// column blocks that tile `0..dim`; `carve` hands out one part per task
/// (so `run` pairs every task with its part), each the task's groups' rows
/// or its columns of the hot row; `Coalesce::task` writes each of its
/// groups' `width` values through `sum_positions`, which writes every value
/// of its `dst`. `run` returns after every task has run.
fn sum_groups<S: Source, D: Slot>(
    split: bool,
    groups: &Groups,
    source: &S,
    dim: usize,
    divide_by_count: bool,
    budget: usize,
    values: &mut [D],
) {
    debug_assert_eq!(values.len(), groups.len() * dim);
    if dim == 0 {
        return;
    }
    let tasks = plan(groups, dim, Space::Groups, true, budget);
    let parts = carve(&tasks, values, dim, dim);
    let none = tasks.iter().map(|_| Default::default()).collect();
    let body = Coalesce {
        groups,
        source,
        divide_by_count,
    };
    run(split, &tasks, parts, none, &body);
}

/// One task of [`coalesce`]: the summed rows of its groups.
struct Coalesce<'a, S> {
    groups: &'a Groups,
    source: &'a S,
    divide_by_count: bool,
}

impl<S: Source, D: Slot> TaskBody<D> for Coalesce<'_, S> {
    #[inline(always)]
    fn task<V: Lanes>(&self, t: &Task, part: &mut [D], _state: &mut [f32]) {
        let (groups, width) = (self.groups, t.cols.len());
        debug_assert_eq!(t.span, t.groups, "a coalesced task's span is its groups");
        debug_assert_eq!(part.len(), t.groups.len() * width);
        let ahead = prefetch_ahead(width);
        let mut cursor = groups.starts[t.groups.start];
        for g in t.groups.clone() {
            groups.prefetch_through(g, ahead, self.source, &t.cols, &mut cursor);
            let at = (g - t.span.start) * width;
            sum_positions::<V, S, _>(
                self.source,
                groups.positions(g),
                t.cols.clone(),
                self.divide_by_count,
                &mut part[at..at + width],
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::groups::tests::{groups_of, ids_with_a_hot_row, mix};
    use super::*;
    use crate::kernels::written::Written;
    use core::ops::Range;

    /// Gradient rows, one a position, each times its factor when there are
    /// factors (a bag's weights, say).
    struct Scaled<'a> {
        grad: &'a [f32],
        dim: usize,
        factors: Option<&'a [f32]>,
    }

    impl Source for Scaled<'_> {
        fn row(&self, p: usize, cols: Range<usize>) -> &[f32] {
            &self.grad[p * self.dim + cols.start..p * self.dim + cols.end]
        }

        fn scale(&self, p: usize) -> Option<f32> {
            self.factors.map(|f| f[p])
        }

        fn bytes(&self) -> usize {
            core::mem::size_of_val(self.grad)
        }
    }

    /// `sum_groups` into an output of `start`s.
    fn sum_into<D: Slot + Clone>(
        start: D,
        split: bool,
        groups: &Groups,
        source: &Scaled<'_>,
        dim: usize,
        divide_by_count: bool,
        budget: usize,
    ) -> Vec<D> {
        let mut out = vec![start; groups.len() * dim];
        sum_groups(
            split,
            groups,
            source,
            dim,
            divide_by_count,
            budget,
            &mut out,
        );
        out
    }

    /// Every value of `sum_groups`' output is written, with the bits of each
    /// group's sum added value by value in position order from `+0.0`:
    /// widths with and without a scalar tail, hot rows cut into column
    /// blocks (small budgets), factors, `scale_grad_by_freq`, both threads'
    /// settings. The output starts as NaNs, and as `Written(None)`s, which
    /// tell a value never written from any value.
    #[test]
    fn every_value_of_the_coalesced_rows_is_written_with_the_reference_bits() {
        let mut seed = 7;
        for case in 0..300 {
            let rows = 1 + mix(&mut seed) as usize % 60;
            let dim = 1 + mix(&mut seed) as usize % 150;
            let n = mix(&mut seed) as usize % 400;
            let ids = ids_with_a_hot_row(&mut seed, rows, n);
            let grad: Vec<f32> = (0..n * dim)
                .map(|_| (mix(&mut seed) % 2001) as f32 / 64.0 - 15.6)
                .collect();
            let factors: Vec<f32> = (0..n)
                .map(|_| (mix(&mut seed) % 9) as f32 / 4.0 - 1.0)
                .collect();
            let groups = groups_of(rows, &ids);
            let budget = 1 + mix(&mut seed) as usize % 3000;
            for (scaled, divide_by_count, split) in [
                (false, false, false),
                (true, false, true),
                (false, true, true),
                (true, true, false),
            ] {
                let source = Scaled {
                    grad: &grad,
                    dim,
                    factors: scaled.then_some(&factors[..]),
                };
                let mut want = vec![0.0f32; groups.len() * dim];
                for (g, row) in want.chunks_exact_mut(dim).enumerate() {
                    let positions = groups.positions(g);
                    for (j, w) in row.iter_mut().enumerate() {
                        let mut acc = 0.0f32;
                        for &p in positions {
                            let x = grad[p * dim + j];
                            acc += if scaled { x * factors[p] } else { x };
                        }
                        if divide_by_count && positions.len() > 1 {
                            acc /= positions.len() as f32;
                        }
                        *w = acc;
                    }
                }
                let what = format!(
                    "case {case}: rows {rows} dim {dim} n {n} budget {budget} \
                     scaled {scaled} divide {divide_by_count} split {split}"
                );
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let got = sum_into(
                    f32::NAN,
                    split,
                    &groups,
                    &source,
                    dim,
                    divide_by_count,
                    budget,
                );
                assert_eq!(bits(&got), bits(&want), "{what}");
                let written = sum_into(
                    Written(None),
                    split,
                    &groups,
                    &source,
                    dim,
                    divide_by_count,
                    budget,
                );
                let want: Vec<Written> = want.iter().map(|x| Written(Some(x.to_bits()))).collect();
                assert_eq!(written, want, "{what}");
            }
        }
    }
}
