//! Rows of every table format as `f32` lanes: the one abstraction the
//! lookup and the bags are written over, so each of their bodies exists
//! once for every format and every instruction set.
//!
//! | type | a row | a vector's columns (8 or 16) become |
//! | --- | --- | --- |
//! | [`PlainRows`] of `f32` | `dim` `f32`s | a load |
//! | [`PlainRows`] of `f16` or `bf16` | `dim` halves | [`Lanes::from_f16`] / [`Lanes::from_bf16`] |
//! | [`Packed`] | FBGEMM's row-wise codes, then a scale and a bias | levels by [`Lanes::from_u8`] (8 bits), [`Lanes::from_nibble_pairs`] (4 bits: two vectors a load, dealt out by column parity, put back by [`RowFormat::in_column_order`]) or [`Lanes::from_packed`] (2 bits); the row's `(scale, bias)` from [`RowFormat::affine`] |
//!
//! Every decode is exact (a byte, a level, a half is an `f32` exactly), so
//! the format adds no rounding of its own: a packed value is
//! `fma(q, scale, bias)` ([`value`]), as PyTorch reads it back, and the
//! sums apply FBGEMM's rule to the levels directly.
//!
//! Widths are counted in the lane type's vectors, `V::WIDTH` columns each
//! (8 with AVX, 16 with AVX-512): a column block of `N` vectors is
//! `N·V::WIDTH` columns.
//!
//! A block is handed over a vector at a time ([`RowFormat::decode`] into a
//! [`Sink`]), not returned whole: a sum with AVX keeps sixteen accumulators
//! in the sixteen registers (24 of AVX-512's 32), and a whole decoded block
//! beside them would not fit: it would spill to the stack.
//!
//! No closure touches a lane here (no `array::from_fn`, no `map`): a
//! closure is compiled apart from the wrapper that enables AVX, and would
//! call each instruction out of line.
//!
//! A row is read as column blocks of `N` vectors ([`Cols`], cut by
//! [`each_block`](super::blocks::each_block): `kernels/blocks.rs`).

use crate::formats::{Data, PackedTable, RowWise, TableRef};
use crate::kernels::blocks::Cols;
use crate::memory::LINE_BYTES as LINE;
use crate::simd::prefetch::{self, BagHints, L2};
use crate::simd::{Lanes, MAX_LANES};

