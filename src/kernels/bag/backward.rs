//! The backward of a bag forward. Sum and mean hand the grouped backward
//! ([`grouped`]) a [`Source`] that reads each position's gradient from its
//! bag's row, times its weight or `1/len`; max adds each output column's
//! gradient to the row that won it.

use super::{Bags, check_backward_rows};
use crate::buffer::{copied, zeroed};
use crate::error::{EmbeddingError, Operand};
use crate::index::{AnyValidIds, Index, RowId, ValidIds, each_row_type};
use crate::kernels::grouped::{self, Groups, RowRule, Source, Target};
use crate::kernels::spare;
use crate::optim::SparseOptimizer;
use crate::parallel::Parallelism;
use crate::pooling::{Mode, Pooling};
use crate::shape::{check_len, rows_len, table_rows};
use crate::simd::{Body, Isa, Lanes, stream};
use crate::sparse_grad::SparseGrad;
use core::ops::Range;

/// The gradient source of a bag: position `p` takes its bag's gradient row,
/// times its per-sample weight (sum) or `1/len` (mean).
struct PerBag<'a> {
    grad_bags: &'a [f32],
    dim: usize,
    bag_of: Vec<usize>,
    padding_idx: Option<usize>,
    /// Per position: the per-sample weight, or `1/len` of its bag.
    factor: Option<Vec<f32>>,
}

impl Source for PerBag<'_> {
    #[inline(always)]
    fn row(&self, p: usize, cols: Range<usize>) -> &[f32] {
        let b = self.bag_of[p] * self.dim;
        &self.grad_bags[b + cols.start..b + cols.end]
    }

    #[inline(always)]
    fn scale(&self, p: usize) -> Option<f32> {
        self.factor.as_ref().map(|f| f[p])
    }

    fn bytes(&self) -> usize {
        // Every position reads a row, however few bags share them: one bag
        // of 65 536 ids is as much work as 65 536 bags of one. (Saturating:
        // positions times a huge `dim` may not fit, and only the size's
        // order matters here.)
        let floats = self.bag_of.len().saturating_mul(self.dim);
        floats.saturating_mul(core::mem::size_of::<f32>())
    }
}

/// The gradient source of a sum or mean bag batch.
fn bag_source<'a, I: RowId>(
    ids: ValidIds<'_, I>,
    bags: &Bags,
    pooling: &Pooling<'_>,
    grad_bags: &'a [f32],
    dim: usize,
) -> Result<PerBag<'a>, EmbeddingError> {
    let skip = pooling.padding_idx;
    let factor = match (pooling.mode, pooling.per_sample_weights) {
        (Mode::Sum, None) => None,
        (Mode::Sum, Some(w)) => Some(copied(w, "workspace")?),
        _ => {
            // Mean: 1 / (kept ids of the bag).
            let mut inv = zeroed::<f32>(ids.len(), "workspace")?;
            for b in 0..bags.len() {
                let range = bags.range(b);
                let kept = range.clone().filter(|&p| Some(ids.row(p)) != skip).count();
                let f = 1.0 / kept.max(1) as f32;
                inv[range].fill(f);
            }
            Some(inv)
        }
    };
    Ok(PerBag {
        grad_bags,
        dim,
        bag_of: bag_of(bags)?,
        padding_idx: skip,
        factor,
    })
}

impl Drop for PerBag<'_> {
    fn drop(&mut self) {
        spare::give(core::mem::take(&mut self.bag_of));
    }
}

impl PerBag<'_> {
    /// Whether position `p` (with row `r`) adds to the gradient: it is in a
    /// bag and not the padding row.
    fn keeps(&self, p: usize, r: usize) -> bool {
        self.bag_of[p] != usize::MAX && Some(r) != self.padding_idx
    }
}

/// The bag of every position (`usize::MAX` for a position past the last
/// bag), in one of the thread's spare vectors.
fn bag_of(bags: &Bags) -> Result<Vec<usize>, EmbeddingError> {
    let mut of = spare::take(bags.num_ids())?;
    of.resize(bags.num_ids(), usize::MAX);
    for b in 0..bags.len() {
        of[bags.range(b)].fill(b);
    }
    Ok(of)
}

