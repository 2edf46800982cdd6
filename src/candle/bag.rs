//! [`EmbeddingBag`]: the bag op and its backward op (sum and mean through
//! the grouped backward, max through the forward's winners).

use super::embedding::embedding;
use super::{
    Ids, bag_arguments, check_ids, check_table, contiguous, kernel_error, matrix_width, zeroed,
};
use crate::bags::Bags;
use crate::parallel::Parallelism;
use crate::pooling::{Mode, Pooling};
use crate::{bag_backward_with, bag_forward_with, bag_max_backward_with};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, DType, Error, Layout, Result, Shape, Tensor};
use std::sync::Mutex;

/// A bag layer over a candle tensor: PyTorch's `nn.EmbeddingBag` (sum,
/// mean or max of each bag's rows, `offsets`, `per_sample_weights`,
/// `padding_idx`) with this crate's bag kernels forward and backward.
///
/// `forward(ids)` (the [`Module`](candle_nn::Module)) takes `[bags, len]`
/// ids, one bag a row; [`EmbeddingBag::forward_offsets`] takes flat ids and
/// PyTorch's offsets. Both return `[bags, dim]`. The table must be `f32`.
/// With a `Var` table, `loss.backward()` gives its gradient (sum and mean
/// through [`bag_backward_with`], max through [`bag_max_backward_with`]:
/// each column's gradient goes to the first row that held the maximum).
/// `per_sample_weights` get no gradient.
///
/// # Example
/// ```
/// use candle_core::{Device, Tensor};
/// use embedding_kernels::candle::EmbeddingBag;
/// use embedding_kernels::Mode;
///
/// let weight = Tensor::arange(0f32, 12., &Device::Cpu)?.reshape((4, 3))?;
/// let bag = EmbeddingBag::from_tensor(weight, Mode::Sum)?;
/// // Bag 0 holds ids[0..1], bag 1 holds ids[1..3].
/// let ids = Tensor::new(&[3u32, 0, 1], &Device::Cpu)?;
/// let offsets = Tensor::new(&[0u32, 1], &Device::Cpu)?;
/// let out = bag.forward_offsets(&ids, &offsets, false, None)?;
/// assert_eq!(out.to_vec2::<f32>()?, [[9., 10., 11.], [3., 5., 7.]]);
/// # Ok::<(), candle_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct EmbeddingBag {
    weight: Tensor,
    mode: Mode,
    padding_idx: Option<usize>,
}

impl EmbeddingBag {
    /// A bag layer over `weight` (`[num_embeddings, dim]`, `f32`).
    ///
    /// # Errors
    /// If `weight` is not an `f32` matrix on the CPU.
    pub fn from_tensor(weight: Tensor, mode: Mode) -> Result<Self> {
        check_bag_table(&weight)?;
        Ok(EmbeddingBag {
            weight,
            mode,
            padding_idx: None,
        })
    }

    /// The layer with a row left out of every bag (and of a mean's count),
    /// as PyTorch's `padding_idx`; it gets no gradient. Checked against the
    /// table at the forward pass.
    pub fn with_padding_idx(self, padding_idx: Option<usize>) -> Self {
        EmbeddingBag {
            padding_idx,
            ..self
        }
    }

    /// The table, `[num_embeddings, dim]`.
    pub fn embeddings(&self) -> &Tensor {
        &self.weight
    }

    /// How each bag is pooled.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The row left out of every bag, if any.
    pub fn padding_idx(&self) -> Option<usize> {
        self.padding_idx
    }

