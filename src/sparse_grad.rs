//! A coalesced sparse gradient: [`SparseGrad`], what the sparse backward
//! kernels return and the sparse optimiser steps take.

use crate::error::{EmbeddingError, Operand};
use crate::shape::{check_len, rows_len};

/// A coalesced sparse gradient: the distinct rows a batch touched, ascending,
/// and each one's summed gradient row. Its size depends on the batch, never
/// on `num_embeddings`.
#[derive(Clone, Debug, PartialEq)]
pub struct SparseGrad {
    indices: Vec<usize>,
    values: Vec<f32>,
    num_embeddings: usize,
    embedding_dim: usize,
}

impl SparseGrad {
    /// Wraps coalesced rows: `indices` strictly ascending and below
    /// `num_embeddings`, `values` holding `indices.len() × embedding_dim`
    /// values.
    ///
    /// # Errors
    /// [`EmbeddingError::LengthMismatch`] for `values`, or
    /// [`EmbeddingError::IndexOutOfRange`] for the first index that is out of
    /// range or not above the one before it.
    pub fn new(
        indices: Vec<usize>,
        values: Vec<f32>,
        num_embeddings: usize,
        embedding_dim: usize,
    ) -> Result<SparseGrad, EmbeddingError> {
        check_len(
            Operand::GradTable,
            rows_len(indices.len(), embedding_dim)?,
            values.len(),
        )?;
        for (position, &i) in indices.iter().enumerate() {
            let ascending = position == 0 || indices[position - 1] < i;
            if i >= num_embeddings || !ascending {
                return Err(EmbeddingError::IndexOutOfRange {
                    position,
                    index: i as i128,
                    num_embeddings,
                });
            }
        }
        Ok(SparseGrad {
            indices,
            values,
            num_embeddings,
            embedding_dim,
        })
    }

    /// The touched rows, strictly ascending.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }

    /// The summed gradient rows, `indices().len() × embedding_dim`, row `k`
    /// belonging to `indices()[k]`.
    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// The touched rows and their summed gradient rows
    /// ([`indices`](Self::indices), [`values`](Self::values)), handed over
    /// without a copy.
    pub fn into_parts(self) -> (Vec<usize>, Vec<f32>) {
        (self.indices, self.values)
    }

    /// The gradient row of the `k`-th touched row (of row `indices()[k]`),
    /// or `None` if `k >= nnz_rows()`, as [`slice::get`] answers.
    pub fn row(&self, k: usize) -> Option<&[f32]> {
        if k >= self.indices.len() {
            return None;
        }
        // `k < nnz_rows()`, and `values` holds `nnz_rows() × dim` values:
        // neither product overflows.
        let dim = self.embedding_dim;
        self.values.get(k * dim..(k + 1) * dim)
    }

    /// The row count of the table this gradient is for.
    pub fn num_embeddings(&self) -> usize {
        self.num_embeddings
    }

    /// The row width.
    pub fn embedding_dim(&self) -> usize {
        self.embedding_dim
    }

    /// How many rows were touched.
    pub fn nnz_rows(&self) -> usize {
        self.indices.len()
    }

    /// The dense `num_embeddings × embedding_dim` gradient: these rows, and
    /// zeros elsewhere.
    ///
    /// # Errors
    /// [`EmbeddingError::SizeOverflow`] (`count` = `num_embeddings`) if the
    /// dense table's size overflows `usize`;
    /// [`EmbeddingError::AllocationFailed`] if its memory cannot be
    /// allocated.
    pub fn to_dense(&self) -> Result<Vec<f32>, EmbeddingError> {
        let dim = self.embedding_dim;
        let len = rows_len(self.num_embeddings, dim)?;
        let mut dense = crate::memory::zeroed_floats(len, "gradient")?;
        for (k, &r) in self.indices.iter().enumerate() {
            dense[r * dim..(r + 1) * dim].copy_from_slice(&self.values[k * dim..(k + 1) * dim]);
        }
        Ok(dense)
    }

    /// Wraps rows the kernels produced, already coalesced and in range.
    pub(crate) fn from_parts(
        indices: Vec<usize>,
        values: Vec<f32>,
        num_embeddings: usize,
        embedding_dim: usize,
    ) -> SparseGrad {
        debug_assert_eq!(indices.len() * embedding_dim, values.len());
        SparseGrad {
            indices,
            values,
            num_embeddings,
            embedding_dim,
        }
    }
}
