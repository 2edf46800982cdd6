//! The lookup (`F.embedding`) and its dense and sparse backward.

use crate::convert::{
    error, grad_output, invalid, output, padding, slice, table_in_place, with_ids, writable, Ids,
    Table,
};
use embedding_kernels::{
    dense_backward, gather, sparse_backward, sparse_step, AdagradOn, Sgd, SparseGrad,
    SparseOptimizer,
};
use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn};
use pyo3::prelude::*;

/// `out[..., :] = weight[ids[...], :]`: the rows of `weight` (float32,
/// `[num_embeddings, embedding_dim]`) for `ids` (int32 or int64, any shape),
/// as a float32 array of shape `ids.shape + (embedding_dim,)`, written into
/// `out` if given.
///
/// `padding_idx` is checked (a negative one counts from the end) but, as in
/// PyTorch, only the backward treats it apart: the forward reads the padding
/// row as it is.
///
/// Raises `IndexError` for an id out of range (naming its flat position and
/// value), `ValueError` for anything else; then `out` is unchanged.
#[pyfunction]
#[pyo3(signature = (weight, ids, padding_idx=None, out=None))]
pub(crate) fn embedding<'py>(
    py: Python<'py>,
    weight: &Bound<'py, PyAny>,
    ids: &Bound<'py, PyAny>,
    padding_idx: Option<i64>,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let table = Table::extract(weight, "weight")?;
    let ids = Ids::extract(ids, "ids")?;
    padding(padding_idx, table.rows)?;
    let mut shape = ids.shape().to_vec();
    shape.push(table.dim);
    let out = output(py, out, &shape)?;
    {
        let mut guard = writable(&out, "out")?;
        let dst = guard.as_slice_mut().map_err(|e| invalid(e.to_string()))?;
        let (src, dim, ids) = (table.slice(), table.dim, ids.slice());
        py.detach(|| with_ids!(ids, |i| gather(src, dim, i, dst)))
            .map_err(error)?;
    }
    Ok(out)
}

/// The dense gradient of [`embedding`]: a float32 `[num_embeddings,
/// embedding_dim]` array whose row `r` is the sum of `grad_out[p]` over the
/// positions `p` with `ids[p] == r`, in position order (divided by their
/// count with `scale_grad_by_freq`); untouched rows and `padding_idx` are
/// zeros. `grad_out` has shape `ids.shape + (embedding_dim,)`. An `out`
/// array is overwritten, every row.
#[pyfunction]
#[pyo3(signature = (grad_out, ids, num_embeddings, padding_idx=None, scale_grad_by_freq=false, out=None))]
pub(crate) fn embedding_dense_backward<'py>(
    py: Python<'py>,
    grad_out: &Bound<'py, PyAny>,
    ids: &Bound<'py, PyAny>,
    num_embeddings: usize,
    padding_idx: Option<i64>,
    scale_grad_by_freq: bool,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let ids = Ids::extract(ids, "ids")?;
    let (grad, dim) = grad_output(grad_out, ids.shape())?;
    let pad = padding(padding_idx, num_embeddings)?;
    let out = output(py, out, &[num_embeddings, dim])?;
    {
        let mut guard = writable(&out, "out")?;
        let dst = guard.as_slice_mut().map_err(|e| invalid(e.to_string()))?;
        let (g, ids) = (slice(&grad), ids.slice());
        py.detach(|| {
            with_ids!(ids, |i| dense_backward(
                g,
                dim,
                i,
                pad,
                scale_grad_by_freq,
                dst
            ))
        })
        .map_err(error)?;
    }
    Ok(out)
}

/// The coalesced gradient of [`embedding`]: `(rows, values)`, the distinct
/// ids less `padding_idx` ascending (int64 `[k]`) and their summed gradient
/// rows (float32 `[k, embedding_dim]`), the rows of
/// [`embedding_dense_backward`] with the same bits.
#[pyfunction]
#[pyo3(signature = (grad_out, ids, num_embeddings, padding_idx=None, scale_grad_by_freq=false))]
pub(crate) fn embedding_sparse_backward<'py>(
    py: Python<'py>,
    grad_out: &Bound<'py, PyAny>,
    ids: &Bound<'py, PyAny>,
    num_embeddings: usize,
    padding_idx: Option<i64>,
    scale_grad_by_freq: bool,
) -> PyResult<SparsePair<'py>> {
    let ids = Ids::extract(ids, "ids")?;
    let (grad, dim) = grad_output(grad_out, ids.shape())?;
    let pad = padding(padding_idx, num_embeddings)?;
    let (g, ids) = (slice(&grad), ids.slice());
    let sparse = py
        .detach(|| {
            with_ids!(ids, |i| sparse_backward(
                g,
                dim,
                i,
                num_embeddings,
                pad,
                scale_grad_by_freq
            ))
        })
        .map_err(error)?;
    sparse_pair(py, sparse)
}

