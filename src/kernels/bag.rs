//! Bags: gather rows and pool them (sum, mean or max) in one pass, as
//! PyTorch's `nn.EmbeddingBag`; and the backward of the pooling.
//!
//! ```text
//! check table, bags, weights, out, max_indices, every id   (nothing written)
//! for each bag b (blocks of bags split across threads):
//!     sum with AVX (any width), or without and at most 128 columns:
//!         for each block of 128 columns with AVX, 64 without (then smaller
//!         blocks of 8s, then single columns):
//!             acc = -0.0 in sixteen 256-bit registers (AVX) or eight f32x8
//!             for p in bag b, skipping padding_idx:
//!                 prefetch table[ids[p + ahead], block]   (at most 16 ahead)
//!                 acc += table[ids[p], block] (· weight[p])
//!             out[b, block] = acc (/ count, mean)  (written once)
//!     max with AVX (rows of whole f32x8s): as the sum, 64 columns a block,
//!         best values and their positions in registers
//!     sum of wider rows without AVX, and max otherwise:
//!         acc = first kept row (· weight)          (a scratch row, in L1)
//!         for the other p in bag b, skipping padding_idx:
//!             prefetch table[ids[p + ahead]]       (16 KiB of rows, at most 16)
//!             sum:  acc += table[ids[p], :] (· weight[p])
//!             max:  where table[ids[p], :] > acc: acc = it, at = p
//!         out[b, :] = acc (/ count, mean)          (written once)
//! ```
//!
//! 1. **Checks first.** The offsets are checked once into [`Bags`] (start at
//!    0, never decrease, never pass the number of ids), every id by
//!    [`ValidIds`], the buffers by length; then the loop cannot fail.
//! 2. **Registers for narrow rows, a scratch row for wide ones; never the
//!    output.** A sum over rows of up to 128 columns runs a block of 64
//!    columns at a time in eight `f32x8` accumulators, one pass over the
//!    bag per block, each pass prefetching its own block of the rows ahead
//!    (a bag of a few dozen rows stays in L1 or L2 between passes). On
//!    recsys (128 columns) that took the bag sum from 57-62 % of a same-run memcpy
//!    to 82 % (report, two alternating runs: 4.5-5.4 ms -> 3.5-4.5 ms).
//!    Where the CPU has AVX (checked at run time, `kernels/avx.rs`) the blocks are
//!    128 columns in sixteen 256-bit registers, for rows of any width: on
//!    recsys the sum then reaches 90-113 % of the memcpy, on gpt2 130-136 %.
//!    Without AVX, wider rows are summed a row at a time into a task-local
//!    row that stays in L1: with six passes a bag on minilm (384 columns)
//!    the SSE2 blocks measured no better, and an earlier version with
//!    32-column blocks lost there. Either way the output row is written
//!    once, at the end.
//!
//!    Every pass prefetches its own block of the row `ahead` positions on,
//!    so the hints are spread evenly over the passes; before, the first
//!    pass prefetched whole rows (24 hints a row on minilm, 48 on gpt2).
//!    A throwaway test program, medians of 77 calls each in one run, the
//!    two versions in a random order, every call after a memcpy of the
//!    workload's size: minilm 0.79 -> 0.69 ms, gpt2 3.63 -> 3.05 ms (on
//!    recsys a row is one block, so the hints are the same: 3.58 and 3.43
//!    ms, noise); back to back minilm 0.43 -> 0.38, gpt2 3.12 -> 2.55. The
//!    bag max shares the blocks. (The `T1` hint, into L2 only, measured the
//!    same as `T0`.)
//! 3. **Exact order.** Each bag is summed in position order, one rounded
//!    product and one rounded sum per term (no fused multiply-add), from
//!    `-0.0` (so the first term comes through as it is). These are the
//!    operations of the reference's bag matrix product (sums from `-0.0`),
//!    so `sum` matches it bit for bit on every thread count. `mean` divides the sum by the count (the reference multiplies
//!    by `1/len`: equal up to rounding). An empty bag (or one holding only
//!    `padding_idx`) is `+0.0`, as in PyTorch.
//! 4. **Max** keeps, per column, the first largest value (strictly greater
//!    replaces, so ties keep the earlier id and a NaN never replaces; a NaN
//!    in the first row stays), and the id it came from. The winner's
//!    position within the bag rides along as an `f32` (exact below 2^24;
//!    longer bags store the position's bits), chosen with the same compare
//!    mask as the value.
//! 5. **Threads.** Blocks of whole bags, about `TASK_BYTES` of output each;
//!    blocks are disjoint, so the result cannot depend on the thread count.
//! 6. **Backward** (sum and mean) is the grouped backward of
//!    [`grouped`] with each position's gradient row taken
//!    from its bag's row, times its weight (or `1/len`): dense (each row
//!    written once), coalesced sparse, or fused into an optimiser. Max's
//!    backward adds each output column's gradient to the row that won it,
//!    bag by bag in order.

use super::avx::{self, Avx};
use super::grouped::{self, Groups, Source};
use super::row::LANES;
use super::{prefetch_ahead, row, PARALLEL_MIN_BYTES, TASK_BYTES};
use crate::bags::Bags;
use crate::error::{EmbeddingError, Operand};
use crate::index::{Index, ValidIds};
use crate::parallel::Parallelism;
use crate::pooling::{Mode, Pooling};
use crate::shape::{check_len, rows_len, table_rows};
use crate::sparse_grad::SparseGrad;
use core::ops::Range;
use rayon::prelude::*;
use wide::f32x8;

/// Bag sizes up to which the max's winner position is exact in an `f32`.
const MAX_EXACT_POSITION: usize = 1 << 24;

