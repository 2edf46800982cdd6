//! The layer: PyTorch's `nn.Embedding`, argument for argument, built on the
//! crate's kernels.
//!
//! | PyTorch | here |
//! | --- | --- |
//! | `nn.Embedding(n, d)` | [`Embedding::new`]`(n, d)` |
//! | `nn.Embedding(n, d, padding_idx=…, max_norm=…, …)` | [`Embedding::with_options`]`(n, d, EmbeddingOptions { … })` |
//! | `nn.Embedding.from_pretrained(w, freeze=…)` | [`Embedding::from_pretrained`]`(w, d, freeze)` |
//! | `emb(ids)` | [`Embedding::forward`]`(&ids, &shape)` |
//! | `emb.weight.grad` after `backward()` | [`Embedding::backward`] (dense or sparse, as `sparse` says) |
//! | `optimizer.step()` on a sparse gradient | [`Embedding::sparse_step`] (fused, no gradient stored) |
//!
//! What each option does, exactly as in PyTorch unless said otherwise:
//!
//! * `padding_idx` (negative counts from the end): the row starts at zero
//!   ([`Embedding::new`]; `from_pretrained` keeps the row it is given, as
//!   PyTorch does) and never receives a gradient or an update.
//! * `max_norm`, `norm_type` (default 2): every distinct row a forward call
//!   looks up whose `norm_type`-norm exceeds `max_norm` is scaled in place by
//!   `max_norm / (norm + 1e-7)`, once, before the lookup. The norm is summed
//!   in `f64` (PyTorch sums in `f32`), so a row on the border may be
//!   renormalised by one side and not the other.
//! * `scale_grad_by_freq`: each row's summed gradient is divided by how many
//!   times its id occurs in the batch (PyTorch scales each term before
//!   summing; the two agree up to rounding).
//! * `sparse`: [`Embedding::backward`] returns a coalesced
//!   [`SparseGrad`] instead of a dense table.
//! * `freeze` (`from_pretrained`): every update checks all its arguments,
//!   the optimiser's included, exactly as for an unfrozen layer (the same
//!   call gives the same error), then changes nothing: neither the table
//!   nor the optimiser's state or step count. Gradients can still be
//!   computed.
//!
//! A layer knows its `num_embeddings`, so every entry point checks ids
//! against it, even when `embedding_dim` is 0 (as `nn.Embedding(5, 0)`
//! accepts ids `0..5`); the flat-table kernels, which count rows by
//! `len / dim`, see no rows in a table of width 0.

use crate::error::{EmbeddingError, Operand};
use crate::index::{Index, RowId, ValidIds, check_splits};
use crate::kernels::{self, Groups, PARALLEL_MIN_BYTES, gather_fresh, gather_valid};
use crate::memory::AlignedTable;
use crate::parallel::{Parallelism, in_pool};
use crate::shape::{check_len, rows_len, table_rows};
use crate::sparse_grad::SparseGrad;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

mod training;

/// Values per independently seeded block of [`Embedding::new`]'s
/// initialisation (block `b` draws from ChaCha8 stream `b`), so the table is
/// the same bits whichever thread fills which block.
const INIT_BLOCK: usize = 1 << 16;

/// The options of `nn.Embedding`, with PyTorch's names and defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddingOptions {
    /// A row that starts at zero and never receives a gradient; negative
    /// values count from the end (-1 is the last row). Default: none.
    pub padding_idx: Option<i64>,
    /// Renormalise looked-up rows whose norm exceeds this. Default: none.
    pub max_norm: Option<f32>,
    /// The `p` of the p-norm for `max_norm`: any `p`, including 0 (count of
    /// non-zeros) and ±infinity. Default: 2.
    pub norm_type: f32,
    /// Divide each row's gradient by its id's count in the batch. Default:
    /// false.
    pub scale_grad_by_freq: bool,
    /// [`Embedding::backward`] returns a sparse gradient. Default: false.
    pub sparse: bool,
    /// The seed of [`Embedding::new`]'s N(0, 1) initialisation; none draws
    /// one from the operating system. Ignored by `from_pretrained`.
    pub seed: Option<u64>,
}

