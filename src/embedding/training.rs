//! The layer's training half: the backward passes (dense, sparse) and the
//! updates (fused sparse steps, a stored sparse gradient, dense SGD), each
//! checking every argument before it allocates or writes; a frozen table
//! checks the same, then changes nothing.

use super::{Embedding, Gradient};
use crate::error::{EmbeddingError, Operand};
use crate::index::{Index, RowId, ValidIds};
use crate::kernels::{self, Groups, Target, dense_backward_valid, sparse_backward_with};
use crate::optim::{Sgd, SparseOptimizer};
use crate::shape::{check_len, rows_len};
use crate::sparse_grad::SparseGrad;

impl Embedding {
    /// The gradient of the table for `grad_output` (`ids.len() ×
    /// embedding_dim`), dense or sparse as the `sparse` option says.
    ///
    /// # Errors
    /// A shape error or [`EmbeddingError::IndexOutOfRange`] (checked before
    /// anything is allocated), then [`EmbeddingError::AllocationFailed`] if
    /// the gradient or its workspace cannot be allocated.
    pub fn backward<I: Index>(
        &self,
        grad_output: &[f32],
        ids: &[I],
    ) -> Result<Gradient, EmbeddingError> {
        if self.sparse {
            self.backward_sparse(grad_output, ids).map(Gradient::Sparse)
        } else {
            self.backward_dense(grad_output, ids).map(Gradient::Dense)
        }
    }

    /// The dense gradient, in a new `num_embeddings × embedding_dim` buffer.
    ///
    /// # Errors
    /// As [`backward`](Self::backward).
    pub fn backward_dense<I: Index>(
        &self,
        grad_output: &[f32],
        ids: &[I],
    ) -> Result<Vec<f32>, EmbeddingError> {
        // Checked before the allocation, so a bad call costs nothing.
        check_len(
            Operand::GradOutput,
            rows_len(ids.len(), self.embedding_dim)?,
            grad_output.len(),
        )?;
        ValidIds::new(ids, self.num_embeddings)?;
        let mut grad = crate::memory::zeroed_floats(self.weight.len(), "gradient")?;
        self.backward_dense_into(grad_output, ids, &mut grad)?;
        Ok(grad)
    }

    /// The dense gradient, **overwriting** `grad_weight` (`num_embeddings ×
    /// embedding_dim`): every row is written once, a sum or zeros, with no
    /// separate zeroing pass.
    ///
    /// # Errors
    /// A shape error or [`EmbeddingError::IndexOutOfRange`], then
    /// [`EmbeddingError::AllocationFailed`] for the workspace; then
    /// `grad_weight` is untouched.
    pub fn backward_dense_into<I: Index>(
        &self,
        grad_output: &[f32],
        ids: &[I],
        grad_weight: &mut [f32],
    ) -> Result<(), EmbeddingError> {
        check_len(Operand::GradTable, self.weight.len(), grad_weight.len())?;
        check_len(
            Operand::GradOutput,
            rows_len(ids.len(), self.embedding_dim)?,
            grad_output.len(),
        )?;
        let valid = ValidIds::new_with(self.parallelism, ids, self.num_embeddings)?;
        dense_backward_valid(
            self.parallelism,
            grad_output,
            self.embedding_dim,
            valid.by_row(),
            self.padding_idx,
            self.scale_grad_by_freq,
            grad_weight,
        )
    }

    /// The coalesced sparse gradient: the distinct ids (less the padding
    /// row), ascending, and their summed gradient rows. Its cost does not
    /// depend on `num_embeddings`.
    ///
    /// # Errors
    /// As [`backward`](Self::backward).
    pub fn backward_sparse<I: Index>(
        &self,
        grad_output: &[f32],
        ids: &[I],
    ) -> Result<SparseGrad, EmbeddingError> {
        sparse_backward_with(
            self.parallelism,
            grad_output,
            self.embedding_dim,
            ids,
            self.num_embeddings,
            self.padding_idx,
            self.scale_grad_by_freq,
        )
    }

