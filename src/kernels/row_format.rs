//! Rows of every table format as `f32` lanes: the one abstraction the
//! lookup and the bags are written over, so each of their bodies exists
//! once for every format and every instruction set.
//!
//! | type | a row | a block of 8 columns becomes |
//! | --- | --- | --- |
//! | [`F32Rows`] | `dim` `f32`s | a load |
//! | [`HalfRows`] | `dim` `f16` or `bf16` bits | [`Lanes::from_f16`] / [`Lanes::from_bf16`] |
//! | [`Packed`] | FBGEMM's row-wise codes, then a scale and a bias | levels by [`Lanes::from_u8`] / [`Lanes::from_packed`], and the row's `(scale, bias)` |
//!
//! Every decode is exact (a byte, a level, a half is an `f32` exactly), so
//! the format adds no rounding of its own: a packed value is
//! `fma(q, scale, bias)` ([`values`]), as PyTorch reads it back, and the
//! sums apply FBGEMM's rule to the levels directly.
//!
//! No closure touches a lane here (no `array::from_fn`, no `map`): a
//! closure is compiled apart from the wrapper that enables AVX, and would
//! call each instruction out of line.
//!
//! A row is read as column blocks of `N` vectors ([`Cols`]): the ladder of
//! [`each_block`] (16 or 8 vectors, then 8, 4, 2, 1, then the last `dim % 8`
//! columns zero-padded into one vector).

use crate::formats::{Data, PackedTable, RowWise, TableRef};
use crate::simd::{prefetch, Lanes, LANES};

/// A table whose rows read as `f32` lanes, a column block at a time: an
/// `f32` table, a half table, or a packed one.
pub(crate) trait RowFormat: Copy + Sync {
    /// Where a sum starts: `-0.0` for `f32` and half rows (the exact
    /// identity, so the first row comes through to the bit, as in the
    /// reference's product), `+0.0` for packed rows (FBGEMM's start, which
    /// PyTorch's bits need).
    const SUM_FROM: f32;
    /// Values per row.
    fn dim(&self) -> usize;
    /// Bytes per row.
    fn row_bytes(&self) -> usize;
    /// Bytes of the whole table (what decides the split).
    fn bytes(&self) -> usize;
    /// Block `cols` of row `r` as lanes: its values, or for a packed table
    /// its levels and `Some((scale, bias))`. `r` is a row of the table (the
    /// ids were checked).
    fn block<V: Lanes, const N: usize>(
        &self,
        r: usize,
        cols: Cols<N>,
    ) -> ([V; N], Option<(f32, f32)>);
    /// Hints for block `cols` of row `r`.
    fn prefetch_block<const N: usize>(&self, r: usize, cols: Cols<N>);
    /// Hints for all of row `r`.
    fn prefetch_row(&self, r: usize);
}

/// The values of a block from [`RowFormat::block`]: as they are, or for a
/// packed row its levels read back as `fma(q, scale, bias)`.
#[inline(always)]
pub(crate) fn values<V: Lanes, const N: usize>(
    block: [V; N],
    affine: Option<(f32, f32)>,
) -> [V; N] {
    match affine {
        None => block,
        Some((scale, bias)) => {
            let (s, b) = (V::splat(scale), V::splat(bias));
            let mut out = block;
            for v in &mut out {
                *v = v.mul_add(s, b);
            }
            out
        }
    }
}

/// A column block: `width` columns from `start`, read as `N` vectors. A
/// whole block has `width == N·8`; the last `dim % 8` columns of a row are
/// a block of one vector, zero-padded.
#[derive(Clone, Copy)]
pub(crate) struct Cols<const N: usize> {
    pub(crate) start: usize,
    pub(crate) width: usize,
}

impl<const N: usize> Cols<N> {
    /// The `N·8` columns from `start`.
    #[inline(always)]
    pub(crate) fn whole(start: usize) -> Self {
        Cols {
            start,
            width: N * LANES,
        }
    }

    /// Whether the block fills its `N` vectors.
    #[inline(always)]
    pub(crate) fn is_whole(self) -> bool {
        self.width == N * LANES
    }

