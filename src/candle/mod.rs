//! The crate's kernels as a candle backend (feature `candle`): [`Embedding`]
//! is `candle_nn::Embedding` with this crate's lookup and backward, and
//! [`embedding`] builds it the way `candle_nn::embedding` does, so a model
//! switches with one line and loads its checkpoint unchanged.
//! [`EmbeddingBag`] (built by [`embedding_bag`]) brings the bags: sum, mean
//! and max over offsets, with per-sample weights and `padding_idx`, on `f32`
//! tables.
//!
//! ```text
//! forward(ids):   weight, ids made contiguous (a no-op when they are)
//!                 out = Lookup.cpu_fwd(weight, ids)        gather, [*ids.shape, dim]
//! backward(g):    grad_weight = DenseGrad.cpu_fwd(g, ids)  dense_backward, [rows, dim]
//!                 ids get no gradient
//! ```
//!
//! 1. **Custom ops** (`embedding.rs`). The lookup is a [`CustomOp2`](candle_core::CustomOp2) over `(weight, ids)`;
//!    candle records it in the graph like its own ops, and calls its `bwd`
//!    from `loss.backward()`. The backward is a second custom op over
//!    `(grad_out, ids)`, run without a graph of its own.
//! 2. **Storage read in place.** `cpu_fwd` borrows the slice of candle's
//!    storage that a contiguous layout spans; nothing is copied on the way
//!    in. A strided weight (a transposed view, say) is made contiguous by
//!    candle's own `contiguous()` before the op, which candle differentiates,
//!    so its gradient still reaches the view's source.
//! 3. **Dtypes.** An `f32` table goes to [`gather_with`](crate::gather_with) and
//!    [`dense_backward_with`](crate::dense_backward_with); an `f16` or `bf16` table's rows are copied
//!    as they are by [`gather_half_with`](crate::gather_half_with) (the output keeps the table's
//!    dtype, as `index_select` does), and its gradient is summed in `f32`
//!    and rounded once to the table's dtype. Ids may be `u8`, `u32`, `i16`,
//!    `i32` or `i64`; `u8` and `i16` ids are widened into a buffer (the
//!    kernels take `u32` and `i32`), the others are read in place.
//! 4. **Bags** (`bag.rs`). [`EmbeddingBag`]'s forward is a third op over `(weight,
//!    ids)` that owns the checked [`Bags`](crate::Bags) and the pooling arguments, and
//!    for max mode records the winners' ids, which its `bwd` hands to
//!    [`bag_max_backward_with`](crate::bag_max_backward_with); sum and mean go back through
//!    [`bag_backward_with`](crate::bag_backward_with).
//! 5. **Outputs in huge pages.** Every op returns a new buffer (candle's
//!    tensors are immutable); a large one is advised for transparent huge
//!    pages before the kernel first writes it, as the crate's own layers
//!    do, which on a 32 MiB output or a 488 MiB gradient is most of the
//!    difference from a plain `vec!` (the page faults).
//! 6. **Errors.** Every problem is a [`candle_core::Error`], never a panic:
//!    a tensor not on the CPU, a dtype the crate does not serve, a shape
//!    that is not a table, and a bad id (the message names its flat
//!    position and its value).
//!
//! [`QuantizedEmbedding`] and [`QuantizedEmbeddingBag`] (`quantized.rs`) are
//! the crate's inference layers over tables of any
//! [`Format`](crate::formats::Format), 8-, 4- and 2-bit rows included: candle id
//! tensors in, `f32` tensors out, no gradient.
//!
//! Where this differs from candle: candle's `index_select` reads an id equal
//! to its dtype's largest value (`255` for `u8`, `u32::MAX`, `i64::MAX`) as
//! "no row" and gives zeros; here such an id is a row number like any other,
//! so it is either that row or an out-of-range error.

use crate::error::EmbeddingError;
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Error, Layout, Result, Tensor};

/// A table this module serves: a CPU matrix of `f32`, `f16` or `bf16`.
fn check_table(weight: &Tensor) -> Result<()> {
    check_cpu(weight, "table")?;
    match weight.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => {}
        other => return Err(Error::UnsupportedDTypeForOp(other, "embedding table")),
    }
    if weight.rank() != 2 {
        return Err(Error::UnexpectedNumberOfDims {
            expected: 2,
            got: weight.rank(),
            shape: weight.shape().clone(),
        }
        .bt());
    }
    Ok(())
}

/// Ids this module serves: a CPU tensor of an integer dtype.
fn check_ids(ids: &Tensor) -> Result<()> {
    check_cpu(ids, "ids")?;
    match ids.dtype() {
        DType::U8 | DType::U32 | DType::I16 | DType::I32 | DType::I64 => Ok(()),
        other => Err(Error::UnsupportedDTypeForOp(other, "embedding ids")),
    }
}

fn check_cpu(t: &Tensor, what: &str) -> Result<()> {
    if t.device().is_cpu() {
        Ok(())
    } else {
        Err(Error::Msg(format!(
            "embedding-kernels runs on the CPU only, but the {what} is on {:?}",
            t.device().location()
        )))
    }
}

