//! The hand-written kernels, one file or folder per operation; the crate
//! docs' table maps each operation to its function and file.
//!
//! Every public kernel is a free function over slices that checks its
//! arguments first (see [`error`](crate::error) for the order) and then runs
//! a body shared by its serial and its parallel driver, on the instruction
//! set [`Isa::detect`](crate::simd::Isa::detect) chose. Each comes in two
//! forms: the plain one uses [`Parallelism::Auto`](crate::Parallelism), the
//! `_with` one takes a [`Parallelism`](crate::Parallelism) first.

mod bag;
pub(crate) mod blocks;
mod gather;
mod grouped;
#[cfg(test)]
mod isa_tests;
mod lookup;
mod row_format;
mod scatter;
mod slot;
mod spare;
mod token_position;
pub(crate) mod tuning;
#[cfg(test)]
mod written;

pub use bag::{
    bag_backward, bag_backward_with, bag_forward, bag_forward_with, bag_max_backward,
    bag_max_backward_with, bag_sparse_backward, bag_sparse_backward_with, bag_sparse_step,
    bag_sparse_step_with, table_bag_forward, table_bag_forward_strided_with,
    table_bag_forward_with,
};
pub use gather::{gather, gather_scaled, gather_scaled_with, gather_with};
pub use grouped::{
    dense_backward, dense_backward_with, sparse_backward, sparse_backward_with, sparse_step,
    sparse_step_with,
};
pub use lookup::{Half, gather_half, gather_half_with, table_gather, table_gather_with};
pub(crate) use scatter::check as check_scatter;
pub use scatter::{scatter_add, scatter_add_scaled, scatter_add_scaled_with, scatter_add_with};
pub use token_position::{
    embed_positions, embed_positions_backward, embed_positions_backward_with, embed_positions_with,
};

pub(crate) use bag::{
    CallIds, bag_backward_valid, bag_step, check_backward_rows, check_forward_rows,
    check_forward_shapes, check_forward_unallocated, forward_fresh, forward_valid,
    forward_valid_fresh, fresh_outputs,
};
pub(crate) use gather::{check as check_gather, gather_fresh, gather_valid};
pub(crate) use grouped::{
    Groups, RowRule, Target, apply_sparse, dense_backward_valid, for_each_row, fused_update,
    sparse_groups,
};
pub(crate) use token_position::embed_positions_valid;
pub(crate) use tuning::PARALLEL_MIN_BYTES;
