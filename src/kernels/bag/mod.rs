//! Bags: gather rows and pool them (sum, mean or max) in one pass, as
//! PyTorch's `nn.EmbeddingBag`; and the backward of the pooling.
//!
//! ```text
//! check table, bags, weights, out, max_indices, every id   (nothing written)
//!     (a fresh output: every id but the bags', which each task checks first)
//! for each task of whole bags (split across threads):
//!     for each bag b, for each column block (sum: 384 columns with
//!     AVX-512, 128 with AVX, 64 without; then the smaller blocks, then the
//!     last few columns):
//!         acc = -0.0 in registers              (max: the first kept row)
//!         for p in bag b, skipping padding_idx:
//!             prefetch table[ids[p + ahead], block] into L2 (L1: rows
//!                 <= 64 B, and every row on a 48 KiB L1)
//!             sum:  acc += table[ids[p], block] (· weight[p])
//!             max:  where table[ids[p], block] > acc: acc = it, at = p
//!         out[b, block] = acc (/ count, mean)  (written once)
//! (a sum whose row is one column block swaps the two outer loops: the
//! block chosen once a task, its bags looped inside it)
//! ```
//!
//! | file | what |
//! | --- | --- |
//! | `mod.rs` | the checks and the public forward |
//! | `forward.rs` | the driver: tasks of bags, the column blocks, the loop over a bag's rows |
//! | `sum.rs` | the body of a sum or mean block |
//! | `max.rs` | the body of a max block |
//! | `backward.rs` | the backward of each mode |
//!
//! 1. **Checks first.** The offsets are checked once into [`Bags`] (start at
//!    0, never decrease, never pass the number of ids), every id by
//!    [`ValidIds`], the buffers by length; then the loop cannot fail. A
//!    forward into a fresh output the caller sees only on success checks
//!    the ids inside its tasks instead, each the positions it reads
//!    ([`CallIds::InTasks`]): a task that finds a bad one writes nothing,
//!    and the call reports the first bad id of all.
//! 2. **Registers, not the output.** A bag is pooled one column block at a
//!    time, the block's accumulators in registers, one pass over the bag's
//!    rows per block (a bag of a few dozen rows stays in L1 or L2 between
//!    passes), and each output value is written once. A block is as many
//!    vectors as the registers hold: sixteen 256-bit registers (128
//!    columns) with AVX, eight `f32x8` pairs (64 columns) with SSE2, and
//!    with AVX-512 24 of the 32 registers for a sum of `f32` or packed rows
//!    (384 columns; `Lanes::SUM_BLOCK`), 16 for the rest; half or packed
//!    rows of several blocks take twelve with AVX, which leaves registers
//!    for the decode (`Lanes::DECODE_BLOCK`); max keeps the
//!    winners' positions beside the values, so half as many columns. The
//!    last `dim % WIDTH` columns go through the same body, copied into a
//!    zero-padded vector.
//! 3. **Prefetch per block.** Every pass prefetches its own block of the row
//!    `ahead` positions on (`tuning::bag_ahead`), into L2 (not L1), so the
//!    hints are spread evenly over the passes; the count of hints per block
//!    is a constant. Rows of one line or less go into L1 instead, and so do
//!    all rows where the L1 data cache is 48 KiB or more; a row that is
//!    exactly one line takes one hint (`prefetch::BagHints`). The rows
//!    ahead may be the next task's, which then starts warm.
//! 4. **Exact order.** Each bag is summed in position order from `-0.0` (so
//!    the first term comes through as it is), one rounded sum per term; a
//!    weighted term is fused into the sum (`fma(row, weight, acc)`) as
//!    PyTorch's CPU bag adds it, or with a `padding_idx` rounded first, as
//!    its loop for that case does. These are the operations of the
//!    reference's bag matrix product (sums from `-0.0`, the same terms),
//!    so `sum` matches it bit for bit on every thread count and instruction
//!    set. `mean` divides the sum by the count (the reference multiplies by
//!    `1/len`: equal up to rounding). An empty bag (or one holding only
//!    `padding_idx`) is `+0.0`, as in PyTorch.
//! 5. **Max** keeps, per column, the first largest value (strictly greater
//!    replaces, so ties keep the earlier id and a NaN never replaces; a NaN
//!    in the first row stays), and the position it came from, as the bits
//!    of an `f32` lane chosen with the same compare mask as the value.
//! 6. **Threads.** Tasks of whole bags, about a 64th of the output each
//!    (a 16th for a call shared by its caller and one pool thread) and at
//!    least `TASK_BYTES` (`task_bytes`);
//!    tasks are disjoint, so the result cannot depend on the thread count.
//! 7. **Backward** (sum and mean) is the grouped backward of
//!    [`grouped`](super::grouped) with each position's gradient row taken
//!    from its bag's row, times its weight (or `1/len`): dense (each row
//!    written once), coalesced sparse, or fused into an optimiser. Max's
//!    backward adds each output column's gradient to the row that won it,
//!    bag by bag in order.

