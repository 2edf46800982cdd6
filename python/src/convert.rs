//! NumPy arrays in and out, and the crate's errors as Python exceptions.
//!
//! Every array argument is checked here (type, dtype, rank, C-contiguity)
//! and then read in place as a slice: nothing is copied on the way in. A
//! non-contiguous array is refused with a `ValueError` rather than copied
//! behind the caller's back (`np.ascontiguousarray` makes the copy where one
//! is wanted). An output is the caller's `out` array, checked the same way
//! and borrowed writable, or a fresh one, not zeroed ([`output`]).
//!
//! The borrows go through NumPy's borrow tracking (`try_readonly`,
//! `try_readwrite`), so an `out` that is also an input is refused before
//! anything is written.

use embedding_kernels::EmbeddingError;
use numpy::{
    Element, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyReadwriteArrayDyn, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;

/// A crate error as Python sees it: an id out of range is an `IndexError`
/// (its message names the position and the value), everything else a
/// `ValueError` with the crate's message.
pub(crate) fn error(e: EmbeddingError) -> PyErr {
    match e {
        EmbeddingError::IndexOutOfRange { .. } => PyIndexError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// A `ValueError` with `message`.
pub(crate) fn invalid(message: String) -> PyErr {
    PyValueError::new_err(message)
}

/// `obj` as a NumPy array of any dtype, or a `ValueError` naming `name`.
fn untyped<'a, 'py>(
    obj: &'a Bound<'py, PyAny>,
    name: &str,
) -> PyResult<&'a Bound<'py, PyUntypedArray>> {
    obj.cast::<PyUntypedArray>().map_err(|_| {
        let type_name = obj
            .get_type()
            .name()
            .map_or_else(|_| "?".to_string(), |n| n.to_string());
        invalid(format!("{name} must be a numpy array, got {type_name}"))
    })
}

/// Whether `array` holds `T`s.
fn holds<T: Element>(array: &Bound<'_, PyUntypedArray>) -> bool {
    array.cast::<PyArrayDyn<T>>().is_ok()
}

/// `obj` as a C-contiguous array of `T` (`dtype` names `T`), borrowed
/// read-only.
pub(crate) fn readonly<'py, T: Element>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    dtype: &str,
) -> PyResult<PyReadonlyArrayDyn<'py, T>> {
    let array = typed::<T>(obj, name, dtype)?;
    contiguous(array.as_untyped(), name)?;
    array
        .try_readonly()
        .map_err(|e| invalid(format!("{name} cannot be read: {e}")))
}

/// `obj` as a NumPy array of `T` (`dtype` names `T`), of any layout.
fn typed<'py, T: Element>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    dtype: &str,
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    let array = untyped(obj, name)?;
    let typed = array.cast::<PyArrayDyn<T>>().map_err(|_| {
        invalid(format!(
            "{name} must be a {dtype} array, got {}",
            array.dtype()
        ))
    })?;
    Ok(typed.clone())
}

/// Fails unless `array` is C-contiguous.
fn contiguous(array: &Bound<'_, PyUntypedArray>, name: &str) -> PyResult<()> {
    if array.is_c_contiguous() {
        Ok(())
    } else {
        Err(invalid(format!(
            "{name} must be C-contiguous (np.ascontiguousarray makes a contiguous copy)"
        )))
    }
}

/// The slice of a checked (C-contiguous) array.
pub(crate) fn slice<'a, T: Element>(array: &'a PyReadonlyArrayDyn<'_, T>) -> &'a [T] {
    // `readonly` checked contiguity, and a borrowed array cannot change it.
    array.as_slice().unwrap_or(&[])
}

