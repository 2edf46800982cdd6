//! The fused sparse optimiser steps: backward and update in one pass over
//! the rows a batch touched, on the caller's table in place. The lookup's
//! (`embedding_sparse_*_step`) and the bags' (`embedding_bag_sparse_*_step`)
//! take the same optimisers: SGD, and Adagrad over accumulators the caller
//! holds (PyTorch's `state["sum"]`).

use crate::bag::{bags, mode, sample_weights};
use crate::convert::{
    Ids, grad_output, invalid, padding, rows_bytes, rows_in_place, slice, table_in_place, with_ids,
    writable,
};
use crate::openmp;
use embedding_kernels::{
    AdagradOn, Bags, Mode, Pooling, RowWiseAdagradOn, Sgd, SparseOptimizer, bag_sparse_step_with,
    sparse_step_with,
};
use numpy::{PyArrayDyn, PyReadonlyArrayDyn};
use pyo3::prelude::*;

/// The table a step updates: float32 `[rows, dim]`, C-contiguous.
struct Weight<'py> {
    array: Bound<'py, PyArrayDyn<f32>>,
    rows: usize,
    dim: usize,
}

impl<'py> Weight<'py> {
    fn extract(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        let (array, rows, dim) = table_in_place(obj, "weight")?;
        Ok(Weight { array, rows, dim })
    }
}

/// A checked batch: its ids, its output gradient (as wide as the table),
/// and how the gradient reaches the rows.
struct Batch<'py> {
    ids: Ids<'py>,
    grad: PyReadonlyArrayDyn<'py, f32>,
    dim: usize,
    padding_idx: Option<usize>,
    scale_grad_by_freq: bool,
    /// The bags and their pooling; `None` for the lookup.
    bags: Option<BagsOf<'py>>,
}

struct BagsOf<'py> {
    bags: Bags,
    mode: Mode,
    weights: Option<PyReadonlyArrayDyn<'py, f32>>,
}

/// `grad_out`'s embedding_dim against the table's.
fn same_width(grad_dim: usize, dim: usize) -> PyResult<()> {
    if grad_dim != dim {
        return Err(invalid(format!(
            "grad_out has embedding_dim {grad_dim}, weight has {dim}"
        )));
    }
    Ok(())
}

impl<'py> Batch<'py> {
    /// The lookup's batch: `grad_out` of `ids.shape + [dim]`.
    fn lookup(
        weight: &Weight<'py>,
        ids: &Bound<'py, PyAny>,
        grad_out: &Bound<'py, PyAny>,
        padding_idx: Option<i64>,
        scale_grad_by_freq: bool,
    ) -> PyResult<Self> {
        let ids = Ids::extract(ids, "ids")?;
        let (grad, grad_dim) = grad_output(grad_out, ids.shape())?;
        same_width(grad_dim, weight.dim)?;
        Ok(Batch {
            ids,
            grad,
            dim: weight.dim,
            padding_idx: padding(padding_idx, weight.rows)?,
            scale_grad_by_freq,
            bags: None,
        })
    }

    /// A bag batch: `grad_out` of `[bags, dim]`, in sum or mean mode.
    #[allow(clippy::too_many_arguments)]
    fn bags(
        weight: &Weight<'py>,
        ids: &Bound<'py, PyAny>,
        offsets: Option<&Bound<'py, PyAny>>,
        grad_out: &Bound<'py, PyAny>,
        mode_name: &str,
        per_sample_weights: Option<&Bound<'py, PyAny>>,
        include_last_offset: bool,
        padding_idx: Option<i64>,
        scale_grad_by_freq: bool,
    ) -> PyResult<Self> {
        let ids = Ids::extract(ids, "ids")?;
        let bags = bags(&ids, offsets, include_last_offset)?;
        let mode = mode(mode_name)?;
        if mode == Mode::Max {
            return Err(invalid(
                "a fused step takes mode \"sum\" or \"mean\"; max's gradient needs the forward's \
                 max_indices (embedding_bag_backward)"
                    .to_string(),
            ));
        }
        let weights = sample_weights(per_sample_weights, &ids)?;
        let (grad, grad_dim) = grad_output(grad_out, &[bags.len()])?;
        same_width(grad_dim, weight.dim)?;
        Ok(Batch {
            ids,
            grad,
            dim: weight.dim,
            padding_idx: padding(padding_idx, weight.rows)?,
            scale_grad_by_freq,
            bags: Some(BagsOf {
                bags,
                mode,
                weights,
            }),
        })
    }

