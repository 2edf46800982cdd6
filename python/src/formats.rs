//! Reduced-precision tables: packing (`prepack`), unpacking (`dequantize`),
//! and the lookup and bags over a table of any of the crate's formats.
//!
//! A table is a NumPy array read in place, its format told by its dtype and,
//! where the dtype is ambiguous, by `format`:
//!
//! | format | array |
//! | --- | --- |
//! | `"f32"` | float32 `[rows, dim]` |
//! | `"f16"` | float16 `[rows, dim]` (or uint16 bits with `format="f16"`) |
//! | `"bf16"` | uint16 `[rows, dim]`, the bf16 bits (NumPy has no bfloat16; a torch bf16 tensor's `.view(torch.int16).numpy()` or `uint16` view) |
//! | `"int8"`, `"int4"`, `"int2"` | uint8 `[rows, row_bytes]`: PyTorch's row-wise packed rows (`embedding_bag_byte_prepack`, `_4bit_`, `_2bit_`) |
//!
//! A packed row's width is read from its byte count as PyTorch's unpackers
//! read it (`row_bytes - 8` values for int8, `(row_bytes - 4) * 2` for int4,
//! `* 4` for int2) unless `embedding_dim` says otherwise (a width that does
//! not fill its last byte). Every lookup and bag writes `float32`.

