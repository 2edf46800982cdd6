//! How a call may use threads: [`Parallelism`], a value the caller passes.

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
    /// pay for the hand-off (each kernel's threshold is in
    /// `kernels/tuning.rs`); otherwise run on the calling thread. What the
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
        wanted && rayon::current_num_threads() > 1
    }
}
