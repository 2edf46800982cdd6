//! The oracle: embedding lookups computed literally as matrix products with a
//! one-hot matrix. Slow on purpose (`O(ids × rows × dim)` memory and time for
//! the one-hot matrix) and obviously right.
//!
//! ```text
//! gather:      out        = one_hot(ids) · table
//! scatter_add: grad_table = grad_table + one_hot(ids)ᵀ · grad_output
//! ```
//!
//! Two details make "obviously right" also "bitwise comparable":
//!
//! * [`matmul`] starts each sum at `-0.0`, the exact additive identity of
//!   IEEE arithmetic (`-0.0 + x` is `x` for every `x`, `+0.0` and `-0.0`
//!   included), and skips zero coefficients of the left matrix, as the
//!   Netlib reference `SGEMM` does. A one-hot row then contributes exactly
//!   `1 · table[id, j]`, and the zeros never turn an `inf` elsewhere in the
//!   table into `0 · inf = NaN`.
//! * [`matmul_tn_acc`] accumulates into its output in the order of the
//!   left matrix's rows, so the gradient of a row is summed in position
//!   order, the order the sequential loop uses.
//!
//! The shape checks are the crate's own (they are a few comparisons); the
//! ids are checked independently, by [`one_hot`] comparing signed values.

use crate::error::{EmbeddingError, Operand};
use crate::index::Index;
use crate::shape::{check_len, rows_len, table_rows};

/// The `ids.len() × num_embeddings` matrix with a 1 at `(i, ids[i])` and
/// zeros elsewhere, row-major.
///
/// # Errors
/// [`EmbeddingError::SizeOverflow`] if the matrix cannot be sized, and
/// [`EmbeddingError::IndexOutOfRange`] for the first id that is negative or
/// not below `num_embeddings`.
pub fn one_hot<I: Index>(ids: &[I], num_embeddings: usize) -> Result<Vec<f32>, EmbeddingError> {
    let len = rows_len(ids.len(), num_embeddings)?;
    for (position, &id) in ids.iter().enumerate() {
        let index = id.to_i128();
        if index < 0 || index >= num_embeddings as i128 {
            return Err(EmbeddingError::IndexOutOfRange {
                position,
                index,
                num_embeddings,
            });
        }
    }
    let mut m = vec![0.0; len];
    for (i, &id) in ids.iter().enumerate() {
        m[i * num_embeddings + id.to_i128() as usize] = 1.0;
    }
    Ok(m)
}

/// `C = A · B` for row-major `A` (`m × k`) and `B` (`k × n`), the textbook
/// triple loop. Sums start at `-0.0` and zero entries of `A` are skipped (see
/// the module notes).
///
/// # Panics
/// If `a.len() != m * k` or `b.len() != k * n`.
pub fn matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    assert_eq!(a.len(), m * k, "A is not m × k");
    assert_eq!(b.len(), k * n, "B is not k × n");
    let mut c = vec![-0.0; m * n];
    for i in 0..m {
        for l in 0..k {
            let a_il = a[i * k + l];
            if a_il == 0.0 {
                continue;
            }
            for j in 0..n {
                c[i * n + j] += a_il * b[l * n + j];
            }
        }
    }
    c
}

/// `C += Aᵀ · B` for row-major `A` (`m × k`), `B` (`m × n`) and `C`
/// (`k × n`), accumulating in the order `i = 0, 1, …, m - 1`. Zero entries
/// of `A` are skipped.
///
/// # Panics
/// If a slice does not have the length its shape implies.
pub fn matmul_tn_acc(a: &[f32], b: &[f32], c: &mut [f32], m: usize, k: usize, n: usize) {
    assert_eq!(a.len(), m * k, "A is not m × k");
    assert_eq!(b.len(), m * n, "B is not m × n");
    assert_eq!(c.len(), k * n, "C is not k × n");
    for i in 0..m {
        for l in 0..k {
            let a_il = a[i * k + l];
            if a_il == 0.0 {
                continue;
            }
            for j in 0..n {
                c[l * n + j] += a_il * b[i * n + j];
            }
        }
    }
}

/// [`gather`](crate::gather) as `one_hot(ids) · table`.
///
/// # Errors
/// The same errors as [`gather`](crate::gather), in the same order.
pub fn gather<I: Index>(
    table: &[f32],
    dim: usize,
    ids: &[I],
    out: &mut [f32],
) -> Result<(), EmbeddingError> {
    let product = gather_product(table, dim, ids, out)?;
    out.copy_from_slice(&product);
    Ok(())
}

/// [`gather_scaled`](crate::gather_scaled) as `(one_hot(ids) · table) × scale`.
///
/// # Errors
/// The same errors as [`gather`](crate::gather), in the same order.
pub fn gather_scaled<I: Index>(
    table: &[f32],
    dim: usize,
    ids: &[I],
    scale: f32,
    out: &mut [f32],
) -> Result<(), EmbeddingError> {
    let product = gather_product(table, dim, ids, out)?;
    for (o, p) in out.iter_mut().zip(product) {
        *o = p * scale;
    }
    Ok(())
}

fn gather_product<I: Index>(
    table: &[f32],
    dim: usize,
    ids: &[I],
    out: &[f32],
) -> Result<Vec<f32>, EmbeddingError> {
    let rows = table_rows(table.len(), dim, Operand::Table)?;
    check_len(Operand::Output, rows_len(ids.len(), dim)?, out.len())?;
    let hot = one_hot(ids, rows)?;
    Ok(matmul(&hot, table, ids.len(), rows, dim))
}

/// [`scatter_add`](crate::scatter_add) as
/// `grad_table += one_hot(ids)ᵀ · grad_output`.
///
/// # Errors
/// The same errors as [`scatter_add`](crate::scatter_add), in the same order.
pub fn scatter_add<I: Index>(
    grad_output: &[f32],
    dim: usize,
    ids: &[I],
    grad_table: &mut [f32],
) -> Result<(), EmbeddingError> {
    let rows = table_rows(grad_table.len(), dim, Operand::GradTable)?;
    check_len(
        Operand::GradOutput,
        rows_len(ids.len(), dim)?,
        grad_output.len(),
    )?;
    let hot = one_hot(ids, rows)?;
    matmul_tn_acc(&hot, grad_output, grad_table, ids.len(), rows, dim);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_matches_hand_computed_product() {
        // [1 2; 3 4] · [5 6; 7 8] = [19 22; 43 50]
        assert_eq!(
            matmul(&[1., 2., 3., 4.], &[5., 6., 7., 8.], 2, 2, 2),
            [19., 22., 43., 50.]
        );
    }

    #[test]
    fn one_hot_gather_keeps_negative_zero_and_ignores_inf_elsewhere() {
        let table = [-0.0, f32::INFINITY, 2.0, 3.0];
        let mut out = [9.0f32; 2];
        gather(&table, 2, &[1u32], &mut out).unwrap();
        assert_eq!(out, [2.0, 3.0]);
        gather(&table, 2, &[0u32], &mut out).unwrap();
        assert_eq!(out[0].to_bits(), (-0.0f32).to_bits());
        assert_eq!(out[1], f32::INFINITY);
    }
}