/// A table whose rows read as `f32` lanes, a column block at a time: an
/// `f32` table, a half table, or a packed one.
pub(crate) trait RowFormat: Copy + Sync {
    /// Whether a row is codes with a scale and a bias (decoded with
    /// arithmetic), rather than values (`f32`, or halves widened).
    const PACKED: bool;
    /// Where a sum starts: `-0.0` for `f32` and half rows (the exact
    /// identity, so the first row comes through to the bit, as in the
    /// reference's product), `+0.0` for packed rows (FBGEMM's start, which
    /// PyTorch's bits need).
    const SUM_FROM: f32 = if Self::PACKED { 0.0 } else { -0.0 };
    /// Whether a row is `f16` or `bf16` values.
    const HALF: bool = false;
    /// Values per row.
    fn dim(&self) -> usize;
    /// Bytes per row.
    fn row_bytes(&self) -> usize;
    /// Bytes of the whole table (what decides the split).
    fn bytes(&self) -> usize;
    /// The storage a row of `dim` values takes, in the units of
    /// [`RowSpan`]: `dim` values, or a packed row's bytes. A constant where
    /// `dim` is one, which is how a loop over rows of one column block
    /// (`Rows::blocks` in the bags) reads them with a constant stride.
    fn row_len(dim: usize) -> usize;
    /// Where row `r` lies in the table's storage. `r` is a row of the
    /// table (the ids were checked).
    #[inline(always)]
    fn row(&self, r: usize) -> RowSpan {
        RowSpan::of(r, Self::row_len(self.dim()))
    }
    /// The row's scale and bias for a packed table, `None` for the others
    /// (whose lanes are values).
    fn affine<V: Lanes>(&self, row: RowSpan) -> Option<(f32, f32)>;
    /// Hands `sink` the `N` vectors of block `cols` of `row`, in order: its
    /// values, or for a packed table its levels. One vector at a time, so a
    /// sink that adds each to an accumulator needs no registers for the
    /// block beyond the one vector.
    fn decode<V: Lanes, const N: usize, S: Sink<V>>(
        &self,
        row: RowSpan,
        cols: Cols<N>,
        sink: &mut S,
    );
    /// Puts vectors that [`decode`](Self::decode) handed a sink as pairs
    /// ([`Sink::take_pair`]) back in column order, for a whole block of `N`
    /// vectors: nothing, but for 4-bit rows.
    #[inline(always)]
    fn in_column_order<V: Lanes, const N: usize>(&self, _lanes: &mut [V; N]) {}
    /// How a bag hints the rows it reads ahead, asked once a call and
    /// passed on to [`prefetch_block`](Self::prefetch_block).
    fn bag_hints(&self) -> BagHints;
    /// Hints for block `cols` of `row`, `N` vectors of `V`, as `hints`
    /// says (where [`BagHints::Line`], the block is the whole row, one
    /// line).
    fn prefetch_block<V: Lanes, const N: usize>(
        &self,
        row: RowSpan,
        cols: Cols<N>,
        hints: BagHints,
    );
    /// Hints for all of `row`.
    fn prefetch_row(&self, row: RowSpan);
}

/// Where a row lies in its table's storage: `len` units from `start`, in
/// values (`f32` and half tables) or bytes (packed tables). Rows are laid
/// end to end, so `len` is also the stride from one row to the next. The
/// formats read every offset of a row from here rather than from the
/// table's fields, so that where `len` is a constant of the code (a row of
/// one column block), so is every offset.
#[derive(Clone, Copy)]
pub(crate) struct RowSpan {
    start: usize,
    len: usize,
}

impl RowSpan {
    /// Row `r` of rows of `len` units.
    #[inline(always)]
    pub(crate) fn of(r: usize, len: usize) -> Self {
        RowSpan {
            start: r * len,
            len,
        }
    }
}

/// What [`RowFormat::decode`] hands each vector of a block to.
pub(crate) trait Sink<V: Lanes> {
    /// Takes vector `j` of the block.
    fn take(&mut self, j: usize, lanes: V);
    /// Takes vectors `j` and `j + 1` dealt out by column parity (see
    /// [`Lanes::from_nibble_pairs`]): 4-bit rows decode two vectors at a
    /// time so. By default the pair is taken as it is, `even` as vector `j`:
    /// right for a sink whose lanes never meet (sums, maxima), whose owner
    /// puts its vectors back in column order with
    /// [`RowFormat::in_column_order`] before it stores them. A sink that
    /// writes each vector out (the lookup) interleaves first.
    #[inline(always)]
    fn take_pair(&mut self, j: usize, even: V, odd: V) {
        self.take(j, even);
        self.take(j + 1, odd);
    }
}

/// A row's scale and bias as lanes, to read its levels back as values.
#[derive(Clone, Copy)]
pub(crate) struct Affine<V> {
    pub(crate) scale: V,
    pub(crate) bias: V,
}

impl<V: Lanes> Affine<V> {
    /// [`RowFormat::affine`]'s answer as lanes.
    #[inline(always)]
    pub(crate) fn of(affine: Option<(f32, f32)>) -> Option<Self> {
        match affine {
            None => None,
            Some((scale, bias)) => Some(Affine {
                scale: V::splat(scale),
                bias: V::splat(bias),
            }),
        }
    }
}

