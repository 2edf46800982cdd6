//! Table formats beyond `f32`: half-precision rows (`f16`, `bf16`) and the
//! row-wise quantized rows of FBGEMM and PyTorch (8, 4 and 2 bits a value,
//! a scale and a bias per row), byte for byte as PyTorch packs them.
//!
//! | format | a row of `dim` values | a value is |
//! | --- | --- | --- |
//! | `f16` | `dim` × 2 bytes | the `f16` |
//! | `bf16` | `dim` × 2 bytes | the `bf16` |
//! | [`RowWise::Int8`] | `dim` bytes of `q`, then an `f32` scale and an `f32` bias (little-endian): `dim + 8` bytes | `scale · q + bias` |
//! | [`RowWise::Int4`] | `ceil(dim / 2)` bytes, two values a byte (the even column in the low nibble), then an `f16` scale and an `f16` bias: `ceil(dim / 2) + 4` bytes | `scale · q + bias` |
//! | [`RowWise::Int2`] | `ceil(dim / 4)` bytes, four values a byte (lowest bits first), then an `f16` scale and bias | `scale · q + bias` |
//!
//! The 8-bit layout is that of `torch.ops.quantized.embedding_bag_byte_prepack`,
//! the 4- and 2-bit ones those of `embedding_bag_4bit_prepack` and
//! `embedding_bag_2bit_prepack`; `rowwise.rs` holds the packing rules and the
//! golden test (`tests/formats.rs`) holds them to PyTorch's bytes.

mod half_rows;
mod owned;
mod rowwise;
mod table_ref;

pub use half_rows::{bf16_to_f32, f16_to_f32, to_bf16, to_f16};
pub use owned::OwnedTable;
pub use rowwise::{PackedTable, RowWise};
pub(crate) use table_ref::Data;
pub use table_ref::{Format, TableRef};