/// Ids (or offsets): an int32 or int64 array of any shape, read in place.
pub(crate) enum Ids<'py> {
    I32(PyReadonlyArrayDyn<'py, i32>),
    I64(PyReadonlyArrayDyn<'py, i64>),
}

/// The slice of an [`Ids`], in its own type.
#[derive(Clone, Copy)]
pub(crate) enum IdSlice<'a> {
    I32(&'a [i32]),
    I64(&'a [i64]),
}

impl IdSlice<'_> {
    pub(crate) fn len(self) -> usize {
        match self {
            IdSlice::I32(s) => s.len(),
            IdSlice::I64(s) => s.len(),
        }
    }
}

/// The bytes of rows a call over `positions` ids reads or hands out, as
/// `f32`s: one row of `dim` a position, a table's row pooled by a bag
/// forward or a gradient row of a backward, whether the position has one of
/// its own or shares its bag's. This, not the size of the arrays, is the
/// work: a broadcast gradient (`out.sum()`'s) comes as a single bag's row,
/// and a few long bags have a small output.
pub(crate) fn rows_bytes(positions: usize, dim: usize) -> usize {
    positions
        .saturating_mul(dim)
        .saturating_mul(core::mem::size_of::<f32>())
}

/// Runs `$body` with `$s` bound to the ids' slice, whichever their type.
macro_rules! with_ids {
    ($ids:expr, |$s:ident| $body:expr) => {
        match $ids {
            $crate::convert::IdSlice::I32($s) => $body,
            $crate::convert::IdSlice::I64($s) => $body,
        }
    };
}
pub(crate) use with_ids;

impl<'py> Ids<'py> {
    /// `obj` as int32 or int64 ids, C-contiguous.
    pub(crate) fn extract(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Ids<'py>> {
        let array = untyped(obj, name)?;
        if holds::<i64>(array) {
            readonly(obj, name, "int64").map(Ids::I64)
        } else if holds::<i32>(array) {
            readonly(obj, name, "int32").map(Ids::I32)
        } else {
            Err(invalid(format!(
                "{name} must be an int32 or int64 array, got {}",
                array.dtype()
            )))
        }
    }

    pub(crate) fn shape(&self) -> &[usize] {
        match self {
            Ids::I32(a) => a.shape(),
            Ids::I64(a) => a.shape(),
        }
    }

    pub(crate) fn slice(&self) -> IdSlice<'_> {
        match self {
            Ids::I32(a) => IdSlice::I32(slice(a)),
            Ids::I64(a) => IdSlice::I64(slice(a)),
        }
    }
}

/// A table `weight[num_embeddings, embedding_dim]` of float32, read in place.
pub(crate) struct Table<'py> {
    pub(crate) array: PyReadonlyArrayDyn<'py, f32>,
    pub(crate) rows: usize,
    pub(crate) dim: usize,
}

impl<'py> Table<'py> {
    pub(crate) fn extract(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Table<'py>> {
        let array = readonly::<f32>(obj, name, "float32")?;
        let (rows, dim) = table_shape(array.shape(), name)?;
        Ok(Table { array, rows, dim })
    }

    pub(crate) fn slice(&self) -> &[f32] {
        slice(&self.array)
    }
}

/// A table's `(num_embeddings, embedding_dim)` from the shape of `name`:
/// two sizes, the second not 0.
fn table_shape(shape: &[usize], name: &str) -> PyResult<(usize, usize)> {
    match *shape {
        [rows, dim] => Ok((rows, nonzero_dim(dim)?)),
        ref shape => Err(invalid(format!(
            "{name} must be 2-D [num_embeddings, embedding_dim], got shape {shape:?}"
        ))),
    }
}

/// `dim`, unless it is 0: the kernels read a table's row count from its
/// length, which a table of width 0 cannot tell.
pub(crate) fn nonzero_dim(dim: usize) -> PyResult<usize> {
    if dim == 0 {
        Err(invalid(
            "embedding_dim 0 is not supported (a table of width 0 holds no values)".to_string(),
        ))
    } else {
        Ok(dim)
    }
}

/// `padding_idx` as a row of a table of `rows` rows: a negative one counts
/// from the end, as in PyTorch.
pub(crate) fn padding(padding_idx: Option<i64>, rows: usize) -> PyResult<Option<usize>> {
    let Some(p) = padding_idx else {
        return Ok(None);
    };
    let n = i128::try_from(rows).unwrap_or(i128::MAX);
    let row = if p < 0 { p as i128 + n } else { p as i128 };
    if row < 0 || row >= n {
        return Err(invalid(format!(
            "padding_idx {p} must be within [-{rows}, {rows}) for a table of {rows} rows"
        )));
    }
    Ok(Some(row as usize))
}

