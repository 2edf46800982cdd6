//! Bags: gather rows and pool them (sum, mean or max) in one pass, as
//! PyTorch's `nn.EmbeddingBag`; and the backward of the pooling.
//!
//! ```text
//! check table, bags, weights, out, max_indices, every id   (nothing written)
//! for each bag b (blocks of bags split across threads):
//!     for each block of 32 columns:
//!         acc = -0.0 (sum, mean) | first kept row (max)      (8 vector registers)
//!         for p in bag b, skipping padding_idx:
//!             prefetch table[ids[p + AHEAD]]
//!             sum:  acc += table[ids[p], cols] (* weight[p])
//!             max:  where table[ids[p], cols] > acc: acc = it, arg = p
//!         out[b, cols] = acc (/ count, mean) — written once
//! ```
//!
//! 1. **Checks first.** The offsets are checked once into [`Bags`] (start at
//!    0, never decrease, never pass the number of ids), every id by
//!    [`ValidIds`], the buffers by length; then the loop cannot fail.
//! 2. **Registers, not memory.** A bag's sum for 32 columns lives in four
//!    `f32x8` values for the whole bag, so the output row is written once
//!    and never read back. Rows wider than 32 columns take several passes
//!    over the bag; the later passes find the rows in cache (the first pass
//!    prefetched every line of each row).
//! 3. **Exact order.** Each bag is summed in position order from `-0.0`
//!    (the additive identity), one rounded product and one rounded sum per
//!    term (no fused multiply-add), the same operations as the reference's
//!    bag matrix product, so `sum` matches it bit for bit on every thread
//!    count. `mean` divides the sum by the count (the reference multiplies
//!    by `1/len`: equal up to rounding). An empty bag (or one holding only
//!    `padding_idx`) is `+0.0`, as in PyTorch.
//! 4. **Max** keeps, per column, the first largest value (strictly greater
//!    replaces, so ties keep the earlier id and a NaN never replaces; a NaN
//!    in the first row stays), and the id it came from. The winner's
//!    position within the bag rides along as an `f32x8` (exact below 2^24),
//!    chosen with the same compare mask as the value.
//! 5. **Threads.** Blocks of whole bags, about `TASK_BYTES` of output each;
//!    blocks are disjoint, so the result cannot depend on the thread count.
//! 6. **Backward** (sum and mean) is the grouped backward of
//!    [`grouped`](super::grouped) with each position's gradient row taken
//!    from its bag's row, times its weight (or `1/len`): dense (each row
//!    written once), coalesced sparse, or fused into an optimiser. Max's
//!    backward adds each output column's gradient to the row that won it,
//!    bag by bag in order.

use super::grouped::{self, Groups, Source};
use super::{row, Parallelism, PARALLEL_MIN_BYTES, TASK_BYTES};
use crate::error::{EmbeddingError, Operand};
use crate::index::{Index, ValidIds};
use crate::shape::{check_len, rows_len, table_rows};
use core::ops::Range;
use rayon::prelude::*;
use wide::f32x8;

/// Columns per register block of the forward.
const BLOCK: usize = 32;

/// Vectors per register block.
const VECS: usize = BLOCK / 8;

/// How many positions ahead the forward prefetches table rows.
const AHEAD: usize = 8;

/// Bag sizes up to which the max's winner position is exact in an `f32`.
const MAX_EXACT_POSITION: usize = 1 << 24;

/// How `nn.EmbeddingBag` pools each bag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// The sum of the bag's rows (times their per-sample weights, if any).
    Sum,
    /// The sum divided by the number of rows (PyTorch's default).
    #[default]
    Mean,
    /// The largest value of each column, with the id it came from.
    Max,
}

impl core::fmt::Display for Mode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Mode::Sum => "sum",
            Mode::Mean => "mean",
            Mode::Max => "max",
        })
    }
}

/// Checked bag boundaries over `num_ids` ids: bag `b` holds positions
/// `starts[b]..starts[b + 1]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bags {
    starts: Vec<usize>,
    num_ids: usize,
}

