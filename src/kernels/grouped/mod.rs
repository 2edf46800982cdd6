//! Backward by row: group the positions by id, then visit each touched row
//! once. The dense backward, the coalesced sparse gradient and the fused
//! optimiser updates of the layers all run here, for a plain lookup and for
//! bags alike: a consumer takes a [`Source`] of gradient rows and a filter of
//! the positions to keep, and chooses its own strategy.
//!
//! | file | what |
//! | --- | --- |
//! | `groups.rs` | the radix grouping (trick 1) |
//! | `plan.rs` | tasks over the groups, hot rows split, the task runner (tricks 4, 5) |
//! | `dense.rs` | the dense gradient: summed in cache, or one sweep (tricks 2, 3) |
//! | `sparse.rs` | the coalesced sparse gradient |
//! | `fused.rs` | sparse optimiser updates fused into the backward, and the row rule |
//!
//! ```text
//! check grad_output length, every id                       (nothing written)
//! keys  = sort [(row, position) for every position, row != padding_idx]
//! groups = runs of equal rows in keys: (row, positions in order)
//! plan tasks over the groups (and, dense, over the untouched rows too)
//! each task, in parallel:
//!     for each group in its range:
//!         sum = 0 + grad_output[p0] + grad_output[p1] + ...   (position order)
//!         sum /= count                             (scale_grad_by_freq only)
//!         dense:     grad_table[row] = sum;  untouched rows = 0
//!         coalesced: values[group]   = sum
//!         fused:     rule(weight[row], sum, state[row])
//! ```
//!
//! 1. **One sort, no table-sized scratch.** The positions are sorted by row
//!    with a stable LSD radix sort, 11 bits of the row per pass (two passes
//!    for a million rows), so each row's positions stay in order. The cost
//!    is `O(n)` per pass and does not grow with `num_embeddings` beyond its
//!    bit count, which is what lets a sparse gradient and a fused update skip
//!    the 488 MiB of an untouched recsys table.
//! 2. **Exact sums.** Each row is summed in position order starting from
//!    `+0.0`, the same additions as `scatter_add` into a zeroed gradient, so
//!    the dense, the coalesced and the reference gradient have the same bits,
//!    for every thread count.
//! 3. **Each row written once.** The dense backward writes a touched row's sum
//!    or an untouched row's zeros in one sweep over the table: there is no
//!    zeroing pass before the scatter. From 8 MiB of table on, the sweep uses
//!    non-temporal (streaming) stores, which send whole lines to memory
//!    without first reading them into the cache: a plain store reads every
//!    line it writes, doubling the traffic.
//! 4. **Tasks own disjoint rows.** Groups are sorted by row, so a run of
//!    groups covers a contiguous range of table rows, and the table (and an
//!    optimiser's state) is carved into those ranges with `split_at_mut`.
//!    No atomics, no locks. The one `unsafe`, the coalesced gradient's
//!    `set_len`, rests on the tasks covering every group (`sparse.rs`).
//! 5. **Hot rows are split by columns.** A row holding more than a task's
//!    share of the positions (say 90 % of a batch) would serialise the call;
//!    such a row becomes several tasks over disjoint column blocks of whole
//!    cache lines, each summing its columns in position order. Rules that
//!    need the whole row at once (row-wise Adagrad) keep the row whole.
//! 6. **Prefetch.** In the grouped order the positions jump about
//!    `grad_output` at random, so each task walks a cursor about 16 KiB of
//!    rows ahead through its positions and prefetches their gradient rows
//!    (and, for a fused update, the weight and state rows of the group as
//!    far ahead). Prefetching only each group's first row would leave most
//!    rows of many small groups to miss.

mod dense;
mod fused;
mod groups;
mod plan;
mod sparse;

pub(crate) use dense::{dense, dense_backward_valid};
pub use dense::{dense_backward, dense_backward_with};
pub(crate) use fused::{RowRule, Target, apply_sparse, fused_update, sparse_groups, update};
pub use fused::{sparse_step, sparse_step_with};
pub(crate) use groups::Groups;
pub(crate) use plan::for_each_row;
pub(crate) use sparse::coalesce;
pub use sparse::{sparse_backward, sparse_backward_with};

use crate::error::EmbeddingError;
use crate::kernels::slot::Slot;
use crate::simd::{Lanes, MAX_LANES};
use core::ops::Range;

/// Where the gradient of each position comes from: position `p` adds
/// `row(p) × scale(p)` to its table row (the embedding's own gradient
/// row, or a bag's gradient row times the sample's weight or `1 / len`).
pub(crate) trait Source: Sync {
    /// Columns `cols` of the gradient row of position `p`.
    fn row(&self, p: usize, cols: Range<usize>) -> &[f32];
    /// The factor for position `p`, or `None` to add the row as it is.
    fn scale(&self, p: usize) -> Option<f32>;
    /// The size of the gradient rows handed out, one per position, in bytes
    /// (a row that many positions share counts once for each): the work
    /// that decides whether a sparse or fused call is worth splitting
    /// across threads.
    fn bytes(&self) -> usize;
}

/// The plain embedding's source: row `p` of `grad_output`, unscaled.
#[derive(Clone, Copy)]
pub(crate) struct PerPosition<'a> {
    pub(crate) grad_output: &'a [f32],
    pub(crate) dim: usize,
}

