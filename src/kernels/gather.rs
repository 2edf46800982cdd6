//! Forward: gather rows of the table.
//!
//! ```text
//! check table shape, out length, every id          (nothing written yet)
//! for i in 0..ids.len():                           (split across threads)
//!     prefetch table[ids[i + ahead]]         (about 4 KiB of rows ahead)
//!     out[i, :] = table[ids[i], :]        (* scale, for gather_scaled)
//! ```
//!
//! 1. **Checks first.** [`ValidIds`] scans the ids once, vectorised; the loop
//!    below only ever sees ids below the row count, so it cannot read out of
//!    bounds and never stops half way.
//! 2. **Rows.** Each row is copied (or scaled) by `simd/row.rs`, eight
//!    lanes at a time plus a scalar tail, so any `dim` works, in 256-bit
//!    registers where the CPU has AVX (`simd/mod.rs`). What is done
//!    to a row is a `RowOp` type, so the fused position kernel
//!    (`kernels/token_position.rs`) reuses this driver and loop unchanged.
//! 3. **Prefetch.** Ids are random, so the hardware prefetcher cannot guess
//!    the next row. The loop asks for row `i + ahead` while it copies row
//!    `i`, past its block's end into the next block's rows (a thread mostly
//!    takes the blocks in order), and warms the first `ahead` rows before
//!    the loop (a block taken out of order starts cold). Where rows are a
//!    whole number of lines, each row's hints are a count fixed once a call
//!    (`prefetch::RowLines`). `ahead` is about
//!    4 KiB of rows, between 4 and 32 rows (`gather_ahead`): 8 rows of
//!    recsys's 512 bytes, 4 of minilm's 1.5 KiB. The writes need line
//!    buffers as much as the reads, so a gather looks less far ahead than a
//!    bag (docs/design.md, "Gather and prefetch"). The hints go into L2,
//!    or into L1 where the L1 data cache is 48 KiB or more and the rows
//!    ahead span at most 8 KiB (`gather_hints_in_l1`);
//!    rows of one or two vectors (their own loop, `narrow_rows`) always go
//!    into L2. The plain stores write the output; streaming stores paid on
//!    some CPUs and lost on others, so no gather takes them
//!    (docs/design.md, "Gather and prefetch").
//! 4. **Threads.** The output is cut into blocks of whole rows, about a
//!    64th of the call each and at least `TASK_BYTES` (`task_bytes`); a 16th
//!    for a call shared by its caller and one pool thread, where each block
//!    costs a hand-off between the two. Rayon hands the blocks to the threads of the
//!    pool the caller runs in. Blocks are disjoint, so there is nothing to
//!    synchronise and the result cannot depend on the thread count. Below
//!    2 MiB of output, [`Parallelism::Auto`] (the default) keeps the call on
//!    the calling thread, or shares it with one pool thread when it follows
//!    another such call closely (calls in a loop; `parallel.rs`).

use super::slot::Slot;
use super::tuning::{
    PARALLEL_MIN_BYTES, PREFETCH_MIN_TABLE_BYTES, gather_ahead, gather_hints_in_l1, task_bytes,
};
use crate::error::{EmbeddingError, Operand};
use crate::index::{AnyValidIds, Index, RowId, ValidIds, check_splits, each_row_type, run_rows};
use crate::parallel::{Parallelism, for_each_chunk, in_pool};
use crate::shape::{check_len, rows_len, table_rows};
use crate::simd::prefetch::{self, L1, L2, Level};
use crate::simd::{Body, Isa, Lanes, row};
use core::mem::MaybeUninit;

/// `out[i, :] = table[ids[i], :]` for every `i`.
///
/// `table` is `num_embeddings × dim`, row-major; `out` must hold
/// `ids.len() × dim` values. Runs on the caller's rayon pool when the call is
/// large enough to pay for it.
///
/// # Errors
/// A shape error or [`EmbeddingError::IndexOutOfRange`]; then `out` is
/// untouched.
///
/// # Example
/// ```
/// use embedding_kernels::gather;
/// let table = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]; // 3 rows of dim 2
/// let mut out = [0.0f32; 4];
/// gather(&table, 2, &[2i64, 0], &mut out)?;
/// assert_eq!(out, [2.0, 2.5, 0.0, 0.5]);
/// assert!(gather(&table, 2, &[3i64, 0], &mut out).is_err());
/// # Ok::<(), embedding_kernels::EmbeddingError>(())
/// ```
pub fn gather<I: Index>(
    table: &[f32],
    dim: usize,
    ids: &[I],
    out: &mut [f32],
) -> Result<(), EmbeddingError> {
    gather_with(Parallelism::Auto, table, dim, ids, out)
}

