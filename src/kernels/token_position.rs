//! The transformer's input path: token embeddings, optionally scaled, plus
//! position embeddings, in one pass forward and one pass backward.
//!
//! ```text
//! forward  (embed_positions):
//!   check table, positions, ids shape, seq_len, out length, every id
//!   for i in 0..batch·seq_len:                            (split across threads)
//!       t = i mod seq_len                                 (counted, not divided)
//!       prefetch table[ids[i + ahead]]
//!       out[i, :] = table[ids[i], :] * scale + position_table[t, :]
//!
//! backward (embed_positions_backward):
//!   check grad_table, grad_position_table, ids shape, seq_len, grad_output length, every id
//!   cut the columns 0..dim into blocks of whole cache lines, one per thread
//!   each block, in parallel:
//!       for i in 0..batch·seq_len (in order):
//!           grad_table[ids[i], block]            += grad_output[i, block] * scale
//!           grad_position_table[i mod seq_len, block] += grad_output[i, block]
//! ```
//!
//! The ids are a flat, row-major `[batch, seq_len]` batch: id `i` is token
//! `t = i mod seq_len` of sequence `b = i / seq_len`, so it takes position
//! row `t`.
//!
//! 1. **Fusion, not new drivers.** The forward is the gather's driver and
//!    loop (`kernels/gather.rs`: blocks of whole rows, one rayon task each,
//!    prefetch about 16 KiB of rows ahead, the 2 MiB [`Parallelism::Auto`] threshold)
//!    with a third row operation besides copy and scale: scale and add a
//!    position row. The backward is the scatter's driver and loop
//!    (`kernels/scatter.rs`: column blocks of whole cache lines, the 8 MiB
//!    threshold) with a scaled row add and a position-gradient sink. Each
//!    direction is one pass over the output (or its gradient).
//! 2. **The bits of the unfused composition.** `x * scale + p` is two IEEE
//!    operations, each rounded, never a fused multiply-add, so the forward
//!    equals [`gather_scaled`](crate::gather_scaled) (or
//!    [`gather`](crate::gather) when `scale` is `None`) followed by
//!    `out[b, t, :] += position_table[t, :]`, bit for bit. The backward adds
//!    `g * scale`, rounded, into `grad_table`, which is scaling every
//!    gradient first and then [`scatter_add`](crate::scatter_add); `None`
//!    adds `g` itself, with no multiply. Neither depends on the thread count
//!    or on the SIMD width.
//! 3. **Position rows by counting.** A block of output rows starts at some
//!    row `first` of the call. Its row operation starts at position
//!    `first mod seq_len` and counts up, wrapping at `seq_len`: one division
//!    per block, none per row. In the backward every task walks all the
//!    positions from 0, so its counter starts at 0.
//! 4. **One read of the output gradient.** `grad_output` is the large
//!    operand (`batch × seq_len × dim`); `grad_position_table` has only
//!    `seq_len` rows, read and written `batch` times, and stays in cache for
//!    common sequence lengths. A separate pass for the position table (serial, or
//!    parallel over `t`) would read all of `grad_output` a second time. So
//!    the scatter's loop feeds each gradient row to both tables, and a
//!    column block's task owns the same columns of both: row `t` of
//!    `grad_position_table` receives batch 0, 1, … in order, on any thread count.
//!    The fused backward took less time than
//!    [`scatter_add_scaled`](super::scatter::scatter_add_scaled) plus a
//!    separate position loop on narrow, medium and wide rows alike. The
//!    fused forward costs what `gather_scaled` costs, within the noise;
//!    gathering and then adding took longer, for the second pass over the
//!    output (docs/design.md, "Token + position").
//! 5. **Checks first, in a fixed order**, before anything is written: the
//!    table (`grad_table` backward), the position table (`max_len` rows of
//!    `dim`), the ids as whole sequences of `seq_len`, `seq_len ≤ max_len`,
//!    the size `ids.len() × dim`, the output (`grad_output`) length, then
//!    every id, first to last.
//!    `ids.len()` not a multiple of `seq_len` is
//!    [`EmbeddingError::IdsShape`] with `shape = [ids.len() / seq_len,
//!    seq_len]` (the whole sequences there are, and the sequence length);
//!    `seq_len == 0` takes no ids, and with ids it reports `shape = [0, 0]`.
//!    [`EmbeddingError::SequenceTooLong`] holds even for an empty batch: the
//!    call still asks for `seq_len` positions.