impl Default for EmbeddingOptions {
    fn default() -> Self {
        EmbeddingOptions {
            padding_idx: None,
            max_norm: None,
            norm_type: 2.0,
            scale_grad_by_freq: false,
            sparse: false,
            seed: None,
        }
    }
}

/// The result of [`Embedding::forward`]: the looked-up rows and their shape
/// (the ids' shape with `embedding_dim` appended).
#[derive(Clone, Debug, PartialEq)]
pub struct Embedded {
    /// The rows, row-major.
    pub values: Vec<f32>,
    /// `[ids shape…, embedding_dim]`.
    pub shape: Vec<usize>,
}

/// The gradient of the table, as [`Embedding::backward`] returns it.
#[derive(Clone, Debug, PartialEq)]
pub enum Gradient {
    /// `num_embeddings × embedding_dim` values.
    Dense(Vec<f32>),
    /// The touched rows only.
    Sparse(SparseGrad),
}

/// An embedding layer that owns its table; see the [module notes](self).
///
/// Cloning copies the table, and running out of memory for it aborts, as it
/// does for a `Vec`; [`try_clone`](Self::try_clone) returns an error instead.
#[derive(Clone, Debug)]
pub struct Embedding {
    weight: AlignedTable,
    num_embeddings: usize,
    embedding_dim: usize,
    padding_idx: Option<usize>,
    max_norm: Option<f32>,
    norm_type: f32,
    scale_grad_by_freq: bool,
    sparse: bool,
    frozen: bool,
    parallelism: Parallelism,
}

impl Embedding {
    /// A `num_embeddings × embedding_dim` table drawn from N(0, 1) with a
    /// seed from the operating system, as `nn.Embedding(n, d)`. Every value
    /// is written, so a table the allocator grants takes its memory for real.
    ///
    /// # Errors
    /// [`EmbeddingError::SizeOverflow`] if `num_embeddings × embedding_dim`
    /// overflows `usize`, [`EmbeddingError::AllocationFailed`] if the table's
    /// memory cannot be allocated.
    pub fn new(num_embeddings: usize, embedding_dim: usize) -> Result<Embedding, EmbeddingError> {
        Embedding::with_options(num_embeddings, embedding_dim, EmbeddingOptions::default())
    }