/// [`gather`] with an explicit [`Parallelism`].
pub fn gather_with<I: Index>(
    par: Parallelism,
    table: &[f32],
    dim: usize,
    ids: &[I],
    out: &mut [f32],
) -> Result<(), EmbeddingError> {
    in_pool(check_splits(par, ids), || {
        let ids = check(par, table, dim, ids, out)?;
        gather_checked(par, table, dim, ids.by_row(), None, out);
        Ok(())
    })
}

/// The lookup of [`gather_with`] (no `scale`) or [`gather_scaled_with`]
/// after its checks. Not generic ([`ByRow`](crate::index::ByRow)):
/// compiled here, once.
fn gather_checked(
    par: Parallelism,
    table: &[f32],
    dim: usize,
    ids: AnyValidIds<'_>,
    scale: Option<f32>,
    out: &mut [f32],
) {
    each_row_type!(ids, |ids| match scale {
        Some(scale) => drive(par, table, dim, ids, out, ScaleRow(scale)),
        None => drive(par, table, dim, ids, out, CopyRow),
    })
}

/// `out[i, :] = table[ids[i], :] * scale` for every `i`, in one pass (the
/// `sqrt(d_model)` of a transformer's input embedding).
///
/// Each value is one IEEE multiplication, so the result has the same bits as
/// [`gather`] followed by a separate scaling pass.
///
/// # Errors
/// As [`gather`].
pub fn gather_scaled<I: Index>(
    table: &[f32],
    dim: usize,
    ids: &[I],
    scale: f32,
    out: &mut [f32],
) -> Result<(), EmbeddingError> {
    gather_scaled_with(Parallelism::Auto, table, dim, ids, scale, out)
}

/// [`gather_scaled`] with an explicit [`Parallelism`].
pub fn gather_scaled_with<I: Index>(
    par: Parallelism,
    table: &[f32],
    dim: usize,
    ids: &[I],
    scale: f32,
    out: &mut [f32],
) -> Result<(), EmbeddingError> {
    in_pool(check_splits(par, ids), || {
        let ids = check(par, table, dim, ids, out)?;
        gather_checked(par, table, dim, ids.by_row(), Some(scale), out);
        Ok(())
    })
}

/// [`gather_with`] on ids already checked against `table` (the layer checks
/// them once, renormalises, then looks up).
pub(crate) fn gather_valid(
    par: Parallelism,
    table: &[f32],
    dim: usize,
    ids: AnyValidIds<'_>,
    out: &mut [f32],
) {
    each_row_type!(ids, |ids| drive(par, table, dim, ids, out, CopyRow));
}

/// The front door: every check, in the crate's order, before any write
/// (the ids' scan split across threads as `par` allows).
pub(crate) fn check<'a, I: Index>(
    par: Parallelism,
    table: &[f32],
    dim: usize,
    ids: &'a [I],
    out: &[f32],
) -> Result<ValidIds<'a, I::Row>, EmbeddingError> {
    let rows = table_rows(table.len(), dim, Operand::Table)?;
    let out_len = rows_len(ids.len(), dim)?;
    check_len(Operand::Output, out_len, out.len())?;
    ValidIds::new_with(par, ids, rows)
}

/// What a gather writes into each output row, given the table row it read:
/// a copy, a scaled copy, or (in [`token_position`](super::token_position)) a scaled
/// copy plus a position row.
///
/// The operation is a type, so each one gets its own loop with nothing to
/// decide per row. A block of the output is written row after row; the driver
/// first places a copy of the operation at the block's first row with
/// [`at`](RowOp::at), so an operation that depends on the row number can
/// count rows instead of dividing for each one.
pub(crate) trait RowOp: Copy + Send + Sync {
    /// What the output holds: `f32`, or `MaybeUninit<f32>` for an output
    /// that is fresh memory ([`FillRow`]).
    type Out: Send;

