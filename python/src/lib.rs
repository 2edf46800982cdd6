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
//! | `embedding_sparse_rowwise_adagrad_step`, `embedding_bag_sparse_rowwise_adagrad_step` | `sparse_step`, `bag_sparse_step` with `RowWiseAdagradOn` |
//! | `prepack`, `dequantize` | `RowWise::prepack`, `RowWise::dequantize` |
//! | `table_embedding`, `table_embedding_bag` | `table_gather`, `table_bag_forward_strided_with` (f32, f16, bf16, int8, int4, int2 tables; rows side by side, or columns of `out`) |
//! | `collapse_huge_pages` | `memory::collapse_huge_pages` (a table's memory into 2 MiB pages) |
//! | `bucket_rows` | (here) a batch's ids bucketed by the rank that holds their rows, for the sharded collection |
//!
//! The PyTorch modules (`embedding_kernels.torch`) are Python, built on these.
//! `OPT_LEVEL` is the optimisation level the extension was built at (`"3"`
//! from `pip install`, `"0"` from CI's quick build), for timing scripts.
//!
//! The kernels run on the crate's rayon pool, which the main thread that
//! imported the module joins (`pool.rs`); `caller_in_pool()` says whether the
//! calling thread is in it, `pool_thread_spinning()` whether a job spinning
//! for the next call is queued or running, `pool_spin_counts()` how many
//! such jobs ran and how many tasks they ran.

mod bag;
mod convert;
mod embedding;
mod formats;
mod memory;
mod openmp;
mod pool;
mod shard;
mod step;

use pyo3::prelude::*;

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    pool::at_import(m.py())?;
    m.add_function(wrap_pyfunction!(pool::caller_in_pool, m)?)?;
    m.add_function(wrap_pyfunction!(pool::pool_thread_spinning, m)?)?;
    m.add_function(wrap_pyfunction!(pool::pool_spin_counts, m)?)?;
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
    m.add_function(wrap_pyfunction!(
        step::embedding_sparse_rowwise_adagrad_step,
        m
    )?)?;
    m.add_function(wrap_pyfunction!(
        step::embedding_bag_sparse_rowwise_adagrad_step,
        m
    )?)?;
    m.add_function(wrap_pyfunction!(openmp::openmp_threads, m)?)?;
    m.add_function(wrap_pyfunction!(openmp::openmp_executor_runs, m)?)?;
    m.add_function(wrap_pyfunction!(openmp::torch_call_threads, m)?)?;
    m.add_function(wrap_pyfunction!(formats::prepack, m)?)?;
    m.add_function(wrap_pyfunction!(formats::dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(formats::table_embedding, m)?)?;
    m.add_function(wrap_pyfunction!(formats::table_embedding_bag, m)?)?;
    m.add_function(wrap_pyfunction!(memory::collapse_huge_pages, m)?)?;
    m.add_function(wrap_pyfunction!(shard::bucket_rows, m)?)?;
    m.add("OPT_LEVEL", env!("EMBEDDING_KERNELS_OPT_LEVEL"))?;
    Ok(())
}
