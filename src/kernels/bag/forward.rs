//! The bag forward's driver: tasks of whole bags across threads, each bag a
//! column block at a time ([`sum`](mod@super::sum) or [`max`](mod@super::max)), and
//! the loop over a bag's rows that both share ([`Rows::blocks`]).

use super::{max, sum};
use crate::bags::Bags;
use crate::formats::PackedTable;
use crate::index::{Index, ValidIds};
use crate::kernels::tuning::{prefetch_ahead, BAG_MAX_AHEAD_ROWS, PARALLEL_MIN_BYTES, TASK_BYTES};
use crate::parallel::Parallelism;
use crate::pooling::{Mode, Pooling};
use crate::simd::{prefetch, Body, Isa, Lanes, LANES};
use core::ops::Range;
use rayon::prelude::*;

/// The forward after [`check_forward`](super::check_forward): it cannot
/// fail.
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
    let isa = Isa::detect();
    let table = F32Rows { table, dim };
    forward_on(isa, par, table, ids, bags, pooling, out, max_indices);
}

/// [`forward_valid`] on a chosen instruction set and table format; the
/// tests run each.
#[allow(clippy::too_many_arguments)]
pub(super) fn forward_on<I: Index, T: BagTable>(
    isa: Isa,
    par: Parallelism,
    table: T,
    ids: ValidIds<'_, I>,
    bags: &Bags,
    pooling: &Pooling<'_>,
    out: &mut [f32],
    max_indices: &mut [i64],
) {
    let is_max = pooling.mode == Mode::Max;
    let dim = table.dim();
    if dim == 0 || bags.is_empty() {
        return;
    }
    let rows = Rows {
        table,
        dim,
        ids,
        padding_idx: pooling.padding_idx,
        ahead: prefetch_ahead(dim).min(BAG_MAX_AHEAD_ROWS),
    };
    let task = |first_bag: usize, out: &mut [f32], max_indices: &mut [i64]| {
        isa.run(BagTask {
            rows,
            bags,
            pooling,
            first_bag,
            out,
            max_indices,
        });
    };
    let max_indices = if is_max { max_indices } else { &mut [][..] };
    let read = ids.len().saturating_mul(table.row_bytes());
    if !par.splits(table.bytes().min(read), PARALLEL_MIN_BYTES) {
        task(0, out, max_indices);
        return;
    }
    let bags_per_task = (TASK_BYTES / (dim * 4)).max(1);
    let chunk = bags_per_task * dim;
    if is_max {
        out.par_chunks_mut(chunk)
            .zip(max_indices.par_chunks_mut(chunk))
            .enumerate()
            .for_each(|(k, (o, m))| task(k * bags_per_task, o, m));
    } else {
        out.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(k, o)| task(k * bags_per_task, o, &mut []));
    }
}

/// A table a bag reads: its rows as `f32` lanes, a block at a time. An
/// `f32` table lends its memory; a packed one decodes its levels into a
/// buffer and hands over each row's scale and bias, which the sum applies
/// with FBGEMM's fused multiply-add (see `sum.rs`).
pub(crate) trait BagTable: Copy + Sync {
    /// Where a sum starts: `-0.0` for `f32` rows (the exact identity, so the
    /// first row comes through to the bit, as in the reference's product),
    /// `+0.0` for packed rows (FBGEMM's start, which PyTorch's bits need).
    const SUM_FROM: f32;
    /// Values per row.
    fn dim(&self) -> usize;
    /// Bytes per row, and of the whole table (what decides the split).
    fn row_bytes(&self) -> usize;
    /// Bytes of the whole table.
    fn bytes(&self) -> usize;
    /// Block `cols` of row `r` as lanes, from the table or decoded into
    /// `buf`; and the row's scale and bias for a packed table.
    fn block<'s, const N: usize>(
        &'s self,
        r: usize,
        cols: Cols<N>,
        buf: &'s mut [[f32; LANES]; N],
    ) -> (&'s [[f32; LANES]; N], Option<(f32, f32)>);
    /// Hints for block `cols` of row `r`.
    fn prefetch_block<const N: usize>(&self, r: usize, cols: Cols<N>);
    /// Hints for all of row `r`.
    fn prefetch_row(&self, r: usize);
}

/// An `f32` table of rows of `dim`.
#[derive(Clone, Copy)]
pub(crate) struct F32Rows<'a> {
    pub(crate) table: &'a [f32],
    pub(crate) dim: usize,
}

