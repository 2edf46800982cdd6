//! Row-wise quantized tables: packing an `f32` table (`prepack`) and
//! reading it back (`dequantize`), with the rules of PyTorch's CPU packers
//! (FBGEMM's), so that a table packed here has PyTorch's bytes.
//!
//! ```text
//! 8-bit, per row x[0..dim]:
//!     min, max  = the row's smallest and largest value
//!     scale     = (max - min) / 255            bias = min        (f32 each)
//!     q[c]      = round_half_even((x[c] - min) * (255 / (max - min + 1e-8)))
//! 4-bit and 2-bit (L = 15 or 3):
//!     bias      = f16(min), and min = f32(bias) from here on
//!     scale     = f32(f16((max - min) / L)), or 1 when max == min
//!                 (and 1 when that rounds to 0, or its inverse is infinite)
//!     q[c]      = clamp(round_half_even((x[c] - min) * (1 / scale)), 0, L)
//! a value reads back as fma(q, scale, bias)     (one rounding)
//! ```
//!
//! * **Ties to even.** `round_half_even` is C's `lrintf` in the default
//!   rounding mode: a value exactly between two levels goes to the even one.
//! * **Smallest and largest** are found as FBGEMM's AVX2 packer finds them,
//!   which decides the sign of a zero minimum (and so the bias's bits):
//!   eight lanes, from `f32::MAX` (`-f32::MAX` for the largest), each whole
//!   block of eight columns updating lane `j` with `min(lane, x)` where an
//!   equal new value replaces the lane; then the lanes in order, then the
//!   last `dim % 8` columns, each replacing only when strictly smaller
//!   (larger).
//! * **Readback** is one fused multiply-add, `fma(q, scale, bias)`, as
//!   PyTorch's unpack computes it (for 4 and 2 bits `q · scale` is exact, so
//!   the fusion only matters at 8 bits).
//! * **A constant row** (`max == min`) packs every value as level 0: with
//!   8 bits the scale is 0 and the bias the value; with 4 and 2 the scale
//!   is 1 (unless the `f16` bias moved the minimum, when the levels make up
//!   the difference). 4-bit and 2-bit rows of any width pack here; PyTorch's
//!   packers want widths that are multiples of 2 and 4.
//! * **What PyTorch packs into garbage is an error here.** A row holding an
//!   infinity or a NaN has no meaningful scale
//!   ([`EmbeddingError::NotFinite`]); neither does a row whose range
//!   `max - min` overflows an `f32`, or (4 and 2 bits) whose minimum or
//!   scale overflows an `f16` ([`EmbeddingError::RangeOverflow`]).
//! * **Threads.** Rows are packed independently, in tasks of whole rows,
//!   so the bytes cannot depend on the thread count.

use crate::error::{EmbeddingError, Operand};
use crate::parallel::Parallelism;
use crate::shape::{check_len, rows_len, table_rows};
use half::f16;

/// Rows per parallel task of packing or unpacking.
const TASK_ROWS: usize = 256;

/// Below this many bytes of `f32` table, packing and unpacking stay on the
/// calling thread under [`Parallelism::Auto`].
const PARALLEL_MIN_BYTES: usize = 1 << 20;

/// A row-wise quantized format: bits per value, a scale and a bias per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowWise {
    /// 8 bits a value, `f32` scale and bias: PyTorch's
    /// `embedding_bag_byte_prepack`.
    Int8,
    /// 4 bits a value, `f16` scale and bias: `embedding_bag_4bit_prepack`.
    Int4,
    /// 2 bits a value, `f16` scale and bias: `embedding_bag_2bit_prepack`.
    Int2,
}

impl RowWise {
    /// Bits per value.
    pub fn bits(self) -> u32 {
        match self {
            RowWise::Int8 => 8,
            RowWise::Int4 => 4,
            RowWise::Int2 => 2,
        }
    }

    /// Values per byte.
    fn per_byte(self) -> usize {
        8 / self.bits() as usize
    }

