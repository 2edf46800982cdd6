//! Running the kernels' tasks on threads other than rayon's.
//!
//! A kernel that splits a call cuts it into tasks and, by default, hands
//! them to the rayon pool it was called from. A program whose threads belong
//! to another runtime (PyTorch's OpenMP team, an engine's job system) can run
//! those tasks there instead: implement [`Executor`] for it and make the
//! calls inside [`with_executor`]. The tasks are cut the same way whatever
//! runs them, so the results are the same bits.
//!
//! Nothing here trusts the executor for soundness: every task is handed out
//! through a slot it is taken from once, a task the executor never ran is
//! run on the calling thread when it returns, and a panicking task's panic
//! is carried back to the caller instead of unwinding through the
//! executor's threads (which may be C frames).

use std::any::Any;
use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::{Arc, Mutex, PoisonError};

/// A pool of threads the kernels can run a call's tasks on, in place of the
/// current rayon pool ([`with_executor`]).
///
/// ```
/// use embedding_kernels::{gather_with, with_executor, Executor, Parallelism};
/// use std::sync::Arc;
///
/// /// Runs each task on a scoped thread of its own: a toy, to show the shape.
/// struct ThreadEach;
///
/// impl Executor for ThreadEach {
///     fn threads(&self) -> usize {
///         4
///     }
///     fn run(&self, count: usize, task: &(dyn Fn(usize) + Sync)) {
///         std::thread::scope(|s| {
///             for k in 0..count {
///                 s.spawn(move || task(k));
///             }
///         });
///     }
/// }
///
/// let (dim, weight) = (4, vec![1.0f32; 40]);
/// let ids = vec![3i64; 1 << 16];
/// let mut out = vec![0.0; ids.len() * dim];
/// with_executor(Arc::new(ThreadEach), || {
///     gather_with(Parallelism::Rayon, &weight, dim, &ids, &mut out)
/// })?;
/// assert!(out.iter().all(|&x| x == 1.0));
/// # Ok::<(), embedding_kernels::EmbeddingError>(())
/// ```
pub trait Executor: Send + Sync {
    /// How many threads run the tasks, the calling thread included: the
    /// kernels size their tasks by it, and with 1 or less run every call on
    /// the calling thread.
    fn threads(&self) -> usize;

    /// Runs `task(k)` for every `k` in `0..count`, each once, on any threads
    /// in any order, and returns once all of them have returned.
    ///
    /// The kernels stay correct if an implementation falls short (an index
    /// it skips runs on the calling thread afterwards, one it repeats or
    /// invents does nothing), but then they run slower.
    fn run(&self, count: usize, task: &(dyn Fn(usize) + Sync));
}

thread_local! {
    /// The executor [`with_executor`] installed on this thread, if any.
    static CURRENT: RefCell<Option<Arc<dyn Executor>>> = const { RefCell::new(None) };
}

/// Runs `f` with `executor` running the tasks of every kernel call that `f`
/// makes on this thread, in place of the current rayon pool.
///
/// Calls that [`Parallelism`](crate::Parallelism) keeps on one thread stay on
/// the calling thread; the others hand their tasks to
/// [`Executor::run`]. The executor applies to this thread only, for the
/// length of `f` (calls nest; the innermost wins), and is removed when `f`
/// returns or panics.
pub fn with_executor<R>(executor: Arc<dyn Executor>, f: impl FnOnce() -> R) -> R {
    /// Puts the executor that was there before back, however `f` ends.
    struct Restore(Option<Arc<dyn Executor>>);

    impl Drop for Restore {
        fn drop(&mut self) {
            let before = self.0.take();
            // Fails only while the thread's locals are being destroyed, when
            // nothing is left to restore.
            let _ = CURRENT.try_with(|c| *c.borrow_mut() = before);
        }
    }

    let before = CURRENT.with(|c| c.replace(Some(executor)));
    let _restore = Restore(before);
    f()
}

/// The executor installed on this thread, if any.
pub(crate) fn current() -> Option<Arc<dyn Executor>> {
    CURRENT.try_with(|c| c.borrow().clone()).ok().flatten()
}

/// How many threads a call made now may use: the installed executor's, or
/// the current rayon pool's.
pub(crate) fn threads() -> usize {
    match current() {
        Some(executor) => executor.threads().max(1),
        None => rayon::current_num_threads(),
    }
}

/// Runs `f(k, part)` once for each of `parts` (`k` its place in the list)
/// on `executor`, and returns when all have run; a panic in one comes back
/// here once the others are done.
pub(crate) fn run_parts<P: Send>(
    executor: &dyn Executor,
    parts: Vec<P>,
    f: &(dyn Fn(usize, P) + Sync),
) {
    let count = parts.len();
    if count == 0 {
        return;
    }
    // Each part is taken once, so each lock is uncontended; it is what hands
    // a part to another thread in safe code.
    let slots: Vec<Mutex<Option<P>>> = parts.into_iter().map(|p| Mutex::new(Some(p))).collect();
    let panicked: Mutex<Option<Box<dyn Any + Send>>> = Mutex::new(None);
    let take = |k: usize| {
        slots
            .get(k)?
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    };
    let one = |k: usize| {
        let Some(part) = take(k) else { return };
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(k, part))) {
            panicked
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert(payload);
        }
    };
    if count == 1 || executor.threads() < 2 {
        (0..count).for_each(one);
    } else {
        executor.run(count, &one);
        // Whatever the executor skipped.
        (0..count).for_each(one);
    }
    let payload = panicked
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(payload) = payload {
        resume_unwind(payload);
    }
}