/// The dense gradient of a sum or mean bag forward, **overwriting**
/// `grad_table`: [`bag_backward_with`] with [`Parallelism::Auto`].
///
/// # Errors
/// As [`bag_backward_with`].
pub fn bag_backward<I: Index>(
    grad_bags: &[f32],
    dim: usize,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    grad_table: &mut [f32],
) -> Result<(), EmbeddingError> {
    bag_backward_with(
        Parallelism::Auto,
        grad_bags,
        dim,
        ids,
        bags,
        pooling,
        grad_table,
    )
}

/// The dense gradient of a sum or mean bag forward, **overwriting**
/// `grad_table`: row `r` = Σ over the positions `p` with `ids[p] == r` of
/// `grad_bags[bag(p)] × factor(p)` (the per-sample weight, `1/len`, or 1),
/// in position order; untouched rows and `padding_idx` are zeros. Each row is
/// written once. Max mode: see [`bag_max_backward`].
///
/// # Errors
/// As [`bag_forward`](crate::bag_forward), with the lengths of `grad_bags`
/// ([`Operand::GradOutput`]) and `grad_table` ([`Operand::GradTable`]), and
/// [`EmbeddingError::MaxNeedsIndices`] for max mode.
pub fn bag_backward_with<I: Index>(
    par: Parallelism,
    grad_bags: &[f32],
    dim: usize,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    grad_table: &mut [f32],
) -> Result<(), EmbeddingError> {
    let rows = table_rows(grad_table.len(), dim, Operand::GradTable)?;
    let ids = check_backward_rows(rows, dim, ids, bags, pooling, grad_bags)?;
    if pooling.mode == Mode::Max {
        return Err(EmbeddingError::MaxNeedsIndices);
    }
    bag_backward_valid(par, grad_bags, dim, ids.by_row(), bags, pooling, grad_table)
}

/// The dense gradient of [`bag_backward_with`] once every argument is
/// checked (sum or mean; `grad_table` whole rows of `dim` for the ids).
///
/// Fails only when the allocator refuses its workspace, before any write.
/// Not generic ([`ByRow`](crate::index::ByRow)): compiled here, once.
pub(crate) fn bag_backward_valid(
    par: Parallelism,
    grad_bags: &[f32],
    dim: usize,
    ids: AnyValidIds<'_>,
    bags: &Bags,
    pooling: &Pooling<'_>,
    grad_table: &mut [f32],
) -> Result<(), EmbeddingError> {
    each_row_type!(ids, |ids| {
        let source = bag_source(ids, bags, pooling, grad_bags, dim)?;
        let keep = |p, r| source.keeps(p, r);
        let divide = pooling.scale_grad_by_freq;
        grouped::dense(par, ids, keep, &source, dim, divide, grad_table)
    })
}

/// The coalesced sparse gradient of a sum or mean bag forward:
/// [`bag_sparse_backward_with`] with [`Parallelism::Auto`].
///
/// # Errors
/// As [`bag_backward_with`].
pub fn bag_sparse_backward<I: Index>(
    grad_bags: &[f32],
    dim: usize,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    num_embeddings: usize,
) -> Result<SparseGrad, EmbeddingError> {
    bag_sparse_backward_with(
        Parallelism::Auto,
        grad_bags,
        dim,
        ids,
        bags,
        pooling,
        num_embeddings,
    )
}

/// The coalesced sparse gradient of a sum or mean bag forward into a table
/// of `num_embeddings` rows: the distinct ids (less `padding_idx`), ascending,
/// with the rows [`bag_backward_with`] would give them.
///
/// # Errors
/// As [`bag_backward_with`].
pub fn bag_sparse_backward_with<I: Index>(
    par: Parallelism,
    grad_bags: &[f32],
    dim: usize,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    num_embeddings: usize,
) -> Result<SparseGrad, EmbeddingError> {
    rows_len(num_embeddings, dim)?;
    let ids = check_backward_rows(num_embeddings, dim, ids, bags, pooling, grad_bags)?;
    if pooling.mode == Mode::Max {
        return Err(EmbeddingError::MaxNeedsIndices);
    }
    bag_sparse_valid(par, grad_bags, dim, ids.by_row(), bags, pooling)
}