use super::gather::{self, RowOp};
use super::scatter;
use crate::error::{EmbeddingError, Operand};
use crate::index::{AnyValidIds, Index, ValidIds, each_row_type};
use crate::parallel::Parallelism;
use crate::shape::{check_len, rows_len, table_rows};
use crate::simd::{Lanes, row};

/// `out[b, t, :] = table[ids[b, t], :] * scale + position_table[t, :]` for every
/// sequence `b` and position `t`: a transformer's input embedding in one
/// pass.
///
/// * `table` is `num_embeddings × dim` and `position_table` is `max_len × dim`,
///   both row-major (`position_table` may be
///   [`sinusoidal_positions`](crate::positions::sinusoidal_positions) or a
///   learned table).
/// * `ids` is a flat, row-major `[batch, seq_len]` batch, so `ids.len()` is a
///   multiple of `seq_len`; `seq_len` may not exceed `max_len`.
/// * `scale` multiplies the token row before the position row is added
///   (`Some(sqrt(dim))` in *Attention Is All You Need*); `None` adds without
///   multiplying.
/// * `out` must hold `ids.len() × dim` values.
///
/// The result is bitwise identical to [`gather`](crate::gather) (or
/// [`gather_scaled`](crate::gather_scaled)) followed by
/// `out[b, t, :] += position_table[t, :]`, for any thread count.
///
/// # Errors
/// Checked in this order, and then `out` is untouched:
/// [`ZeroDimWithData`](EmbeddingError::ZeroDimWithData) or
/// [`NotMultipleOfDim`](EmbeddingError::NotMultipleOfDim) for `table`
/// ([`Operand::Table`]), then for `position_table` ([`Operand::Positions`]);
/// [`IdsShape`](EmbeddingError::IdsShape) if `ids.len()` is not a multiple of
/// `seq_len` (shape `[ids.len() / seq_len, seq_len]`, or `[0, 0]` for ids with
/// `seq_len == 0`); [`SequenceTooLong`](EmbeddingError::SequenceTooLong) if
/// `seq_len > max_len`; [`SizeOverflow`](EmbeddingError::SizeOverflow) or
/// [`LengthMismatch`](EmbeddingError::LengthMismatch) for `out`
/// ([`Operand::Output`]); [`IndexOutOfRange`](EmbeddingError::IndexOutOfRange)
/// for the first bad id.
///
/// # Example
/// ```
/// use embedding_kernels::embed_positions;
/// let table = [1.0, 2.0, 3.0, 4.0]; // 2 tokens of dim 2
/// let positions = [0.5, 0.5, 0.25, 0.25, 0.0, 0.0]; // max_len 3
/// let ids = [1u32, 0, 0, 0]; // 2 sequences of 2
/// let mut out = [0.0f32; 8];
/// embed_positions(&table, &positions, 2, &ids, 2, Some(2.0), &mut out)?;
/// assert_eq!(out, [6.5, 8.5, 2.25, 4.25, 2.5, 4.5, 2.25, 4.25]);
/// # Ok::<(), embedding_kernels::EmbeddingError>(())
/// ```
pub fn embed_positions<I: Index>(
    table: &[f32],
    position_table: &[f32],
    dim: usize,
    ids: &[I],
    seq_len: usize,
    scale: Option<f32>,
    out: &mut [f32],
) -> Result<(), EmbeddingError> {
    embed_positions_with(
        Parallelism::Auto,
        table,
        position_table,
        dim,
        ids,
        seq_len,
        scale,
        out,
    )
}

/// [`embed_positions`] with an explicit [`Parallelism`].
///
/// # Errors
/// As [`embed_positions`]; then `out` is untouched.
// The arguments are `embed_positions`'s plus `par`, as for every `_with`.
#[allow(clippy::too_many_arguments)]
pub fn embed_positions_with<I: Index>(
    par: Parallelism,
    table: &[f32],
    position_table: &[f32],
    dim: usize,
    ids: &[I],
    seq_len: usize,
    scale: Option<f32>,
    out: &mut [f32],
) -> Result<(), EmbeddingError> {
    let rows = table_rows(table.len(), dim, Operand::Table)?;
    check_sequences(
        position_table.len(),
        dim,
        Operand::Positions,
        ids.len(),
        seq_len,
    )?;
    check_len(Operand::Output, rows_len(ids.len(), dim)?, out.len())?;
    let ids = ValidIds::new(ids, rows)?;
    embed_positions_valid(
        par,
        table,
        position_table,
        dim,
        ids.by_row(),
        seq_len,
        scale,
        out,
    );
    Ok(())
}

