//! Workloads and peer implementations shared by `benches/kernels.rs` and
//! `examples/report.rs` (both include this file with `#[path]`).
//!
//! The five workloads are the shapes of real tables: a toy, a sentence
//! encoder's vocabulary (MiniLM), GPT-2's vocabulary, a recommender's
//! million-row table and a narrow one with many lookups. Ids are drawn
//! uniformly from a fixed seed, so every run measures the same call.

#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One benchmark shape.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub name: &'static str,
    pub num_embeddings: usize,
    pub dim: usize,
    pub num_ids: usize,
}

pub const WORKLOADS: [Workload; 5] = [
    Workload {
        name: "tiny",
        num_embeddings: 1_000,
        dim: 64,
        num_ids: 4_096,
    },
    Workload {
        name: "minilm",
        num_embeddings: 30_522,
        dim: 384,
        num_ids: 8_192,
    },
    Workload {
        name: "gpt2",
        num_embeddings: 50_257,
        dim: 768,
        num_ids: 16_384,
    },
    Workload {
        name: "recsys",
        num_embeddings: 1_000_000,
        dim: 128,
        num_ids: 65_536,
    },
    Workload {
        name: "narrow",
        num_embeddings: 100_000,
        dim: 16,
        num_ids: 262_144,
    },
];

/// The data of one workload: table, ids, and an output-gradient buffer.
pub struct Data {
    pub w: Workload,
    pub table: Buffer,
    pub ids: Vec<i64>,
    pub grad_output: Vec<f32>,
}

impl Workload {
    /// Looks a workload up by name.
    pub fn by_name(name: &str) -> Option<Workload> {
        WORKLOADS.iter().copied().find(|w| w.name == name)
    }

    /// Bytes of one output (ids × dim × 4).
    pub fn out_bytes(&self) -> usize {
        self.num_ids * self.dim * 4
    }

    // Bytes moved, counted (not measured), so throughputs compare across
    // kernels and with a memcpy of the same size:
    //   gather, gather_scaled: read ids·dim·4 (table rows) + write ids·dim·4
    //   scatter_add: read ids·dim·4 (grad_output) + read and write each
    //                distinct touched row of the gradient (distinct·dim·4·2)
    //   memcpy of L floats: 2·L·4 (read L·4 + write L·4)

    /// Bytes a `gather` or `gather_scaled` call moves (see the rule above).
    pub fn gather_bytes(&self) -> usize {
        2 * self.out_bytes()
    }

    /// Bytes a `scatter_add` call moves when `distinct` rows are touched.
    pub fn scatter_add_bytes(&self, distinct: usize) -> usize {
        self.out_bytes() + distinct * self.dim * 4 * 2
    }

    /// Bytes a memcpy of `num_ids × dim` floats moves: the roofline's size.
    pub fn memcpy_bytes(&self) -> usize {
        2 * self.out_bytes()
    }

    /// Builds the table (values in [-1, 1)), the ids (uniform) and a gradient.
    /// With `huge_pages`, the table is an `AlignedTable` (line-aligned, in
    /// transparent huge pages), as the crate's layers allocate theirs.
    pub fn data(&self, huge_pages: bool) -> Data {
        let mut rng = StdRng::seed_from_u64(0x5eed_0000 + self.num_embeddings as u64);
        let mut table = table_buffer(self.num_embeddings * self.dim, huge_pages);
        table.fill_with(|| rng.random_range(-1.0f32..1.0));
        let ids = (0..self.num_ids)
            .map(|_| rng.random_range(0..self.num_embeddings as i64))
            .collect();
        let grad_output = (0..self.num_ids * self.dim)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        Data {
            w: *self,
            table,
            ids,
            grad_output,
        }
    }
}

/// A table or gradient buffer: the crate's line-aligned `AlignedTable` in
/// transparent huge pages, or a plain `vec!` (16-byte aligned, 4 KiB pages).
pub enum Buffer {
    Aligned(embedding_kernels::memory::AlignedTable),
    Plain(Vec<f32>),
}

impl Default for Buffer {
    fn default() -> Buffer {
        Buffer::Plain(Vec::new())
    }
}

impl std::ops::Deref for Buffer {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match self {
            Buffer::Aligned(t) => t,
            Buffer::Plain(v) => v,
        }
    }
}

impl std::ops::DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [f32] {
        match self {
            Buffer::Aligned(t) => t,
            Buffer::Plain(v) => v,
        }
    }
}

/// A zeroed buffer for a table (or a table's gradient) of `len` floats: an
/// `AlignedTable` (line-aligned, huge pages) when `huge_pages`, as the
/// layers allocate theirs, else a plain `vec!`.
pub fn table_buffer(len: usize, huge_pages: bool) -> Buffer {
    if huge_pages {
        Buffer::Aligned(
            embedding_kernels::memory::AlignedTable::zeroed(len).expect("a table that fits"),
        )
    } else {
        Buffer::Plain(vec![0.0; len])
    }
}

