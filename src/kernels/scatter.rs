//! Backward: scatter-add output gradients into the table's gradient.
//!
//! ```text
//! check grad_table shape, grad_output length, every id   (nothing written)
//! cut the columns 0..dim into blocks of whole cache lines, one per thread
//! each block, in parallel:
//!     for p in 0..n (in order):
//!         prefetch grad_table[ids[p + ahead], block]   (~16 KiB ahead)
//!         grad_table[ids[p], block] += grad_output[p, block]   (* scale: trick 7)
//!         (grad_position_table[p mod seq_len, block] += the same: trick 8)
//! ```
//!
//! 1. **Determinism without atomics or locks.** Every value of `grad_table`
//!    belongs to exactly one block, and that block's task adds its gradients
//!    in position order, which is what the sequential loop does. So every
//!    thread count gives the sequential loop's bits, which are also the bits
//!    of the one-hot reference. One thread is just one block of all columns.
//! 2. **Hot ids cost nothing extra.** Work is split by columns, not rows, so
//!    every task does the same share of every id: a batch where one id holds
//!    90 % of the positions is as balanced as a uniform one.
//! 3. **Streams stay streams.** Each task reads `ids` and its columns of
//!    `grad_output` front to back, as the sequential loop does; only the
//!    table rows are random, and those are prefetched about 16 KiB of
//!    rows ahead (4 to 32 positions, as in the gather).
//!    (A sort of positions by id, then whole rows per task, was tried first:
//!    it turned `grad_output` into a random stream and ran slower than one
//!    thread on every workload of the report.)
//! 4. **Cache lines are never shared.** Block borders sit on 64-byte lines
//!    of the actual table address (when `dim` is a multiple of 16 floats,
//!    every row's lines line up), so two threads never write one line. A
//!    block is at least 16 floats, so rows narrower than 32 floats
//!    (`dim < 32`, one or two lines) run on one thread.
//! 5. **The one `unsafe`.** Blocks of one row are interleaved in memory, so
//!    `split_at_mut` cannot hand them out. `SharedColumns` does, from a
//!    raw pointer, with the bounds checked on every access; what it relies
//!    on is only that the blocks are disjoint column ranges.
//! 6. **Small calls** (under 8 MiB of gradient with [`Parallelism::Auto`],
//!    or a one-thread pool) run as one block on the calling thread: every
//!    task reads every id, which pays only once rows come from DRAM.
//! 7. **Scaled gradients cost the plain scatter nothing.** How a row is added
//!    (`+= g` or `+= g * scale`, the product rounded before the sum, never a
//!    fused multiply-add) is a type, `AddRow`, chosen once per call, so
//!    [`scatter_add`] compiles to the loop it always was: no multiply, no
//!    branch. [`scatter_add_scaled`] therefore equals scaling every gradient
//!    first and then calling [`scatter_add`], bit for bit.
//! 8. **Position gradients ride along.** The fused backward of
//!    `kernels/token_position.rs` also needs `grad_position_table[p % seq_len] +=
//!    grad_output[p]`. The same loop does it (a `PositionTableSink`, again a
//!    type, and nothing for the plain scatter): it reads each gradient row
//!    once for both tables instead of twice, and a task owns the same
//!    columns of both tables, so the position rows are also summed in
//!    position order (batch 0, 1, …) on any thread count. Only the table's
//!    address places the column borders, so when the two tables sit at
//!    different offsets within a cache line, the border lines of the
//!    position rows are written by two threads: slower (they share those
//!    lines) but never wrong, since no value belongs to two blocks.

use super::tuning::{LINE_FLOATS, SCATTER_PARALLEL_MIN_BYTES, prefetch_ahead};
use crate::error::{EmbeddingError, Operand};
use crate::index::{AnyValidIds, Index, RowId, ValidIds, each_row_type, run_rows};
use crate::parallel::Parallelism;
use crate::shape::{check_len, rows_len, table_rows};
use crate::simd::prefetch::{L1, RowLines};
use crate::simd::{Body, Isa, Lanes, row};
use core::marker::PhantomData;
use core::ops::Range;

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
    scatter_add_with(Parallelism::Auto, grad_output, dim, ids, grad_table)
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
    scatter_valid(par, grad_output, dim, ids.by_row(), None, grad_table, None);
    Ok(())
}

