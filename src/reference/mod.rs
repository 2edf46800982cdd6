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
//! Every argument check is written here again, independently of the
//! kernels' (nothing below imports from them), in the order
//! [`error`](crate::error) documents: the tests compare the two, so a check
//! the kernels drop or reorder shows up as a different error. The ids are
//! checked by [`check_ids`], comparing signed values.
//!
//! The matrices are allocated after every check, fallibly: a call whose
//! one-hot matrix the allocator refuses (a huge `num_embeddings`) returns
//! [`EmbeddingError::AllocationFailed`] where the kernel, which needs no
//! such matrix, may succeed.

pub mod loops;
mod packed;

pub use packed::packed_bag_sum;

use crate::bags::Bags;
use crate::buffer::{with_capacity, zeroed};
use crate::error::{EmbeddingError, Operand};
use crate::index::Index;
use crate::pooling::{Mode, Pooling};

/// The rows of a table of `len` values and width `dim`: a table with
/// `dim == 0` must be empty (and has no rows), any other a whole number of
/// rows.
fn table_rows(len: usize, dim: usize, operand: Operand) -> Result<usize, EmbeddingError> {
    match (dim, len) {
        (0, 0) => Ok(0),
        (0, len) => Err(EmbeddingError::ZeroDimWithData { operand, len }),
        (dim, len) if len % dim != 0 => Err(EmbeddingError::NotMultipleOfDim { operand, len, dim }),
        (dim, len) => Ok(len / dim),
    }
}

/// `count × dim`, or [`EmbeddingError::SizeOverflow`].
fn rows_len(count: usize, dim: usize) -> Result<usize, EmbeddingError> {
    match count.checked_mul(dim) {
        Some(len) => Ok(len),
        None => Err(EmbeddingError::SizeOverflow { count, dim }),
    }
}

/// [`EmbeddingError::LengthMismatch`] unless `got == expected`.
fn check_len(operand: Operand, expected: usize, got: usize) -> Result<(), EmbeddingError> {
    if got != expected {
        return Err(EmbeddingError::LengthMismatch {
            operand,
            expected,
            got,
        });
    }
    Ok(())
}

/// Every id against `num_embeddings`, first to last, as signed values.
///
/// # Errors
/// [`EmbeddingError::IndexOutOfRange`] for the first id that is negative or
/// not below `num_embeddings`.
pub fn check_ids<I: Index>(ids: &[I], num_embeddings: usize) -> Result<(), EmbeddingError> {
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
    Ok(())
}

/// The `ids.len() × num_embeddings` matrix with a 1 at `(i, ids[i])` and
/// zeros elsewhere, row-major.
///
/// # Errors
/// [`EmbeddingError::SizeOverflow`] if the matrix cannot be sized,
/// [`EmbeddingError::IndexOutOfRange`] for the first id that is negative or
/// not below `num_embeddings`, then [`EmbeddingError::AllocationFailed`] if
/// the matrix cannot be allocated (a huge `num_embeddings` asks for
/// `4 × ids × num_embeddings` bytes).
pub fn one_hot<I: Index>(ids: &[I], num_embeddings: usize) -> Result<Vec<f32>, EmbeddingError> {
    let len = rows_len(ids.len(), num_embeddings)?;
    check_ids(ids, num_embeddings)?;
    let mut m = zeroed::<f32>(len, "one-hot matrix")?;
    for (i, &id) in ids.iter().enumerate() {
        m[i * num_embeddings + id.to_i128() as usize] = 1.0;
    }
    Ok(m)
}