    /// The crate's fused step of `optimizer` on `w` (the table's values),
    /// with the GIL released.
    fn step<O: SparseOptimizer + Send>(
        &self,
        py: Python<'py>,
        w: &mut [f32],
        optimizer: &mut O,
    ) -> PyResult<()> {
        let (g, ids, dim, pad) = (
            slice(&self.grad),
            self.ids.slice(),
            self.dim,
            self.padding_idx,
        );
        let scale = self.scale_grad_by_freq;
        let bytes = core::mem::size_of_val(g).max(rows_bytes(ids.len(), dim));
        match &self.bags {
            None => openmp::run(py, bytes, |par| {
                with_ids!(ids, |i| sparse_step_with(
                    par, w, dim, g, i, pad, scale, optimizer
                ))
            }),
            Some(b) => {
                let pooling = Pooling {
                    mode: b.mode,
                    per_sample_weights: b.weights.as_ref().map(slice),
                    padding_idx: pad,
                    scale_grad_by_freq: scale,
                };
                let bags = &b.bags;
                openmp::run(py, bytes, |par| {
                    with_ids!(ids, |i| bag_sparse_step_with(
                        par, w, dim, g, i, bags, &pooling, optimizer
                    ))
                })
            }
        }
    }
}

/// An SGD step of `batch` on `weight`.
fn sgd(py: Python<'_>, weight: Weight<'_>, batch: Batch<'_>, lr: f32, wd: f32) -> PyResult<()> {
    let mut sgd = Sgd::new(lr).with_weight_decay(wd);
    let mut guard = writable(&weight.array, "weight")?;
    let w = guard.as_slice_mut().map_err(|e| invalid(e.to_string()))?;
    batch.step(py, w, &mut sgd)
}

/// Fails if `weight` and the optimiser state called `name` overlap. Two
/// arrays over the same buffer with different NumPy bases pass the borrow
/// checks; the two updates must never write the same floats.
fn apart(weight: &[f32], state: &[f32], name: &str) -> PyResult<()> {
    let (wr, sr) = (weight.as_ptr_range(), state.as_ptr_range());
    if wr.start < sr.end && sr.start < wr.end {
        return Err(invalid(format!(
            "weight and {name} share memory: {name} must be an array of its own"
        )));
    }
    Ok(())
}

/// Adagrad's hyper-parameters as PyTorch names them, and this step's
/// number (from 1).
struct AdagradArgs {
    lr: f32,
    step: u64,
    lr_decay: f32,
    weight_decay: f32,
    eps: f32,
}

/// An Adagrad step of `batch` on `weight` and its accumulators `state_sum`.
fn adagrad(
    py: Python<'_>,
    weight: Weight<'_>,
    state_sum: &Bound<'_, PyAny>,
    batch: Batch<'_>,
    args: AdagradArgs,
) -> PyResult<()> {
    let (rows, dim) = (weight.rows, weight.dim);
    let (state, state_rows, state_dim) = table_in_place(state_sum, "state_sum")?;
    if (state_rows, state_dim) != (rows, dim) {
        return Err(invalid(format!(
            "state_sum has shape [{state_rows}, {state_dim}], weight has [{rows}, {dim}]"
        )));
    }
    let Some(steps_taken) = args.step.checked_sub(1) else {
        return Err(invalid("step counts from 1; got 0".to_string()));
    };
    let mut guard = writable(&weight.array, "weight")?;
    let mut state_guard = writable(&state, "state_sum")?;
    let w = guard.as_slice_mut().map_err(|e| invalid(e.to_string()))?;
    let s = state_guard
        .as_slice_mut()
        .map_err(|e| invalid(e.to_string()))?;
    apart(w, s, "state_sum")?;
    let mut adagrad = AdagradOn::new(args.lr, s, steps_taken);
    adagrad.lr_decay = args.lr_decay;
    adagrad.weight_decay = args.weight_decay;
    adagrad.eps = args.eps;
    batch.step(py, w, &mut adagrad)
}

