//! The bag layer: PyTorch's `nn.EmbeddingBag`, argument for argument, on the
//! bag kernels ([`bag_forward`](crate::bag_forward) and its backward).
//!
//! | PyTorch | here |
//! | --- | --- |
//! | `nn.EmbeddingBag(n, d, mode="sum")` | [`EmbeddingBag::with_options`]`(n, d, EmbeddingBagOptions { mode: Mode::Sum, .. })` |
//! | `bag(input, offsets)` (1-D input) | [`EmbeddingBag::forward`]`(&ids, &bag.offsets(&offsets, ids.len())?, None)` |
//! | `bag(input)` (2-D input `[B, N]`) | the same with [`Bags::fixed`]`(B, N)` |
//! | `bag(input, offsets, per_sample_weights=w)` | `forward(&ids, &bags, Some(&w))` (sum only) |
//! | `weight.grad` | [`EmbeddingBag::backward`] (dense, or sparse with `sparse: true`) |
//! | sparse grads + an optimiser step | [`EmbeddingBag::sparse_step`], fused (sum and mean) |
//!
//! The options mean what they mean in PyTorch: `mode` (default mean),
//! `padding_idx` (left out of every bag and of mean's count; its row gets
//! no gradient), `max_norm` / `norm_type` (each looked-up row renormalised
//! in place first, as [`Embedding`] does), `scale_grad_by_freq` (sum and
//! mean), `sparse` and `include_last_offset`. An empty bag gives zeros in
//! every mode, and max mode's indices are -1 for it.
//!
//! As for [`Embedding`], ids are checked against the layer's
//! `num_embeddings` in every entry point (a layer of width 0 included), and
//! a frozen table checks every argument, the optimiser's included, before
//! it skips the update. Every backward entry point checks in one order,
//! whatever the mode: `grad_weight` (the `_into` form), `grad_output`, the
//! ids' count against the bags, `per_sample_weights`, every id, then max
//! mode's `max_indices`.

use crate::bags::Bags;
use crate::embedding::{Embedding, EmbeddingOptions, Gradient};
use crate::error::{EmbeddingError, Operand};
use crate::index::{Index, UncheckedIds, ValidIds, check_splits};
use crate::kernels::{
    CallIds, bag_backward_valid, bag_max_backward, bag_sparse_backward_with, bag_step,
    check_backward_rows, check_forward_rows, check_forward_shapes, check_forward_unallocated,
    forward_valid, forward_valid_fresh, fresh_outputs,
};
use crate::optim::SparseOptimizer;
use crate::parallel::{Parallelism, in_pool};
use crate::pooling::{Mode, Pooling};
use crate::shape::{check_len, rows_len};
use crate::sparse_grad::SparseGrad;

/// The options of `nn.EmbeddingBag`, with PyTorch's names and defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddingBagOptions {
    /// How each bag is pooled. Default: mean, as in PyTorch.
    pub mode: Mode,
    /// A row left out of every bag; negative counts from the end.
    pub padding_idx: Option<i64>,
    /// Renormalise looked-up rows whose norm exceeds this.
    pub max_norm: Option<f32>,
    /// The `p` of the norm for `max_norm` (default 2).
    pub norm_type: f32,
    /// Divide each row's gradient by its id's count in the batch (sum and
    /// mean only).
    pub scale_grad_by_freq: bool,
    /// [`EmbeddingBag::backward`] returns a sparse gradient.
    pub sparse: bool,
    /// `offsets` carry the end of the last bag as their last entry.
    pub include_last_offset: bool,
    /// The seed of the N(0, 1) initialisation; none draws one.
    pub seed: Option<u64>,
}

impl Default for EmbeddingBagOptions {
    fn default() -> Self {
        EmbeddingBagOptions {
            mode: Mode::Mean,
            padding_idx: None,
            max_norm: None,
            norm_type: 2.0,
            scale_grad_by_freq: false,
            sparse: false,
            include_last_offset: false,
            seed: None,
        }
    }
}