/// `grad_table[ids[i], :] += grad_output[i, :] * scale` for every `i`,
/// accumulating into what `grad_table` already holds: the backward of
/// [`gather_scaled`](crate::gather_scaled).
///
/// Each product is rounded before it is added (no fused multiply-add), so
/// the result is bitwise identical to multiplying every value of
/// `grad_output` by `scale` and then calling [`scatter_add`], for any thread
/// count and any pattern of repeated ids.
///
/// # Errors
/// As [`scatter_add`]; then `grad_table` is untouched.
///
/// # Example
/// ```
/// use embedding_kernels::scatter_add_scaled;
/// let mut grad = [0.0f32; 4]; // 2 rows of dim 2
/// scatter_add_scaled(&[1.0, 2.0, 10.0, 20.0], 2, &[1u32, 1], 0.5, &mut grad)?;
/// assert_eq!(grad, [0.0, 0.0, 5.5, 11.0]);
/// # Ok::<(), embedding_kernels::EmbeddingError>(())
/// ```
pub fn scatter_add_scaled<I: Index>(
    grad_output: &[f32],
    dim: usize,
    ids: &[I],
    scale: f32,
    grad_table: &mut [f32],
) -> Result<(), EmbeddingError> {
    scatter_add_scaled_with(Parallelism::Auto, grad_output, dim, ids, scale, grad_table)
}

/// [`scatter_add_scaled`] with an explicit [`Parallelism`].
///
/// # Errors
/// As [`scatter_add`]; then `grad_table` is untouched.
pub fn scatter_add_scaled_with<I: Index>(
    par: Parallelism,
    grad_output: &[f32],
    dim: usize,
    ids: &[I],
    scale: f32,
    grad_table: &mut [f32],
) -> Result<(), EmbeddingError> {
    let ids = check(grad_output, dim, ids, grad_table)?;
    let ids = ids.by_row();
    scatter_valid(par, grad_output, dim, ids, Some(scale), grad_table, None);
    Ok(())
}

/// The front door: every check, in the crate's order, before any write.
pub(crate) fn check<'a, I: Index>(
    grad_output: &[f32],
    dim: usize,
    ids: &'a [I],
    grad_table: &[f32],
) -> Result<ValidIds<'a, I::Row>, EmbeddingError> {
    let rows = table_rows(grad_table.len(), dim, Operand::GradTable)?;
    let len = rows_len(ids.len(), dim)?;
    check_len(Operand::GradOutput, len, grad_output.len())?;
    ValidIds::new(ids, rows)
}

/// [`drive`] with each gradient row times `scale` (when there is one). Not
/// generic, like each entry point of the scatter: its kernels are compiled
/// here, for both row types.
pub(crate) fn scatter_valid(
    par: Parallelism,
    grad_output: &[f32],
    dim: usize,
    ids: AnyValidIds<'_>,
    scale: Option<f32>,
    grad_table: &mut [f32],
    grad_position_table: Option<(&mut [f32], usize)>,
) {
    let positions = grad_position_table;
    each_row_type!(ids, |ids| match scale {
        None => drive(par, grad_output, dim, ids, grad_table, Unscaled, positions),
        Some(s) => drive(par, grad_output, dim, ids, grad_table, Scaled(s), positions),
    })
}

