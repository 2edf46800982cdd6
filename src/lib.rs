//! Fast, bounds-checked, deterministic embedding layers for CPUs.
//!
//! An embedding layer is a table `weight[num_embeddings, embedding_dim]`
//! (row-major, one flat `[f32]`). Its forward pass gathers rows,
//! `out[i, :] = weight[ids[i], :]`, which is exactly `one_hot(ids) · weight`;
//! its backward pass scatter-adds the output gradient back,
//! `grad[ids[i], :] += grad_out[i, :]`, which is `one_hot(ids)ᵀ · grad_out`.
//!
//! # The layers
//!
//! Most users start here: the layers a PyTorch user knows, with PyTorch's
//! argument names and numbers.
//!
//! * [`Embedding`] is `nn.Embedding`: `padding_idx`, `max_norm`,
//!   `norm_type`, `scale_grad_by_freq`, `sparse`; dense and sparse
//!   backward; sparse optimiser steps fused into the backward ([`Sgd`],
//!   [`Adagrad`], [`RowWiseAdagrad`]).
//! * [`EmbeddingBag`] is `nn.EmbeddingBag`: sum, mean and max over
//!   `offsets`, with `per_sample_weights` and `include_last_offset`.
//! * [`QuantizedEmbedding`] and [`QuantizedEmbeddingBag`] are
//!   `torch.ao.nn.quantized`'s, for inference over `f16`, `bf16` and
//!   row-wise 8/4/2-bit tables ([`formats`]), built with `from_float`.
//! * [`InputEmbedding`] is a transformer's input: token plus sinusoidal or
//!   learned positions, in one fused pass.
//! * [`Vocab`] turns text into ids; [`io`] reads and writes tables as
//!   safetensors; [`memory`] allocates tables in huge pages.
//!
//! ```
//! use embedding_kernels::{Embedding, Sgd};
//!
//! let mut emb = Embedding::new(1000, 16)?;
//! let ids: Vec<i64> = vec![5, 42, 7, 5]; // a [2, 2] batch
//! let out = emb.forward(&ids, &[2, 2])?;
//! assert_eq!(out.shape, [2, 2, 16]);
//! let grad_out = vec![0.1f32; out.values.len()];
//! emb.sparse_step(&grad_out, &ids, &mut Sgd::new(0.5))?;
//! # Ok::<(), embedding_kernels::EmbeddingError>(())
//! ```
//!
//! # Features
//!
//! * `candle` (off by default): the `candle` module's `Embedding` and
//!   `EmbeddingBag`, candle modules whose forward and backward run this
//!   crate's kernels; `embedding_kernels::candle::embedding(..)` replaces
//!   `candle_nn::embedding(..)` line for line.
//!
//! # The kernels
//!
//! The layers are built only from these free functions over slices, each in
//! two forms: the plain one lets the crate decide about threads
//! ([`Parallelism::Auto`]); the `_with` one takes a [`Parallelism`] first.
//!
//! | operation | functions | source |
//! | --- | --- | --- |
//! | lookup | [`gather`], [`gather_scaled`] | `kernels/gather.rs` |
//! | scatter-add (accumulating backward) | [`scatter_add`], [`scatter_add_scaled`] | `kernels/scatter.rs` |
//! | dense backward (overwriting) | [`dense_backward`] | `kernels/grouped/dense.rs` |
//! | sparse backward ([`SparseGrad`]) | [`sparse_backward`] | `kernels/grouped/sparse.rs` |
//! | token + position lookup, and its backward | [`embed_positions`], [`embed_positions_backward`] | `kernels/token_position.rs` |
//! | bag forward: sum, mean, max ([`Bags`], [`Pooling`]) | [`bag_forward`] | `kernels/bag/` |
//! | bag backward: dense, sparse, max | [`bag_backward`], [`bag_sparse_backward`], [`bag_max_backward`] | `kernels/bag/backward.rs` |
//! | lookup and bags on tables of any [`formats::Format`] (`f16`, `bf16`, row-wise 8/4/2-bit) | [`table_gather`], [`table_bag_forward`], [`gather_half`] | `kernels/lookup.rs`, `kernels/bag/`, `kernels/row_format.rs` |
//! | the one-hot oracle, and plain loops | [`reference`](mod@reference), [`reference::loops`] | `reference/` |
//!
//! Under them: `simd/` (one lane trait, for `wide::f32x8` and for AVX
//! registers, and the row operations written once over it),
//! `kernels/tuning.rs` (every size the kernels tune by), and the shared
//! vocabulary (`bags.rs`, `pooling.rs`, `sparse_grad.rs`, `parallel.rs`,
//! `index/`, `error.rs`). Each kernel file opens with its algorithm and
//! its tricks; `docs/design.md` explains the choices.
//!
//! ```
//! use embedding_kernels::{gather, scatter_add};
//!
//! let (num_embeddings, dim) = (4, 3);
//! let weight: Vec<f32> = (0..num_embeddings * dim).map(|x| x as f32).collect();
//! let ids = [3i64, 1, 3];
//!
//! let mut out = vec![0.0; ids.len() * dim];
//! gather(&weight, dim, &ids, &mut out)?;
//! assert_eq!(&out[..3], &weight[9..12]);
//!
//! let grad_out = vec![1.0; ids.len() * dim];
//! let mut grad = vec![0.0; weight.len()];
//! scatter_add(&grad_out, dim, &ids, &mut grad)?;
//! assert_eq!(&grad[9..12], &[2.0, 2.0, 2.0]); // id 3 appeared twice
//!
//! // A bad id is an error, and nothing is written.
//! let err = gather(&weight, dim, &[0i64, -1], &mut out[..2 * dim]).unwrap_err();
//! assert_eq!(err.to_string(), "id -1 at position 1 is out of range for a table of 4 rows");
//! # Ok::<(), embedding_kernels::EmbeddingError>(())
//! ```
//!
//! # What the crate promises
//!
//! * **Checks before writes.** Shapes and every id are checked before a
//!   single value is written; an error is an [`EmbeddingError`] (or, for
//!   files, an [`io::FileError`]) that names the position and value of the
//!   bad id, or the expected and actual lengths.
//! * **Exact results.** [`gather`] copies bits; [`gather_scaled`] does one
//!   multiplication per value; [`scatter_add`] sums each row's gradients in
//!   position order; the bag sum adds in position order from `-0.0`. They
//!   equal the one-hot [`reference`](mod@reference) bit for bit.
//! * **NaNs are NaNs.** A result that is NaN is NaN on every instruction
//!   set, thread count and in the reference; where NaNs meet or one is
//!   computed, which NaN comes out (sign and payload) is not specified, as
//!   the compiler may keep either operand's. Every other value keeps its
//!   bits; [`gather`] and the lookups copy a table's NaNs as they are.
//! * **Determinism.** Results are the same bits for every thread count and
//!   on every instruction set.
//! * **Threads are the caller's.** Kernels run on the rayon pool they are
//!   called from, or on the caller's own threads through an [`Executor`]
//!   ([`with_executor`]), and never touch the global pool's configuration.
//!
//! # SIMD
//!
//! Row arithmetic is written once over a lane trait and runs, chosen at run
//! time, in sixteen-lane AVX-512 registers where the CPU has AVX-512F and
//! AVX-512VL, in eight-lane AVX2 registers (with FMA and F16C) where it has
//! those, and otherwise with `wide::f32x8` (two SSE2 halves in a default
//! x86-64 build). Every path does the same operations in the same order: a
//! multiply and an add are fused only where every path fuses them (the
//! packed formats' sums, as FBGEMM computes them, with `mul_add` on the
//! portable lanes), so all give the same bits. `unsafe` is
//! confined to the intrinsics (`simd/`), the prefetch hints, the column
//! blocks of the parallel scatter, the aligned tables of [`memory`], the
//! `set_len` of each fresh output written in place and the bag forward's
//! view of a caller's buffer as slots it writes once, each site with a
//! `SAFETY` comment; `docs/design.md` lists them.
//!
//! How the kernels ask for rows ahead (prefetch hints) depends on the
//! call's sizes and on what the CPU reports about itself (its L1 data
//! cache), never on its vendor or model (`kernels/tuning.rs`). For
//! measuring, the environment variable `EMBEDDING_KERNELS_ISA` (`portable`,
//! `avx2` or `avx512`, read once) caps the instruction set at a lower level
//! than the CPU has, to time or check that level's code; it changes speed
//! only, never a result. [`instruction_set`] names the one in use.
//!
//! # Testing
//!
//! `tests/` holds property tests (proptest) that compare every kernel, id
//! type and thread count with [`reference`](mod@reference) bit for bit,
//! plus edge sweeps with NaN canaries; `fuzz/` holds differential
//! cargo-fuzz targets; `docs/testing.md` describes both.