/// The argument checks every bag call shares, in the crate's order: table,
/// bags against the ids, `per_sample_weights` (mode, then length), the
/// padding row. The ids come last, after the caller's buffers. Returns the
/// row count.
fn check_arguments<I: Index>(
    table_len: usize,
    dim: usize,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
) -> Result<usize, EmbeddingError> {
    let rows = table_rows(table_len, dim, Operand::Table)?;
    check_len(Operand::Ids, bags.num_ids(), ids.len())?;
    if let Some(weights) = pooling.per_sample_weights {
        if pooling.mode != Mode::Sum {
            return Err(EmbeddingError::PerSampleWeightsNeedSum { mode: pooling.mode });
        }
        check_len(Operand::PerSampleWeights, ids.len(), weights.len())?;
    }
    if let Some(p) = pooling.padding_idx {
        if p >= rows {
            return Err(EmbeddingError::PaddingIdxOutOfRange {
                padding_idx: i64::try_from(p).unwrap_or(i64::MAX),
                num_embeddings: rows,
            });
        }
    }
    Ok(rows)
}

/// Every check of a sum or mean backward, in order (max mode is refused:
/// its backward takes the forward's `max_indices`): the checked ids, for
/// the kernels, the layer and the reference.
pub(crate) fn check_backward_call<'a, I: Index>(
    grad_bags: &[f32],
    dim: usize,
    ids: &'a [I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    grad_table_len: usize,
) -> Result<ValidIds<'a, I>, EmbeddingError> {
    let ids = check_backward(grad_table_len, dim, ids, bags, pooling, grad_bags)?;
    if pooling.mode == Mode::Max {
        return Err(EmbeddingError::MaxNeedsIndices);
    }
    Ok(ids)
}

/// Every check of the forward, in order, before any write: the checked
/// ids, for the kernel, the layer and the reference.
pub(crate) fn check_forward<'a, I: Index>(
    table: &[f32],
    dim: usize,
    ids: &'a [I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    out: &[f32],
    max_indices: &[i64],
) -> Result<ValidIds<'a, I>, EmbeddingError> {
    let rows = check_arguments(table.len(), dim, ids, bags, pooling)?;
    let out_len = rows_len(bags.len(), dim)?;
    check_len(Operand::Output, out_len, out.len())?;
    if pooling.mode == Mode::Max {
        check_len(Operand::MaxIndices, out_len, max_indices.len())?;
    }
    ValidIds::new(ids, rows)
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
/// [`EmbeddingError::PaddingIdxOutOfRange`] or
/// [`EmbeddingError::IndexOutOfRange`]; then nothing is written.
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
    let ids = check_forward(table, dim, ids, bags, pooling, out, max_indices)?;
    forward_valid(par, table, dim, ids, bags, pooling, out, max_indices);
    Ok(())
}

/// Columns per register block of a bag sum: eight `f32x8` accumulators.
const BLOCK: usize = 64;

/// The column blocks of one bag's sum: blocks of `N·8` columns through
/// `$block::<N>` for each `N` given (largest first, each as often as it
/// fits), the last columns one at a time, then the end of the sum.
macro_rules! sum_blocks {
    ($self:ident, $block:ident, $bag:ident, $limit:ident, $dst:ident, $($n:literal),+) => {{
        let (mut kept, mut c) = (0, 0);
        $(
            while c + $n * LANES <= $self.dim {
                kept = $self.$block::<$n>($bag.clone(), $limit, c, $dst);
                c += $n * LANES;
            }
        )+
        if c < $self.dim {
            kept = $self.sum_columns($bag, $limit, c, $dst);
        }
        $self.finish_sum(kept, $dst);
    }};
}

/// Registers per block of a bag max with AVX: as many for the best values
/// and as many for their positions (64 columns a pass). On recsys, three
/// alternating report runs: 4.0-4.6 ms against 5.6-6.3 ms for the row at a
/// time max (and 5.0-5.6 ms with blocks of 32 columns, in two).
const MAX_BLOCK: usize = 8;

/// The most positions a bag prefetches ahead (the kernels' 16 KiB rule
/// would give recsys's 512-byte rows 32). On recsys, a test program's
/// medians of paired rounds: 16 ahead took 0.92x the time of 32 back to
/// back and 0.95x after a cache sweep; 8 ahead 0.95x and 0.97x.
const MAX_AHEAD: usize = 16;

/// The widest rows a bag sums in register blocks (a pass over the bag per
/// block); wider ones are summed a row at a time into an L1 scratch row
/// (see trick 2 of the module).
const BLOCKED_MAX_DIM: usize = 2 * BLOCK;

/// The forward after [`check_forward`]: it cannot fail.
// `bag_forward_with`'s arguments, with the ids checked.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_valid<I: Index>(
    par: Parallelism,
    table: &[f32],
    dim: usize,
    ids: ValidIds<'_, I>,
    bags: &Bags,
    pooling: &Pooling<'_>,
    out: &mut [f32],
    max_indices: &mut [i64],
) {
    let avx = Avx::detect();
    forward_on(par, table, dim, ids, bags, pooling, out, max_indices, avx);
}