impl Data {
    /// How many distinct ids the workload draws.
    pub fn distinct_ids(&self) -> usize {
        let mut seen = vec![false; self.w.num_embeddings];
        self.ids
            .iter()
            .filter(|&&id| !std::mem::replace(&mut seen[id as usize], true))
            .count()
    }
}

/// candle-core, the peer: `index_select` and `index_add` on CPU tensors.
pub mod candle_peer {
    use candle_core::{Device, Tensor};

    /// Tensors prepared once, outside the timed region.
    pub struct Candle {
        pub table: Tensor,
        pub ids: Tensor,
        pub grad_output: Tensor,
        pub zeros: Tensor,
    }

    impl Candle {
        pub fn new(d: &super::Data) -> candle_core::Result<Candle> {
            let dev = Device::Cpu;
            let w = d.w;
            let table = Tensor::from_slice(&d.table[..], (w.num_embeddings, w.dim), &dev)?;
            let ids = Tensor::from_slice(&d.ids, w.num_ids, &dev)?;
            let grad_output = Tensor::from_slice(&d.grad_output, (w.num_ids, w.dim), &dev)?;
            let zeros = Tensor::zeros((w.num_embeddings, w.dim), candle_core::DType::F32, &dev)?;
            Ok(Candle {
                table,
                ids,
                grad_output,
                zeros,
            })
        }

        /// Forward: `table.index_select(ids, 0)` (allocates its output).
        pub fn gather(&self) -> candle_core::Result<Tensor> {
            self.table.index_select(&self.ids, 0)
        }

        /// Forward, scaled: `index_select` then an affine multiply.
        pub fn gather_scaled(&self, scale: f64) -> candle_core::Result<Tensor> {
            self.table.index_select(&self.ids, 0)?.affine(scale, 0.0)
        }

        /// Backward: `zeros.index_add(ids, grad_output, 0)` (allocates the
        /// result, as candle tensors are immutable).
        pub fn scatter_add(&self) -> candle_core::Result<Tensor> {
            self.zeros.index_add(&self.ids, &self.grad_output, 0)
        }
    }
}

/// candle-core peers of the layer benches (`benches/layer.rs`).
pub mod candle_layer {
    use super::Data;
    use super::candle_peer::Candle;
    use candle_core::{DType, Device, Tensor};

    impl Candle {
        /// The `index_add` peer alone: [`Candle::new`] without the table.
        /// `table` is an empty `0 × dim` tensor, so a table that `index_add`
        /// never reads (488 MiB on recsys) is not copied and `d.table` may be
        /// empty; only [`Candle::scatter_add`] may be called on the result.
        pub fn for_index_add(d: &Data) -> candle_core::Result<Candle> {
            let dev = Device::Cpu;
            let w = d.w;
            Ok(Candle {
                table: Tensor::zeros((0, w.dim), DType::F32, &dev)?,
                ids: Tensor::from_slice(&d.ids, w.num_ids, &dev)?,
                grad_output: Tensor::from_slice(&d.grad_output, (w.num_ids, w.dim), &dev)?,
                zeros: Tensor::zeros((w.num_embeddings, w.dim), DType::F32, &dev)?,
            })
        }
    }

    /// A transformer's input embedding with candle's ops, tensors prepared
    /// once: `index_select` of the token rows, `affine(scale, 0)`, then the
    /// rows viewed as `[batch, seq_len, dim]` and `broadcast_add` of the
    /// `[seq_len, dim]` position table. Each op allocates its result.
    pub struct TokenPosition {
        pub table: Tensor,
        pub ids: Tensor,
        pub positions: Tensor,
        pub batch: usize,
        pub seq_len: usize,
    }

    impl TokenPosition {
        /// `table` is `rows × dim`, `ids` a flat `[batch, seq_len]` batch,
        /// `positions` at least `seq_len × dim` (only the first `seq_len`
        /// rows are copied).
        pub fn new(
            table: &[f32],
            dim: usize,
            ids: &[i64],
            seq_len: usize,
            positions: &[f32],
        ) -> candle_core::Result<TokenPosition> {
            let dev = Device::Cpu;
            let batch = ids.len() / seq_len;
            Ok(TokenPosition {
                table: Tensor::from_slice(table, (table.len() / dim, dim), &dev)?,
                ids: Tensor::from_slice(ids, ids.len(), &dev)?,
                positions: Tensor::from_slice(&positions[..seq_len * dim], (seq_len, dim), &dev)?,
                batch,
                seq_len,
            })
        }

