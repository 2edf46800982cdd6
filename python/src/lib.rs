//! `embedding_kernels._native`: the crate's kernels as NumPy functions.
//!
//! Each function takes NumPy arrays, reads them in place (no copy: a
//! non-contiguous array is refused), checks every argument and id before it
//! writes anything, and runs the kernel with the GIL released. The output is
//! the caller's `out` array or a fresh one. An id out of range raises
//! `IndexError` naming its position and value; any other bad argument raises
//! `ValueError` with the crate's message; on an error nothing is written.
//!
//! | function | kernel |
//! | --- | --- |
//! | `embedding` | `gather` |
//! | `embedding_dense_backward`, `embedding_sparse_backward` | `dense_backward`, `sparse_backward` |
//! | `embedding_sparse_sgd_step`, `embedding_sparse_adagrad_step` (update `weight` in place) | `sparse_step` with `Sgd`, `AdagradOn` |
//! | `embedding_bag` | `bag_forward` |
//! | `embedding_bag_backward`, `embedding_bag_sparse_backward` | `bag_backward` or `bag_max_backward`, `bag_sparse_backward` |
//! | `embedding_bag_sparse_sgd_step`, `embedding_bag_sparse_adagrad_step` | `bag_sparse_step` with `Sgd`, `AdagradOn` |
//! | `prepack`, `dequantize` | `RowWise::prepack`, `RowWise::dequantize` |
//! | `table_embedding`, `table_embedding_bag` | `table_gather`, `table_bag_forward` (f32, f16, bf16, int8, int4, int2 tables) |
//!
//! The PyTorch modules (`embedding_kernels.torch`) are Python, built on these.
//! `OPT_LEVEL` is the optimisation level the extension was built at (`"3"`
//! from `pip install`, `"0"` from CI's quick build), for timing scripts.
//!
//! The thread that imports the module, when it is Python's main thread, joins
//! the crate's rayon pool as its first thread: a kernel called from it then
//! works on its own call with the pool's other threads, as PyTorch's calling
//! thread is one of its OpenMP threads, instead of handing the call to the
//! pool and sleeping until it is done. The pool has `RAYON_NUM_THREADS`
//! threads (as set at import), the calling thread one of them; calls from
//! other threads run on the others. `EMBEDDING_KERNELS_CALLER_WAITS` (set to
//! anything at import) keeps rayon's own pool, which every calling thread
//! waits on. `caller_in_pool()` says whether the calling thread is in it.

mod bag;
mod convert;
mod embedding;
mod formats;
mod step;

use pyo3::prelude::*;

/// Makes the crate's rayon pool with the importing thread in it, when that
/// is Python's main thread and `EMBEDDING_KERNELS_CALLER_WAITS` is not set.
/// A pool already made (a second import in another interpreter) is kept.
fn join_pool(py: Python<'_>) -> PyResult<()> {
    if std::env::var_os("EMBEDDING_KERNELS_CALLER_WAITS").is_some() {
        return Ok(());
    }
    let threading = py.import("threading")?;
    let main = threading.call_method0("main_thread")?;
    if !main.is(&threading.call_method0("current_thread")?) {
        return Ok(());
    }
    // Fails only when the global pool exists already: then it stays as it is.
    let _ = rayon::ThreadPoolBuilder::new()
        .use_current_thread()
        .build_global();
    Ok(())
}

/// Whether the calling thread is one of the crate's pool threads: the main
/// thread that imported the module, unless `EMBEDDING_KERNELS_CALLER_WAITS`
/// was set.
#[pyfunction]
fn caller_in_pool() -> bool {
    rayon::current_thread_index().is_some()
}

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    join_pool(m.py())?;
    m.add_function(wrap_pyfunction!(caller_in_pool, m)?)?;
    m.add_function(wrap_pyfunction!(embedding::embedding, m)?)?;
    m.add_function(wrap_pyfunction!(embedding::embedding_dense_backward, m)?)?;
    m.add_function(wrap_pyfunction!(embedding::embedding_sparse_backward, m)?)?;
    m.add_function(wrap_pyfunction!(step::embedding_sparse_sgd_step, m)?)?;
    m.add_function(wrap_pyfunction!(step::embedding_sparse_adagrad_step, m)?)?;
    m.add_function(wrap_pyfunction!(bag::embedding_bag, m)?)?;
    m.add_function(wrap_pyfunction!(bag::embedding_bag_backward, m)?)?;
    m.add_function(wrap_pyfunction!(bag::embedding_bag_sparse_backward, m)?)?;
    m.add_function(wrap_pyfunction!(step::embedding_bag_sparse_sgd_step, m)?)?;
    m.add_function(wrap_pyfunction!(
        step::embedding_bag_sparse_adagrad_step,
        m
    )?)?;
    m.add_function(wrap_pyfunction!(formats::prepack, m)?)?;
    m.add_function(wrap_pyfunction!(formats::dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(formats::table_embedding, m)?)?;
    m.add_function(wrap_pyfunction!(formats::table_embedding_bag, m)?)?;
    m.add("OPT_LEVEL", env!("EMBEDDING_KERNELS_OPT_LEVEL"))?;
    Ok(())
}