/// [`forward_valid`] with the sums in 256-bit registers or not (`avx` only
/// where [`Avx::detect`] found it); the tests run both.
#[allow(clippy::too_many_arguments)]
fn forward_on<I: Index>(
    par: Parallelism,
    table: &[f32],
    dim: usize,
    ids: ValidIds<'_, I>,
    bags: &Bags,
    pooling: &Pooling<'_>,
    out: &mut [f32],
    max_indices: &mut [i64],
    avx: Option<Avx>,
) {
    let is_max = pooling.mode == Mode::Max;
    if dim == 0 || bags.is_empty() {
        return;
    }
    let max_indices = if is_max { max_indices } else { &mut [][..] };
    let body = |first_bag: usize, out: &mut [f32], max_indices: &mut [i64]| {
        let count = out.len() / dim;
        let block = Block {
            table,
            dim,
            ids,
            bags,
            pooling,
            first_bag,
            count,
            ahead: prefetch_ahead(dim).min(MAX_AHEAD),
            avx,
        };
        block.run(out, max_indices);
    };
    let bags_per_task = (TASK_BYTES / (dim * 4)).max(1);
    let read = ids.len().saturating_mul(dim * 4);
    if !par.splits(core::mem::size_of_val(table).min(read), PARALLEL_MIN_BYTES) {
        body(0, out, max_indices);
        return;
    }
    let chunk = bags_per_task * dim;
    if is_max {
        out.par_chunks_mut(chunk)
            .zip(max_indices.par_chunks_mut(chunk))
            .enumerate()
            .for_each(|(task, (o, m))| body(task * bags_per_task, o, m));
    } else {
        out.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(task, o)| body(task * bags_per_task, o, &mut []));
    }
}

/// One task of the forward: `count` bags from `first_bag`.
struct Block<'a, 'i, I: Index> {
    table: &'a [f32],
    dim: usize,
    ids: ValidIds<'i, I>,
    bags: &'a Bags,
    pooling: &'a Pooling<'a>,
    first_bag: usize,
    count: usize,
    /// How many positions ahead rows are prefetched.
    ahead: usize,
    /// Whether sums and maxima run in 256-bit registers ([`avx`]); true only
    /// where `Avx::detect` found it.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    avx: Option<Avx>,
}

impl<I: Index> Block<'_, '_, I> {
    fn run(&self, out: &mut [f32], max_indices: &mut [i64]) {
        let dim = self.dim;
        let first = self.bags.starts()[self.first_bag];
        let limit = self.bags.starts()[self.first_bag + self.count];
        // Warm the first rows: a block starts cold.
        for p in first..limit.min(first + self.ahead) {
            self.prefetch(p);
        }
        // Scratch rows, in L1: max's best values and where they came from,
        // the sum of a wide row without AVX (with it, every width is blocks).
        let (mut acc, mut at) = match self.pooling.mode {
            Mode::Max => (vec![0.0f32; dim], vec![0.0f32; dim]),
            _ if dim > BLOCKED_MAX_DIM && self.avx.is_none() => (vec![0.0f32; dim], Vec::new()),
            _ => (Vec::new(), Vec::new()),
        };
        for k in 0..self.count {
            let bag = self.bags.bag(self.first_bag + k);
            let dst = &mut out[k * dim..(k + 1) * dim];
            match self.pooling.mode {
                Mode::Sum | Mode::Mean => self.pool_sum(bag, limit, &mut acc, dst),
                Mode::Max => {
                    let args = &mut max_indices[k * dim..(k + 1) * dim];
                    self.pool_max(bag, limit, &mut acc, &mut at, dst, args);
                }
            }
        }
    }

    /// Prefetches the table row of position `p`.
    #[inline(always)]
    fn prefetch(&self, p: usize) {
        let r = self.ids.row(p);
        row::prefetch(&self.table[r * self.dim..(r + 1) * self.dim]);
    }

    /// Whether position `p` takes part (its row is not the padding row).
    #[inline(always)]
    fn kept(&self, p: usize) -> bool {
        Some(self.ids.row(p)) != self.pooling.padding_idx
    }

    /// Position `p`'s table row.
    #[inline(always)]
    fn row_of(&self, p: usize) -> &[f32] {
        let r = self.ids.row(p) * self.dim;
        &self.table[r..r + self.dim]
    }

    /// Sum (or mean) of bag `bag`, written to `dst` once. Rows of up to
    /// [`BLOCKED_MAX_DIM`] columns go a block at a time (trick 2): [`BLOCK`]
    /// columns in eight `f32x8` accumulators, then what is left in blocks
    /// of 32, 16 and 8 and one column at a time, each block a pass over the
    /// bag's rows, prefetching its block of the rows ahead. Wider rows go
    /// through [`Block::pool_sum_rows`] and `acc`; with AVX,
    /// [`Block::pool_sum_avx`].
    #[inline(always)]
    fn pool_sum(&self, bag: Range<usize>, limit: usize, acc: &mut [f32], dst: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx.is_some() {
            return self.pool_sum_avx(bag, limit, dst);
        }
        if self.dim > BLOCKED_MAX_DIM {
            return self.pool_sum_rows(bag, limit, acc, dst);
        }
        sum_blocks!(self, sum_block, bag, limit, dst, 8, 4, 2, 1);
    }

