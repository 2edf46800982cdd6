//! The bags (`F.embedding_bag`) and their dense and sparse backward.
//!
//! Ids are 1-D with `offsets` (each offset starts a bag; with
//! `include_last_offset` the last one ends the last bag), or 2-D `[B, N]`
//! without offsets (each row is a bag), as in PyTorch.

use crate::convert::{
    Ids, Table, error, grad_output, invalid, output, padding, readonly, rows_bytes, slice,
    with_ids, writable,
};
use crate::embedding::{SparsePair, sparse_pair};
use crate::openmp;
use embedding_kernels::formats::TableRef;
use embedding_kernels::{
    Bags, Mode, Pooling, bag_backward_with, bag_max_backward_with, bag_sparse_backward_with,
    table_bag_forward_strided_with,
};
use numpy::{PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;

/// `mode` as the crate's [`Mode`].
pub(crate) fn mode(name: &str) -> PyResult<Mode> {
    match name {
        "sum" => Ok(Mode::Sum),
        "mean" => Ok(Mode::Mean),
        "max" => Ok(Mode::Max),
        _ => Err(invalid(format!(
            "mode must be \"sum\", \"mean\" or \"max\", got {name:?}"
        ))),
    }
}

/// The bags of `ids`: from `offsets` for 1-D ids, one per row for 2-D ids.
pub(crate) fn bags(
    ids: &Ids<'_>,
    offsets: Option<&Bound<'_, PyAny>>,
    include_last_offset: bool,
) -> PyResult<Bags> {
    match (ids.shape(), offsets) {
        (&[n], Some(offsets)) => {
            let offsets = Ids::extract(offsets, "offsets")?;
            if offsets.shape().len() != 1 {
                return Err(invalid(format!(
                    "offsets must be 1-D, got shape {:?}",
                    offsets.shape()
                )));
            }
            with_ids!(offsets.slice(), |o| Bags::from_offsets(
                o,
                n,
                include_last_offset
            ))
            .map_err(error)
        }
        (&[_], None) => Err(invalid(
            "1-D ids need offsets (or pass 2-D ids [B, N], one bag per row)".to_string(),
        )),
        (&[b, n], None) => Bags::fixed(b, n).map_err(error),
        (&[_, _], Some(_)) => Err(invalid(
            "2-D ids take no offsets: each row is a bag".to_string(),
        )),
        (shape, _) => Err(invalid(format!(
            "ids must be 1-D (with offsets) or 2-D [B, N], got shape {shape:?}"
        ))),
    }
}

/// `per_sample_weights`: float32, one weight per id, in the ids' shape.
pub(crate) fn sample_weights<'py>(
    obj: Option<&Bound<'py, PyAny>>,
    ids: &Ids<'_>,
) -> PyResult<Option<PyReadonlyArrayDyn<'py, f32>>> {
    let Some(obj) = obj else {
        return Ok(None);
    };
    let weights = readonly::<f32>(obj, "per_sample_weights", "float32")?;
    if weights.shape() != ids.shape() {
        return Err(invalid(format!(
            "per_sample_weights has shape {:?}, but ids have shape {:?}",
            weights.shape(),
            ids.shape()
        )));
    }
    Ok(Some(weights))
}

/// A bag forward's output and, in max mode, its `max_indices`.
pub(crate) type BagPair<'py> = (
    Bound<'py, PyArrayDyn<f32>>,
    Option<Bound<'py, PyArrayDyn<i64>>>,
);

/// Each bag's sum, mean or max of the rows of `weight` (float32,
/// `[num_embeddings, embedding_dim]`), as `(out, max_indices)`: `out` is
/// float32 `[num_bags, embedding_dim]`; `max_indices` (max mode only,
/// otherwise `None`) is int64 of the same shape, each column's winning id
/// (-1 in an empty bag). An empty bag is zeros. `per_sample_weights`
/// (sum only) multiplies each row; `padding_idx` is left out of the pool and
/// of mean's count. An `out` array is overwritten.
#[pyfunction]
#[pyo3(signature = (weight, ids, offsets=None, mode="mean", per_sample_weights=None, include_last_offset=false, padding_idx=None, out=None))]
// PyTorch's arguments, one for one.
#[allow(clippy::too_many_arguments)]
pub(crate) fn embedding_bag<'py>(
    py: Python<'py>,
    weight: &Bound<'py, PyAny>,
    ids: &Bound<'py, PyAny>,
    offsets: Option<&Bound<'py, PyAny>>,
    mode: &str,
    per_sample_weights: Option<&Bound<'py, PyAny>>,
    include_last_offset: bool,
    padding_idx: Option<i64>,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<BagPair<'py>> {
    let table = Table::extract(weight, "weight")?;
    let view = TableRef::f32(table.slice(), table.dim).map_err(error)?;
    let args = BagArgs {
        ids,
        offsets,
        mode,
        per_sample_weights,
        include_last_offset,
        padding_idx,
    };
    forward_on(py, view, table.rows, args, out, None)
}

