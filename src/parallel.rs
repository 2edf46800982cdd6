//! How a call may use threads: [`Parallelism`], a value the caller passes,
//! and the drivers that split a call's output into tasks by it.

use crate::executor;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use rayon::prelude::*;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// How a kernel may use threads.
///
/// Parallelism is a value the caller passes, never a global setting: the
/// kernels run on whatever rayon pool the call is made from (wrap it in
/// `pool.install(..)` to choose one), or on the caller's own threads inside
/// [`with_executor`](crate::with_executor), and never build or configure a
/// pool. Whatever the choice, the results are the same bits. "The pool"
/// below is the executor's threads when one is installed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Parallelism {
    /// Run on the calling thread only.
    Serial,
    /// Split across the current rayon pool whenever it has more than one
    /// thread, however small the call.
    Rayon,
    /// Split across the current rayon pool when the call is large enough to
    /// pay for the hand-off (each kernel's threshold is in
    /// `kernels/tuning.rs`); otherwise run on the calling thread, except
    /// that a gather, lookup or bag forward of 128 KiB or more made within
    /// 30 µs of the end of such a call (calls in a loop, on any thread) is
    /// shared between the calling thread and one pool thread. A shared call
    /// returns only once a pool thread has picked up its share (finding
    /// nothing left to do, if the caller was faster): a caller outside the
    /// pool that must not wait on it, say one holding a lock that the
    /// pool's threads may be waiting for, should pass `Serial`. What the
    /// plain (not `_with`) functions use.
    #[default]
    Auto,
}

impl Parallelism {
    /// Whether a call of `bytes` should be split across threads, when
    /// `Auto` splits from `auto_min_bytes` on.
    #[inline]
    pub(crate) fn splits(self, bytes: usize, auto_min_bytes: usize) -> bool {
        let wanted = match self {
            Parallelism::Serial => false,
            Parallelism::Rayon => true,
            Parallelism::Auto => bytes >= auto_min_bytes,
        };
        wanted && executor::threads() > 1
    }
}

/// How one call runs, as [`Parallelism::plan`] decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    how: How,
    /// Whether the call's end is noted for the next call's [`in_a_loop`]:
    /// `Auto` calls that could have used threads.
    noted: bool,
}

/// Who runs a call's tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum How {
    /// The whole call on the calling thread, as one task.
    Serial,
    /// The calling thread and one pool thread, taking tasks from the two
    /// ends of the list ([`share`]).
    Shared,
    /// Every task handed to the rayon pool.
    Pool,
}

impl Plan {
    /// Whether the call's tasks go to the rayon pool.
    pub(crate) fn is_pool(self) -> bool {
        self.how == How::Pool
    }

    /// Whether the call is shared between its caller and one pool thread.
    pub(crate) fn is_shared(self) -> bool {
        self.how == How::Shared
    }
}

impl Parallelism {
    /// How a call of `bytes` runs, when `Auto` hands calls of
    /// `auto_min_bytes` or more to the pool: [`plan_sized`](Self::plan_sized)
    /// with one size for both rules.
    pub(crate) fn plan(self, bytes: usize, auto_min_bytes: usize) -> Plan {
        self.plan_sized(bytes, bytes, auto_min_bytes)
    }

