//! Inference layers over tables of every [`Format`]: PyTorch's
//! `torch.ao.nn.quantized.Embedding` and `EmbeddingBag`, built the same way
//! (`from_float`) and extended to `f16` and `bf16` tables.
//!
//! | PyTorch | here |
//! | --- | --- |
//! | `torch.ao.nn.quantized.EmbeddingBag.from_float(bag)` (8-bit: `dtype=torch.quint8`) | [`QuantizedEmbeddingBag::from_float`]`(&bag, Format::Int8)` |
//! | the same with `dtype=torch.quint4x2` | `from_float(&bag, Format::Int4)` |
//! | `bag.half()` / `bag.bfloat16()` | `from_float(&bag, Format::F16)` / `Format::Bf16` |
//! | `qbag(input, offsets, per_sample_weights=w)` | [`QuantizedEmbeddingBag::forward`]`(&ids, &bags, Some(&w))` |
//! | `torch.ao.nn.quantized.Embedding.from_float(emb)` | [`QuantizedEmbedding::from_float`]`(&emb, Format::Int8)` |
//!
//! The layers read their table in place, through
//! [`table_gather`](crate::table_gather) and
//! [`table_bag_forward`](crate::table_bag_forward): a packed table is never
//! unpacked. They are for inference: no backward, and the table is never
//! written.
//!
//! What differs from PyTorch, on purpose:
//!
//! * **Every mode.** PyTorch's quantized bag computes a sum whatever `mode`
//!   says; here sum, mean and max each do what they say.
//! * **`f32` out.** The output is `f32` for every format (PyTorch returns
//!   `f16` from an `f16` table); a half table's bag sums in `f32`.
//! * **`max_norm` is refused.** Renormalising would write the table, and a
//!   packed row cannot be renormalised without packing it again; PyTorch's
//!   quantized modules ignore it silently. A layer with `max_norm` set is
//!   [`EmbeddingError::InvalidArgument`] here.
//! * `padding_idx` keeps its meaning (the row is left out of every bag);
//!   `scale_grad_by_freq` and `sparse` only shape gradients, so they have
//!   nothing to do.
//!
//! A layer made by `from_float` keeps the float layer's `num_embeddings`,
//! so ids are checked against it even when `embedding_dim` is 0 (a table
//! of width 0 holds no values to count its rows by), as in the float
//! layers.

use crate::bags::Bags;
use crate::embedding::{Embedded, Embedding, check_shape};
use crate::embedding_bag::{BagOutput, EmbeddingBag};
use crate::error::{EmbeddingError, Operand};
use crate::formats::{Format, OwnedTable};
use crate::index::{Index, UncheckedIds, ValidIds, check_splits};
use crate::io::FileError;
use crate::kernels::{
    CallIds, check_forward_rows, check_forward_shapes, forward_fresh, fresh_outputs,
    table_bag_forward_with, table_gather_with,
};
use crate::parallel::{Parallelism, in_pool};
use crate::pooling::{Mode, Pooling};
use crate::shape::{check_len, rows_len};

/// An embedding-bag layer for inference over a table of any format; see
/// the [module notes](self).
#[derive(Clone, Debug)]
pub struct QuantizedEmbeddingBag {
    table: OwnedTable,
    /// The table's rows, or the float layer's for a table of width 0.
    num_embeddings: usize,
    mode: Mode,
    padding_idx: Option<usize>,
    include_last_offset: bool,
    parallelism: Parallelism,
}

impl QuantizedEmbeddingBag {
    /// `bag`'s table in `format` (converted, or packed by PyTorch's rules:
    /// [`RowWise::prepack`](crate::formats::RowWise::prepack)), with its
    /// mode, `padding_idx`, `include_last_offset` and threading.
    ///
    /// # Errors
    /// [`EmbeddingError::InvalidArgument`] if `bag` has `max_norm` set, or
    /// a packing error (a row holding a NaN or an infinity, or one whose
    /// range overflows).
    pub fn from_float(bag: &EmbeddingBag, format: Format) -> Result<Self, EmbeddingError> {
        let emb = bag.table();
        refuse_max_norm(emb)?;
        let table = OwnedTable::from_f32(emb.weight(), emb.embedding_dim(), format)?;
        Ok(QuantizedEmbeddingBag {
            table,
            num_embeddings: emb.num_embeddings(),
            mode: bag.mode(),
            padding_idx: emb.padding_idx(),
            include_last_offset: bag.include_last_offset(),
            parallelism: emb.parallelism(),
        })
    }