/// The arguments of a bag forward that PyTorch names, as the NumPy
/// functions receive them.
pub(crate) struct BagArgs<'a, 'py> {
    pub(crate) ids: &'a Bound<'py, PyAny>,
    pub(crate) offsets: Option<&'a Bound<'py, PyAny>>,
    pub(crate) mode: &'a str,
    pub(crate) per_sample_weights: Option<&'a Bound<'py, PyAny>>,
    pub(crate) include_last_offset: bool,
    pub(crate) padding_idx: Option<i64>,
}

/// The bag forward of [`embedding_bag`] and of the any-format
/// `table_embedding_bag`: the arguments checked, the outputs made (or `out`
/// checked), then the kernel on `table` without the GIL. `rows` is what
/// `padding_idx` is checked against (the array's rows). With `column`, the
/// bags go into columns `column..column + dim` of the caller's float32
/// `out` `[num_bags, width]` (C-contiguous), its other columns left as they
/// are: how a collection writes each table's bags into its `[batch, Σ dims]`
/// output without a copy.
pub(crate) fn forward_on<'py>(
    py: Python<'py>,
    table: TableRef<'_>,
    rows: usize,
    args: BagArgs<'_, 'py>,
    out: Option<&Bound<'py, PyAny>>,
    column: Option<usize>,
) -> PyResult<BagPair<'py>> {
    let ids = Ids::extract(args.ids, "ids")?;
    let bags = bags(&ids, args.offsets, args.include_last_offset)?;
    let mode = self::mode(args.mode)?;
    let weights = sample_weights(args.per_sample_weights, &ids)?;
    let padding_idx = padding(args.padding_idx, rows)?;
    let shape = [bags.len(), table.dim()];
    // The output and how far apart its rows are.
    let (out, width) = match (column, out) {
        (None, out) => (output(py, out, &shape)?, shape[1]),
        (Some(column), Some(out)) => {
            let (out, num_bags, width) = crate::convert::output_columns(out)?;
            if num_bags != shape[0] || column.checked_add(shape[1]).is_none_or(|end| end > width) {
                return Err(invalid(format!(
                    "out has shape [{num_bags}, {width}]: it must have {} rows and room for {} \
                     columns from column {column}",
                    shape[0], shape[1]
                )));
            }
            (out, width)
        }
        (Some(_), None) => return Err(invalid("column needs an out array".to_string())),
    };
    let max_indices = (mode == Mode::Max).then(|| PyArrayDyn::<i64>::zeros(py, &shape[..], false));
    {
        let mut guard = writable(&out, "out")?;
        let all = guard.as_slice_mut().map_err(|e| invalid(e.to_string()))?;
        // From the first bag's first value to the last bag's last.
        let first = column.unwrap_or(0);
        let dst = match shape[0] {
            0 => &mut all[..0],
            n => &mut all[first..first + (n - 1) * width + shape[1]],
        };
        let mut max_guard = max_indices.as_ref().map(|m| m.readwrite());
        let max_dst: &mut [i64] = match max_guard.as_mut() {
            Some(m) => m.as_slice_mut().map_err(|e| invalid(e.to_string()))?,
            None => &mut [],
        };
        let sample_weights = weights.as_ref().map(slice);
        let pooling = Pooling {
            mode,
            per_sample_weights: sample_weights,
            padding_idx,
            scale_grad_by_freq: false,
        };
        let ids = ids.slice();
        // The rows pooled, one a position, are the work (as the crate counts
        // it, in `f32`s whatever the format): a few long bags pool far more
        // than their output holds.
        let bytes = rows_bytes(shape[0], shape[1]).max(rows_bytes(ids.len(), shape[1]));
        openmp::run(py, bytes, |par| {
            with_ids!(ids, |i| table_bag_forward_strided_with(
                par, table, i, &bags, &pooling, dst, width, max_dst
            ))
        })?;
    }
    Ok((out, max_indices))
}