/// One SGD step of the lookup's gradient, fused: `weight` (float32
/// `[num_embeddings, embedding_dim]`, updated in place) gets, on each row
/// `r` that `ids` touch (less `padding_idx`),
/// `w -= lr * (g + weight_decay * w)` with `g` the row of
/// [`embedding_sparse_backward`](crate::embedding::embedding_sparse_backward)
/// (the sum of `grad_out[p]` over the positions with `ids[p] == r`, divided
/// by their count with `scale_grad_by_freq`). No gradient is stored and
/// untouched rows are not read: what `sparse=True` and `torch.optim.SGD` do
/// in three passes.
///
/// Raises `IndexError` for an id out of range, `ValueError` for anything
/// else (a `grad_out` of another width than `weight`, a negative or NaN
/// `lr`, `weight` read-only or also passed as `grad_out`); then `weight` is
/// unchanged.
#[pyfunction]
#[pyo3(signature = (weight, ids, grad_out, lr, weight_decay=0.0, padding_idx=None, scale_grad_by_freq=false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn embedding_sparse_sgd_step<'py>(
    py: Python<'py>,
    weight: &Bound<'py, PyAny>,
    ids: &Bound<'py, PyAny>,
    grad_out: &Bound<'py, PyAny>,
    lr: f32,
    weight_decay: f32,
    padding_idx: Option<i64>,
    scale_grad_by_freq: bool,
) -> PyResult<()> {
    let weight = Weight::extract(weight)?;
    let batch = Batch::lookup(&weight, ids, grad_out, padding_idx, scale_grad_by_freq)?;
    sgd(py, weight, batch, lr, weight_decay)
}

/// One Adagrad step of the lookup's gradient, fused, as
/// `torch.optim.Adagrad` takes it on a sparse gradient: on each row `r`
/// that `ids` touch (less `padding_idx`), with `g` the row's summed gradient
/// (see [`embedding_sparse_sgd_step`]) plus `weight_decay * w`,
/// `state_sum[r] += g * g` and
/// `weight[r] -= clr * g / (sqrt(state_sum[r]) + eps)`, where
/// `clr = lr / (1 + (step - 1) * lr_decay)`. `weight` and `state_sum`
/// (float32, both `[num_embeddings, embedding_dim]`) are updated in place;
/// `step` is this step's number, counted from 1 (PyTorch's `state["step"]`
/// after the step, as a Python int: `int(state["step"])`). Untouched rows
/// are not read.
///
/// Raises `IndexError` for an id out of range, `ValueError` for anything
/// else (a `state_sum` of another shape than `weight`, a `step` of 0, a
/// negative or NaN hyper-parameter, an array read-only, or `weight` and
/// `state_sum` over the same memory); then `weight` and `state_sum` are
/// unchanged. (`step` must be an int: a negative one raises
/// `OverflowError`, another type `TypeError`.)
#[pyfunction]
#[pyo3(signature = (weight, state_sum, ids, grad_out, lr, step, lr_decay=0.0, weight_decay=0.0, eps=1e-10, padding_idx=None, scale_grad_by_freq=false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn embedding_sparse_adagrad_step<'py>(
    py: Python<'py>,
    weight: &Bound<'py, PyAny>,
    state_sum: &Bound<'py, PyAny>,
    ids: &Bound<'py, PyAny>,
    grad_out: &Bound<'py, PyAny>,
    lr: f32,
    step: u64,
    lr_decay: f32,
    weight_decay: f32,
    eps: f32,
    padding_idx: Option<i64>,
    scale_grad_by_freq: bool,
) -> PyResult<()> {
    let weight = Weight::extract(weight)?;
    let batch = Batch::lookup(&weight, ids, grad_out, padding_idx, scale_grad_by_freq)?;
    let args = AdagradArgs {
        lr,
        step,
        lr_decay,
        weight_decay,
        eps,
    };
    adagrad(py, weight, state_sum, batch, args)
}