        /// `table[ids] * scale + positions`, shape `[batch, seq_len, dim]`.
        pub fn forward(&self, scale: f64) -> candle_core::Result<Tensor> {
            let dim = self.positions.dim(1)?;
            self.table
                .index_select(&self.ids, 0)?
                .affine(scale, 0.0)?
                .reshape((self.batch, self.seq_len, dim))?
                .broadcast_add(&self.positions)
        }
    }
}

/// candle-core's peer of `EmbeddingBag`'s forward over bags of one size
/// (`benches/layer.rs`). candle has no embedding bag, so the peer is the
/// composition: `index_select` of every id's row, the rows viewed as
/// `[bags, bag_size, dim]`, then a reduction over the bag axis: `sum(1)`,
/// `mean(1)` or `max(1)` (values only: candle's `max` returns no ids).
pub mod candle_bag {
    use candle_core::{Device, Tensor};
    use embedding_kernels::Mode;

    /// Tensors prepared once, outside the timed region.
    pub struct Bag {
        pub table: Tensor,
        pub ids: Tensor,
        pub bags: usize,
        pub bag_size: usize,
    }

    impl Bag {
        /// `table` is `rows × dim` (copied into a tensor), `ids` a flat
        /// `[bags, bag_size]` batch.
        pub fn new(
            table: &[f32],
            dim: usize,
            ids: &[i64],
            bag_size: usize,
        ) -> candle_core::Result<Bag> {
            let dev = Device::Cpu;
            Ok(Bag {
                table: Tensor::from_slice(table, (table.len() / dim, dim), &dev)?,
                ids: Tensor::from_slice(ids, ids.len(), &dev)?,
                bags: ids.len() / bag_size,
                bag_size,
            })
        }

        /// Each bag pooled as `mode` says, shape `[bags, dim]`. Each op
        /// allocates its result (the gathered rows, then the pooled ones).
        pub fn forward(&self, mode: Mode) -> candle_core::Result<Tensor> {
            let dim = self.table.dim(1)?;
            let rows =
                self.table
                    .index_select(&self.ids, 0)?
                    .reshape((self.bags, self.bag_size, dim))?;
            match mode {
                Mode::Sum => rows.sum(1),
                Mode::Mean => rows.mean(1),
                Mode::Max => rows.max(1),
            }
        }
    }
}

/// This crate's candle layer beside `candle_nn::Embedding`, both driven
/// through candle's API over one `Var` table, and the crate's kernels called
/// directly on that same table's storage: the `candle_layer` rows of the
/// report (`examples/report/candle_layer.rs`) and `benches/candle_layer.rs`.
///
/// What a call does, the same for both layers:
///
/// ```text
/// forward:   out  = layer.forward(ids)                  [num_ids, dim]
/// loss:      loss = out.apply_op1(FixedUpstream)        a scalar; out's gradient is grad_output
/// backward:  grads = loss.backward()                    the table's gradient in grads
/// ```
///
/// and for the kernels, into fresh buffers as the candle ops allocate
/// theirs (`memory::zeroed_table`, advised for huge pages): `gather_with`
/// into a new `num_ids × dim` output, `dense_backward_with` of
/// `grad_output` into a new table-sized gradient.
///
/// The loss is a stand-in for the rest of a model: it hands the embedding's
/// output a fixed, contiguous gradient (the workload's `grad_output`), as
/// the next layer's backward would, and costs nothing itself. A reduction
/// such as `sum_all` would not do: candle's backward of it adds a scalar
/// broadcast over the whole output, element by element, a cost of that
/// loss and not of the embedding.
pub mod candle_module {
    use super::Data;
    use candle_core::backprop::GradStore;
    use candle_core::{CpuStorage, CustomOp1, Device, Layout, Shape, Storage, Tensor, Var};
    use candle_nn::Module;
    use embedding_kernels::memory::zeroed_table;
    use embedding_kernels::{Parallelism, dense_backward_with, gather_with};