mod backward;
mod forward;
mod max;
mod sum;
#[cfg(test)]
mod tests;

use crate::index::each_row_type;
pub(crate) use backward::bag_backward_valid;
pub(crate) use backward::bag_step;
pub use backward::{
    bag_backward, bag_backward_with, bag_max_backward, bag_max_backward_with, bag_sparse_backward,
    bag_sparse_backward_with, bag_sparse_step, bag_sparse_step_with,
};
use forward::AnyCallIds;
pub(crate) use forward::{CallIds, forward_valid};

use crate::bags::Bags;
use crate::error::{EmbeddingError, Operand};
use crate::formats::TableRef;
use crate::index::{Index, RowId, UncheckedIds, ValidIds, check_splits};
use crate::kernels::row_format::{F32Rows, dispatch};
use crate::parallel::{Parallelism, in_pool};
use crate::pooling::{Mode, Pooling};
use crate::shape::{check_len, rows_len, table_rows};
use crate::simd::Isa;

/// The argument checks every bag call shares, in the crate's order, after
/// the table's: bags against the ids, `per_sample_weights` (mode, then
/// length), the padding row, for a table of `rows` rows. The ids come
/// last, after the caller's buffers.
fn check_pooling<I: Index>(
    rows: usize,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
) -> Result<(), EmbeddingError> {
    check_len(Operand::Ids, bags.num_ids(), ids.len())?;
    if let Some(weights) = pooling.per_sample_weights {
        if pooling.mode != Mode::Sum {
            return Err(EmbeddingError::PerSampleWeightsNeedSum { mode: pooling.mode });
        }
        check_len(Operand::PerSampleWeights, ids.len(), weights.len())?;
    }
    if let Some(p) = pooling.padding_idx
        && p >= rows
    {
        return Err(EmbeddingError::PaddingIdxOutOfRange {
            padding_idx: i64::try_from(p).unwrap_or(i64::MAX),
            num_embeddings: rows,
        });
    }
    Ok(())
}

/// Every check of the forward, in order, before any write: the checked
/// ids, for the kernels.
#[allow(clippy::too_many_arguments)]
fn check_forward<'a, I: Index>(
    par: Parallelism,
    table: &[f32],
    dim: usize,
    ids: &'a [I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    out: &[f32],
    max_indices: &[i64],
) -> Result<ValidIds<'a, I::Row>, EmbeddingError> {
    let rows = table_rows(table.len(), dim, Operand::Table)?;
    check_forward_rows(par, rows, dim, ids, bags, pooling, out, max_indices)
}

/// The forward's checks after the table's, for a table of `rows` rows: the
/// pooling's, the output buffers, max's bag lengths, then every id. A layer
/// calls this with its own row count, which a table of width 0 cannot tell.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_forward_rows<'a, I: Index>(
    par: Parallelism,
    rows: usize,
    dim: usize,
    ids: &'a [I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    out: &[f32],
    max_indices: &[i64],
) -> Result<ValidIds<'a, I::Row>, EmbeddingError> {
    check_pooling(rows, ids, bags, pooling)?;
    check_outputs(par, rows, dim, ids, bags, pooling, (out, dim), max_indices)
}

