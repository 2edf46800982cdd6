//! The crate's kernels as a candle backend (feature `candle`): [`Embedding`]
//! is `candle_nn::Embedding` with this crate's lookup and backward, and
//! [`embedding`] builds it the way `candle_nn::embedding` does, so a model
//! switches with one line and loads its checkpoint unchanged.
//! [`EmbeddingBag`] (built by [`embedding_bag`]) brings the bags: sum, mean
//! and max over offsets, with per-sample weights and `padding_idx`, on `f32`
//! tables.
//!
//! ```text
//! forward(ids):   weight, ids made contiguous (a no-op when they are)
//!                 out = Lookup.cpu_fwd(weight, ids)        gather, [*ids.shape, dim]
//! backward(g):    grad_weight = DenseGrad.cpu_fwd(g, ids)  dense_backward, [rows, dim]
//!                 ids get no gradient
//! ```
//!
//! 1. **Custom ops.** The lookup is a [`CustomOp2`] over `(weight, ids)`;
//!    candle records it in the graph like its own ops, and calls its `bwd`
//!    from `loss.backward()`. The backward is a second custom op over
//!    `(grad_out, ids)`, run without a graph of its own.
//! 2. **Storage read in place.** `cpu_fwd` borrows the slice of candle's
//!    storage that a contiguous layout spans; nothing is copied on the way
//!    in. A strided weight (a transposed view, say) is made contiguous by
//!    candle's own `contiguous()` before the op, which candle differentiates,
//!    so its gradient still reaches the view's source.
//! 3. **Dtypes.** An `f32` table goes to [`gather_with`] and
//!    [`dense_backward_with`]; an `f16` or `bf16` table's rows are copied
//!    as they are by [`gather_half_with`] (the output keeps the table's
//!    dtype, as `index_select` does), and its gradient is summed in `f32`
//!    and rounded once to the table's dtype. Ids may be `u8`, `u32`, `i16`,
//!    `i32` or `i64`; `u8` and `i16` ids are widened into a buffer (the
//!    kernels take `u32` and `i32`), the others are read in place.
//! 4. **Bags.** [`EmbeddingBag`]'s forward is a third op over `(weight,
//!    ids)` that owns the checked [`Bags`] and the pooling arguments, and
//!    for max mode records the winners' ids, which its `bwd` hands to
//!    [`bag_max_backward_with`]; sum and mean go back through
//!    [`bag_backward_with`].
//! 5. **Errors.** Every problem is a [`candle_core::Error`], never a panic:
//!    a tensor not on the CPU, a dtype the crate does not serve, a shape
//!    that is not a table, and a bad id (the message names its flat
//!    position and its value).
//!
//! Where this differs from candle: candle's `index_select` reads an id equal
//! to its dtype's largest value (`255` for `u8`, `u32::MAX`, `i64::MAX`) as
//! "no row" and gives zeros; here such an id is a row number like any other,
//! so it is either that row or an out-of-range error.

use crate::bags::Bags;
use crate::error::EmbeddingError;
use crate::parallel::Parallelism;
use crate::pooling::{Mode, Pooling};
use crate::{
    bag_backward_with, bag_forward_with, bag_max_backward_with, dense_backward_with,
    gather_half_with, gather_with,
};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, DType, Error, Layout, Result, Shape, Tensor};
use half::{bf16, f16};
use std::sync::Mutex;

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

/// A table this module serves: a CPU matrix of `f32`, `f16` or `bf16`.
fn check_table(weight: &Tensor) -> Result<()> {
    check_cpu(weight, "table")?;
    match weight.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => {}
        other => return Err(Error::UnsupportedDTypeForOp(other, "embedding table")),
    }
    if weight.rank() != 2 {
        return Err(Error::UnexpectedNumberOfDims {
            expected: 2,
            got: weight.rank(),
            shape: weight.shape().clone(),
        }
        .bt());
    }
    Ok(())
}

/// Ids this module serves: a CPU tensor of an integer dtype.
fn check_ids(ids: &Tensor) -> Result<()> {
    check_cpu(ids, "ids")?;
    match ids.dtype() {
        DType::U8 | DType::U32 | DType::I16 | DType::I32 | DType::I64 => Ok(()),
        other => Err(Error::UnsupportedDTypeForOp(other, "embedding ids")),
    }
}

fn check_cpu(t: &Tensor, what: &str) -> Result<()> {
    if t.device().is_cpu() {
        Ok(())
    } else {
        Err(Error::Msg(format!(
            "embedding-kernels runs on the CPU only, but the {what} is on {:?}",
            t.device().location()
        )))
    }
}

/// The slice of `storage` that a contiguous `layout` spans.
fn contiguous<'a, T>(values: &'a [T], layout: &Layout, op: &'static str) -> Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&values[start..end]),
        None => Err(Error::RequiresContiguous { op }.bt()),
    }
}

