//! [`OwnedTable`]: a table of any [`Format`] that owns its values, made
//! from an `f32` table by converting or packing it, or from stored bytes.

use super::table_ref::{Data, Format};
use super::{half_rows, PackedTable, RowWise, TableRef};
use crate::buffer::{copied, with_capacity};
use crate::error::{EmbeddingError, Operand};
use crate::parallel::Parallelism;
use crate::shape::{rows_len, table_rows};
use half::{bf16, f16};

/// A table of any [`Format`], owned: what the reduced-precision layers hold
/// and what files store. [`as_ref`](Self::as_ref) lends it to the kernels.
///
/// Cloning copies the values, and running out of memory for them aborts, as
/// it does for a `Vec`; [`try_clone`](Self::try_clone) returns an error
/// instead.
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
    /// [`RowWise::prepack`] for the row-wise formats, or
    /// [`EmbeddingError::AllocationFailed`] if the copy cannot be allocated.
    pub fn from_f32(table: &[f32], dim: usize, format: Format) -> Result<Self, EmbeddingError> {
        let rows = table_rows(table.len(), dim, Operand::Table)?;
        let row_bytes = format
            .row_bytes(dim)
            .ok_or(EmbeddingError::SizeOverflow { count: 1, dim })?;
        let values = match format {
            Format::F32 => Values::F32(copied(table, "table")?),
            Format::F16 => Values::F16(half_rows::to_f16(table)?),
            Format::Bf16 => Values::Bf16(half_rows::to_bf16(table)?),
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
    /// format, [`EmbeddingError::SizeOverflow`] if a row cannot be sized, or
    /// [`EmbeddingError::AllocationFailed`] if the values cannot be
    /// allocated.
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
            Format::F32 => Values::F32(decoded(bytes, f32::from_le_bytes)?),
            Format::F16 => Values::F16(decoded(bytes, f16::from_le_bytes)?),
            Format::Bf16 => Values::Bf16(decoded(bytes, bf16::from_le_bytes)?),
            Format::Int8 | Format::Int4 | Format::Int2 => {
                let packing = format.row_wise().expect("a row-wise format");
                Values::Packed(packing, copied(bytes, "table")?)
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
    ///
    /// # Errors
    /// [`EmbeddingError::AllocationFailed`] if the bytes cannot be
    /// allocated.
    pub fn to_le_bytes(&self) -> Result<Vec<u8>, EmbeddingError> {
        let mut out = with_capacity(self.byte_len(), "table bytes")?;
        match &self.values {
            Values::F32(v) => out.extend(v.iter().flat_map(|x| x.to_le_bytes())),
            Values::F16(v) => out.extend(v.iter().flat_map(|x| x.to_le_bytes())),
            Values::Bf16(v) => out.extend(v.iter().flat_map(|x| x.to_le_bytes())),
            Values::Packed(_, bytes) => out.extend_from_slice(bytes),
        }
        Ok(out)
    }

    /// A copy of the table, or an error where [`Clone::clone`] would abort.
    ///
    /// # Errors
    /// [`EmbeddingError::AllocationFailed`] if the copy cannot be allocated.
    pub fn try_clone(&self) -> Result<OwnedTable, EmbeddingError> {
        let values = match &self.values {
            Values::F32(v) => Values::F32(copied(v, "table")?),
            Values::F16(v) => Values::F16(copied(v, "table")?),
            Values::Bf16(v) => Values::Bf16(copied(v, "table")?),
            Values::Packed(format, bytes) => Values::Packed(*format, copied(bytes, "table")?),
        };
        Ok(OwnedTable { values, ..*self })
    }

    /// The table read back as `f32`s (`rows × dim`): copied, widened
    /// exactly, or dequantized (`fma(q, scale, bias)`).
    ///
    /// # Errors
    /// [`EmbeddingError::SizeOverflow`] if `rows × dim` does not fit,
    /// [`EmbeddingError::AllocationFailed`] if the values cannot be
    /// allocated.
    pub fn to_f32(&self) -> Result<Vec<f32>, EmbeddingError> {
        Ok(match &self.values {
            Values::F32(v) => copied(v, "table")?,
            Values::F16(v) => half_rows::f16_to_f32(v)?,
            Values::Bf16(v) => half_rows::bf16_to_f32(v)?,
            Values::Packed(format, bytes) => {
                let len = rows_len(self.rows, self.dim)?;
                let mut out = crate::memory::zeroed_floats(len, "table")?;
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

/// The little-endian values of `bytes` (a whole number of them), each read
/// by `read` from its `N` bytes.
fn decoded<T, const N: usize>(
    bytes: &[u8],
    read: fn([u8; N]) -> T,
) -> Result<Vec<T>, EmbeddingError> {
    let (values, _) = bytes.as_chunks::<N>();
    let mut out = with_capacity(values.len(), "table")?;
    out.extend(values.iter().map(|&b| read(b)));
    Ok(out)
}