    /// How a call runs. `Auto` hands it to the pool from `auto_min_bytes`
    /// of `pool_bytes` on, or from [`SHARE_MAX_BYTES`] of `serial_bytes`
    /// (too long a call to share). Below that, a call of [`SHARE_MIN_BYTES`] or
    /// more of `serial_bytes` (a measure of its time on one thread) is
    /// shared between the caller and one pool thread when a call of that
    /// size or more ended less than [`AWAKE_NS`] ago, on any thread: calls
    /// in a loop. The first shared call of a loop wakes the pool (the call
    /// before it ran on its caller alone); from then on the pool thread is
    /// still spinning from the call before. Calls further apart run on the
    /// caller, since waking a sleeping pool costs more than such a call
    /// gains.
    pub(crate) fn plan_sized(
        self,
        pool_bytes: usize,
        serial_bytes: usize,
        auto_min_bytes: usize,
    ) -> Plan {
        let threads = executor::threads() > 1;
        let how = match self {
            _ if !threads => How::Serial,
            Parallelism::Serial => How::Serial,
            Parallelism::Rayon => How::Pool,
            Parallelism::Auto if pool_bytes >= auto_min_bytes => How::Pool,
            Parallelism::Auto if serial_bytes >= SHARE_MAX_BYTES => How::Pool,
            Parallelism::Auto if forced_share() => How::Shared,
            Parallelism::Auto if serial_bytes < SHARE_MIN_BYTES => How::Serial,
            Parallelism::Auto if in_a_loop(now_ns(), LAST_CALL_END.load(Ordering::Relaxed)) => {
                How::Shared
            }
            Parallelism::Auto => How::Serial,
        };
        let noted = threads
            && self == Parallelism::Auto
            && (how != How::Serial || serial_bytes >= SHARE_MIN_BYTES);
        Plan { how, noted }
    }
}

/// The smallest call (in the bytes its `Auto` rule counts) that `Auto`
/// shares with a pool thread: a task handed over takes the other thread
/// about as long to start as one thread takes to copy 128 KiB, so a smaller
/// call would be done before its helper began (docs/design.md, "Threads").
pub(crate) const SHARE_MIN_BYTES: usize = 128 << 10;

/// The longest call (in the bytes its `Auto` rule counts for one thread)
/// that `Auto` may share with a pool thread rather than hand to the pool,
/// whatever its pool size says: reached only by a bag forward over a table
/// under 2 MiB, whose pool size is the table's. From a thread outside the
/// pool, with two CPUs, shared bag sums over a small table took longer than
/// one thread from 8 MiB of work on: their ids, checked in the pool, leave
/// both pool threads awake to contend with the two working ones for the
/// two CPUs. Below that (ids checked on the caller) the shared call was
/// faster than handing the call to the pool; from a thread in the pool the
/// two ways are level (docs/design.md, "Threads").
pub(crate) const SHARE_MAX_BYTES: usize = 8 << 20;

/// How soon after the end of a call the next one counts as the same loop's
/// (and the pool thread that shared the last one as still awake): an idle
/// rayon worker yields its CPU 33 times before it sleeps, and this bound
/// stays below the shortest time that took, so a call counted as in a loop
/// finds its helper awake; past it a shared call pays the wake-up and loses
/// to one thread (docs/design.md, "Threads").
pub(crate) const AWAKE_NS: u64 = 30_000;

/// When the last call that used threads, or could have, ended: nanoseconds
/// since [`epoch`], 0 for never.
static LAST_CALL_END: AtomicU64 = AtomicU64::new(0);

