//! The kernels on PyTorch's OpenMP threads.
//!
//! PyTorch's OpenMP threads (libgomp's, by default) keep spinning for several
//! milliseconds after each of its ops. On a machine with as many cores as
//! threads, the crate's rayon threads then share their cores with spinning
//! threads, and a call made right after a torch op runs at the speed of one
//! thread (docs/design.md, "Threads"). Where the process has libgomp
//! loaded (PyTorch loads it) and its team has two threads or more, a call
//! reading or writing 256 KiB or more runs on that team instead ([`run`]):
//! the crate cuts it into the tasks it would hand its rayon pool and, through
//! its [`Executor`] hook, hands them to the team's threads, the ones already
//! spinning. The same tasks give the same bits, every id is checked before
//! any task writes, and a panic is carried back to the calling thread rather
//! than unwound through libgomp's C frames. Where PyTorch has one thread
//! (`torch.set_num_threads(1)`), every call runs on its calling thread alone.
//! `EMBEDDING_KERNELS_OPENMP=0`, set before the first call, keeps every call
//! on the crate's rayon pool, whatever PyTorch's count.

use crate::pool;
use embedding_kernels::{EmbeddingError, Executor, Parallelism, with_executor};
use pyo3::prelude::*;
use std::any::Any;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Calls reading or writing less than this stay on the rayon path, which
/// keeps a small call on its calling thread.
const MIN_BYTES: usize = 256 << 10;

/// `GOMP_parallel(fn, data, num_threads, flags)`: runs `fn(data)` on a team
/// of `num_threads` threads (0: the default count), the calling thread one
/// of them, and returns when every one has.
type Parallel = unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, u32, u32);

/// `omp_get_max_threads`.
type Count = unsafe extern "C" fn() -> i32;

/// The entry points of the libgomp loaded in this process.
struct Gomp {
    parallel: Parallel,
    max_threads: Count,
}

/// libgomp's team, for one call: the entry points and how many threads.
#[derive(Clone, Copy)]
pub(crate) struct Team {
    gomp: &'static Gomp,
    threads: usize,
}

/// The loaded libgomp, once found; looked for again by each large call until
/// then (PyTorch may be imported after this module).
static GOMP: OnceLock<Gomp> = OnceLock::new();

/// Whether `EMBEDDING_KERNELS_OPENMP=0` turned this path off.
fn disabled() -> bool {
    static OFF: OnceLock<bool> = OnceLock::new();
    *OFF.get_or_init(|| std::env::var_os("EMBEDDING_KERNELS_OPENMP").is_some_and(|v| v == "0"))
}

/// libgomp, if the process has already loaded it: never loaded here (on
/// Linux; elsewhere never found).
#[cfg(not(target_os = "linux"))]
fn find() -> Option<&'static Gomp> {
    None
}

/// libgomp, if the process has already loaded it: never loaded here (on
/// Linux; elsewhere never found).
#[cfg(target_os = "linux")]
fn find() -> Option<&'static Gomp> {
    if let Some(gomp) = GOMP.get() {
        return Some(gomp);
    }
    // SAFETY: `dlopen` with `RTLD_NOLOAD` only looks among the objects
    // already loaded (and takes a reference to the one it finds, which keeps
    // it loaded for the life of the process); `dlsym` reads its symbol table.
    // Each symbol is libgomp's public entry point of that name, whose C
    // signature the type it is cast to spells out (libgomp's ABI, stable
    // since GCC 4.9 for `GOMP_parallel`).
    let gomp = unsafe {
        let handle = libc::dlopen(
            c"libgomp.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        );
        if handle.is_null() {
            return None;
        }
        let symbol = |name: &core::ffi::CStr| {
            let p = libc::dlsym(handle, name.as_ptr());
            (!p.is_null()).then_some(p)
        };
        Gomp {
            parallel: core::mem::transmute::<*mut c_void, Parallel>(symbol(c"GOMP_parallel")?),
            max_threads: core::mem::transmute::<*mut c_void, Count>(symbol(
                c"omp_get_max_threads",
            )?),
        }
    };
    Some(GOMP.get_or_init(|| gomp))
}

/// libgomp's team for a call reading or writing `bytes`, where this path
/// applies: a large enough call, libgomp loaded, two threads or more.
pub(crate) fn team(bytes: usize) -> Option<Team> {
    match torch_threads(bytes) {
        Some(Threads::Team(team)) => Some(team),
        _ => None,
    }
}

/// Where PyTorch's thread count decides how a call runs.
enum Threads {
    /// On libgomp's team of two threads or more.
    Team(Team),
    /// On the calling thread alone: PyTorch was asked for one thread
    /// (`torch.set_num_threads(1)` sets libgomp's count), and one means one.
    One,
}

/// How PyTorch's thread count has a call reading or writing `bytes` run,
/// where libgomp is loaded; `None` leaves it to the crate's pool. A small
/// call looks only at a libgomp already found by a large one, so that a
/// process without PyTorch pays no lookup on each small call.
fn torch_threads(bytes: usize) -> Option<Threads> {
    if disabled() {
        return None;
    }
    let gomp = if bytes < MIN_BYTES {
        GOMP.get()?
    } else {
        find()?
    };
    // SAFETY: libgomp's `omp_get_max_threads`, no arguments.
    let threads = usize::try_from(unsafe { (gomp.max_threads)() }).ok()?;
    match threads {
        0 => None,
        1 => Some(Threads::One),
        _ if bytes < MIN_BYTES => None,
        _ => Some(Threads::Team(Team { gomp, threads })),
    }
}

