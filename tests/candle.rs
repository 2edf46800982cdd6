//! The candle backend against candle itself: `embedding_kernels::candle`'s
//! layers beside `candle_nn`'s on random cases, a model trained with each,
//! and a checkpoint loaded through both.
//!
//! CUDA and Metal are not tested: this candle is built without them, so no
//! tensor here can live anywhere but the CPU. The device check is the first
//! thing the layer does and is covered by its code path for every non-CPU
//! `Device`; the test below only shows that a CUDA device cannot be made.

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{Module, Optimizer, VarBuilder, VarMap};
use embedding_kernels::Mode;
use embedding_kernels::candle::{self as ek, Embedding};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;

const CPU: Device = Device::Cpu;

/// A `[rows, dim]` table of values from `rng`, with some negative zeros
/// (their sign must survive a copy) and repeated values.
fn table(rng: &mut ChaCha8Rng, rows: usize, dim: usize) -> Vec<f32> {
    (0..rows * dim)
        .map(|_| match rng.random_range(0..10) {
            0 => -0.0,
            1 => 0.5,
            _ => rng.random_range(-4.0f32..4.0),
        })
        .collect()
}

/// `n` ids below `rows`, many repeated when `rows` is small.
fn ids_of(rng: &mut ChaCha8Rng, n: usize, rows: usize) -> Vec<i64> {
    (0..n).map(|_| rng.random_range(0..rows as i64)).collect()
}

/// The ids as a `[b, t]` tensor of `dtype`.
fn ids_tensor(ids: &[i64], b: usize, t: usize, dtype: DType) -> Tensor {
    Tensor::new(ids, &CPU)
        .unwrap()
        .reshape((b, t))
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn bits_f32(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

/// The bits of a tensor of any float dtype, as `u16` or `u32` words.
fn bits(t: &Tensor) -> Vec<u32> {
    let flat = t.flatten_all().unwrap();
    match t.dtype() {
        DType::F32 => bits_f32(t),
        DType::F16 => flat
            .to_vec1::<half::f16>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits().into())
            .collect(),
        DType::BF16 => flat
            .to_vec1::<half::bf16>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits().into())
            .collect(),
        other => panic!("no bits for {other:?}"),
    }
}

#[test]
fn forward_equals_candle_nn_bit_for_bit() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for case in 0..60 {
        // u8 ids keep below 255, which candle reads as "no row".
        let rows = rng.random_range(1..=200);
        let dim = rng.random_range(1..=19);
        let (b, t) = (rng.random_range(0..=5), rng.random_range(1..=7));
        let dtype = [DType::F32, DType::F16, DType::BF16][case % 3];
        let id_dtype = [DType::U8, DType::U32, DType::I64, DType::I32, DType::I16][case % 5];
        let weight = Tensor::from_vec(table(&mut rng, rows, dim), (rows, dim), &CPU)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let ids = ids_tensor(&ids_of(&mut rng, b * t, rows), b, t, id_dtype);

        let ours = Embedding::new(weight.clone(), dim).forward(&ids).unwrap();
        // candle's index_select takes u8, u32 and i64 ids only: the others
        // are compared as i64.
        let candle_ids = match id_dtype {
            DType::I32 | DType::I16 => ids.to_dtype(DType::I64).unwrap(),
            _ => ids,
        };
        let theirs = candle_nn::Embedding::new(weight, dim)
            .forward(&candle_ids)
            .unwrap();
        assert_eq!(ours.dims(), [b, t, dim], "case {case}");
        assert_eq!(ours.dtype(), dtype, "case {case}");
        assert_eq!(
            bits(&ours),
            bits(&theirs),
            "case {case}: {dtype:?} {id_dtype:?}"
        );
    }
}

/// Ids of shape [], [n] and [a, b, c] keep their shape in front of `dim`.
#[test]
fn ids_of_any_rank() {
    let weight = Tensor::arange(0f32, 20., &CPU)
        .unwrap()
        .reshape((5, 4))
        .unwrap();
    let emb = Embedding::from_tensor(weight.clone()).unwrap();
    let reference = candle_nn::Embedding::new(weight, 4);
    for ids in [
        Tensor::new(3u32, &CPU).unwrap(),
        Tensor::new(&[4u32, 0, 4], &CPU).unwrap(),
        Tensor::new(&[[[1i64], [2]], [[3], [0]]], &CPU).unwrap(),
    ] {
        let ours = emb.forward(&ids).unwrap();
        let theirs = reference.forward(&ids).unwrap();
        assert_eq!(ours.dims(), theirs.dims());
        assert_eq!(bits(&ours), bits(&theirs));
    }
}

