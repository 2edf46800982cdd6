//! The sum (and mean) of one bag, a column block at a time in registers;
//! for rows of one block, of each bag of a task inside that block.

use super::forward::{Rows, Visit};
use crate::bags::Bags;
use crate::index::RowId;
use crate::kernels::blocks::{BlockBody, Cols, Widest, block_count, each_block};
use crate::kernels::row_format::{Affine, RowFormat, RowSpan, Sink};
use crate::kernels::slot::Slot;
use crate::simd::Lanes;
use core::ops::Range;

/// `dst` = the sum of bag `bag`'s kept rows (times their weights), divided
/// by their count for a mean; zeros when it kept none.
///
/// A block is one pass over the bag's rows, each pass paying a row's
/// bookkeeping again (its id, hints, scale and bias), so the widest block
/// is as wide as the registers allow: [`Lanes::SUM_BLOCK`] vectors (24 on
/// AVX-512, 16 with AVX, 8 without) for `f32` and packed rows. Half rows
/// keep blocks of [`Lanes::REGISTERS`]: on AVX-512 their sums were slower
/// in blocks of 24 than of 16, where `f32` and packed rows were faster
/// (docs/design.md, "SIMD"). A half or packed row of several blocks takes
/// blocks of [`Lanes::DECODE_BLOCK`] ([`widest`]).
#[inline(always)]
pub(super) fn pool<V: Lanes, I: RowId, T: RowFormat, S: Slot>(
    terms: Terms<'_, '_, I, T>,
    bag: Range<usize>,
    dst: &mut [S],
) {
    let mut sum = Sum::<_, _, _, false> { terms, bag, dst };
    if each_block::<V, _>(terms.rows.dim, widest::<V, T>(terms.rows.dim), &mut sum) == 0 {
        S::zero(sum.dst);
    }
}

/// The widest column block of [`pool`] over rows of `dim` values, in
/// vectors. Rows that a decode reads (half or packed) and that take more
/// than one pass anyway are cut into blocks that fit the registers beside
/// the decode ([`Lanes::DECODE_BLOCK`]): with AVX, minilm's 384 columns in
/// four passes of 96 rather than three of 128 that spill.
#[inline(always)]
fn widest<V: Lanes, T: RowFormat>(dim: usize) -> usize {
    let one_pass = if T::HALF { V::REGISTERS } else { V::SUM_BLOCK };
    if (T::HALF || T::PACKED) && dim > one_pass * V::WIDTH {
        one_pass.min(V::DECODE_BLOCK)
    } else {
        one_pass
    }
}

/// The kind of [`widest`]'s answer for rows of `T`.
const fn widest_kind<T: RowFormat>() -> Widest {
    if T::HALF {
        Widest::Half
    } else {
        Widest::Sum { decodes: T::PACKED }
    }
}

/// Whether [`pool_each`] can take the bags of rows of `dim` values: [`pool`]
/// cuts such a row into one column block.
#[inline(always)]
pub(super) fn one_block<V: Lanes, T: RowFormat>(dim: usize) -> bool {
    block_count::<V>(dim, widest::<V, T>(dim)) == 1
}

/// [`pool`] for bags `first_bag..` of `bags`, one a row of `out`, whose rows
/// are one column block ([`one_block`]): the loop over the bags runs inside
/// the block, so the block's size is chosen, and its code entered, once for
/// them all rather than once a bag.
///
/// With short bags of one-line rows, the code outside the loop over a
/// bag's rows (choosing the block, entering its code, storing) held a
/// large share of a bag sum's time; looping over the bags inside the block
/// pays that once a task, and the sums of narrow and recsys took less time
/// in every format measured (docs/design.md, "Bags"). A row of several
/// blocks keeps a bag at a time: its blocks read the row while it is in
/// cache.
#[inline(always)]
pub(super) fn pool_each<V: Lanes, I: RowId, T: RowFormat, S: Slot>(
    terms: Terms<'_, '_, I, T>,
    bags: &Bags,
    first_bag: usize,
    out: &mut [S],
    stride: usize,
) {
    let mut each = EachBag {
        terms,
        bags,
        first_bag,
        out,
        stride,
    };
    each_block::<V, _>(terms.rows.dim, widest::<V, T>(terms.rows.dim), &mut each);
}