/// The values of decoded lanes: as they are, or levels read back as
/// `fma(q, scale, bias)`.
#[inline(always)]
pub(crate) fn value<V: Lanes>(lanes: V, affine: Option<Affine<V>>) -> V {
    match affine {
        None => lanes,
        Some(a) => lanes.mul_add(a.scale, a.bias),
    }
}

/// A value a table holds as it is, a vector's worth of which become lanes:
/// `f32`, `f16` or `bf16`.
pub(crate) trait Element: Copy + Default + Sync {
    /// The first `V::WIDTH` of `values` as lanes, exactly.
    fn lanes<V: Lanes>(values: &[Self]) -> V;
}

impl Element for f32 {
    #[inline(always)]
    fn lanes<V: Lanes>(values: &[f32]) -> V {
        V::load(values)
    }
}

impl Element for half::f16 {
    #[inline(always)]
    fn lanes<V: Lanes>(values: &[half::f16]) -> V {
        V::from_f16(bytemuck::cast_slice(values))
    }
}

impl Element for half::bf16 {
    #[inline(always)]
    fn lanes<V: Lanes>(values: &[half::bf16]) -> V {
        V::from_bf16(bytemuck::cast_slice(values))
    }
}

/// A table of `dim` values a row, each an `f32`, `f16` or `bf16`.
#[derive(Clone, Copy)]
pub(crate) struct PlainRows<'a, E> {
    pub(crate) table: &'a [E],
    pub(crate) dim: usize,
}

/// An `f32` table: what the `f32` kernels read.
pub(crate) type F32Rows<'a> = PlainRows<'a, f32>;

impl<E: Element> PlainRows<'_, E> {
    /// Whether every row is one whole cache line: 16 `f32`s or 32 halves,
    /// the table starting a line.
    fn rows_are_lines(&self) -> bool {
        self.row_bytes() == LINE && (self.table.as_ptr() as usize).is_multiple_of(LINE)
    }
}

impl<E: Element> RowFormat for PlainRows<'_, E> {
    const PACKED: bool = false;
    const HALF: bool = core::mem::size_of::<E>() == 2;

    fn dim(&self) -> usize {
        self.dim
    }

    fn row_bytes(&self) -> usize {
        self.dim * core::mem::size_of::<E>()
    }

    fn bytes(&self) -> usize {
        core::mem::size_of_val(self.table)
    }

    #[inline(always)]
    fn row_len(dim: usize) -> usize {
        dim
    }

    #[inline(always)]
    fn affine<V: Lanes>(&self, _row: RowSpan) -> Option<(f32, f32)> {
        None
    }

    #[inline(always)]
    fn decode<V: Lanes, const N: usize, S: Sink<V>>(
        &self,
        row: RowSpan,
        cols: Cols<N>,
        sink: &mut S,
    ) {
        let at = row.start + cols.start;
        if cols.is_whole() {
            let block = &self.table[at..at + N * V::WIDTH];
            for (j, x) in block.chunks_exact(V::WIDTH).enumerate() {
                sink.take(j, E::lanes(x));
            }
        } else {
            let mut buf = [E::default(); MAX_LANES];
            buf[..cols.width].copy_from_slice(&self.table[at..at + cols.width]);
            sink.take(0, E::lanes(&buf));
        }
    }

    /// One hint a row where each is a whole line ([`Self::rows_are_lines`]),
    /// else as [`BagHints::for_rows`] says: a hint per line of the block and
    /// one at its last byte. Wider rows keep the last byte's hint even where
    /// they start lines: without it `f32` rows were no faster and `f16` rows
    /// slower (docs/design.md, "Bags").
    fn bag_hints(&self) -> BagHints {
        if self.rows_are_lines() {
            BagHints::Line
        } else {
            BagHints::for_rows(self.row_bytes())
        }
    }

    #[inline(always)]
    fn prefetch_block<V: Lanes, const N: usize>(
        &self,
        row: RowSpan,
        cols: Cols<N>,
        hints: BagHints,
    ) {
        let size = core::mem::size_of::<E>();
        let at = (row.start + cols.start) * size;
        let base: *const u8 = self.table.as_ptr().cast();
        let len = N * V::WIDTH * size;
        debug_assert!(
            hints != BagHints::Line
                || (cols.start == 0 && len == LINE && (base as usize + at).is_multiple_of(LINE)),
            "one hint for a block of {len} bytes at {at} (column {}) past {base:?}",
            cols.start
        );
        prefetch::bag_block(base, at, len, hints);
    }

    #[inline(always)]
    fn prefetch_row(&self, row: RowSpan) {
        let size = core::mem::size_of::<E>();
        let at = row.start * size;
        prefetch::span::<L2>(self.table.as_ptr().cast(), at, at + row.len * size);
    }
}