    /// Backward and an optimiser step in one pass over the touched rows: each
    /// distinct id's gradient is summed (as [`backward_sparse`](Self::backward_sparse)
    /// would) and applied to its row at once. No gradient is stored and
    /// untouched rows are not read. A frozen layer makes every check an
    /// unfrozen one makes (the optimiser's included), then changes nothing,
    /// the optimiser included; the padding row never changes.
    ///
    /// # Errors
    /// A shape error, [`EmbeddingError::IndexOutOfRange`], an invalid
    /// hyper-parameter, or an optimiser state made for another table (all
    /// checked before anything is allocated), then
    /// [`EmbeddingError::AllocationFailed`] for the grouping of the ids or a
    /// first step's optimiser state; then nothing has changed.
    pub fn sparse_step<I: Index, O: SparseOptimizer>(
        &mut self,
        grad_output: &[f32],
        ids: &[I],
        optimizer: &mut O,
    ) -> Result<(), EmbeddingError> {
        let dim = self.embedding_dim;
        check_len(
            Operand::GradOutput,
            rows_len(ids.len(), dim)?,
            grad_output.len(),
        )?;
        let valid = ValidIds::new_with(self.parallelism, ids, self.num_embeddings)?;
        // The optimiser's checks (a frozen table stops after them), then the
        // grouping (the one allocation besides a first step's state), then
        // the step.
        optimizer.check_step(self.num_embeddings, dim)?;
        if self.frozen {
            return Ok(());
        }
        let groups = self.step_groups(valid)?;
        self.step_grouped(grad_output, &groups, optimizer)
    }

    /// The allocating half of [`sparse_step`](Self::sparse_step): the
    /// checked ids grouped by row, less the padding row.
    pub(crate) fn step_groups<I: RowId>(
        &self,
        valid: ValidIds<'_, I>,
    ) -> Result<Groups, EmbeddingError> {
        Groups::new(valid, self.padding_idx)
    }

    /// The writing half of [`sparse_step`](Self::sparse_step), on checked
    /// arguments and their [`step_groups`](Self::step_groups): fails only
    /// as `optimizer`'s step begins (a first step's state), before any
    /// write.
    pub(crate) fn step_grouped<O: SparseOptimizer>(
        &mut self,
        grad_output: &[f32],
        groups: &Groups,
        optimizer: &mut O,
    ) -> Result<(), EmbeddingError> {
        let dim = self.embedding_dim;
        let (rule, state) = optimizer.begin_step(self.num_embeddings, dim)?;
        let target = Target {
            weight: &mut self.weight,
            dim,
            state,
        };
        kernels::fused_update(
            self.parallelism,
            grad_output,
            groups,
            self.scale_grad_by_freq,
            target,
            &rule,
        );
        Ok(())
    }

    /// Applies a coalesced gradient (from [`backward_sparse`](Self::backward_sparse))
    /// with `optimizer`: the same bits as [`sparse_step`](Self::sparse_step)
    /// on the batch it came from. A frozen layer checks as
    /// [`sparse_step`](Self::sparse_step) does, then changes nothing.
    ///
    /// # Errors
    /// [`EmbeddingError::LengthMismatch`] if `grad` is for another table
    /// shape, or an optimiser error (an invalid hyper-parameter, a state
    /// made for another table), then
    /// [`EmbeddingError::AllocationFailed`] for the workspace or a first
    /// step's optimiser state; then nothing has changed.
    pub fn apply_sparse<O: SparseOptimizer>(
        &mut self,
        grad: &SparseGrad,
        optimizer: &mut O,
    ) -> Result<(), EmbeddingError> {
        let dim = self.embedding_dim;
        for (expected, got) in [
            (self.num_embeddings, grad.num_embeddings()),
            (dim, grad.embedding_dim()),
        ] {
            // The gradient's shape ([rows, dim]) must be the table's.
            check_len(Operand::GradTable, expected, got)?;
        }
        optimizer.check_step(self.num_embeddings, dim)?;
        if self.frozen {
            return Ok(());
        }
        let groups = kernels::sparse_groups(grad, self.padding_idx)?;
        let (rule, state) = optimizer.begin_step(self.num_embeddings, dim)?;
        let target = Target {
            weight: &mut self.weight,
            dim,
            state,
        };
        kernels::apply_sparse(self.parallelism, grad, &groups, target, &rule);
        Ok(())
    }

    /// One dense SGD step with a dense gradient (`num_embeddings ×
    /// embedding_dim`); the padding row and a frozen table stay as they are.
    ///
    /// # Errors
    /// [`EmbeddingError::LengthMismatch`] or an invalid hyper-parameter;
    /// then nothing has changed.
    pub fn dense_sgd_step(&mut self, grad: &[f32], sgd: &Sgd) -> Result<(), EmbeddingError> {
        check_len(Operand::GradTable, self.weight.len(), grad.len())?;
        sgd.validate()?;
        if self.frozen {
            return Ok(());
        }
        match self.padding_idx {
            None => sgd.step_dense(&mut self.weight, grad),
            Some(p) => {
                let dim = self.embedding_dim;
                let (before, rest) = self.weight.split_at_mut(p * dim);
                let after = &mut rest[dim..];
                sgd.step_dense(before, &grad[..p * dim])?;
                sgd.step_dense(after, &grad[(p + 1) * dim..])
            }
        }
    }
}