    /// Writes the block's `N` vectors to its columns of `dst`, a row.
    #[inline(always)]
    pub(crate) fn store<V: Lanes>(self, lanes: [V; N], dst: &mut [f32]) {
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
    pub(crate) fn tail(start: usize, width: usize) -> Self {
        debug_assert!(width < LANES);
        Cols { start, width }
    }
}

/// What [`each_block`] runs on each column block of a row.
pub(crate) trait BlockBody {
    /// Works on columns `cols` with lanes `V`; returns a count the caller
    /// keeps (the bags: how many rows were kept).
    fn block<V: Lanes, const N: usize>(&mut self, cols: Cols<N>) -> usize;
}

/// Runs `body` on every column block of a row of `dim` values: blocks of
/// `widest` vectors (16 or 8), then one block each of the smaller sizes that
/// fit (8, 4, 2, 1 vectors), then the last `dim % 8` columns. Returns the
/// count of the last block.
#[inline(always)]
pub(crate) fn each_block<V: Lanes, B: BlockBody>(dim: usize, widest: usize, body: &mut B) -> usize {
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

/// An `f32` table of rows of `dim`.
#[derive(Clone, Copy)]
pub(crate) struct F32Rows<'a> {
    pub(crate) table: &'a [f32],
    pub(crate) dim: usize,
}

impl RowFormat for F32Rows<'_> {
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
    fn block<V: Lanes, const N: usize>(
        &self,
        r: usize,
        cols: Cols<N>,
    ) -> ([V; N], Option<(f32, f32)>) {
        let at = r * self.dim + cols.start;
        if cols.is_whole() {
            let (block, _) = self.table[at..at + N * LANES].as_chunks::<LANES>();
            let mut lanes = [V::splat(0.0); N];
            for (v, x) in lanes.iter_mut().zip(block) {
                *v = V::load(x);
            }
            (lanes, None)
        } else {
            let mut buf = [0.0f32; LANES];
            buf[..cols.width].copy_from_slice(&self.table[at..at + cols.width]);
            ([V::load(&buf); N], None)
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

/// A half-precision table: the bits of `dim` `bf16`s a row when `BF16`,
/// else of `dim` `f16`s.
#[derive(Clone, Copy)]
pub(crate) struct HalfRows<'a, const BF16: bool> {
    pub(crate) table: &'a [u16],
    pub(crate) dim: usize,
}

impl<const BF16: bool> HalfRows<'_, BF16> {
    /// Eight halves as lanes.
    #[inline(always)]
    fn widen<V: Lanes>(halves: [u16; LANES]) -> V {
        if BF16 {
            V::from_bf16(halves)
        } else {
            V::from_f16(halves)
        }
    }
}

impl<const BF16: bool> RowFormat for HalfRows<'_, BF16> {
    const SUM_FROM: f32 = -0.0;

    fn dim(&self) -> usize {
        self.dim
    }

    fn row_bytes(&self) -> usize {
        self.dim * 2
    }

    fn bytes(&self) -> usize {
        core::mem::size_of_val(self.table)
    }

    #[inline(always)]
    fn block<V: Lanes, const N: usize>(
        &self,
        r: usize,
        cols: Cols<N>,
    ) -> ([V; N], Option<(f32, f32)>) {
        let at = r * self.dim + cols.start;
        if cols.is_whole() {
            let (block, _) = self.table[at..at + N * LANES].as_chunks::<LANES>();
            let mut lanes = [V::splat(0.0); N];
            for (v, &x) in lanes.iter_mut().zip(block) {
                *v = Self::widen(x);
            }
            (lanes, None)
        } else {
            let mut buf = [0u16; LANES];
            buf[..cols.width].copy_from_slice(&self.table[at..at + cols.width]);
            ([Self::widen(buf); N], None)
        }
    }

    #[inline(always)]
    fn prefetch_block<const N: usize>(&self, r: usize, cols: Cols<N>) {
        let at = (r * self.dim + cols.start) * 2;
        prefetch::span(self.table.as_ptr().cast(), at, at + cols.width * 2);
    }

    #[inline(always)]
    fn prefetch_row(&self, r: usize) {
        let at = r * self.dim * 2;
        prefetch::span(self.table.as_ptr().cast(), at, at + self.dim * 2);
    }
}

