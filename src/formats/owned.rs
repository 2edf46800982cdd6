//! [`OwnedTable`]: a table of any [`Format`] that owns its values, made
//! from an `f32` table by converting or packing it, or from stored bytes.

use super::table_ref::{Data, Format};
use super::{half_rows, PackedTable, RowWise, TableRef};
use crate::error::{EmbeddingError, Operand};
use crate::parallel::Parallelism;
use crate::shape::{rows_len, table_rows};
use half::{bf16, f16};

/// A table of any [`Format`], owned: what the reduced-precision layers hold
/// and what files store. [`as_ref`](Self::as_ref) lends it to the kernels.
#[derive(Clone, Debug, PartialEq)]
pub struct OwnedTable {
    values: Values,
    dim: usize,
    rows: usize,
    /// Bytes per row, checked when the table was made.
    row_bytes: usize,
}

/// The values, by format.
#[derive(Clone, Debug, PartialEq)]
enum Values {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    Packed(RowWise, Vec<u8>),
}

impl OwnedTable {
    /// `table` (`rows × dim` `f32`s) in `format`: copied, rounded to
    /// `f16` / `bf16` (nearest, ties to even), or packed by
    /// [`RowWise::prepack`].
    ///
    /// # Errors
    /// A shape error for `table`, or the errors of
    /// [`RowWise::prepack`] for the row-wise formats.
    pub fn from_f32(table: &[f32], dim: usize, format: Format) -> Result<Self, EmbeddingError> {
        let rows = table_rows(table.len(), dim, Operand::Table)?;
        let row_bytes = format
            .row_bytes(dim)
            .ok_or(EmbeddingError::SizeOverflow { count: 1, dim })?;
        let values = match format {
            Format::F32 => Values::F32(table.to_vec()),
            Format::F16 => Values::F16(half_rows::to_f16(table)),
            Format::Bf16 => Values::Bf16(half_rows::to_bf16(table)),
            Format::Int8 | Format::Int4 | Format::Int2 => {
                let packing = format.row_wise().expect("a row-wise format");
                Values::Packed(packing, packing.prepack(table, dim)?)
            }
        };
        Ok(OwnedTable {
            values,
            dim,
            rows,
            row_bytes,
        })
    }

    /// A table of `format` from its little-endian bytes, as
    /// [`to_le_bytes`](Self::to_le_bytes) gives them (and as PyTorch's
    /// tensors hold them): `f32`s, `f16`s or `bf16`s, or packed rows.
    ///
    /// # Errors
    /// [`EmbeddingError::PackedLength`] unless `bytes` is whole rows of the
    /// format, or [`EmbeddingError::SizeOverflow`] if a row cannot be sized.
    pub fn from_le_bytes(format: Format, dim: usize, bytes: &[u8]) -> Result<Self, EmbeddingError> {
        let row_bytes = format
            .row_bytes(dim)
            .ok_or(EmbeddingError::SizeOverflow { count: 1, dim })?;
        let whole = if row_bytes == 0 {
            bytes.is_empty()
        } else {
            bytes.len().is_multiple_of(row_bytes)
        };
        if !whole {
            return Err(EmbeddingError::PackedLength {
                len: bytes.len(),
                row_bytes,
            });
        }
        let rows = bytes.len().checked_div(row_bytes).unwrap_or(0);
        let values = match format {
            Format::F32 => Values::F32(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            ),
            Format::F16 => Values::F16(
                bytes
                    .chunks_exact(2)
                    .map(|b| f16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            ),
            Format::Bf16 => Values::Bf16(
                bytes
                    .chunks_exact(2)
                    .map(|b| bf16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            ),
            Format::Int8 | Format::Int4 | Format::Int2 => {
                let packing = format.row_wise().expect("a row-wise format");
                Values::Packed(packing, bytes.to_vec())
            }
        };
        Ok(OwnedTable {
            values,
            dim,
            rows,
            row_bytes,
        })
    }

    /// The table's bytes, little-endian: what [`from_le_bytes`](Self::from_le_bytes)
    /// reads back and what a file stores.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match &self.values {
            Values::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Values::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Values::Bf16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Values::Packed(_, bytes) => bytes.clone(),
        }
    }

    /// The table read back as `f32`s (`rows × dim`): copied, widened
    /// exactly, or dequantized (`fma(q, scale, bias)`).
    ///
    /// # Errors
    /// [`EmbeddingError::SizeOverflow`] if `rows × dim` does not fit.
    pub fn to_f32(&self) -> Result<Vec<f32>, EmbeddingError> {
        Ok(match &self.values {
            Values::F32(v) => v.clone(),
            Values::F16(v) => half_rows::f16_to_f32(v),
            Values::Bf16(v) => half_rows::bf16_to_f32(v),
            Values::Packed(format, bytes) => {
                let mut out = vec![0.0; rows_len(self.rows, self.dim)?];
                format.dequantize_with(Parallelism::Auto, bytes, self.dim, &mut out)?;
                out
            }
        })
    }

    /// The table lent to the kernels.
    pub fn as_ref(&self) -> TableRef<'_> {
        let data = match &self.values {
            Values::F32(v) => Data::F32(v),
            Values::F16(v) => Data::F16(v),
            Values::Bf16(v) => Data::Bf16(v),
            Values::Packed(format, bytes) => Data::Packed(PackedTable::from_checked(
                *format,
                self.dim,
                self.rows,
                self.row_bytes,
                bytes,
            )),
        };
        TableRef::from_checked(data, self.dim, self.rows)
    }

    /// The format.
    pub fn format(&self) -> Format {
        match &self.values {
            Values::F32(_) => Format::F32,
            Values::F16(_) => Format::F16,
            Values::Bf16(_) => Format::Bf16,
            Values::Packed(format, _) => (*format).into(),
        }
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// How many rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes the table's values take.
    pub fn byte_len(&self) -> usize {
        self.as_ref().byte_len()
    }
}
