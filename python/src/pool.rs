//! The crate's rayon pool as the extension makes it.
//!
//! The pool is made on the first kernel call, so that `RAYON_NUM_THREADS`
//! can be set until then and a process that forks before any call gives
//! each child a pool of its own. When that first call comes from the thread
//! that imported the module and it is Python's main thread, the pool is made
//! with that thread in it (`use_current_thread`): its calls then work on
//! themselves beside the pool's other threads, as PyTorch's calling thread is
//! one of its OpenMP threads, instead of handing the work over and sleeping
//! until it is done. `EMBEDDING_KERNELS_CALLER_WAITS`, set to any value at
//! import, keeps rayon's own pool, which every calling thread waits on.
//!
//! A fork copies the pool but not its threads. In a child of a process that
//! had made its pool, the main thread (if it is in the pool) still runs
//! every call, alone; a call from any other thread would wait for threads
//! that are gone, so it raises `RuntimeError` instead.

use crate::convert::error;
use embedding_kernels::EmbeddingError;
use pyo3::exceptions::PyRuntimeError;
use pyo3::marker::Ungil;
use pyo3::prelude::*;
use std::error::Error;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::thread::ThreadId;

/// The importing thread, when it is Python's main thread and the caller is
/// to work in the pool (set once, at import).
static MAIN: OnceLock<ThreadId> = OnceLock::new();

/// How making the pool went: `Err` holds why it could not start.
static MADE: OnceLock<Result<(), String>> = OnceLock::new();

/// Whether this process is a fork of one that had made its pool.
static FORKED_WITH_POOL: AtomicBool = AtomicBool::new(false);

/// At import: notes whether the importing thread is Python's main thread
/// (and the opt-out unset), and has a fork tell the child.
pub(crate) fn at_import(py: Python<'_>) -> PyResult<()> {
    let threading = py.import("threading")?;
    let main = threading.call_method0("main_thread")?;
    let here = threading.call_method0("current_thread")?;
    if main.is(&here) && std::env::var_os("EMBEDDING_KERNELS_CALLER_WAITS").is_none() {
        let _ = MAIN.set(std::thread::current().id());
    }
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("after_in_child", wrap_pyfunction!(after_fork_in_child, py)?)?;
    py.import("os")?
        .call_method("register_at_fork", (), Some(&kwargs))?;
    Ok(())
}

/// `os.register_at_fork`'s hook in the child.
#[pyfunction]
fn after_fork_in_child() {
    FORKED_WITH_POOL.store(MADE.get().is_some(), Ordering::Relaxed);
}

/// Runs a kernel call `f` with the GIL released, once the pool is ready
/// ([`ready`]); its error as the Python exception (`convert::error`). Every
/// kernel of the module runs through here.
pub(crate) fn run<T: Send>(
    py: Python<'_>,
    f: impl Ungil + FnOnce() -> Result<T, EmbeddingError>,
) -> PyResult<T> {
    ready()?;
    py.detach(f).map_err(error)
}

/// The stack of each of the pool's threads (address space: only the pages a
/// thread touches take memory). rayon's default is Rust's 2 MiB, which an
/// optimised build never comes near (its largest kernel frame is 48 KiB),
/// but an unoptimised one, as CI builds the extension, keeps every local of
/// a kernel's inlined body in a slot of its own: the bag sum's AVX-512 body
/// took 4.3 MB, and a bag call split onto a pool thread overflowed its stack
/// (a segmentation fault, since a library has no handler for it).
const POOL_STACK_BYTES: usize = 16 << 20;

/// Makes the pool on the first call; refuses a call that the pool cannot
/// run. Nothing here touches Python, so the `OnceLock` cannot wait on a
/// thread that waits for the GIL.
fn ready() -> PyResult<()> {
    let made = MADE.get_or_init(|| {
        let mut builder = rayon::ThreadPoolBuilder::new().stack_size(POOL_STACK_BYTES);
        if MAIN.get() == Some(&std::thread::current().id()) {
            builder = builder.use_current_thread();
        }
        match builder.build_global() {
            // Only a failure to start a thread has a source; the other two
            // errors (a pool made already, this thread in a pool) leave a
            // working pool.
            Err(e) if e.source().is_some() => Err(e.to_string()),
            _ => Ok(()),
        }
    });
    if let Err(why) = made {
        return Err(PyRuntimeError::new_err(format!(
            "the kernels' thread pool could not start: {why}"
        )));
    }
    if FORKED_WITH_POOL.load(Ordering::Relaxed) && rayon::current_thread_index().is_none() {
        return Err(PyRuntimeError::new_err(
            "this process is a fork of one that had run the kernels, and its thread pool did not \
             survive the fork: call them from the main thread, or start the process with \
             multiprocessing's \"spawn\" or \"forkserver\"",
        ));
    }
    Ok(())
}

/// Whether the calling thread is one of the crate's pool threads (the main
/// thread that imported the module, unless `EMBEDDING_KERNELS_CALLER_WAITS`
/// was set); makes the pool if no call has yet.
#[pyfunction]
pub(crate) fn caller_in_pool() -> PyResult<bool> {
    ready()?;
    Ok(rayon::current_thread_index().is_some())
}
