//! The max of one bag, a column block at a time in registers, with the
//! position each column's winner came from.

use super::forward::{Cols, Rows, Visit};
use crate::index::Index;
use crate::simd::{Lanes, LANES};
use core::ops::Range;

/// `dst` = the column-wise max of bag `bag`'s kept rows and `args` the ids
/// they came from; zeros and -1 when it kept none. A block is half the
/// registers of values and half of positions: 8 vectors with sixteen
/// registers, 4 with eight; then 2 and 1, then the last columns.
///
/// The bag must hold at most `u32::MAX + 1` positions (the positions ride
/// in the bits of an `f32` lane); the checks refuse longer ones.
#[inline(always)]
pub(super) fn pool<V: Lanes, I: Index>(
    rows: &Rows<'_, '_, I>,
    bag: Range<usize>,
    limit: usize,
    dst: &mut [f32],
    args: &mut [i64],
) {
    debug_assert!(u32::try_from(bag.len().saturating_sub(1)).is_ok());
    let dim = rows.dim;
    let max = Max { rows, limit };
    let (mut kept, mut c) = (0, 0);
    if V::REGISTERS >= 16 {
        while c + 8 * LANES <= dim {
            kept = max.block::<V, 8>(bag.clone(), Cols::whole(c), dst, args);
            c += 8 * LANES;
        }
    }
    while c + 4 * LANES <= dim {
        kept = max.block::<V, 4>(bag.clone(), Cols::whole(c), dst, args);
        c += 4 * LANES;
    }
    if c + 2 * LANES <= dim {
        kept = max.block::<V, 2>(bag.clone(), Cols::whole(c), dst, args);
        c += 2 * LANES;
    }
    if c + LANES <= dim {
        kept = max.block::<V, 1>(bag.clone(), Cols::whole(c), dst, args);
        c += LANES;
    }
    if c < dim {
        kept = max.block::<V, 1>(bag, Cols::tail(c, dim - c), dst, args);
    }
    if kept == 0 {
        dst.fill(0.0);
        args.fill(-1);
    }
}

/// One bag's max: its rows.
struct Max<'r, 'a, 'i, I: Index> {
    rows: &'r Rows<'a, 'i, I>,
    limit: usize,
}

impl<I: Index> Max<'_, '_, '_, I> {
    /// Columns `cols` of the bag's max into `dst` and the winners' ids into
    /// `args`; returns how many rows were kept (and writes nothing when none
    /// was). The first kept row is taken as it is; after it a strictly
    /// greater value replaces (an ordered compare, so a NaN neither wins nor
    /// is replaced), and its position in the bag replaces the winner's,
    /// through the same mask.
    #[inline(always)]
    fn block<V: Lanes, const N: usize>(
        &self,
        bag: Range<usize>,
        cols: Cols<N>,
        dst: &mut [f32],
        args: &mut [i64],
    ) -> usize {
        let start = bag.start;
        let mut max = Running {
            best: [V::splat(0.0); N],
            from: [V::splat(0.0); N],
            first: true,
            start,
        };
        let kept = self.rows.blocks::<N, _>(bag, self.limit, cols, &mut max);
        let Running { best, from, .. } = max;
        if kept > 0 {
            cols.store(best, dst);
            let mut at = [[0.0f32; LANES]; N];
            for (a, f) in at.iter_mut().zip(from) {
                f.store(a);
            }
            let winners = &mut args[cols.start..cols.start + cols.width];
            for (arg, k) in winners.iter_mut().zip(at.as_flattened()) {
                *arg = self.rows.ids.row(start + k.to_bits() as usize) as i64;
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

impl<V: Lanes, const N: usize> Visit<N> for Running<V, N> {
    #[inline(always)]
    fn visit(&mut self, p: usize, row: &[[f32; LANES]; N]) {
        // The position's bits as a lane: only ever selected and stored.
        let here = V::splat(f32::from_bits((p - self.start) as u32));
        let lanes = self.best.iter_mut().zip(&mut self.from).zip(row);
        if self.first {
            for ((b, f), x) in lanes {
                (*b, *f) = (V::load(x), here);
            }
            self.first = false;
        } else {
            for ((b, f), x) in lanes {
                let v = V::load(x);
                let wins = v.greater(*b);
                (*b, *f) = (wins.select(v, *b), wins.select(here, *f));
            }
        }
    }
}