/// The dense gradient of [`embedding_bag`]: float32 `[num_embeddings,
/// embedding_dim]`, every row written (untouched rows and `padding_idx`
/// zeros). `grad_out` is `[num_bags, embedding_dim]`; the other arguments
/// are the forward's. Max mode takes the forward's `max_indices` and gives
/// each column's gradient to the row that won it. An `out` array is
/// overwritten.
#[pyfunction]
#[pyo3(signature = (grad_out, ids, num_embeddings, offsets=None, mode="mean", per_sample_weights=None, include_last_offset=false, padding_idx=None, scale_grad_by_freq=false, max_indices=None, out=None))]
// PyTorch's arguments, one for one, and the forward's max_indices.
#[allow(clippy::too_many_arguments)]
pub(crate) fn embedding_bag_backward<'py>(
    py: Python<'py>,
    grad_out: &Bound<'py, PyAny>,
    ids: &Bound<'py, PyAny>,
    num_embeddings: usize,
    offsets: Option<&Bound<'py, PyAny>>,
    mode: &str,
    per_sample_weights: Option<&Bound<'py, PyAny>>,
    include_last_offset: bool,
    padding_idx: Option<i64>,
    scale_grad_by_freq: bool,
    max_indices: Option<&Bound<'py, PyAny>>,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let ids = Ids::extract(ids, "ids")?;
    let bags = bags(&ids, offsets, include_last_offset)?;
    let mode = self::mode(mode)?;
    let weights = sample_weights(per_sample_weights, &ids)?;
    let padding_idx = padding(padding_idx, num_embeddings)?;
    let (grad, dim) = grad_output(grad_out, &[bags.len()])?;
    let maxima = match (mode, max_indices) {
        (Mode::Max, Some(m)) => Some(readonly::<i64>(m, "max_indices", "int64")?),
        (Mode::Max, None) => {
            return Err(invalid(
                "max mode's backward needs the forward's max_indices".to_string(),
            ));
        }
        (_, _) => None,
    };
    let out = output(py, out, &[num_embeddings, dim])?;
    {
        let mut guard = writable(&out, "out")?;
        let dst = guard.as_slice_mut().map_err(|e| invalid(e.to_string()))?;
        let g = slice(&grad);
        let bytes = core::mem::size_of_val(g).max(core::mem::size_of_val(dst));
        match &maxima {
            Some(m) => {
                let m = slice(m);
                openmp::run(py, bytes, |par| bag_max_backward_with(par, g, dim, m, dst))
            }
            None => {
                let pooling = Pooling {
                    mode,
                    per_sample_weights: weights.as_ref().map(slice),
                    padding_idx,
                    scale_grad_by_freq,
                };
                let ids = ids.slice();
                openmp::run(py, bytes, |par| {
                    with_ids!(ids, |i| bag_backward_with(
                        par, g, dim, i, &bags, &pooling, dst
                    ))
                })
            }
        }?;
    }
    Ok(out)
}

/// The coalesced gradient of [`embedding_bag`] (sum and mean): `(rows,
/// values)` as [`embedding_sparse_backward`](crate::embedding::embedding_sparse_backward)
/// gives them, the rows of [`embedding_bag_backward`] with the same bits.
#[pyfunction]
#[pyo3(signature = (grad_out, ids, num_embeddings, offsets=None, mode="mean", per_sample_weights=None, include_last_offset=false, padding_idx=None, scale_grad_by_freq=false))]
// PyTorch's arguments, one for one.
#[allow(clippy::too_many_arguments)]
pub(crate) fn embedding_bag_sparse_backward<'py>(
    py: Python<'py>,
    grad_out: &Bound<'py, PyAny>,
    ids: &Bound<'py, PyAny>,
    num_embeddings: usize,
    offsets: Option<&Bound<'py, PyAny>>,
    mode: &str,
    per_sample_weights: Option<&Bound<'py, PyAny>>,
    include_last_offset: bool,
    padding_idx: Option<i64>,
    scale_grad_by_freq: bool,
) -> PyResult<SparsePair<'py>> {
    let ids = Ids::extract(ids, "ids")?;
    let bags = bags(&ids, offsets, include_last_offset)?;
    let mode = self::mode(mode)?;
    let weights = sample_weights(per_sample_weights, &ids)?;
    let padding_idx = padding(padding_idx, num_embeddings)?;
    let (grad, dim) = grad_output(grad_out, &[bags.len()])?;
    let pooling = Pooling {
        mode,
        per_sample_weights: weights.as_ref().map(slice),
        padding_idx,
        scale_grad_by_freq,
    };
    let (g, ids) = (slice(&grad), ids.slice());
    let bytes = core::mem::size_of_val(g).max(rows_bytes(ids.len(), dim));
    let sparse = openmp::run(py, bytes, |par| {
        with_ids!(ids, |i| bag_sparse_backward_with(
            par,
            g,
            dim,
            i,
            &bags,
            &pooling,
            num_embeddings
        ))
    })?;
    sparse_pair(py, sparse)
}