/// The table's gradient through `loss.backward()`: ours and candle's.
fn table_grad(weight: &Var, ids: &Tensor, grad_out: &Tensor, ours: bool) -> Tensor {
    let dim = weight.dim(1).unwrap();
    let out = if ours {
        Embedding::new(weight.as_tensor().clone(), dim).forward(ids)
    } else {
        candle_nn::Embedding::new(weight.as_tensor().clone(), dim).forward(ids)
    }
    .unwrap();
    // d(sum(out * g))/d(out) = g: every gradient row is different.
    let loss = (out * grad_out).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    grads.get(weight).unwrap().clone()
}

#[test]
fn gradient_equals_candle_index_add_bit_for_bit() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for case in 0..60 {
        // Few rows, many ids: rows summed from many positions.
        let rows = rng.random_range(1..=40);
        let dim = rng.random_range(1..=19);
        let (b, t) = (rng.random_range(1..=6), rng.random_range(1..=30));
        let id_dtype = [DType::U8, DType::U32, DType::I64][case % 3];
        let weight = Var::from_vec(table(&mut rng, rows, dim), (rows, dim), &CPU).unwrap();
        let ids = ids_tensor(&ids_of(&mut rng, b * t, rows), b, t, id_dtype);
        let g = Tensor::from_vec(table(&mut rng, b * t, dim), (b, t, dim), &CPU).unwrap();

        let ours = table_grad(&weight, &ids, &g, true);
        let theirs = table_grad(&weight, &ids, &g, false);
        assert_eq!(ours.dims(), [rows, dim]);
        assert_eq!(bits(&ours), bits(&theirs), "case {case}");
    }
}

/// A half table's gradient is summed in f32 and rounded once, where
/// candle's `index_add` rounds after every addition: it equals candle's f32
/// gradient rounded to the table's dtype, bit for bit.
#[test]
fn half_gradient_is_the_f32_sum_rounded_once() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for dtype in [DType::F16, DType::BF16] {
        let (rows, dim, n) = (7, 11, 64);
        let weight32 = Var::from_vec(table(&mut rng, rows, dim), (rows, dim), &CPU).unwrap();
        let weight = Var::from_tensor(&weight32.to_dtype(dtype).unwrap()).unwrap();
        let ids = ids_tensor(&ids_of(&mut rng, n, rows), 1, n, DType::U32);
        let g = Tensor::from_vec(table(&mut rng, n, dim), (1, n, dim), &CPU)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();

        let ours = table_grad(&weight, &ids, &g, true);
        let g32 = g.to_dtype(DType::F32).unwrap();
        let wide = table_grad(&weight32, &ids, &g32, false);
        assert_eq!(ours.dtype(), dtype);
        assert_eq!(
            bits(&ours),
            bits(&wide.to_dtype(dtype).unwrap()),
            "{dtype:?}"
        );
    }
}

/// A strided view of the table (a transposed `Var`) and strided ids are
/// read (candle's `index_select` refuses a strided table, so its side is
/// given a contiguous copy), and the gradient reaches the `Var`.
#[test]
fn strided_table_and_ids() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let (rows, dim) = (9, 5);
    let source = Var::from_vec(table(&mut rng, dim, rows), (dim, rows), &CPU).unwrap();
    let view = source.t().unwrap(); // [rows, dim], strides (1, rows)
    assert!(!view.is_contiguous());
    let ids = Tensor::new(&[[0u32, 8, 3], [3, 3, 1]], &CPU)
        .unwrap()
        .t()
        .unwrap();
    assert!(!ids.is_contiguous());
    let g = Tensor::from_vec(table(&mut rng, 6, dim), (3, 2, dim), &CPU).unwrap();

    let run = |ours: bool| {
        let out = if ours {
            Embedding::new(view.clone(), dim).forward(&ids)
        } else {
            candle_nn::Embedding::new(view.contiguous().unwrap(), dim).forward(&ids)
        }
        .unwrap();
        let grads = (&out * &g).unwrap().sum_all().unwrap().backward().unwrap();
        (out, grads.get(&source).unwrap().clone())
    };
    let (out, grad) = run(true);
    let (want_out, want_grad) = run(false);
    assert_eq!(bits(&out), bits(&want_out));
    assert_eq!(grad.dims(), [dim, rows]);
    assert_eq!(bits(&grad), bits(&want_grad));
}

