//! Column blocks: a row read as blocks of `N` vectors ([`Cols`]), cut by
//! the ladder of [`each_block`] (24, 16 or 8 vectors, then 16, 8, 4, 2, 1,
//! then the last `dim % V::WIDTH` columns zero-padded into one vector), each
//! handed to a [`BlockBody`] with `N` a constant, so a block's vectors can
//! live in registers.

use crate::kernels::slot::Slot;
use crate::simd::{Body, Lanes, MAX_LANES};

/// A column block: `width` columns from `start`, read as `N` vectors. A
/// whole block has `width == N·V::WIDTH`; the last `dim % V::WIDTH`
/// columns of a row are a block of one vector, zero-padded.
#[derive(Clone, Copy)]
pub(crate) struct Cols<const N: usize> {
    pub(crate) start: usize,
    pub(crate) width: usize,
    /// Whether the block fills its `N` vectors.
    whole: bool,
}

impl<const N: usize> Cols<N> {
    /// The `N·V::WIDTH` columns from `start`.
    #[inline(always)]
    pub(crate) fn whole<V: Lanes>(start: usize) -> Self {
        Cols {
            start,
            width: N * V::WIDTH,
            whole: true,
        }
    }

    /// Whether the block fills its `N` vectors (else it is a row's last
    /// few columns, one vector).
    #[inline(always)]
    pub(crate) fn is_whole(self) -> bool {
        self.whole
    }

    /// Writes the block's `N` vectors of `V` to its columns of `dst`, a row.
    #[inline(always)]
    pub(crate) fn store<V: Lanes, S: Slot>(self, lanes: [V; N], dst: &mut [S]) {
        let dst = &mut dst[self.start..self.start + self.width];
        let mut values = [0.0f32; MAX_LANES];
        if self.is_whole() {
            for (o, v) in dst.chunks_exact_mut(V::WIDTH).zip(lanes) {
                v.store(&mut values);
                S::put(o, &values[..V::WIDTH]);
            }
        } else {
            lanes[0].store(&mut values);
            S::put(dst, &values[..self.width]);
        }
    }

    /// The last `width` (fewer than a vector of `V`'s) columns of a row,
    /// from `start`: a block of one vector, so only made with `N == 1`.
    #[inline(always)]
    fn tail<V: Lanes>(start: usize, width: usize) -> Self {
        debug_assert!(N == 1 && width < V::WIDTH);
        Cols {
            start,
            width,
            whole: false,
        }
    }
}

/// What [`each_block`] runs on each column block of a row.
pub(crate) trait BlockBody {
    /// Whether [`each_block`] calls each run of blocks of one size as a
    /// function of its own ([`Lanes::apart`]) rather than inlining
    /// them all into its caller. The bags' blocks are large, and a bag
    /// kernel holds up to eight sizes of each: inlined into one function,
    /// they made LLVM's optimisation of the kernel superlinear in its size,
    /// and a bag kernel compiled far faster with its blocks apart
    /// (docs/design.md, "SIMD"). One call runs all of a row's blocks of its
    /// size, so a row costs a call per block size it holds (at most five),
    /// not one per block.
    const APART: bool = false;

    /// The widest block this body ever asks [`each_block`] for: the sizes
    /// above it are never compiled for it.
    const WIDEST: Widest;

    /// Works on columns `cols` with lanes `V`; returns a count the caller
    /// keeps (the bags: how many rows were kept).
    fn block<V: Lanes, const N: usize>(&mut self, cols: Cols<N>) -> usize;
}

/// The widest column block a [`BlockBody`] asks for, as a kind: the lane
/// type says how many vectors each is ([`Widest::most`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Widest {
    /// [`Lanes::REGISTERS`]: the lookup.
    Registers,
    /// Half of them: max, which keeps the winners' positions beside the
    /// values.
    HalfRegisters,
    /// [`Lanes::SUM_BLOCK`], or for a row of several blocks whose values
    /// are decoded (`decodes`: packed rows) [`Lanes::DECODE_BLOCK`].
    Sum { decodes: bool },
    /// [`Lanes::REGISTERS`], or [`Lanes::DECODE_BLOCK`] for a row of
    /// several blocks: sums of half rows.
    Half,
    /// Whatever the caller passes.
    Any,
}

impl Widest {
    /// The most vectors a block of this kind holds with lanes `V`.
    pub(crate) const fn most<V: Lanes>(self) -> usize {
        match self {
            Widest::Registers | Widest::Half => V::REGISTERS,
            Widest::HalfRegisters => V::REGISTERS / 2,
            Widest::Sum { .. } => V::SUM_BLOCK,
            Widest::Any => {
                if V::SUM_BLOCK > V::REGISTERS {
                    V::SUM_BLOCK
                } else {
                    V::REGISTERS
                }
            }
        }
    }

    /// Whether blocks of 12 vectors, which only [`Lanes::DECODE_BLOCK`]
    /// asks for, are reachable with lanes `V`.
    pub(crate) const fn twelve<V: Lanes>(self) -> bool {
        let decodes = match self {
            Widest::Sum { decodes } => decodes,
            Widest::Half | Widest::Any => true,
            Widest::Registers | Widest::HalfRegisters => false,
        };
        decodes && V::DECODE_BLOCK == 12
    }
}