/// [`run_parts`] on the installed executor, or else on the current rayon
/// pool; `f` is handed on as a `dyn Fn` (see `parallel::for_each_chunk`).
#[inline]
pub(crate) fn for_each_part<P, F>(parts: Vec<P>, f: F)
where
    P: Send,
    F: Fn(usize, P) + Sync,
{
    parts_dyn(parts, &f);
}

/// [`for_each_part`] with its task a `dyn Fn`.
fn parts_dyn<P: Send>(parts: Vec<P>, f: &(dyn Fn(usize, P) + Sync)) {
    use rayon::prelude::*;
    match current() {
        Some(executor) => run_parts(&*executor, parts, f),
        None => parts.into_par_iter().enumerate().for_each(|(k, p)| f(k, p)),
    }
}

/// `f(k, part)` for each of `parts` as [`for_each_part`] runs them, the
/// results in the parts' order.
pub(crate) fn map_parts<P, R, F>(parts: Vec<P>, f: F) -> Vec<R>
where
    P: Send,
    R: Send,
    F: Fn(usize, P) -> R + Sync,
{
    let mut results: Vec<Option<R>> = core::iter::repeat_with(|| None).take(parts.len()).collect();
    let pairs: Vec<(P, &mut Option<R>)> = parts.into_iter().zip(results.iter_mut()).collect();
    for_each_part(pairs, |k, (p, r)| *r = Some(f(k, p)));
    // `for_each_part` runs every part (or panics), so every result is there.
    results.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::{AtomicUsize, Ordering};

    /// Claims `threads` threads but runs the tasks on the calling thread,
    /// last first (the bookkeeping, not the threads, is under test here;
    /// `tests/executor.rs` runs the kernels on real threads); with `skip`,
    /// leaves every third index alone, runs index 0 twice and one past the
    /// end once.
    struct Backwards {
        threads: usize,
        skip: bool,
        runs: AtomicUsize,
    }

    impl Executor for Backwards {
        fn threads(&self) -> usize {
            self.threads
        }

        fn run(&self, count: usize, task: &(dyn Fn(usize) + Sync)) {
            self.runs.fetch_add(1, Ordering::Relaxed);
            for k in (0..count).rev().filter(|k| !(self.skip && k % 3 == 2)) {
                task(k);
            }
            if self.skip {
                task(0);
                task(count);
            }
        }
    }

    fn backwards(threads: usize, skip: bool) -> Arc<Backwards> {
        Arc::new(Backwards {
            threads,
            skip,
            runs: AtomicUsize::new(0),
        })
    }

    #[test]
    fn every_part_runs_once_whatever_the_executor_does() {
        for skip in [false, true] {
            for count in [0, 1, 2, 3, 7, 64, 100] {
                let executor = backwards(3, skip);
                let mut seen = vec![0u32; count];
                let parts: Vec<&mut u32> = seen.iter_mut().collect();
                with_executor(executor.clone(), || {
                    for_each_part(parts, |k, slot| *slot += 1 + k as u32)
                });
                let want: Vec<u32> = (0..count).map(|k| 1 + k as u32).collect();
                assert_eq!(seen, want, "{count} parts, skip {skip}");
                assert_eq!(
                    executor.runs.load(Ordering::Relaxed),
                    usize::from(count >= 2)
                );
            }
        }
    }

    #[test]
    fn results_keep_the_parts_order() {
        let executor = backwards(2, true);
        let got = with_executor(executor, || {
            map_parts((0..50).collect(), |k, p: u64| (k, p * p))
        });
        let want: Vec<(usize, u64)> = (0..50).map(|k| (k, (k * k) as u64)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn one_thread_runs_on_the_caller_and_nothing_is_installed_after() {
        let executor = backwards(1, false);
        let here = std::thread::current().id();
        let ids = with_executor(executor.clone(), || {
            assert_eq!(threads(), 1);
            map_parts(vec![(); 9], |_, ()| std::thread::current().id())
        });
        assert!(ids.iter().all(|&id| id == here));
        assert_eq!(executor.runs.load(Ordering::Relaxed), 0);
        assert!(current().is_none());
        assert_eq!(threads(), rayon::current_num_threads());
    }

    #[test]
    fn calls_nest_and_a_panic_reaches_the_caller_and_uninstalls() {
        let outer = backwards(2, false);
        let inner = backwards(5, false);
        with_executor(outer, || {
            assert_eq!(threads(), 2);
            with_executor(inner, || assert_eq!(threads(), 5));
            assert_eq!(threads(), 2);
        });
        let caught = catch_unwind(|| {
            with_executor(backwards(2, false), || {
                for_each_part((0..8).collect(), |_, p: i32| assert!(p != 5, "part five"))
            })
        });
        let payload = caught.expect_err("the task's panic comes back");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"part five"));
        assert!(current().is_none());
    }
}