/// The rest of the forward's checks, after the table's and the pooling's:
/// the output buffers (`out`'s rows `stride` values apart), max's bag
/// lengths, then every id.
#[allow(clippy::too_many_arguments)]
fn check_outputs<'a, I: Index>(
    par: Parallelism,
    rows: usize,
    dim: usize,
    ids: &'a [I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    (out, stride): (&[f32], usize),
    max_indices: &[i64],
) -> Result<ValidIds<'a, I::Row>, EmbeddingError> {
    // `(bags - 1) * stride + dim`: `bags × dim` for rows side by side, with
    // the same error where that overflows.
    let out_len = match bags.len() {
        0 => 0,
        n => (n - 1)
            .checked_mul(stride)
            .and_then(|len| len.checked_add(dim))
            .ok_or(EmbeddingError::SizeOverflow {
                count: n,
                dim: stride,
            })?,
    };
    check_len(Operand::Output, out_len, out.len())?;
    if pooling.mode == Mode::Max {
        check_len(
            Operand::MaxIndices,
            rows_len(bags.len(), dim)?,
            max_indices.len(),
        )?;
        check_max_bag_lengths(bags)?;
    }
    ValidIds::new_with(par, ids, rows)
}

/// The forward's checks for a layer that allocates the outputs itself, on
/// its table of `rows` rows (of any format), in [`check_forward`]'s order
/// less the two output lengths: the checked ids and the output length
/// (`bags × dim`), before anything is allocated.
pub(crate) fn check_forward_unallocated<'a, I: Index>(
    par: Parallelism,
    rows: usize,
    dim: usize,
    ids: &'a [I],
    bags: &Bags,
    pooling: &Pooling<'_>,
) -> Result<(ValidIds<'a, I::Row>, usize), EmbeddingError> {
    let out_len = check_forward_shapes(rows, dim, ids, bags, pooling)?;
    Ok((ValidIds::new_with(par, ids, rows)?, out_len))
}

/// `allocated`, or its error; but when the allocator refused
/// ([`EmbeddingError::AllocationFailed`]) and an id of `ids` is not a row of
/// `rows`, that id's error, as if every id had been checked before anything
/// was allocated (the order a caller of a fresh forward sees with the ids
/// left to the tasks; a size that overflows still comes first).
pub(crate) fn ids_first<T, R: RowId>(
    par: Parallelism,
    ids: UncheckedIds<'_, R>,
    rows: usize,
    allocated: Result<T, EmbeddingError>,
) -> Result<T, EmbeddingError> {
    allocated.or_else(|e| {
        if let EmbeddingError::AllocationFailed { .. } = e {
            ids.check(par, rows)?;
        }
        Err(e)
    })
}

/// A fresh forward's outputs for `len` values: room for the values (the
/// forward writes them all), and for [`Mode::Max`] the indices, zeroed;
/// else no indices. Either allocation's error as [`ids_first`] orders it.
pub(crate) fn fresh_outputs<R: RowId>(
    par: Parallelism,
    ids: UncheckedIds<'_, R>,
    rows: usize,
    len: usize,
    mode: Mode,
) -> Result<(Vec<f32>, Vec<i64>), EmbeddingError> {
    let values = ids_first(par, ids, rows, crate::buffer::with_capacity(len, "output"))?;
    let max_indices = if mode == Mode::Max {
        ids_first(par, ids, rows, crate::buffer::zeroed(len, "max_indices"))?
    } else {
        Vec::new()
    };
    Ok((values, max_indices))
}

/// [`check_forward_unallocated`] less the ids, for a forward into a fresh
/// output whose tasks check them ([`CallIds::InTasks`]): the output length.
pub(crate) fn check_forward_shapes<I: Index>(
    rows: usize,
    dim: usize,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
) -> Result<usize, EmbeddingError> {
    check_pooling(rows, ids, bags, pooling)?;
    let out_len = rows_len(bags.len(), dim)?;
    if pooling.mode == Mode::Max {
        check_max_bag_lengths(bags)?;
    }
    Ok(out_len)
}