// `unsafe` only where a benchmark showed it pays, each block with its SAFETY.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod bags;
mod buffer;
#[cfg(feature = "candle")]
pub mod candle;
pub mod embedding;
pub mod embedding_bag;
pub mod error;
mod executor;
pub mod formats;
mod index;
pub mod input;
pub mod io;
mod kernels;
pub mod memory;
pub mod optim;
mod parallel;
mod pooling;
pub mod positions;
pub mod quantized;
pub mod reference;
mod shape;
mod simd;
mod sparse_grad;
pub mod vocab;

pub use bags::Bags;
pub use embedding::{Embedded, Embedding, EmbeddingOptions, Gradient};
pub use embedding_bag::{BagOutput, EmbeddingBag, EmbeddingBagOptions};
pub use error::{EmbeddingError, Operand};
pub use executor::{Executor, with_executor};
pub use index::Index;
pub use input::{InputEmbedding, InputGrads, Positions};
pub use kernels::{
    Half, bag_backward, bag_backward_with, bag_forward, bag_forward_with, bag_max_backward,
    bag_max_backward_with, bag_sparse_backward, bag_sparse_backward_with, bag_sparse_step,
    bag_sparse_step_with, dense_backward, dense_backward_with, embed_positions,
    embed_positions_backward, embed_positions_backward_with, embed_positions_with, gather,
    gather_half, gather_half_with, gather_scaled, gather_scaled_with, gather_with, scatter_add,
    scatter_add_scaled, scatter_add_scaled_with, scatter_add_with, sparse_backward,
    sparse_backward_with, sparse_step, sparse_step_with, table_bag_forward,
    table_bag_forward_strided_with, table_bag_forward_with, table_gather, table_gather_with,
};
pub use optim::{Adagrad, AdagradOn, RowWiseAdagrad, RowWiseAdagradOn, Sgd, SparseOptimizer};
pub use parallel::Parallelism;
pub use pooling::{Mode, Pooling};
pub use quantized::{QuantizedEmbedding, QuantizedEmbeddingBag};
pub use sparse_grad::SparseGrad;
pub use vocab::Vocab;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The guide's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide.md")]
struct GuideDoctests;

/// The instruction set the kernels run with on this machine, chosen once at
/// run time: `"avx512"` (sixteen lanes of AVX-512F), `"avx2"` (eight lanes,
/// with FMA and F16C), or `"portable"` (`wide::f32x8`, as the build
/// targets, on a CPU without AVX2). The widest the CPU has, unless the
/// environment variable `EMBEDDING_KERNELS_ISA` names a lower one. Every
/// level gives the same bits.
///
/// ```
/// let isa = embedding_kernels::instruction_set();
/// assert!(["avx512", "avx2", "portable"].contains(&isa));
/// ```
pub fn instruction_set() -> &'static str {
    simd::Isa::detect().name()
}