/// The bags of [`pool_each`], and their rows of the output.
struct EachBag<'r, 'i, I: RowId, T, S> {
    terms: Terms<'r, 'i, I, T>,
    bags: &'r Bags,
    first_bag: usize,
    out: &'r mut [S],
    /// How far apart the bags' rows are in `out`.
    stride: usize,
}

impl<I: RowId, T: RowFormat, S: Slot> BlockBody for EachBag<'_, '_, I, T, S> {
    const APART: bool = true;
    const WIDEST: Widest = widest_kind::<T>();

    /// Each bag's sum, as [`pool`] writes it, through the one block `cols`.
    // Inlined into its block wrapper, as `Sum::block`.
    #[inline(always)]
    fn block<V: Lanes, const N: usize>(&mut self, cols: Cols<N>) -> usize {
        let dim = self.terms.rows.dim;
        for (k, row) in self.out.chunks_mut(self.stride).enumerate() {
            let mut sum = Sum::<_, _, _, true> {
                terms: self.terms,
                bag: self.bags.range(self.first_bag + k),
                dst: &mut row[..dim],
            };
            if sum.block::<V, N>(cols) == 0 {
                S::zero(sum.dst);
            }
        }
        0
    }
}

/// What every bag of a call sums over: the rows, the weights, the mode, and
/// the call's last position for the hints ([`Rows::blocks`]).
pub(super) struct Terms<'r, 'i, I: RowId, T> {
    pub(super) rows: &'r Rows<'i, I, T>,
    pub(super) weights: Option<&'r [f32]>,
    /// Whether a weighted row is fused into the sum (`fma`) rather than
    /// rounded first: PyTorch's CPU bag fuses it, except with a
    /// `padding_idx`, where it takes its plain loop.
    pub(super) fused: bool,
    /// Whether the sum is divided by the count of rows kept.
    pub(super) mean: bool,
    pub(super) limit: usize,
}

// By hand: derived, they would ask `I` and `T` to be `Copy` too.
impl<I: RowId, T> Clone for Terms<'_, '_, I, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<I: RowId, T> Copy for Terms<'_, '_, I, T> {}

/// One bag's sum: what it sums over, its positions, and where it goes;
/// `ONE` whether its rows may be one column block (only under
/// [`pool_each`]: see [`Rows::blocks`]).
struct Sum<'r, 'i, I: RowId, T, S, const ONE: bool> {
    terms: Terms<'r, 'i, I, T>,
    bag: Range<usize>,
    dst: &'r mut [S],
}

impl<I: RowId, T: RowFormat, S: Slot, const ONE: bool> BlockBody for Sum<'_, '_, I, T, S, ONE> {
    const APART: bool = true;
    const WIDEST: Widest = widest_kind::<T>();

    /// Columns `cols` of the bag's sum into `dst`; returns how many rows
    /// were kept. The sums start from `-0.0`, so the first kept term comes
    /// through to the bit (`-0.0 + x == x`); a mean divides in the registers
    /// before the one store. One copy of the loop per weighting, so the plain
    /// sum's loop holds the accumulators and nothing else (with one shared
    /// loop the compiler kept half of them on the stack).
    // Inlined into its block wrapper (`APART`), a function of its own with
    // the lanes' instructions. Also unoptimised, where every inlined local
    // keeps a stack slot of its own, that keeps the frames small: with all
    // the block sizes inlined into one function, a sixteen-lane bag sum's
    // frame reached 7 MB there and overflowed a thread's stack.
    #[inline(always)]
    fn block<V: Lanes, const N: usize>(&mut self, cols: Cols<N>) -> usize {
        let bag = self.bag.clone();
        let Terms {
            rows,
            weights,
            fused,
            mean,
            limit,
        } = self.terms;
        // A local copy, which the compiler can keep in registers: read
        // through the reference, the table's and the ids' fields may be
        // loaded again after each hint, which LLVM counts as a possible
        // write to memory.
        let rows = *rows;
        let from = [V::splat(T::SUM_FROM); N];
        let (mut acc, kept) = if const { T::PACKED } {
            // One loop for packed rows with or without weights: a weight of
            // 1 scales the row's scale and bias to themselves.
            let mut levels = Levels { acc: from, weights };
            let kept = rows.blocks::<V, N, ONE, _>(bag, limit, cols, &mut levels);
            (levels.acc, kept)
        } else {
            match weights {
                None => {
                    let mut values = Values(from);
                    let kept = rows.blocks::<V, N, ONE, _>(bag, limit, cols, &mut values);
                    (values.0, kept)
                }
                Some(weights) => {
                    let mut scaled = Scaled {
                        acc: from,
                        weights,
                        fused,
                    };
                    let kept = rows.blocks::<V, N, ONE, _>(bag, limit, cols, &mut scaled);
                    (scaled.acc, kept)
                }
            }
        };
        if mean && kept > 0 {
            let n = V::splat(kept as f32);
            for a in &mut acc {
                *a = a.div(n);
            }
        }
        rows.table.in_column_order(&mut acc);
        cols.store(acc, self.dst);
        kept
    }
}