use crate::bag::BagArgs;
use crate::convert::{Ids, error, invalid, output, readonly, slice, with_ids, writable};
use crate::openmp;
use embedding_kernels::formats::{Format, PackedTable, RowWise, TableRef};
use embedding_kernels::table_gather_with;
use half::slice::HalfBitsSliceExt;
use half::{bf16, f16};
use numpy::{
    PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;

/// The row-wise format called `name` (`"int8"`, `"int4"` or `"int2"`).
fn row_wise(name: &str) -> PyResult<RowWise> {
    Format::from_name(name)
        .and_then(Format::row_wise)
        .ok_or_else(|| {
            invalid(format!(
                "format must be \"int8\", \"int4\" or \"int2\", got {name:?}"
            ))
        })
}

/// The dtype's name of `obj`, if it is a NumPy array.
pub(crate) fn dtype_name(obj: &Bound<'_, PyAny>) -> Option<String> {
    obj.cast::<PyUntypedArray>()
        .ok()
        .map(|a| a.dtype().to_string())
}

/// A table of any format, its array borrowed read-only.
enum Stored<'py> {
    F32(PyReadonlyArrayDyn<'py, f32>),
    F16(PyReadonlyArrayDyn<'py, f16>),
    /// f16 (`bf16 == false`) or bf16 bits.
    Bits(PyReadonlyArrayDyn<'py, u16>, bool),
    Packed(PyReadonlyArrayDyn<'py, u8>, RowWise),
}

/// A checked table: its stored array, width and rows.
struct AnyTable<'py> {
    stored: Stored<'py>,
    dim: usize,
}

impl<'py> AnyTable<'py> {
    /// `obj` as a table of `format` (or the format its dtype implies), of
    /// width `embedding_dim` where given.
    fn extract(
        obj: &Bound<'py, PyAny>,
        format: Option<&str>,
        embedding_dim: Option<usize>,
    ) -> PyResult<AnyTable<'py>> {
        let dtype = dtype_name(obj).ok_or_else(|| {
            invalid(format!(
                "table must be a numpy array, got {}",
                obj.get_type()
                    .name()
                    .map_or_else(|_| "?".to_string(), |n| n.to_string())
            ))
        })?;
        let format = match format {
            Some(name) => Format::from_name(name).ok_or_else(|| {
                invalid(format!(
                    "format must be one of \"f32\", \"f16\", \"bf16\", \"int8\", \"int4\", \"int2\", got {name:?}"
                ))
            })?,
            None => match dtype.as_str() {
                "float32" => Format::F32,
                "float16" => Format::F16,
                _ => {
                    return Err(invalid(format!(
                        "a {dtype} table needs format= (\"bf16\" for uint16 bits, \"int8\", \"int4\" or \"int2\" for uint8 packed rows)"
                    )))
                }
            },
        };
        let (stored, shape) = match format {
            Format::F32 => {
                let a = readonly::<f32>(obj, "table", "float32")?;
                let shape = a.shape().to_vec();
                (Stored::F32(a), shape)
            }
            Format::F16 if dtype == "float16" => {
                let a = readonly::<f16>(obj, "table", "float16")?;
                let shape = a.shape().to_vec();
                (Stored::F16(a), shape)
            }
            Format::F16 | Format::Bf16 => {
                let want = if format == Format::F16 {
                    "float16 or uint16"
                } else {
                    "uint16 (the bf16 bits)"
                };
                let a = readonly::<u16>(obj, "table", want)?;
                let shape = a.shape().to_vec();
                (Stored::Bits(a, format == Format::Bf16), shape)
            }
            Format::Int8 | Format::Int4 | Format::Int2 => {
                let a = readonly::<u8>(obj, "table", "uint8 (packed rows)")?;
                let shape = a.shape().to_vec();
                let rw = format.row_wise().unwrap_or(RowWise::Int8);
                (Stored::Packed(a, rw), shape)
            }
        };
        let [_, width] = shape[..] else {
            return Err(invalid(format!(
                "table must be 2-D [num_embeddings, {}], got shape {shape:?}",
                if matches!(stored, Stored::Packed(..)) {
                    "row_bytes"
                } else {
                    "embedding_dim"
                }
            )));
        };
        let dim = match &stored {
            Stored::Packed(_, rw) => packed_dim(*rw, width, embedding_dim)?,
            _ => match embedding_dim {
                Some(d) if d != width => {
                    return Err(invalid(format!(
                        "embedding_dim {d} does not match the table's width {width}"
                    )));
                }
                _ => width,
            },
        };
        Ok(AnyTable {
            stored,
            dim: crate::convert::nonzero_dim(dim)?,
        })
    }

    /// The crate's view of the table.
    fn table_ref(&self) -> PyResult<TableRef<'_>> {
        let dim = self.dim;
        match &self.stored {
            Stored::F32(a) => TableRef::f32(slice(a), dim),
            Stored::F16(a) => TableRef::f16(slice(a), dim),
            Stored::Bits(a, false) => TableRef::f16(slice(a).reinterpret_cast::<f16>(), dim),
            Stored::Bits(a, true) => TableRef::bf16(slice(a).reinterpret_cast::<bf16>(), dim),
            Stored::Packed(a, rw) => PackedTable::new(*rw, dim, slice(a)).map(TableRef::packed),
        }
        .map_err(error)
    }
}

/// The width of packed rows of `row_bytes`: `embedding_dim` if given (and
/// its rows are `row_bytes` long), else as PyTorch's unpackers read it.
fn packed_dim(format: RowWise, row_bytes: usize, embedding_dim: Option<usize>) -> PyResult<usize> {
    let per_byte = 8 / format.bits() as usize;
    let tail = format.row_bytes(0).unwrap_or(0);
    let dim = match embedding_dim {
        Some(d) => d,
        None => row_bytes.saturating_sub(tail) * per_byte,
    };
    if row_bytes < tail || format.row_bytes(dim) != Some(row_bytes) {
        return Err(invalid(format!(
            "packed {} rows of {row_bytes} bytes cannot hold {} values",
            Format::from(format),
            dim
        )));
    }
    Ok(dim)
}

/// Packs a float32 table `[rows, dim]` row by row, as PyTorch's
/// `embedding_bag_byte_prepack` (`"int8"`), `embedding_bag_4bit_prepack`
/// (`"int4"`) and `embedding_bag_2bit_prepack` (`"int2"`) do, byte for
/// byte: a uint8 array `[rows, row_bytes]`, each row its codes then its
/// scale and bias (float32 for int8, float16 otherwise). A row holding an
/// infinity or a NaN, or whose range overflows, raises `ValueError`.
#[pyfunction]
#[pyo3(signature = (weight, format))]
pub(crate) fn prepack<'py>(
    py: Python<'py>,
    weight: &Bound<'py, PyAny>,
    format: &str,
) -> PyResult<Bound<'py, PyArrayDyn<u8>>> {
    let format = row_wise(format)?;
    let table = crate::convert::Table::extract(weight, "weight")?;
    let row_bytes = format
        .row_bytes(table.dim)
        .ok_or_else(|| invalid(format!("rows of {} values cannot be sized", table.dim)))?;
    let (src, dim) = (table.slice(), table.dim);
    let packed = openmp::run(py, core::mem::size_of_val(src), |par| {
        format.prepack_with(par, src, dim)
    })?;
    PyArray1::from_vec(py, packed).reshape(vec![table.rows, row_bytes])
}

