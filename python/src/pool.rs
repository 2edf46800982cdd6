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
//! After each call one pool thread keeps looking for work for 100 µs
//! (`EMBEDDING_KERNELS_SPIN_US`; unless one already is), as PyTorch's OpenMP
//! threads spin after an op, so that a call made from Python a few µs after
//! the last one finds it awake ([`linger`]).
//!
//! A fork copies the pool but not its threads. In a child of a process that
//! had made its pool, the main thread (if it is in the pool) still runs
//! every call, alone; a call from any other thread would wait for threads
//! that are gone, so it raises `RuntimeError` instead.

use crate::convert::error;
use embedding_kernels::EmbeddingError;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::error::Error;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::ThreadId;
use std::time::Instant;

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
    if let Some(us) = std::env::var_os("EMBEDDING_KERNELS_SPIN_US") {
        let us = us
            .to_str()
            .and_then(|us| us.trim().parse::<u64>().ok())
            .filter(|&us| us <= 1_000_000)
            .ok_or_else(|| {
                pyo3::exceptions::PyValueError::new_err(format!(
                    "EMBEDDING_KERNELS_SPIN_US must be a whole number of microseconds from 0 to 1000000, got {us:?}"
                ))
            })?;
        SPIN_NS.store(us * 1_000, Ordering::Relaxed);
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
    // The spinning thread, if any, is not in the child.
    SPIN_JOB.store(false, Ordering::Relaxed);
}

/// Runs a kernel call `f` with the GIL released, once the pool is ready
/// ([`ready`]), and leaves a pool thread spinning after it ([`linger`]); its
/// error as the Python exception (`convert::error`). Every kernel call of
/// the module that does not run on PyTorch's OpenMP threads
/// ([`openmp::run`](crate::openmp::run)) runs through here.
pub(crate) fn run<T: Send>(
    py: Python<'_>,
    f: impl Send + FnOnce() -> Result<T, EmbeddingError>,
) -> PyResult<T> {
    ready()?;
    let result = py.detach(|| {
        mark_busy();
        let result = f();
        linger();
        result
    });
    result.map_err(error)
}

/// How long a pool thread keeps looking for work after the last kernel
/// call started or ended, in ns: `EMBEDDING_KERNELS_SPIN_US` at import (µs,
/// 0 for never), else [`DEFAULT_SPIN_US`].
static SPIN_NS: AtomicU64 = AtomicU64::new(DEFAULT_SPIN_US * 1_000);

/// rayon's idle threads go to sleep soon after their work runs out, within
/// the time a module call spends in Python around its kernel, and the next
/// split call then waits for one to wake (docs/design.md, "Threads"). The
/// default covers that gap with room; PyTorch's OpenMP threads spin for
/// longer.
const DEFAULT_SPIN_US: u64 = 100;

/// Whether a spin job is queued or running (one at most).
static SPIN_JOB: AtomicBool = AtomicBool::new(false);

/// When the last kernel call started or ended, in ns after [`epoch`].
static LAST_BUSY: AtomicU64 = AtomicU64::new(0);

/// For tests: the spin jobs that ran on a pool thread, and the tasks they
/// ran (`pool_spin_counts`).
static SPINS: AtomicU64 = AtomicU64::new(0);
static SPIN_TASKS: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ns() -> u64 {
    u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Notes a call's start or end (calls from several threads only move the
/// time forward).
fn mark_busy() {
    LAST_BUSY.fetch_max(now_ns(), Ordering::Relaxed);
}

/// After a call: unless a spin job is queued or running, spawns one, which
/// has a pool thread other than the calling one look for work ([`spin`]).
/// A call that ends just as the job ends may find it still there and spawn
/// none; the next call's end does.
fn linger() {
    let spin_ns = SPIN_NS.load(Ordering::Relaxed);
    mark_busy();
    if spin_ns == 0 || rayon::current_num_threads() < 2 || SPIN_JOB.swap(true, Ordering::AcqRel) {
        return;
    }
    rayon::spawn(move || {
        // The calling thread, when it is in the pool, can take the job back
        // from its own queue while it waits in a later call: it leaves it.
        if MAIN.get() != Some(&std::thread::current().id()) {
            spin(spin_ns);
        }
        SPIN_JOB.store(false, Ordering::Release);
    });
}

/// Looks for work until no call has started or ended for `spin_ns`, or for
/// at most `spin_ns` in all: runs what it finds (`rayon::yield_now`: the
/// next call's tasks, as an awake idle thread would) and otherwise gives up
/// its CPU between looks (`sched_yield`), so that a thread waiting for that
/// CPU runs first; with nothing else to run, the thread keeps a core busy.
///
/// The bound on the job's own time matters when Python calls from more
/// than one thread: a pool thread waiting inside one call can take the job
/// (rayon runs other work while it waits), and that call resumes only when
/// the job returns, so a job that lived as long as another thread kept
/// calling could hold the call up for as long.
fn spin(spin_ns: u64) {
    SPINS.fetch_add(1, Ordering::Relaxed);
    let start = now_ns();
    loop {
        let now = now_ns();
        let idle = now.saturating_sub(LAST_BUSY.load(Ordering::Relaxed));
        if idle >= spin_ns || now.saturating_sub(start) >= spin_ns {
            return;
        }
        if rayon::yield_now() == Some(rayon::Yield::Executed) {
            SPIN_TASKS.fetch_add(1, Ordering::Relaxed);
        } else {
            std::thread::yield_now();
        }
    }
}

/// Whether a spin job is queued or running (see the module's docs), for
/// tests.
#[pyfunction]
pub(crate) fn pool_thread_spinning() -> bool {
    SPIN_JOB.load(Ordering::Acquire)
}

/// The spin jobs that ran on a pool thread so far, and the tasks they ran,
/// for tests.
#[pyfunction]
pub(crate) fn pool_spin_counts() -> (u64, u64) {
    (
        SPINS.load(Ordering::Relaxed),
        SPIN_TASKS.load(Ordering::Relaxed),
    )
}

/// The stack of each of the pool's threads (address space: only the pages a
/// thread touches take memory). rayon's default is Rust's 2 MiB, which an
/// optimised build never comes near (its largest kernel frame is 48 KiB),
/// but an unoptimised one, as CI builds the extension, keeps every local of
/// a kernel's body in a slot of its own: the bag sum's blocks, each size a
/// function of its own (`Lanes::apart`), take up to 380 KB in the
/// crate's unoptimised test build. A thread
/// that overflows its stack crashes the process (a segmentation fault, since
/// a library has no handler for it), so the pool leaves room to spare.
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
