//! The hand-written kernels, one file per operation.
//!
//! Every public kernel is a free function over slices that checks its
//! arguments first (see [`error`](crate::error) for the order) and then runs a
//! body that is shared by its serial and its parallel driver. The `_with`
//! forms take a [`Parallelism`]; the plain forms use [`Parallelism::Auto`].

mod avx;
pub mod bag;
pub mod gather;
pub mod grouped;
pub mod positions;
pub(crate) mod row;
pub mod scalar;
pub mod scatter;
mod spare;

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
    /// pay for the hand-off (measured: 2 MiB of output for the gathers, 8 MiB
    /// of output gradient for `scatter_add`); otherwise run on the calling
    /// thread. What the plain functions use.
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
        wanted && rayon::current_num_threads() > 1
    }
}

/// Below this many bytes of output a gather under [`Parallelism::Auto`]
/// stays on the calling thread. Waking a sleeping rayon pool from outside
/// it costs 15 to 40 µs on the development machine, and in the `threshold`
/// group of `benches/kernels.rs` the split first wins at 2 MiB (48 vs 54 µs).
pub(crate) const PARALLEL_MIN_BYTES: usize = 2 * 1024 * 1024;

/// The same for `scatter_add`, in bytes of output gradient. Its column
/// blocks make every thread read every id, which only pays once the table
/// rows come from DRAM: in the `threshold` group (a cache-resident table)
/// one thread still wins at 4 MiB, while the report's minilm (12 MiB) and
/// larger workloads gain from the split.
pub(crate) const SCATTER_PARALLEL_MIN_BYTES: usize = 8 * 1024 * 1024;

/// How far ahead the kernels prefetch random rows, in bytes of rows: enough
/// misses in flight to cover a DRAM round trip, few enough that the line
/// buffers do not overflow. On recsys (512-byte rows), 32 rows ahead ran
/// the bag sum in 2.3 ms against 3.2 ms at 8 rows (two threads).
const PREFETCH_BYTES: usize = 16 * 1024;

/// The prefetch distance, in rows, for rows of `row_floats` `f32`s: between
/// 4 and 32 rows, about [`PREFETCH_BYTES`] ahead. Saturates, so even an
/// absurd width (a call with nothing to do) gives a distance.
#[inline]
pub(crate) fn prefetch_ahead(row_floats: usize) -> usize {
    let row_bytes = row_floats.saturating_mul(core::mem::size_of::<f32>());
    (PREFETCH_BYTES / row_bytes.max(1)).clamp(4, 32)
}

/// The size of one parallel task's share of the output, in bytes: large
/// enough that scheduling is noise, small enough that two threads finish
/// close together.
pub(crate) const TASK_BYTES: usize = 16 * 1024;