/// The checked call's body: adds every gradient row into its table row
/// (through `add`), and into row `p % seq_len` of `grad_position_table` when
/// that is given as `Some((grad_position_table, seq_len))`, with `seq_len > 0`
/// and `grad_position_table` holding at least `seq_len` rows of `dim`.
///
/// Splits the columns across the pool when the call is worth it (trick 1),
/// and otherwise runs one block of all columns on the calling thread.
fn drive<I: RowId, A: AddRow>(
    par: Parallelism,
    grad_output: &[f32],
    dim: usize,
    ids: ValidIds<'_, I>,
    grad_table: &mut [f32],
    add: A,
    grad_position_table: Option<(&mut [f32], usize)>,
) {
    if dim == 0 || ids.is_empty() {
        return;
    }
    if dim >= 2 * LINE_FLOATS
        && par.splits(
            core::mem::size_of_val(grad_output),
            SCATTER_PARALLEL_MIN_BYTES,
        )
    {
        let blocks = column_blocks(
            dim,
            grad_table.as_ptr() as usize,
            crate::executor::threads(),
        );
        let table = SharedColumns::new(grad_table, dim);
        match grad_position_table {
            None => crate::executor::for_each_part(blocks, |_, cols| {
                accumulate(grad_output, dim, ids, cols, &table, add, NoPositionTable);
            }),
            Some((grad_position_table, seq_len)) => {
                let position_table = SharedColumns::new(grad_position_table, dim);
                crate::executor::for_each_part(blocks, |_, cols| {
                    let sink = PositionTableRows::new(&position_table, seq_len);
                    accumulate(grad_output, dim, ids, cols, &table, add, sink);
                });
            }
        }
    } else {
        let table = Exclusive {
            table: grad_table,
            dim,
        };
        match grad_position_table {
            None => accumulate(grad_output, dim, ids, 0..dim, table, add, NoPositionTable),
            Some((grad_position_table, seq_len)) => {
                let rows = Exclusive {
                    table: grad_position_table,
                    dim,
                };
                let sink = PositionTableRows::new(rows, seq_len);
                accumulate(grad_output, dim, ids, 0..dim, table, add, sink);
            }
        }
    }
}

/// How a gradient row is added into its table row (trick 7).
pub(crate) trait AddRow: Copy + Send + Sync {
    /// `dst += src`, or a variation of it.
    fn add<V: Lanes>(self, dst: &mut [f32], src: &[f32]);
}

/// `dst += src`: [`scatter_add`].
#[derive(Clone, Copy)]
pub(crate) struct Unscaled;

impl AddRow for Unscaled {
    #[inline(always)]
    fn add<V: Lanes>(self, dst: &mut [f32], src: &[f32]) {
        row::add::<V>(dst, src);
    }
}

/// `dst += src * scale`, the product rounded first: [`scatter_add_scaled`].
#[derive(Clone, Copy)]
pub(crate) struct Scaled(pub(crate) f32);

impl AddRow for Scaled {
    #[inline(always)]
    fn add<V: Lanes>(self, dst: &mut [f32], src: &[f32]) {
        row::add_scaled::<V>(dst, src, self.0);
    }
}

/// Where each position's gradient goes besides its table row (trick 8).
trait PositionTableSink {
    /// Adds `src`, columns `cols` of the next position's gradient row.
    fn add_next<V: Lanes>(&mut self, cols: Range<usize>, src: &[f32]);
}

/// Nowhere: the plain scatters.
struct NoPositionTable;

impl PositionTableSink for NoPositionTable {
    #[inline(always)]
    fn add_next<V: Lanes>(&mut self, _cols: Range<usize>, _src: &[f32]) {}
}

/// Into row `p % seq_len` of a table of position gradients, for positions
/// `p = 0, 1, …` in turn; the row is counted, not divided out.
struct PositionTableRows<R> {
    rows: R,
    seq_len: usize,
    next: usize,
}

impl<R: ColumnRows> PositionTableRows<R> {
    fn new(rows: R, seq_len: usize) -> Self {
        debug_assert!(seq_len > 0, "a batch of ids needs seq_len > 0");
        PositionTableRows {
            rows,
            seq_len,
            next: 0,
        }
    }
}

