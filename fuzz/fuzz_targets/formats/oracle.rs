//! The oracles of the `formats` target, written from the crate's
//! documentation rather than its code: the packed layout and the decode of
//! a row by hand, the result each call must have (its error, in the
//! documented check order), and how close a prepacked value must read back.

use super::case::Table;
use embedding_kernels::formats::RowWise;
use embedding_kernels::{Bags, EmbeddingError, Mode, Operand, Pooling};
use embedding_kernels_fuzz::Id;
use half::f16;

/// The packed layout, restated from the table in `formats/mod.rs`: bits a
/// value, code bytes a row, and bytes a row (`None` if that overflows).
pub(crate) fn layout(format: RowWise, dim: usize) -> (u32, usize, Option<usize>) {
    let bits = match format {
        RowWise::Int8 => 8,
        RowWise::Int4 => 4,
        RowWise::Int2 => 2,
    };
    let code_bytes = dim.div_ceil(8 / bits as usize);
    let tail = if bits == 8 { 8 } else { 4 };
    (bits, code_bytes, code_bytes.checked_add(tail))
}

/// The highest level of a format, `2^bits - 1`.
fn levels(format: RowWise) -> f32 {
    ((1u32 << layout(format, 1).0) - 1) as f32
}

/// A half value decoded by hand.
pub(crate) fn widen_half(bits: u16, is_bf16: bool) -> f32 {
    if is_bf16 {
        f32::from_bits(u32::from(bits) << 16)
    } else {
        f16::from_bits(bits).to_f32()
    }
}

/// A packed row's scale and bias, read by hand from after its codes.
pub(crate) fn scale_bias(format: RowWise, dim: usize, row: &[u8]) -> (f32, f32) {
    let (bits, code_bytes, _) = layout(format, dim);
    let t = &row[code_bytes..];
    if bits == 8 {
        (
            f32::from_le_bytes([t[0], t[1], t[2], t[3]]),
            f32::from_le_bytes([t[4], t[5], t[6], t[7]]),
        )
    } else {
        (
            f16::from_le_bytes([t[0], t[1]]).to_f32(),
            f16::from_le_bytes([t[2], t[3]]).to_f32(),
        )
    }
}

/// A packed row decoded by hand: `fma(q, scale, bias)` for each level `q`,
/// the levels lowest bits first.
pub(crate) fn decode_packed_row(format: RowWise, dim: usize, row: &[u8], out: &mut Vec<f32>) {
    let (bits, _, _) = layout(format, dim);
    let per_byte = 8 / bits as usize;
    let mask = ((1u32 << bits) - 1) as u8;
    let (scale, bias) = scale_bias(format, dim, row);
    for c in 0..dim {
        let q = (row[c / per_byte] >> ((c % per_byte) as u32 * bits)) & mask;
        out.push(f32::mul_add(f32::from(q), scale, bias));
    }
}

/// How many rows the constructor must find in `table` of width `dim`, or
/// its error: `TableRef::f16`/`bf16` (the shape rule of `shape.rs`) or
/// `PackedTable::new`.
pub(crate) fn expected_rows(table: &Table, dim: usize) -> Result<usize, EmbeddingError> {
    match table {
        Table::Half { bits, .. } => value_rows(bits.len(), dim),
        Table::Packed { format, bytes } => {
            let (_, _, row_bytes) = layout(*format, dim);
            let row_bytes = row_bytes.ok_or(EmbeddingError::SizeOverflow { count: 1, dim })?;
            if bytes.len() % row_bytes != 0 {
                return Err(EmbeddingError::PackedLength {
                    len: bytes.len(),
                    row_bytes,
                });
            }
            Ok(bytes.len() / row_bytes)
        }
    }
}

/// The rows of `len` values (`f32`, `f16` or `bf16`) in rows of `dim`, or
/// the shape error, by the rule of `shape.rs`: a `dim` of 0 holds no rows.
pub(crate) fn value_rows(len: usize, dim: usize) -> Result<usize, EmbeddingError> {
    let operand = Operand::Table;
    match dim {
        0 if len == 0 => Ok(0),
        0 => Err(EmbeddingError::ZeroDimWithData { operand, len }),
        _ if !len.is_multiple_of(dim) => {
            Err(EmbeddingError::NotMultipleOfDim { operand, len, dim })
        }
        _ => Ok(len / dim),
    }
}

/// What `OwnedTable::from_le_bytes` must make of `table`'s bytes: its rows,
/// or its error (rows of `2·dim` bytes for halves).
pub(crate) fn expected_owned_rows(table: &Table, dim: usize) -> Result<usize, EmbeddingError> {
    let len = table.len();
    let (row_bytes, bytes) = match table {
        Table::Half { .. } => (dim.checked_mul(2), len * 2),
        Table::Packed { format, .. } => (layout(*format, dim).2, len),
    };
    let row_bytes = row_bytes.ok_or(EmbeddingError::SizeOverflow { count: 1, dim })?;
    let whole = match row_bytes {
        0 => bytes == 0,
        _ => bytes % row_bytes == 0,
    };
    if !whole {
        return Err(EmbeddingError::PackedLength {
            len: bytes,
            row_bytes,
        });
    }
    Ok(bytes.checked_div(row_bytes).unwrap_or(0))
}

/// The first id that is not a row, as the crate reports it.
fn first_bad_id<I: Id>(ids: &[I], rows: usize) -> Result<(), EmbeddingError> {
    match ids
        .iter()
        .position(|id| !(0..rows as i128).contains(&id.to_i128()))
    {
        Some(position) => Err(EmbeddingError::IndexOutOfRange {
            position,
            index: ids[position].to_i128(),
            num_embeddings: rows,
        }),
        None => Ok(()),
    }
}