/// The process's reference instant for [`LAST_CALL_END`].
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds since [`epoch`], at least 1 (0 means never).
fn now_ns() -> u64 {
    u64::try_from(epoch().elapsed().as_nanos())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Whether a call made at `now` follows one that ended at `last_end` (0
/// for never) within [`AWAKE_NS`].
fn in_a_loop(now: u64, last_end: u64) -> bool {
    last_end != 0 && now.saturating_sub(last_end) < AWAKE_NS
}

/// Runs `f(k, chunk)` over `out` as `plan` says: on the whole of it as
/// task 0 ([`How::Serial`]), or on each `chunk`-long piece `k`.
///
/// `f` is handed on as a `dyn Fn`, one indirect call a piece: the drivers
/// below (rayon's, the shared split, an executor's) are then compiled once
/// for each element type, not again for every kernel's closure.
#[inline]
pub(crate) fn for_each_chunk<T, F>(plan: Plan, out: &mut [T], chunk: usize, f: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync,
{
    chunks_dyn(plan, out, chunk, &f);
}

/// [`for_each_chunk`] with its task a `dyn Fn`.
fn chunks_dyn<T: Send>(
    plan: Plan,
    out: &mut [T],
    chunk: usize,
    f: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    let chunk = chunk.max(1);
    match (plan.how, executor::current()) {
        (How::Serial, _) => f(0, out),
        (_, Some(executor)) => executor::run_parts(&*executor, out.chunks_mut(chunk).collect(), f),
        (How::Shared, None) => share(out.chunks_mut(chunk).collect(), f),
        (How::Pool, None) => out
            .par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(k, c)| f(k, c)),
    }
    note_end(plan);
}

/// [`for_each_chunk`] over two outputs cut alike: piece `k` of `a` (of
/// `chunk_a` values) goes with piece `k` of `b` (of `chunk_b`).
#[inline]
pub(crate) fn for_each_chunk_pair<A, B, F>(
    plan: Plan,
    a: (&mut [A], usize),
    b: (&mut [B], usize),
    f: F,
) where
    A: Send,
    B: Send,
    F: Fn(usize, &mut [A], &mut [B]) + Sync,
{
    pairs_dyn(plan, a, b, &f);
}

/// The task of [`for_each_chunk_pair`]: piece `k` of each output.
type PairTask<'f, A, B> = &'f (dyn Fn(usize, &mut [A], &mut [B]) + Sync);

/// [`for_each_chunk_pair`] with its task a `dyn Fn`.
fn pairs_dyn<A: Send, B: Send>(
    plan: Plan,
    (a, chunk_a): (&mut [A], usize),
    (b, chunk_b): (&mut [B], usize),
    f: PairTask<'_, A, B>,
) {
    let (chunk_a, chunk_b) = (chunk_a.max(1), chunk_b.max(1));
    fn pairs<'a, A, B>(
        a: &'a mut [A],
        b: &'a mut [B],
        chunks: (usize, usize),
    ) -> Vec<(&'a mut [A], &'a mut [B])> {
        a.chunks_mut(chunks.0).zip(b.chunks_mut(chunks.1)).collect()
    }
    match (plan.how, executor::current()) {
        (How::Serial, _) => f(0, a, b),
        (_, Some(executor)) => {
            let f = |k, (a, b): (&mut [A], &mut [B])| f(k, a, b);
            executor::run_parts(&*executor, pairs(a, b, (chunk_a, chunk_b)), &f);
        }
        (How::Shared, None) => {
            let f = |k, (a, b): (&mut [A], &mut [B])| f(k, a, b);
            share(pairs(a, b, (chunk_a, chunk_b)), &f);
        }
        (How::Pool, None) => a
            .par_chunks_mut(chunk_a)
            .zip(b.par_chunks_mut(chunk_b))
            .enumerate()
            .for_each(|(k, (a, b))| f(k, a, b)),
    }
    note_end(plan);
}

/// Runs `f` as one job of the current rayon pool when `inside`, the pool
/// has two threads or more, and the calling thread is none of the pool's:
/// a call that hands the pool two pieces of work one after the other (the
/// split id check, then the kernel) then puts its caller to sleep and wakes
/// it once, not twice. (The bag layers' fresh forwards, whose tasks check
/// their ids, pass the same condition: a call with that many ids goes to
/// the pool anyway.) Otherwise, or under an [`Executor`](crate::Executor),
/// runs `f` here.
pub(crate) fn in_pool<R: Send>(inside: bool, f: impl FnOnce() -> R + Send) -> R {
    if inside
        && rayon::current_thread_index().is_none()
        && rayon::current_num_threads() > 1
        && executor::current().is_none()
    {
        rayon::scope(|_| f())
    } else {
        f()
    }
}

/// Records the end of a call the plan notes, for the next call's
/// [`in_a_loop`].
fn note_end(plan: Plan) {
    if plan.noted {
        LAST_CALL_END.store(now_ns(), Ordering::Relaxed);
    }
}

#[cfg(test)]
thread_local! {
    /// Tests set this to make `Auto` share every call it would otherwise
    /// keep on this thread, whatever its size and the clock.
    static FORCE_SHARE: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

/// Runs `f` with every `Auto` call on this thread below the pool threshold
/// shared (when the pool has two threads or more), however small.
#[cfg(test)]
pub(crate) fn with_forced_share<R>(f: impl FnOnce() -> R) -> R {
    FORCE_SHARE.with(|c| c.set(true));
    let r = f();
    FORCE_SHARE.with(|c| c.set(false));
    r
}

#[cfg(test)]
fn forced_share() -> bool {
    FORCE_SHARE.with(core::cell::Cell::get)
}

#[cfg(not(test))]
#[inline(always)]
fn forced_share() -> bool {
    false
}

/// Runs `f(k, task)` on every task, the calling thread taking them from
/// the front of the list and one job spawned on the current rayon pool
/// from the back, until the two meet.
///
/// The calling thread starts at once, and the pool thread joins when it
/// picks the job up: with the pool awake that is soon, and each side then
/// keeps the same half of the output from call to call (the same lines stay
/// in the same core's cache), which was faster than tasks dealt from one
/// counter (docs/design.md, "Threads"). With the pool asleep the caller
/// does most of the tasks itself and then waits for the job to run.
fn share<P: Send>(tasks: Vec<P>, f: &(dyn Fn(usize, P) + Sync)) {
    let count = tasks.len();
    if count < 2 {
        tasks.into_iter().enumerate().for_each(|(k, t)| f(k, t));
        return;
    }
    if count as u64 >= FRONT_MASK {
        // Not reached from `Auto` (its shared calls are under 2 MiB), but a
        // list too long for `Ends` still runs every task.
        tasks.into_par_iter().enumerate().for_each(|(k, t)| f(k, t));
        return;
    }
    // Each task is claimed once (by `Ends::claim`), so each lock is taken
    // once and never waited on; it is what hands a task to the other
    // thread in safe code.
    let slots: Vec<Mutex<Option<P>>> = tasks.into_iter().map(|t| Mutex::new(Some(t))).collect();
    let ends = Ends::new(count);
    let helper_done = AtomicBool::new(false);
    let run = |from_front: bool| {
        while let Some(k) = ends.claim(from_front) {
            // `Ends` hands out each of `0..count` once, so the slot exists
            // and still holds its task. The callers rely on every task
            // running (`gather_fresh` marks its output written), so a
            // missing one is a bug to stop at, never a task to skip.
            let task = slots[k]
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
                .expect("each task is claimed once");
            f(k, task);
        }
    };
    rayon::in_place_scope(|scope| {
        scope.spawn(|_| {
            run(false);
            helper_done.store(true, Ordering::Release);
        });
        run(true);
        // The pool thread, if it started, has one task left at most: wait
        // for it here rather than sleep in the scope's end, whose wake-up
        // would cost more than the task. If it has not started, the scope
        // waits for it (it will find nothing to do).
        if ends.helper_started() {
            let start = Instant::now();
            while !helper_done.load(Ordering::Acquire) && start.elapsed() < HELPER_SPIN {
                core::hint::spin_loop();
            }
        }
    });
}

/// How long the caller spins for the pool thread's last task before it
/// leaves the wait to rayon.
const HELPER_SPIN: Duration = Duration::from_micros(50);

/// The two ends of a task list, in one atomic: the next task from the front
/// in the low 31 bits, whether the back has claimed anything in bit 31, and
/// one past the next task from the back in the high 32 bits. Lists of
/// [`FRONT_MASK`] tasks or more (2^31 - 1) are run by rayon instead
/// (`share`).
struct Ends(AtomicU64);

const BACK_STARTED: u64 = 1 << 31;
const FRONT_MASK: u64 = BACK_STARTED - 1;

impl Ends {
    /// `count` is below [`FRONT_MASK`] (`share` checks).
    fn new(count: usize) -> Ends {
        Ends(AtomicU64::new((count as u64) << 32))
    }

    /// The next task from the front or the back, or `None` once the two
    /// ends meet.
    fn claim(&self, from_front: bool) -> Option<usize> {
        let mut cur = self.0.load(Ordering::Relaxed);
        loop {
            let (front, back) = (cur & FRONT_MASK, cur >> 32);
            if front >= back {
                return None;
            }
            let (next, k) = if from_front {
                (cur + 1, front)
            } else {
                ((cur - (1 << 32)) | BACK_STARTED, back - 1)
            };
            match self
                .0
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return usize::try_from(k).ok(),
                Err(seen) => cur = seen,
            }
        }
    }

    /// Whether the back (the pool thread) has claimed a task.
    fn helper_started(&self) -> bool {
        self.0.load(Ordering::Relaxed) & BACK_STARTED != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::{PackedTable, RowWise};
    use crate::{Bags, Mode, Pooling};

    fn two_threads() -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("a pool of two threads")
    }

    #[test]
    fn the_two_ends_hand_out_each_task_once() {
        for count in (0..70).chain([1000, 4099]) {
            for _ in 0..20 {
                let ends = Ends::new(count);
                let (front, back) = std::thread::scope(|s| {
                    let back =
                        s.spawn(|| core::iter::from_fn(|| ends.claim(false)).collect::<Vec<_>>());
                    let front: Vec<_> = core::iter::from_fn(|| ends.claim(true)).collect();
                    (front, back.join().expect("the back's thread"))
                });
                // The front counts up from 0, the back down from the end,
                // and together they are every task once.
                assert!(front.iter().enumerate().all(|(i, &k)| k == i), "{count}");
                assert!(
                    back.iter().enumerate().all(|(i, &k)| k == count - 1 - i),
                    "{count}"
                );
                assert_eq!(front.len() + back.len(), count);
                assert_eq!(ends.helper_started(), !back.is_empty());
                assert_eq!(ends.claim(true), None);
                assert_eq!(ends.claim(false), None);
            }
        }
    }

    #[test]
    fn share_runs_every_task_once_from_inside_and_outside_a_pool() {
        let pool = two_threads();
        for count in [0, 1, 2, 3, 17, 64, 513] {
            for round in 0..50 {
                let mut runs = vec![0u32; count];
                let task = |k: usize, slot: &mut u32| *slot += 1 + k as u32;
                let tasks: Vec<&mut u32> = runs.iter_mut().collect();
                if round % 2 == 0 {
                    share(tasks, &task);
                } else {
                    pool.install(|| share(tasks, &task));
                }
                let want: Vec<u32> = (0..count).map(|k| 1 + k as u32).collect();
                assert_eq!(runs, want, "{count} tasks, round {round}");
            }
        }
    }

    #[test]
    fn plans_follow_the_rules() {
        let pool = two_threads();
        let min = 2 << 20;
        pool.install(|| {
            let how = |par: Parallelism, bytes| par.plan(bytes, min).how;
            assert_eq!(how(Parallelism::Serial, usize::MAX), How::Serial);
            assert_eq!(how(Parallelism::Rayon, 1), How::Pool);
            assert_eq!(how(Parallelism::Auto, min), How::Pool);
            // Whatever the clock says, a call too small to share stays.
            assert_eq!(how(Parallelism::Auto, SHARE_MIN_BYTES - 1), How::Serial);
            assert!(!Parallelism::Auto.plan(SHARE_MIN_BYTES - 1, min).noted);
            assert!(Parallelism::Auto.plan(SHARE_MIN_BYTES, min).noted);
            assert!(!Parallelism::Serial.plan(SHARE_MIN_BYTES, min).noted);
            // A bag's pool size and serial size are separate.
            let bag = Parallelism::Auto.plan_sized(SHARE_MIN_BYTES, 3 * min, min);
            assert_ne!(bag.how, How::Pool);
            with_forced_share(|| {
                assert_eq!(how(Parallelism::Auto, 1), How::Shared);
                assert_eq!(how(Parallelism::Auto, min), How::Pool);
                assert_eq!(how(Parallelism::Serial, 1), How::Serial);
            });
            assert_eq!(how(Parallelism::Auto, 1), How::Serial);
        });
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build();
        let one = one.expect("a pool of one thread");
        one.install(|| {
            with_forced_share(|| {
                assert_eq!(Parallelism::Auto.plan(1, min).how, How::Serial);
                assert_eq!(Parallelism::Rayon.plan(usize::MAX, min).how, How::Serial);
            })
        });
    }

    /// Under `Auto`, a call of [`SHARE_MAX_BYTES`] of work or more goes to
    /// the pool even when its pool size (a bag's table, held by the caches)
    /// is small; a call of less work with that pool size stays out of it
    /// (on its caller, or shared with one pool thread); `Serial` never goes.
    #[test]
    fn much_work_goes_to_the_pool_whatever_its_pool_size() {
        let min = 2 << 20;
        let small_table = 1 << 20;
        two_threads().install(|| {
            let auto = |work| Parallelism::Auto.plan_sized(small_table, work, min);
            assert!(auto(SHARE_MAX_BYTES).is_pool());
            assert!(auto(4 * SHARE_MAX_BYTES).is_pool());
            assert!(!auto(SHARE_MAX_BYTES - 4).is_pool());
            let serial = Parallelism::Serial.plan_sized(small_table, SHARE_MAX_BYTES, min);
            assert!(!serial.is_pool());
        });
    }

    #[test]
    fn a_call_within_the_window_counts_as_the_same_loop() {
        let end = 5_000_000;
        assert!(!in_a_loop(end, 0), "no call yet");
        assert!(in_a_loop(end, end));
        assert!(in_a_loop(end + AWAKE_NS - 1, end));
        assert!(!in_a_loop(end + AWAKE_NS, end));
        assert!(!in_a_loop(end + 10 * AWAKE_NS, end));
        // Another thread's call may end after this one began.
        assert!(in_a_loop(end, end + 1));
    }

    #[test]
    fn large_calls_from_outside_the_pool_give_the_serial_bits() {
        // 1 MiB of ids or more: the check splits and the call runs as one
        // job of the global pool (when it has two threads).
        let (dim, n) = (3, 150_000);
        let (table, mut ids) = case(1000, dim, n, 11);
        assert!(
            crate::index::check_splits(Parallelism::Auto, &ids) || rayon::current_num_threads() < 2
        );
        let mut want = vec![f32::NAN; n * dim];
        crate::gather_with(Parallelism::Serial, &table, dim, &ids, &mut want).expect("gather");
        let mut got = vec![f32::NAN; n * dim];
        crate::gather_with(Parallelism::Auto, &table, dim, &ids, &mut got).expect("gather");
        assert_eq!(bits(&got), bits(&want));
        let bags = Bags::fixed(n / 10, 10).expect("bags");
        let pooling = Pooling::default();
        let bag = |par, out: &mut [f32]| {
            crate::bag_forward_with(par, &table, dim, &ids, &bags, &pooling, out, &mut [])
        };
        let (mut want, mut got) = (vec![f32::NAN; n / 10 * dim], vec![f32::NAN; n / 10 * dim]);
        bag(Parallelism::Serial, &mut want).expect("bag");
        bag(Parallelism::Auto, &mut got).expect("bag");
        assert_eq!(bits(&got), bits(&want));
        // A bad id in the last task: the same error, and nothing written.
        ids[n - 2] = 1000;
        let mut out = vec![f32::NAN; n * dim];
        let err = crate::gather_with(Parallelism::Auto, &table, dim, &ids, &mut out);
        assert_eq!(
            err,
            Err(crate::EmbeddingError::IndexOutOfRange {
                position: n - 2,
                index: 1000,
                num_embeddings: 1000
            })
        );
        assert!(out.iter().all(|x| x.is_nan()));
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// A table of `rows × dim` values and `n` ids into it, from a seed.
    fn case(rows: usize, dim: usize, n: usize, seed: u64) -> (Vec<f32>, Vec<i64>) {
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let table = (0..rows * dim)
            .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        let ids = (0..n).map(|_| (next() % rows as u64) as i64).collect();
        (table, ids)
    }

    #[test]
    fn shared_calls_give_the_serial_bits() {
        let pool = two_threads();
        for (dim, n) in [(1, 5), (16, 4099), (64, 1000), (64, 4096), (100, 333)] {
            let (table, ids) = case(97, dim, n, (dim * n) as u64);
            let what = format!("dim {dim}, {n} ids");
            // gather, through a caller's buffer and a format's lookup
            let mut want = vec![f32::NAN; n * dim];
            crate::gather_with(Parallelism::Serial, &table, dim, &ids, &mut want).expect(&what);
            let packed = RowWise::Int8.prepack(&table, dim).expect(&what);
            let packed = PackedTable::new(RowWise::Int8, dim, &packed).expect(&what);
            let mut want_int8 = vec![f32::NAN; n * dim];
            crate::table_gather_with(Parallelism::Serial, packed.into(), &ids, &mut want_int8)
                .expect(&what);
            // bags of 7 (the last shorter), each mode
            let bags = Bags::from_offsets(&(0..n).step_by(7).collect::<Vec<_>>(), n, false);
            let bags = bags.expect(&what);
            let size = bags.len() * dim;
            let bag = |par, mode, out: &mut [f32], at: &mut [i64]| {
                let pooling = Pooling {
                    mode,
                    ..Pooling::default()
                };
                crate::bag_forward_with(par, &table, dim, &ids, &bags, &pooling, out, at)
                    .expect(&what);
            };
            let mut want_bags = Vec::new();
            for mode in [Mode::Sum, Mode::Mean, Mode::Max] {
                let (mut out, mut at) = (vec![f32::NAN; size], vec![-2; size]);
                let at_len = if mode == Mode::Max { size } else { 0 };
                bag(Parallelism::Serial, mode, &mut out, &mut at[..at_len]);
                want_bags.push((mode, out, at));
            }
            // From the test's own thread, outside every pool, the call
            // shares with the global pool, which must have two threads.
            let outside_too = rayon::current_num_threads() > 1;
            if !outside_too {
                eprintln!("the global pool has one thread: shared calls tested inside a pool only");
            }
            for outside in [true, false] {
                if outside && !outside_too {
                    continue;
                }
                let run = || {
                    with_forced_share(|| {
                        let mut out = vec![f32::NAN; n * dim];
                        crate::gather_with(Parallelism::Auto, &table, dim, &ids, &mut out)
                            .expect(&what);
                        assert_eq!(bits(&out), bits(&want), "gather, {what}");
                        let mut out = vec![f32::NAN; n * dim];
                        crate::table_gather_with(Parallelism::Auto, packed.into(), &ids, &mut out)
                            .expect(&what);
                        assert_eq!(bits(&out), bits(&want_int8), "int8 lookup, {what}");
                        for (mode, want, want_at) in &want_bags {
                            let (mut out, mut at) = (vec![f32::NAN; size], vec![-2; size]);
                            let at_len = if *mode == Mode::Max { size } else { 0 };
                            bag(Parallelism::Auto, *mode, &mut out, &mut at[..at_len]);
                            assert_eq!(bits(&out), bits(want), "{mode:?} bags, {what}");
                            assert_eq!(&at, want_at, "{mode:?} bags, {what}");
                        }
                    })
                };
                if outside {
                    run();
                } else {
                    pool.install(run);
                }
            }
        }
    }
}
