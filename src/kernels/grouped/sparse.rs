//! The coalesced sparse gradient: the distinct rows a batch touched, each
//! with its summed gradient row, in a [`SparseGrad`] whose size depends on
//! the batch, never on the table.

use super::plan::{carve, plan, run, Space, Task, TaskBody};
use super::{check_padding, sum_positions, Groups, PerPosition, Source};
use crate::buffer::copied;
use crate::error::{EmbeddingError, Operand};
use crate::index::{Index, ValidIds};
use crate::kernels::tuning::{prefetch_ahead, GROUP_TASK_BYTES, PARALLEL_MIN_BYTES};
use crate::parallel::Parallelism;
use crate::shape::{check_len, rows_len};
use crate::simd::Lanes;
use crate::sparse_grad::SparseGrad;
use core::mem::MaybeUninit;

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
    let source = PerPosition { grad_output, dim };
    let keep = |_, r| Some(r) != padding_idx;
    coalesce(par, ids, keep, &source, dim, scale_grad_by_freq)
}

/// The coalesced gradient of any [`Source`]: the positions `p` (with row
/// `r`) for which `keep(p, r)`, grouped by row, each group's rows summed in
/// position order. The arguments are checked.
pub(crate) fn coalesce<I: Index, S: Source>(
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
    if dim > 0 {
        let tasks = plan(&groups, dim, Space::Groups, true, GROUP_TASK_BYTES / 4);
        let parts = carve(&tasks, fresh, dim, dim);
        let none = tasks.iter().map(|_| Default::default()).collect();
        let split = par.splits(source.bytes(), PARALLEL_MIN_BYTES);
        let body = Coalesce {
            groups: &groups,
            source,
            divide_by_count,
        };
        run(split, &tasks, parts, none, &body);
    }
    // SAFETY: every one of the `len` values (capacity reserved by
    // `fresh_floats`) is written. With `dim == 0`, `len` is 0. Otherwise
    // `plan` in `Space::Groups` puts every group `0..groups.len()` in a
    // task (runs of groups, or one hot group as column blocks of `0..dim`),
    // `carve` hands each task its groups' rows (or its columns of the hot
    // row), and `Coalesce::task` writes, for each of its groups, the whole
    // `width` values of that group's row in its part through
    // `sum_positions`, which writes every value of its `dst`. `run` returns
    // after every task has run.
    #[allow(unsafe_code)]
    unsafe {
        values.set_len(len)
    };
    // A copy: `rows` is one of the thread's spare vectors, sized for every
    // id; the caller's gradient gets one just large enough.
    let rows = copied(&groups.rows, "gradient")?;
    Ok(SparseGrad::from_parts(rows, values, num_embeddings, dim))
}

/// One task of [`coalesce`]: the summed rows of its groups.
struct Coalesce<'a, S> {
    groups: &'a Groups,
    source: &'a S,
    divide_by_count: bool,
}

impl<S: Source> TaskBody<MaybeUninit<f32>> for Coalesce<'_, S> {
    #[inline(always)]
    fn task<V: Lanes>(&self, t: &Task, part: &mut [MaybeUninit<f32>], _state: &mut [f32]) {
        let (groups, width) = (self.groups, t.cols.len());
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