impl<R: ColumnRows> PositionTableSink for PositionTableRows<R> {
    #[inline(always)]
    fn add_next<V: Lanes>(&mut self, cols: Range<usize>, src: &[f32]) {
        row::add::<V>(self.rows.columns(self.next, cols), src);
        self.next += 1;
        if self.next == self.seq_len {
            self.next = 0;
        }
    }
}

/// Splits columns `0..dim` into at most `threads` blocks whose borders fall
/// on cache-line borders of a table starting at address `base`.
fn column_blocks(dim: usize, base: usize, threads: usize) -> Vec<Range<usize>> {
    let blocks = (dim / LINE_FLOATS).min(threads).max(1);
    // Column `c` of a row starts a line when `c ≡ skew (mod LINE_FLOATS)`; this is
    // the same for every row only when `dim` is a multiple of LINE_FLOATS, and then
    // it is exact. Otherwise any multiple of LINE_FLOATS is as good as another.
    let skew = if dim.is_multiple_of(LINE_FLOATS) {
        (LINE_FLOATS - (base / 4) % LINE_FLOATS) % LINE_FLOATS
    } else {
        0
    };
    let mut cuts = vec![0];
    for k in 1..blocks {
        // In u128: `k × dim` may pass usize for a very wide row.
        let target = (k as u128 * dim as u128 / blocks as u128) as usize;
        // The line border at or below `target`.
        let cut = if target >= skew {
            target - (target - skew) % LINE_FLOATS
        } else {
            continue;
        };
        if cut > *cuts.last().unwrap_or(&0) && cut < dim {
            cuts.push(cut);
        }
    }
    cuts.push(dim);
    cuts.windows(2).map(|w| w[0]..w[1]).collect()
}

/// Where a task writes: columns of table rows.
trait ColumnRows {
    /// Columns `cols` of row `row`.
    fn columns(&mut self, row: usize, cols: Range<usize>) -> &mut [f32];
}

/// The loop body, shared by the one-block (serial) and the parallel driver:
/// for each position in order, add its `cols` into its row's `cols` (through
/// `add`), and hand them to `position_sink`.
#[inline(always)]
fn accumulate<I: RowId, R: ColumnRows, A: AddRow, P: PositionTableSink>(
    grad_output: &[f32],
    dim: usize,
    ids: ValidIds<'_, I>,
    cols: Range<usize>,
    table: R,
    add: A,
    position_sink: P,
) {
    run_rows::<I, _>(
        Isa::detect(),
        Accumulate {
            grad_output,
            dim,
            ids,
            cols,
            table,
            add,
            position_sink,
        },
    );
}

/// The arguments of [`accumulate`], run as a [`Body`].
struct Accumulate<'a, 'i, I: RowId, R, A, P> {
    grad_output: &'a [f32],
    dim: usize,
    ids: ValidIds<'i, I>,
    cols: Range<usize>,
    table: R,
    add: A,
    position_sink: P,
}

impl<I: RowId, R: ColumnRows, A: AddRow, P: PositionTableSink> Body
    for Accumulate<'_, '_, I, R, A, P>
{
    type Output = ();

    #[inline(always)]
    fn run<V: Lanes>(self) {
        let Accumulate {
            grad_output,
            dim,
            ids,
            cols,
            mut table,
            add,
            mut position_sink,
        } = self;
        let n = ids.len();
        if n == 0 {
            return;
        }
        let ahead = prefetch_ahead(cols.len());
        let span = RowLines::of(table.columns(ids.row(0), cols.clone()), dim);
        for p in 0..n {
            if p + ahead < n {
                span.hint::<L1>(table.columns(ids.row(p + ahead), cols.clone()));
            }
            let src = &grad_output[p * dim + cols.start..p * dim + cols.end];
            add.add::<V>(table.columns(ids.row(p), cols.clone()), src);
            position_sink.add_next::<V>(cols.clone(), src);
        }
    }
}

/// The whole table, owned by one task: plain slicing.
struct Exclusive<'a> {
    table: &'a mut [f32],
    dim: usize,
}