/// `out[b, :]` = the pooled rows of bag `b`, for every bag; with
/// [`Mode::Max`], also `max_indices[b, j]` = the id whose row gave
/// `out[b, j]` (-1 for an empty bag). See the module notes for the exact
/// arithmetic.
///
/// `out` holds `bags.len() × dim` values; `max_indices` as many for max mode
/// and is ignored (may be empty) otherwise.
///
/// # Errors
/// A shape error, an offsets error (made by [`Bags`]),
/// [`EmbeddingError::PerSampleWeightsNeedSum`],
/// [`EmbeddingError::PaddingIdxOutOfRange`],
/// [`EmbeddingError::BagTooLong`] (max mode, a bag of more than 2^32 ids)
/// or [`EmbeddingError::IndexOutOfRange`]; then nothing is written.
pub fn bag_forward<I: Index>(
    table: &[f32],
    dim: usize,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    out: &mut [f32],
    max_indices: &mut [i64],
) -> Result<(), EmbeddingError> {
    bag_forward_with(
        Parallelism::Auto,
        table,
        dim,
        ids,
        bags,
        pooling,
        out,
        max_indices,
    )
}

/// [`bag_forward`] with an explicit [`Parallelism`].
///
/// # Errors
/// As [`bag_forward`].
// The arguments are `bag_forward`'s plus `par`, as for every `_with`.
#[allow(clippy::too_many_arguments)]
pub fn bag_forward_with<I: Index>(
    par: Parallelism,
    table: &[f32],
    dim: usize,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    out: &mut [f32],
    max_indices: &mut [i64],
) -> Result<(), EmbeddingError> {
    in_pool(check_splits(par, ids), || {
        let ids = check_forward(par, table, dim, ids, bags, pooling, out, max_indices)?;
        forward_valid(
            par,
            table,
            dim,
            ids.by_row(),
            bags,
            pooling,
            out,
            max_indices,
        );
        Ok(())
    })
}

/// [`forward_valid`] into a fresh output, for a layer that allocates it
/// (after [`check_forward_unallocated`], or [`check_forward_shapes`] with
/// the ids left to the tasks): `values` (emptied, and reserved if the
/// caller has not) gets the `bags × dim` values, each written once (no
/// zeroing first).
///
/// # Errors
/// With [`CallIds::InTasks`], [`EmbeddingError::IndexOutOfRange`] for the
/// first bad id; [`EmbeddingError::SizeOverflow`] or
/// [`EmbeddingError::AllocationFailed`] for the output. Then `values` is
/// empty (and `max_indices` holds nothing to read).
// `forward_valid`'s arguments, the output a `Vec`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_valid_fresh(
    par: Parallelism,
    table: &[f32],
    dim: usize,
    ids: AnyCallIds<'_>,
    bags: &Bags,
    pooling: &Pooling<'_>,
    values: &mut Vec<f32>,
    max_indices: &mut [i64],
) -> Result<(), EmbeddingError> {
    let (isa, table) = (Isa::detect(), F32Rows { table, dim });
    each_row_type!(ids, |ids| {
        forward::forward_fresh(isa, par, table, ids, bags, pooling, values, max_indices)
    })
}

/// [`forward_valid_fresh`] over a table of any format.
///
/// # Errors
/// As [`forward_valid_fresh`].
pub(crate) fn forward_fresh(
    par: Parallelism,
    table: TableRef<'_>,
    ids: AnyCallIds<'_>,
    bags: &Bags,
    pooling: &Pooling<'_>,
    values: &mut Vec<f32>,
    max_indices: &mut [i64],
) -> Result<(), EmbeddingError> {
    let isa = Isa::detect();
    each_row_type!(ids, |ids| {
        let op = forward::FreshForward {
            isa,
            par,
            ids,
            bags,
            pooling,
            values,
            max_indices,
        };
        dispatch(&table, op)
    })
}

/// Every check of a backward call into a table of `rows` rows, in order:
/// `grad_bags`' length, the pooling's arguments, then every id. The mode
/// is the caller's to check (max mode's backward takes the forward's
/// `max_indices`, and refuses to run without them only after these).
pub(crate) fn check_backward_rows<'a, I: Index>(
    rows: usize,
    dim: usize,
    ids: &'a [I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    grad_bags: &[f32],
) -> Result<ValidIds<'a, I::Row>, EmbeddingError> {
    check_len(
        Operand::GradOutput,
        rows_len(bags.len(), dim)?,
        grad_bags.len(),
    )?;
    check_pooling(rows, ids, bags, pooling)?;
    ValidIds::new(ids, rows)
}

/// The most ids a max bag may hold: the winner's position in its bag rides
/// in the 32 bits of an `f32` lane (`max.rs`).
const MAX_BAG_LEN: u64 = 1 << 32;