impl Source for PerPosition<'_> {
    #[inline(always)]
    fn row(&self, p: usize, cols: Range<usize>) -> &[f32] {
        &self.grad_output[p * self.dim + cols.start..p * self.dim + cols.end]
    }

    #[inline(always)]
    fn scale(&self, _p: usize) -> Option<f32> {
        None
    }

    fn bytes(&self) -> usize {
        core::mem::size_of_val(self.grad_output)
    }
}

/// `dst = (+0.0 + Σ row(p) × scale(p)) / count?` over `positions` in order,
/// where `dst` is already the `cols` of one row. Each product is rounded
/// before it is added (no fused multiply-add).
///
/// The sums are kept in registers, [`SUM_VECTORS`] vectors of columns at a
/// time (then one vector, then the last `cols.len() % V::WIDTH` columns),
/// and `dst` is written once and never read: a fresh output (the coalesced
/// gradient's values) needs no zeroing first, and a group of one position
/// moves the bytes of a copy (it still adds its row to `+0.0`). The same
/// additions in the same order as adding each row into a zeroed `dst`, so
/// the same bits. Every value of `dst` is written.
#[inline(always)]
pub(crate) fn sum_positions<V: Lanes, S: Source, D: Slot>(
    source: &S,
    positions: &[usize],
    cols: Range<usize>,
    divide_by_count: bool,
    dst: &mut [D],
) {
    debug_assert_eq!(dst.len(), cols.len());
    let count = (divide_by_count && positions.len() > 1).then_some(positions.len() as f32);
    let sum = Positions {
        source,
        positions,
        first: cols.start,
        count,
    };
    let block = SUM_VECTORS * V::WIDTH;
    let (wide, rest) = dst.split_at_mut(dst.len() / block * block);
    for (k, d) in wide.chunks_exact_mut(block).enumerate() {
        sum.vectors::<V, SUM_VECTORS, D>(k * block, d);
    }
    let at = wide.len();
    let (vectors, tail) = rest.split_at_mut(rest.len() / V::WIDTH * V::WIDTH);
    for (k, d) in vectors.chunks_exact_mut(V::WIDTH).enumerate() {
        sum.vectors::<V, 1, D>(at + k * V::WIDTH, d);
    }
    sum.tail(at + vectors.len(), tail);
}

/// Vectors of columns [`sum_positions`] sums at once: 128 columns with
/// AVX-512 and 64 with AVX, in a quarter and a half of the registers. The
/// portable lanes without AVX hold eight `f32x8`s in all sixteen SSE
/// registers, so there the row's loads wait on spills (the bits are the
/// same).
const SUM_VECTORS: usize = 8;

/// The terms of one group's sum: its positions' rows from column `first`
/// on, and the count to divide by (`scale_grad_by_freq`).
struct Positions<'a, S> {
    source: &'a S,
    positions: &'a [usize],
    first: usize,
    count: Option<f32>,
}

impl<S: Source> Positions<'_, S> {
    /// The sums of the `N` vectors from column `first + at` on, into `dst`.
    #[inline(always)]
    fn vectors<V: Lanes, const N: usize, D: Slot>(&self, at: usize, dst: &mut [D]) {
        let cols = self.first + at..self.first + at + N * V::WIDTH;
        let mut acc = [V::splat(0.0); N];
        for &p in self.positions {
            let row = self.source.row(p, cols.clone()).chunks_exact(V::WIDTH);
            match self.source.scale(p) {
                None => {
                    for (a, x) in acc.iter_mut().zip(row) {
                        *a = a.add(V::load(x));
                    }
                }
                Some(s) => {
                    let s = V::splat(s);
                    for (a, x) in acc.iter_mut().zip(row) {
                        *a = a.add(V::load(x).mul(s));
                    }
                }
            }
        }
        if let Some(count) = self.count {
            let count = V::splat(count);
            for a in &mut acc {
                *a = a.div(count);
            }
        }
        let mut values = [0.0f32; MAX_LANES];
        for (a, d) in acc.into_iter().zip(dst.chunks_exact_mut(V::WIDTH)) {
            a.store(&mut values);
            D::put(d, &values[..V::WIDTH]);
        }
    }

    /// The sums of the fewer than one vector's columns from `first + at`
    /// on, into `dst`, one value at a time in one pass over the positions.
    #[inline(always)]
    fn tail<D: Slot>(&self, at: usize, dst: &mut [D]) {
        if dst.is_empty() {
            return;
        }
        let cols = self.first + at..self.first + at + dst.len();
        let acc = &mut [0.0f32; MAX_LANES][..dst.len()];
        for &p in self.positions {
            let row = self.source.row(p, cols.clone());
            match self.source.scale(p) {
                None => acc.iter_mut().zip(row).for_each(|(a, x)| *a += *x),
                Some(s) => acc.iter_mut().zip(row).for_each(|(a, x)| *a += *x * s),
            }
        }
        if let Some(count) = self.count {
            acc.iter_mut().for_each(|a| *a /= count);
        }
        D::put(dst, acc);
    }
}

/// Checks a `padding_idx` that is already a row number.
pub(crate) fn check_padding(padding_idx: Option<usize>, rows: usize) -> Result<(), EmbeddingError> {
    match padding_idx {
        Some(p) if p >= rows => Err(EmbeddingError::PaddingIdxOutOfRange {
            padding_idx: i64::try_from(p).unwrap_or(i64::MAX),
            num_embeddings: rows,
        }),
        _ => Ok(()),
    }
}