    /// Which implementation a call goes through.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Layer {
        /// `embedding_kernels::candle::Embedding`.
        Ours,
        /// `candle_nn::Embedding` (`index_select`, and `index_add` backward).
        CandleNn,
    }

    /// The table as a `Var`, the ids as a tensor, both layers over the
    /// table, and the output's gradient as a tensor.
    pub struct Modules {
        pub table: Var,
        pub ids: Tensor,
        ours: embedding_kernels::candle::Embedding,
        theirs: candle_nn::Embedding,
        upstream: Tensor,
    }

    /// The loss: forward, a zero scalar (one value written); backward, the
    /// fixed gradient `grad` for its input, whatever the scalar's gradient
    /// (candle's `backward()` seeds it with one).
    struct FixedUpstream {
        grad: Tensor,
    }

    impl CustomOp1 for FixedUpstream {
        fn name(&self) -> &'static str {
            "fixed-upstream-gradient"
        }

        fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
            Ok((CpuStorage::F32(vec![0.0]), Shape::from(())))
        }

        fn bwd(&self, _: &Tensor, _: &Tensor, _: &Tensor) -> candle_core::Result<Option<Tensor>> {
            Ok(Some(self.grad.clone()))
        }
    }

    impl Modules {
        /// Copies the workload's table into a `Var` (candle's own storage,
        /// plain 4 KiB pages) and its ids into an `i64` tensor.
        pub fn new(d: &Data) -> candle_core::Result<Modules> {
            let w = d.w;
            let table = Var::from_slice(&d.table[..], (w.num_embeddings, w.dim), &Device::Cpu)?;
            let ids = Tensor::from_slice(&d.ids, w.num_ids, &Device::Cpu)?;
            let upstream = Tensor::from_slice(&d.grad_output, (w.num_ids, w.dim), &Device::Cpu)?;
            let ours = embedding_kernels::candle::Embedding::new(table.as_tensor().clone(), w.dim);
            let theirs = candle_nn::Embedding::new(table.as_tensor().clone(), w.dim);
            Ok(Modules {
                table,
                ids,
                ours,
                theirs,
                upstream,
            })
        }

        /// `layer.forward(ids)`.
        pub fn forward(&self, layer: Layer) -> candle_core::Result<Tensor> {
            match layer {
                Layer::Ours => self.ours.forward(&self.ids),
                Layer::CandleNn => self.theirs.forward(&self.ids),
            }
        }

        /// `layer.forward(ids)` under the fixed-gradient loss, a graph
        /// ready for `backward()`.
        pub fn loss(&self, layer: Layer) -> candle_core::Result<Tensor> {
            let grad = self.upstream.clone();
            self.forward(layer)?.apply_op1(FixedUpstream { grad })
        }

        /// Forward, loss and backward; the loss is returned with the
        /// gradients so that the caller decides when the graph is freed.
        pub fn fwd_bwd(&self, layer: Layer) -> candle_core::Result<(Tensor, GradStore)> {
            let loss = self.loss(layer)?;
            let grads = loss.backward()?;
            Ok((loss, grads))
        }

        /// What `backward()` does with the table's gradient `grad` whatever
        /// the layer: candle accumulates every gradient into a `zeros_like`
        /// of its tensor with `add`, so a `Var`'s gradient costs a
        /// table-sized allocation and pass of candle's own on top of the
        /// layer's backward.
        pub fn accumulate(&self, grad: &Tensor) -> candle_core::Result<Tensor> {
            self.table.zeros_like()?.add(grad)
        }

        /// The table's gradient in `grads`.
        pub fn table_grad<'a>(&self, grads: &'a GradStore) -> candle_core::Result<&'a Tensor> {
            grads
                .get(self.table.as_tensor())
                .ok_or_else(|| candle_core::Error::Msg("no gradient for the table".into()))
        }

        /// The table's values, borrowed from the `Var`'s storage, passed to
        /// `f`: the kernels read the very bytes the layers read.
        pub fn with_table<R>(&self, f: impl FnOnce(&[f32]) -> R) -> candle_core::Result<R> {
            let (storage, layout) = self.table.storage_and_layout();
            let (start, end) = layout
                .contiguous_offsets()
                .ok_or_else(|| candle_core::Error::Msg("the table is not contiguous".into()))?;
            match &*storage {
                Storage::Cpu(CpuStorage::F32(values)) => Ok(f(&values[start..end])),
                _ => Err(candle_core::Error::Msg(
                    "the table is not f32 on the CPU".into(),
                )),
            }
        }

        /// `gather_with(Parallelism::Auto, ..)` of every id into a new
        /// output, as `forward` allocates its own.
        pub fn kernel_forward(&self, d: &Data, table: &[f32]) -> Vec<f32> {
            let mut out = zeroed_table(d.w.num_ids * d.w.dim).expect("memory for the output");
            gather_with(Parallelism::Auto, table, d.w.dim, &d.ids, &mut out)
                .expect("the workload's ids are in range");
            out
        }

        /// `dense_backward_with(Parallelism::Auto, ..)` of `grad_output`
        /// into a new table-sized gradient, as `backward()` allocates its
        /// own.
        pub fn kernel_backward(&self, d: &Data) -> Vec<f32> {
            let mut grad =
                zeroed_table(d.w.num_embeddings * d.w.dim).expect("memory for the gradient");
            dense_backward_with(
                Parallelism::Auto,
                &d.grad_output,
                d.w.dim,
                &d.ids,
                None,
                false,
                &mut grad,
            )
            .expect("the workload's ids are in range");
            grad
        }
    }
}