/// [`embed_positions_with`] after its checks, for a caller that made them
/// (not generic: [`ByRow`](crate::index::ByRow), compiled here, once):
/// `table` and `out` hold whole rows of `dim`, `out` one for each id, the
/// ids were checked against `table`'s row count and are `seq_len`-long
/// sequences, and `position_table` holds `seq_len` rows or more.
// `embed_positions_with`'s arguments, the ids checked.
#[allow(clippy::too_many_arguments)]
pub(crate) fn embed_positions_valid(
    par: Parallelism,
    table: &[f32],
    position_table: &[f32],
    dim: usize,
    ids: AnyValidIds<'_>,
    seq_len: usize,
    scale: Option<f32>,
    out: &mut [f32],
) {
    // Only the first `seq_len` rows are ever read.
    let position_table = &position_table[..seq_len * dim];
    each_row_type!(ids, |ids| match scale {
        None => {
            let op = AddPosition::<false>::new(position_table, dim, seq_len, 1.0);
            gather::drive(par, table, dim, ids, out, op);
        }
        Some(s) => {
            let op = AddPosition::<true>::new(position_table, dim, seq_len, s);
            gather::drive(par, table, dim, ids, out, op);
        }
    })
}

/// The backward of [`embed_positions`], accumulated into both tables'
/// gradients (`+=`, like [`scatter_add`](crate::scatter_add)):
///
/// ```text
/// grad_table[ids[b, t], :] += grad_output[b, t, :] * scale
/// grad_position_table[t, :] += grad_output[b, t, :]
/// ```
///
/// Every row of either gradient is summed in position order (`b, t`
/// row-major), so the result is the same bits for any thread count:
/// `grad_table` equals multiplying every value of `grad_output` by `scale`
/// (each product rounded, no fused multiply-add) and then
/// [`scatter_add`](crate::scatter_add); `grad_position_table[t]` equals adding
/// `grad_output[0, t]`, `grad_output[1, t]`, … in turn. `scale: None` adds
/// the gradient itself, with no multiply. `grad_output` is read once, for
/// both tables.
///
/// `grad_table` is `num_embeddings × dim`; `grad_position_table` is
/// `max_len × dim` with `max_len ≥ seq_len` (rows from `seq_len` on are left
/// alone); `ids` is a flat `[batch, seq_len]` batch; `grad_output` holds
/// `ids.len() × dim` values.
///
/// # Errors
/// Checked in this order, and then both gradients are untouched:
/// [`ZeroDimWithData`](EmbeddingError::ZeroDimWithData) or
/// [`NotMultipleOfDim`](EmbeddingError::NotMultipleOfDim) for `grad_table`
/// ([`Operand::GradTable`]), then for `grad_position_table`
/// ([`Operand::GradPositions`]); [`IdsShape`](EmbeddingError::IdsShape) and
/// [`SequenceTooLong`](EmbeddingError::SequenceTooLong) as in
/// [`embed_positions`] (`max_len` is the row count of `grad_position_table`);
/// [`SizeOverflow`](EmbeddingError::SizeOverflow) or
/// [`LengthMismatch`](EmbeddingError::LengthMismatch) for `grad_output`
/// ([`Operand::GradOutput`]);
/// [`IndexOutOfRange`](EmbeddingError::IndexOutOfRange) for the first bad id.
///
/// # Example
/// ```
/// use embedding_kernels::embed_positions_backward;
/// let grad_output = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]; // 2 × 2 × dim 2
/// let ids = [1u32, 0, 1, 1];
/// let mut grad_table = [0.0f32; 4];
/// let mut grad_position_table = [0.0f32; 6]; // max_len 3: row 2 stays 0
/// embed_positions_backward(&grad_output, 2, &ids, 2, Some(0.5),
///                          &mut grad_table, &mut grad_position_table)?;
/// assert_eq!(grad_table, [1.5, 2.0, 6.5, 8.0]);
/// assert_eq!(grad_position_table, [6.0, 8.0, 10.0, 12.0, 0.0, 0.0]);
/// # Ok::<(), embedding_kernels::EmbeddingError>(())
/// ```
pub fn embed_positions_backward<I: Index>(
    grad_output: &[f32],
    dim: usize,
    ids: &[I],
    seq_len: usize,
    scale: Option<f32>,
    grad_table: &mut [f32],
    grad_position_table: &mut [f32],
) -> Result<(), EmbeddingError> {
    embed_positions_backward_with(
        Parallelism::Auto,
        grad_output,
        dim,
        ids,
        seq_len,
        scale,
        grad_table,
        grad_position_table,
    )
}

