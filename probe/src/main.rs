//! A build-time probe (issue 64, "compiled once"): a calling crate that uses
//! every public kernel and layer of `embedding-kernels`, for `u32` and `i64`
//! ids and every table format, so that its build time is what a user's crate
//! pays for the generic code it instantiates.
//!
//! ```text
//! cd probe
//! cargo build --release                              # once: dependencies and the library
//! touch src/main.rs && time cargo build --release    # what a calling crate compiles
//! ```
//!
//! `scripts/build-times.sh probe` times the second line for the table of
//! issue 64 and docs/testing.md. The data are small and made up; a run only
//! checks that every call succeeds and prints one checksum, the sum of every
//! output, so that no call can be optimised away. Speed does not matter here.
//!
//! Each `_with` form is called once, for `gather`: the plain forms call theirs
//! with `Parallelism::Auto`, so they compile the same code.

use embedding_kernels::formats::{self, Format, OwnedTable, PackedTable, RowWise, TableRef};
use embedding_kernels::positions::sinusoidal_positions;
use embedding_kernels::{
    Adagrad, AdagradOn, Bags, Embedding, EmbeddingBag, EmbeddingBagOptions, EmbeddingError,
    EmbeddingOptions, Gradient, Index, InputEmbedding, Mode, Parallelism, Pooling, Positions,
    QuantizedEmbedding, QuantizedEmbeddingBag, RowWiseAdagrad, Sgd, SparseOptimizer, bag_backward,
    bag_forward, bag_max_backward, bag_sparse_backward, bag_sparse_step, dense_backward,
    embed_positions, embed_positions_backward, gather, gather_half, gather_scaled, gather_with,
    scatter_add, scatter_add_scaled, sparse_backward, sparse_step, table_bag_forward, table_gather,
};

/// The table: `ROWS × DIM` values.
const ROWS: usize = 64;
const DIM: usize = 40;
/// The ids form a `[BATCH, SEQ]` batch, for the position kernels and layers.
const BATCH: usize = 4;
const SEQ: usize = 9;
/// The ids: repeats, the padding row, the first and the last row.
const IDS: [u8; BATCH * SEQ] = [
    5, 63, 3, 17, 5, 0, 42, 42, 9, //
    28, 3, 11, 60, 5, 33, 1, 63, 20, //
    7, 7, 7, 50, 14, 3, 38, 2, 61, //
    19, 0, 44, 26, 5, 12, 57, 31, 8,
];
/// The first position of each bag; the second bag is empty.
const OFFSETS: [u8; 6] = [0, 5, 5, 12, 20, 31];
/// The row that the padding options leave out.
const PAD: usize = 3;

type Result<T = ()> = core::result::Result<T, EmbeddingError>;