    /// The highest level, `2^bits - 1`.
    fn levels(self) -> u32 {
        (1 << self.bits()) - 1
    }

    /// Bytes of the scale and the bias that end each row.
    fn scale_bias_bytes(self) -> usize {
        match self {
            RowWise::Int8 => 8,
            RowWise::Int4 | RowWise::Int2 => 4,
        }
    }

    /// Bytes of the packed values of a row of `dim`.
    fn code_bytes(self, dim: usize) -> usize {
        dim.div_ceil(self.per_byte())
    }

    /// Bytes of one packed row of `dim` values (`None` if that overflows).
    pub fn row_bytes(self, dim: usize) -> Option<usize> {
        self.code_bytes(dim).checked_add(self.scale_bias_bytes())
    }

    /// Packs `table` (`rows × dim` values) into `rows` packed rows:
    /// [`prepack_with`](Self::prepack_with) with [`Parallelism::Auto`].
    ///
    /// # Errors
    /// As [`prepack_with`](Self::prepack_with).
    pub fn prepack(self, table: &[f32], dim: usize) -> Result<Vec<u8>, EmbeddingError> {
        self.prepack_with(Parallelism::Auto, table, dim)
    }

    /// Packs `table` (`rows × dim` values) into `rows` packed rows of
    /// [`row_bytes`](Self::row_bytes) each, by the rules of the module notes.
    ///
    /// # Errors
    /// A shape error for `table`, [`EmbeddingError::SizeOverflow`] if the
    /// packed table cannot be sized, or, for the first row that cannot be
    /// packed, [`EmbeddingError::NotFinite`] or
    /// [`EmbeddingError::RangeOverflow`].
    pub fn prepack_with(
        self,
        par: Parallelism,
        table: &[f32],
        dim: usize,
    ) -> Result<Vec<u8>, EmbeddingError> {
        let rows = table_rows(table.len(), dim, Operand::Table)?;
        let row_bytes = self
            .row_bytes(dim)
            .ok_or(EmbeddingError::SizeOverflow { count: 1, dim })?;
        let mut packed = crate::buffer::zeroed::<u8>(rows_len(rows, row_bytes)?, "table")?;
        if rows == 0 {
            return Ok(packed);
        }
        let pack = |first: usize, out: &mut [u8]| -> Result<(), EmbeddingError> {
            for (k, out) in out.chunks_exact_mut(row_bytes).enumerate() {
                let r = first + k;
                self.pack_row(r, &table[r * dim..(r + 1) * dim], out)?;
            }
            Ok(())
        };
        if par.splits(core::mem::size_of_val(table), PARALLEL_MIN_BYTES) {
            // Each task stops at its first bad row; the first failing task
            // holds the first bad row of the table.
            let tasks = packed.chunks_mut(TASK_ROWS.min(rows) * row_bytes).collect();
            crate::executor::map_parts(tasks, |task, out| pack(task * TASK_ROWS, out))
                .into_iter()
                .collect::<Result<(), _>>()?;
        } else {
            pack(0, &mut packed)?;
        }
        Ok(packed)
    }