impl EmbeddingBagOptions {
    /// The options the table itself keeps.
    fn table_options(&self) -> EmbeddingOptions {
        EmbeddingOptions {
            padding_idx: self.padding_idx,
            max_norm: self.max_norm,
            norm_type: self.norm_type,
            scale_grad_by_freq: self.scale_grad_by_freq,
            sparse: self.sparse,
            seed: self.seed,
        }
    }
}

/// The result of [`EmbeddingBag::forward`].
#[derive(Clone, Debug, PartialEq)]
pub struct BagOutput {
    /// One pooled row per bag, `bags × embedding_dim`.
    pub values: Vec<f32>,
    /// `[bags, embedding_dim]`.
    pub shape: [usize; 2],
    /// Max mode: the id behind every output value (-1 in an empty bag);
    /// what [`EmbeddingBag::backward`] needs back.
    pub max_indices: Option<Vec<i64>>,
}

/// An embedding-bag layer; see the [module notes](self).
///
/// Cloning copies the table, and running out of memory for it aborts, as it
/// does for a `Vec`; [`try_clone`](Self::try_clone) returns an error instead.
#[derive(Clone, Debug)]
pub struct EmbeddingBag {
    table: Embedding,
    mode: Mode,
    include_last_offset: bool,
}

impl EmbeddingBag {
    /// A `num_embeddings × embedding_dim` table drawn from N(0, 1), mean mode.
    ///
    /// # Errors
    /// [`EmbeddingError::SizeOverflow`] if the table cannot be sized,
    /// [`EmbeddingError::AllocationFailed`] if its memory cannot be
    /// allocated.
    pub fn new(
        num_embeddings: usize,
        embedding_dim: usize,
    ) -> Result<EmbeddingBag, EmbeddingError> {
        EmbeddingBag::with_options(
            num_embeddings,
            embedding_dim,
            EmbeddingBagOptions::default(),
        )
    }

    /// A table drawn from N(0, 1) (the padding row zeroed) with these
    /// options; a seed gives the same bits as [`Embedding::with_options`].
    ///
    /// # Errors
    /// A size or option error, then [`EmbeddingError::AllocationFailed`] if
    /// the table's memory cannot be allocated.
    pub fn with_options(
        num_embeddings: usize,
        embedding_dim: usize,
        options: EmbeddingBagOptions,
    ) -> Result<EmbeddingBag, EmbeddingError> {
        check_options(&options)?;
        let table =
            Embedding::with_options(num_embeddings, embedding_dim, options.table_options())?;
        Ok(EmbeddingBag {
            table,
            mode: options.mode,
            include_last_offset: options.include_last_offset,
        })
    }

    /// Wraps an existing table, as `nn.EmbeddingBag.from_pretrained`.
    ///
    /// # Errors
    /// A shape or option error, then [`EmbeddingError::AllocationFailed`] if
    /// the table's aligned copy cannot be allocated.
    pub fn from_pretrained(
        weight: Vec<f32>,
        embedding_dim: usize,
        freeze: bool,
        options: EmbeddingBagOptions,
    ) -> Result<EmbeddingBag, EmbeddingError> {
        check_options(&options)?;
        let table = Embedding::from_pretrained_with_options(
            weight,
            embedding_dim,
            freeze,
            options.table_options(),
        )?;
        Ok(EmbeddingBag {
            table,
            mode: options.mode,
            include_last_offset: options.include_last_offset,
        })
    }

