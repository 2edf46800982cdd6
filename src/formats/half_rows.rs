//! `f16` and `bf16` tables from and to `f32`: round to nearest, ties to
//! even, as PyTorch's `.half()` and `.bfloat16()` do. The `half` crate does
//! the work (with F16C instructions where the CPU has them).
//! Each allocates its result fallibly: a table the allocator refuses is
//! an error, not an abort.

use crate::buffer::{with_capacity, zeroed};
use crate::error::EmbeddingError;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// The table as `f16`s, each value rounded to nearest, ties to even.
///
/// # Errors
/// [`EmbeddingError::AllocationFailed`] if the result cannot be allocated.
pub fn to_f16(table: &[f32]) -> Result<Vec<f16>, EmbeddingError> {
    let mut out = zeroed::<f16>(table.len(), "table")?;
    out.convert_from_f32_slice(table);
    Ok(out)
}

/// The table as `bf16`s, each value rounded to nearest, ties to even.
///
/// # Errors
/// [`EmbeddingError::AllocationFailed`] if the result cannot be allocated.
pub fn to_bf16(table: &[f32]) -> Result<Vec<bf16>, EmbeddingError> {
    let mut out = zeroed::<bf16>(table.len(), "table")?;
    out.convert_from_f32_slice(table);
    Ok(out)
}

/// An `f16` table back to `f32`s (exact).
///
/// # Errors
/// [`EmbeddingError::AllocationFailed`] if the result cannot be allocated.
pub fn f16_to_f32(table: &[f16]) -> Result<Vec<f32>, EmbeddingError> {
    let mut out = zeroed::<f32>(table.len(), "table")?;
    table.convert_to_f32_slice(&mut out);
    Ok(out)
}

/// A `bf16` table back to `f32`s (exact: a `bf16` is the top half of an
/// `f32`'s bits, so every value, signalling NaNs included, keeps its bits).
///
/// # Errors
/// [`EmbeddingError::AllocationFailed`] if the result cannot be allocated.
pub fn bf16_to_f32(table: &[bf16]) -> Result<Vec<f32>, EmbeddingError> {
    let mut out = with_capacity(table.len(), "table")?;
    out.extend(
        table
            .iter()
            .map(|h| f32::from_bits(u32::from(h.to_bits()) << 16)),
    );
    Ok(out)
}