/// [`embed_positions_backward`] with an explicit [`Parallelism`].
///
/// # Errors
/// As [`embed_positions_backward`]; then both gradients are untouched.
// The arguments are `embed_positions_backward`'s plus `par`, as for every
// `_with`.
#[allow(clippy::too_many_arguments)]
pub fn embed_positions_backward_with<I: Index>(
    par: Parallelism,
    grad_output: &[f32],
    dim: usize,
    ids: &[I],
    seq_len: usize,
    scale: Option<f32>,
    grad_table: &mut [f32],
    grad_position_table: &mut [f32],
) -> Result<(), EmbeddingError> {
    let rows = table_rows(grad_table.len(), dim, Operand::GradTable)?;
    check_sequences(
        grad_position_table.len(),
        dim,
        Operand::GradPositions,
        ids.len(),
        seq_len,
    )?;
    check_len(
        Operand::GradOutput,
        rows_len(ids.len(), dim)?,
        grad_output.len(),
    )?;
    let ids = ValidIds::new(ids, rows)?.by_row();
    let grad_position_table = Some((&mut grad_position_table[..seq_len * dim], seq_len));
    let positions = grad_position_table;
    scatter::scatter_valid(par, grad_output, dim, ids, scale, grad_table, positions);
    Ok(())
}

/// The checks both directions make after their table's (trick 5): the
/// position table `operand` (of `position_table_len` values) is whole rows of
/// `dim`, the `ids_len` ids are whole sequences of `seq_len`, and a sequence
/// fits in the position table.
fn check_sequences(
    position_table_len: usize,
    dim: usize,
    operand: Operand,
    ids_len: usize,
    seq_len: usize,
) -> Result<(), EmbeddingError> {
    let max_len = table_rows(position_table_len, dim, operand)?;
    let whole = match ids_len.checked_rem(seq_len) {
        Some(rest) => rest == 0,
        None => ids_len == 0,
    };
    if !whole {
        return Err(EmbeddingError::IdsShape {
            shape: vec![ids_len.checked_div(seq_len).unwrap_or(0), seq_len],
            len: ids_len,
        });
    }
    if seq_len > max_len {
        return Err(EmbeddingError::SequenceTooLong { seq_len, max_len });
    }
    Ok(())
}

/// `dst = src * scale + position_table[t]`, or `dst = src + position_table[t]` when
/// `SCALED` is false, where `t` counts the output rows modulo `seq_len`
/// (trick 3). Whether to scale is a constant, so neither loop decides it per
/// row.
#[derive(Clone, Copy)]
struct AddPosition<'a, const SCALED: bool> {
    /// The first `seq_len` rows of the position table.
    position_table: &'a [f32],
    dim: usize,
    seq_len: usize,
    scale: f32,
    /// The position of the next output row.
    next: usize,
}

impl<'a, const SCALED: bool> AddPosition<'a, SCALED> {
    fn new(position_table: &'a [f32], dim: usize, seq_len: usize, scale: f32) -> Self {
        debug_assert_eq!(position_table.len(), seq_len * dim);
        AddPosition {
            position_table,
            dim,
            seq_len,
            scale,
            next: 0,
        }
    }
}

impl<const SCALED: bool> RowOp for AddPosition<'_, SCALED> {
    type Out = f32;

    #[inline(always)]
    fn at(mut self, first: usize) -> Self {
        // The driver only runs with ids, and the checks make `seq_len > 0`
        // whenever there are ids.
        self.next = first % self.seq_len;
        self
    }

    #[inline(always)]
    fn write<V: Lanes>(&mut self, dst: &mut [f32], src: &[f32]) {
        let start = self.next * self.dim;
        let position = &self.position_table[start..start + self.dim];
        let scale = SCALED.then_some(self.scale);
        row::scale_add_rows::<V>(dst, src, scale, position);
        self.next += 1;
        if self.next == self.seq_len {
            self.next = 0;
        }
    }
}