    /// [`Block::pool_sum`] with AVX: blocks of 128 columns (sixteen 256-bit
    /// registers), then of 64, 32, 16 and 8, then single columns; a pass
    /// over the bag per block, each prefetching its block of the rows ahead.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn pool_sum_avx(&self, bag: Range<usize>, limit: usize, dst: &mut [f32]) {
        sum_blocks!(self, avx_block, bag, limit, dst, 16, 8, 4, 2, 1);
    }

    /// Columns `c..c + N·8` of the bag's sum into `dst` in 256-bit
    /// registers; returns how many rows were kept.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    #[allow(unsafe_code)]
    fn avx_block<const N: usize>(
        &self,
        bag: Range<usize>,
        limit: usize,
        c: usize,
        dst: &mut [f32],
    ) -> usize {
        let (out, _) = dst[c..c + N * LANES].as_chunks_mut::<LANES>();
        let out: &mut [[f32; LANES]; N] = out.try_into().expect("N blocks of 8");
        // SAFETY: the two need a CPU with AVX, and `self.avx` holds an `Avx`,
        // which only `Avx::detect` makes, on a CPU that has it.
        unsafe {
            match self.pooling.per_sample_weights {
                None => self.avx_sum::<N>(bag, limit, c, out),
                Some(w) => self.avx_sum_weighted::<N>(bag, limit, c, w, out),
            }
        }
    }

    /// Calls `f(p, block)` with columns `c..c + N·8` of each kept row of
    /// `bag`, in order, and returns how many rows were kept. Before each
    /// position it prefetches the same block of the row `ahead` positions
    /// on (from the task's last position at its end: a repeated hint costs
    /// next to nothing, a branch around it more). Without `padding_idx`
    /// every row is kept and the loop holds no test for it.
    ///
    /// This loop, the fixed count of hints ([`row::prefetch_block`]) and
    /// [`MAX_AHEAD`] against the loop before (a test for padding and a
    /// branch around the hint per row, hints counted at run time): a test
    /// program, three alternating runs each, medians. After a memcpy that
    /// sweeps the caches, recsys 2.05-2.14 ms against 2.19-2.52, minilm
    /// 0.54-0.62 against 0.63-0.70, gpt2 2.22-2.41 against 2.31-2.54; back
    /// to back, recsys 1.46-1.65 against 1.65-1.91, gpt2 1.70-1.81 against
    /// 1.80-2.02, minilm 0.18-0.20 both.
    #[inline(always)]
    fn blocks<const N: usize>(
        &self,
        bag: Range<usize>,
        limit: usize,
        c: usize,
        mut f: impl FnMut(usize, &[[f32; LANES]; N]),
    ) -> usize {
        let (table, dim) = (self.table, self.dim);
        // `limit` is 0 for a task of bags that hold no id; then no loop below
        // runs and `last` is never read.
        let (ahead, last) = (self.ahead, limit.saturating_sub(1));
        let block = |r: usize| -> &[[f32; LANES]; N] {
            let at = r * dim + c;
            let (block, _) = table[at..at + N * LANES].as_chunks::<LANES>();
            block.try_into().expect("N blocks of 8")
        };
        let prefetch = |p: usize| {
            let at = self.ids.row((p + ahead).min(last)) * dim + c;
            row::prefetch_block::<N>(table, at);
        };
        match self.pooling.padding_idx {
            None => {
                for p in bag.clone() {
                    prefetch(p);
                    f(p, block(self.ids.row(p)));
                }
                bag.len()
            }
            Some(padding) => {
                let mut kept = 0;
                for p in bag {
                    prefetch(p);
                    let r = self.ids.row(p);
                    if r != padding {
                        f(p, block(r));
                        kept += 1;
                    }
                }
                kept
            }
        }
    }

    /// `out = -0.0 + Σ row` over the bag's kept rows (columns `c..c + N·8`),
    /// in order, `N` registers; returns how many rows were kept. `-0.0 + x`
    /// is `x` to the bit, so the first row comes through as it is. The
    /// whole loop is compiled with AVX, so nothing in it is a call and the
    /// accumulators stay in registers (a version that took the rows from an
    /// iterator called its `next` per row, spilled all sixteen around the
    /// call and gained nothing).
    ///
    /// Only for a CPU with AVX ([`Avx::detect`]).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx")]
    fn avx_sum<const N: usize>(
        &self,
        bag: Range<usize>,
        limit: usize,
        c: usize,
        out: &mut [[f32; LANES]; N],
    ) -> usize {
        let mut acc = [avx::neg_zero(); N];
        let kept = self.blocks::<N>(bag, limit, c, |_, row| {
            for (a, x) in acc.iter_mut().zip(row) {
                *a = avx::add(*a, avx::load(x));
            }
        });
        self.avx_store_mean(kept, acc, out);
        kept
    }

    /// [`Block::avx_sum`] with a weight per row: `-0.0 + Σ row × w[p]`, each
    /// product rounded before it is added (no fused multiply-add).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx")]
    fn avx_sum_weighted<const N: usize>(
        &self,
        bag: Range<usize>,
        limit: usize,
        c: usize,
        weights: &[f32],
        out: &mut [[f32; LANES]; N],
    ) -> usize {
        let mut acc = [avx::neg_zero(); N];
        let kept = self.blocks::<N>(bag, limit, c, |p, row| {
            let w = avx::splat(weights[p]);
            for (a, x) in acc.iter_mut().zip(row) {
                *a = avx::add(*a, avx::mul(avx::load(x), w));
            }
        });
        self.avx_store_mean(kept, acc, out);
        kept
    }

    /// The block's sums to `out`, divided first in mean mode.
    ///
    /// Only for a CPU with AVX ([`Avx::detect`]).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx")]
    #[inline]
    fn avx_store_mean<const N: usize>(
        &self,
        kept: usize,
        mut acc: [core::arch::x86_64::__m256; N],
        out: &mut [[f32; LANES]; N],
    ) {
        if let Some(n) = self.mean_of(kept) {
            let n = avx::splat(n);
            acc.iter_mut().for_each(|a| *a = avx::div(*a, n));
        }
        avx::store(out, acc);
    }

    /// Columns `c..c + N·8` of the bag's max into `dst` and `args` in
    /// 256-bit registers; returns how many rows were kept (and writes
    /// nothing when none was).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    #[allow(unsafe_code)]
    fn avx_max_block<const N: usize>(
        &self,
        bag: Range<usize>,
        limit: usize,
        c: usize,
        dst: &mut [f32],
        args: &mut [i64],
    ) -> usize {
        let start = bag.start;
        let (out, _) = dst[c..c + N * LANES].as_chunks_mut::<LANES>();
        let out: &mut [[f32; LANES]; N] = out.try_into().expect("N blocks of 8");
        let mut at = [[0.0f32; LANES]; N];
        // SAFETY: it needs a CPU with AVX, and `self.avx` holds an `Avx`,
        // which only `Avx::detect` makes, on a CPU that has it.
        let kept = unsafe { self.avx_max::<N>(bag, limit, c, out, &mut at) };
        if kept > 0 {
            for (arg, &k) in args[c..c + N * LANES].iter_mut().zip(at.as_flattened()) {
                *arg = self.ids.row(start + k as usize) as i64;
            }
        }
        kept
    }

    /// The max of the bag's kept rows over columns `c..c + N·8` into `out`,
    /// the winners' positions in the bag into `at` (as `f32`s: the caller
    /// checks they are exact); returns how many rows were kept. The rule of
    /// [`Block::pool_max`]: the first kept row as it is, then a strictly
    /// greater value replaces (an ordered compare, so a NaN neither wins nor
    /// is replaced).
    ///
    /// Only for a CPU with AVX ([`Avx::detect`]).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx")]
    fn avx_max<const N: usize>(
        &self,
        bag: Range<usize>,
        limit: usize,
        c: usize,
        out: &mut [[f32; LANES]; N],
        at: &mut [[f32; LANES]; N],
    ) -> usize {
        let start = bag.start;
        let mut best = [avx::neg_zero(); N];
        let mut from = [avx::neg_zero(); N];
        let mut first = true;
        let kept = self.blocks::<N>(bag, limit, c, |p, row| {
            let here = avx::splat((p - start) as f32);
            if first {
                for ((b, f), x) in best.iter_mut().zip(&mut from).zip(row) {
                    (*b, *f) = (avx::load(x), here);
                }
                first = false;
            } else {
                for ((b, f), x) in best.iter_mut().zip(&mut from).zip(row) {
                    let v = avx::load(x);
                    let wins = avx::greater(v, *b);
                    (*b, *f) = (avx::select(wins, v, *b), avx::select(wins, here, *f));
                }
            }
        });
        if kept > 0 {
            avx::store(out, best);
            avx::store(at, from);
        }
        kept
    }

    /// The end of a sum: zeros for a bag that kept no row. (The mean's
    /// division happens in each block's registers, [`Block::mean_of`].)
    #[inline(always)]
    fn finish_sum(&self, kept: usize, dst: &mut [f32]) {
        if kept == 0 {
            dst.fill(0.0);
        }
    }

    /// What a bag's sum is divided by: its count of kept rows in mean mode
    /// (none for sum, or for a bag that kept nothing). Each block divides
    /// its registers before its one store: a second pass dividing the
    /// output row read back 32-byte stores in 16-byte loads, and on minilm
    /// the mean took 0.55-0.65 ms against 0.40 for the sum (one thread, a
    /// loop of calls); the quotients are the same to the bit.
    #[inline(always)]
    fn mean_of(&self, kept: usize) -> Option<f32> {
        (self.pooling.mode == Mode::Mean && kept > 0).then_some(kept as f32)
    }

    /// [`Block::pool_sum`] for wide rows without AVX, a row at a time into
    /// `acc`, a scratch row that stays in L1: `-0.0`, then every kept row
    /// added in position order (the blocks' operations, so the same bits).
    #[inline(always)]
    fn pool_sum_rows(&self, bag: Range<usize>, limit: usize, acc: &mut [f32], dst: &mut [f32]) {
        let weights = self.pooling.per_sample_weights;
        let mut kept = 0usize;
        acc.fill(-0.0);
        for p in bag {
            if p + self.ahead < limit {
                self.prefetch(p + self.ahead);
            }
            if !self.kept(p) {
                continue;
            }
            let src = self.row_of(p);
            match weights {
                None => row::add(acc, src),
                Some(w) => row::add_scaled(acc, src, w[p]),
            }
            kept += 1;
        }
        match self.mean_of(kept) {
            Some(n) => dst.iter_mut().zip(&*acc).for_each(|(d, &a)| *d = a / n),
            None => dst.copy_from_slice(acc),
        }
        self.finish_sum(kept, dst);
    }

    /// Columns `c..c + N·8` of the bag's sum into `dst`, in registers;
    /// returns how many rows were kept. The sums start from `-0.0`, so the
    /// first kept term comes through to the bit (`-0.0 + x == x`). One copy
    /// of the loop per weighting (a closure the compiler folds away), so the
    /// plain sum's loop holds the accumulators and little else: with one
    /// shared loop the compiler kept half of them on the stack.
    #[inline(always)]
    fn sum_block<const N: usize>(
        &self,
        bag: Range<usize>,
        limit: usize,
        c: usize,
        dst: &mut [f32],
    ) -> usize {
        let (acc, kept) = match self.pooling.per_sample_weights {
            None => self.sum_block_with::<N>(bag, limit, c, |_| None),
            Some(w) => self.sum_block_with::<N>(bag, limit, c, |p| Some(w[p])),
        };
        let mean = self.mean_of(kept).map(f32x8::splat);
        let (out, _) = dst[c..c + N * LANES].as_chunks_mut::<LANES>();
        for (o, a) in out.iter_mut().zip(acc) {
            row::store(o, mean.map_or(a, |n| a / n));
        }
        kept
    }

    /// The loop of [`Block::sum_block`]: the accumulators and the count of
    /// kept rows.
    #[inline(always)]
    fn sum_block_with<const N: usize>(
        &self,
        bag: Range<usize>,
        limit: usize,
        c: usize,
        weight: impl Fn(usize) -> Option<f32>,
    ) -> ([f32x8; N], usize) {
        let mut acc = [f32x8::splat(-0.0); N];
        let kept = self.blocks::<N>(bag, limit, c, |p, src| match weight(p) {
            None => {
                for (a, x) in acc.iter_mut().zip(src) {
                    *a += row::load(x);
                }
            }
            Some(w) => {
                let w = f32x8::splat(w);
                for (a, x) in acc.iter_mut().zip(src) {
                    *a += row::load(x) * w;
                }
            }
        });
        (acc, kept)
    }

    /// Columns `c..` (fewer than eight) of the bag's sum into `dst`, one
    /// value at a time; returns how many rows were kept.
    #[inline(always)]
    fn sum_columns(&self, bag: Range<usize>, limit: usize, c: usize, dst: &mut [f32]) -> usize {
        let dst = &mut dst[c..];
        dst.fill(-0.0);
        let mut kept = 0;
        for p in bag {
            if c == 0 && p + self.ahead < limit {
                self.prefetch(p + self.ahead);
            }
            if !self.kept(p) {
                continue;
            }
            let src = &self.row_of(p)[c..];
            match self.pooling.per_sample_weights {
                None => dst.iter_mut().zip(src).for_each(|(d, &x)| *d += x),
                Some(w) => dst.iter_mut().zip(src).for_each(|(d, &x)| *d += x * w[p]),
            }
            kept += 1;
        }
        if let Some(n) = self.mean_of(kept) {
            dst.iter_mut().for_each(|x| *x /= n);
        }
        kept
    }

    /// Max of bag `bag` into `dst`, the winning ids into `args`; `best` and
    /// `at` are scratch rows (the best values, and the winners' positions in
    /// the bag as `f32`s, exact below 2^24).
    #[inline(always)]
    fn pool_max(
        &self,
        bag: Range<usize>,
        limit: usize,
        best: &mut [f32],
        at: &mut [f32],
        dst: &mut [f32],
        args: &mut [i64],
    ) {
        let start = bag.start;
        let exact = bag.len() <= MAX_EXACT_POSITION;
        #[cfg(target_arch = "x86_64")]
        if self.avx.is_some() && exact && self.dim.is_multiple_of(LANES) {
            let (mut kept, mut c) = (0, 0);
            while c + MAX_BLOCK * LANES <= self.dim {
                kept = self.avx_max_block::<MAX_BLOCK>(bag.clone(), limit, c, dst, args);
                c += MAX_BLOCK * LANES;
            }
            while c < self.dim {
                kept = self.avx_max_block::<1>(bag.clone(), limit, c, dst, args);
                c += LANES;
            }
            if kept == 0 {
                dst.fill(0.0);
                args.fill(-1);
            }
            return;
        }
        let mut kept = 0usize;
        for p in bag {
            if p + self.ahead < limit {
                self.prefetch(p + self.ahead);
            }
            if !self.kept(p) {
                continue;
            }
            let src = self.row_of(p);
            let here = (p - start) as f32;
            if kept == 0 {
                best.copy_from_slice(src);
                at.fill(if exact {
                    here
                } else {
                    f32::from_bits((p - start) as u32)
                });
            } else if exact {
                row::keep_max(best, at, src, here);
            } else {
                // Positions past 2^24 are not exact in f32: record the
                // position's bits instead, one column at a time.
                for ((b, a), &x) in best.iter_mut().zip(at.iter_mut()).zip(src) {
                    if x > *b {
                        *b = x;
                        *a = f32::from_bits((p - start) as u32);
                    }
                }
            }
            kept += 1;
        }
        if kept == 0 {
            dst.fill(0.0);
            args.fill(-1);
            return;
        }
        dst.copy_from_slice(best);
        for (a, &w) in args.iter_mut().zip(at.iter()) {
            let k = if exact {
                w as usize
            } else {
                w.to_bits() as usize
            };
            *a = self.ids.row(start + k) as i64;
        }
    }
}

