//! [`OwnedTable`]: a table of any [`Format`] that owns its values, made
//! from an `f32` table by converting or packing it, or from stored bytes.
//!
//! The values of every format sit in one [`AlignedTable`]: each row starts
//! where a `Vec` would put it plus nothing (the first row on a cache line),
//! and a table of 2 MiB or more lies in transparent huge pages, as the `f32`
//! layers keep theirs. A bag sum over a table in 4 KiB pages took longer
//! than over the same bytes in huge pages (the rows are read at random, so
//! nearly every row is a TLB miss without them; docs/design.md, "Memory:
//! huge pages and aligned tables").

use super::table_ref::{Data, Format};
use super::{PackedTable, TableRef, half_rows};
use crate::buffer::{copied, with_capacity};
use crate::error::{EmbeddingError, Operand};
use crate::memory::AlignedTable;
use crate::parallel::Parallelism;
use crate::shape::{rows_len, table_rows};
use bytemuck::Pod;
use half::{bf16, f16};

/// A table of any [`Format`], owned: what the reduced-precision layers hold
/// and what files store. [`as_ref`](Self::as_ref) lends it to the kernels.
/// Two tables are equal when their formats, shapes and bytes are.
///
/// Cloning copies the values, and running out of memory for them aborts, as
/// it does for a `Vec`; [`try_clone`](Self::try_clone) returns an error
/// instead.
#[derive(Clone, PartialEq)]
pub struct OwnedTable {
    format: Format,
    values: Memory,
    dim: usize,
    rows: usize,
    /// Bytes per row, checked when the table was made.
    row_bytes: usize,
}

impl core::fmt::Debug for OwnedTable {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("OwnedTable")
            .field("format", &self.format)
            .field("rows", &self.rows)
            .field("dim", &self.dim)
            .finish_non_exhaustive()
    }
}

/// The values' bytes (in the machine's byte order), `len` of them, at the
/// start of an [`AlignedTable`]: aligned to a line or a huge page, so a view
/// as `f32`s, `f16`s, `bf16`s or bytes is always aligned.
#[derive(Clone)]
struct Memory {
    words: AlignedTable,
    len: usize,
}

impl Memory {
    /// A copy of `values`.
    fn copy_of<T: Pod>(values: &[T]) -> Result<Memory, EmbeddingError> {
        let bytes: &[u8] = bytemuck::cast_slice(values);
        let mut words = AlignedTable::zeroed(bytes.len().div_ceil(4))?;
        bytemuck::cast_slice_mut::<f32, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        Ok(Memory {
            words,
            len: bytes.len(),
        })
    }

    /// The `len` bytes.
    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<f32, u8>(&self.words)[..self.len]
    }

    /// The bytes as values of `T` (`len` is a whole number of them, and the
    /// start is aligned for any `T` here).
    fn values<T: Pod>(&self) -> &[T] {
        bytemuck::cast_slice(self.bytes())
    }
}

impl PartialEq for Memory {
    fn eq(&self, other: &Memory) -> bool {
        self.bytes() == other.bytes()
    }
}