/// `acc += row`, for rows of values (`f32`, halves).
struct Values<V, const N: usize>([V; N]);

impl<V: Lanes, const N: usize> Visit<V, N> for Values<V, N> {
    #[inline(always)]
    fn visit<T: RowFormat>(&mut self, _p: usize, table: &T, row: RowSpan, cols: Cols<N>) {
        debug_assert!(!T::PACKED);
        table.decode(row, cols, &mut AddValues(&mut self.0));
    }
}

/// `acc += row × weights[p]` for rows of values: fused into one rounding
/// (`fused`), or the product rounded first.
struct Scaled<'w, V, const N: usize> {
    acc: [V; N],
    weights: &'w [f32],
    fused: bool,
}

impl<V: Lanes, const N: usize> Visit<V, N> for Scaled<'_, V, N> {
    #[inline(always)]
    fn visit<T: RowFormat>(&mut self, p: usize, table: &T, row: RowSpan, cols: Cols<N>) {
        debug_assert!(!T::PACKED);
        let mut sink = AddScaled {
            acc: &mut self.acc,
            w: V::splat(self.weights[p]),
            fused: self.fused,
        };
        table.decode(row, cols, &mut sink);
    }
}

/// FBGEMM's `acc = fma(w · scale, q, acc + w · bias)` for packed rows, `w`
/// the position's weight, or 1 without weights (`1 · x` is `x`, so the
/// unweighted sum is `fma(scale, q, acc + bias)`).
struct Levels<'w, V, const N: usize> {
    acc: [V; N],
    weights: Option<&'w [f32]>,
}

impl<V: Lanes, const N: usize> Visit<V, N> for Levels<'_, V, N> {
    #[inline(always)]
    fn visit<T: RowFormat>(&mut self, p: usize, table: &T, row: RowSpan, cols: Cols<N>) {
        let w = match self.weights {
            Some(weights) => weights[p],
            None => 1.0,
        };
        if let Some((scale, bias)) = table.affine::<V>(row) {
            let a = Affine {
                scale: V::splat(w * scale),
                bias: V::splat(w * bias),
            };
            table.decode(
                row,
                cols,
                &mut AddLevels {
                    acc: &mut self.acc,
                    a,
                },
            );
        }
    }
}

/// `acc[j] += x`.
struct AddValues<'a, V, const N: usize>(&'a mut [V; N]);

impl<V: Lanes, const N: usize> Sink<V> for AddValues<'_, V, N> {
    #[inline(always)]
    fn take(&mut self, j: usize, x: V) {
        self.0[j] = self.0[j].add(x);
    }
}

/// `acc[j] = fma(x, w, acc[j])` (`fused`: one rounding, as PyTorch's CPU
/// bag adds a weighted row through FBGEMM; `mul_add` is fused on every lane
/// type, so the same bits on every machine), or `acc[j] + x × w` with the
/// product rounded first (PyTorch's loop where a `padding_idx` is set).
struct AddScaled<'a, V, const N: usize> {
    acc: &'a mut [V; N],
    w: V,
    fused: bool,
}

impl<V: Lanes, const N: usize> Sink<V> for AddScaled<'_, V, N> {
    #[inline(always)]
    fn take(&mut self, j: usize, x: V) {
        self.acc[j] = if self.fused {
            x.mul_add(self.w, self.acc[j])
        } else {
            self.acc[j].add(x.mul(self.w))
        };
    }
}

/// FBGEMM's `acc[j] = fma(scale, q, acc[j] + bias)` (the scale and bias
/// already times the weight).
struct AddLevels<'a, V, const N: usize> {
    acc: &'a mut [V; N],
    a: Affine<V>,
}

impl<V: Lanes, const N: usize> Sink<V> for AddLevels<'_, V, N> {
    #[inline(always)]
    fn take(&mut self, j: usize, q: V) {
        self.acc[j] = self.a.scale.mul_add(q, self.acc[j].add(self.a.bias));
    }
}