#[test]
fn bad_ids_are_errors_that_name_them() {
    let weight = Tensor::zeros((5, 3), DType::F32, &CPU).unwrap();
    let emb = Embedding::from_tensor(weight).unwrap();
    let cases = [
        (
            Tensor::new(&[0i64, 4, -1], &CPU).unwrap(),
            "id -1 at position 2",
        ),
        (Tensor::new(&[5u32], &CPU).unwrap(), "id 5 at position 0"),
        (
            Tensor::new(&[[1u8, 2], [200, 0]], &CPU).unwrap(),
            "id 200 at position 2",
        ),
        (
            Tensor::new(&[i64::MAX], &CPU).unwrap(),
            "id 9223372036854775807",
        ),
    ];
    for (ids, message) in cases {
        let err = emb.forward(&ids).unwrap_err().to_string();
        assert!(err.contains(message), "{err}");
        assert!(err.contains("table of 5 rows"), "{err}");
    }
}

#[test]
fn unsupported_inputs_are_errors() {
    let f32_table = Tensor::zeros((5, 3), DType::F32, &CPU).unwrap();
    let emb = Embedding::from_tensor(f32_table.clone()).unwrap();

    // Float ids.
    let err = emb
        .forward(&Tensor::new(&[1f32], &CPU).unwrap())
        .unwrap_err();
    assert!(err.to_string().contains("F32"), "{err}");
    // A dtype the crate has no kernel for.
    let f64_table = Tensor::zeros((5, 3), DType::F64, &CPU).unwrap();
    assert!(Embedding::from_tensor(f64_table.clone()).is_err());
    let err = Embedding::new(f64_table, 3)
        .forward(&Tensor::new(&[1u32], &CPU).unwrap())
        .unwrap_err();
    assert!(err.to_string().contains("F64"), "{err}");
    // Not a matrix.
    let cube = Tensor::zeros((2, 5, 3), DType::F32, &CPU).unwrap();
    assert!(Embedding::from_tensor(cube).is_err());
    // A hidden_size that is not the table's width.
    let err = Embedding::new(f32_table, 4)
        .forward(&Tensor::new(&[1u32], &CPU).unwrap())
        .unwrap_err();
    assert!(err.to_string().contains("hidden_size is 4"), "{err}");
}

/// This candle has no CUDA: the device cannot be made, so a tensor on it
/// cannot reach the layer. (Where it can, the layer answers with an error
/// naming the device, before any kernel runs.)
#[test]
fn no_cuda_device_here() {
    assert!(Device::new_cuda(0).is_err());
}

/// A small next-token model: embedding, mean over the context, linear,
/// cross-entropy. `ours` picks the embedding constructor; everything else
/// is candle's.
struct Model {
    emb: Box<dyn Module>,
    out: candle_nn::Linear,
}

impl Model {
    fn new(vb: VarBuilder, vocab: usize, dim: usize, ours: bool) -> Model {
        let emb: Box<dyn Module> = if ours {
            Box::new(ek::embedding(vocab, dim, vb.pp("emb")).unwrap())
        } else {
            Box::new(candle_nn::embedding(vocab, dim, vb.pp("emb")).unwrap())
        };
        let out = candle_nn::linear(dim, vocab, vb.pp("out")).unwrap();
        Model { emb, out }
    }

    fn loss(&self, context: &Tensor, target: &Tensor) -> Tensor {
        let x = self.emb.forward(context).unwrap().mean(1).unwrap();
        let logits = self.out.forward(&x).unwrap();
        candle_nn::loss::cross_entropy(&logits, target).unwrap()
    }
}

/// Initial values for every variable of [`Model`], from a seed (candle's
/// CPU generator cannot be seeded).
fn seeded_init(seed: u64, vocab: usize, dim: usize) -> HashMap<&'static str, Tensor> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut uniform = |n: usize, bound: f32| -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-bound..bound)).collect()
    };
    let bound = 1.0 / (dim as f32).sqrt();
    HashMap::from([
        (
            "emb.weight",
            Tensor::from_vec(uniform(vocab * dim, 1.7), (vocab, dim), &CPU).unwrap(),
        ),
        (
            "out.weight",
            Tensor::from_vec(uniform(vocab * dim, bound), (vocab, dim), &CPU).unwrap(),
        ),
        (
            "out.bias",
            Tensor::from_vec(uniform(vocab, bound), vocab, &CPU).unwrap(),
        ),
    ])
}

