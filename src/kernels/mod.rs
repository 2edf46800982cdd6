//! The hand-written kernels, one file (or folder) per operation.
//!
//! | operation | functions | file |
//! | --- | --- | --- |
//! | lookup | [`gather`], [`gather_scaled`] | `gather.rs` |
//! | scatter-add | [`scatter_add`], [`scatter_add_scaled`] | `scatter.rs` |
//! | token + position lookup, and its backward | [`embed_positions`], [`embed_positions_backward`] | `positions.rs` |
//! | dense and sparse backward, fused updates | [`dense_backward`], [`sparse_backward`] | `grouped.rs` |
//! | bags: forward and backward | [`bag_forward`], [`bag_backward`], [`bag_sparse_backward`], [`bag_max_backward`] | `bag.rs` |
//!
//! Every public kernel is a free function over slices that checks its
//! arguments first (see [`error`](crate::error) for the order) and then runs
//! a body shared by its serial and its parallel driver. Each comes in two
//! forms: the plain one uses [`Parallelism::Auto`](crate::Parallelism), the
//! `_with` one takes a [`Parallelism`](crate::Parallelism) first.

mod avx;
mod bag;
mod gather;
mod grouped;
mod positions;
pub(crate) mod row;
mod scatter;
mod spare;

pub use bag::{
    bag_backward, bag_backward_with, bag_forward, bag_forward_with, bag_max_backward,
    bag_max_backward_with, bag_sparse_backward, bag_sparse_backward_with,
};
pub use gather::{gather, gather_scaled, gather_scaled_with, gather_with};
pub use grouped::{dense_backward, dense_backward_with, sparse_backward, sparse_backward_with};
pub use positions::{
    embed_positions, embed_positions_backward, embed_positions_backward_with, embed_positions_with,
};
pub(crate) use scatter::check as check_scatter;
pub use scatter::{scatter_add, scatter_add_scaled, scatter_add_scaled_with, scatter_add_with};

pub(crate) use bag::{bag_fused_update, check_backward_call, check_forward, forward_valid};
pub(crate) use gather::{check as check_gather, gather_valid};
pub(crate) use grouped::{apply_sparse, for_each_row, fused_update, Groups, Target};

/// Below this many bytes of output a gather under [`Parallelism::Auto`]
/// stays on the calling thread. Waking a sleeping rayon pool from outside
/// it costs 15 to 40 µs on the development machine, and in the `threshold`
/// group of `benches/kernels.rs` the split first wins at 2 MiB (48 vs 54 µs).
///
/// [`Parallelism::Auto`]: crate::Parallelism::Auto
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
