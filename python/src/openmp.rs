//! The lookup and the bag forward split across PyTorch's OpenMP threads.
//!
//! PyTorch's OpenMP threads (libgomp's, by default) keep spinning for several
//! milliseconds after each of its ops. On a machine with as many cores as
//! threads, the crate's rayon threads then share their cores with spinning
//! threads, and a call made right after a torch op ran at the speed of one
//! thread (minilm's bag sum: 210-220 µs in the 7 ms after a torch op, 90 µs
//! later, on the project's 2-vCPU machine). Where the process has libgomp
//! loaded (PyTorch loads it) and its team has two threads or more, the
//! lookup and the bag forward cut their rows or bags into one part per
//! thread and run each part as a one-thread kernel call on that team
//! instead: the threads are the ones already spinning, and a part's rows
//! (a bag's sum) are the same bits whichever thread computes them. Every id
//! is checked before any part starts, so a bad id still writes nothing.
//! `EMBEDDING_KERNELS_OPENMP=0`, set before the first call, keeps every call
//! on the crate's rayon pool.

use embedding_kernels::EmbeddingError;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, OnceLock};

/// Calls with less output than this stay on the rayon path, which keeps a
/// small call on its calling thread.
const MIN_BYTES: usize = 256 << 10;

/// `GOMP_parallel(fn, data, num_threads, flags)`: runs `fn(data)` on a team
/// of `num_threads` threads (0: the default count), the calling thread one
/// of them, and returns when every one has.
type Parallel = unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, u32, u32);

/// `omp_get_thread_num`, `omp_get_num_threads`, `omp_get_max_threads`.
type Count = unsafe extern "C" fn() -> i32;

/// The entry points of the libgomp loaded in this process.
struct Gomp {
    parallel: Parallel,
    thread_num: Count,
    num_threads: Count,
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
        let count = |p: *mut c_void| core::mem::transmute::<*mut c_void, Count>(p);
        Gomp {
            parallel: core::mem::transmute::<*mut c_void, Parallel>(symbol(c"GOMP_parallel")?),
            thread_num: count(symbol(c"omp_get_thread_num")?),
            num_threads: count(symbol(c"omp_get_num_threads")?),
            max_threads: count(symbol(c"omp_get_max_threads")?),
        }
    };
    Some(GOMP.get_or_init(|| gomp))
}

/// libgomp's team for a call writing `bytes` of output, where this path
/// applies: a large enough call, libgomp loaded, two threads or more.
pub(crate) fn team(bytes: usize) -> Option<Team> {
    if bytes < MIN_BYTES || disabled() {
        return None;
    }
    let gomp = find()?;
    // SAFETY: libgomp's `omp_get_max_threads`, no arguments.
    let threads = unsafe { (gomp.max_threads)() };
    let threads = usize::try_from(threads).ok().filter(|&t| t >= 2)?;
    Some(Team { gomp, threads })
}

/// Whether calls of `bytes` of output would run on libgomp's team now, and
/// on how many threads (0: on the rayon pool); for tests and benchmarks.
#[pyfunction]
#[pyo3(signature = (nbytes=MIN_BYTES))]
pub(crate) fn openmp_threads(nbytes: usize) -> usize {
    team(nbytes).map_or(0, |t| t.threads)
}

/// The rows `start..end` of part `part` of `count` items cut into `parts`.
pub(crate) fn part(count: usize, part: usize, parts: usize) -> core::ops::Range<usize> {
    (count * part / parts)..(count * (part + 1) / parts)
}

/// What the team's threads share during one [`Team::run`].
struct Shared<'a, T> {
    gomp: &'static Gomp,
    parts: &'a [Mutex<Option<T>>],
    work: &'a (dyn Fn(T) -> Result<(), EmbeddingError> + Sync),
    /// The first error of a part, or a panic's note.
    failed: Mutex<Option<Result<EmbeddingError, ()>>>,
}

/// Each thread of the team: the parts `t`, `t + n`, `t + 2n`… (`t` its
/// number, `n` the team's size, which may be less than asked for).
extern "C" fn each_thread<T>(data: *mut c_void) {
    // SAFETY: `data` is the `&Shared<T>` that `Team::run` passed to
    // `GOMP_parallel`, which returns only after every thread has run this.
    let shared = unsafe { &*data.cast::<Shared<'_, T>>() };
    // SAFETY: libgomp's own calls, inside its parallel region.
    let (t, n) = unsafe { ((shared.gomp.thread_num)(), (shared.gomp.num_threads)()) };
    let (t, n) = (
        usize::try_from(t).unwrap_or(0),
        usize::try_from(n).unwrap_or(1).max(1),
    );
    for slot in shared.parts.iter().skip(t).step_by(n) {
        let taken = slot.lock().map(|mut p| p.take()).unwrap_or(None);
        let Some(part) = taken else { continue };
        // A panic must not unwind into libgomp's C frames.
        let outcome = catch_unwind(AssertUnwindSafe(|| (shared.work)(part)));
        let failure = match outcome {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => Ok(e),
            Err(_) => Err(()),
        };
        if let Ok(mut first) = shared.failed.lock() {
            first.get_or_insert(failure);
        }
    }
}

impl Team {
    /// How many parts a call is cut into: one a thread.
    pub(crate) fn threads(self) -> usize {
        self.threads
    }

    /// Runs `work` on every one of `parts` on the team, with the GIL
    /// released; the first part's error, if any, as the Python exception.
    pub(crate) fn run<T: Send>(
        self,
        py: Python<'_>,
        parts: Vec<T>,
        work: &(dyn Fn(T) -> Result<(), EmbeddingError> + Sync),
    ) -> PyResult<()> {
        let parts: Vec<Mutex<Option<T>>> = parts.into_iter().map(|p| Mutex::new(Some(p))).collect();
        let threads = u32::try_from(self.threads.min(parts.len())).unwrap_or(u32::MAX);
        let shared = Shared {
            gomp: self.gomp,
            parts: &parts,
            work,
            failed: Mutex::new(None),
        };
        py.detach(|| {
            // SAFETY: `GOMP_parallel` runs `each_thread::<T>` on up to
            // `threads` threads with `&shared`, and returns only when all of
            // them are done, so `shared` outlives every use. `each_thread`
            // takes each part out of its mutex once, catches any panic, and
            // reads `shared` only through shared references.
            unsafe {
                (self.gomp.parallel)(
                    each_thread::<T>,
                    core::ptr::from_ref(&shared).cast_mut().cast(),
                    threads,
                    0,
                )
            }
        });
        match shared.failed.into_inner().unwrap_or(Some(Err(()))) {
            None => Ok(()),
            Some(Ok(e)) => Err(crate::convert::error(e)),
            Some(Err(())) => Err(PyRuntimeError::new_err(
                "a kernel task panicked on an OpenMP thread",
            )),
        }
    }
}