/// [`bag_sparse_backward_with`] after its checks. Not generic ([`ByRow`](crate::index::ByRow)): compiled here, once.
fn bag_sparse_valid(
    par: Parallelism,
    grad_bags: &[f32],
    dim: usize,
    ids: AnyValidIds<'_>,
    bags: &Bags,
    pooling: &Pooling<'_>,
) -> Result<SparseGrad, EmbeddingError> {
    each_row_type!(ids, |ids| {
        let source = bag_source(ids, bags, pooling, grad_bags, dim)?;
        let keep = |p, r| source.keeps(p, r);
        let divide = pooling.scale_grad_by_freq;
        grouped::coalesce(par, ids, keep, &source, dim, divide)
    })
}

/// Backward and an optimiser step of a sum or mean bag batch in one pass over
/// the touched rows, on a table the caller owns (`table.len() / dim` rows):
/// the step of [`EmbeddingBag::sparse_step`](crate::EmbeddingBag::sparse_step),
/// with its bits on every thread count. Each touched row (less
/// `pooling.padding_idx`) gets the optimiser's update with the row that
/// [`bag_sparse_backward`] would give it; no gradient is stored and untouched
/// rows are not read.
///
/// # Errors
/// In this order: [`EmbeddingError::ZeroDimWithData`] or
/// [`EmbeddingError::NotMultipleOfDim`] for the table, the errors of
/// [`bag_backward`](crate::bag_backward) but `grad_table`'s,
/// [`EmbeddingError::MaxNeedsIndices`] in max mode, the optimiser's own
/// errors, then [`EmbeddingError::AllocationFailed`] for the workspace or a
/// first step's state. On any error the table and the optimiser are as they
/// were.
#[allow(clippy::too_many_arguments)]
pub fn bag_sparse_step_with<I: Index, O: SparseOptimizer>(
    par: Parallelism,
    table: &mut [f32],
    dim: usize,
    grad_bags: &[f32],
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    optimizer: &mut O,
) -> Result<(), EmbeddingError> {
    let rows = table_rows(table.len(), dim, Operand::Table)?;
    bag_step(
        par,
        rows,
        dim,
        Some(table),
        grad_bags,
        ids,
        bags,
        pooling,
        optimizer,
    )
}

/// [`bag_sparse_step_with`] with [`Parallelism::Auto`].
///
/// # Errors
/// As [`bag_sparse_step_with`].
pub fn bag_sparse_step<I: Index, O: SparseOptimizer>(
    table: &mut [f32],
    dim: usize,
    grad_bags: &[f32],
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    optimizer: &mut O,
) -> Result<(), EmbeddingError> {
    let par = Parallelism::Auto;
    bag_sparse_step_with(par, table, dim, grad_bags, ids, bags, pooling, optimizer)
}

/// The checks and the step of a bag batch on a table of `rows × dim`
/// values; `table: None` (a frozen table) makes every check, then changes
/// nothing, the optimiser included.
#[allow(clippy::too_many_arguments)]
pub(crate) fn bag_step<I: Index, O: SparseOptimizer>(
    par: Parallelism,
    rows: usize,
    dim: usize,
    table: Option<&mut [f32]>,
    grad_bags: &[f32],
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    optimizer: &mut O,
) -> Result<(), EmbeddingError> {
    let ids = check_backward_rows(rows, dim, ids, bags, pooling, grad_bags)?;
    if pooling.mode == Mode::Max {
        return Err(EmbeddingError::MaxNeedsIndices);
    }
    optimizer.check_step(rows, dim)?;
    let Some(weight) = table else {
        return Ok(());
    };
    let update = BagUpdate::new(grad_bags, dim, ids, bags, pooling)?;
    let (rule, state) = optimizer.begin_step(rows, dim)?;
    update.apply(par, Target { weight, dim, state }, &rule);
    Ok(())
}

