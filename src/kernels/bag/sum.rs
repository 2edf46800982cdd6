//! The sum (and mean) of one bag, a column block at a time in registers.

use super::forward::{each_block, BlockBody, Cols, Rows, Visit};
use crate::index::Index;
use crate::simd::{Lanes, LANES};
use core::ops::Range;

/// `dst` = the sum of bag `bag`'s kept rows (times their weights), divided
/// by their count when `mean`; zeros when it kept none. Blocks of 16
/// vectors where the lanes have sixteen registers, else of 8.
#[inline(always)]
pub(super) fn pool<V: Lanes, I: Index>(
    rows: &Rows<'_, '_, I>,
    bag: Range<usize>,
    limit: usize,
    weights: Option<&[f32]>,
    mean: bool,
    dst: &mut [f32],
) {
    let mut sum = Sum {
        rows,
        bag,
        weights,
        mean,
        limit,
        dst,
    };
    if each_block::<V, _>(rows.dim, V::REGISTERS, &mut sum) == 0 {
        sum.dst.fill(0.0);
    }
}

/// One bag's sum: its rows, weights and mode, and where it goes.
struct Sum<'r, 'a, 'i, I: Index> {
    rows: &'r Rows<'a, 'i, I>,
    bag: Range<usize>,
    weights: Option<&'r [f32]>,
    mean: bool,
    limit: usize,
    dst: &'r mut [f32],
}

impl<I: Index> BlockBody for Sum<'_, '_, '_, I> {
    /// Columns `cols` of the bag's sum into `dst`; returns how many rows
    /// were kept. The sums start from `-0.0`, so the first kept term comes
    /// through to the bit (`-0.0 + x == x`); a mean divides in the registers
    /// before the one store. One copy of the loop per weighting, so the plain
    /// sum's loop holds the accumulators and nothing else (with one shared
    /// loop the compiler kept half of them on the stack).
    #[inline(always)]
    fn block<V: Lanes, const N: usize>(&mut self, cols: Cols<N>) -> usize {
        let bag = self.bag.clone();
        let (mut acc, kept) = match self.weights {
            None => {
                let mut plain = Plain([V::splat(-0.0); N]);
                let kept = self.rows.blocks::<N, _>(bag, self.limit, cols, &mut plain);
                (plain.0, kept)
            }
            Some(weights) => {
                let mut weighted = Weighted {
                    acc: [V::splat(-0.0); N],
                    weights,
                };
                let kept = self
                    .rows
                    .blocks::<N, _>(bag, self.limit, cols, &mut weighted);
                (weighted.acc, kept)
            }
        };
        if self.mean && kept > 0 {
            let n = V::splat(kept as f32);
            for a in &mut acc {
                *a = a.div(n);
            }
        }
        cols.store(acc, self.dst);
        kept
    }
}

/// `acc += row`.
struct Plain<V, const N: usize>([V; N]);

impl<V: Lanes, const N: usize> Visit<N> for Plain<V, N> {
    #[inline(always)]
    fn visit(&mut self, _p: usize, row: &[[f32; LANES]; N]) {
        for (a, x) in self.0.iter_mut().zip(row) {
            *a = a.add(V::load(x));
        }
    }
}

/// `acc += row × weights[p]`, the product rounded first.
struct Weighted<'w, V, const N: usize> {
    acc: [V; N],
    weights: &'w [f32],
}

impl<V: Lanes, const N: usize> Visit<N> for Weighted<'_, V, N> {
    #[inline(always)]
    fn visit(&mut self, p: usize, row: &[[f32; LANES]; N]) {
        let w = V::splat(self.weights[p]);
        for (a, x) in self.acc.iter_mut().zip(row) {
            *a = a.add(V::load(x).mul(w));
        }
    }
}
