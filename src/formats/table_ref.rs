//! [`TableRef`]: a borrowed table of any format, checked once, and
//! [`Format`], the name of each format.

use super::{PackedTable, RowWise};
use crate::error::{EmbeddingError, Operand};
use crate::shape::table_rows;
use half::{bf16, f16};

/// Every format a table can be stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// `f32` values.
    F32,
    /// `f16` values.
    F16,
    /// `bf16` values.
    Bf16,
    /// 8-bit row-wise quantized ([`RowWise::Int8`]).
    Int8,
    /// 4-bit row-wise quantized ([`RowWise::Int4`]).
    Int4,
    /// 2-bit row-wise quantized ([`RowWise::Int2`]).
    Int2,
}

impl Format {
    /// Every format, widest first.
    pub const ALL: [Format; 6] = [
        Format::F32,
        Format::F16,
        Format::Bf16,
        Format::Int8,
        Format::Int4,
        Format::Int2,
    ];

    /// The format's short name: `f32`, `f16`, `bf16`, `int8`, `int4`,
    /// `int2` (what files and the report call it).
    pub fn name(self) -> &'static str {
        match self {
            Format::F32 => "f32",
            Format::F16 => "f16",
            Format::Bf16 => "bf16",
            Format::Int8 => "int8",
            Format::Int4 => "int4",
            Format::Int2 => "int2",
        }
    }

    /// The format called `name` (as [`name`](Self::name) spells it).
    pub fn from_name(name: &str) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The row-wise quantized format, if this is one.
    pub fn row_wise(self) -> Option<RowWise> {
        match self {
            Format::Int8 => Some(RowWise::Int8),
            Format::Int4 => Some(RowWise::Int4),
            Format::Int2 => Some(RowWise::Int2),
            Format::F32 | Format::F16 | Format::Bf16 => None,
        }
    }

    /// Bytes of one row of `dim` values (`None` if that overflows).
    pub fn row_bytes(self, dim: usize) -> Option<usize> {
        match self {
            Format::F32 => dim.checked_mul(4),
            Format::F16 | Format::Bf16 => dim.checked_mul(2),
            Format::Int8 | Format::Int4 | Format::Int2 => {
                self.row_wise().and_then(|f| f.row_bytes(dim))
            }
        }
    }
}

impl From<RowWise> for Format {
    fn from(format: RowWise) -> Format {
        match format {
            RowWise::Int8 => Format::Int8,
            RowWise::Int4 => Format::Int4,
            RowWise::Int2 => Format::Int2,
        }
    }
}

impl core::fmt::Display for Format {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A borrowed table of any [`Format`], its length checked against its
/// width once: what [`table_gather`](crate::table_gather) and
/// [`table_bag_forward`](crate::table_bag_forward) read, in place.
#[derive(Clone, Copy, Debug)]
pub struct TableRef<'a> {
    data: Data<'a>,
    dim: usize,
    rows: usize,
}

/// The table's values, by format.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Data<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
    Packed(PackedTable<'a>),
}

impl<'a> TableRef<'a> {
    /// An `f32` table of rows of `dim`.
    ///
    /// # Errors
    /// A shape error if `values` is not whole rows of `dim`.
    pub fn f32(values: &'a [f32], dim: usize) -> Result<Self, EmbeddingError> {
        let rows = table_rows(values.len(), dim, Operand::Table)?;
        Ok(TableRef {
            data: Data::F32(values),
            dim,
            rows,
        })
    }

    /// An `f16` table of rows of `dim`.
    ///
    /// # Errors
    /// As [`f32`](Self::f32).
    pub fn f16(values: &'a [f16], dim: usize) -> Result<Self, EmbeddingError> {
        let rows = table_rows(values.len(), dim, Operand::Table)?;
        Ok(TableRef {
            data: Data::F16(values),
            dim,
            rows,
        })
    }

    /// A `bf16` table of rows of `dim`.
    ///
    /// # Errors
    /// As [`f32`](Self::f32).
    pub fn bf16(values: &'a [bf16], dim: usize) -> Result<Self, EmbeddingError> {
        let rows = table_rows(values.len(), dim, Operand::Table)?;
        Ok(TableRef {
            data: Data::Bf16(values),
            dim,
            rows,
        })
    }

    /// A row-wise quantized table (already checked into its
    /// [`PackedTable`]).
    pub fn packed(table: PackedTable<'a>) -> Self {
        TableRef {
            data: Data::Packed(table),
            dim: table.dim(),
            rows: table.rows(),
        }
    }

    /// The format.
    pub fn format(&self) -> Format {
        match self.data {
            Data::F32(_) => Format::F32,
            Data::F16(_) => Format::F16,
            Data::Bf16(_) => Format::Bf16,
            Data::Packed(p) => p.format().into(),
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

    /// Bytes of the whole table.
    pub fn byte_len(&self) -> usize {
        match self.data {
            Data::F32(v) => core::mem::size_of_val(v),
            Data::F16(v) => core::mem::size_of_val(v),
            Data::Bf16(v) => core::mem::size_of_val(v),
            Data::Packed(p) => p.bytes().len(),
        }
    }

    /// A table whose length its owner already checked against `dim` and
    /// `rows` ([`OwnedTable`](super::OwnedTable)).
    pub(crate) fn from_checked(data: Data<'a>, dim: usize, rows: usize) -> Self {
        TableRef { data, dim, rows }
    }

    /// The values, by format (for the kernels).
    pub(crate) fn data(&self) -> Data<'a> {
        self.data
    }
}

impl<'a> From<PackedTable<'a>> for TableRef<'a> {
    fn from(table: PackedTable<'a>) -> Self {
        TableRef::packed(table)
    }
}
