//! [`QuantizedEmbedding`] and [`QuantizedEmbeddingBag`]: the crate's
//! inference layers over tables of any [`Format`] (`f32`, `f16`, `bf16`,
//! 8-, 4- and 2-bit rows) behind candle's interface.
//!
//! ```text
//! forward(ids):  ids made contiguous, read in place from candle's storage
//!                crate::QuantizedEmbedding{,Bag}::forward    table_gather / table_bag_forward
//!                the f32 result moved into a tensor          no copy
//! ```
//!
//! These are not custom ops: nothing here has a gradient (a packed table
//! cannot be trained in place), so the layer calls the crate's layer
//! directly and wraps its output. The table lives in the crate's
//! [`OwnedTable`], not in a candle tensor, because candle has no dtype for
//! the packed rows; [`QuantizedEmbedding::from_float`] packs a trained
//! [`Embedding`]'s weight.

use super::{Embedding, EmbeddingBag, Ids, bag_arguments, check_ids, check_table, kernel_error};
use crate::bags::Bags;
use crate::formats::{Format, OwnedTable};
use crate::pooling::Mode;
use crate::quantized;
use candle_core::{DType, Device, Error, Result, Storage, Tensor};

/// The rows of a table in any [`Format`] looked up from a candle id
/// tensor, as `f32`: `candle_nn::Embedding`'s forward over a packed table,
/// for inference.
///
/// # Example
/// ```
/// use candle_core::{Device, Tensor};
/// use candle_nn::Module;
/// use embedding_kernels::candle::{Embedding, QuantizedEmbedding};
/// use embedding_kernels::formats::Format;
///
/// let weight = Tensor::arange(0f32, 12., &Device::Cpu)?.reshape((4, 3))?;
/// let trained = Embedding::from_tensor(weight)?;
/// let packed = QuantizedEmbedding::from_float(&trained, Format::Int8)?;
/// let out = packed.forward(&Tensor::new(&[[3u32, 0]], &Device::Cpu)?)?;
/// assert_eq!(out.dims(), [1, 2, 3]);
/// // 8-bit rows hold each row's range in 255 steps: close, not equal.
/// let row: Vec<f32> = out.get(0)?.get(0)?.to_vec1()?;
/// assert!(row.iter().zip([9., 10., 11.]).all(|(a, b)| (a - b).abs() < 0.01));
/// # Ok::<(), candle_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct QuantizedEmbedding {
    layer: quantized::QuantizedEmbedding,
}

impl QuantizedEmbedding {
    /// A layer over the crate's inference layer (built from a file with
    /// `QuantizedEmbedding::load`, say).
    pub fn new(layer: quantized::QuantizedEmbedding) -> Self {
        QuantizedEmbedding { layer }
    }

    /// A layer over a table already in hand.
    pub fn from_table(table: OwnedTable) -> Self {
        QuantizedEmbedding::new(quantized::QuantizedEmbedding::from_table(table))
    }

    /// `emb`'s table stored in `format` (converted, or packed by PyTorch's
    /// rules).
    ///
    /// # Errors
    /// As [`Embedding::from_tensor`] for its weight, and a packing error (a
    /// row holding a NaN or an infinity, or one whose range overflows).
    pub fn from_float(emb: &Embedding, format: Format) -> Result<Self> {
        let (values, dim) = table_values(emb.embeddings())?;
        let table = OwnedTable::from_f32(&values, dim, format)
            .map_err(|e| kernel_error("quantized embedding", e))?;
        Ok(QuantizedEmbedding::from_table(table))
    }

    /// The crate's layer underneath.
    pub fn layer(&self) -> &quantized::QuantizedEmbedding {
        &self.layer
    }
}

impl candle_nn::Module for QuantizedEmbedding {
    /// `out[.., :] = table[ids[..], :]` as `f32`, of shape `[*ids.shape,
    /// dim]`.
    ///
    /// # Errors
    /// Ids not on the CPU or not of an integer dtype, or an id out of range.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let op = "embedding-kernels-quantized-lookup";
        let dims = ids.dims().to_vec();
        let out = with_ids(ids, op, |ids| {
            with_ids!(ids, |v| self.layer.forward(v, &dims)).map_err(|e| kernel_error(op, e))
        })?;
        Tensor::from_vec(out.values, out.shape, &Device::Cpu)
    }
}

/// Bags of rows of a table in any [`Format`], pooled as `f32` (sum, mean
/// or max, with per-sample weights and `padding_idx`):
/// [`EmbeddingBag`]'s forward over a packed table, for inference.
///
/// # Example
/// ```
/// use candle_core::{Device, Tensor};
/// use embedding_kernels::candle::{EmbeddingBag, QuantizedEmbeddingBag};
/// use embedding_kernels::formats::Format;
/// use embedding_kernels::Mode;
///
/// let weight = Tensor::arange(0f32, 12., &Device::Cpu)?.reshape((4, 3))?;
/// let trained = EmbeddingBag::from_tensor(weight, Mode::Sum)?;
/// let packed = QuantizedEmbeddingBag::from_float(&trained, Format::F16)?;
/// let ids = Tensor::new(&[3u32, 0, 1], &Device::Cpu)?;
/// let offsets = Tensor::new(&[0u32, 1], &Device::Cpu)?;
/// let out = packed.forward_offsets(&ids, &offsets, false, None)?;
/// // Small integers are exact in f16.
/// assert_eq!(out.to_vec2::<f32>()?, [[9., 10., 11.], [3., 5., 7.]]);
/// # Ok::<(), candle_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct QuantizedEmbeddingBag {
    layer: quantized::QuantizedEmbeddingBag,
}