    /// This operation, placed so that its next row is row `first` of the
    /// whole output; the operation itself for one that does not count rows.
    #[inline(always)]
    fn at(self, _first: usize) -> Self {
        self
    }

    /// Writes the next output row, `dst`, from the table row `src` (both
    /// `dim` long), with lanes `V`.
    fn write<V: Lanes>(&mut self, dst: &mut [Self::Out], src: &[f32]);

    /// Ends a piece of the output, before another thread may read it.
    #[inline(always)]
    fn finish(&self) {}
}

/// `dst = src`: [`gather`], a vector at a time from each row's start
/// ([`row::copy_plain`]).
#[derive(Clone, Copy)]
struct CopyRow;

impl RowOp for CopyRow {
    type Out = f32;

    #[inline(always)]
    fn write<V: Lanes>(&mut self, dst: &mut [f32], src: &[f32]) {
        row::copy_plain::<V>(dst, src);
    }
}

/// `dst = src * scale`: [`gather_scaled`].
#[derive(Clone, Copy)]
struct ScaleRow(f32);

impl RowOp for ScaleRow {
    type Out = f32;

    #[inline(always)]
    fn write<V: Lanes>(&mut self, dst: &mut [f32], src: &[f32]) {
        row::scale::<V>(dst, src, self.0);
    }
}

/// `dst = src` into memory not written before: [`gather_fresh`]. Each value
/// is written once, as the bags write theirs ([`Slot::put`]: arrays of a
/// known size, which compile to the moves of a copy).
#[derive(Clone, Copy)]
struct FillRow;

impl RowOp for FillRow {
    type Out = MaybeUninit<f32>;

    #[inline(always)]
    fn write<V: Lanes>(&mut self, dst: &mut [MaybeUninit<f32>], src: &[f32]) {
        Slot::put(dst, src);
    }
}

/// [`gather_valid`] into `values`, replacing what it held: the output of
/// an allocating lookup, each value written once (not zeroed, then
/// written). A caller that allocates `values` beforehand (with room for
/// `ids × dim` values) has it used as it is; otherwise it grows here.
/// Large outputs are advised into huge pages before their first touch.
///
/// # Errors
/// [`EmbeddingError::SizeOverflow`] or
/// [`EmbeddingError::AllocationFailed`] for the output; then `values` is
/// empty.
pub(crate) fn gather_fresh(
    par: Parallelism,
    table: &[f32],
    dim: usize,
    ids: AnyValidIds<'_>,
    values: &mut Vec<f32>,
) -> Result<(), EmbeddingError> {
    each_row_type!(ids, |ids| {
        let fresh = crate::memory::fresh_floats(values, ids.len(), dim, "output")?;
        let len = fresh.len();
        drive(par, table, dim, ids, fresh, FillRow);
        // SAFETY: `drive` wrote all of `spare_capacity_mut()[..len]`: each
        // of the `ids.len()` rows of `dim` values, split among tasks or
        // not, went through `FillRow::write`, whose `Slot::put` writes all
        // of its row when the source row is as long, as it is in every loop
        // of `GatherBlock` (the narrow one too: both are `dim` values), and
        // `drive` returns only after every task. With `dim == 0` or no ids,
        // `len` is 0. The capacity is `len` or more (`memory::fresh_floats`
        // reserved `ids.len() × dim`, `len`, values).
        #[allow(unsafe_code)]
        unsafe {
            values.set_len(len)
        };
    });
    Ok(())
}

/// Splits the work (or not) and runs a [`GatherBlock`] on each piece, with
/// `op` placed at the piece's first row.
pub(crate) fn drive<I: RowId, Op: RowOp>(
    par: Parallelism,
    table: &[f32],
    dim: usize,
    ids: ValidIds<'_, I>,
    out: &mut [Op::Out],
    op: Op,
) {
    if dim == 0 || ids.is_empty() {
        return;
    }
    let isa = Isa::detect();
    for_each_row_block(par, out, dim, dim * 4, |first, out| {
        let op = op.at(first);
        run_rows::<I, _>(
            isa,
            GatherBlock {
                piece: Piece { table, ids, first },
                dim,
                out,
                op,
            },
        );
    });
}

