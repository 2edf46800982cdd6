//! The max of one bag, a column block at a time in registers, with the
//! position each column's winner came from.

use super::forward::{Rows, Visit};
use crate::index::RowId;
use crate::kernels::blocks::{BlockBody, Cols, Widest, each_block};
use crate::kernels::row_format::{Affine, RowFormat, RowSpan, Sink, value};
use crate::kernels::slot::Slot;
use crate::simd::{Lanes, MAX_LANES};
use core::ops::Range;

/// `dst` = the column-wise max of bag `bag`'s kept rows and `args` the ids
/// they came from; zeros and -1 when it kept none. A block is half the
/// registers of values and half of positions: 8 vectors with sixteen
/// registers, 4 with eight.
///
/// The bag must hold at most `2^32` positions (the positions ride in the
/// bits of an `f32` lane); the checks refuse longer ones.
#[inline(always)]
pub(super) fn pool<V: Lanes, I: RowId, T: RowFormat, S: Slot>(
    rows: &Rows<'_, I, T>,
    bag: Range<usize>,
    limit: usize,
    dst: &mut [S],
    args: &mut [i64],
) {
    debug_assert!(u32::try_from(bag.len().saturating_sub(1)).is_ok());
    let mut max = Max {
        rows,
        bag,
        limit,
        dst,
        args,
    };
    if each_block::<V, _>(rows.dim, V::REGISTERS / 2, &mut max) == 0 {
        S::zero(max.dst);
        max.args.fill(-1);
    }
}

/// One bag's max: its rows, and where the values and winners go.
struct Max<'r, 'i, I: RowId, T, S> {
    rows: &'r Rows<'i, I, T>,
    bag: Range<usize>,
    limit: usize,
    dst: &'r mut [S],
    args: &'r mut [i64],
}

impl<I: RowId, T: RowFormat, S: Slot> BlockBody for Max<'_, '_, I, T, S> {
    const APART: bool = true;
    const WIDEST: Widest = Widest::HalfRegisters;

    /// Columns `cols` of the bag's max into `dst` and the winners' ids into
    /// `args`; returns how many rows were kept (and writes nothing when none
    /// was). The first kept row is taken as it is; after it a strictly
    /// greater value replaces (an ordered compare, so a NaN neither wins nor
    /// is replaced), and its position in the bag replaces the winner's,
    /// through the same mask.
    // Inlined into its block wrapper, as `Sum::block` (sum.rs).
    #[inline(always)]
    fn block<V: Lanes, const N: usize>(&mut self, cols: Cols<N>) -> usize {
        let (bag, start) = (self.bag.clone(), self.bag.start);
        let mut max = Running {
            best: [V::splat(0.0); N],
            from: [V::splat(0.0); N],
            first: true,
            start,
        };
        // A copy the compiler keeps in registers, as in `Sum::block`.
        let rows = *self.rows;
        let kept = rows.blocks::<V, N, true, _>(bag, self.limit, cols, &mut max);
        let Running {
            mut best, mut from, ..
        } = max;
        if kept > 0 {
            rows.table.in_column_order(&mut best);
            rows.table.in_column_order(&mut from);
            cols.store(best, self.dst);
            let winners = &mut self.args[cols.start..cols.start + cols.width];
            let mut at = [0.0f32; MAX_LANES];
            for (args, f) in winners.chunks_mut(V::WIDTH).zip(from) {
                f.store(&mut at);
                for (arg, k) in args.iter_mut().zip(&at) {
                    *arg = rows.ids.row(start + k.to_bits() as usize) as i64;
                }
            }
        }
        kept
    }
}

/// The running max of a block: the best values, the positions (in the bag,
/// as `f32` bits) they came from, and whether a row was seen yet.
struct Running<V, const N: usize> {
    best: [V; N],
    from: [V; N],
    first: bool,
    start: usize,
}

impl<V: Lanes, const N: usize> Visit<V, N> for Running<V, N> {
    #[inline(always)]
    fn visit<T: RowFormat>(&mut self, p: usize, table: &T, row: RowSpan, cols: Cols<N>) {
        // The position's bits as a lane: only ever selected and stored.
        let here = V::splat(f32::from_bits((p - self.start) as u32));
        let mut sink = Keep {
            best: &mut self.best,
            from: &mut self.from,
            here,
            affine: Affine::of(table.affine::<V>(row)),
        };
        if self.first {
            table.decode(row, cols, &mut TakeAll(sink));
            self.first = false;
        } else {
            table.decode(row, cols, &mut sink);
        }
    }
}

/// Where a value strictly greater than the best so far wins, it and the
/// position replace them, through one mask.
struct Keep<'a, V, const N: usize> {
    best: &'a mut [V; N],
    from: &'a mut [V; N],
    here: V,
    affine: Option<Affine<V>>,
}

impl<V: Lanes, const N: usize> Sink<V> for Keep<'_, V, N> {
    #[inline(always)]
    fn take(&mut self, j: usize, lanes: V) {
        let x = value(lanes, self.affine);
        let wins = x.greater(self.best[j]);
        self.best[j] = wins.select(x, self.best[j]);
        self.from[j] = wins.select(self.here, self.from[j]);
    }
}

/// The first kept row: taken as it is.
struct TakeAll<'a, V, const N: usize>(Keep<'a, V, N>);

impl<V: Lanes, const N: usize> Sink<V> for TakeAll<'_, V, N> {
    #[inline(always)]
    fn take(&mut self, j: usize, lanes: V) {
        let keep = &mut self.0;
        keep.best[j] = value(lanes, keep.affine);
        keep.from[j] = keep.here;
    }
}