impl ColumnRows for Exclusive<'_> {
    #[inline(always)]
    fn columns(&mut self, row: usize, cols: Range<usize>) -> &mut [f32] {
        &mut self.table[row * self.dim + cols.start..row * self.dim + cols.end]
    }
}

/// The table shared by tasks that each own a disjoint range of columns
/// (trick 5). It borrows the table mutably for its whole life, so nothing
/// else can see the table while tasks write it.
struct SharedColumns<'a> {
    ptr: *mut f32,
    len: usize,
    dim: usize,
    _table: PhantomData<&'a mut [f32]>,
}

// SAFETY: a `SharedColumns` is a `&mut [f32]` in disguise; `f32` is `Send`,
// so the table may be written from other threads. Sharing it between tasks
// is sound because each task only ever asks for its own column range
// (`columns` documents the contract, and the one caller keeps it).
#[allow(unsafe_code)]
unsafe impl Send for SharedColumns<'_> {}
// SAFETY: as above.
#[allow(unsafe_code)]
unsafe impl Sync for SharedColumns<'_> {}

impl<'a> SharedColumns<'a> {
    fn new(table: &'a mut [f32], dim: usize) -> Self {
        SharedColumns {
            ptr: table.as_mut_ptr(),
            len: table.len(),
            dim,
            _table: PhantomData,
        }
    }
}

impl ColumnRows for &SharedColumns<'_> {
    /// Columns `cols` of row `row`. The bounds are checked, so this never
    /// reaches outside the table.
    ///
    /// The tasks sharing one `SharedColumns` must ask for pairwise disjoint
    /// column ranges (the blocks of [`column_blocks`]), and a task must not
    /// hold two results at once; then no two live `&mut` overlap.
    #[inline(always)]
    #[allow(unsafe_code)]
    fn columns(&mut self, row: usize, cols: Range<usize>) -> &mut [f32] {
        let start = row * self.dim + cols.start;
        let end = row * self.dim + cols.end;
        assert!(cols.start <= cols.end && cols.end <= self.dim && end <= self.len);
        // SAFETY: `start..end` lies inside the table (checked just above),
        // which `self` borrows mutably for `'a`, so the memory is valid and
        // nobody outside the tasks can touch it. Inside the tasks, each one
        // asks only for its own columns, disjoint from every other task's,
        // and drops each slice before asking for the next (the contract
        // above, kept by `accumulate` and `PositionTableRows`), so this slice
        // aliases no other live reference. (The fused backward shares a
        // second table the same way; the two are separate `&mut` borrows,
        // so slices of one never overlap slices of the other.)
        unsafe { core::slice::from_raw_parts_mut(self.ptr.add(start), end - start) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_blocks_cover_every_column_once_on_line_borders() {
        for dim in [1, 15, 16, 31, 32, 33, 64, 100, 128, 384, 768] {
            for base in [0usize, 4, 16, 48, 60] {
                for threads in [1, 2, 3, 8, 64] {
                    let blocks = column_blocks(dim, base, threads);
                    assert_eq!(blocks.first().map(|b| b.start), Some(0));
                    assert_eq!(blocks.last().map(|b| b.end), Some(dim));
                    assert!(blocks.windows(2).all(|w| w[0].end == w[1].start));
                    assert!(blocks.iter().all(|b| b.start < b.end));
                    assert!(blocks.len() <= threads.max(1));
                    if dim % LINE_FLOATS == 0 {
                        for b in &blocks[1..] {
                            assert_eq!(
                                (base / 4 + b.start) % LINE_FLOATS,
                                0,
                                "dim {dim} base {base} {blocks:?}"
                            );
                        }
                    }
                    if dim >= 2 * LINE_FLOATS && threads >= 2 {
                        assert!(
                            blocks.len() >= 2,
                            "dim {dim} base {base} threads {threads}: {blocks:?}"
                        );
                    }
                }
            }
        }
    }
}