impl BagTable for F32Rows<'_> {
    const SUM_FROM: f32 = -0.0;

    fn dim(&self) -> usize {
        self.dim
    }

    fn row_bytes(&self) -> usize {
        self.dim * 4
    }

    fn bytes(&self) -> usize {
        core::mem::size_of_val(self.table)
    }

    #[inline(always)]
    fn block<'s, const N: usize>(
        &'s self,
        r: usize,
        cols: Cols<N>,
        buf: &'s mut [[f32; LANES]; N],
    ) -> (&'s [[f32; LANES]; N], Option<(f32, f32)>) {
        let at = r * self.dim + cols.start;
        if cols.is_whole() {
            let (block, _) = self.table[at..at + N * LANES].as_chunks::<LANES>();
            (block.try_into().expect("N blocks of 8"), None)
        } else {
            buf.as_flattened_mut()[..cols.width].copy_from_slice(&self.table[at..at + cols.width]);
            (buf, None)
        }
    }

    #[inline(always)]
    fn prefetch_block<const N: usize>(&self, r: usize, cols: Cols<N>) {
        prefetch::block::<N>(self.table, r * self.dim + cols.start);
    }

    #[inline(always)]
    fn prefetch_row(&self, r: usize) {
        prefetch::row(&self.table[r * self.dim..(r + 1) * self.dim]);
    }
}

/// A row-wise quantized table of `BITS` bits a value (8, 4 or 2), its
/// layout known at compile time so that decoding a block is a short loop of
/// constant shifts (see `formats/rowwise.rs` for the layout).
#[derive(Clone, Copy)]
pub(crate) struct Packed<'a, const BITS: u32> {
    bytes: &'a [u8],
    dim: usize,
    row_bytes: usize,
    /// Bytes of codes at the start of each row.
    code_bytes: usize,
}

impl<'a, const BITS: u32> Packed<'a, BITS> {
    /// Values per byte.
    const PER_BYTE: usize = 8 / BITS as usize;

    /// The table's bytes, laid out for `BITS` (the caller matched the
    /// table's format to `BITS`).
    pub(crate) fn new(table: &PackedTable<'a>) -> Self {
        debug_assert_eq!(table.format().bits(), BITS);
        Packed {
            bytes: table.bytes(),
            dim: table.dim(),
            row_bytes: table.row_bytes(),
            code_bytes: table.dim().div_ceil(Self::PER_BYTE),
        }
    }
}

impl<const BITS: u32> BagTable for Packed<'_, BITS> {
    const SUM_FROM: f32 = 0.0;

    fn dim(&self) -> usize {
        self.dim
    }

    fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    fn bytes(&self) -> usize {
        self.bytes.len()
    }

    #[inline(always)]
    fn block<'s, const N: usize>(
        &'s self,
        r: usize,
        cols: Cols<N>,
        buf: &'s mut [[f32; LANES]; N],
    ) -> (&'s [[f32; LANES]; N], Option<(f32, f32)>) {
        let row = &self.bytes[r * self.row_bytes..(r + 1) * self.row_bytes];
        let (codes, tail) = row.split_at(self.code_bytes);
        let out = &mut buf.as_flattened_mut()[..cols.width];
        // Blocks start at multiples of 8 columns, so at whole bytes.
        let codes = &codes[cols.start / Self::PER_BYTE..];
        let mask = ((1u32 << BITS) - 1) as u8;
        let per = Self::PER_BYTE;
        let (whole, rest) = out.split_at_mut(out.len() / per * per);
        // Each code byte holds `per` values, the lowest bits first.
        for (o, &byte) in whole.chunks_exact_mut(per).zip(codes) {
            for (j, v) in o.iter_mut().enumerate() {
                *v = f32::from((byte >> (j as u32 * BITS)) & mask);
            }
        }
        if let Some(&byte) = codes.get(whole.len() / per) {
            for (j, v) in rest.iter_mut().enumerate() {
                *v = f32::from((byte >> (j as u32 * BITS)) & mask);
            }
        }
        let affine = if BITS == 8 {
            (
                f32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]),
                f32::from_le_bytes([tail[4], tail[5], tail[6], tail[7]]),
            )
        } else {
            (
                half::f16::from_le_bytes([tail[0], tail[1]]).to_f32(),
                half::f16::from_le_bytes([tail[2], tail[3]]).to_f32(),
            )
        };
        (buf, Some(affine))
    }

    #[inline(always)]
    fn prefetch_block<const N: usize>(&self, r: usize, cols: Cols<N>) {
        // The block's codes, then the scale and bias at the row's end.
        let at = r * self.row_bytes;
        let first = at + cols.start / Self::PER_BYTE;
        let last = (at + (cols.start + cols.width).div_ceil(Self::PER_BYTE)).max(first + 1);
        prefetch::bytes(self.bytes.get(first..last).unwrap_or(&[]));
        prefetch::bytes(
            self.bytes
                .get(at + self.code_bytes..at + self.row_bytes)
                .unwrap_or(&[]),
        );
    }

    #[inline(always)]
    fn prefetch_row(&self, r: usize) {
        let at = r * self.row_bytes;
        prefetch::bytes(&self.bytes[at..at + self.row_bytes]);
    }
}