    /// Packs row `r`, `x`, into `out` (one packed row).
    fn pack_row(self, r: usize, x: &[f32], out: &mut [u8]) -> Result<(), EmbeddingError> {
        if let Some(column) = x.iter().position(|v| !v.is_finite()) {
            return Err(EmbeddingError::NotFinite { row: r, column });
        }
        let (min, max) = min_max(x);
        if !(max - min).is_finite() {
            return Err(EmbeddingError::RangeOverflow { row: r });
        }
        let (codes, tail) = out.split_at_mut(self.code_bytes(x.len()));
        if self == RowWise::Int8 {
            let range = max - min;
            let inverse = 255.0 / (range + 1e-8);
            for (q, &v) in codes.iter_mut().zip(x) {
                *q = ((v - min) * inverse).round_ties_even() as u8;
            }
            tail[..4].copy_from_slice(&(range / 255.0).to_le_bytes());
            tail[4..].copy_from_slice(&min.to_le_bytes());
            return Ok(());
        }
        let bias = f16::from_f32(min);
        let min = bias.to_f32();
        let range = max - min;
        let levels = self.levels() as f32;
        let scale = f16::from_f32(if range == 0.0 { 1.0 } else { range / levels });
        if !min.is_finite() || scale.is_infinite() {
            return Err(EmbeddingError::RangeOverflow { row: r });
        }
        let mut scale = scale.to_f32();
        if scale == 0.0 {
            scale = 1.0;
        }
        let mut inverse = 1.0 / scale;
        if inverse.is_infinite() {
            (scale, inverse) = (1.0, 1.0);
        }
        codes.fill(0);
        let per_byte = self.per_byte();
        for (c, &v) in x.iter().enumerate() {
            let q = ((v - min) * inverse).round_ties_even().clamp(0.0, levels) as u8;
            codes[c / per_byte] |= q << ((c % per_byte) as u32 * self.bits());
        }
        tail[..2].copy_from_slice(&f16::from_f32(scale).to_le_bytes());
        tail[2..].copy_from_slice(&bias.to_le_bytes());
        Ok(())
    }

    /// Unpacks a packed table into `out` (`rows × dim` values, each
    /// `fma(q, scale, bias)`): [`dequantize_with`](Self::dequantize_with) with
    /// [`Parallelism::Auto`].
    ///
    /// # Errors
    /// As [`dequantize_with`](Self::dequantize_with).
    pub fn dequantize(
        self,
        packed: &[u8],
        dim: usize,
        out: &mut [f32],
    ) -> Result<(), EmbeddingError> {
        self.dequantize_with(Parallelism::Auto, packed, dim, out)
    }

    /// Unpacks a packed table into `out`, `rows × dim` values, value `c` of
    /// row `r` being `fma(q_rc, scale_r, bias_r)`, rounded once (as
    /// PyTorch's unpack).
    ///
    /// # Errors
    /// [`EmbeddingError::PackedLength`] unless `packed` is whole rows, or
    /// [`EmbeddingError::LengthMismatch`] for `out`; then `out` is untouched.
    pub fn dequantize_with(
        self,
        par: Parallelism,
        packed: &[u8],
        dim: usize,
        out: &mut [f32],
    ) -> Result<(), EmbeddingError> {
        let table = PackedTable::new(self, dim, packed)?;
        check_len(Operand::Output, rows_len(table.rows(), dim)?, out.len())?;
        if dim == 0 || table.rows() == 0 {
            return Ok(());
        }
        let unpack = |first: usize, out: &mut [f32]| {
            for (k, out) in out.chunks_exact_mut(dim).enumerate() {
                table.dequantize_row(first + k, out);
            }
        };
        if par.splits(core::mem::size_of_val(out), PARALLEL_MIN_BYTES) {
            // At most the table's rows per task: `rows × dim` fits, so this
            // product does too.
            let tasks = out.chunks_mut(TASK_ROWS.min(table.rows()) * dim).collect();
            crate::executor::for_each_part(tasks, |task, out| unpack(task * TASK_ROWS, out));
        } else {
            unpack(0, out);
        }
        Ok(())
    }
}

/// The smallest and the largest value of a row, in FBGEMM's order (the
/// module notes): it decides which of `-0.0` and `+0.0` is the minimum.
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut lo, mut hi) = ([f32::MAX; 8], [-f32::MAX; 8]);
    let (blocks, tail) = x.as_chunks::<8>();
    for block in blocks {
        for ((l, h), &v) in lo.iter_mut().zip(&mut hi).zip(block) {
            // `vminps`/`vmaxps`: the new value wins unless the lane is
            // strictly smaller (larger).
            *l = if *l < v { *l } else { v };
            *h = if *h > v { *h } else { v };
        }
    }
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in lo.iter().chain(tail) {
        min = if v < min { v } else { min };
    }
    for &v in hi.iter().chain(tail) {
        max = if v > max { v } else { max };
    }
    (min, max)
}