    /// The bags of flat `ids` (`[n]`) cut at PyTorch's `offsets` (`[bags]`,
    /// or `[bags + 1]` with `include_last_offset`), each id's row times its
    /// `per_sample_weights` entry (`[n]`, `f32`, sum mode only): `[bags,
    /// dim]`. An empty bag is zeros.
    ///
    /// # Errors
    /// A tensor not on the CPU, ids or offsets that are not 1-D integers,
    /// bad offsets, weights that are not `[n]` `f32` or not with
    /// [`Mode::Sum`], a `padding_idx` or an id out of range.
    pub fn forward_offsets(
        &self,
        ids: &Tensor,
        offsets: &Tensor,
        include_last_offset: bool,
        per_sample_weights: Option<&Tensor>,
    ) -> Result<Tensor> {
        check_ids(ids)?;
        let (bags, weights) = bag_arguments(
            ids,
            offsets,
            include_last_offset,
            per_sample_weights,
            ["embedding bag offsets", "embedding bag per_sample_weights"],
        )?;
        self.apply(ids, bags, weights)
    }

    fn apply(&self, ids: &Tensor, bags: Bags, weights: Option<Vec<f32>>) -> Result<Tensor> {
        check_bag_table(&self.weight)?;
        let op = BagForward {
            bags,
            mode: self.mode,
            padding_idx: self.padding_idx,
            weights,
            max_indices: Mutex::new(Vec::new()),
        };
        let weight = self.weight.contiguous()?;
        weight.apply_op2(&ids.contiguous()?, op)
    }
}

impl candle_nn::Module for EmbeddingBag {
    /// Bags of the same length, one per row of `ids` (`[bags, len]`):
    /// `[bags, dim]`.
    ///
    /// # Errors
    /// As [`EmbeddingBag::forward_offsets`], and ids that are not 2-D.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        check_ids(ids)?;
        let (num_bags, len) = ids.dims2()?;
        let bags = Bags::fixed(num_bags, len).map_err(|e| kernel_error("embedding bag", e))?;
        self.apply(&ids.flatten_all()?, bags, None)
    }
}

/// An [`EmbeddingBag`] of `in_size` rows of `out_size` values from `vb`,
/// under the name `weight` with [`embedding`]'s initialisation.
///
/// # Errors
/// As [`embedding`].
///
/// # Example
/// ```
/// use candle_core::{DType, Device, Tensor};
/// use candle_nn::{Module, VarBuilder, VarMap};
/// use embedding_kernels::Mode;
///
/// let varmap = VarMap::new();
/// let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
/// let bags = embedding_kernels::candle::embedding_bag(100, 8, Mode::Mean, vb.pp("bag"))?;
/// let ids = Tensor::new(&[[1u32, 2, 3], [4, 5, 6]], &Device::Cpu)?; // two bags of three
/// assert_eq!(bags.forward(&ids)?.dims(), [2, 8]);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn embedding_bag(
    in_size: usize,
    out_size: usize,
    mode: Mode,
    vb: candle_nn::VarBuilder,
) -> Result<EmbeddingBag> {
    let table = embedding(in_size, out_size, vb)?;
    EmbeddingBag::from_tensor(table.embeddings().clone(), mode)
}

/// A table the bag kernels serve: an `f32` matrix on the CPU.
fn check_bag_table(weight: &Tensor) -> Result<()> {
    check_table(weight)?;
    match weight.dtype() {
        DType::F32 => Ok(()),
        other => Err(Error::UnsupportedDTypeForOp(other, "embedding bag table")),
    }
}

/// The bags' arguments, owned, as the forward and backward ops keep them.
#[derive(Clone)]
struct BagArgs {
    bags: Bags,
    mode: Mode,
    padding_idx: Option<usize>,
    weights: Option<Vec<f32>>,
}

impl BagArgs {
    fn pooling(&self) -> Pooling<'_> {
        Pooling {
            mode: self.mode,
            per_sample_weights: self.weights.as_deref(),
            padding_idx: self.padding_idx,
            scale_grad_by_freq: false,
        }
    }
}

/// The bag forward custom op: `(weight [rows, dim], ids [n]) -> [bags,
/// dim]`. Max mode keeps the winners' ids for its backward.
struct BagForward {
    bags: Bags,
    mode: Mode,
    padding_idx: Option<usize>,
    weights: Option<Vec<f32>>,
    max_indices: Mutex<Vec<i64>>,
}