    /// A layer over a table already in hand (loaded from a file, say),
    /// pooling with `mode`.
    ///
    /// # Errors
    /// [`EmbeddingError::PaddingIdxOutOfRange`] if `padding_idx` is not a
    /// row of `table`.
    pub fn from_table(
        table: OwnedTable,
        mode: Mode,
        padding_idx: Option<usize>,
        include_last_offset: bool,
    ) -> Result<Self, EmbeddingError> {
        check_padding(&table, padding_idx)?;
        Ok(QuantizedEmbeddingBag {
            num_embeddings: table.rows(),
            table,
            mode,
            padding_idx,
            include_last_offset,
            parallelism: Parallelism::Auto,
        })
    }

    /// The same layer with another threading choice for its kernels.
    pub fn with_parallelism(self, parallelism: Parallelism) -> Self {
        QuantizedEmbeddingBag {
            parallelism,
            ..self
        }
    }

    /// The table.
    pub fn table(&self) -> &OwnedTable {
        &self.table
    }

    /// The table's format.
    pub fn format(&self) -> Format {
        self.table.format()
    }

    /// The pooling mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The padding row, if any.
    pub fn padding_idx(&self) -> Option<usize> {
        self.padding_idx
    }

    /// The number of rows.
    pub fn num_embeddings(&self) -> usize {
        self.num_embeddings
    }

    /// The row width.
    pub fn embedding_dim(&self) -> usize {
        self.table.dim()
    }

    /// Checked bags from PyTorch-style `offsets` over `num_ids` ids, read
    /// with this layer's `include_last_offset`.
    ///
    /// # Errors
    /// An offsets error (see [`Bags::from_offsets`]).
    pub fn offsets<O: Index>(&self, offsets: &[O], num_ids: usize) -> Result<Bags, EmbeddingError> {
        Bags::from_offsets(offsets, num_ids, self.include_last_offset)
    }