/// `C = A · B` for row-major `A` (`m × k`) and `B` (`k × n`), the textbook
/// triple loop. Sums start at `-0.0` and zero entries of `A` are skipped (see
/// the module notes).
///
/// # Errors
/// [`EmbeddingError::SizeOverflow`] if a shape's product overflows, then
/// [`EmbeddingError::LengthMismatch`] ([`Operand::MatrixA`],
/// [`Operand::MatrixB`]) if a slice does not have the length its shape
/// implies, then [`EmbeddingError::AllocationFailed`] if `C` cannot be
/// allocated.
pub fn matmul(
    a: &[f32],
    b: &[f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<Vec<f32>, EmbeddingError> {
    product(a, b, m, k, n, false)
}

/// [`matmul`], each term rounded once (`c = fma(a, b, c)`) where `fused`.
fn product(
    a: &[f32],
    b: &[f32],
    m: usize,
    k: usize,
    n: usize,
    fused: bool,
) -> Result<Vec<f32>, EmbeddingError> {
    check_len(Operand::MatrixA, rows_len(m, k)?, a.len())?;
    check_len(Operand::MatrixB, rows_len(k, n)?, b.len())?;
    let mut c = with_capacity(rows_len(m, n)?, "matrix product")?;
    c.resize(m * n, -0.0);
    for i in 0..m {
        for l in 0..k {
            let a_il = a[i * k + l];
            if a_il == 0.0 {
                continue;
            }
            for j in 0..n {
                let (x, sum) = (b[l * n + j], c[i * n + j]);
                c[i * n + j] = if fused {
                    a_il.mul_add(x, sum)
                } else {
                    sum + a_il * x
                };
            }
        }
    }
    Ok(c)
}

/// `C += Aᵀ · B` for row-major `A` (`m × k`), `B` (`m × n`) and `C`
/// (`k × n`), accumulating in the order `i = 0, 1, …, m - 1`. Zero entries
/// of `A` are skipped.
///
/// # Errors
/// [`EmbeddingError::SizeOverflow`] if a shape's product overflows, then
/// [`EmbeddingError::LengthMismatch`] ([`Operand::MatrixA`],
/// [`Operand::MatrixB`], [`Operand::MatrixC`]) if a slice does not have the
/// length its shape implies; then `c` is untouched.
pub fn matmul_tn_acc(
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<(), EmbeddingError> {
    check_len(Operand::MatrixA, rows_len(m, k)?, a.len())?;
    check_len(Operand::MatrixB, rows_len(m, n)?, b.len())?;
    check_len(Operand::MatrixC, rows_len(k, n)?, c.len())?;
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
    Ok(())
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
    matmul(&hot, table, ids.len(), rows, dim)
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
    matmul_tn_acc(&hot, grad_output, grad_table, ids.len(), rows, dim)
}

/// The `bags × ids` bag matrix of a sum or mean bag call: entry `(b, p)` is
/// position `p`'s coefficient in bag `b` — its per-sample weight (sum with
/// weights), 1 (sum), or `1 / n` (mean, `n` the bag's ids other than
/// `padding_idx` — and 0 where `p` is outside bag `b` or holds
/// `padding_idx`. Positions past the last bag have an all-zero column.
///
/// # Errors
/// In the order of the bag calls: [`EmbeddingError::LengthMismatch`]
/// ([`Operand::Ids`]) unless `ids` are as many as the bags were made for,
/// [`EmbeddingError::PerSampleWeightsNeedSum`] for weights with another
/// mode, [`EmbeddingError::LengthMismatch`]
/// ([`Operand::PerSampleWeights`]) unless they are one per id; then
/// [`EmbeddingError::InvalidArgument`] (`mode`) for max, whose pooling is
/// no matrix product, and [`EmbeddingError::SizeOverflow`] if the matrix
/// cannot be sized.
pub fn bag_matrix<I: Index>(
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
) -> Result<Vec<f32>, EmbeddingError> {
    check_len(Operand::Ids, bags.num_ids(), ids.len())?;
    if let Some(weights) = pooling.per_sample_weights {
        if pooling.mode != Mode::Sum {
            return Err(EmbeddingError::PerSampleWeightsNeedSum { mode: pooling.mode });
        }
        check_len(Operand::PerSampleWeights, ids.len(), weights.len())?;
    }
    if pooling.mode == Mode::Max {
        return Err(EmbeddingError::InvalidArgument {
            name: "mode",
            value: Mode::Max.to_string(),
            requirement: "sum or mean (max pooling is no matrix product)",
        });
    }
    let n = ids.len();
    let mut m = zeroed::<f32>(rows_len(bags.len(), n)?, "bag matrix")?;
    let padding = pooling.padding_idx.map(|p| p as i128);
    for (b, bag) in bags.iter().enumerate() {
        let kept: Vec<usize> = bag.filter(|&p| Some(ids[p].to_i128()) != padding).collect();
        for &p in &kept {
            m[b * n + p] = match (pooling.mode, pooling.per_sample_weights) {
                (Mode::Mean, _) => 1.0 / kept.len() as f32,
                (_, Some(w)) => w[p],
                (_, None) => 1.0,
            };
        }
    }
    Ok(m)
}

/// [`bag_forward`](crate::bag_forward) as
/// `bag_matrix · (one_hot(ids) · table)` for sum and mean (empty bags set to
/// `+0.0`, the zeros of the contract), and as a plain loop for max (first
/// strictly largest value per column; -1 and zeros for an empty bag).
///
/// Sum with weights has the kernel's bits (each weighted row fused into the
/// sum without a `padding_idx`, rounded first with one) when no weight is 0 (the matrix product
/// skips zero coefficients; the kernel adds `0 × x`); mean differs
/// from the kernel in rounding (`Σ x / n` there, `Σ x · (1/n)` here).
///
/// # Errors
/// The same errors as the kernel, in the same order.
pub fn bag_forward<I: Index>(
    table: &[f32],
    dim: usize,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    out: &mut [f32],
    max_indices: &mut [i64],
) -> Result<(), EmbeddingError> {
    let rows = check_bag_arguments(table.len(), Operand::Table, dim, ids, bags, pooling)?;
    let out_len = rows_len(bags.len(), dim)?;
    check_len(Operand::Output, out_len, out.len())?;
    if pooling.mode == Mode::Max {
        check_len(Operand::MaxIndices, out_len, max_indices.len())?;
        // The kernel's limit (its winners' positions ride in 32 bits); the
        // loop below has none, but the errors must match.
        let max = 1u64 << 32;
        if let Some(bag) = (0..bags.len()).find(|&b| bags.range(b).len() as u64 > max) {
            let len = bags.range(bag).len();
            return Err(EmbeddingError::BagTooLong { bag, len, max });
        }
    }
    check_ids(ids, rows)?;
    let gathered = matmul(&one_hot(ids, rows)?, table, ids.len(), rows, dim)?;
    if pooling.mode == Mode::Max {
        for b in 0..bags.len() {
            for j in 0..dim {
                let mut best: Option<(f32, usize)> = None;
                for p in bags.range(b) {
                    if Some(ids[p].to_i128()) == pooling.padding_idx.map(|p| p as i128) {
                        continue;
                    }
                    let x = gathered[p * dim + j];
                    if best.is_none_or(|(v, _)| x > v) {
                        best = Some((x, p));
                    }
                }
                let (v, i) = best.map_or((0.0, -1), |(v, p)| (v, ids[p].to_i128() as i64));
                out[b * dim + j] = v;
                max_indices[b * dim + j] = i;
            }
        }
        return Ok(());
    }
    let m = bag_matrix(ids, bags, pooling)?;
    // Weighted rows are fused into the sums, as the kernel (and PyTorch)
    // adds them where no padding_idx is set.
    let fused = pooling.per_sample_weights.is_some() && pooling.padding_idx.is_none();
    let pooled = product(&m, &gathered, bags.len(), ids.len(), dim, fused)?;
    for b in 0..bags.len() {
        let empty = (0..ids.len()).all(|p| m[b * ids.len() + p] == 0.0);
        for j in 0..dim {
            out[b * dim + j] = if empty { 0.0 } else { pooled[b * dim + j] };
        }
    }
    Ok(())
}

/// The checks a bag call makes before its buffers: the table (`table_len`
/// values, named `operand`), the ids' count against the bags',
/// `per_sample_weights` (sum mode only, one per id) and `padding_idx` (a row
/// of the table). Returns the table's rows.
fn check_bag_arguments<I: Index>(
    table_len: usize,
    operand: Operand,
    dim: usize,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
) -> Result<usize, EmbeddingError> {
    let rows = table_rows(table_len, dim, operand)?;
    check_len(Operand::Ids, bags.num_ids(), ids.len())?;
    if let Some(weights) = pooling.per_sample_weights {
        if pooling.mode != Mode::Sum {
            return Err(EmbeddingError::PerSampleWeightsNeedSum { mode: pooling.mode });
        }
        check_len(Operand::PerSampleWeights, ids.len(), weights.len())?;
    }
    match pooling.padding_idx {
        Some(padding_idx) if padding_idx >= rows => Err(EmbeddingError::PaddingIdxOutOfRange {
            padding_idx: i64::try_from(padding_idx).unwrap_or(i64::MAX),
            num_embeddings: rows,
        }),
        _ => Ok(rows),
    }
}

/// The sum or mean bag backward as `grad_table += one_hotᵀ · (bag_matrixᵀ ·
/// grad_bags)`, accumulating (start from zeros for the kernel's
/// overwriting dense backward).
///
/// # Errors
/// The same errors as [`bag_backward_with`](crate::bag_backward_with).
pub fn bag_backward<I: Index>(
    grad_bags: &[f32],
    dim: usize,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    grad_table: &mut [f32],
) -> Result<(), EmbeddingError> {
    // The gradient's shape first (its rows are the table's), then the
    // forward's arguments, the ids, and last the mode.
    let rows = table_rows(grad_table.len(), dim, Operand::GradTable)?;
    check_len(
        Operand::GradOutput,
        rows_len(bags.len(), dim)?,
        grad_bags.len(),
    )?;
    check_bag_arguments(
        grad_table.len(),
        Operand::GradTable,
        dim,
        ids,
        bags,
        pooling,
    )?;
    check_ids(ids, rows)?;
    if pooling.mode == Mode::Max {
        return Err(EmbeddingError::MaxNeedsIndices);
    }
    let m = bag_matrix(ids, bags, pooling)?;
    let mut per_id = zeroed::<f32>(rows_len(ids.len(), dim)?, "gradient")?;
    matmul_tn_acc(&m, grad_bags, &mut per_id, bags.len(), ids.len(), dim)?;
    let hot = one_hot(ids, rows)?;
    if !pooling.scale_grad_by_freq {
        return matmul_tn_acc(&hot, &per_id, grad_table, ids.len(), rows, dim);
    }
    // Each row's sum divided by its id's count among the kept positions.
    let mut sums = zeroed::<f32>(grad_table.len(), "gradient")?;
    matmul_tn_acc(&hot, &per_id, &mut sums, ids.len(), rows, dim)?;
    let mut counts = zeroed::<usize>(rows, "counts")?;
    for b in 0..bags.len() {
        for p in bags.range(b) {
            if Some(ids[p].to_i128()) != pooling.padding_idx.map(|p| p as i128) {
                counts[ids[p].to_i128() as usize] += 1;
            }
        }
    }
    for (r, &count) in counts.iter().enumerate() {
        for j in 0..dim {
            let sum = if count > 1 {
                sums[r * dim + j] / count as f32
            } else {
                sums[r * dim + j]
            };
            grad_table[r * dim + j] += sum;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_matches_hand_computed_product() {
        // [1 2; 3 4] · [5 6; 7 8] = [19 22; 43 50]
        assert_eq!(
            matmul(&[1., 2., 3., 4.], &[5., 6., 7., 8.], 2, 2, 2).unwrap(),
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