/// How many threads PyTorch's count gives calls of `nbytes` now: 1 on the
/// calling thread alone, the team's size on libgomp's team, 0 on the crate's
/// pool; for tests.
#[pyfunction]
#[pyo3(signature = (nbytes=MIN_BYTES))]
pub(crate) fn torch_call_threads(nbytes: usize) -> usize {
    match torch_threads(nbytes) {
        Some(Threads::Team(team)) => team.threads,
        Some(Threads::One) => 1,
        None => 0,
    }
}

/// Whether calls of `bytes` would run on libgomp's team now, and on how many
/// threads (0: on the rayon pool); for tests and benchmarks.
#[pyfunction]
#[pyo3(signature = (nbytes=MIN_BYTES))]
pub(crate) fn openmp_threads(nbytes: usize) -> usize {
    team(nbytes).map_or(0, |t| t.threads)
}

/// Runs a kernel call `f` with the GIL released, and its error as the Python
/// exception. When a call reading or writing `bytes` qualifies ([`team`]), on
/// libgomp's team as the crate's executor, split whatever its size
/// (`f(Parallelism::Rayon)`); where PyTorch has one thread, on the calling
/// thread (`f(Parallelism::Serial)`); else on the crate's rayon pool, which
/// decides ([`pool::run`], `f(Parallelism::Auto)`).
pub(crate) fn run<T: Send>(
    py: Python<'_>,
    bytes: usize,
    f: impl Send + FnOnce(Parallelism) -> Result<T, EmbeddingError>,
) -> PyResult<T> {
    match torch_threads(bytes) {
        Some(Threads::Team(team)) => py
            .detach(|| with_executor(Arc::new(team), || f(Parallelism::Rayon)))
            .map_err(crate::convert::error),
        Some(Threads::One) => py
            .detach(|| f(Parallelism::Serial))
            .map_err(crate::convert::error),
        None => pool::run(py, || f(Parallelism::Auto)),
    }
}

/// One [`Executor::run`] on the team: the tasks, cut into one run of
/// consecutive tasks a thread, the next task of each run, and the first
/// panic.
struct Job<'a> {
    task: &'a (dyn Fn(usize) + Sync),
    count: usize,
    /// The threads that have started, each taking the run of its arrival.
    started: AtomicUsize,
    next: Vec<Next>,
    panicked: Mutex<Option<Box<dyn Any + Send>>>,
}

/// The next task of a run, alone on its cache line (128 bytes: the line and
/// the neighbour that the adjacent-line prefetcher fetches with it). A thread
/// takes each task of its run from it; with the runs' counters side by side,
/// every take would move the line from the other thread's core, a cost that
/// a small call's short tasks pay on each task.
#[repr(align(128))]
struct Next(AtomicUsize);

impl Job<'_> {
    /// The end of run `r`'s tasks (it starts where run `r - 1` ends).
    fn end(&self, r: usize) -> usize {
        self.count * (r + 1) / self.next.len()
    }
}

/// Each thread of the team: the tasks of its own run first, in order, then
/// whatever is left of the others'. A thread's tasks are neighbours, as
/// rayon's halving keeps them: taking tasks from one counter in turns was
/// slower than runs.
extern "C" fn each_task(data: *mut c_void) {
    // SAFETY: `data` is the `&Job` that `Executor::run` passed to
    // `GOMP_parallel`, which returns only after every thread has run this.
    let job = unsafe { &*data.cast::<Job<'_>>() };
    let runs = job.next.len();
    let mine = job.started.fetch_add(1, Ordering::Relaxed);
    for r in (0..runs).map(|j| (mine + j) % runs) {
        let end = job.end(r);
        loop {
            let k = job.next[r].0.fetch_add(1, Ordering::Relaxed);
            if k >= end {
                break;
            }
            // A panic must not unwind into libgomp's C frames: the first one
            // is carried back to the caller.
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| (job.task)(k))) {
                job.panicked
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get_or_insert(payload);
            }
        }
    }
}

/// How many times [`Executor::run`] has handed tasks to the team.
static EXECUTOR_RUNS: AtomicUsize = AtomicUsize::new(0);

/// How many times the crate has handed a call's tasks to libgomp's team
/// (through [`run`]); for tests.
#[pyfunction]
pub(crate) fn openmp_executor_runs() -> usize {
    EXECUTOR_RUNS.load(Ordering::Relaxed)
}

impl Executor for Team {
    fn threads(&self) -> usize {
        self.threads
    }

    fn run(&self, count: usize, task: &(dyn Fn(usize) + Sync)) {
        EXECUTOR_RUNS.fetch_add(1, Ordering::Relaxed);
        let runs = self.threads.min(count).max(1);
        let job = Job {
            task,
            count,
            started: AtomicUsize::new(0),
            next: (0..runs)
                .map(|r| Next(AtomicUsize::new(count * r / runs)))
                .collect(),
            panicked: Mutex::new(None),
        };
        let threads = u32::try_from(runs).unwrap_or(u32::MAX);
        // SAFETY: `GOMP_parallel` runs `each_task` on up to `threads`
        // threads with `&job` and returns only when all of them are done, so
        // `job` outlives every use; `each_task` reads it through shared
        // references and catches every panic.
        unsafe {
            (self.gomp.parallel)(
                each_task,
                core::ptr::from_ref(&job).cast_mut().cast(),
                threads,
                0,
            )
        }
        let panicked = job
            .panicked
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(payload) = panicked {
            resume_unwind(payload);
        }
    }
}
