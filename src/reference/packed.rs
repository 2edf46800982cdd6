//! The oracle for row-wise quantized tables: a bag sum computed term by term
//! with FBGEMM's rule, the contract PyTorch's quantized bags hold to.
//!
//! ```text
//! out[b, :] = +0.0
//! for p in bag b, in order:   (w = per_sample_weights[p], or 1)
//!     (scale, bias) = the row's; q = its levels
//!     out[b, c] = fma(w · scale, q[c], out[b, c] + w · bias)
//! ```
//!
//! `w · scale` and `w · bias` are each rounded once, the fused multiply-add
//! once: `f32::mul_add`, which gives the same bits on every machine.

use crate::bags::Bags;
use crate::error::{EmbeddingError, Operand};
use crate::formats::PackedTable;
use crate::index::Index;

/// The sum of each bag's rows of a packed table, `bags.len() × dim` values.
///
/// # Errors
/// [`EmbeddingError::LengthMismatch`] if `ids` or `per_sample_weights` do
/// not match the bags, [`EmbeddingError::SizeOverflow`] if the output cannot
/// be sized, or [`EmbeddingError::IndexOutOfRange`] for the first bad id;
/// [`EmbeddingError::AllocationFailed`] if its buffers cannot be allocated.
pub fn packed_bag_sum<I: Index>(
    table: &PackedTable<'_>,
    ids: &[I],
    bags: &Bags,
    per_sample_weights: Option<&[f32]>,
) -> Result<Vec<f32>, EmbeddingError> {
    let dim = table.dim();
    if ids.len() != bags.num_ids() {
        return Err(EmbeddingError::LengthMismatch {
            operand: Operand::Ids,
            expected: bags.num_ids(),
            got: ids.len(),
        });
    }
    if let Some(w) = per_sample_weights
        && w.len() != ids.len()
    {
        return Err(EmbeddingError::LengthMismatch {
            operand: Operand::PerSampleWeights,
            expected: ids.len(),
            got: w.len(),
        });
    }
    let len = bags
        .len()
        .checked_mul(dim)
        .ok_or(EmbeddingError::SizeOverflow {
            count: bags.len(),
            dim,
        })?;
    let mut rows = crate::buffer::with_capacity(ids.len(), "rows")?;
    for (position, id) in ids.iter().enumerate() {
        let index = id.to_i128();
        if index < 0 || index >= table.rows() as i128 {
            return Err(EmbeddingError::IndexOutOfRange {
                position,
                index,
                num_embeddings: table.rows(),
            });
        }
        rows.push(index as usize);
    }
    let mut out = crate::buffer::zeroed::<f32>(len, "output")?;
    for b in 0..bags.len() {
        let acc = &mut out[b * dim..(b + 1) * dim];
        for p in bags.range(b) {
            let r = rows[p];
            let w = per_sample_weights.map_or(1.0, |w| w[p]);
            let (scale, bias) = table.scale_bias(r).expect("a checked row");
            let (ws, wb) = (w * scale, w * bias);
            for (c, a) in acc.iter_mut().enumerate() {
                let q = f32::from(table.code(r, c).expect("a checked row"));
                *a = ws.mul_add(q, *a + wb);
            }
        }
    }
    Ok(out)
}