/// A packed table checked against its format and width: whole rows of
/// [`RowWise::row_bytes`] each, read in place.
#[derive(Clone, Copy, Debug)]
pub struct PackedTable<'a> {
    format: RowWise,
    dim: usize,
    rows: usize,
    row_bytes: usize,
    bytes: &'a [u8],
}

impl<'a> PackedTable<'a> {
    /// Checks that `bytes` is whole packed rows of `dim` values.
    ///
    /// # Errors
    /// [`EmbeddingError::SizeOverflow`] if a row cannot be sized, or
    /// [`EmbeddingError::PackedLength`].
    pub fn new(format: RowWise, dim: usize, bytes: &'a [u8]) -> Result<Self, EmbeddingError> {
        let row_bytes = format
            .row_bytes(dim)
            .ok_or(EmbeddingError::SizeOverflow { count: 1, dim })?;
        if !bytes.len().is_multiple_of(row_bytes) {
            return Err(EmbeddingError::PackedLength {
                len: bytes.len(),
                row_bytes,
            });
        }
        Ok(PackedTable {
            format,
            dim,
            rows: bytes.len() / row_bytes,
            row_bytes,
            bytes,
        })
    }

    /// A table whose owner already checked `bytes` to be `rows` rows of
    /// `row_bytes` ([`OwnedTable`](super::OwnedTable)).
    pub(crate) fn from_checked(
        format: RowWise,
        dim: usize,
        rows: usize,
        row_bytes: usize,
        bytes: &'a [u8],
    ) -> Self {
        debug_assert_eq!(format.row_bytes(dim), Some(row_bytes));
        debug_assert_eq!(bytes.len(), rows * row_bytes);
        PackedTable {
            format,
            dim,
            rows,
            row_bytes,
            bytes,
        }
    }

    /// The format.
    pub fn format(&self) -> RowWise {
        self.format
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// How many rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The packed bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Bytes per packed row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Row `r`'s scale and bias, or `None` past the last row.
    pub fn scale_bias(&self, r: usize) -> Option<(f32, f32)> {
        if r >= self.rows {
            return None;
        }
        let row = &self.bytes[r * self.row_bytes..(r + 1) * self.row_bytes];
        let tail = &row[self.format.code_bytes(self.dim)..];
        Some(match self.format {
            RowWise::Int8 => (
                f32::from_le_bytes(tail[..4].try_into().expect("4 bytes")),
                f32::from_le_bytes(tail[4..].try_into().expect("4 bytes")),
            ),
            RowWise::Int4 | RowWise::Int2 => (
                f16::from_le_bytes(tail[..2].try_into().expect("2 bytes")).to_f32(),
                f16::from_le_bytes(tail[2..].try_into().expect("2 bytes")).to_f32(),
            ),
        })
    }

    /// The level of value `c` of row `r`, or `None` outside the table.
    pub fn code(&self, r: usize, c: usize) -> Option<u8> {
        if r >= self.rows || c >= self.dim {
            return None;
        }
        let per_byte = self.format.per_byte();
        let byte = self.bytes[r * self.row_bytes + c / per_byte];
        let shift = (c % per_byte) as u32 * self.format.bits();
        Some((byte >> shift) & self.format.levels() as u8)
    }

    /// Row `r` as `f32`s into `out` (`dim` values); `r` must be a row.
    fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let (scale, bias) = self.scale_bias(r).expect("a row of the table");
        let codes = &self.bytes[r * self.row_bytes..];
        let (bits, per_byte) = (self.format.bits(), self.format.per_byte());
        let mask = self.format.levels() as u8;
        for (c, v) in out.iter_mut().enumerate() {
            let byte = codes[c / per_byte];
            let q = (byte >> ((c % per_byte) as u32 * bits)) & mask;
            *v = f32::from(q).mul_add(scale, bias);
        }
    }
}