/// One SGD step of a bag forward's gradient (sum or mean), fused: as
/// [`embedding_sparse_sgd_step`], with `g` the row of
/// [`embedding_bag_sparse_backward`](crate::bag::embedding_bag_sparse_backward)
/// for the same bag arguments (`grad_out` is `[num_bags, embedding_dim]`).
///
/// Raises as [`embedding_sparse_sgd_step`], and `ValueError` for the bag
/// arguments of [`embedding_bag`](crate::bag::embedding_bag) and for
/// `mode="max"`; then `weight` is unchanged.
#[pyfunction]
#[pyo3(signature = (weight, ids, offsets, grad_out, lr, weight_decay=0.0, mode="mean", per_sample_weights=None, include_last_offset=false, padding_idx=None, scale_grad_by_freq=false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn embedding_bag_sparse_sgd_step<'py>(
    py: Python<'py>,
    weight: &Bound<'py, PyAny>,
    ids: &Bound<'py, PyAny>,
    offsets: Option<&Bound<'py, PyAny>>,
    grad_out: &Bound<'py, PyAny>,
    lr: f32,
    weight_decay: f32,
    mode: &str,
    per_sample_weights: Option<&Bound<'py, PyAny>>,
    include_last_offset: bool,
    padding_idx: Option<i64>,
    scale_grad_by_freq: bool,
) -> PyResult<()> {
    let weight = Weight::extract(weight)?;
    let batch = Batch::bags(
        &weight,
        ids,
        offsets,
        grad_out,
        mode,
        per_sample_weights,
        include_last_offset,
        padding_idx,
        scale_grad_by_freq,
    )?;
    sgd(py, weight, batch, lr, weight_decay)
}

/// One Adagrad step of a bag forward's gradient (sum or mean), fused: as
/// [`embedding_sparse_adagrad_step`], with `g` the row of
/// [`embedding_bag_sparse_backward`](crate::bag::embedding_bag_sparse_backward)
/// for the same bag arguments.
///
/// Raises as [`embedding_sparse_adagrad_step`] and
/// [`embedding_bag_sparse_sgd_step`]; then `weight` and `state_sum` are
/// unchanged.
#[pyfunction]
#[pyo3(signature = (weight, state_sum, ids, offsets, grad_out, lr, step, lr_decay=0.0, weight_decay=0.0, eps=1e-10, mode="mean", per_sample_weights=None, include_last_offset=false, padding_idx=None, scale_grad_by_freq=false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn embedding_bag_sparse_adagrad_step<'py>(
    py: Python<'py>,
    weight: &Bound<'py, PyAny>,
    state_sum: &Bound<'py, PyAny>,
    ids: &Bound<'py, PyAny>,
    offsets: Option<&Bound<'py, PyAny>>,
    grad_out: &Bound<'py, PyAny>,
    lr: f32,
    step: u64,
    lr_decay: f32,
    weight_decay: f32,
    eps: f32,
    mode: &str,
    per_sample_weights: Option<&Bound<'py, PyAny>>,
    include_last_offset: bool,
    padding_idx: Option<i64>,
    scale_grad_by_freq: bool,
) -> PyResult<()> {
    let weight = Weight::extract(weight)?;
    let batch = Batch::bags(
        &weight,
        ids,
        offsets,
        grad_out,
        mode,
        per_sample_weights,
        include_last_offset,
        padding_idx,
        scale_grad_by_freq,
    )?;
    let args = AdagradArgs {
        lr,
        step,
        lr_decay,
        weight_decay,
        eps,
    };
    adagrad(py, weight, state_sum, batch, args)
}