/// What every block of every bag reads: the table, the checked ids, the
/// padding row and the prefetch distance.
#[derive(Clone, Copy)]
pub(super) struct Rows<'i, I: Index, T> {
    pub(super) table: T,
    pub(super) dim: usize,
    pub(super) ids: ValidIds<'i, I>,
    pub(super) padding_idx: Option<usize>,
    /// How many positions ahead rows are prefetched.
    pub(super) ahead: usize,
}

/// A column block: `width` columns from `start`, read as `N` vectors. A
/// whole block has `width == N·8`; the last `dim % 8` columns of a row are
/// a block of one vector, zero-padded.
#[derive(Clone, Copy)]
pub(super) struct Cols<const N: usize> {
    pub(super) start: usize,
    pub(super) width: usize,
}

impl<const N: usize> Cols<N> {
    /// The `N·8` columns from `start`.
    #[inline(always)]
    pub(super) fn whole(start: usize) -> Self {
        Cols {
            start,
            width: N * LANES,
        }
    }

    /// Whether the block fills its `N` vectors.
    #[inline(always)]
    fn is_whole(self) -> bool {
        self.width == N * LANES
    }

    /// Writes the block's `N` vectors to its columns of `dst`, a row.
    #[inline(always)]
    pub(super) fn store<V: Lanes>(self, lanes: [V; N], dst: &mut [f32]) {
        let dst = &mut dst[self.start..self.start + self.width];
        if self.is_whole() {
            let (out, _) = dst.as_chunks_mut::<LANES>();
            for (o, v) in out.iter_mut().zip(lanes) {
                v.store(o);
            }
        } else {
            let mut buf = [[0.0f32; LANES]; N];
            for (o, v) in buf.iter_mut().zip(lanes) {
                v.store(o);
            }
            dst.copy_from_slice(&buf.as_flattened()[..self.width]);
        }
    }
}

impl Cols<1> {
    /// The last `width` (< 8) columns of a row, from `start`.
    #[inline(always)]
    pub(super) fn tail(start: usize, width: usize) -> Self {
        debug_assert!(width < LANES);
        Cols { start, width }
    }
}

impl<I: Index, T: BagTable> Rows<'_, I, T> {
    /// Hands `f` columns `cols` of each kept row of `bag`, in order, and
    /// returns how many rows were kept. Before each position it prefetches
    /// the same block of the row `ahead` positions on (from the task's last
    /// position, `limit - 1`, at its end: a repeated hint costs next to
    /// nothing, a branch around it more). Without `padding_idx` every row is
    /// kept and the loop holds no test for it.
    #[inline(always)]
    pub(super) fn blocks<const N: usize, F: Visit<N>>(
        &self,
        bag: Range<usize>,
        limit: usize,
        cols: Cols<N>,
        f: &mut F,
    ) -> usize {
        // `limit` is 0 for a task of bags that hold no id; then no loop below
        // runs and `last` is never read.
        let last = limit.saturating_sub(1);
        let mut buf = [[0.0f32; LANES]; N];
        match self.padding_idx {
            None => {
                for p in bag.clone() {
                    self.prefetch_block(p, last, cols);
                    self.visit(p, self.ids.row(p), cols, &mut buf, f);
                }
                bag.len()
            }
            Some(padding) => {
                let mut kept = 0;
                for p in bag {
                    self.prefetch_block(p, last, cols);
                    let r = self.ids.row(p);
                    if r != padding {
                        self.visit(p, r, cols, &mut buf, f);
                        kept += 1;
                    }
                }
                kept
            }
        }
    }

    /// Prefetches block `cols` of the row `ahead` positions after `p` (at
    /// most position `last`).
    #[inline(always)]
    fn prefetch_block<const N: usize>(&self, p: usize, last: usize, cols: Cols<N>) {
        let r = self.ids.row((p + self.ahead).min(last));
        self.table.prefetch_block::<N>(r, cols);
    }

    /// Hands `f` block `cols` of row `r` (position `p`): straight from the
    /// table when it can, else through `buf`.
    #[inline(always)]
    fn visit<const N: usize, F: Visit<N>>(
        &self,
        p: usize,
        r: usize,
        cols: Cols<N>,
        buf: &mut [[f32; LANES]; N],
        f: &mut F,
    ) {
        let (block, affine) = self.table.block::<N>(r, cols, buf);
        f.visit(p, block, affine);
    }
}