    /// A bag layer over an existing [`Embedding`] (its table, options and
    /// threading), pooling with `mode`: no copy of the table. PyTorch's
    /// `scale_grad_by_freq` is refused in max mode here too.
    ///
    /// # Errors
    /// [`EmbeddingError::InvalidArgument`] for `scale_grad_by_freq` with max.
    pub fn from_embedding(
        table: Embedding,
        mode: Mode,
        include_last_offset: bool,
    ) -> Result<EmbeddingBag, EmbeddingError> {
        check_options(&EmbeddingBagOptions {
            mode,
            scale_grad_by_freq: table.scale_grad_by_freq(),
            ..EmbeddingBagOptions::default()
        })?;
        Ok(EmbeddingBag {
            table,
            mode,
            include_last_offset,
        })
    }

    /// The table, as the [`Embedding`] it is kept in.
    pub fn into_table(self) -> Embedding {
        self.table
    }

    /// A copy of the layer, or an error where [`Clone::clone`] would abort.
    ///
    /// # Errors
    /// [`EmbeddingError::AllocationFailed`] if the table's copy cannot be
    /// allocated.
    pub fn try_clone(&self) -> Result<EmbeddingBag, EmbeddingError> {
        Ok(EmbeddingBag {
            table: self.table.try_clone()?,
            mode: self.mode,
            include_last_offset: self.include_last_offset,
        })
    }

    /// The same layer with another threading choice for its kernels.
    pub fn with_parallelism(self, parallelism: Parallelism) -> EmbeddingBag {
        EmbeddingBag {
            table: self.table.with_parallelism(parallelism),
            ..self
        }
    }

    /// The table as an [`Embedding`] (its weight, options and accessors).
    pub fn table(&self) -> &Embedding {
        &self.table
    }

    /// The table, for changes by hand.
    pub fn weight_mut(&mut self) -> &mut [f32] {
        self.table.weight_mut()
    }

    /// The pooling mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The row width.
    pub fn embedding_dim(&self) -> usize {
        self.table.embedding_dim()
    }

    /// Whether `offsets` carry the end of the last bag.
    pub fn include_last_offset(&self) -> bool {
        self.include_last_offset
    }

    /// Checked bags from PyTorch-style `offsets` over `num_ids` ids, read
    /// with this layer's `include_last_offset`.
    ///
    /// # Errors
    /// An offsets error (see [`Bags::from_offsets`]).
    pub fn offsets<O: Index>(&self, offsets: &[O], num_ids: usize) -> Result<Bags, EmbeddingError> {
        Bags::from_offsets(offsets, num_ids, self.include_last_offset)
    }