/// The row width of a table `layout` that must be a matrix, or `op`'s
/// error naming its shape.
fn matrix_width(layout: &Layout, op: &'static str) -> Result<usize> {
    match layout.dims() {
        &[_, dim] => Ok(dim),
        _ => Err(Error::Msg(format!(
            "{op}: the table has shape {:?}, not a matrix",
            layout.shape()
        ))),
    }
}

/// The slice of `storage` that a contiguous `layout` spans.
fn contiguous<'a, T>(values: &'a [T], layout: &Layout, op: &'static str) -> Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((start, end)) => values.get(start..end).ok_or_else(|| {
            Error::Msg(format!(
                "{op}: the layout spans {start}..{end} of a storage of {}",
                values.len()
            ))
        }),
        None => Err(Error::RequiresContiguous { op }.bt()),
    }
}

/// Ids as the kernels take them: borrowed where the dtype is an
/// [`Index`](crate::Index), widened where it is not.
enum Ids<'a> {
    U32(std::borrow::Cow<'a, [u32]>),
    I32(std::borrow::Cow<'a, [i32]>),
    I64(&'a [i64]),
}

impl<'a> Ids<'a> {
    fn new(storage: &'a CpuStorage, layout: &Layout, op: &'static str) -> Result<Self> {
        Ok(match storage {
            CpuStorage::U8(v) => Ids::U32(
                contiguous(v, layout, op)?
                    .iter()
                    .map(|&i| i.into())
                    .collect(),
            ),
            CpuStorage::U32(v) => Ids::U32(contiguous(v, layout, op)?.into()),
            CpuStorage::I16(v) => Ids::I32(
                contiguous(v, layout, op)?
                    .iter()
                    .map(|&i| i.into())
                    .collect(),
            ),
            CpuStorage::I32(v) => Ids::I32(contiguous(v, layout, op)?.into()),
            CpuStorage::I64(v) => Ids::I64(contiguous(v, layout, op)?),
            other => return Err(Error::UnsupportedDTypeForOp(other.dtype(), op)),
        })
    }
}

/// Runs `$body` with `$ids` bound to the id slice, whatever its type.
macro_rules! with_ids {
    ($ids:expr, |$v:ident| $body:expr) => {
        match $ids {
            Ids::U32(ref ids) => {
                let $v: &[u32] = ids;
                $body
            }
            Ids::I32(ref ids) => {
                let $v: &[i32] = ids;
                $body
            }
            Ids::I64(ids) => {
                let $v: &[i64] = ids;
                $body
            }
        }
    };
}

/// `len` zeros for an op's result, as candle's storage holds it: an
/// ordinary `Vec` (candle frees it as one), advised for transparent huge
/// pages before its first touch when it spans one, as the crate's layers
/// allocate their outputs ([`crate::memory`]). Writing a fresh buffer costs
/// a page fault per page; with 2 MiB pages instead of 4 KiB ones, a large
/// output or table gradient takes 512 times fewer. Memory the allocator
/// refuses is an error, not an abort.
fn zeroed<T: bytemuck::Zeroable>(len: usize, op: &'static str) -> Result<Vec<T>> {
    let values = crate::buffer::zeroed::<T>(len, "output").map_err(|e| kernel_error(op, e))?;
    if core::mem::size_of_val(values.as_slice()) >= crate::memory::HUGE_PAGE {
        crate::memory::advise_huge_pages(&values);
    }
    Ok(values)
}

/// A kernel error as a candle error, its message naming the operation.
/// The bags of a bag layer's `offsets` over the `n` ids of `ids` (1-D), and
/// its `per_sample_weights` (`f32`, on the CPU) as a `Vec`: what every bag
/// layer checks before its op. `ops` name the offsets and the weights in
/// the errors.
fn bag_arguments(
    ids: &Tensor,
    offsets: &Tensor,
    include_last_offset: bool,
    per_sample_weights: Option<&Tensor>,
    ops: [&'static str; 2],
) -> Result<(crate::Bags, Option<Vec<f32>>)> {
    check_ids(offsets)?;
    let n = ids.dims1()?;
    let offsets = offsets.to_dtype(DType::I64)?.to_vec1::<i64>()?;
    let bags = crate::Bags::from_offsets(&offsets, n, include_last_offset)
        .map_err(|e| kernel_error(ops[0], e))?;
    let weights = match per_sample_weights {
        None => None,
        Some(w) => {
            check_cpu(w, "per_sample_weights")?;
            if w.dtype() != DType::F32 {
                return Err(Error::UnsupportedDTypeForOp(w.dtype(), ops[1]));
            }
            Some(w.flatten_all()?.to_vec1::<f32>()?)
        }
    };
    Ok((bags, weights))
}

fn kernel_error(op: &'static str, err: EmbeddingError) -> Error {
    Error::Msg(format!("{op}: {err}")).bt()
}

mod bag;
mod embedding;
mod quantized;

pub use bag::{EmbeddingBag, embedding_bag};
pub use embedding::{Embedding, embedding};
pub use quantized::{QuantizedEmbedding, QuantizedEmbeddingBag};