/// Refuses a max bag longer than [`MAX_BAG_LEN`] (only possible with over
/// four billion ids, so the scan is skipped below that).
fn check_max_bag_lengths(bags: &Bags) -> Result<(), EmbeddingError> {
    if bags.num_ids() as u64 <= MAX_BAG_LEN {
        return Ok(());
    }
    match (0..bags.len()).find(|&b| bags.range(b).len() as u64 > MAX_BAG_LEN) {
        Some(bag) => Err(EmbeddingError::BagTooLong {
            bag,
            len: bags.range(bag).len(),
            max: MAX_BAG_LEN,
        }),
        None => Ok(()),
    }
}

/// The bags of a table of any [`Format`](crate::formats::Format): sum,
/// mean or max of each bag's rows, read in place, never converted whole.
/// [`table_bag_forward_with`] with [`Parallelism::Auto`].
///
/// # Errors
/// As [`table_bag_forward_with`].
pub fn table_bag_forward<I: Index>(
    table: TableRef<'_>,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    out: &mut [f32],
    max_indices: &mut [i64],
) -> Result<(), EmbeddingError> {
    table_bag_forward_with(
        Parallelism::Auto,
        table,
        ids,
        bags,
        pooling,
        out,
        max_indices,
    )
}

/// [`bag_forward_with`] on a table of any format, `out` in `f32`.
///
/// * `f32`: exactly [`bag_forward_with`].
/// * `f16`, `bf16`: each row widened to `f32` (exactly), then pooled as an
///   `f32` row: the sum of the widened table, bit for bit.
/// * Row-wise quantized: a value is `fma(q, scale, bias)`. The sum adds a
///   row with FBGEMM's rule, `acc = fma(w · scale, q, acc + w · bias)`, in
///   position order from `+0.0` (`w` the per-sample weight, or 1), which
///   gives PyTorch's quantized bag sum bit for bit
///   ([`reference::packed_bag_sum`](crate::reference::packed_bag_sum));
///   mean divides that sum by the count; max compares the read-back values.
///
/// # Errors
/// As [`bag_forward`] (the table was checked into its [`TableRef`]); then
/// nothing is written.
pub fn table_bag_forward_with<I: Index>(
    par: Parallelism,
    table: TableRef<'_>,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    out: &mut [f32],
    max_indices: &mut [i64],
) -> Result<(), EmbeddingError> {
    let dim = table.dim();
    table_bag_forward_strided_with(par, table, ids, bags, pooling, out, dim, max_indices)
}

/// [`table_bag_forward_with`] into rows `out_stride` values apart: bag `b`'s
/// row is `out[b * out_stride..][..dim]`, and the values between rows keep
/// theirs. So a bag call writes its columns of a wider output in place (a
/// collection's `[batch, Σ dims]`, each table a block of columns), without
/// a copy afterwards. `out` holds `(bags - 1) * out_stride + dim` values
/// (none without bags); `max_indices`, in max mode, `bags × dim`, side by side.
///
/// # Errors
/// As [`table_bag_forward_with`], with `out`'s length as above;
/// [`EmbeddingError::InvalidArgument`] for `out_stride < dim`. Then nothing is
/// written.
// `table_bag_forward_with`'s arguments, and the stride.
#[allow(clippy::too_many_arguments)]
pub fn table_bag_forward_strided_with<I: Index>(
    par: Parallelism,
    table: TableRef<'_>,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    out: &mut [f32],
    out_stride: usize,
    max_indices: &mut [i64],
) -> Result<(), EmbeddingError> {
    in_pool(check_splits(par, ids), || {
        let (rows, dim) = (table.rows(), table.dim());
        if out_stride < dim {
            return Err(EmbeddingError::InvalidArgument {
                name: "out_stride",
                value: out_stride.to_string(),
                requirement: "at least embedding_dim",
            });
        }
        check_pooling(rows, ids, bags, pooling)?;
        let checked = (&*out, out_stride);
        let ids = check_outputs(par, rows, dim, ids, bags, pooling, checked, max_indices)?;
        let ids = ids.by_row();
        forward::forward_table(
            par,
            &table,
            ids,
            bags,
            pooling,
            out,
            out_stride,
            max_indices,
        );
        Ok(())
    })
}