impl Bags {
    /// Bags from PyTorch's `offsets` (the first position of each bag) over
    /// `num_ids` ids. With `include_last_offset`, the last offset ends the
    /// last bag (so there are `offsets.len() - 1` bags, and ids past it
    /// belong to none); without, the last bag runs to the end of the ids.
    ///
    /// # Errors
    /// [`EmbeddingError::OffsetsStart`] unless the first offset is 0,
    /// [`EmbeddingError::OffsetOutOfRange`] for an offset that is negative
    /// or past `num_ids`, [`EmbeddingError::OffsetsDecrease`] for one below
    /// the offset before it, [`EmbeddingError::NoOffsets`] for an empty
    /// `offsets` with `include_last_offset`.
    pub fn from_offsets<O: Index>(
        offsets: &[O],
        num_ids: usize,
        include_last_offset: bool,
    ) -> Result<Bags, EmbeddingError> {
        if include_last_offset && offsets.is_empty() {
            return Err(EmbeddingError::NoOffsets);
        }
        let mut starts = Vec::with_capacity(offsets.len() + 1);
        for (position, &o) in offsets.iter().enumerate() {
            let value = o.to_i128();
            if value < 0 || value > num_ids as i128 {
                return Err(EmbeddingError::OffsetOutOfRange {
                    position,
                    value,
                    num_ids,
                });
            }
            let value = value as usize;
            if position == 0 && value != 0 {
                return Err(EmbeddingError::OffsetsStart {
                    first: value as i128,
                });
            }
            if let Some(&previous) = starts.last() {
                if value < previous {
                    return Err(EmbeddingError::OffsetsDecrease {
                        position,
                        value: value as i128,
                        previous: previous as i128,
                    });
                }
            }
            starts.push(value);
        }
        if !include_last_offset {
            starts.push(num_ids);
        }
        if starts.len() == 1 && !include_last_offset {
            // No offsets: no bags (the sentinel alone).
            starts.clear();
            starts.push(0);
        }
        Ok(Bags { starts, num_ids })
    }

    /// `num_bags` bags of `bag_size` ids each, in order: a 2-D input of
    /// shape `[num_bags, bag_size]`.
    ///
    /// # Errors
    /// [`EmbeddingError::SizeOverflow`] if the product overflows.
    pub fn fixed(num_bags: usize, bag_size: usize) -> Result<Bags, EmbeddingError> {
        let num_ids = rows_len(num_bags, bag_size)?;
        Ok(Bags {
            starts: (0..=num_bags).map(|b| b * bag_size).collect(),
            num_ids,
        })
    }

    /// How many bags.
    pub fn len(&self) -> usize {
        self.starts.len() - 1
    }

    /// Whether there are no bags.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The positions of bag `b`.
    pub fn bag(&self, b: usize) -> Range<usize> {
        self.starts[b]..self.starts[b + 1]
    }

    /// The number of ids the bags were made for.
    pub fn num_ids(&self) -> usize {
        self.num_ids
    }

    /// The bag of every position (`u32::MAX`… no: `usize::MAX` for a
    /// position past the last bag).
    fn bag_of(&self) -> Vec<usize> {
        let mut of = vec![usize::MAX; self.num_ids];
        for b in 0..self.len() {
            of[self.bag(b)].fill(b);
        }
        of
    }
}

/// What to pool and how: PyTorch's `mode`, `per_sample_weights` and
/// `padding_idx` (already a row number).
#[derive(Clone, Copy, Debug, Default)]
pub struct Pooling<'a> {
    /// Sum, mean or max.
    pub mode: Mode,
    /// One weight per id, multiplying its row (sum mode only).
    pub per_sample_weights: Option<&'a [f32]>,
    /// A row left out of every bag (and of mean's count).
    pub padding_idx: Option<usize>,
    /// Backward only: divide each row's gradient by how many times its id
    /// occurs in the batch (sum and mean).
    pub scale_grad_by_freq: bool,
}