/// The gradient source of a bag: position `p` takes its bag's gradient row,
/// times its per-sample weight (sum) or `1/len` (mean).
struct PerBag<'a> {
    grad_bags: &'a [f32],
    dim: usize,
    bag_of: Vec<usize>,
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
}

/// The gradient source of a sum or mean bag batch.
fn bag_source<'a, I: Index>(
    ids: ValidIds<'_, I>,
    bags: &Bags,
    pooling: &Pooling<'_>,
    grad_bags: &'a [f32],
    dim: usize,
) -> PerBag<'a> {
    let skip = pooling.padding_idx;
    let factor = match (pooling.mode, pooling.per_sample_weights) {
        (Mode::Sum, None) => None,
        (Mode::Sum, Some(w)) => Some(w.to_vec()),
        _ => {
            // Mean: 1 / (kept ids of the bag).
            let mut inv = vec![0.0f32; ids.len()];
            for b in 0..bags.len() {
                let range = bags.bag(b);
                let kept = range.clone().filter(|&p| Some(ids.row(p)) != skip).count();
                let f = 1.0 / kept.max(1) as f32;
                inv[range].fill(f);
            }
            Some(inv)
        }
    };
    PerBag {
        grad_bags,
        dim,
        bag_of: bag_of(bags),
        factor,
    }
}

