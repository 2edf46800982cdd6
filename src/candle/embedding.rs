//! [`Embedding`]: the lookup op and its dense backward op.

use super::{Ids, check_ids, check_table, contiguous, kernel_error, matrix_width, zeroed};
use crate::parallel::Parallelism;
use crate::{dense_backward_with, gather_half_with, gather_with};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Error, Layout, Result, Shape, Tensor};
use half::{bf16, f16};

/// An embedding layer over a candle tensor: `candle_nn::Embedding`'s
/// contract, with this crate's kernels for the lookup and its gradient.
///
/// `forward(ids)` takes ids of any shape and integer dtype and returns
/// `[*ids.shape, hidden_size]` in the table's dtype. With a `Var` table,
/// `loss.backward()` gives the table's gradient, so candle's optimisers
/// train it as they train `candle_nn::Embedding`.
///
/// # Example
/// ```
/// use candle_core::{DType, Device, Tensor};
/// use candle_nn::Module;
/// use embedding_kernels::candle::Embedding;
///
/// let weight = Tensor::arange(0f32, 12., &Device::Cpu)?.reshape((4, 3))?;
/// let emb = Embedding::from_tensor(weight)?;
/// let ids = Tensor::new(&[[3u32, 0], [1, 3]], &Device::Cpu)?;
/// let out = emb.forward(&ids)?;
/// assert_eq!(out.dims(), [2, 2, 3]);
/// assert_eq!(out.get(0)?.get(0)?.to_vec1::<f32>()?, [9., 10., 11.]);
///
/// // A bad id is an error that names it.
/// let err = emb.forward(&Tensor::new(&[0i64, 7], &Device::Cpu)?).unwrap_err();
/// assert!(err.to_string().contains("id 7 at position 1"));
/// # Ok::<(), candle_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Embedding {
    weight: Tensor,
    hidden_size: usize,
}

impl Embedding {
    /// A layer over `weight` (`[num_embeddings, hidden_size]`), as
    /// `candle_nn::Embedding::new`: nothing is checked until the forward
    /// pass. [`Embedding::from_tensor`] checks at once.
    pub fn new(weight: Tensor, hidden_size: usize) -> Self {
        Embedding {
            weight,
            hidden_size,
        }
    }

    /// A layer over a table already in hand, its width read from the
    /// tensor.
    ///
    /// # Errors
    /// If `weight` is not a matrix, not on the CPU, or not `f32`, `f16` or
    /// `bf16`.
    pub fn from_tensor(weight: Tensor) -> Result<Self> {
        check_table(&weight)?;
        let hidden_size = weight.dim(1)?;
        Ok(Embedding::new(weight, hidden_size))
    }

    /// The table, `[num_embeddings, hidden_size]`.
    pub fn embeddings(&self) -> &Tensor {
        &self.weight
    }

    /// The width of a row.
    pub fn hidden_size(&self) -> usize {
        self.hidden_size
    }
}

impl candle_nn::Module for Embedding {
    /// `out[.., :] = weight[ids[..], :]`, of shape `[*ids.shape, hidden_size]`.
    ///
    /// # Errors
    /// A tensor not on the CPU, a table that is not an `f32`, `f16` or
    /// `bf16` matrix `hidden_size` wide, ids that are not integers, or an id
    /// out of range.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        check_table(&self.weight)?;
        let width = self.weight.dim(1)?;
        if width != self.hidden_size {
            return Err(Error::Msg(format!(
                "embedding: the table is {width} wide but hidden_size is {}",
                self.hidden_size
            )));
        }
        check_ids(ids)?;
        let weight = self.weight.contiguous()?;
        let ids = ids.contiguous()?;
        weight.apply_op2(&ids, Lookup)
    }
}

/// An [`Embedding`] of `in_size` rows of `out_size` values, from `vb` under
/// the name `weight` with `candle_nn::embedding`'s initialisation (normal,
/// mean 0, standard deviation 1): the same tensor, so a checkpoint written
/// for `candle_nn::embedding` loads unchanged, and a `VarMap` seeded alike
/// holds the same values.
///
/// # Errors
/// As `VarBuilder::get_with_hints` (a missing tensor or a wrong shape), and
/// as [`Embedding::from_tensor`] for the tensor it gives.
///
/// # Example
/// ```
/// use candle_core::{DType, Device, Tensor};
/// use candle_nn::{Module, VarBuilder, VarMap};
///
/// let varmap = VarMap::new();
/// let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
/// let emb = embedding_kernels::candle::embedding(100, 8, vb.pp("tok"))?;
/// let out = emb.forward(&Tensor::new(&[1u32, 2, 3], &Device::Cpu)?)?;
/// assert_eq!(out.dims(), [3, 8]);
/// assert!(varmap.data().lock().unwrap().contains_key("tok.weight"));
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn embedding(in_size: usize, out_size: usize, vb: candle_nn::VarBuilder) -> Result<Embedding> {
    let weight = vb.get_with_hints(
        (in_size, out_size),
        "weight",
        candle_nn::Init::Randn {
            mean: 0.,
            stdev: 1.,
        },
    )?;
    Embedding::from_tensor(weight)
}