/// How many column blocks [`each_block`] cuts a row of `dim` values into
/// (its blocks counted by running it).
#[inline(always)]
pub(crate) fn block_count<V: Lanes>(dim: usize, widest: usize) -> usize {
    struct Count(usize);
    impl BlockBody for Count {
        const WIDEST: Widest = Widest::Any;

        #[inline(always)]
        fn block<V: Lanes, const N: usize>(&mut self, _cols: Cols<N>) -> usize {
            self.0 += 1;
            0
        }
    }
    let mut count = Count(0);
    each_block::<V, _>(dim, widest, &mut count);
    count.0
}

/// Runs `body` on every column block of a row of `dim` values: blocks of
/// `widest` vectors (24, 16, 12 or 8), then the smaller sizes that fit (16,
/// 8, 4, 2, 1; 12 only as the widest), then the last `dim % V::WIDTH` columns.
/// Returns the count of the last block.
///
/// `widest` is one of `V`'s block sizes ([`Lanes::REGISTERS`] or half of
/// it, [`Lanes::SUM_BLOCK`], [`Lanes::DECODE_BLOCK`]), at most what the
/// body's [`BlockBody::WIDEST`] allows. The sizes a lane type or a body
/// never reaches (24 without AVX-512, 16 and 12 without AVX, 12 with
/// AVX-512, 16 and 24 for max, 12 but for decoded rows; 8 on
/// [`Lanes::FALLBACK`] lanes) are left out by constant tests, so they are
/// never compiled for it. A size left out would only cost speed (the
/// smaller ones cover the row).
#[inline(always)]
pub(crate) fn each_block<V: Lanes, B: BlockBody>(dim: usize, widest: usize, body: &mut B) -> usize {
    debug_assert!(widest <= B::WIDEST.most::<V>() || widest == 12);
    debug_assert!(widest != 12 || B::WIDEST.twelve::<V>());
    let at = &mut Ladder {
        dim,
        next: 0,
        kept: 0,
    };
    // The tests on `V`'s constants are `const` blocks: a branch under a
    // false one is dropped before its calls are collected, so their copies
    // are never made (a plain `V::REGISTERS >= 24` is folded only by LLVM,
    // after it has compiled them).
    if const { !V::FALLBACK && B::WIDEST.most::<V>() >= 24 } && widest >= 24 {
        run::<V, B, 24>(body, at);
    }
    if const { !V::FALLBACK && B::WIDEST.most::<V>() >= 16 } && widest >= 16 {
        run::<V, B, 16>(body, at);
    }
    if const { !V::FALLBACK && B::WIDEST.twelve::<V>() } && widest == 12 {
        run::<V, B, 12>(body, at);
    }
    if const { !V::FALLBACK && B::WIDEST.most::<V>() >= 8 } && widest >= 8 {
        run::<V, B, 8>(body, at);
    }
    run::<V, B, 4>(body, at);
    // Fewer than four vectors are left: at most one block of 2, then of 1,
    // then the last columns (with the blocks of 1).
    run::<V, B, 2>(body, at);
    run::<V, B, 1>(body, at);
    at.kept
}

/// Where [`each_block`] stands in a row: its width, the first column not
/// yet run, and the count the last block returned.
struct Ladder {
    dim: usize,
    next: usize,
    kept: usize,
}

impl Ladder {
    /// Whether a whole block of `width` columns fits from `next`.
    #[inline(always)]
    fn fits(&self, width: usize) -> bool {
        self.next + width <= self.dim
    }

    /// Whether any column is left (after the whole blocks of one vector:
    /// the row's last few columns).
    #[inline(always)]
    fn has_columns_left(&self) -> bool {
        self.next < self.dim
    }
}

/// [`blocks_of`], inlined or apart as [`BlockBody::APART`] says; apart,
/// called only when it has a block to run.
#[inline(always)]
fn run<V: Lanes, B: BlockBody, const N: usize>(body: &mut B, at: &mut Ladder) {
    if !B::APART {
        blocks_of::<V, B, N>(body, at);
    } else if at.fits(N * V::WIDTH) || (N == 1 && at.has_columns_left()) {
        V::apart(BlocksOf::<B, N> { body, at });
    }
}

/// [`blocks_of`] as a [`Body`], for [`Lanes::apart`] to compile as a
/// function of its own: run with the lanes it was handed by, `V` again.
struct BlocksOf<'a, B, const N: usize> {
    body: &'a mut B,
    at: &'a mut Ladder,
}

impl<B: BlockBody, const N: usize> Body for BlocksOf<'_, B, N> {
    type Output = ();

    #[inline(always)]
    fn run<V: Lanes>(self) {
        blocks_of::<V, B, N>(self.body, self.at);
    }
}

/// Whole blocks of `N` vectors from column `at.next` while they fit in the
/// row, then, for `N == 1`, its last columns (fewer than a vector) as a
/// block of their own; `at` moved past them, holding the last block's count.
#[inline(always)]
fn blocks_of<V: Lanes, B: BlockBody, const N: usize>(body: &mut B, at: &mut Ladder) {
    while at.fits(N * V::WIDTH) {
        at.kept = body.block::<V, N>(Cols::whole::<V>(at.next));
        at.next += N * V::WIDTH;
    }
    if N == 1 && at.has_columns_left() {
        let tail = Cols::<N>::tail::<V>(at.next, at.dim - at.next);
        at.kept = body.block::<V, N>(tail);
        at.next = at.dim;
    }
}