/// Ids as the kernels take them: borrowed where the dtype is an
/// [`Index`](crate::Index), widened where it is not.
enum Ids<'a> {
    U32(std::borrow::Cow<'a, [u32]>),
    I32(std::borrow::Cow<'a, [i32]>),
    I64(&'a [i64]),
}

impl<'a> Ids<'a> {
    fn new(storage: &'a CpuStorage, layout: &Layout, op: &'static str) -> Result<Self> {
        Ok(match storage {
            CpuStorage::U8(v) => Ids::U32(
                contiguous(v, layout, op)?
                    .iter()
                    .map(|&i| i.into())
                    .collect(),
            ),
            CpuStorage::U32(v) => Ids::U32(contiguous(v, layout, op)?.into()),
            CpuStorage::I16(v) => Ids::I32(
                contiguous(v, layout, op)?
                    .iter()
                    .map(|&i| i.into())
                    .collect(),
            ),
            CpuStorage::I32(v) => Ids::I32(contiguous(v, layout, op)?.into()),
            CpuStorage::I64(v) => Ids::I64(contiguous(v, layout, op)?),
            other => return Err(Error::UnsupportedDTypeForOp(other.dtype(), op)),
        })
    }
}

/// Runs `$body` with `$ids` bound to the id slice, whatever its type.
macro_rules! with_ids {
    ($ids:expr, |$v:ident| $body:expr) => {
        match $ids {
            Ids::U32(ref ids) => {
                let $v: &[u32] = ids;
                $body
            }
            Ids::I32(ref ids) => {
                let $v: &[i32] = ids;
                $body
            }
            Ids::I64(ids) => {
                let $v: &[i64] = ids;
                $body
            }
        }
    };
}

/// A kernel error as a candle error, its message naming the operation.
fn kernel_error(op: &'static str, err: EmbeddingError) -> Error {
    Error::Msg(format!("{op}: {err}")).bt()
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
        let &[_, dim] = weight_layout.dims() else {
            return Err(Error::Msg(format!(
                "{op}: the table has shape {:?}, not a matrix",
                weight_layout.shape()
            )));
        };
        let ids = Ids::new(ids, ids_layout, op)?;
        let mut dims = ids_layout.dims().to_vec();
        dims.push(dim);
        let len = with_ids!(ids, |v| v.len()) * dim;
        let par = Parallelism::Auto;
        let out = match weight {
            CpuStorage::F32(w) => {
                let w = contiguous(w, weight_layout, op)?;
                let mut out = vec![0f32; len];
                with_ids!(ids, |v| gather_with(par, w, dim, v, &mut out))
                    .map_err(|e| kernel_error(op, e))?;
                CpuStorage::F32(out)
            }
            CpuStorage::F16(w) => {
                let w = contiguous(w, weight_layout, op)?;
                let mut out = vec![f16::ZERO; len];
                with_ids!(ids, |v| gather_half_with(par, w, dim, v, &mut out))
                    .map_err(|e| kernel_error(op, e))?;
                CpuStorage::F16(out)
            }
            CpuStorage::BF16(w) => {
                let w = contiguous(w, weight_layout, op)?;
                let mut out = vec![bf16::ZERO; len];
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
            let mut grad = vec![0f32; len];
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
        check_ids(offsets)?;
        let n = ids.dims1()?;
        let offsets = offsets.to_dtype(DType::I64)?.to_vec1::<i64>()?;
        let bags = Bags::from_offsets(&offsets, n, include_last_offset)
            .map_err(|e| kernel_error("embedding bag offsets", e))?;
        let weights = match per_sample_weights {
            None => None,
            Some(w) => {
                check_cpu(w, "per_sample_weights")?;
                if w.dtype() != DType::F32 {
                    return Err(Error::UnsupportedDTypeForOp(
                        w.dtype(),
                        "embedding bag per_sample_weights",
                    ));
                }
                Some(w.flatten_all()?.to_vec1::<f32>()?)
            }
        };
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
    EmbeddingBag::from_tensor(table.weight, mode)
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
        let &[_, dim] = weight_layout.dims() else {
            return Err(Error::Msg(format!(
                "{op}: the table has shape {:?}, not a matrix",
                weight_layout.shape()
            )));
        };
        let CpuStorage::F32(w) = weight else {
            return Err(Error::UnsupportedDTypeForOp(weight.dtype(), op));
        };
        let w = contiguous(w, weight_layout, op)?;
        let ids = Ids::new(ids, ids_layout, op)?;
        let args = self.args();
        let len = self.bags.len() * dim;
        let mut out = vec![0f32; len];
        let mut max_indices = match self.mode {
            Mode::Max => vec![0i64; len],
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
        let mut grad = vec![0f32; self.rows * dim];
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