    /// The pooling arguments of one call.
    fn pooling<'a>(&self, per_sample_weights: Option<&'a [f32]>) -> Pooling<'a> {
        Pooling {
            mode: self.mode,
            per_sample_weights,
            padding_idx: self.table.padding_idx(),
            scale_grad_by_freq: self.table.scale_grad_by_freq(),
        }
    }

    /// Pools the rows of each bag of `ids` (renormalising them first with
    /// `max_norm`). Returns `[bags, embedding_dim]` values, and with max mode
    /// the winning ids.
    ///
    /// # Errors
    /// A shape error (including [`EmbeddingError::SizeOverflow`] for
    /// `bags × embedding_dim`), [`EmbeddingError::PerSampleWeightsNeedSum`]
    /// or [`EmbeddingError::IndexOutOfRange`] (the shapes are checked before
    /// anything is allocated; without `max_norm` the forward's tasks check
    /// the ids, each those it reads, and a bad id is reported as the first
    /// one of the call), then [`EmbeddingError::AllocationFailed`] for the
    /// outputs or the renormalisation's workspace; then nothing has changed,
    /// the table included.
    pub fn forward<I: Index>(
        &mut self,
        ids: &[I],
        bags: &Bags,
        per_sample_weights: Option<&[f32]>,
    ) -> Result<BagOutput, EmbeddingError> {
        in_pool(check_splits(self.table.parallelism(), ids), || {
            let pooling = self.pooling(per_sample_weights);
            let dim = self.embedding_dim();
            let rows = self.table.num_embeddings();
            let par = self.table.parallelism();
            let unchecked = UncheckedIds::of(ids);
            // Without `max_norm` the forward's tasks check the ids, each
            // those it reads; `max_norm` needs them checked to renormalise
            // the rows first.
            let (call_ids, len) = if self.table.max_norm().is_some() {
                let (valid, len) = check_forward_unallocated(par, rows, dim, ids, bags, &pooling)?;
                (CallIds::Checked(valid), len)
            } else {
                let len = check_forward_shapes(rows, dim, ids, bags, &pooling)?;
                (
                    CallIds::InTasks {
                        ids: unchecked,
                        num_embeddings: rows,
                    },
                    len,
                )
            };
            let (mut values, mut max_indices) =
                fresh_outputs(par, unchecked, rows, len, self.mode)?;
            if let CallIds::Checked(valid) = call_ids {
                self.table.renorm_rows(valid)?;
            }
            let weight = self.table.weight();
            let at = &mut max_indices[..];
            let ids = call_ids.by_row();
            forward_valid_fresh(par, weight, dim, ids, bags, &pooling, &mut values, at)?;
            Ok(BagOutput {
                values,
                shape: [bags.len(), self.embedding_dim()],
                max_indices: (self.mode == Mode::Max).then_some(max_indices),
            })
        })
    }

    /// [`forward`](Self::forward) into caller buffers (`max_indices` is
    /// only written in max mode, and may be empty otherwise).
    ///
    /// # Errors
    /// As [`forward`](Self::forward) (the only allocation is the
    /// renormalisation's workspace); then the buffers and the table are
    /// untouched.
    pub fn forward_into<I: Index>(
        &mut self,
        ids: &[I],
        bags: &Bags,
        per_sample_weights: Option<&[f32]>,
        out: &mut [f32],
        max_indices: &mut [i64],
    ) -> Result<(), EmbeddingError> {
        in_pool(check_splits(self.table.parallelism(), ids), || {
            let pooling = self.pooling(per_sample_weights);
            let dim = self.embedding_dim();
            // Every check before `max_norm` may change the table; the kernel
            // then runs on the checked ids.
            let rows = self.table.num_embeddings();
            let par = self.table.parallelism();
            let valid = check_forward_rows(par, rows, dim, ids, bags, &pooling, out, max_indices)?;
            self.table.renorm_rows(valid)?;
            let weight = self.table.weight();
            forward_valid(
                par,
                weight,
                dim,
                valid.by_row(),
                bags,
                &pooling,
                out,
                max_indices,
            );
            Ok(())
        })
    }

    /// The gradient of the table for `grad_output` (`bags × embedding_dim`):
    /// dense or sparse as the `sparse` option says. Max mode needs the
    /// forward's `max_indices`; the other modes ignore them.
    ///
    /// # Errors
    /// A shape error, [`EmbeddingError::PerSampleWeightsNeedSum`], an id
    /// error, or [`EmbeddingError::MaxNeedsIndices`] for max mode without
    /// `max_indices`, in the order of the [module notes](self) and before
    /// anything is allocated; then [`EmbeddingError::AllocationFailed`] if
    /// the gradient or its workspace cannot be allocated.
    pub fn backward<I: Index>(
        &self,
        grad_output: &[f32],
        ids: &[I],
        bags: &Bags,
        per_sample_weights: Option<&[f32]>,
        max_indices: Option<&[i64]>,
    ) -> Result<Gradient, EmbeddingError> {
        if self.table.is_sparse() {
            return self
                .backward_sparse(grad_output, ids, bags, per_sample_weights, max_indices)
                .map(Gradient::Sparse);
        }
        // The checks before the allocation, so a bad call costs nothing.
        self.check_backward(grad_output, ids, bags, per_sample_weights, max_indices)?;
        let len = self.table.weight().len();
        let mut dense = crate::memory::zeroed_floats(len, "gradient")?;
        self.backward_dense_into(
            grad_output,
            ids,
            bags,
            per_sample_weights,
            max_indices,
            &mut dense,
        )?;
        Ok(Gradient::Dense(dense))
    }

    /// The dense gradient, **overwriting** `grad_weight` (`num_embeddings ×
    /// embedding_dim`). Sum and mean write every row once (sums or zeros);
    /// max zeroes the table, then adds each output column's gradient to the
    /// row that won it.
    ///
    /// # Errors
    /// As [`backward`](Self::backward); then `grad_weight` is untouched.
    pub fn backward_dense_into<I: Index>(
        &self,
        grad_output: &[f32],
        ids: &[I],
        bags: &Bags,
        per_sample_weights: Option<&[f32]>,
        max_indices: Option<&[i64]>,
        grad_weight: &mut [f32],
    ) -> Result<(), EmbeddingError> {
        let dim = self.embedding_dim();
        check_len(
            Operand::GradTable,
            self.table.weight().len(),
            grad_weight.len(),
        )?;
        let valid = self.check_backward(grad_output, ids, bags, per_sample_weights, max_indices)?;
        match (self.mode, max_indices) {
            (Mode::Max, Some(indices)) => bag_max_backward(grad_output, dim, indices, grad_weight),
            (Mode::Max, None) => Err(EmbeddingError::MaxNeedsIndices),
            _ => {
                let pooling = self.pooling(per_sample_weights);
                let par = self.table.parallelism();
                bag_backward_valid(
                    par,
                    grad_output,
                    dim,
                    valid.by_row(),
                    bags,
                    &pooling,
                    grad_weight,
                )
            }
        }
    }

    /// The coalesced sparse gradient: the touched rows (less the padding
    /// row), ascending, and their summed gradients. For sum and mean its
    /// cost does not depend on `num_embeddings`.
    ///
    /// # Errors
    /// As [`backward`](Self::backward).
    pub fn backward_sparse<I: Index>(
        &self,
        grad_output: &[f32],
        ids: &[I],
        bags: &Bags,
        per_sample_weights: Option<&[f32]>,
        max_indices: Option<&[i64]>,
    ) -> Result<SparseGrad, EmbeddingError> {
        let dim = self.embedding_dim();
        let rows = self.table.num_embeddings();
        if self.mode == Mode::Max {
            self.check_backward(grad_output, ids, bags, per_sample_weights, max_indices)?;
            let indices = max_indices.ok_or(EmbeddingError::MaxNeedsIndices)?;
            return max_sparse(grad_output, dim, indices, rows);
        }
        let pooling = self.pooling(per_sample_weights);
        let par = self.table.parallelism();
        bag_sparse_backward_with(par, grad_output, dim, ids, bags, &pooling, rows)
    }

    /// Backward and an optimiser step in one pass over the touched rows (sum
    /// and mean): no gradient is stored. A frozen table makes every check an
    /// unfrozen one makes (the optimiser's included), then changes nothing,
    /// the optimiser included; the padding row never changes.
    ///
    /// # Errors
    /// As [`backward`](Self::backward), [`EmbeddingError::MaxNeedsIndices`]
    /// in max mode, or an optimiser error (all checked before anything is
    /// allocated), then [`EmbeddingError::AllocationFailed`] for the
    /// workspace or a first step's optimiser state; then nothing has
    /// changed.
    pub fn sparse_step<I: Index, O: SparseOptimizer>(
        &mut self,
        grad_output: &[f32],
        ids: &[I],
        bags: &Bags,
        per_sample_weights: Option<&[f32]>,
        optimizer: &mut O,
    ) -> Result<(), EmbeddingError> {
        let dim = self.embedding_dim();
        let pooling = self.pooling(per_sample_weights);
        let rows = self.table.num_embeddings();
        let par = self.table.parallelism();
        let table = (!self.table.is_frozen()).then(|| self.table.weight_mut());
        bag_step(
            par,
            rows,
            dim,
            table,
            grad_output,
            ids,
            bags,
            &pooling,
            optimizer,
        )
    }

    /// Every check of a backward call but `grad_weight`'s, in the order of
    /// every mode (see the [module notes](self)): the checked ids.
    fn check_backward<'a, I: Index>(
        &self,
        grad_output: &[f32],
        ids: &'a [I],
        bags: &Bags,
        per_sample_weights: Option<&[f32]>,
        max_indices: Option<&[i64]>,
    ) -> Result<ValidIds<'a, I::Row>, EmbeddingError> {
        let pooling = self.pooling(per_sample_weights);
        let rows = self.table.num_embeddings();
        let dim = self.embedding_dim();
        let valid = check_backward_rows(rows, dim, ids, bags, &pooling, grad_output)?;
        if self.mode == Mode::Max {
            let indices = max_indices.ok_or(EmbeddingError::MaxNeedsIndices)?;
            check_max_backward(grad_output, dim, indices, rows)?;
        }
        Ok(valid)
    }

    /// Saves the table as tensor `name` of a safetensors file.
    ///
    /// # Errors
    /// As [`io::save`](crate::io::save).
    pub fn save(
        &self,
        path: impl AsRef<std::path::Path>,
        name: &str,
    ) -> Result<(), crate::io::FileError> {
        self.table.save(path, name)
    }
}