fn main() -> Result {
    let table: Vec<f32> = (0..ROWS * DIM)
        .map(|k| ((k * 37) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let mut sum = Checksum::default();
    table_formats(&table, &mut sum)?;
    exercise::<u32>(&table, &mut sum)?;
    exercise::<i64>(&table, &mut sum)?;
    println!("checksum {:.6}", sum.0);
    Ok(())
}

/// Every generic entry point of the crate, with ids of type `I`.
fn exercise<I: Index + From<u8>>(table: &[f32], sum: &mut Checksum) -> Result {
    let batch = Batch::<I>::new()?;
    kernels(table, &batch, sum)?;
    bag_kernels(table, &batch, sum)?;
    table_kernels(table, &batch, sum)?;
    embedding(table, &batch, sum)?;
    embedding_bag(table, &batch, sum)?;
    input_embedding(table, &batch, sum)?;
    let mut sgd = Sgd::new(0.1).with_weight_decay(0.01);
    steps(table, &batch, &mut sgd, sum)?;
    steps(table, &batch, &mut Adagrad::new(0.1), sum)?;
    steps(table, &batch, &mut RowWiseAdagrad::new(0.1), sum)?;
    let mut state = vec![0.0; table.len()];
    steps(table, &batch, &mut AdagradOn::new(0.1, &mut state, 0), sum)?;
    sum.add(&state);
    Ok(())
}

/// The sum of every output, in `f64`.
#[derive(Default)]
struct Checksum(f64);

impl Checksum {
    fn add(&mut self, values: &[f32]) {
        self.0 += values.iter().map(|&x| f64::from(x)).sum::<f64>();
    }

    fn gradient(&mut self, gradient: &Gradient) {
        match gradient {
            Gradient::Dense(values) => self.add(values),
            Gradient::Sparse(grad) => self.add(grad.values()),
        }
    }
}

/// One batch of ids of type `I`, its bags, and the gradients that go with it.
struct Batch<I> {
    /// `[BATCH, SEQ]` ids.
    ids: Vec<I>,
    /// The first position of each bag, as the layers take them.
    offsets: Vec<I>,
    /// `offsets`, checked.
    bags: Bags,
    /// One per id (sum mode).
    weights: Vec<f32>,
    /// One row per id.
    grad_out: Vec<f32>,
    /// One row per bag.
    grad_bags: Vec<f32>,
}

impl<I: Index + From<u8>> Batch<I> {
    fn new() -> Result<Batch<I>> {
        let ids: Vec<I> = IDS.iter().map(|&id| I::from(id)).collect();
        let offsets: Vec<I> = OFFSETS.iter().map(|&o| I::from(o)).collect();
        let bags = Bags::from_offsets(&offsets, ids.len(), false)?;
        Ok(Batch {
            weights: ramp(ids.len()),
            grad_out: ramp(ids.len() * DIM),
            grad_bags: ramp(bags.len() * DIM),
            ids,
            offsets,
            bags,
        })
    }
}

/// `len` made-up values in [-0.5, 0.5).
fn ramp(len: usize) -> Vec<f32> {
    (0..len).map(|k| (k % 13) as f32 / 13.0 - 0.5).collect()
}

/// Sum with per-sample weights, mean with the gradient scaled by frequency,
/// and max; each leaves out the padding row.
fn poolings(weights: &[f32]) -> [Pooling<'_>; 3] {
    let pooling = |mode| Pooling {
        mode,
        padding_idx: Some(PAD),
        ..Pooling::default()
    };
    [
        Pooling {
            per_sample_weights: Some(weights),
            ..pooling(Mode::Sum)
        },
        Pooling {
            scale_grad_by_freq: true,
            ..pooling(Mode::Mean)
        },
        pooling(Mode::Max),
    ]
}

/// A bag forward's `max_indices`: one per output value in max mode, none
/// otherwise.
fn max_slots(mode: Mode, out_len: usize) -> Vec<i64> {
    vec![0; if mode == Mode::Max { out_len } else { 0 }]
}

/// The kernels over `f32` tables: lookups, scatters, backward passes and
/// positions.
fn kernels<I: Index>(table: &[f32], batch: &Batch<I>, sum: &mut Checksum) -> Result {
    let (ids, grad_out) = (&batch.ids[..], &batch.grad_out[..]);
    let mut out = vec![0.0; ids.len() * DIM];
    gather(table, DIM, ids, &mut out)?;
    sum.add(&out);
    gather_with(Parallelism::Serial, table, DIM, ids, &mut out)?;
    sum.add(&out);
    gather_scaled(table, DIM, ids, 0.5, &mut out)?;
    sum.add(&out);

    let mut grad = vec![0.0; table.len()];
    scatter_add(grad_out, DIM, ids, &mut grad)?;
    scatter_add_scaled(grad_out, DIM, ids, 0.25, &mut grad)?;
    sum.add(&grad);
    dense_backward(grad_out, DIM, ids, Some(PAD), true, &mut grad)?;
    sum.add(&grad);
    let sparse = sparse_backward(grad_out, DIM, ids, ROWS, Some(PAD), false)?;
    sum.add(sparse.values());

    let positions = sinusoidal_positions(SEQ, DIM)?;
    embed_positions(table, &positions, DIM, ids, SEQ, Some(2.0), &mut out)?;
    sum.add(&out);
    let mut grad_pos = vec![0.0; positions.len()];
    embed_positions_backward(grad_out, DIM, ids, SEQ, None, &mut grad, &mut grad_pos)?;
    sum.add(&grad);
    sum.add(&grad_pos);
    Ok(())
}

/// The bag kernels over `f32` tables, forward and backward, in every mode.
fn bag_kernels<I: Index>(table: &[f32], batch: &Batch<I>, sum: &mut Checksum) -> Result {
    let (ids, bags, grad_bags) = (&batch.ids[..], &batch.bags, &batch.grad_bags[..]);
    let mut out = vec![0.0; bags.len() * DIM];
    let mut grad = vec![0.0; table.len()];
    for pooling in poolings(&batch.weights) {
        let mut max_indices = max_slots(pooling.mode, out.len());
        bag_forward(table, DIM, ids, bags, &pooling, &mut out, &mut max_indices)?;
        sum.add(&out);
        if pooling.mode == Mode::Max {
            bag_max_backward(grad_bags, DIM, &max_indices, &mut grad)?;
        } else {
            bag_backward(grad_bags, DIM, ids, bags, &pooling, &mut grad)?;
            let sparse = bag_sparse_backward(grad_bags, DIM, ids, bags, &pooling, ROWS)?;
            sum.add(sparse.values());
        }
        sum.add(&grad);
    }
    // The batch's rows as bags (a 2-D input), mean-pooled.
    let rows = Bags::fixed(BATCH, SEQ)?;
    let mut out = vec![0.0; rows.len() * DIM];
    let mean = Pooling::default();
    bag_forward(table, DIM, ids, &rows, &mean, &mut out, &mut [])?;
    sum.add(&out);
    Ok(())
}

/// The lookups and bags on tables of every format: owned tables, the views
/// made directly, and the half-precision gather.
fn table_kernels<I: Index>(table: &[f32], batch: &Batch<I>, sum: &mut Checksum) -> Result {
    let (ids, bags) = (&batch.ids[..], &batch.bags);
    let mut out = vec![0.0; ids.len() * DIM];
    let mut bag_out = vec![0.0; bags.len() * DIM];
    for format in Format::ALL {
        let owned = OwnedTable::from_f32(table, DIM, format)?;
        table_gather(owned.as_ref(), ids, &mut out)?;
        sum.add(&out);
        for pooling in poolings(&batch.weights) {
            let mut max_indices = max_slots(pooling.mode, bag_out.len());
            let view = owned.as_ref();
            table_bag_forward(view, ids, bags, &pooling, &mut bag_out, &mut max_indices)?;
            sum.add(&bag_out);
        }
    }

    let halves = formats::to_f16(table)?;
    let brain_halves = formats::to_bf16(table)?;
    let packed = RowWise::Int2.prepack(table, DIM)?;
    let views = [
        TableRef::f32(table, DIM)?,
        TableRef::f16(&halves, DIM)?,
        TableRef::bf16(&brain_halves, DIM)?,
        TableRef::packed(PackedTable::new(RowWise::Int2, DIM, &packed)?),
    ];
    for view in views {
        table_gather(view, ids, &mut out)?;
        sum.add(&out);
    }

    let zeros = vec![0.0; ids.len() * DIM];
    let mut out_f16 = formats::to_f16(&zeros)?;
    gather_half(&halves, DIM, ids, &mut out_f16)?;
    sum.add(&formats::f16_to_f32(&out_f16)?);
    let mut out_bf16 = formats::to_bf16(&zeros)?;
    gather_half(&brain_halves, DIM, ids, &mut out_bf16)?;
    sum.add(&formats::bf16_to_f32(&out_bf16)?);
    Ok(())
}

/// The format conversions, which take no ids: packing and unpacking every
/// row-wise format, and every owned table's round trip through its bytes.
fn table_formats(table: &[f32], sum: &mut Checksum) -> Result {
    let mut unpacked = vec![0.0; table.len()];
    for packing in [RowWise::Int8, RowWise::Int4, RowWise::Int2] {
        let packed = packing.prepack(table, DIM)?;
        packing.dequantize(&packed, DIM, &mut unpacked)?;
        sum.add(&unpacked);
    }
    for format in Format::ALL {
        let owned = OwnedTable::from_f32(table, DIM, format)?;
        let again = OwnedTable::from_le_bytes(format, DIM, &owned.to_le_bytes()?)?;
        sum.add(&again.to_f32()?);
    }
    Ok(())
}

/// `Embedding` (lookups, every backward, the dense step and a stored sparse
/// gradient's step) and `QuantizedEmbedding` made from it in every format.
fn embedding<I: Index>(table: &[f32], batch: &Batch<I>, sum: &mut Checksum) -> Result {
    let (ids, grad_out) = (&batch.ids[..], &batch.grad_out[..]);
    let options = EmbeddingOptions {
        padding_idx: Some(PAD as i64),
        scale_grad_by_freq: true,
        ..EmbeddingOptions::default()
    };
    let mut emb = Embedding::from_pretrained_with_options(table.to_vec(), DIM, false, options)?;
    sum.add(&emb.forward(ids, &[BATCH, SEQ])?.values);
    let mut out = vec![0.0; ids.len() * DIM];
    emb.forward_into(ids, &mut out)?;
    sum.add(&out);
    emb.lookup_into(ids, &mut out)?;
    sum.add(&out);
    sum.add(emb.row(ids[0])?);

    for format in Format::ALL {
        let quantized = QuantizedEmbedding::from_float(&emb, format)?;
        sum.add(&quantized.forward(ids, &[BATCH, SEQ])?.values);
        quantized.forward_into(ids, &mut out)?;
        sum.add(&out);
    }
    let owned = OwnedTable::from_f32(table, DIM, Format::Int8)?;
    let quantized = QuantizedEmbedding::from_table(owned);
    sum.add(&quantized.forward(ids, &[ids.len()])?.values);

    sum.gradient(&emb.backward(grad_out, ids)?);
    let dense = emb.backward_dense(grad_out, ids)?;
    let mut grad = vec![0.0; table.len()];
    emb.backward_dense_into(grad_out, ids, &mut grad)?;
    sum.add(&grad);
    emb.dense_sgd_step(&dense, &Sgd::new(0.01))?;
    sum.add(emb.weight());

    // With max_norm the forward renormalises the rows it reads; a sparse
    // layer's backward is sparse.
    let options = EmbeddingOptions {
        max_norm: Some(1.0),
        sparse: true,
        seed: Some(7),
        ..EmbeddingOptions::default()
    };
    let mut renormed = Embedding::with_options(ROWS, DIM, options)?;
    sum.add(&renormed.forward(ids, &[ids.len()])?.values);
    sum.gradient(&renormed.backward(grad_out, ids)?);
    Ok(())
}

/// `EmbeddingBag` in every mode (forward, every backward) and
/// `QuantizedEmbeddingBag` made from it in every format.
fn embedding_bag<I: Index>(table: &[f32], batch: &Batch<I>, sum: &mut Checksum) -> Result {
    let (ids, grad_bags) = (&batch.ids[..], &batch.grad_bags[..]);
    for mode in [Mode::Sum, Mode::Mean, Mode::Max] {
        let options = EmbeddingBagOptions {
            mode,
            padding_idx: Some(PAD as i64),
            ..EmbeddingBagOptions::default()
        };
        let mut bag = EmbeddingBag::from_pretrained(table.to_vec(), DIM, false, options)?;
        let bags = bag.offsets(&batch.offsets, ids.len())?;
        let weights = (mode == Mode::Sum).then_some(&batch.weights[..]);
        let forward = bag.forward(ids, &bags, weights)?;
        sum.add(&forward.values);
        let max = forward.max_indices.as_deref();
        let mut out = vec![0.0; forward.values.len()];
        let mut max_indices = max_slots(mode, out.len());
        bag.forward_into(ids, &bags, weights, &mut out, &mut max_indices)?;
        sum.add(&out);

        sum.gradient(&bag.backward(grad_bags, ids, &bags, weights, max)?);
        let mut grad = vec![0.0; table.len()];
        bag.backward_dense_into(grad_bags, ids, &bags, weights, max, &mut grad)?;
        sum.add(&grad);
        let sparse = bag.backward_sparse(grad_bags, ids, &bags, weights, max)?;
        sum.add(sparse.values());

        for format in Format::ALL {
            let quantized = QuantizedEmbeddingBag::from_float(&bag, format)?;
            let bags = quantized.offsets(&batch.offsets, ids.len())?;
            sum.add(&quantized.forward(ids, &bags, weights)?.values);
            quantized.forward_into(ids, &bags, weights, &mut out, &mut max_indices)?;
            sum.add(&out);
        }
    }
    let owned = OwnedTable::from_f32(table, DIM, Format::Int4)?;
    let quantized = QuantizedEmbeddingBag::from_table(owned, Mode::Sum, Some(PAD), false)?;
    sum.add(&quantized.forward(ids, &batch.bags, None)?.values);
    Ok(())
}

/// `InputEmbedding` with sinusoidal, learned and given positions: forward,
/// backward and its SGD step.
fn input_embedding<I: Index>(table: &[f32], batch: &Batch<I>, sum: &mut Checksum) -> Result {
    let (ids, grad_out) = (&batch.ids[..], &batch.grad_out[..]);
    let tokens = || Embedding::from_pretrained(table.to_vec(), DIM, false);
    let given = Positions::Fixed(sinusoidal_positions(SEQ + 2, DIM)?);
    let layers = [
        InputEmbedding::sinusoidal(tokens()?, SEQ, true)?,
        InputEmbedding::learned(tokens()?, SEQ, 11, false)?,
        InputEmbedding::new(tokens()?, given, Some(0.5))?,
    ];
    for mut layer in layers {
        sum.add(&layer.forward(ids, BATCH, SEQ)?.values);
        let mut out = vec![0.0; ids.len() * DIM];
        layer.forward_into(ids, BATCH, SEQ, &mut out)?;
        sum.add(&out);
        let grads = layer.backward(grad_out, ids, BATCH, SEQ)?;
        sum.add(&grads.tokens);
        sum.add(grads.positions.as_deref().unwrap_or_default());
        layer.sparse_sgd_step(grad_out, ids, BATCH, SEQ, &Sgd::new(0.01))?;
        sum.add(layer.tokens().weight());
        sum.add(layer.positions().weight());
    }
    Ok(())
}

/// Every sparse step with the optimiser `O`: the fused kernels, both
/// layers' fused steps, and a stored sparse gradient's step.
fn steps<I: Index, O: SparseOptimizer>(
    table: &[f32],
    batch: &Batch<I>,
    optimizer: &mut O,
    sum: &mut Checksum,
) -> Result {
    let (ids, bags) = (&batch.ids[..], &batch.bags);
    let (grad_out, grad_bags) = (&batch.grad_out[..], &batch.grad_bags[..]);
    let mut weight = table.to_vec();
    sparse_step(&mut weight, DIM, grad_out, ids, Some(PAD), true, optimizer)?;
    let [weighted_sum, mean, _max] = poolings(&batch.weights);
    for pooling in [weighted_sum, mean] {
        bag_sparse_step(&mut weight, DIM, grad_bags, ids, bags, &pooling, optimizer)?;
    }
    sum.add(&weight);

    let mut emb = Embedding::from_pretrained(table.to_vec(), DIM, false)?;
    emb.sparse_step(grad_out, ids, optimizer)?;
    let grad = emb.backward_sparse(grad_out, ids)?;
    emb.apply_sparse(&grad, optimizer)?;
    sum.add(emb.weight());

    let mut bag = EmbeddingBag::from_embedding(emb, Mode::Sum, false)?;
    bag.sparse_step(grad_bags, ids, bags, Some(&batch.weights), optimizer)?;
    sum.add(bag.table().weight());
    Ok(())
}