impl OwnedTable {
    /// `table` (`rows × dim` `f32`s) in `format`: copied, rounded to
    /// `f16` / `bf16` (nearest, ties to even), or packed by
    /// [`RowWise::prepack`](super::RowWise::prepack).
    ///
    /// # Errors
    /// A shape error for `table`, or the errors of
    /// [`RowWise::prepack`](super::RowWise::prepack) for the row-wise formats, or
    /// [`EmbeddingError::AllocationFailed`] if the copy cannot be allocated.
    pub fn from_f32(table: &[f32], dim: usize, format: Format) -> Result<Self, EmbeddingError> {
        let rows = table_rows(table.len(), dim, Operand::Table)?;
        let row_bytes = format
            .row_bytes(dim)
            .ok_or(EmbeddingError::SizeOverflow { count: 1, dim })?;
        let values = match format {
            Format::F32 => Memory::copy_of(table)?,
            Format::F16 => Memory::copy_of(&half_rows::to_f16(table)?)?,
            Format::Bf16 => Memory::copy_of(&half_rows::to_bf16(table)?)?,
            Format::Int8 | Format::Int4 | Format::Int2 => {
                let packing = format.row_wise().expect("a row-wise format");
                Memory::copy_of(&packing.prepack(table, dim)?)?
            }
        };
        Ok(OwnedTable {
            format,
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
            Format::F32 => decoded(bytes, f32::from_le_bytes)?,
            Format::F16 => decoded(bytes, f16::from_le_bytes)?,
            Format::Bf16 => decoded(bytes, bf16::from_le_bytes)?,
            Format::Int8 | Format::Int4 | Format::Int2 => Memory::copy_of(bytes)?,
        };
        Ok(OwnedTable {
            format,
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
        let values = &self.values;
        match self.format {
            Format::F32 => out.extend(values.values::<f32>().iter().flat_map(|x| x.to_le_bytes())),
            Format::F16 => out.extend(values.values::<f16>().iter().flat_map(|x| x.to_le_bytes())),
            Format::Bf16 => {
                out.extend(values.values::<bf16>().iter().flat_map(|x| x.to_le_bytes()))
            }
            Format::Int8 | Format::Int4 | Format::Int2 => out.extend_from_slice(values.bytes()),
        }
        Ok(out)
    }

    /// A copy of the table, or an error where [`Clone::clone`] would abort.
    ///
    /// # Errors
    /// [`EmbeddingError::AllocationFailed`] if the copy cannot be allocated.
    pub fn try_clone(&self) -> Result<OwnedTable, EmbeddingError> {
        Ok(OwnedTable {
            values: Memory::copy_of(self.values.bytes())?,
            ..*self
        })
    }

    /// The table read back as `f32`s (`rows × dim`): copied, widened
    /// exactly, or dequantized (`fma(q, scale, bias)`).
    ///
    /// # Errors
    /// [`EmbeddingError::SizeOverflow`] if `rows × dim` does not fit,
    /// [`EmbeddingError::AllocationFailed`] if the values cannot be
    /// allocated.
    pub fn to_f32(&self) -> Result<Vec<f32>, EmbeddingError> {
        let values = &self.values;
        Ok(match self.format {
            Format::F32 => copied(values.values::<f32>(), "table")?,
            Format::F16 => half_rows::f16_to_f32(values.values())?,
            Format::Bf16 => half_rows::bf16_to_f32(values.values())?,
            Format::Int8 | Format::Int4 | Format::Int2 => {
                let packing = self.format.row_wise().expect("a row-wise format");
                let len = rows_len(self.rows, self.dim)?;
                let mut out = crate::memory::zeroed_floats(len, "table")?;
                packing.dequantize_with(Parallelism::Auto, values.bytes(), self.dim, &mut out)?;
                out
            }
        })
    }

    /// The table lent to the kernels.
    pub fn as_ref(&self) -> TableRef<'_> {
        let values = &self.values;
        let data = match self.format {
            Format::F32 => Data::F32(values.values()),
            Format::F16 => Data::F16(values.values()),
            Format::Bf16 => Data::Bf16(values.values()),
            Format::Int8 | Format::Int4 | Format::Int2 => Data::Packed(PackedTable::from_checked(
                self.format.row_wise().expect("a row-wise format"),
                self.dim,
                self.rows,
                self.row_bytes,
                values.bytes(),
            )),
        };
        TableRef::from_checked(data, self.dim, self.rows)
    }

    /// The format.
    pub fn format(&self) -> Format {
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

    /// Bytes the table's values take.
    pub fn byte_len(&self) -> usize {
        self.as_ref().byte_len()
    }
}

/// The little-endian values of `bytes` (a whole number of them), each read
/// by `read` from its `N` bytes, in the machine's byte order.
fn decoded<T: Pod, const N: usize>(
    bytes: &[u8],
    read: fn([u8; N]) -> T,
) -> Result<Memory, EmbeddingError> {
    let mut values = Memory::copy_of(bytes)?;
    let (stored, _) = bytes.as_chunks::<N>();
    let len = values.len;
    let own: &mut [T] = bytemuck::cast_slice_mut(
        &mut bytemuck::cast_slice_mut::<f32, u8>(&mut values.words)[..len],
    );
    for (v, &b) in own.iter_mut().zip(stored) {
        *v = read(b);
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every format's first row starts a cache line, and a table of 2 MiB or
    /// more starts a huge page (what `AlignedTable` promises).
    #[test]
    fn every_format_is_line_aligned_and_large_ones_page_aligned() {
        for (rows, dim) in [(3, 5), (4096, 256), (8192, 520)] {
            let values: Vec<f32> = (0..rows * dim).map(|i| (i % 97) as f32 / 7.0).collect();
            for format in Format::ALL {
                let table = OwnedTable::from_f32(&values, dim, format).unwrap();
                let at = table.values.bytes().as_ptr() as usize;
                let huge = table.byte_len() >= crate::memory::HUGE_PAGE;
                let align = if huge { crate::memory::HUGE_PAGE } else { 64 };
                assert_eq!(at % align, 0, "{format:?} at {at:#x}, {rows} x {dim}");
                assert_eq!(table.values.len, table.byte_len(), "{format:?}");
            }
        }
    }

    /// Equality is of the bytes: a NaN table equals its copy, and `-0.0`
    /// differs from `0.0`.
    #[test]
    fn equal_means_the_same_bytes() {
        let nan = [f32::NAN, 1.0];
        let a = OwnedTable::from_f32(&nan, 2, Format::F32).unwrap();
        assert_eq!(a, a.try_clone().unwrap());
        let zero = OwnedTable::from_f32(&[0.0, 1.0], 2, Format::F32).unwrap();
        let negative = OwnedTable::from_f32(&[-0.0, 1.0], 2, Format::F32).unwrap();
        assert_ne!(zero, negative);
        let f16_zero = OwnedTable::from_f32(&[0.0, 1.0], 2, Format::F16).unwrap();
        assert_ne!(zero, f16_zero, "same values, other format");
    }
}