/// A bag's pooling, one column block at a time: what [`each_block`] runs.
pub(super) trait BlockBody {
    /// Pools columns `cols` with lanes `V`, writes them, and returns how many
    /// of the bag's rows were kept.
    fn block<V: Lanes, const N: usize>(&mut self, cols: Cols<N>) -> usize;
}

/// Runs `body` on every column block of a row of `dim` values: blocks of
/// `widest` vectors (16 or 8), then one block each of the smaller sizes that
/// fit (8, 4, 2, 1 vectors), then the last `dim % 8` columns. Returns the
/// kept count of the last block (every block of a bag keeps the same rows).
#[inline(always)]
pub(super) fn each_block<V: Lanes, B: BlockBody>(dim: usize, widest: usize, body: &mut B) -> usize {
    let (mut kept, mut c) = (0, 0);
    if widest >= 16 {
        while c + 16 * LANES <= dim {
            kept = body.block::<V, 16>(Cols::whole(c));
            c += 16 * LANES;
        }
    }
    if widest >= 8 {
        while c + 8 * LANES <= dim {
            kept = body.block::<V, 8>(Cols::whole(c));
            c += 8 * LANES;
        }
    }
    while c + 4 * LANES <= dim {
        kept = body.block::<V, 4>(Cols::whole(c));
        c += 4 * LANES;
    }
    if c + 2 * LANES <= dim {
        kept = body.block::<V, 2>(Cols::whole(c));
        c += 2 * LANES;
    }
    if c + LANES <= dim {
        kept = body.block::<V, 1>(Cols::whole(c));
        c += LANES;
    }
    if c < dim {
        kept = body.block::<V, 1>(Cols::tail(c, dim - c));
    }
    kept
}

/// What a block body does with each kept row of a bag: the sum's and the
/// max's registers. A trait with `#[inline(always)]` methods rather than a
/// closure: a closure is compiled as a function of its own, without the AVX
/// of [`Isa::run`]'s wrapper, and calls each instruction it holds.
pub(super) trait Visit<const N: usize> {
    /// Takes block `block` of the row at position `p`: its values, or, with
    /// `affine = Some((scale, bias))`, its levels `q` (a value being
    /// `fma(q, scale, bias)`).
    fn visit(&mut self, p: usize, block: &[[f32; LANES]; N], affine: Option<(f32, f32)>);
}

/// One task of the forward: the bags from `first_bag` whose rows `out` (and
/// `max_indices`, for max) hold.
struct BagTask<'a, 'i, I: Index, T> {
    rows: Rows<'i, I, T>,
    bags: &'a Bags,
    pooling: &'a Pooling<'a>,
    first_bag: usize,
    out: &'a mut [f32],
    max_indices: &'a mut [i64],
}

impl<I: Index, T: BagTable> Body for BagTask<'_, '_, I, T> {
    type Output = ();

    #[inline(always)]
    fn run<V: Lanes>(self) {
        let BagTask {
            rows,
            bags,
            pooling,
            first_bag,
            out,
            max_indices,
        } = self;
        let dim = rows.dim;
        let count = out.len() / dim;
        let first = bags.starts()[first_bag];
        let limit = bags.starts()[first_bag + count];
        // Warm the first rows: a task starts cold.
        for p in first..limit.min(first + rows.ahead) {
            rows.table.prefetch_row(rows.ids.row(p));
        }
        for (k, dst) in out.chunks_exact_mut(dim).enumerate() {
            let bag = bags.bag(first_bag + k);
            match pooling.mode {
                Mode::Sum | Mode::Mean => {
                    let weights = pooling.per_sample_weights;
                    let mean = pooling.mode == Mode::Mean;
                    sum::pool::<V, I, T>(&rows, bag, limit, weights, mean, dst);
                }
                Mode::Max => {
                    let args = &mut max_indices[k * dim..(k + 1) * dim];
                    max::pool::<V, I, T>(&rows, bag, limit, dst, args);
                }
            }
        }
    }
}