impl Drop for PerBag<'_> {
    fn drop(&mut self) {
        super::spare::give(core::mem::take(&mut self.bag_of));
    }
}

impl PerBag<'_> {
    /// Whether position `p` (with row `r`) adds to the gradient: it is in a
    /// bag and not the padding row.
    fn keeps(&self, p: usize, r: usize, padding_idx: Option<usize>) -> bool {
        self.bag_of[p] != usize::MAX && Some(r) != padding_idx
    }
}

/// The bag of every position (`usize::MAX` for a position past the last
/// bag), in one of the thread's spare vectors.
fn bag_of(bags: &Bags) -> Vec<usize> {
    let mut of = super::spare::take(bags.num_ids());
    of.resize(bags.num_ids(), usize::MAX);
    for b in 0..bags.len() {
        of[bags.bag(b)].fill(b);
    }
    of
}

/// The grouped form of a sum or mean bag batch: its groups and its source.
fn grouped_bags<'a, I: Index>(
    ids: ValidIds<'_, I>,
    bags: &Bags,
    pooling: &Pooling<'_>,
    grad_bags: &'a [f32],
    dim: usize,
) -> (Groups, PerBag<'a>) {
    let source = bag_source(ids, bags, pooling, grad_bags, dim);
    let skip = pooling.padding_idx;
    let groups = Groups::new_kept(ids, |p, r| source.keeps(p, r, skip));
    (groups, source)
}