/// The checks every bag call shares, in the crate's order: table, bags
/// against the ids, `per_sample_weights` (mode, then length), the padding
/// row, then the ids. Returns the checked ids and the row count.
fn check_call<'a, I: Index>(
    table_len: usize,
    dim: usize,
    ids: &'a [I],
    bags: &Bags,
    pooling: &Pooling<'_>,
) -> Result<(ValidIds<'a, I>, usize), EmbeddingError> {
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
    Ok((ValidIds::new(ids, rows)?, rows))
}

/// The forward's checks alone (for the reference, so both report the same
/// error for the same call).
pub(crate) fn check_only<I: Index>(
    table: &[f32],
    dim: usize,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    out: &[f32],
    max_indices: &[i64],
) -> Result<(), EmbeddingError> {
    check_forward(table, dim, ids, bags, pooling, out, max_indices).map(|_| ())
}

/// The backward's checks alone (for the reference).
pub(crate) fn check_backward_only<I: Index>(
    grad_bags: &[f32],
    dim: usize,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    grad_table: &[f32],
) -> Result<(), EmbeddingError> {
    check_backward(grad_table.len(), dim, ids, bags, pooling, grad_bags)?;
    if pooling.mode == Mode::Max {
        return Err(EmbeddingError::MaxNeedsIndices);
    }
    Ok(())
}

/// Every check of the forward, in order, before any write.
fn check_forward<'a, I: Index>(
    table: &[f32],
    dim: usize,
    ids: &'a [I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    out: &[f32],
    max_indices: &[i64],
) -> Result<ValidIds<'a, I>, EmbeddingError> {
    let (ids, _) = check_call(table.len(), dim, ids, bags, pooling)?;
    let out_len = rows_len(bags.len(), dim)?;
    check_len(Operand::Output, out_len, out.len())?;
    if pooling.mode == Mode::Max {
        check_len(Operand::MaxIndices, out_len, max_indices.len())?;
    }
    Ok(ids)
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
    let is_max = pooling.mode == Mode::Max;
    if dim == 0 || bags.is_empty() {
        return Ok(());
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
        };
        block.run(out, max_indices);
    };
    let bags_per_task = (TASK_BYTES / (dim * 4)).max(1);
    if !par.splits(
        core::mem::size_of_val(table).min(ids.len() * dim * 4),
        PARALLEL_MIN_BYTES,
    ) {
        body(0, out, max_indices);
        return Ok(());
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
    Ok(())
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
}

