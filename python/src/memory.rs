//! Tables in transparent huge pages: `collapse_huge_pages`.

use crate::convert::{invalid, readonly, slice};
use crate::formats::dtype_name;
use numpy::Element;
use pyo3::prelude::*;

/// Moves the whole 2 MiB pages of `table` (a C-contiguous array of
/// float32, float16, uint16 or uint8: a table of any format) into
/// transparent huge pages, its values kept: the crate's
/// `memory::collapse_huge_pages`, with the GIL released while the kernel
/// copies. Returns whether every such page is now a huge page: False off
/// Linux (with glibc), before Linux 6.1, for an array holding no whole
/// 2 MiB page, where the kernel found none free, or for memory never
/// written (then the advice still stands, and its pages come as huge ones
/// when first written).
#[pyfunction]
pub(crate) fn collapse_huge_pages(py: Python<'_>, table: &Bound<'_, PyAny>) -> PyResult<bool> {
    let dtype =
        dtype_name(table).ok_or_else(|| invalid("table must be a numpy array".to_string()))?;
    match dtype.as_str() {
        "float32" => collapse::<f32>(py, table),
        "float16" => collapse::<half::f16>(py, table),
        "uint16" => collapse::<u16>(py, table),
        "uint8" => collapse::<u8>(py, table),
        _ => Err(invalid(format!(
            "table must hold float32, float16, uint16 or uint8, got {dtype}"
        ))),
    }
}

/// [`collapse_huge_pages`] on an array of `T`.
fn collapse<T: Element + Sync>(py: Python<'_>, table: &Bound<'_, PyAny>) -> PyResult<bool> {
    let array = readonly::<T>(table, "table", "float32, float16, uint16 or uint8")?;
    let values = slice(&array);
    Ok(py.detach(|| embedding_kernels::memory::collapse_huge_pages(values)))
}