/// The result a lookup of `ids` into `out_len` values must have, in the
/// documented order: the output size, its length, then every id.
pub(crate) fn expected_lookup<I: Id>(
    rows: usize,
    dim: usize,
    ids: &[I],
    out_len: usize,
) -> Result<(), EmbeddingError> {
    let count = ids.len();
    let len = count
        .checked_mul(dim)
        .ok_or(EmbeddingError::SizeOverflow { count, dim })?;
    if len != out_len {
        return Err(EmbeddingError::LengthMismatch {
            operand: Operand::Output,
            expected: len,
            got: out_len,
        });
    }
    first_bad_id(ids, rows)
}

/// The result of a bag call, in the crate's check order: ids against the
/// bags, weights (mode, then length), `padding_idx`, the output size and
/// length, `max_indices` (max mode), then every id.
pub(crate) fn expected_bag<I: Id>(
    rows: usize,
    dim: usize,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    out_len: usize,
    indices_len: usize,
) -> Result<(), EmbeddingError> {
    let mismatch = |operand, expected, got| match expected == got {
        true => Ok(()),
        false => Err(EmbeddingError::LengthMismatch {
            operand,
            expected,
            got,
        }),
    };
    mismatch(Operand::Ids, bags.num_ids(), ids.len())?;
    if let Some(w) = pooling.per_sample_weights {
        if pooling.mode != Mode::Sum {
            return Err(EmbeddingError::PerSampleWeightsNeedSum { mode: pooling.mode });
        }
        mismatch(Operand::PerSampleWeights, ids.len(), w.len())?;
    }
    if let Some(p) = pooling.padding_idx
        && p >= rows
    {
        return Err(EmbeddingError::PaddingIdxOutOfRange {
            padding_idx: i64::try_from(p).unwrap_or(i64::MAX),
            num_embeddings: rows,
        });
    }
    let count = bags.len();
    let len = count
        .checked_mul(dim)
        .ok_or(EmbeddingError::SizeOverflow { count, dim })?;
    mismatch(Operand::Output, len, out_len)?;
    if pooling.mode == Mode::Max {
        mismatch(Operand::MaxIndices, len, indices_len)?;
    }
    first_bad_id(ids, rows)
}

/// The packed length `prepack` must return for `x`, or its error, from the
/// rules of `formats/rowwise.rs`: the shape, the row size, then the first
/// row holding a value that is not finite (its first such column), whose
/// range overflows an `f32`, or (4 and 2 bits) whose `f16` minimum or scale
/// is infinite.
pub(crate) fn expected_prepack(
    format: RowWise,
    x: &[f32],
    dim: usize,
) -> Result<usize, EmbeddingError> {
    let rows = value_rows(x.len(), dim)?;
    let row_bytes = layout(format, dim)
        .2
        .ok_or(EmbeddingError::SizeOverflow { count: 1, dim })?;
    if dim == 0 {
        return Ok(rows * row_bytes);
    }
    for (row, values) in x.chunks_exact(dim).enumerate() {
        if let Some(column) = values.iter().position(|v| !v.is_finite()) {
            return Err(EmbeddingError::NotFinite { row, column });
        }
        let min = values.iter().copied().fold(f32::INFINITY, f32::min);
        let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if !(max - min).is_finite() {
            return Err(EmbeddingError::RangeOverflow { row });
        }
        if format != RowWise::Int8 {
            let bias = f16::from_f32(min).to_f32();
            let range = max - bias;
            let scale = f16::from_f32(if range == 0.0 {
                1.0
            } else {
                range / levels(format)
            });
            if !bias.is_finite() || scale.is_infinite() {
                return Err(EmbeddingError::RangeOverflow { row });
            }
        }
    }
    Ok(rows * row_bytes)
}

/// How far value `v` of row `xs` may read back from itself, given the
/// row's stored `scale` and `bias`: half a level, plus how far `v` lies
/// outside the levels' span, plus rounding.
///
/// The levels are `bias + q·scale`, `q` in `0..=L`. The packer picks the
/// level nearest to `v` (half a level, `|scale|/2`), or, for a value outside
/// the span (the `f16` bias rounded above the minimum, the `f16` scale
/// rounded below the range, a scale replaced by 1), the nearer end. On top:
/// rounding of `v - min`, of the inverse scale and of the product (`4ε`
/// relative to the magnitudes involved), of the fused readback, subnormal
/// steps, and for 8 bits the `1e-8` that `255 / (range + 1e-8)` adds to the
/// range, which moves a value's level inward by up to `min(range, 1e-8)`
/// before it is rounded.
pub(crate) fn round_trip_bound(format: RowWise, xs: &[f32], scale: f32, bias: f32, v: f32) -> f64 {
    let (scale, bias, v) = (f64::from(scale), f64::from(bias), f64::from(v));
    let top = f64::from(levels(format));
    let (lo, hi) = {
        let far = bias + top * scale;
        (bias.min(far), bias.max(far))
    };
    let outside = (lo - v).max(v - hi).max(0.0);
    let eps = f64::from(f32::EPSILON);
    let mut slack = 4.0 * eps * (v.abs() + bias.abs() + top * scale.abs()) + 2f64.powi(-140);
    if format == RowWise::Int8 {
        let min = xs.iter().copied().fold(f32::INFINITY, f32::min);
        let max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        slack += (f64::from(max) - f64::from(min)).min(1e-8) * 1.01;
    }
    scale.abs() / 2.0 + outside + slack
}
