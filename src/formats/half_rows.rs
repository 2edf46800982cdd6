//! `f16` and `bf16` tables from and to `f32`: round to nearest, ties to
//! even, as PyTorch's `.half()` and `.bfloat16()` do. The `half` crate does
//! the work (with F16C instructions where the CPU has them).

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// The table as `f16`s, each value rounded to nearest, ties to even.
pub fn to_f16(table: &[f32]) -> Vec<f16> {
    let mut out = vec![f16::ZERO; table.len()];
    out.convert_from_f32_slice(table);
    out
}

/// The table as `bf16`s, each value rounded to nearest, ties to even.
pub fn to_bf16(table: &[f32]) -> Vec<bf16> {
    let mut out = vec![bf16::ZERO; table.len()];
    out.convert_from_f32_slice(table);
    out
}

/// An `f16` table back to `f32`s (exact).
pub fn f16_to_f32(table: &[f16]) -> Vec<f32> {
    table.to_f32_vec()
}

/// A `bf16` table back to `f32`s (exact: a `bf16` is the top half of an
/// `f32`'s bits, so every value, signalling NaNs included, keeps its bits).
pub fn bf16_to_f32(table: &[bf16]) -> Vec<f32> {
    table
        .iter()
        .map(|h| f32::from_bits(u32::from(h.to_bits()) << 16))
        .collect()
}