/// Unpacks row-wise packed rows (uint8 `[rows, row_bytes]`, as [`prepack`]
/// writes them) into a float32 `[rows, embedding_dim]` table, each value
/// `fma(code, scale, bias)` as PyTorch's `embedding_bag_byte_unpack` /
/// `_4bit_unpack` compute it.
#[pyfunction]
#[pyo3(signature = (packed, format, embedding_dim=None, out=None))]
pub(crate) fn dequantize<'py>(
    py: Python<'py>,
    packed: &Bound<'py, PyAny>,
    format: &str,
    embedding_dim: Option<usize>,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let rw = row_wise(format)?;
    let table = AnyTable::extract(packed, Some(format), embedding_dim)?;
    let Stored::Packed(bytes, _) = &table.stored else {
        return Err(invalid(format!("{format} is not a packed format")));
    };
    let (rows, dim) = (bytes.shape()[0], table.dim);
    let out = output(py, out, &[rows, dim])?;
    {
        let mut guard = writable(&out, "out")?;
        let dst = guard.as_slice_mut().map_err(|e| invalid(e.to_string()))?;
        let src = slice(bytes);
        openmp::run(py, core::mem::size_of_val(dst), |par| {
            rw.dequantize_with(par, src, dim, dst)
        })?;
    }
    Ok(out)
}

/// `out[..., :] = table[ids[...], :]` read back as float32, for a table of
/// any format (module notes): shape `ids.shape + (embedding_dim,)`, written
/// into `out` if given. An `f16` or `bf16` value is widened exactly, a packed
/// one is `fma(code, scale, bias)` (the bits of [`dequantize`]).
///
/// Raises `IndexError` for an id out of range (naming its flat position and
/// value), `ValueError` for anything else; then `out` is unchanged.
#[pyfunction]
#[pyo3(signature = (table, ids, format=None, embedding_dim=None, out=None))]
pub(crate) fn table_embedding<'py>(
    py: Python<'py>,
    table: &Bound<'py, PyAny>,
    ids: &Bound<'py, PyAny>,
    format: Option<&str>,
    embedding_dim: Option<usize>,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let table = AnyTable::extract(table, format, embedding_dim)?;
    let view = table.table_ref()?;
    let ids = Ids::extract(ids, "ids")?;
    let mut shape = ids.shape().to_vec();
    shape.push(table.dim);
    let out = output(py, out, &shape)?;
    {
        let mut guard = writable(&out, "out")?;
        let dst = guard.as_slice_mut().map_err(|e| invalid(e.to_string()))?;
        let ids = ids.slice();
        openmp::run(py, core::mem::size_of_val(dst), |par| {
            with_ids!(ids, |i| table_gather_with(par, view, i, dst))
        })?;
    }
    Ok(out)
}

/// [`embedding_bag`](crate::bag::embedding_bag) over a table of any format:
/// `(out, max_indices)`, `out` float32 `[num_bags, embedding_dim]`. Over
/// `f16` and `bf16` tables the bags are those of the widened float32 table,
/// bit for bit; over packed tables the sum adds each row as FBGEMM does
/// (`acc = fma(w * scale, code, acc + w * bias)`, PyTorch's
/// `embedding_bag_byte_rowwise_offsets` / `_4bit_rowwise_offsets` bit for
/// bit), mean divides that sum by the count, and max compares the read-back
/// values. With `column`, `out` is the caller's float32 `[num_bags, width]`
/// array and the bags fill its columns `column..column + embedding_dim`,
/// the others left as they are.
#[pyfunction]
#[pyo3(signature = (table, ids, offsets=None, mode="mean", per_sample_weights=None, include_last_offset=false, padding_idx=None, format=None, embedding_dim=None, out=None, column=None))]
// PyTorch's arguments, and the table's format.
#[allow(clippy::too_many_arguments)]
pub(crate) fn table_embedding_bag<'py>(
    py: Python<'py>,
    table: &Bound<'py, PyAny>,
    ids: &Bound<'py, PyAny>,
    offsets: Option<&Bound<'py, PyAny>>,
    mode: &str,
    per_sample_weights: Option<&Bound<'py, PyAny>>,
    include_last_offset: bool,
    padding_idx: Option<i64>,
    format: Option<&str>,
    embedding_dim: Option<usize>,
    out: Option<&Bound<'py, PyAny>>,
    column: Option<usize>,
) -> PyResult<crate::bag::BagPair<'py>> {
    let table = AnyTable::extract(table, format, embedding_dim)?;
    let view = table.table_ref()?;
    let args = BagArgs {
        ids,
        offsets,
        mode,
        per_sample_weights,
        include_last_offset,
        padding_idx,
    };
    crate::bag::forward_on(py, view, view.rows(), args, out, column)
}