/// Checks a backward call's `grad_bags` (and mode) after the shared checks.
fn check_backward<'a, I: Index>(
    table_len: usize,
    dim: usize,
    ids: &'a [I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    grad_bags: &[f32],
) -> Result<ValidIds<'a, I>, EmbeddingError> {
    let rows = table_rows(table_len, dim, Operand::GradTable)?;
    check_len(
        Operand::GradOutput,
        rows_len(bags.len(), dim)?,
        grad_bags.len(),
    )?;
    check_arguments(rows * dim, dim, ids, bags, pooling)?;
    ValidIds::new(ids, rows)
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
/// As [`bag_forward`], with the lengths of `grad_bags`
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
    let ids = check_backward(grad_table.len(), dim, ids, bags, pooling, grad_bags)?;
    if pooling.mode == Mode::Max {
        return Err(EmbeddingError::MaxNeedsIndices);
    }
    let split = par.splits(core::mem::size_of_val(grad_table), PARALLEL_MIN_BYTES);
    if grouped::fits_cache(grad_table) {
        let source = bag_source(ids, bags, pooling, grad_bags, dim);
        let skip = pooling.padding_idx;
        let keep = |p, r| source.keeps(p, r, skip);
        grouped::dense_in_cache(
            ids,
            keep,
            &source,
            dim,
            pooling.scale_grad_by_freq,
            grad_table,
        );
        return Ok(());
    }
    let (groups, source) = grouped_bags(ids, bags, pooling, grad_bags, dim);
    grouped::dense_from(
        split,
        &groups,
        &source,
        dim,
        pooling.scale_grad_by_freq,
        grad_table,
    );
    Ok(())
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
    let len = rows_len(num_embeddings, dim)?;
    let ids = check_backward(len, dim, ids, bags, pooling, grad_bags)?;
    if pooling.mode == Mode::Max {
        return Err(EmbeddingError::MaxNeedsIndices);
    }
    let split = par.splits(core::mem::size_of_val(grad_bags), PARALLEL_MIN_BYTES);
    let (groups, source) = grouped_bags(ids, bags, pooling, grad_bags, dim);
    let values = grouped::coalesce_from(split, &groups, &source, dim, pooling.scale_grad_by_freq);
    // A copy: `rows` is one of the thread's spare vectors, sized for every
    // id; the caller's gradient gets one just large enough.
    Ok(SparseGrad::from_parts(
        groups.rows.clone(),
        values,
        num_embeddings,
        dim,
    ))
}

/// The fused backward + update of a sum or mean bag batch, after
/// [`check_backward_call`]: each touched row's gradient is summed and handed
/// to `rule` at once.
pub(crate) fn bag_fused_update<I: Index, R: grouped_rule::Rule>(
    par: Parallelism,
    grad_bags: &[f32],
    ids: ValidIds<'_, I>,
    bags: &Bags,
    pooling: &Pooling<'_>,
    target: grouped::Target<'_>,
    rule: &R,
) {
    let dim = target.dim;
    let split = par.splits(core::mem::size_of_val(grad_bags), PARALLEL_MIN_BYTES);
    let (groups, source) = grouped_bags(ids, bags, pooling, grad_bags, dim);
    grouped::apply_groups(
        split,
        &groups,
        &source,
        pooling.scale_grad_by_freq,
        target,
        rule,
    );
}