/// The float32 gradient `grad_out` of `shape_prefix + [embedding_dim]`;
/// returns it and the `embedding_dim`.
pub(crate) fn grad_output<'py>(
    obj: &Bound<'py, PyAny>,
    shape_prefix: &[usize],
) -> PyResult<(PyReadonlyArrayDyn<'py, f32>, usize)> {
    let grad = readonly::<f32>(obj, "grad_out", "float32")?;
    let shape = grad.shape();
    match shape.split_last() {
        Some((&dim, prefix)) if prefix == shape_prefix => Ok((grad, nonzero_dim(dim)?)),
        _ => Err(invalid(format!(
            "grad_out has shape {shape:?}, expected {shape_prefix:?} + [embedding_dim]"
        ))),
    }
}

/// The output: the caller's `out` (float32, C-contiguous, exactly `shape`),
/// or a fresh array of `shape` as `np.empty` makes it, not zeroed: every
/// function that takes an output writes each of its elements before reading
/// any (a caller's `out` holds anything), so zeroing it would only cost time:
/// one more pass over the output (docs/design.md, "Memory: huge pages and
/// aligned tables").
pub(crate) fn output<'py>(
    py: Python<'py>,
    out: Option<&Bound<'py, PyAny>>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let Some(obj) = out else {
        // SAFETY: the array is NumPy's (its allocator, its own reference);
        // its elements are floats, for which any bytes are a value, and the
        // caller (every kernel function, through `writable`) writes every
        // element before the array reaches Python or is read. On an error the
        // array is dropped without being returned.
        return Ok(unsafe { PyArrayDyn::<f32>::new(py, shape, false) });
    };
    let typed = typed::<f32>(obj, "out", "float32")?;
    if typed.shape() != shape {
        return Err(invalid(format!(
            "out has shape {:?}, expected {shape:?}",
            typed.shape()
        )));
    }
    contiguous(typed.as_untyped(), "out")?;
    Ok(typed)
}

/// `obj` as a caller's 2-D output to write columns of: a C-contiguous
/// float32 array, and its shape.
pub(crate) fn output_columns<'py>(
    obj: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyArrayDyn<f32>>, usize, usize)> {
    let typed = typed::<f32>(obj, "out", "float32")?;
    contiguous(typed.as_untyped(), "out")?;
    match *typed.shape() {
        [rows, width] => Ok((typed, rows, width)),
        ref shape => Err(invalid(format!(
            "out must be 2-D [bags, width], got shape {shape:?}"
        ))),
    }
}

/// `obj` as a table to update in place: a C-contiguous float32 array of
/// shape `[num_embeddings, embedding_dim]` with `embedding_dim` not 0.
/// Returns it and its two sizes; [`writable`] borrows it.
pub(crate) fn table_in_place<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<(Bound<'py, PyArrayDyn<f32>>, usize, usize)> {
    let array = typed::<f32>(obj, name, "float32")?;
    let (rows, dim) = table_shape(array.shape(), name)?;
    contiguous(array.as_untyped(), name)?;
    Ok((array, rows, dim))
}

/// `obj` as a C-contiguous 1-D float32 array of `len` values, for state the
/// caller holds one value a row of (row-wise Adagrad's accumulators).
pub(crate) fn rows_in_place<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    len: usize,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let array = typed::<f32>(obj, name, "float32")?;
    if array.shape() != [len] {
        return Err(invalid(format!(
            "{name} must hold one value a row, shape [{len}], got {:?}",
            array.shape()
        )));
    }
    contiguous(array.as_untyped(), name)?;
    Ok(array)
}

/// `array` (called `name` in the error) borrowed writable: fails if it is
/// read-only or is also one of the inputs (borrowed already).
pub(crate) fn writable<'py>(
    array: &Bound<'py, PyArrayDyn<f32>>,
    name: &str,
) -> PyResult<PyReadwriteArrayDyn<'py, f32>> {
    array
        .try_readwrite()
        .map_err(|e| invalid(format!("{name} cannot be written: {e}")))
}