/// Runs `f(first_row, block)` over `out` (rows of `dim` values, each read
/// from a table row of `row_bytes`) as `par` plans a call of `out`'s bytes:
/// the whole of it from row 0, or blocks of rows, each about a
/// [`task_bytes`] share of the rows read.
pub(crate) fn for_each_row_block<T, F>(
    par: Parallelism,
    out: &mut [T],
    dim: usize,
    row_bytes: usize,
    f: F,
) where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync,
{
    let row_bytes = row_bytes.max(1);
    let rows = out.len() / dim.max(1);
    let plan = par.plan(core::mem::size_of_val(out), PARALLEL_MIN_BYTES);
    let rows_per_task = (task_bytes(plan, rows.saturating_mul(row_bytes)) / row_bytes).max(1);
    for_each_chunk(plan, out, rows_per_task * dim, |task, block| {
        f(task * rows_per_task, block)
    });
}

/// One piece of a gather: `out[i, :] = op(table[ids[first + i], :])` for
/// its rows. The one loop body, shared by the serial and the parallel
/// driver.
struct GatherBlock<'a, 'i, I: RowId, Op: RowOp> {
    piece: Piece<'a, 'i, I>,
    dim: usize,
    out: &'a mut [Op::Out],
    op: Op,
}

impl<I: RowId, Op: RowOp> Body for GatherBlock<'_, '_, I, Op> {
    type Output = ();

    #[inline(always)]
    fn run<V: Lanes>(self) {
        let GatherBlock {
            piece,
            dim,
            out,
            mut op,
        } = self;
        let Piece { table, ids, first } = piece;
        if core::mem::size_of_val(table) < PREFETCH_MIN_TABLE_BYTES {
            // A table this small sits in the caches: hints would only
            // cost instructions.
            for (i, dst) in (first..).zip(out.chunks_exact_mut(dim)) {
                let start = ids.row(i) * dim;
                op.write::<V>(dst, &table[start..start + dim]);
            }
            op.finish();
            return;
        }
        // Rows of one or two vectors go through a loop of their own, their
        // width a constant: a row's offset is a shift, its copy one or two
        // moves, its hints a fixed count, and the ids walked as two slices
        // with no test a row, where the general loop's multiply, tail test
        // and hint count cost as much as the copy (docs/design.md, "Gather
        // and prefetch"). Wider rows keep the general loop, which was
        // faster on recsys and gpt2 than this one (their tasks are a few
        // rows, all hinted ahead).
        if dim == V::WIDTH {
            narrow_rows::<V, I, Op>(piece, V::WIDTH, out, &mut op);
        } else if dim == 2 * V::WIDTH {
            narrow_rows::<V, I, Op>(piece, 2 * V::WIDTH, out, &mut op);
        } else if gather_hints_in_l1(dim) {
            wide_rows::<V, I, Op, L1>(piece, dim, out, &mut op);
        } else {
            wide_rows::<V, I, Op, L2>(piece, dim, out, &mut op);
        }
        op.finish();
    }
}

/// What a piece of a gather reads: the table, the call's ids (not only the
/// piece's: the rows it hints ahead run on into the next piece's, which a
/// thread mostly takes next and then starts with its rows on the way), and
/// the position of the piece's first row among them.
#[derive(Clone, Copy)]
struct Piece<'a, 'i, I: RowId> {
    table: &'a [f32],
    ids: ValidIds<'i, I>,
    first: usize,
}

/// The piece's rows (as many as `out` holds, `dim` values each) into `out`
/// through `op`, each row hinted into `L` [`gather_ahead`] rows before it
/// is read: the loop for rows of any width.
#[inline(always)]
fn wide_rows<V: Lanes, I: RowId, Op: RowOp, L: Level>(
    piece: Piece<'_, '_, I>,
    dim: usize,
    out: &mut [Op::Out],
    op: &mut Op,
) {
    let Piece { table, ids, first } = piece;
    let n = ids.len();
    let ahead = gather_ahead(dim);
    let span = prefetch::RowLines::of(table.get(..dim).unwrap_or(&[]), dim);
    // Warm the first rows too: a piece taken out of order starts cold.
    for i in first..n.min(first + ahead) {
        let start = ids.row(i) * dim;
        span.hint::<L>(&table[start..start + dim]);
    }
    for (i, dst) in (first..).zip(out.chunks_exact_mut(dim)) {
        if i + ahead < n {
            let next = ids.row(i + ahead) * dim;
            span.hint::<L>(&table[next..next + dim]);
        }
        let start = ids.row(i) * dim;
        op.write::<V>(dst, &table[start..start + dim]);
    }
}