impl QuantizedEmbeddingBag {
    /// A layer over the crate's inference layer. Its
    /// `include_last_offset` is not used: [`forward_offsets`](Self::forward_offsets)
    /// takes it per call, as [`EmbeddingBag::forward_offsets`] does.
    pub fn new(layer: quantized::QuantizedEmbeddingBag) -> Self {
        QuantizedEmbeddingBag { layer }
    }

    /// A layer over a table already in hand, pooling with `mode`.
    ///
    /// # Errors
    /// If `padding_idx` is not a row of `table`.
    pub fn from_table(table: OwnedTable, mode: Mode, padding_idx: Option<usize>) -> Result<Self> {
        let layer = quantized::QuantizedEmbeddingBag::from_table(table, mode, padding_idx, false)
            .map_err(|e| kernel_error("quantized embedding bag", e))?;
        Ok(QuantizedEmbeddingBag::new(layer))
    }

    /// `bag`'s table stored in `format`, with its mode and `padding_idx`.
    ///
    /// # Errors
    /// As [`QuantizedEmbedding::from_float`], and a `padding_idx` that is
    /// not a row of the table.
    pub fn from_float(bag: &EmbeddingBag, format: Format) -> Result<Self> {
        let (values, dim) = table_values(bag.embeddings())?;
        let table = OwnedTable::from_f32(&values, dim, format)
            .map_err(|e| kernel_error("quantized embedding bag", e))?;
        QuantizedEmbeddingBag::from_table(table, bag.mode(), bag.padding_idx())
    }

    /// The crate's layer underneath.
    pub fn layer(&self) -> &quantized::QuantizedEmbeddingBag {
        &self.layer
    }

    /// The bags of flat `ids` (`[n]`) cut at PyTorch's `offsets` (`[bags]`,
    /// or `[bags + 1]` with `include_last_offset`), each id's row times its
    /// `per_sample_weights` entry (`[n]`, `f32`, sum mode only): `[bags,
    /// dim]` `f32`. An empty bag is zeros.
    ///
    /// # Errors
    /// As [`EmbeddingBag::forward_offsets`].
    pub fn forward_offsets(
        &self,
        ids: &Tensor,
        offsets: &Tensor,
        include_last_offset: bool,
        per_sample_weights: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (bags, weights) = bag_arguments(
            ids,
            offsets,
            include_last_offset,
            per_sample_weights,
            [
                "quantized embedding bag offsets",
                "quantized embedding bag per_sample_weights",
            ],
        )?;
        self.pool(ids, &bags, weights.as_deref())
    }

    fn pool(&self, ids: &Tensor, bags: &Bags, weights: Option<&[f32]>) -> Result<Tensor> {
        let op = "embedding-kernels-quantized-bag";
        let out = with_ids(ids, op, |ids| {
            with_ids!(ids, |v| self.layer.forward(v, bags, weights))
                .map_err(|e| kernel_error(op, e))
        })?;
        // Max mode's winners are for a backward, which a packed table has
        // not: only the values are returned.
        let [num_bags, dim] = out.shape;
        Tensor::from_vec(out.values, (num_bags, dim), &Device::Cpu)
    }
}

impl candle_nn::Module for QuantizedEmbeddingBag {
    /// Bags of the same length, one per row of `ids` (`[bags, len]`):
    /// `[bags, dim]` `f32`.
    ///
    /// # Errors
    /// As [`QuantizedEmbeddingBag::forward_offsets`], and ids that are not
    /// 2-D.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        check_ids(ids)?;
        let (num_bags, len) = ids.dims2()?;
        let bags =
            Bags::fixed(num_bags, len).map_err(|e| kernel_error("quantized embedding bag", e))?;
        self.pool(&ids.flatten_all()?, &bags, None)
    }
}

/// A candle table's values as `f32` (half tables widened exactly) and its
/// row width.
fn table_values(weight: &Tensor) -> Result<(Vec<f32>, usize)> {
    check_table(weight)?;
    let dim = weight.dim(1)?;
    let values = weight
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    Ok((values, dim))
}

/// Runs `f` on `ids` as the kernels take them, read in place from candle's
/// storage when the tensor is contiguous.
fn with_ids<R>(ids: &Tensor, op: &'static str, f: impl FnOnce(Ids<'_>) -> Result<R>) -> Result<R> {
    check_ids(ids)?;
    let ids = ids.contiguous()?;
    let (storage, layout) = ids.storage_and_layout();
    match &*storage {
        Storage::Cpu(cpu) => f(Ids::new(cpu, layout, op)?),
        // check_ids has refused every other device; an error all the same.
        _ => Err(Error::Msg(format!("{op}: the ids are not on the CPU"))),
    }
}