    /// The layer's pooling with these weights (no `scale_grad_by_freq`:
    /// a packed table has no backward).
    fn pooling<'a>(&self, per_sample_weights: Option<&'a [f32]>) -> Pooling<'a> {
        Pooling {
            mode: self.mode,
            per_sample_weights,
            padding_idx: self.padding_idx,
            scale_grad_by_freq: false,
        }
    }

    /// Pools the rows of each bag of `ids`: `[bags, embedding_dim]` `f32`
    /// values, and with max mode the winning ids.
    ///
    /// # Errors
    /// As [`table_bag_forward`](crate::table_bag_forward) (the shapes
    /// checked before anything is allocated, the ids by the forward's tasks,
    /// a bad one reported as the first one of the call), then
    /// [`EmbeddingError::AllocationFailed`] for the outputs.
    pub fn forward<I: Index>(
        &self,
        ids: &[I],
        bags: &Bags,
        per_sample_weights: Option<&[f32]>,
    ) -> Result<BagOutput, EmbeddingError> {
        in_pool(check_splits(self.parallelism, ids), || {
            let pooling = self.pooling(per_sample_weights);
            let (rows, dim) = (self.num_embeddings(), self.embedding_dim());
            // The forward's tasks check the ids, each those it reads.
            let par = self.parallelism;
            let len = check_forward_shapes(rows, dim, ids, bags, &pooling)?;
            let unchecked = UncheckedIds::of(ids);
            let (mut values, mut max_indices) =
                fresh_outputs(par, unchecked, rows, len, self.mode)?;
            let (table, at) = (self.table.as_ref(), &mut max_indices[..]);
            forward_fresh(
                par,
                table,
                CallIds::InTasks {
                    ids: unchecked,
                    num_embeddings: rows,
                }
                .by_row(),
                bags,
                &pooling,
                &mut values,
                at,
            )?;
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
    /// As [`forward`](Self::forward); then the buffers are untouched.
    pub fn forward_into<I: Index>(
        &self,
        ids: &[I],
        bags: &Bags,
        per_sample_weights: Option<&[f32]>,
        out: &mut [f32],
        max_indices: &mut [i64],
    ) -> Result<(), EmbeddingError> {
        in_pool(check_splits(self.parallelism, ids), || {
            let pooling = self.pooling(per_sample_weights);
            let dim = self.embedding_dim();
            if dim == 0 {
                // Nothing to read or write, but every check of any width, with
                // the layer's row count.
                let rows = self.num_embeddings;
                let par = self.parallelism;
                check_forward_rows(par, rows, dim, ids, bags, &pooling, out, max_indices)?;
                return Ok(());
            }
            let table = self.table.as_ref();
            table_bag_forward_with(
                self.parallelism,
                table,
                ids,
                bags,
                &pooling,
                out,
                max_indices,
            )
        })
    }

    /// Saves the table as tensor `name` of a safetensors file
    /// ([`io::save_tables`](crate::io::save_tables): a half table as an
    /// `F16`/`BF16` tensor, a packed one as PyTorch's `U8` rows with its
    /// format in the metadata).
    ///
    /// # Errors
    /// As [`io::save_tables`](crate::io::save_tables).
    pub fn save(&self, path: impl AsRef<std::path::Path>, name: &str) -> Result<(), FileError> {
        crate::io::save_tables(path, &[(name, &self.table)])
    }

    /// A layer over tensor `name` of a safetensors file, in the format the
    /// file holds ([`io::load_table`](crate::io::load_table)), pooling with
    /// `mode`.
    ///
    /// # Errors
    /// As [`io::load_table`](crate::io::load_table), or
    /// [`FileError::Table`] when `padding_idx` is not a row of it.
    pub fn load(
        path: impl AsRef<std::path::Path>,
        name: &str,
        mode: Mode,
        padding_idx: Option<usize>,
        include_last_offset: bool,
    ) -> Result<Self, FileError> {
        let table = crate::io::load_table(path, name)?;
        QuantizedEmbeddingBag::from_table(table, mode, padding_idx, include_last_offset).map_err(
            |source| FileError::Table {
                name: name.to_string(),
                source,
            },
        )
    }
}

/// An embedding layer for inference over a table of any format; see the
/// [module notes](self).
#[derive(Clone, Debug)]
pub struct QuantizedEmbedding {
    table: OwnedTable,
    /// The table's rows, or the float layer's for a table of width 0.
    num_embeddings: usize,
    parallelism: Parallelism,
}

impl QuantizedEmbedding {
    /// `emb`'s table in `format`, with its threading. Its `padding_idx` row
    /// is looked up like any other (as in PyTorch, where the padding row is
    /// only special for gradients; it holds zeros if `emb` kept them).
    ///
    /// # Errors
    /// As [`QuantizedEmbeddingBag::from_float`].
    pub fn from_float(emb: &Embedding, format: Format) -> Result<Self, EmbeddingError> {
        refuse_max_norm(emb)?;
        let table = OwnedTable::from_f32(emb.weight(), emb.embedding_dim(), format)?;
        Ok(QuantizedEmbedding {
            table,
            num_embeddings: emb.num_embeddings(),
            parallelism: emb.parallelism(),
        })
    }

    /// A layer over a table already in hand.
    pub fn from_table(table: OwnedTable) -> Self {
        QuantizedEmbedding {
            num_embeddings: table.rows(),
            table,
            parallelism: Parallelism::Auto,
        }
    }

    /// The same layer with another threading choice for its kernels.
    pub fn with_parallelism(self, parallelism: Parallelism) -> Self {
        QuantizedEmbedding {
            parallelism,
            ..self
        }
    }

    /// The table.
    pub fn table(&self) -> &OwnedTable {
        &self.table
    }

    /// The table's format.
    pub fn format(&self) -> Format {
        self.table.format()
    }

    /// The number of rows.
    pub fn num_embeddings(&self) -> usize {
        self.num_embeddings
    }

    /// The row width.
    pub fn embedding_dim(&self) -> usize {
        self.table.dim()
    }

    /// Looks up `ids`, a batch of the given `shape`: the rows as `f32`s,
    /// shaped `[shape…, embedding_dim]`.
    ///
    /// # Errors
    /// [`EmbeddingError::IdsShape`] if `shape` does not hold `ids.len()`
    /// ids, or as [`table_gather`](crate::table_gather) (checked before
    /// anything is allocated), then [`EmbeddingError::AllocationFailed`] for
    /// the output.
    pub fn forward<I: Index>(
        &self,
        ids: &[I],
        shape: &[usize],
    ) -> Result<Embedded, EmbeddingError> {
        check_shape(ids.len(), shape)?;
        let len = rows_len(ids.len(), self.embedding_dim())?;
        ValidIds::new_with(self.parallelism, ids, self.num_embeddings())?;
        let mut values = crate::memory::zeroed_floats(len, "output")?;
        let mut shape_out = crate::buffer::with_capacity(shape.len() + 1, "output")?;
        shape_out.extend_from_slice(shape);
        shape_out.push(self.embedding_dim());
        self.forward_into(ids, &mut values)?;
        Ok(Embedded {
            values,
            shape: shape_out,
        })
    }

    /// The rows of `ids` into `out` (`ids.len() × embedding_dim`).
    ///
    /// # Errors
    /// As [`table_gather`](crate::table_gather); then `out` is untouched.
    pub fn forward_into<I: Index>(&self, ids: &[I], out: &mut [f32]) -> Result<(), EmbeddingError> {
        if self.embedding_dim() == 0 {
            // Nothing to read or write, but the checks of any width, with
            // the layer's row count.
            check_len(Operand::Output, 0, out.len())?;
            ValidIds::new(ids, self.num_embeddings)?;
            return Ok(());
        }
        table_gather_with(self.parallelism, self.table.as_ref(), ids, out)
    }

    /// Saves the table as tensor `name` of a safetensors file, as
    /// [`QuantizedEmbeddingBag::save`].
    ///
    /// # Errors
    /// As [`io::save_tables`](crate::io::save_tables).
    pub fn save(&self, path: impl AsRef<std::path::Path>, name: &str) -> Result<(), FileError> {
        crate::io::save_tables(path, &[(name, &self.table)])
    }

    /// A layer over tensor `name` of a safetensors file, in the format the
    /// file holds.
    ///
    /// # Errors
    /// As [`io::load_table`](crate::io::load_table).
    pub fn load(path: impl AsRef<std::path::Path>, name: &str) -> Result<Self, FileError> {
        Ok(QuantizedEmbedding::from_table(crate::io::load_table(
            path, name,
        )?))
    }
}

/// A table with `max_norm` cannot be frozen into a read-only format.
fn refuse_max_norm(emb: &Embedding) -> Result<(), EmbeddingError> {
    match emb.max_norm() {
        None => Ok(()),
        Some(max_norm) => Err(EmbeddingError::InvalidArgument {
            name: "max_norm",
            value: max_norm.to_string(),
            requirement: "unset: a quantized table is read-only, so rows cannot be renormalised",
        }),
    }
}

/// `padding_idx` must be a row of the table.
fn check_padding(table: &OwnedTable, padding_idx: Option<usize>) -> Result<(), EmbeddingError> {
    match padding_idx {
        Some(p) if p >= table.rows() => Err(EmbeddingError::PaddingIdxOutOfRange {
            padding_idx: i64::try_from(p).unwrap_or(i64::MAX),
            num_embeddings: table.rows(),
        }),
        _ => Ok(()),
    }
}
