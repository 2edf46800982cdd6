//! The plain loops: what a first implementation would write, and the
//! baseline the benchmarks and the report measure speed-ups against.
//!
//! They take the same front door as the fast kernels (same checks, same
//! errors) and then index element by element on one thread, with no
//! prefetch and no explicit SIMD.

use crate::error::EmbeddingError;
use crate::index::Index;
use crate::kernels::{check_gather, check_scatter};
use crate::parallel::Parallelism;

/// [`gather`](crate::gather) as a plain loop.
///
/// # Errors
/// As [`gather`](crate::gather).
pub fn gather<I: Index>(
    table: &[f32],
    dim: usize,
    ids: &[I],
    out: &mut [f32],
) -> Result<(), EmbeddingError> {
    let ids = check_gather(Parallelism::Serial, table, dim, ids, out)?;
    for (i, row) in ids.rows().enumerate() {
        for j in 0..dim {
            out[i * dim + j] = table[row * dim + j];
        }
    }
    Ok(())
}

/// [`gather_scaled`](crate::gather_scaled) as a plain loop.
///
/// # Errors
/// As [`gather`](crate::gather).
pub fn gather_scaled<I: Index>(
    table: &[f32],
    dim: usize,
    ids: &[I],
    scale: f32,
    out: &mut [f32],
) -> Result<(), EmbeddingError> {
    let ids = check_gather(Parallelism::Serial, table, dim, ids, out)?;
    for (i, row) in ids.rows().enumerate() {
        for j in 0..dim {
            out[i * dim + j] = table[row * dim + j] * scale;
        }
    }
    Ok(())
}

/// [`scatter_add`](crate::scatter_add) as a plain loop.
///
/// # Errors
/// As [`scatter_add`](crate::scatter_add).
pub fn scatter_add<I: Index>(
    grad_output: &[f32],
    dim: usize,
    ids: &[I],
    grad_table: &mut [f32],
) -> Result<(), EmbeddingError> {
    let ids = check_scatter(grad_output, dim, ids, grad_table)?;
    for (i, row) in ids.rows().enumerate() {
        for j in 0..dim {
            grad_table[row * dim + j] += grad_output[i * dim + j];
        }
    }
    Ok(())
}
