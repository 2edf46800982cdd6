//! The hand-written kernels, one file per operation.
//!
//! Every public kernel is a free function over slices that checks its
//! arguments first (see [`error`](crate::error) for the order) and then runs a
//! body that is shared by its serial and its parallel driver. The `_with`
//! forms take a [`Parallelism`]; the plain forms use [`Parallelism::Auto`].

pub mod gather;
pub(crate) mod row;
pub mod scalar;
pub mod scatter;

/// How a kernel may use threads.
///
/// Parallelism is a value the caller passes, never a global setting: the
/// kernels run on whatever rayon pool the call is made from (wrap it in
/// `pool.install(..)` to choose one) and never build or configure a pool.
/// Whatever the choice, the results are the same bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Parallelism {
    /// Run on the calling thread only.
    Serial,
    /// Split across the current rayon pool whenever it has more than one
    /// thread, however small the call.
    Rayon,
    /// Split across the current rayon pool when the call is large enough to
    /// pay for the hand-off (2 MiB of output, measured); otherwise run on the
    /// calling thread. What the plain functions use.
    #[default]
    Auto,
}

impl Parallelism {
    /// Whether a call moving `bytes` should be split across threads.
    #[inline]
    pub(crate) fn splits(self, bytes: usize) -> bool {
        let wanted = match self {
            Parallelism::Serial => false,
            Parallelism::Rayon => true,
            Parallelism::Auto => bytes >= PARALLEL_MIN_BYTES,
        };
        wanted && rayon::current_num_threads() > 1
    }
}

/// Below this many bytes of output (or of output gradient) a call stays on
/// the calling thread. Waking a sleeping rayon pool from outside it costs
/// 20 to 40 µs on the development machine (the `threshold` group of
/// `benches/kernels.rs`), and one thread moves about 2 MiB through the
/// caches in that time, so below this the hand-off cannot pay.
pub(crate) const PARALLEL_MIN_BYTES: usize = 2 * 1024 * 1024;

/// The size of one parallel task's share of the output, in bytes: large
/// enough that scheduling is noise, small enough that two threads finish
/// close together.
pub(crate) const TASK_BYTES: usize = 16 * 1024;