/// A row-wise quantized table of `BITS` bits a value (8, 4 or 2), its
/// layout known at compile time so that a block decodes with constant
/// shifts (see `formats/rowwise.rs` for the layout).
#[derive(Clone, Copy)]
pub(crate) struct Packed<'a, const BITS: u32> {
    bytes: &'a [u8],
    dim: usize,
}

impl<'a, const BITS: u32> Packed<'a, BITS> {
    /// Values per byte.
    const PER_BYTE: usize = 8 / BITS as usize;
    /// Bytes of the scale and bias after a row's codes: two `f32`s after
    /// 8-bit codes, two `f16`s after 4- and 2-bit ones.
    const AFFINE_BYTES: usize = if BITS == 8 { 8 } else { 4 };

    /// The table's bytes, laid out for `BITS` (the caller matched the
    /// table's format to `BITS`).
    pub(crate) fn new(table: &PackedTable<'a>) -> Self {
        debug_assert_eq!(table.format().bits(), BITS);
        debug_assert_eq!(table.row_bytes(), Self::row_len(table.dim()));
        Packed {
            bytes: table.bytes(),
            dim: table.dim(),
        }
    }

    /// Code bytes per vector of `V`.
    #[inline(always)]
    fn vector_bytes<V: Lanes>() -> usize {
        V::WIDTH / Self::PER_BYTE
    }

    /// The levels of a vector of `V` from `codes`, its code bytes (fewer at
    /// a row's end: the missing ones read as zeros).
    #[inline(always)]
    fn levels<V: Lanes>(codes: &[u8]) -> V {
        if BITS == 8 {
            let mut bytes = [0u8; MAX_LANES];
            let n = codes.len().min(V::WIDTH);
            bytes[..n].copy_from_slice(&codes[..n]);
            V::from_u8(&bytes)
        } else {
            let mut word = [0u8; 8];
            let n = codes.len().min(Self::vector_bytes::<V>());
            word[..n].copy_from_slice(&codes[..n]);
            V::from_packed::<BITS>(u64::from_le_bytes(word))
        }
    }

    /// A row's scale and bias from the bytes after its codes: `f32`s
    /// after 8-bit codes, `f16`s after 4- and 2-bit ones.
    #[inline(always)]
    fn scale_bias<V: Lanes>(tail: &[u8]) -> (f32, f32) {
        if BITS == 8 {
            let (s, b) = (&tail[..4], &tail[4..8]);
            (
                f32::from_le_bytes([s[0], s[1], s[2], s[3]]),
                f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            )
        } else {
            let (s, b) = (&tail[..2], &tail[2..4]);
            // Both through the lanes' conversion (F16C where the CPU has
            // it): `f16::to_f32` would ask the CPU for F16C twice a row.
            let halves = [
                u16::from_le_bytes([s[0], s[1]]),
                u16::from_le_bytes([b[0], b[1]]),
            ];
            let mut both = [0u16; MAX_LANES];
            both[..2].copy_from_slice(&halves);
            let mut values = [0.0; MAX_LANES];
            V::from_f16(&both).store(&mut values);
            (values[0], values[1])
        }
    }
}