/// Fails for option pairs PyTorch refuses: `scale_grad_by_freq` with max.
fn check_options(options: &EmbeddingBagOptions) -> Result<(), EmbeddingError> {
    if options.mode == Mode::Max && options.scale_grad_by_freq {
        return Err(EmbeddingError::InvalidArgument {
            name: "scale_grad_by_freq",
            value: "true".to_string(),
            requirement: "false in max mode (as in PyTorch)",
        });
    }
    Ok(())
}

/// The checks of a max backward after `grad_output`'s length, in
/// [`bag_max_backward`]'s order: `max_indices` as long as `grad_output`,
/// each -1 or a row.
fn check_max_backward(
    grad_output: &[f32],
    dim: usize,
    max_indices: &[i64],
    rows: usize,
) -> Result<(), EmbeddingError> {
    check_len(Operand::MaxIndices, grad_output.len(), max_indices.len())?;
    if dim == 0 {
        return Ok(());
    }
    for (position, &i) in max_indices.iter().enumerate() {
        let row = usize::try_from(i).ok().filter(|&r| r < rows);
        if i != -1 && row.is_none() {
            return Err(EmbeddingError::IndexOutOfRange {
                position,
                index: i128::from(i),
                num_embeddings: rows,
            });
        }
    }
    Ok(())
}

/// The gradient of a max backward as a coalesced sparse gradient, without
/// the dense table: the rows that won anything, ascending, each column the
/// sum of the gradients it won, added in bag order from `+0.0` (the
/// additions of [`bag_max_backward`], so the same bits). `grad_output`'s
/// length is checked.
fn max_sparse(
    grad_output: &[f32],
    dim: usize,
    max_indices: &[i64],
    rows: usize,
) -> Result<SparseGrad, EmbeddingError> {
    check_max_backward(grad_output, dim, max_indices, rows)?;
    let mut touched = crate::buffer::with_capacity(max_indices.len(), "gradient")?;
    touched.extend(max_indices.iter().filter(|&&i| i >= 0).map(|&i| i as usize));
    touched.sort_unstable();
    touched.dedup();
    let len = rows_len(touched.len(), dim)?;
    let mut values = crate::memory::zeroed_floats(len, "gradient")?;
    for (at, (&x, &i)) in grad_output.iter().zip(max_indices).enumerate() {
        if i >= 0 {
            let k = touched.partition_point(|&r| r < i as usize);
            values[k * dim + at % dim] += x;
        }
    }
    SparseGrad::new(touched, values, rows, dim)
}