    /// A table drawn from N(0, 1) with these options (the padding row zeroed).
    /// With `options.seed`, the same seed gives the same bits on every
    /// platform and thread count (ChaCha8, one stream per block of 65 536
    /// values, `rand_distr`'s `StandardNormal`).
    ///
    /// # Errors
    /// [`EmbeddingError::SizeOverflow`], an invalid option
    /// ([`EmbeddingError::PaddingIdxOutOfRange`],
    /// [`EmbeddingError::InvalidArgument`]), checked in that order before
    /// anything is allocated; then [`EmbeddingError::AllocationFailed`] if
    /// the table's memory cannot be allocated.
    pub fn with_options(
        num_embeddings: usize,
        embedding_dim: usize,
        options: EmbeddingOptions,
    ) -> Result<Embedding, EmbeddingError> {
        let len = rows_len(num_embeddings, embedding_dim)?;
        let empty = AlignedTable::zeroed(0)?;
        let mut layer = Embedding::configured(empty, num_embeddings, embedding_dim, &options)?;
        let seed = options.seed.unwrap_or_else(rand::random);
        let mut weight = AlignedTable::zeroed(len)?;
        let blocks = weight.chunks_mut(INIT_BLOCK).collect();
        crate::executor::for_each_part(blocks, |block, values: &mut [f32]| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            rng.set_stream(block as u64);
            for v in values {
                *v = StandardNormal.sample(&mut rng);
            }
        });
        if let Some(p) = layer.padding_idx {
            weight[p * embedding_dim..(p + 1) * embedding_dim].fill(0.0);
        }
        layer.weight = weight;
        Ok(layer)
    }

    /// Wraps an existing table (`weight.len() / embedding_dim` rows), as
    /// `nn.Embedding.from_pretrained(weight, freeze)`. The values are copied
    /// once into the layer's line-aligned table ([`AlignedTable`]).
    ///
    /// # Errors
    /// A shape error for `weight`, or [`EmbeddingError::AllocationFailed`]
    /// if the aligned copy cannot be allocated.
    pub fn from_pretrained(
        weight: Vec<f32>,
        embedding_dim: usize,
        freeze: bool,
    ) -> Result<Embedding, EmbeddingError> {
        Embedding::from_pretrained_with_options(
            weight,
            embedding_dim,
            freeze,
            EmbeddingOptions::default(),
        )
    }

    /// [`from_pretrained`](Self::from_pretrained) with options. The padding
    /// row is kept as given, as in PyTorch.
    ///
    /// # Errors
    /// A shape error for `weight`, an invalid option, or
    /// [`EmbeddingError::AllocationFailed`] if the aligned copy cannot be
    /// allocated.
    pub fn from_pretrained_with_options(
        weight: Vec<f32>,
        embedding_dim: usize,
        freeze: bool,
        options: EmbeddingOptions,
    ) -> Result<Embedding, EmbeddingError> {
        let rows = table_rows(weight.len(), embedding_dim, Operand::Table)?;
        // The options are checked before the copy is allocated.
        let empty = AlignedTable::zeroed(0)?;
        let mut layer = Embedding::configured(empty, rows, embedding_dim, &options)?;
        // The layer keeps its table line-aligned (see `AlignedTable`): one
        // copy here, and `weight` is freed.
        layer.weight = AlignedTable::from_slice(&weight)?;
        layer.frozen = freeze;
        Ok(layer)
    }

    /// The layer with its options checked and normalised.
    fn configured(
        weight: AlignedTable,
        num_embeddings: usize,
        embedding_dim: usize,
        options: &EmbeddingOptions,
    ) -> Result<Embedding, EmbeddingError> {
        let padding_idx = match options.padding_idx {
            None => None,
            Some(p) => {
                let rows = i128::try_from(num_embeddings).unwrap_or(i128::MAX);
                let p128 = i128::from(p);
                let row = if p128 < 0 { p128 + rows } else { p128 };
                if !(0..rows).contains(&row) {
                    return Err(EmbeddingError::PaddingIdxOutOfRange {
                        padding_idx: p,
                        num_embeddings,
                    });
                }
                Some(row as usize)
            }
        };
        if let Some(m) = options.max_norm
            && (m.is_nan() || m <= 0.0)
        {
            return Err(EmbeddingError::InvalidArgument {
                name: "max_norm",
                value: m.to_string(),
                requirement: "greater than 0",
            });
        }
        if options.norm_type.is_nan() {
            return Err(EmbeddingError::InvalidArgument {
                name: "norm_type",
                value: options.norm_type.to_string(),
                requirement: "a number (any p, including 0 and ±inf)",
            });
        }
        Ok(Embedding {
            weight,
            num_embeddings,
            embedding_dim,
            padding_idx,
            max_norm: options.max_norm,
            norm_type: options.norm_type,
            scale_grad_by_freq: options.scale_grad_by_freq,
            sparse: options.sparse,
            frozen: false,
            parallelism: Parallelism::Auto,
        })
    }

    /// The same layer with another threading choice for its kernels.
    pub fn with_parallelism(self, parallelism: Parallelism) -> Embedding {
        Embedding {
            parallelism,
            ..self
        }
    }

    /// How the layer's kernels use threads.
    pub fn parallelism(&self) -> Parallelism {
        self.parallelism
    }

    /// The number of rows.
    pub fn num_embeddings(&self) -> usize {
        self.num_embeddings
    }

    /// The row width.
    pub fn embedding_dim(&self) -> usize {
        self.embedding_dim
    }

    /// The table, `num_embeddings × embedding_dim`, row-major.
    pub fn weight(&self) -> &[f32] {
        &self.weight
    }

    /// The table, for changes by hand.
    pub fn weight_mut(&mut self) -> &mut [f32] {
        &mut self.weight
    }

    /// The table, as a `Vec` (a copy: the layer keeps its table in an
    /// [`AlignedTable`]).
    ///
    /// # Errors
    /// [`EmbeddingError::AllocationFailed`] if the copy cannot be allocated.
    pub fn into_weight(self) -> Result<Vec<f32>, EmbeddingError> {
        crate::buffer::copied(&self.weight, "table")
    }

    /// A copy of the layer, or an error where [`Clone::clone`] would abort
    /// (cloning copies the table; running out of memory aborts, as it does
    /// for a `Vec`).
    ///
    /// # Errors
    /// [`EmbeddingError::AllocationFailed`] if the table's copy cannot be
    /// allocated.
    pub fn try_clone(&self) -> Result<Embedding, EmbeddingError> {
        Ok(Embedding {
            weight: self.weight.try_clone()?,
            num_embeddings: self.num_embeddings,
            embedding_dim: self.embedding_dim,
            padding_idx: self.padding_idx,
            max_norm: self.max_norm,
            norm_type: self.norm_type,
            scale_grad_by_freq: self.scale_grad_by_freq,
            sparse: self.sparse,
            frozen: self.frozen,
            parallelism: self.parallelism,
        })
    }

    /// Row `id`.
    ///
    /// # Errors
    /// [`EmbeddingError::IndexOutOfRange`] (position 0) if `id` is negative
    /// or not below `num_embeddings`.
    pub fn row<I: Index>(&self, id: I) -> Result<&[f32], EmbeddingError> {
        let ids = ValidIds::new(core::slice::from_ref(&id), self.num_embeddings)?;
        let r = ids.row(0);
        Ok(&self.weight[r * self.embedding_dim..(r + 1) * self.embedding_dim])
    }

    /// The padding row, normalised to a row number.
    pub fn padding_idx(&self) -> Option<usize> {
        self.padding_idx
    }

    /// `max_norm`, if set.
    pub fn max_norm(&self) -> Option<f32> {
        self.max_norm
    }

    /// `norm_type`.
    pub fn norm_type(&self) -> f32 {
        self.norm_type
    }

    /// Whether gradients are divided by id counts.
    pub fn scale_grad_by_freq(&self) -> bool {
        self.scale_grad_by_freq
    }

    /// Whether [`backward`](Self::backward) returns a sparse gradient.
    pub fn is_sparse(&self) -> bool {
        self.sparse
    }

    /// Whether updates are no-ops.
    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// Freezes or unfreezes the table.
    pub fn set_frozen(&mut self, frozen: bool) {
        self.frozen = frozen;
    }

    /// Looks up `ids` laid out as `shape` (`[n]`, `[batch, seq]`, …),
    /// renormalising the rows first when `max_norm` is set. The result has
    /// shape `[shape…, embedding_dim]`.
    ///
    /// # Errors
    /// [`EmbeddingError::IdsShape`] if `shape` does not hold `ids.len()` ids,
    /// [`EmbeddingError::SizeOverflow`] if `ids.len() × embedding_dim`
    /// overflows, [`EmbeddingError::IndexOutOfRange`] for a bad id (all
    /// checked before anything is allocated), then
    /// [`EmbeddingError::AllocationFailed`] for the output or the
    /// renormalisation's workspace; then the table is untouched too.
    pub fn forward<I: Index>(
        &mut self,
        ids: &[I],
        shape: &[usize],
    ) -> Result<Embedded, EmbeddingError> {
        in_pool(check_splits(self.parallelism, ids), || {
            check_shape(ids.len(), shape)?;
            let len = rows_len(ids.len(), self.embedding_dim)?;
            let valid = ValidIds::new_with(self.parallelism, ids, self.num_embeddings)?;
            // Room for the output, written once by the lookup (not zeroed first).
            let mut values = crate::buffer::with_capacity(len, "output")?;
            let mut shape_out = crate::buffer::with_capacity(shape.len() + 1, "output")?;
            shape_out.extend_from_slice(shape);
            shape_out.push(self.embedding_dim);
            self.renorm_rows(valid)?;
            let (par, dim) = (self.parallelism, self.embedding_dim);
            gather_fresh(par, &self.weight, dim, valid.by_row(), &mut values)?;
            Ok(Embedded {
                values,
                shape: shape_out,
            })
        })
    }

    /// [`forward`](Self::forward) into a caller's buffer of `ids.len() ×
    /// embedding_dim` values (any shape of ids).
    ///
    /// # Errors
    /// A shape error for `out` or [`EmbeddingError::IndexOutOfRange`], or
    /// [`EmbeddingError::AllocationFailed`] for the renormalisation's
    /// workspace; then `out` and the table are untouched.
    pub fn forward_into<I: Index>(
        &mut self,
        ids: &[I],
        out: &mut [f32],
    ) -> Result<(), EmbeddingError> {
        in_pool(check_splits(self.parallelism, ids), || {
            let len = rows_len(ids.len(), self.embedding_dim)?;
            check_len(Operand::Output, len, out.len())?;
            let valid = ValidIds::new_with(self.parallelism, ids, self.num_embeddings)?;
            self.lookup_valid(valid, out)
        })
    }

    /// The renormalisation and the lookup of checked ids into an output of
    /// the right length; fails only before anything is written.
    fn lookup_valid<I: RowId>(
        &mut self,
        valid: ValidIds<'_, I>,
        out: &mut [f32],
    ) -> Result<(), EmbeddingError> {
        self.renorm_rows(valid)?;
        gather_valid(
            self.parallelism,
            &self.weight,
            self.embedding_dim,
            valid.by_row(),
            out,
        );
        Ok(())
    }

    /// A read-only lookup, for a layer without `max_norm` (inference, or
    /// several threads sharing one layer): `out[i, :] = weight[ids[i], :]`.
    ///
    /// # Errors
    /// [`EmbeddingError::InvalidArgument`] if `max_norm` is set (its lookups
    /// change the table: use [`forward_into`](Self::forward_into)), a shape
    /// error for `out`, or [`EmbeddingError::IndexOutOfRange`]; then `out` is
    /// untouched.
    pub fn lookup_into<I: Index>(&self, ids: &[I], out: &mut [f32]) -> Result<(), EmbeddingError> {
        if let Some(m) = self.max_norm {
            return Err(EmbeddingError::InvalidArgument {
                name: "max_norm",
                value: m.to_string(),
                requirement: "unset for a read-only lookup (forward_into renormalises)",
            });
        }
        let len = rows_len(ids.len(), self.embedding_dim)?;
        check_len(Operand::Output, len, out.len())?;
        let valid = ValidIds::new_with(self.parallelism, ids, self.num_embeddings)?;
        gather_valid(
            self.parallelism,
            &self.weight,
            self.embedding_dim,
            valid.by_row(),
            out,
        );
        Ok(())
    }

    /// `embedding_renorm_`, when `max_norm` is set: scales each distinct row
    /// of `ids` whose norm exceeds `max_norm` by `max_norm / (norm + 1e-7)`.
    /// [`forward_into`](Self::forward_into) runs it before its lookup, and so
    /// do the fused kernels that read the table themselves
    /// ([`InputEmbedding`](crate::input::InputEmbedding),
    /// [`EmbeddingBag`](crate::EmbeddingBag)). Fails only when the grouping
    /// of `ids` cannot be allocated, and then the table is untouched.
    pub(crate) fn renorm_rows<I: RowId>(
        &mut self,
        ids: ValidIds<'_, I>,
    ) -> Result<(), EmbeddingError> {
        let plan = self.renorm_plan(ids)?;
        self.renorm(plan);
        Ok(())
    }

    /// The allocating half of [`renorm_rows`](Self::renorm_rows): `ids`
    /// grouped by row, or `None` without `max_norm`. A caller renormalising
    /// two tables makes both plans before it changes either.
    pub(crate) fn renorm_plan<I: RowId>(
        &self,
        ids: ValidIds<'_, I>,
    ) -> Result<Option<RenormPlan>, EmbeddingError> {
        debug_assert_eq!(ids.num_embeddings(), self.num_embeddings);
        if self.max_norm.is_none() {
            return Ok(None);
        }
        // The bytes the rows span, saturated: `dim` alone may be near
        // `usize::MAX` (a table of no rows), and this only picks a strategy.
        let bytes = ids
            .len()
            .saturating_mul(self.embedding_dim)
            .saturating_mul(core::mem::size_of::<f32>());
        Ok(Some(RenormPlan {
            groups: Groups::new(ids, None)?,
            split: self.parallelism.splits(bytes, PARALLEL_MIN_BYTES),
        }))
    }

    /// The writing half of [`renorm_rows`](Self::renorm_rows); cannot fail.
    pub(crate) fn renorm(&mut self, plan: Option<RenormPlan>) {
        let (Some(plan), Some(max_norm)) = (plan, self.max_norm) else {
            return;
        };
        let dim = self.embedding_dim;
        let (p, max_norm) = (self.norm_type, f64::from(max_norm));
        kernels::for_each_row(plan.split, &plan.groups, &mut self.weight, dim, |row| {
            let norm = p_norm(row, p);
            if norm > max_norm {
                let scale = (max_norm / (norm + 1e-7)) as f32;
                row.iter_mut().for_each(|x| *x *= scale);
            }
        });
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
        crate::io::save(path, &[(name, &self.weight, self.embedding_dim)])
    }

    /// Loads tensor `name` of a safetensors file as a pretrained table (a
    /// Hugging Face checkpoint's `embeddings.word_embeddings.weight`, say).
    ///
    /// # Errors
    /// As [`io::load`](crate::io::load).
    pub fn load(
        path: impl AsRef<std::path::Path>,
        name: &str,
        freeze: bool,
    ) -> Result<Embedding, crate::io::FileError> {
        let table = crate::io::load(path, name)?;
        let dim = table.embedding_dim;
        Embedding::from_pretrained(table.weight, dim, freeze).map_err(|source| {
            crate::io::FileError::Table {
                name: name.to_string(),
                source,
            }
        })
    }
}