/// Trains [`Model`] with SGD for `steps` steps and returns every step's loss.
fn train(ours: bool, steps: usize) -> Vec<f32> {
    let (vocab, dim, batch, context) = (64, 16, 32, 4);
    let varmap = VarMap::new();
    {
        let mut data = varmap.data().lock().unwrap();
        for (name, value) in seeded_init(7, vocab, dim) {
            data.insert(name.to_string(), Var::from_tensor(&value).unwrap());
        }
    }
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &CPU);
    let model = Model::new(vb, vocab, dim, ours);
    let mut sgd = candle_nn::SGD::new(varmap.all_vars(), 0.5).unwrap();

    // The task: a context holds a token `a` twice among noise, and the
    // target is `a + 1` (mod vocab).
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let mut losses = Vec::with_capacity(steps);
    for _ in 0..steps {
        let mut ids = ids_of(&mut rng, batch * context, vocab);
        let mut targets = Vec::with_capacity(batch);
        for c in ids.chunks_mut(context) {
            c[1] = c[0];
            targets.push((c[0] as u32 + 1) % vocab as u32);
        }
        let context = ids_tensor(&ids, batch, context, DType::U32);
        let targets = Tensor::new(targets, &CPU).unwrap();
        let loss = model.loss(&context, &targets);
        sgd.backward_step(&loss).unwrap();
        losses.push(loss.to_scalar::<f32>().unwrap());
    }
    losses
}

/// The same model trained with candle's embedding and with ours, from the
/// same initial values on the same batches: the forward copies the same
/// bits and the gradient sums in the same order, so the loss curves are
/// the same bits too (tolerance 0, measured).
#[test]
fn training_swap_gives_the_same_loss_curve() {
    let steps = 300;
    let theirs = train(false, steps);
    let ours = train(true, steps);
    assert!(
        ours[steps - 1] < ours[0] * 0.9,
        "the model did not learn: {} -> {}",
        ours[0],
        ours[steps - 1]
    );
    for (step, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "step {step}: {a} vs {b}");
    }
}

/// A checkpoint written from `candle_nn::embedding`'s `VarMap` loads
/// through both constructors under the same names and gives the same
/// embeddings.
#[test]
fn checkpoint_loads_through_both_layers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &CPU);
    let written = candle_nn::embedding(50, 12, vb.pp("model").pp("tok")).unwrap();
    varmap.save(&path).unwrap();

    let tensors = candle_core::safetensors::load(&path, &CPU).unwrap();
    assert!(tensors.contains_key("model.tok.weight"));
    let vb = VarBuilder::from_tensors(tensors, DType::F32, &CPU);
    let theirs = candle_nn::embedding(50, 12, vb.pp("model").pp("tok")).unwrap();
    let ours = ek::embedding(50, 12, vb.pp("model").pp("tok")).unwrap();

    let ids = Tensor::new(&[[49i64, 0, 7], [7, 7, 1]], &CPU).unwrap();
    let want = written.forward(&ids).unwrap();
    assert_eq!(bits(&theirs.forward(&ids).unwrap()), bits(&want));
    assert_eq!(bits(&ours.forward(&ids).unwrap()), bits(&want));
    // The wrong shape is candle's error, as for candle_nn::embedding.
    assert!(ek::embedding(51, 12, vb.pp("model").pp("tok")).is_err());
}

/// `embedding` draws its initial table like `candle_nn::embedding`: a
/// normal distribution of mean 0 and deviation 1 (candle's CPU generator
/// cannot be seeded, so the test checks the moments).
#[test]
fn embedding_initialises_like_candle_nn() {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &CPU);
    let emb = ek::embedding(400, 50, vb).unwrap();
    let w = emb.embeddings();
    assert_eq!(w.dims(), [400, 50]);
    assert_eq!(emb.hidden_size(), 50);
    let mean = w.mean_all().unwrap().to_scalar::<f32>().unwrap();
    let var = w
        .sqr()
        .unwrap()
        .mean_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(mean.abs() < 0.03, "mean {mean}");
    assert!((var - 1.0).abs() < 0.05, "variance {var}");
}