/// The fused backward + update of a sum or mean bag batch, after
/// [`check_backward_rows`](super::check_backward_rows): its workspace (the
/// gradient source and the grouping), made before the optimiser's step
/// begins, since making it can fail.
pub(crate) struct BagUpdate<'a> {
    source: PerBag<'a>,
    groups: Groups,
    divide: bool,
}

impl<'a> BagUpdate<'a> {
    /// The workspace of the update of `ids` (checked) with `grad_bags`.
    ///
    /// Fails only when the allocator refuses it.
    pub(crate) fn new<I: RowId>(
        grad_bags: &'a [f32],
        dim: usize,
        ids: ValidIds<'_, I>,
        bags: &Bags,
        pooling: &Pooling<'_>,
    ) -> Result<BagUpdate<'a>, EmbeddingError> {
        let source = bag_source(ids, bags, pooling, grad_bags, dim)?;
        let groups = Groups::new_kept(ids, |p, r| source.keeps(p, r))?;
        Ok(BagUpdate {
            source,
            groups,
            divide: pooling.scale_grad_by_freq,
        })
    }

    /// Each touched row's gradient summed and handed to `rule` at once.
    pub(crate) fn apply<R: RowRule>(&self, par: Parallelism, target: Target<'_>, rule: &R) {
        grouped::update(par, &self.groups, &self.source, self.divide, target, rule);
    }
}

/// The gradient of a max bag forward, **overwriting** `grad_table`: zeros,
/// then `grad_table[max_indices[b, j], j] += grad_bags[b, j]` for every bag
/// in order (empty bags, with index -1, add nothing).
///
/// # Errors
/// A shape error for `grad_table`, `grad_bags` or `max_indices`, or
/// [`EmbeddingError::IndexOutOfRange`] for an index that is neither -1 nor a
/// row (its position is its flat position in `max_indices`); then
/// `grad_table` is untouched.
pub fn bag_max_backward(
    grad_bags: &[f32],
    dim: usize,
    max_indices: &[i64],
    grad_table: &mut [f32],
) -> Result<(), EmbeddingError> {
    bag_max_backward_with(Parallelism::Auto, grad_bags, dim, max_indices, grad_table)
}

/// [`bag_max_backward`] with an explicit [`Parallelism`]. The additions run
/// in bag order on the calling thread whatever `par` says (each column of a
/// row may take gradients from many bags, and their order fixes the bits);
/// `par` is taken so that every kernel has the same two forms.
///
/// # Errors
/// As [`bag_max_backward`].
pub fn bag_max_backward_with(
    par: Parallelism,
    grad_bags: &[f32],
    dim: usize,
    max_indices: &[i64],
    grad_table: &mut [f32],
) -> Result<(), EmbeddingError> {
    let _ = par;
    let rows = table_rows(grad_table.len(), dim, Operand::GradTable)?;
    check_len(Operand::MaxIndices, grad_bags.len(), max_indices.len())?;
    if dim == 0 {
        return check_len(Operand::GradOutput, 0, grad_bags.len());
    }
    check_len(
        Operand::GradOutput,
        grad_bags.len() / dim * dim,
        grad_bags.len(),
    )?;
    for (position, &i) in max_indices.iter().enumerate() {
        if i < -1 || i128::from(i) >= rows as i128 {
            return Err(EmbeddingError::IndexOutOfRange {
                position,
                index: i128::from(i),
                num_embeddings: rows,
            });
        }
    }
    Isa::detect().run(Zeros(grad_table));
    stream::fence();
    for (g, idx) in grad_bags
        .chunks_exact(dim)
        .zip(max_indices.chunks_exact(dim))
    {
        for (j, (&x, &i)) in g.iter().zip(idx).enumerate() {
            if i >= 0 {
                grad_table[i as usize * dim + j] += x;
            }
        }
    }
    Ok(())
}

/// Zeros over a whole table, with streaming stores.
struct Zeros<'a>(&'a mut [f32]);

impl Body for Zeros<'_> {
    type Output = ();

    #[inline(always)]
    fn run<V: Lanes>(self) {
        V::stream(self.0, None);
    }
}