/// One SGD step of the lookup's gradient, fused: `weight` (float32
/// `[num_embeddings, embedding_dim]`, updated in place) gets, on each row
/// `r` that `ids` touch (less `padding_idx`),
/// `w -= lr * (g + weight_decay * w)` with `g` the row of
/// [`embedding_sparse_backward`] (the sum of `grad_out[p]` over the
/// positions with `ids[p] == r`, divided by their count with
/// `scale_grad_by_freq`). No gradient is stored and untouched rows are not
/// read: what `sparse=True` and `torch.optim.SGD` do in three passes.
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
    let args = StepArgs::extract(weight, ids, grad_out, padding_idx)?;
    let mut sgd = Sgd::new(lr).with_weight_decay(weight_decay);
    let mut guard = writable(&args.table, "weight")?;
    let w = guard.as_slice_mut().map_err(|e| invalid(e.to_string()))?;
    args.step(py, w, scale_grad_by_freq, &mut sgd)
}

/// What both fused steps take and check alike: the table to update in
/// place, the ids, a gradient as wide as the table, and `padding_idx`.
struct StepArgs<'py> {
    table: Bound<'py, PyArrayDyn<f32>>,
    rows: usize,
    dim: usize,
    ids: Ids<'py>,
    grad: PyReadonlyArrayDyn<'py, f32>,
    pad: Option<usize>,
}

impl<'py> StepArgs<'py> {
    /// Checks the arguments in the order of the errors' documentation,
    /// writing nothing.
    fn extract(
        weight: &Bound<'py, PyAny>,
        ids: &Bound<'py, PyAny>,
        grad_out: &Bound<'py, PyAny>,
        padding_idx: Option<i64>,
    ) -> PyResult<Self> {
        let (table, rows, dim) = table_in_place(weight, "weight")?;
        let ids = Ids::extract(ids, "ids")?;
        let (grad, grad_dim) = grad_output(grad_out, ids.shape())?;
        if grad_dim != dim {
            return Err(invalid(format!(
                "grad_out has embedding_dim {grad_dim}, weight has {dim}"
            )));
        }
        let pad = padding(padding_idx, rows)?;
        Ok(StepArgs {
            table,
            rows,
            dim,
            ids,
            grad,
            pad,
        })
    }

    /// The crate's fused step of `optimizer` on `w` (the table's values),
    /// with the GIL released.
    fn step<O: SparseOptimizer + Send>(
        &self,
        py: Python<'py>,
        w: &mut [f32],
        scale_grad_by_freq: bool,
        optimizer: &mut O,
    ) -> PyResult<()> {
        let (g, ids, dim, pad) = (slice(&self.grad), self.ids.slice(), self.dim, self.pad);
        py.detach(|| {
            with_ids!(ids, |i| sparse_step(
                w,
                dim,
                g,
                i,
                pad,
                scale_grad_by_freq,
                optimizer
            ))
        })
        .map_err(error)
    }
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
    let args = StepArgs::extract(weight, ids, grad_out, padding_idx)?;
    let (rows, dim) = (args.rows, args.dim);
    let (state, state_rows, state_dim) = table_in_place(state_sum, "state_sum")?;
    if (state_rows, state_dim) != (rows, dim) {
        return Err(invalid(format!(
            "state_sum has shape [{state_rows}, {state_dim}], weight has [{rows}, {dim}]"
        )));
    }
    let Some(steps_taken) = step.checked_sub(1) else {
        return Err(invalid("step counts from 1; got 0".to_string()));
    };
    let mut guard = writable(&args.table, "weight")?;
    let mut state_guard = writable(&state, "state_sum")?;
    let w = guard.as_slice_mut().map_err(|e| invalid(e.to_string()))?;
    let s = state_guard
        .as_slice_mut()
        .map_err(|e| invalid(e.to_string()))?;
    // Two arrays over the same buffer with different NumPy bases pass the
    // borrow check above; the two updates must never write the same floats.
    let (wr, sr) = (w.as_ptr_range(), s.as_ptr_range());
    if wr.start < sr.end && sr.start < wr.end {
        return Err(invalid(
            "weight and state_sum share memory: state_sum must be an array of its own".to_string(),
        ));
    }
    let mut adagrad = AdagradOn::new(lr, s, steps_taken);
    adagrad.lr_decay = lr_decay;
    adagrad.weight_decay = weight_decay;
    adagrad.eps = eps;
    args.step(py, w, scale_grad_by_freq, &mut adagrad)
}

/// A sparse gradient as Python gets it: int64 rows and float32 values.
pub(crate) type SparsePair<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArrayDyn<f32>>);

/// `grad` as `(rows, values)` arrays: the values handed to NumPy as they
/// are, the rows widened to int64 (a copy proportional to the rows the
/// batch touched).
pub(crate) fn sparse_pair<'py>(py: Python<'py>, grad: SparseGrad) -> PyResult<SparsePair<'py>> {
    let (nnz, dim) = (grad.nnz_rows(), grad.embedding_dim());
    let (indices, values) = grad.into_parts();
    let rows: Vec<i64> = indices.iter().map(|&r| r as i64).collect();
    let values = PyArray1::from_vec(py, values).reshape(vec![nnz, dim])?;
    Ok((PyArray1::from_vec(py, rows), values))
}