/// The forward custom op: `(weight [rows, dim], ids [..]) -> [.., dim]`.
struct Lookup;

impl CustomOp2 for Lookup {
    fn name(&self) -> &'static str {
        "embedding-kernels-lookup"
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
        let ids = Ids::new(ids, ids_layout, op)?;
        let mut dims = ids_layout.dims().to_vec();
        dims.push(dim);
        let len = with_ids!(ids, |v| v.len()) * dim;
        let par = Parallelism::Auto;
        let out = match weight {
            CpuStorage::F32(w) => {
                let w = contiguous(w, weight_layout, op)?;
                let mut out = zeroed::<f32>(len, op)?;
                with_ids!(ids, |v| gather_with(par, w, dim, v, &mut out))
                    .map_err(|e| kernel_error(op, e))?;
                CpuStorage::F32(out)
            }
            CpuStorage::F16(w) => {
                let w = contiguous(w, weight_layout, op)?;
                let mut out = zeroed::<f16>(len, op)?;
                with_ids!(ids, |v| gather_half_with(par, w, dim, v, &mut out))
                    .map_err(|e| kernel_error(op, e))?;
                CpuStorage::F16(out)
            }
            CpuStorage::BF16(w) => {
                let w = contiguous(w, weight_layout, op)?;
                let mut out = zeroed::<bf16>(len, op)?;
                with_ids!(ids, |v| gather_half_with(par, w, dim, v, &mut out))
                    .map_err(|e| kernel_error(op, e))?;
                CpuStorage::BF16(out)
            }
            other => return Err(Error::UnsupportedDTypeForOp(other.dtype(), op)),
        };
        Ok((out, Shape::from(dims)))
    }

    fn bwd(
        &self,
        weight: &Tensor,
        ids: &Tensor,
        _out: &Tensor,
        grad_out: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let rows = weight.dim(0)?;
        // The gradient candle hands back may be strided (a broadcast of a
        // sum's gradient has stride 0): the kernel reads rows.
        let grad_out = grad_out.contiguous()?;
        let grad = grad_out.apply_op2_no_bwd(ids, &DenseGrad { rows })?;
        Ok((Some(grad), None))
    }
}

/// The backward custom op: `(grad_out [.., dim], ids [..]) -> [rows, dim]`,
/// the table's dense gradient.
struct DenseGrad {
    rows: usize,
}

impl CustomOp2 for DenseGrad {
    fn name(&self) -> &'static str {
        "embedding-kernels-dense-backward"
    }

    fn cpu_fwd(
        &self,
        grad_out: &CpuStorage,
        grad_layout: &Layout,
        ids: &CpuStorage,
        ids_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let dim = grad_layout.dims().last().copied().unwrap_or(0);
        let ids = Ids::new(ids, ids_layout, op)?;
        let len = self.rows * dim;
        let par = Parallelism::Auto;
        let sum = |g: &[f32]| -> Result<Vec<f32>> {
            let mut grad = zeroed::<f32>(len, op)?;
            with_ids!(ids, |v| dense_backward_with(
                par, g, dim, v, None, false, &mut grad
            ))
            .map_err(|e| kernel_error(op, e))?;
            Ok(grad)
        };
        let grad = match grad_out {
            CpuStorage::F32(g) => CpuStorage::F32(sum(contiguous(g, grad_layout, op)?)?),
            CpuStorage::F16(g) => {
                let wide: Vec<f32> = contiguous(g, grad_layout, op)?
                    .iter()
                    .map(|x| x.to_f32())
                    .collect();
                CpuStorage::F16(sum(&wide)?.into_iter().map(f16::from_f32).collect())
            }
            CpuStorage::BF16(g) => {
                let wide: Vec<f32> = contiguous(g, grad_layout, op)?
                    .iter()
                    .map(|x| x.to_f32())
                    .collect();
                CpuStorage::BF16(sum(&wide)?.into_iter().map(bf16::from_f32).collect())
            }
            other => return Err(Error::UnsupportedDTypeForOp(other.dtype(), op)),
        };
        Ok((grad, Shape::from((self.rows, dim))))
    }
}
