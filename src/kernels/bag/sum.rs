//! The sum (and mean) of one bag, a column block at a time in registers.

use super::forward::{Rows, Visit};
use crate::index::Index;
use crate::kernels::row_format::{each_block, BlockBody, Cols, RowFormat};
use crate::simd::Lanes;
use core::ops::Range;

/// `dst` = the sum of bag `bag`'s kept rows (times their weights), divided
/// by their count when `mean`; zeros when it kept none. Blocks of 16
/// vectors where the lanes have sixteen registers, else of 8.
#[inline(always)]
pub(super) fn pool<V: Lanes, I: Index, T: RowFormat>(
    rows: &Rows<'_, I, T>,
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
struct Sum<'r, 'i, I: Index, T> {
    rows: &'r Rows<'i, I, T>,
    bag: Range<usize>,
    weights: Option<&'r [f32]>,
    mean: bool,
    limit: usize,
    dst: &'r mut [f32],
}

impl<I: Index, T: RowFormat> BlockBody for Sum<'_, '_, I, T> {
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
                let mut plain = Plain([V::splat(T::SUM_FROM); N]);
                let kept = self
                    .rows
                    .blocks::<V, N, _>(bag, self.limit, cols, &mut plain);
                (plain.0, kept)
            }
            Some(weights) => {
                let mut weighted = Weighted {
                    acc: [V::splat(T::SUM_FROM); N],
                    weights,
                };
                let kept = self
                    .rows
                    .blocks::<V, N, _>(bag, self.limit, cols, &mut weighted);
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

/// `acc += row`; for a packed row, FBGEMM's `acc = fma(scale, q, acc + bias)`.
struct Plain<V, const N: usize>([V; N]);

impl<V: Lanes, const N: usize> Visit<V, N> for Plain<V, N> {
    #[inline(always)]
    fn visit(&mut self, _p: usize, row: [V; N], affine: Option<(f32, f32)>) {
        match affine {
            None => {
                for (a, x) in self.0.iter_mut().zip(row) {
                    *a = a.add(x);
                }
            }
            Some((scale, bias)) => {
                let (s, b) = (V::splat(scale), V::splat(bias));
                for (a, q) in self.0.iter_mut().zip(row) {
                    *a = s.mul_add(q, a.add(b));
                }
            }
        }
    }
}

/// `acc += row × weights[p]`, the product rounded first; for a packed row
/// FBGEMM's `acc = fma(w · scale, q, acc + w · bias)`.
struct Weighted<'w, V, const N: usize> {
    acc: [V; N],
    weights: &'w [f32],
}

impl<V: Lanes, const N: usize> Visit<V, N> for Weighted<'_, V, N> {
    #[inline(always)]
    fn visit(&mut self, p: usize, row: [V; N], affine: Option<(f32, f32)>) {
        let w = self.weights[p];
        match affine {
            None => {
                let w = V::splat(w);
                for (a, x) in self.acc.iter_mut().zip(row) {
                    *a = a.add(x.mul(w));
                }
            }
            Some((scale, bias)) => {
                let (s, b) = (V::splat(w * scale), V::splat(w * bias));
                for (a, q) in self.acc.iter_mut().zip(row) {
                    *a = s.mul_add(q, a.add(b));
                }
            }
        }
    }
}