/// A row-wise quantized table of `BITS` bits a value (8, 4 or 2), its
/// layout known at compile time so that a block decodes with constant
/// shifts (see `formats/rowwise.rs` for the layout).
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
    /// Code bytes per vector of eight values.
    const VECTOR_BYTES: usize = LANES / Self::PER_BYTE;

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

    /// The levels of eight values from `codes` (`VECTOR_BYTES` bytes, or
    /// fewer at a row's end, the missing ones read as zeros).
    #[inline(always)]
    fn levels<V: Lanes>(codes: &[u8]) -> V {
        if BITS == 8 {
            let mut bytes = [0u8; LANES];
            let n = codes.len().min(LANES);
            bytes[..n].copy_from_slice(&codes[..n]);
            V::from_u8(bytes)
        } else {
            let mut word = [0u8; 4];
            let n = codes.len().min(Self::VECTOR_BYTES);
            word[..n].copy_from_slice(&codes[..n]);
            V::from_packed::<BITS>(u32::from_le_bytes(word))
        }
    }

    /// Row `r`'s scale and bias: `f32`s after 8-bit codes, `f16`s after
    /// 4- and 2-bit ones.
    #[inline(always)]
    fn affine(tail: &[u8]) -> (f32, f32) {
        if BITS == 8 {
            let (s, b) = (&tail[..4], &tail[4..8]);
            (
                f32::from_le_bytes([s[0], s[1], s[2], s[3]]),
                f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            )
        } else {
            let (s, b) = (&tail[..2], &tail[2..4]);
            (
                half::f16::from_le_bytes([s[0], s[1]]).to_f32(),
                half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
            )
        }
    }
}

impl<const BITS: u32> RowFormat for Packed<'_, BITS> {
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
    fn block<V: Lanes, const N: usize>(
        &self,
        r: usize,
        cols: Cols<N>,
    ) -> ([V; N], Option<(f32, f32)>) {
        let row = &self.bytes[r * self.row_bytes..(r + 1) * self.row_bytes];
        let (codes, tail) = row.split_at(self.code_bytes);
        // Blocks start at multiples of 8 columns, so at whole bytes.
        let first = cols.start / Self::PER_BYTE;
        let lanes = if cols.is_whole() {
            let block = &codes[first..first + N * Self::VECTOR_BYTES];
            let mut lanes = [V::splat(0.0); N];
            for (v, x) in lanes.iter_mut().zip(block.chunks_exact(Self::VECTOR_BYTES)) {
                *v = Self::levels(x);
            }
            lanes
        } else {
            [Self::levels(&codes[first..]); N]
        };
        (lanes, Some(Self::affine(tail)))
    }

    #[inline(always)]
    fn prefetch_block<const N: usize>(&self, r: usize, cols: Cols<N>) {
        // The block's codes, then the scale and bias at the row's end.
        let at = r * self.row_bytes;
        let first = at + cols.start / Self::PER_BYTE;
        let end = at + (cols.start + cols.width).div_ceil(Self::PER_BYTE);
        let base = self.bytes.as_ptr();
        prefetch::span(base, first, end);
        prefetch::span(base, at + self.code_bytes, at + self.row_bytes);
    }

    #[inline(always)]
    fn prefetch_row(&self, r: usize) {
        let at = r * self.row_bytes;
        prefetch::span(self.bytes.as_ptr(), at, at + self.row_bytes);
    }
}

/// An operation generic over the row format: what [`dispatch`] calls with
/// the concrete rows of a [`TableRef`].
pub(crate) trait OnRows {
    /// What the operation returns.
    type Output;
    /// Runs the operation on `rows`.
    fn on<T: RowFormat>(self, rows: T) -> Self::Output;
}

/// Runs `op` on `table`'s rows as the [`RowFormat`] of its format: the one
/// place a format becomes a type.
pub(crate) fn dispatch<O: OnRows>(table: &TableRef<'_>, op: O) -> O::Output {
    let dim = table.dim();
    match table.data() {
        Data::F32(table) => op.on(F32Rows { table, dim }),
        Data::F16(halves) => op.on(HalfRows::<false> {
            table: bytemuck::cast_slice(halves),
            dim,
        }),
        Data::Bf16(halves) => op.on(HalfRows::<true> {
            table: bytemuck::cast_slice(halves),
            dim,
        }),
        Data::Packed(packed) => match packed.format() {
            RowWise::Int8 => op.on(Packed::<8>::new(&packed)),
            RowWise::Int4 => op.on(Packed::<4>::new(&packed)),
            RowWise::Int2 => op.on(Packed::<2>::new(&packed)),
        },
    }
}