/// A row-wise Adagrad step of `batch` on `weight` and its accumulators
/// `state` (one a row).
fn rowwise_adagrad(
    py: Python<'_>,
    weight: Weight<'_>,
    state: &Bound<'_, PyAny>,
    batch: Batch<'_>,
    lr: f32,
    weight_decay: f32,
    eps: f32,
) -> PyResult<()> {
    let state = rows_in_place(state, "state", weight.rows)?;
    let mut guard = writable(&weight.array, "weight")?;
    let mut state_guard = writable(&state, "state")?;
    let w = guard.as_slice_mut().map_err(|e| invalid(e.to_string()))?;
    let s = state_guard
        .as_slice_mut()
        .map_err(|e| invalid(e.to_string()))?;
    apart(w, s, "state")?;
    let mut rowwise = RowWiseAdagradOn::new(lr, s);
    rowwise.weight_decay = weight_decay;
    rowwise.eps = eps;
    batch.step(py, w, &mut rowwise)
}

/// One row-wise Adagrad step of a bag forward's gradient (sum or mean; with
/// `offsets=None` and 2-D ids, the bags of the rows; `mode="sum"` over bags
/// of one id is the lookup's step), fused, as FBGEMM's
/// `EXACT_ROWWISE_ADAGRAD`: on each touched row `r`, with `g` its summed
/// gradient (see [`embedding_bag_sparse_sgd_step`]) plus
/// `weight_decay * w`, `state[r] += mean(g * g)` and
/// `weight[r] -= lr / (sqrt(state[r]) + eps) * g`. `state` is float32
/// `[num_embeddings]`, updated in place with `weight`.
///
/// Raises as [`embedding_bag_sparse_adagrad_step`]; then `weight` and
/// `state` are unchanged.
#[pyfunction]
#[pyo3(signature = (weight, state, ids, offsets, grad_out, lr, weight_decay=0.0, eps=1e-8, mode="mean", per_sample_weights=None, include_last_offset=false, padding_idx=None, scale_grad_by_freq=false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn embedding_bag_sparse_rowwise_adagrad_step<'py>(
    py: Python<'py>,
    weight: &Bound<'py, PyAny>,
    state: &Bound<'py, PyAny>,
    ids: &Bound<'py, PyAny>,
    offsets: Option<&Bound<'py, PyAny>>,
    grad_out: &Bound<'py, PyAny>,
    lr: f32,
    weight_decay: f32,
    eps: f32,
    mode: &str,
    per_sample_weights: Option<&Bound<'py, PyAny>>,
    include_last_offset: bool,
    padding_idx: Option<i64>,
    scale_grad_by_freq: bool,
) -> PyResult<()> {
    let weight = Weight::extract(weight)?;
    let batch = Batch::bags(
        &weight,
        ids,
        offsets,
        grad_out,
        mode,
        per_sample_weights,
        include_last_offset,
        padding_idx,
        scale_grad_by_freq,
    )?;
    rowwise_adagrad(py, weight, state, batch, lr, weight_decay, eps)
}

/// One row-wise Adagrad step of the lookup's gradient, fused: as
/// [`embedding_bag_sparse_rowwise_adagrad_step`] with `g` the row of
/// [`embedding_sparse_backward`](crate::embedding::embedding_sparse_backward).
#[pyfunction]
#[pyo3(signature = (weight, state, ids, grad_out, lr, weight_decay=0.0, eps=1e-8, padding_idx=None, scale_grad_by_freq=false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn embedding_sparse_rowwise_adagrad_step<'py>(
    py: Python<'py>,
    weight: &Bound<'py, PyAny>,
    state: &Bound<'py, PyAny>,
    ids: &Bound<'py, PyAny>,
    grad_out: &Bound<'py, PyAny>,
    lr: f32,
    weight_decay: f32,
    eps: f32,
    padding_idx: Option<i64>,
    scale_grad_by_freq: bool,
) -> PyResult<()> {
    let weight = Weight::extract(weight)?;
    let batch = Batch::lookup(&weight, ids, grad_out, padding_idx, scale_grad_by_freq)?;
    rowwise_adagrad(py, weight, state, batch, lr, weight_decay, eps)
}