/// candle's own composition of a bag layer, one bag at a time: the bag's
/// kept ids (padding left out) through `index_select`, times their
/// weights, then `sum`, `mean` or `max` over the bag; an empty bag is
/// zeros.
fn candle_bags(
    weight: &Tensor,
    ids: &[i64],
    starts: &[usize],
    mode: Mode,
    padding_idx: Option<usize>,
    weights: Option<&[f32]>,
) -> Tensor {
    let dim = weight.dim(1).unwrap();
    let mut pooled = Vec::new();
    for w in starts.windows(2) {
        let kept: Vec<usize> = (w[0]..w[1])
            .filter(|&p| Some(ids[p] as usize) != padding_idx)
            .collect();
        if kept.is_empty() {
            pooled.push(Tensor::zeros(dim, DType::F32, &CPU).unwrap());
            continue;
        }
        let bag_ids: Vec<i64> = kept.iter().map(|&p| ids[p]).collect();
        let n = bag_ids.len();
        let mut rows = weight
            .index_select(&Tensor::new(bag_ids, &CPU).unwrap(), 0)
            .unwrap();
        if let Some(weights) = weights {
            let scale: Vec<f32> = kept.iter().map(|&p| weights[p]).collect();
            let scale = Tensor::from_vec(scale, (n, 1), &CPU).unwrap();
            rows = rows.broadcast_mul(&scale).unwrap();
        }
        pooled.push(
            match mode {
                Mode::Sum => rows.sum(0),
                Mode::Mean => rows.mean(0),
                Mode::Max => rows.max(0),
            }
            .unwrap(),
        );
    }
    Tensor::stack(&pooled, 0).unwrap()
}

/// The largest difference between two f32 tensors of the same shape.
fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// Random bags against candle's composition, forward and gradient, in
/// every mode, with offsets (empty bags included), per-sample weights (sum)
/// and padding_idx. Max bags hold distinct ids of a table without repeated
/// values: candle's `max` backward gives a tied maximum's gradient to every
/// position that holds it, the crate (and PyTorch) to the first. Mean
/// and the weighted sum differ from candle's in their last bits: both
/// within 1e-5 (measured: the forward 2.4e-7, the gradient 9.5e-7).
#[test]
fn bags_equal_candle_compositions() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let (mut worst_forward, mut worst_grad) = (0f32, 0f32);
    for case in 0..45 {
        let mode = [Mode::Sum, Mode::Mean, Mode::Max][case % 3];
        let rows = rng.random_range(8..=40);
        let dim = rng.random_range(1..=19);
        let num_bags = rng.random_range(1..=6);
        let mut starts = vec![0];
        let mut ids = Vec::new();
        for _ in 0..num_bags {
            let len = rng.random_range(0..=7);
            let mut bag: Vec<i64> = Vec::new();
            while bag.len() < len {
                let id = rng.random_range(0..rows as i64);
                if mode != Mode::Max || !bag.contains(&id) {
                    bag.push(id);
                }
            }
            ids.extend(bag);
            starts.push(ids.len());
        }
        let padding_idx = (case % 2 == 1).then(|| ids.first().map_or(0, |&id| id as usize));
        let weights: Option<Vec<f32>> = (mode == Mode::Sum && case % 4 == 0).then(|| {
            (0..ids.len())
                .map(|_| rng.random_range(-2.0..2.0))
                .collect()
        });

        // Max compares values: a table without repeats, so no column ties.
        let values = match mode {
            Mode::Max => (0..rows * dim)
                .map(|_| rng.random_range(-4.0..4.0))
                .collect(),
            _ => table(&mut rng, rows, dim),
        };
        let weight = Var::from_vec(values, (rows, dim), &CPU).unwrap();
        let g = Tensor::from_vec(table(&mut rng, num_bags, dim), (num_bags, dim), &CPU).unwrap();
        let id_tensor = Tensor::new(ids.as_slice(), &CPU).unwrap();
        let offsets: Vec<u32> = starts[..num_bags].iter().map(|&s| s as u32).collect();
        let offsets = Tensor::new(offsets, &CPU).unwrap();
        let psw = weights
            .as_ref()
            .map(|w| Tensor::new(w.as_slice(), &CPU).unwrap());

        let layer = ek::EmbeddingBag::from_tensor(weight.as_tensor().clone(), mode)
            .unwrap()
            .with_padding_idx(padding_idx);
        let ours = layer
            .forward_offsets(&id_tensor, &offsets, false, psw.as_ref())
            .unwrap();
        let theirs = candle_bags(
            &weight,
            &ids,
            &starts,
            mode,
            padding_idx,
            weights.as_deref(),
        );
        worst_forward = worst_forward.max(max_diff(&ours, &theirs));

        let grad = |out: &Tensor| {
            let grads = (out * &g).unwrap().sum_all().unwrap().backward().unwrap();
            // candle's composition of bags that are all empty never reads
            // the table: no gradient, which is zeros.
            match grads.get(&weight) {
                Some(g) => g.clone(),
                None => weight.zeros_like().unwrap(),
            }
        };
        let (ours_grad, theirs_grad) = (grad(&ours), grad(&theirs));
        worst_grad = worst_grad.max(max_diff(&ours_grad, &theirs_grad));
        if mode == Mode::Max || (mode == Mode::Sum && weights.is_none()) {
            // Copies and sums in position order: the same values (a zero's
            // sign aside).
            assert_eq!(
                ours.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                theirs.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                "case {case} {mode:?}"
            );
        }
    }
    eprintln!("bags: forward within {worst_forward:e}, gradient within {worst_grad:e}");
    assert!(worst_forward <= 1e-5, "forward {worst_forward}");
    assert!(worst_grad <= 1e-5, "gradient {worst_grad}");
}