impl BagForward {
    fn args(&self) -> BagArgs {
        BagArgs {
            bags: self.bags.clone(),
            mode: self.mode,
            padding_idx: self.padding_idx,
            weights: self.weights.clone(),
        }
    }
}

impl CustomOp2 for BagForward {
    fn name(&self) -> &'static str {
        "embedding-kernels-bag"
    }

    fn cpu_fwd(
        &self,
        weight: &CpuStorage,
        weight_layout: &Layout,
        ids: &CpuStorage,
        ids_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let dim = matrix_width(weight_layout, op)?;
        let CpuStorage::F32(w) = weight else {
            return Err(Error::UnsupportedDTypeForOp(weight.dtype(), op));
        };
        let w = contiguous(w, weight_layout, op)?;
        let ids = Ids::new(ids, ids_layout, op)?;
        let args = self.args();
        let len = self.bags.len() * dim;
        let mut out = zeroed::<f32>(len, op)?;
        let mut max_indices = match self.mode {
            Mode::Max => zeroed::<i64>(len, op)?,
            _ => Vec::new(),
        };
        with_ids!(ids, |v| bag_forward_with(
            Parallelism::Auto,
            w,
            dim,
            v,
            &args.bags,
            &args.pooling(),
            &mut out,
            &mut max_indices
        ))
        .map_err(|e| kernel_error(op, e))?;
        if self.mode == Mode::Max {
            // The op's own record: candle calls `bwd` on this op, for this
            // forward.
            *self.max_indices.lock().unwrap_or_else(|e| e.into_inner()) = max_indices;
        }
        Ok((CpuStorage::F32(out), Shape::from((self.bags.len(), dim))))
    }

    fn bwd(
        &self,
        weight: &Tensor,
        ids: &Tensor,
        _out: &Tensor,
        grad_out: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let max_indices = match self.mode {
            Mode::Max => self
                .max_indices
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            _ => Vec::new(),
        };
        let op = BagGrad {
            rows: weight.dim(0)?,
            args: self.args(),
            max_indices,
        };
        let grad = grad_out.contiguous()?.apply_op2_no_bwd(ids, &op)?;
        Ok((Some(grad), None))
    }
}

/// The bag backward custom op: `(grad_out [bags, dim], ids [n]) -> [rows,
/// dim]`, the table's dense gradient.
struct BagGrad {
    rows: usize,
    args: BagArgs,
    max_indices: Vec<i64>,
}

impl CustomOp2 for BagGrad {
    fn name(&self) -> &'static str {
        "embedding-kernels-bag-backward"
    }

    fn cpu_fwd(
        &self,
        grad_out: &CpuStorage,
        grad_layout: &Layout,
        ids: &CpuStorage,
        ids_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let &[_, dim] = grad_layout.dims() else {
            return Err(Error::Msg(format!(
                "{op}: the gradient has shape {:?}, not [bags, dim]",
                grad_layout.shape()
            )));
        };
        let CpuStorage::F32(g) = grad_out else {
            return Err(Error::UnsupportedDTypeForOp(grad_out.dtype(), op));
        };
        let g = contiguous(g, grad_layout, op)?;
        let mut grad = zeroed::<f32>(self.rows * dim, op)?;
        let par = Parallelism::Auto;
        let done = match self.args.mode {
            Mode::Max => bag_max_backward_with(par, g, dim, &self.max_indices, &mut grad),
            _ => {
                let ids = Ids::new(ids, ids_layout, op)?;
                with_ids!(ids, |v| bag_backward_with(
                    par,
                    g,
                    dim,
                    v,
                    &self.args.bags,
                    &self.args.pooling(),
                    &mut grad
                ))
            }
        };
        done.map_err(|e| kernel_error(op, e))?;
        Ok((CpuStorage::F32(grad), Shape::from((self.rows, dim))))
    }
}