impl<I: Index> Block<'_, '_, I> {
    fn run(&self, out: &mut [f32], max_indices: &mut [i64]) {
        let dim = self.dim;
        let positions =
            self.bags.starts[self.first_bag]..self.bags.starts[self.first_bag + self.count];
        // Warm the first rows: a block starts cold.
        for p in positions.start..positions.end.min(positions.start + AHEAD) {
            self.prefetch(p);
        }
        for k in 0..self.count {
            let b = self.first_bag + k;
            let bag = self.bags.bag(b);
            let dst = &mut out[k * dim..(k + 1) * dim];
            let mut cols = 0;
            while cols < dim {
                let end = (cols + BLOCK).min(dim);
                match self.pooling.mode {
                    Mode::Sum | Mode::Mean => {
                        self.pool_sum(bag.clone(), cols..end, positions.end, dst)
                    }
                    Mode::Max => {
                        let args = &mut max_indices[k * dim..(k + 1) * dim];
                        self.pool_max(bag.clone(), cols..end, positions.end, dst, args);
                    }
                }
                cols = end;
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

    /// Columns `cols` of position `p`'s table row.
    #[inline(always)]
    fn cols(&self, p: usize, cols: &Range<usize>) -> &[f32] {
        let r = self.ids.row(p) * self.dim;
        &self.table[r + cols.start..r + cols.end]
    }

    /// Sum (or mean) of bag `bag` over `cols`, written to `dst[cols]`.
    #[inline(always)]
    fn pool_sum(&self, bag: Range<usize>, cols: Range<usize>, limit: usize, dst: &mut [f32]) {
        let width = cols.len();
        let weights = self.pooling.per_sample_weights;
        let mut acc = [f32x8::splat(-0.0); VECS];
        let mut tail = [-0.0f32; 8];
        let mut kept = 0usize;
        let first_block = cols.start == 0;
        for p in bag {
            if first_block && p + AHEAD < limit {
                self.prefetch(p + AHEAD);
            }
            if !self.kept(p) {
                continue;
            }
            kept += 1;
            let src = self.cols(p, &cols);
            let (body, rest) = src.as_chunks::<8>();
            match weights {
                None => {
                    for (a, x) in acc.iter_mut().zip(body) {
                        *a += f32x8::from(*x);
                    }
                    for (t, x) in tail.iter_mut().zip(rest) {
                        *t += *x;
                    }
                }
                Some(w) => {
                    let s = f32x8::splat(w[p]);
                    for (a, x) in acc.iter_mut().zip(body) {
                        *a += f32x8::from(*x) * s;
                    }
                    for (t, x) in tail.iter_mut().zip(rest) {
                        *t += *x * w[p];
                    }
                }
            }
        }
        let dst = &mut dst[cols];
        if kept == 0 {
            dst.fill(0.0);
            return;
        }
        let (body, rest) = dst.as_chunks_mut::<8>();
        let divisor = (self.pooling.mode == Mode::Mean).then_some(kept as f32);
        for (d, a) in body.iter_mut().zip(acc) {
            let a = match divisor {
                Some(n) => a / f32x8::splat(n),
                None => a,
            };
            *d = a.to_array();
        }
        for (d, t) in rest.iter_mut().zip(tail) {
            *d = match divisor {
                Some(n) => t / n,
                None => t,
            };
        }
        debug_assert!(width <= BLOCK);
    }

    /// Max of bag `bag` over `cols` into `dst[cols]`, the winning ids into
    /// `args[cols]`.
    #[inline(always)]
    fn pool_max(
        &self,
        bag: Range<usize>,
        cols: Range<usize>,
        limit: usize,
        dst: &mut [f32],
        args: &mut [i64],
    ) {
        let first_block = cols.start == 0;
        let start = bag.start;
        let mut kept = bag.clone().filter(|&p| self.kept(p));
        let Some(first) = kept.next() else {
            dst[cols.clone()].fill(0.0);
            args[cols].fill(-1);
            return;
        };
        if bag.len() > MAX_EXACT_POSITION {
            // Positions would not be exact in f32 lanes: a plain loop.
            dst[cols.clone()].copy_from_slice(self.cols(first, &cols));
            let mut win = vec![first; cols.len()];
            for p in kept {
                for (j, (&x, best)) in self
                    .cols(p, &cols)
                    .iter()
                    .zip(&mut dst[cols.clone()])
                    .enumerate()
                {
                    if x > *best {
                        *best = x;
                        win[j] = p;
                    }
                }
            }
            for (a, &p) in args[cols].iter_mut().zip(&win) {
                *a = self.ids.row(p) as i64;
            }
            return;
        }
        let load = |p: usize| -> ([f32x8; VECS], [f32; 8]) {
            let mut v = [f32x8::splat(f32::NEG_INFINITY); VECS];
            let mut t = [f32::NEG_INFINITY; 8];
            let (body, rest) = self.cols(p, &cols).as_chunks::<8>();
            for (a, x) in v.iter_mut().zip(body) {
                *a = f32x8::from(*x);
            }
            t[..rest.len()].copy_from_slice(rest);
            (v, t)
        };
        if first_block {
            for p in bag.start..first + 1 {
                if p + AHEAD < limit {
                    self.prefetch(p + AHEAD);
                }
            }
        }
        let (mut best, mut best_tail) = load(first);
        let offset = (first - start) as f32;
        let mut at = [f32x8::splat(offset); VECS];
        let mut at_tail = [offset; 8];
        let mut last = first;
        for p in kept {
            if first_block {
                for q in last + 1..=p {
                    if q + AHEAD < limit {
                        self.prefetch(q + AHEAD);
                    }
                }
            }
            last = p;
            let (v, t) = load(p);
            let here = f32x8::splat((p - start) as f32);
            for k in 0..VECS {
                let gt = v[k].simd_gt(best[k]);
                best[k] = gt.bitselect(v[k], best[k]);
                at[k] = gt.bitselect(here, at[k]);
            }
            for k in 0..8 {
                if t[k] > best_tail[k] {
                    best_tail[k] = t[k];
                    at_tail[k] = (p - start) as f32;
                }
            }
        }
        if first_block {
            for q in last + 1..bag.end {
                if q + AHEAD < limit {
                    self.prefetch(q + AHEAD);
                }
            }
        }
        let width = cols.len();
        let mut values = [0.0f32; BLOCK];
        let mut winners = [0.0f32; BLOCK];
        for k in 0..VECS {
            values[8 * k..8 * k + 8].copy_from_slice(&best[k].to_array());
            winners[8 * k..8 * k + 8].copy_from_slice(&at[k].to_array());
        }
        let body = width / 8 * 8;
        values[body..width].copy_from_slice(&best_tail[..width - body]);
        winners[body..width].copy_from_slice(&at_tail[..width - body]);
        dst[cols.clone()].copy_from_slice(&values[..width]);
        for (a, &w) in args[cols].iter_mut().zip(&winners[..width]) {
            *a = self.ids.row(start + w as usize) as i64;
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

/// The grouped form of a sum or mean bag batch: its groups and its source.
fn grouped_bags<'a, I: Index>(
    par: bool,
    ids: ValidIds<'_, I>,
    bags: &Bags,
    pooling: &Pooling<'_>,
    grad_bags: &'a [f32],
    dim: usize,
) -> (Groups, PerBag<'a>) {
    let bag_of = bags.bag_of();
    let skip = pooling.padding_idx;
    let groups = Groups::new_kept(ids, |p, r| bag_of[p] != usize::MAX && Some(r) != skip, par);
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
    let source = PerBag {
        grad_bags,
        dim,
        bag_of,
        factor,
    };
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
    let (ids, _) = check_call(rows * dim, dim, ids, bags, pooling)?;
    Ok(ids)
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
    let (groups, source) = grouped_bags(split, ids, bags, pooling, grad_bags, dim);
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
) -> Result<grouped::SparseGrad, EmbeddingError> {
    let len = rows_len(num_embeddings, dim)?;
    let ids = check_backward(len, dim, ids, bags, pooling, grad_bags)?;
    if pooling.mode == Mode::Max {
        return Err(EmbeddingError::MaxNeedsIndices);
    }
    let split = par.splits(core::mem::size_of_val(grad_bags), PARALLEL_MIN_BYTES);
    let (groups, source) = grouped_bags(split, ids, bags, pooling, grad_bags, dim);
    let values = grouped::coalesce_from(split, &groups, &source, dim, pooling.scale_grad_by_freq);
    grouped::SparseGrad::new(groups.rows, values, num_embeddings, dim)
}

/// The fused backward + update of a sum or mean bag batch (the caller has
/// checked the target's shapes): each touched row's gradient is summed and
/// handed to `rule` at once.
pub(crate) fn bag_fused_update<I: Index, R: grouped_rule::Rule>(
    par: Parallelism,
    grad_bags: &[f32],
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    target: grouped::Target<'_>,
    rule: &R,
) -> Result<(), EmbeddingError> {
    let dim = target.dim;
    let ids = check_backward(target.weight.len(), dim, ids, bags, pooling, grad_bags)?;
    if pooling.mode == Mode::Max {
        return Err(EmbeddingError::MaxNeedsIndices);
    }
    let split = par.splits(core::mem::size_of_val(grad_bags), PARALLEL_MIN_BYTES);
    let (groups, source) = grouped_bags(split, ids, bags, pooling, grad_bags, dim);
    grouped::apply_groups(
        split,
        &groups,
        &source,
        pooling.scale_grad_by_freq,
        target,
        rule,
    );
    Ok(())
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