/// Fixed-length bags (the `Module` form, `[bags, len]` ids) against
/// candle's embedding then `sum`, `mean` or `max` over the bag.
#[test]
fn fixed_bags_equal_embedding_then_pool() {
    let mut rng = ChaCha8Rng::seed_from_u64(10);
    let (rows, dim, b, l) = (30, 13, 5, 4);
    let weight = Tensor::from_vec(table(&mut rng, rows, dim), (rows, dim), &CPU).unwrap();
    let ids = ids_tensor(&ids_of(&mut rng, b * l, rows), b, l, DType::I64);
    let looked_up = candle_nn::Embedding::new(weight.clone(), dim)
        .forward(&ids)
        .unwrap();
    for mode in [Mode::Sum, Mode::Mean, Mode::Max] {
        let ours = ek::EmbeddingBag::from_tensor(weight.clone(), mode)
            .unwrap()
            .forward(&ids)
            .unwrap();
        let theirs = match mode {
            Mode::Sum => looked_up.sum(1),
            Mode::Mean => looked_up.mean(1),
            Mode::Max => looked_up.max(1),
        }
        .unwrap();
        assert_eq!(ours.dims(), [b, dim]);
        assert!(max_diff(&ours, &theirs) <= 1e-6, "{mode:?}");
    }
}

#[test]
fn bag_errors_are_candle_errors() {
    let weight = Tensor::zeros((5, 3), DType::F32, &CPU).unwrap();
    let layer = ek::EmbeddingBag::from_tensor(weight.clone(), Mode::Mean).unwrap();
    let ids = Tensor::new(&[1u32, 2, 3], &CPU).unwrap();
    let offsets = |o: &[i64]| Tensor::new(o, &CPU).unwrap();
    let err = |r: candle_core::Result<Tensor>| r.unwrap_err().to_string();

    assert!(err(layer.forward_offsets(&ids, &offsets(&[1]), false, None)).contains("offset"));
    assert!(err(layer.forward_offsets(&ids, &offsets(&[0, 2, 1]), false, None)).contains("offset"));
    let bad = Tensor::new(&[1u32, 9, 3], &CPU).unwrap();
    assert!(
        err(layer.forward_offsets(&bad, &offsets(&[0]), false, None))
            .contains("id 9 at position 1")
    );
    // Weights need sum mode.
    let w = Tensor::new(&[1f32, 1., 1.], &CPU).unwrap();
    assert!(
        layer
            .forward_offsets(&ids, &offsets(&[0]), false, Some(&w))
            .is_err()
    );
    // A padding_idx past the table.
    let padded = layer.clone().with_padding_idx(Some(5));
    assert!(
        padded
            .forward_offsets(&ids, &offsets(&[0]), false, None)
            .is_err()
    );
    // Half tables have no bag kernel here yet.
    let half = weight.to_dtype(DType::F16).unwrap();
    assert!(ek::EmbeddingBag::from_tensor(half, Mode::Sum).is_err());
}