impl<const BITS: u32> RowFormat for Packed<'_, BITS> {
    const PACKED: bool = true;

    fn dim(&self) -> usize {
        self.dim
    }

    fn row_bytes(&self) -> usize {
        Self::row_len(self.dim)
    }

    fn bytes(&self) -> usize {
        self.bytes.len()
    }

    /// The codes, then the scale and the bias.
    #[inline(always)]
    fn row_len(dim: usize) -> usize {
        dim.div_ceil(Self::PER_BYTE) + Self::AFFINE_BYTES
    }

    #[inline(always)]
    fn affine<V: Lanes>(&self, row: RowSpan) -> Option<(f32, f32)> {
        let end = row.start + row.len;
        Some(Self::scale_bias::<V>(
            &self.bytes[end - Self::AFFINE_BYTES..end],
        ))
    }

    #[inline(always)]
    fn decode<V: Lanes, const N: usize, S: Sink<V>>(
        &self,
        row: RowSpan,
        cols: Cols<N>,
        sink: &mut S,
    ) {
        let codes = &self.bytes[row.start..row.start + row.len - Self::AFFINE_BYTES];
        // Blocks start at multiples of 8 columns, so at whole bytes.
        let first = cols.start / Self::PER_BYTE;
        if cols.is_whole() {
            // One fixed-size load per vector: `WIDTH`, `WIDTH / 2` or
            // `WIDTH / 4` bytes of codes.
            let vector = Self::vector_bytes::<V>();
            let block = &codes[first..first + N * vector];
            match BITS {
                8 => {
                    for (j, bytes) in block.chunks_exact(vector).enumerate() {
                        sink.take(j, V::from_u8(bytes));
                    }
                }
                4 => {
                    // Two vectors per `WIDTH` bytes, dealt out by column
                    // parity (`in_column_order` undoes it once per block);
                    // an odd last vector from its `WIDTH / 2` bytes.
                    let pairs = block.chunks_exact(2 * vector);
                    let rest = pairs.remainder();
                    for (k, bytes) in pairs.enumerate() {
                        let (even, odd) = V::from_nibble_pairs(bytes);
                        sink.take_pair(2 * k, even, odd);
                    }
                    if !rest.is_empty() {
                        sink.take(N - 1, Self::levels(rest));
                    }
                }
                _ => {
                    for (j, bytes) in block.chunks_exact(vector).enumerate() {
                        sink.take(j, Self::levels(bytes));
                    }
                }
            }
        } else {
            sink.take(0, Self::levels(&codes[first..]));
        }
    }

    #[inline(always)]
    fn in_column_order<V: Lanes, const N: usize>(&self, lanes: &mut [V; N]) {
        if BITS == 4 {
            for k in 0..N / 2 {
                let (first, second) = V::interleave(lanes[2 * k], lanes[2 * k + 1]);
                lanes[2 * k] = first;
                lanes[2 * k + 1] = second;
            }
        }
    }

    /// Whole blocks, as [`BagHints::for_rows`] says.
    fn bag_hints(&self) -> BagHints {
        BagHints::for_rows(self.row_bytes())
    }

    #[inline(always)]
    fn prefetch_block<V: Lanes, const N: usize>(
        &self,
        row: RowSpan,
        cols: Cols<N>,
        hints: BagHints,
    ) {
        // A row of a line or less: a hint at each end, two where its codes
        // and scale and bias took four. Wider: the block's codes (a whole
        // block's worth: a hint past the row is only a wasted fetch), then
        // the scale and bias. Never `Line` (never a line's bare values).
        let (base, end) = (self.bytes.as_ptr(), row.start + row.len);
        if row.len <= crate::memory::LINE_BYTES {
            prefetch::bag_block(base, row.start, row.len, hints);
        } else {
            let codes = row.start + cols.start / Self::PER_BYTE;
            prefetch::bag_block(base, codes, N * Self::vector_bytes::<V>(), hints);
            prefetch::bag_block(base, end - Self::AFFINE_BYTES, Self::AFFINE_BYTES, hints);
        }
    }

    #[inline(always)]
    fn prefetch_row(&self, row: RowSpan) {
        let at = row.start;
        prefetch::span::<L2>(self.bytes.as_ptr(), at, at + row.len);
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
        Data::F16(table) => op.on(PlainRows { table, dim }),
        Data::Bf16(table) => op.on(PlainRows { table, dim }),
        Data::Packed(packed) => match packed.format() {
            RowWise::Int8 => op.on(Packed::<8>::new(&packed)),
            RowWise::Int4 => op.on(Packed::<4>::new(&packed)),
            RowWise::Int2 => op.on(Packed::<2>::new(&packed)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::{Packed, PlainRows, RowFormat};
    use crate::memory::AlignedTable;
    use crate::simd::prefetch::{BagHints, roomy_l1};

    /// A bag's hints follow the row: one for a row of one line, into L1 up
    /// to a line, and past it as [`BagHints::rule`] says.
    #[test]
    fn bag_hints_follow_the_row_and_the_cache() {
        let table = AlignedTable::zeroed(64 * 64).unwrap();
        let plain = |from: usize, dim: usize| {
            PlainRows {
                table: &table[from..from + 16 * dim],
                dim,
            }
            .bag_hints()
        };
        let wide = BagHints::rule(65, roomy_l1());
        let whole = wide;
        assert_eq!(plain(0, 16), BagHints::Line);
        assert_eq!(plain(1, 16), BagHints::L1, "a line's bytes, not on a line");
        assert_eq!(plain(0, 15), BagHints::L1);
        assert_eq!(plain(0, 17), wide);
        assert_eq!(plain(0, 128), wide);
        let (table, dim) = (&vec![half::f16::ZERO; 16 * 64][..], 64);
        let halves = BagHints::rule(128, roomy_l1());
        assert_eq!(PlainRows { table, dim }.bag_hints(), halves);
        let bytes = vec![0u8; 64 * 1024];
        let packed = |dim: usize| Packed::<8> { bytes: &bytes, dim }.bag_hints();
        assert_eq!(packed(56), BagHints::L1, "56 codes and 8 bytes: one line");
        assert_eq!(packed(57), whole);
        assert_eq!(packed(384), whole);
        let int4 = Packed::<4> {
            bytes: &bytes,
            dim: 384,
        };
        assert_eq!(int4.bag_hints(), whole);
    }

    /// A bag hints a row of one line once only where the rows really are
    /// lines: 64 bytes each, from a line-aligned start.
    #[test]
    fn rows_are_lines_only_when_each_row_is_a_whole_line() {
        let table = AlignedTable::zeroed(64 * 16).unwrap();
        let rows = |from: usize, dim: usize| PlainRows {
            table: &table[from..from + 32 * dim],
            dim,
        };
        assert!(rows(0, 16).rows_are_lines());
        assert!(!rows(1, 16).rows_are_lines(), "table not on a line");
        assert!(!rows(4, 16).rows_are_lines(), "16 bytes into a line");
        assert!(!rows(0, 15).rows_are_lines(), "rows of 60 bytes");
        assert!(!rows(0, 32).rows_are_lines(), "rows of two lines");
        let halves = vec![half::f16::ZERO; 64 * 40];
        let offset = halves.as_ptr().align_offset(64);
        let h = PlainRows {
            table: &halves[offset..offset + 32 * 32],
            dim: 32,
        };
        assert!(h.rows_are_lines(), "32 halves on a line");
        let h = PlainRows {
            table: &halves[offset + 1..offset + 1 + 32 * 32],
            dim: 32,
        };
        assert!(!h.rows_are_lines(), "32 halves, 2 bytes into a line");
    }
}