/// A [`Embedding::renorm_plan`]: the rows to visit, and whether on the pool.
pub(crate) struct RenormPlan {
    groups: Groups,
    split: bool,
}

/// Fails unless `shape` holds exactly `len` ids.
pub(crate) fn check_shape(len: usize, shape: &[usize]) -> Result<(), EmbeddingError> {
    let held = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    if held == Some(len) {
        Ok(())
    } else {
        Err(EmbeddingError::IdsShape {
            shape: shape.to_vec(),
            len,
        })
    }
}

/// The `p`-norm of a row, summed in `f64`: `p` = 0 counts non-zeros, ±inf
/// takes the largest or smallest magnitude.
pub(crate) fn p_norm(row: &[f32], p: f32) -> f64 {
    let abs = row.iter().map(|&x| f64::from(x).abs());
    if p == 2.0 {
        abs.map(|x| x * x).sum::<f64>().sqrt()
    } else if p == 1.0 {
        abs.sum()
    } else if p == 0.0 {
        abs.filter(|&x| x != 0.0).count() as f64
    } else if p == f32::INFINITY {
        abs.fold(0.0, f64::max)
    } else if p == f32::NEG_INFINITY {
        abs.fold(f64::INFINITY, f64::min)
    } else {
        let p = f64::from(p);
        abs.map(|x| x.powf(p)).sum::<f64>().powf(1.0 / p)
    }
}
