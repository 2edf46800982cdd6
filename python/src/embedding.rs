//! The lookup (`F.embedding`) and its dense and sparse backward.

use crate::convert::{
    Ids, Table, grad_output, invalid, output, padding, slice, with_ids, writable,
};
use crate::openmp;
use embedding_kernels::{SparseGrad, dense_backward_with, gather_with, sparse_backward_with};
use numpy::{PyArray1, PyArrayDyn, PyArrayMethods};
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
        openmp::run(py, core::mem::size_of_val(dst), |par| {
            with_ids!(ids, |i| gather_with(par, src, dim, i, dst))
        })?;
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
        let bytes = core::mem::size_of_val(g).max(core::mem::size_of_val(dst));
        openmp::run(py, bytes, |par| {
            with_ids!(ids, |i| dense_backward_with(
                par,
                g,
                dim,
                i,
                pad,
                scale_grad_by_freq,
                dst
            ))
        })?;
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
    let sparse = openmp::run(py, core::mem::size_of_val(g), |par| {
        with_ids!(ids, |i| sparse_backward_with(
            par,
            g,
            dim,
            i,
            num_embeddings,
            pad,
            scale_grad_by_freq
        ))
    })?;
    sparse_pair(py, sparse)
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