/// [`wide_rows`] for rows of one or two vectors, hinted into L2: `dim` is
/// a constant of the caller. The rows that have a row to hint (all but the
/// call's last `ahead`) walk the ids and the ids `ahead` on as two slices
/// (no test a row), the rest follow unhinted.
#[inline(always)]
fn narrow_rows<V: Lanes, I: RowId, Op: RowOp>(
    piece: Piece<'_, '_, I>,
    dim: usize,
    out: &mut [Op::Out],
    op: &mut Op,
) {
    let Piece { table, ids, first } = piece;
    let (n, end) = (out.len() / dim, ids.len());
    let ahead = gather_ahead(dim);
    let hinted = n.min(end.saturating_sub(first + ahead));
    let base = table.as_ptr().cast::<u8>();
    // Warm the first rows too: a piece taken out of order starts cold.
    for r in ids.slice(first..end.min(first + ahead)).rows() {
        prefetch::bytes::<L2>(base, r * dim * 4, dim * 4);
    }
    let (with_hints, rest) = out.split_at_mut(hinted * dim);
    let here = ids.slice(first..first + hinted);
    // Where no row has a row to hint (`hinted` 0: fewer than `ahead` ids
    // left in the call), `first + ahead` may lie past the ids.
    let from = end.min(first + ahead);
    let next = ids.slice(from..from + hinted);
    // By the pairs' one count: zipped with the output's rows as well, each
    // step would test both.
    for (k, r, q) in here.rows_beside(&next) {
        prefetch::bytes::<L2>(base, q * dim * 4, dim * 4);
        let dst = &mut with_hints[k * dim..k * dim + dim];
        op.write::<V>(dst, &table[r * dim..r * dim + dim]);
    }
    for (dst, r) in rest
        .chunks_exact_mut(dim)
        .zip(ids.slice(first + hinted..first + n).rows())
    {
        op.write::<V>(dst, &table[r * dim..r * dim + dim]);
    }
}

#[cfg(test)]
mod tests {
    use super::for_each_row_block;
    use crate::kernels::tuning::{SHARED_TASKS, TASKS_PER_CALL};
    use crate::parallel::{Parallelism, with_forced_share};
    use std::sync::Mutex;

    /// The row blocks a call is cut into, as `(first_row, rows)`, in order.
    fn blocks(par: Parallelism, rows: usize, dim: usize) -> Vec<(usize, usize)> {
        let seen = Mutex::new(Vec::new());
        let mut out = vec![0u8; rows * dim];
        for_each_row_block(par, &mut out, dim, dim * 4, |first, block| {
            seen.lock().unwrap().push((first, block.len() / dim));
        });
        let mut seen = seen.into_inner().unwrap();
        seen.sort_unstable();
        seen
    }

    /// A call shared between its caller and one pool thread is cut into
    /// [`SHARED_TASKS`] blocks, a call handed to a pool of two threads into
    /// [`TASKS_PER_CALL`]: whole rows, each row once, in order.
    #[test]
    fn shared_calls_take_fewer_blocks_than_pool_calls() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        // tiny's gather: 4 096 rows of 256 bytes read, 1 MiB.
        let (rows, dim) = (4096, 64);
        let (shared, pooled) = pool.install(|| {
            let shared = with_forced_share(|| blocks(Parallelism::Auto, rows, dim));
            (shared, blocks(Parallelism::Rayon, rows, dim))
        });
        for (what, cut, tasks) in [
            ("shared", &shared, SHARED_TASKS),
            ("pool", &pooled, TASKS_PER_CALL),
        ] {
            assert_eq!(cut.len(), tasks, "{what}: {cut:?}");
            let mut next = 0;
            for &(first, n) in cut {
                assert_eq!(first, next, "{what}: {cut:?}");
                next += n;
            }
            assert_eq!(next, rows, "{what}");
        }
    }
}