/// The optimiser rule trait, named for this module.
mod grouped_rule {
    pub(crate) use crate::optim::RowRule as Rule;
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
        if i < -1 || i >= rows as i64 {
            return Err(EmbeddingError::IndexOutOfRange {
                position,
                index: i128::from(i),
                num_embeddings: rows,
            });
        }
    }
    row::stream(grad_table, None);
    row::stream_fence();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn mix(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let z = (*state ^ (*state >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z ^ (z >> 31)
    }

    /// The sums in 256-bit registers and in `f32x8` pairs (and, past 128
    /// columns, a row at a time) give the same bits, and the sum those of
    /// the bag-matrix reference, for widths around every block edge, with
    /// and without weights and padding, on one thread and on the pool; the
    /// maxima of both paths are the reference's, values and winners.
    /// Bags that hold no id, alone or before one that does, give zeros (and
    /// -1 winners) on every path: a task whose bags are all empty ends at
    /// position 0, which the prefetch's clamp must not step below.
    #[test]
    fn empty_bags_give_zeros_on_every_path() {
        let table: Vec<f32> = (0..4 * 384).map(|i| i as f32 - 700.0).collect();
        let ids = [3usize, 1];
        for (offsets, num_ids) in [(&[0usize, 0, 0][..], 0), (&[0, 0, 0, 0][..], 2)] {
            let bags = Bags::from_offsets(offsets, num_ids, false).unwrap();
            let valid = ValidIds::new(&ids[..num_ids], 4).unwrap();
            for dim in [1, 8, 64, 128, 384] {
                for mode in [Mode::Sum, Mode::Mean, Mode::Max] {
                    let pooling = Pooling {
                        mode,
                        ..Pooling::default()
                    };
                    let mut want = vec![f32::NAN; bags.len() * dim];
                    let mut want_at = vec![7; if mode == Mode::Max { want.len() } else { 0 }];
                    let table = &table[..4 * dim];
                    let ids = &ids[..num_ids];
                    crate::reference::bag_forward(
                        table,
                        dim,
                        ids,
                        &bags,
                        &pooling,
                        &mut want,
                        &mut want_at,
                    )
                    .unwrap();
                    for avx in [None, Avx::detect()] {
                        for par in [Parallelism::Serial, Parallelism::Rayon] {
                            let mut out = vec![f32::NAN; want.len()];
                            let mut at = vec![7; want_at.len()];
                            forward_on(
                                par, table, dim, valid, &bags, &pooling, &mut out, &mut at, avx,
                            );
                            let bits =
                                |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                            let what = format!("{offsets:?} dim {dim} {mode:?} {par:?} {avx:?}");
                            assert_eq!(bits(&out), bits(&want), "{what}");
                            assert_eq!(at, want_at, "{what}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn both_sum_paths_give_the_reference_bits() {
        let mut seed = 7;
        let dims = [
            1, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 40, 56, 63, 64, 65, 72, 96, 120, 127, 128, 129,
            136, 200, 255, 256, 257, 384, 385,
        ];
        for (case, &dim) in dims.iter().enumerate() {
            let rows = 1 + mix(&mut seed) as usize % 50;
            let n = mix(&mut seed) as usize % 200;
            let table: Vec<f32> = (0..rows * dim)
                .map(|_| match mix(&mut seed) % 16 {
                    0 => -0.0,
                    _ => (mix(&mut seed) % 2001) as f32 / 1000.0 - 1.0,
                })
                .collect();
            let ids: Vec<usize> = (0..n).map(|_| mix(&mut seed) as usize % rows).collect();
            // No weight is 0: the reference's product skips zero
            // coefficients, where the kernel adds `0 × x` (a `+0.0` that can
            // turn a `-0.0` sum into `+0.0`).
            let weights: Vec<f32> = (0..n)
                .map(|_| [-3.0, -1.5, -1.0, 0.25, 1.0, 2.0, 3.0][mix(&mut seed) as usize % 7])
                .collect();
            let mut offsets = vec![0];
            while let Some(&last) = offsets.last() {
                let next = last + mix(&mut seed) as usize % 20;
                if next >= n {
                    break;
                }
                offsets.push(next);
            }
            let bags = Bags::from_offsets(&offsets, n, false).unwrap();
            let valid = ValidIds::new(&ids, rows).unwrap();
            for (mode, weighted, padded) in [
                (Mode::Sum, false, false),
                (Mode::Sum, true, false),
                (Mode::Sum, true, true),
                (Mode::Mean, false, true),
            ] {
                let pooling = Pooling {
                    mode,
                    per_sample_weights: weighted.then_some(&weights[..]),
                    padding_idx: padded.then_some(case % rows),
                    ..Pooling::default()
                };
                let what = format!(
                    "dim {dim} rows {rows} n {n} {mode:?} weighted {weighted} padded {padded}"
                );
                let mut want = vec![f32::NAN; bags.len() * dim];
                crate::reference::bag_forward(
                    &table,
                    dim,
                    &ids,
                    &bags,
                    &pooling,
                    &mut want,
                    &mut [],
                )
                .unwrap();
                let mut outs = Vec::new();
                for avx in [None, Avx::detect()] {
                    for par in [Parallelism::Serial, Parallelism::Rayon] {
                        let mut out = vec![f32::NAN; bags.len() * dim];
                        forward_on(
                            par,
                            &table,
                            dim,
                            valid,
                            &bags,
                            &pooling,
                            &mut out,
                            &mut [],
                            avx,
                        );
                        outs.push(out);
                    }
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                for out in &outs[1..] {
                    assert_eq!(bits(out), bits(&outs[0]), "{what}");
                }
                if mode == Mode::Sum {
                    assert_eq!(bits(&outs[0]), bits(&want), "{what}");
                }
            }
            // Max, with ties and NaNs in the table: both paths pick the
            // reference's winners.
            let ties: Vec<f32> = table
                .iter()
                .map(|&x| match mix(&mut seed) % 32 {
                    0 => f32::NAN,
                    1..=8 => 0.5,
                    _ => x,
                })
                .collect();
            for padded in [false, true] {
                let pooling = Pooling {
                    mode: Mode::Max,
                    padding_idx: padded.then_some(case % rows),
                    ..Pooling::default()
                };
                let size = bags.len() * dim;
                let (mut want, mut want_at) = (vec![f32::NAN; size], vec![-2; size]);
                crate::reference::bag_forward(
                    &ties,
                    dim,
                    &ids,
                    &bags,
                    &pooling,
                    &mut want,
                    &mut want_at,
                )
                .unwrap();
                for avx in [None, Avx::detect()] {
                    for par in [Parallelism::Serial, Parallelism::Rayon] {
                        let (mut out, mut at) = (vec![f32::NAN; size], vec![-2; size]);
                        forward_on(
                            par, &ties, dim, valid, &bags, &pooling, &mut out, &mut at, avx,
                        );
                        let what =
                            format!("max dim {dim} rows {rows} n {n} padded {padded} avx {avx:?}");
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&out), bits(&want), "{what}");
                        assert_eq!(at, want_at, "{what}");
                    }
                }
            }
        }
    }
}
