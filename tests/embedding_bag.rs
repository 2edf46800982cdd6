//! The bag layer (`EmbeddingBag`): its options, its gradients against the
//! bag-matrix reference and finite differences, the fused row-wise Adagrad
//! step, and errors that change nothing.

use crate::common::{
    Row, SplitMix, assert_error, assert_gradient, bad_id, bits, central_differences, invalid,
    mismatch, not_whole_rows, pools, row, run_table, weighted_sum,
};
use embedding_kernels::Pooling;
use embedding_kernels::{
    Bags, EmbeddingBag, EmbeddingBagOptions, EmbeddingError, Gradient, Mode, Operand, Parallelism,
    RowWiseAdagrad, Sgd, bag_sparse_step_with, reference,
};

const ROWS: usize = 40;
const DIM: usize = 36;

fn table(seed: u64) -> Vec<f32> {
    SplitMix(seed).values(ROWS * DIM)
}

fn layer(mode: Mode, options: EmbeddingBagOptions) -> EmbeddingBag {
    let options = EmbeddingBagOptions { mode, ..options };
    EmbeddingBag::from_pretrained(table(1), DIM, false, options).unwrap()
}

/// Ids with repeats and offsets with an empty bag in the middle.
fn batch() -> (Vec<i64>, Vec<i64>) {
    let ids = vec![3, 7, 3, 0, 12, 12, 12, 5, 39, 3, 7, 22, 0, 1];
    let offsets = vec![0, 4, 4, 8, 9];
    (ids, offsets)
}

fn dense(g: Gradient) -> Vec<f32> {
    match g {
        Gradient::Dense(d) => d,
        Gradient::Sparse(s) => s.to_dense().unwrap(),
    }
}

#[test]
fn sum_and_max_equal_the_reference_and_mean_is_sum_over_count() {
    let (ids, offsets) = batch();
    for padding in [None, Some(12i64)] {
        let options = EmbeddingBagOptions {
            padding_idx: padding,
            ..EmbeddingBagOptions::default()
        };
        let mut sum = layer(Mode::Sum, options.clone());
        let bags = sum.offsets(&offsets, ids.len()).unwrap();
        let pooling = Pooling {
            mode: Mode::Sum,
            padding_idx: padding.map(|p| p as usize),
            ..Pooling::default()
        };
        let got = sum.forward(&ids, &bags, None).unwrap();
        assert_eq!(got.shape, [5, DIM]);
        let mut want = vec![f32::NAN; 5 * DIM];
        reference::bag_forward(&table(1), DIM, &ids, &bags, &pooling, &mut want, &mut []).unwrap();
        assert_eq!(bits(&got.values), bits(&want));
        // Bag 1 is empty: +0.0 everywhere.
        assert!(got.values[DIM..2 * DIM].iter().all(|x| x.to_bits() == 0));

        let mut mean = layer(Mode::Mean, options.clone());
        let got_mean = mean.forward(&ids, &bags, None).unwrap();
        for b in 0..5 {
            let n = bags
                .bag(b)
                .unwrap()
                .filter(|&p| Some(ids[p]) != padding)
                .count();
            for j in 0..DIM {
                let want = if n == 0 {
                    0.0
                } else {
                    got.values[b * DIM + j] / n as f32
                };
                assert_eq!(
                    got_mean.values[b * DIM + j].to_bits(),
                    want.to_bits(),
                    "bag {b}"
                );
            }
        }

        let mut max = layer(Mode::Max, options);
        let got_max = max.forward(&ids, &bags, None).unwrap();
        let pooling = Pooling {
            mode: Mode::Max,
            ..pooling
        };
        let mut want_idx = vec![0i64; 5 * DIM];
        reference::bag_forward(
            &table(1),
            DIM,
            &ids,
            &bags,
            &pooling,
            &mut want,
            &mut want_idx,
        )
        .unwrap();
        assert_eq!(bits(&got_max.values), bits(&want));
        assert_eq!(got_max.max_indices.as_deref(), Some(&want_idx[..]));
        assert!(want_idx[DIM..2 * DIM].iter().all(|&i| i == -1));
    }
}

#[test]
fn include_last_offset_and_fixed_bags() {
    let ids: Vec<u32> = vec![1, 2, 3, 4, 5, 6];
    let options = EmbeddingBagOptions {
        include_last_offset: true,
        ..EmbeddingBagOptions::default()
    };
    let mut bag = layer(Mode::Sum, options);
    // Bags [0, 2) and [2, 5); id 6 at position 5 is in no bag.
    let bags = bag.offsets(&[0u32, 2, 5], ids.len()).unwrap();
    assert_eq!(bags.len(), 2);
    let out = bag.forward(&ids, &bags, None).unwrap();
    let fixed = Bags::fixed(3, 2).unwrap();
    let pairs = bag.forward(&ids, &fixed, None).unwrap();
    assert_eq!(pairs.shape, [3, DIM]);
    assert_eq!(bits(&out.values[..DIM]), bits(&pairs.values[..DIM]));
    assert_eq!(
        bag.offsets(&[0u32; 0], ids.len()).unwrap_err(),
        EmbeddingError::NoOffsets
    );
}

/// Every backward path of every mode equals the reference (sum: bit for
/// bit; mean: bit for bit too, since both scale each gradient by the same
/// `1/n` before summing), on every pool, dense and sparse alike.
#[test]
fn gradients_equal_the_reference_on_every_pool() {
    let (ids, offsets) = batch();
    let weights: Vec<f32> = (0..ids.len()).map(|p| 0.25 + p as f32 * 0.5).collect();
    let g = SplitMix(5).values(5 * DIM);
    for (mode, w) in [
        (Mode::Sum, None),
        (Mode::Sum, Some(&weights[..])),
        (Mode::Mean, None),
    ] {
        for by_freq in [false, true] {
            let options = EmbeddingBagOptions {
                padding_idx: Some(0),
                scale_grad_by_freq: by_freq,
                ..EmbeddingBagOptions::default()
            };
            let pooling = Pooling {
                mode,
                per_sample_weights: w,
                padding_idx: Some(0),
                scale_grad_by_freq: by_freq,
            };
            let bag = layer(mode, options.clone());
            let bags = bag.offsets(&offsets, ids.len()).unwrap();
            let mut want = vec![0.0; ROWS * DIM];
            reference::bag_backward(&g, DIM, &ids, &bags, &pooling, &mut want).unwrap();
            assert!(want[..DIM].iter().all(|&x| x == 0.0), "padding row");
            for pool in pools() {
                for par in [Parallelism::Serial, Parallelism::Rayon] {
                    let bag = layer(mode, options.clone()).with_parallelism(par);
                    let got = pool
                        .install(|| bag.backward(&g, &ids, &bags, w, None))
                        .unwrap();
                    assert_eq!(bits(&dense(got)), bits(&want), "{mode} {by_freq} {par:?}");
                    let sparse = EmbeddingBagOptions {
                        sparse: true,
                        ..options.clone()
                    };
                    let bag = layer(mode, sparse).with_parallelism(par);
                    let got = pool
                        .install(|| bag.backward(&g, &ids, &bags, w, None))
                        .unwrap();
                    match got {
                        Gradient::Sparse(s) => {
                            assert_eq!(s.indices(), [1, 3, 5, 7, 12, 22, 39]);
                            assert_eq!(bits(&s.to_dense().unwrap()), bits(&want));
                        }
                        Gradient::Dense(_) => panic!("sparse option gave a dense gradient"),
                    }
                }
            }
        }
    }
}

#[test]
fn max_backward_routes_each_column_to_its_winner() {
    let (ids, offsets) = batch();
    let mut bag = layer(Mode::Max, EmbeddingBagOptions::default());
    let bags = bag.offsets(&offsets, ids.len()).unwrap();
    let out = bag.forward(&ids, &bags, None).unwrap();
    let idx = out.max_indices.unwrap();
    let g = SplitMix(9).values(5 * DIM);
    let mut want = vec![0.0f32; ROWS * DIM];
    for b in 0..5 {
        for j in 0..DIM {
            let i = idx[b * DIM + j];
            if i >= 0 {
                want[i as usize * DIM + j] += g[b * DIM + j];
            }
        }
    }
    let got = dense(bag.backward(&g, &ids, &bags, None, Some(&idx)).unwrap());
    assert_eq!(bits(&got), bits(&want));
    assert_eq!(
        bag.backward(&g, &ids, &bags, None, None).unwrap_err(),
        EmbeddingError::MaxNeedsIndices
    );
    let sparse = EmbeddingBagOptions {
        sparse: true,
        ..EmbeddingBagOptions::default()
    };
    let bag = layer(Mode::Max, sparse);
    let s = dense(bag.backward(&g, &ids, &bags, None, Some(&idx)).unwrap());
    assert_eq!(bits(&s), bits(&want));
}

/// `L = Σ R ⊙ forward(table)`, in f64: linear in the table for sum and mean.
fn loss(bag: &EmbeddingBag, ids: &[i64], bags: &Bags, w: Option<&[f32]>, r: &[f32]) -> f64 {
    let mut bag = bag.clone();
    weighted_sum(&bag.forward(ids, bags, w).unwrap().values, r)
}

#[test]
fn sum_mean_and_weighted_backward_match_finite_differences() {
    let (ids, offsets) = batch();
    let weights: Vec<f32> = (0..ids.len()).map(|p| 1.5 - p as f32 * 0.125).collect();
    let r = SplitMix(11).values(5 * DIM);
    for (mode, w) in [
        (Mode::Sum, None),
        (Mode::Sum, Some(&weights[..])),
        (Mode::Mean, None),
    ] {
        let bag = layer(mode, EmbeddingBagOptions::default());
        let bags = bag.offsets(&offsets, ids.len()).unwrap();
        let grad = dense(bag.backward(&r, &ids, &bags, w, None).unwrap());
        let numeric = central_differences(
            &mut bag.clone(),
            |b| b.weight_mut(),
            (0..ROWS * DIM).step_by(7),
            0.5,
            |b| loss(b, &ids, &bags, w, &r),
        );
        assert_gradient(&format!("{mode}"), &grad, &numeric, |_, _, fd| {
            1e-4 * (1.0 + fd.abs())
        });
    }
}

/// The fused backward + row-wise Adagrad step equals the sparse gradient
/// applied by hand with FBGEMM's rule, bit for bit, on every pool, through
/// the layer and through the free step on a plain table; the padding row
/// and untouched rows keep their bits.
#[test]
fn fused_rowwise_adagrad_step_equals_the_rule_on_the_sparse_gradient() {
    let (ids, offsets) = batch();
    let g = SplitMix(13).values(5 * DIM);
    for mode in [Mode::Sum, Mode::Mean] {
        let options = EmbeddingBagOptions {
            padding_idx: Some(12),
            sparse: true,
            ..EmbeddingBagOptions::default()
        };
        let bag = layer(mode, options.clone());
        let bags = bag.offsets(&offsets, ids.len()).unwrap();
        let Gradient::Sparse(grad) = bag.backward(&g, &ids, &bags, None, None).unwrap() else {
            panic!("sparse expected");
        };
        let mut want = table(1);
        let mut state = vec![0.0f32; ROWS];
        for (k, &r) in grad.indices().iter().enumerate() {
            let row = grad.row(k).unwrap();
            state[r] += row.iter().map(|x| x * x).sum::<f32>() / DIM as f32;
            let step = 0.1 / (state[r].sqrt() + 1e-8);
            for (w, x) in want[r * DIM..(r + 1) * DIM].iter_mut().zip(row) {
                *w -= step * x;
            }
        }
        let pooling = Pooling {
            mode,
            per_sample_weights: None,
            padding_idx: Some(12),
            scale_grad_by_freq: false,
        };
        let free = |par: Parallelism| {
            let (mut plain, mut opt) = (table(1), RowWiseAdagrad::new(0.1));
            bag_sparse_step_with(par, &mut plain, DIM, &g, &ids, &bags, &pooling, &mut opt)
                .unwrap();
            (plain, opt)
        };
        let (plain, opt) = free(Parallelism::Serial);
        assert_eq!(bits(&plain), bits(&want), "{mode} free, serial");
        assert_eq!(bits(opt.state()), bits(&state));
        for pool in pools() {
            let mut bag = layer(mode, options.clone()).with_parallelism(Parallelism::Rayon);
            let mut opt = RowWiseAdagrad::new(0.1);
            pool.install(|| bag.sparse_step(&g, &ids, &bags, None, &mut opt))
                .unwrap();
            assert_eq!(bits(bag.table().weight()), bits(&want), "{mode}");
            assert_eq!(bits(opt.state()), bits(&state));
            let (plain, opt) = pool.install(|| free(Parallelism::Rayon));
            assert_eq!(bits(&plain), bits(&want), "{mode} free");
            assert_eq!(bits(opt.state()), bits(&state));
        }
        assert_eq!(
            bits(&want[12 * DIM..13 * DIM]),
            bits(&table(1)[12 * DIM..13 * DIM])
        );
    }
}

/// The free bag step refuses a bad table, a bad id and max mode, with the
/// table and the optimiser as they were.
#[test]
fn free_bag_step_errors_change_nothing() {
    let (mut ids, offsets) = batch();
    let g = SplitMix(14).values(5 * DIM);
    let bags = layer(Mode::Sum, EmbeddingBagOptions::default())
        .offsets(&offsets, ids.len())
        .unwrap();
    let pooling = |mode| Pooling {
        mode,
        per_sample_weights: None,
        padding_idx: None,
        scale_grad_by_freq: false,
    };
    let mut opt = RowWiseAdagrad::new(0.1);
    let step = |t: &mut [f32], ids: &[i64], mode, opt: &mut RowWiseAdagrad| {
        let par = Parallelism::Serial;
        bag_sparse_step_with(par, t, DIM, &g, ids, &bags, &pooling(mode), opt)
    };
    let mut short = table(1)[1..].to_vec();
    let got = step(&mut short, &ids, Mode::Sum, &mut opt);
    assert_error(
        "table",
        got,
        &not_whole_rows(Operand::Table, ROWS * DIM - 1, DIM),
    );
    let mut plain = table(1);
    let got = step(&mut plain, &ids, Mode::Max, &mut opt);
    assert_error("max", got, &EmbeddingError::MaxNeedsIndices);
    ids[9] = ROWS as i64;
    let got = step(&mut plain, &ids, Mode::Sum, &mut opt);
    assert_error("id", got, &bad_id(9, ROWS as i128, ROWS));
    assert_eq!(bits(&plain), bits(&table(1)));
    assert!(opt.state().is_empty());
}

/// One bad call of the bag layer, one variant per entry point. The layer
/// is [`layer`] in the given mode; the ids are [`batch`]'s with one
/// changed (position, id) and the bags are its offsets.
enum Call {
    /// `forward_into` with this `max_norm`, an output and max_indices of
    /// these lengths (the output a NaN canary).
    ForwardInto {
        mode: Mode,
        max_norm: Option<f32>,
        id: (usize, i64),
        out_len: usize,
        indices_len: usize,
    },
    /// `forward` with a per-sample weight of 1 for each id.
    ForwardWeighted(Mode),
    /// `offsets` of these offsets over the batch's ids.
    Offsets(Vec<i64>),
    /// `with_options(4, 2, options)`.
    WithOptions(EmbeddingBagOptions),
}

impl Call {
    /// Fails with `want`, and the table (and any output) is left as it was.
    fn run(&self, want: &EmbeddingError) {
        let (mut ids, offsets) = batch();
        let build = |mode, max_norm| {
            let options = EmbeddingBagOptions {
                max_norm,
                ..EmbeddingBagOptions::default()
            };
            layer(mode, options)
        };
        let untouched = |what: &str, bag: &EmbeddingBag| {
            let weight = bag.table().weight();
            assert_eq!(bits(weight), bits(&table(1)), "{what} changed the table");
        };
        match self {
            Call::ForwardInto {
                mode,
                max_norm,
                id: (position, id),
                out_len,
                indices_len,
            } => {
                let mut bag = build(*mode, *max_norm);
                let bags = bag.offsets(&offsets, ids.len()).unwrap();
                ids[*position] = *id;
                let mut out = vec![f32::NAN; *out_len];
                let mut indices = vec![-1i64; *indices_len];
                let got = bag.forward_into(&ids, &bags, None, &mut out, &mut indices);
                assert_error("forward_into", got, want);
                untouched("forward_into", &bag);
                assert!(out.iter().all(|x| x.is_nan()), "output written");
                assert!(indices.iter().all(|&i| i == -1), "max_indices written");
            }
            Call::ForwardWeighted(mode) => {
                let mut bag = build(*mode, None);
                let bags = bag.offsets(&offsets, ids.len()).unwrap();
                let w = vec![1.0f32; ids.len()];
                let got = bag.forward(&ids, &bags, Some(&w));
                assert_error("forward", got.map(drop), want);
                untouched("forward", &bag);
            }
            Call::Offsets(bad) => {
                let bag = build(Mode::Sum, None);
                assert_error("offsets", bag.offsets(bad, ids.len()).map(drop), want);
            }
            Call::WithOptions(options) => {
                let got = EmbeddingBag::with_options(4, 2, options.clone());
                assert_error("with_options", got.map(drop), want);
            }
        }
    }
}

/// The layer's own errors (the kernels' are in `tests/bag.rs`): a bad id
/// before `max_norm` touches a row, buffers before ids, and the options.
fn layer_errors() -> Vec<Row<Call>> {
    let bags = 5 * DIM;
    let forward_into = |mode, max_norm, id, out_len, indices_len| Call::ForwardInto {
        mode,
        max_norm,
        id,
        out_len,
        indices_len,
    };
    vec![
        row(
            "id -2, mean with max_norm",
            forward_into(Mode::Mean, Some(0.5), (10, -2), bags, 0),
            bad_id(10, -2, ROWS),
        ),
        row(
            "weights in mean mode",
            Call::ForwardWeighted(Mode::Mean),
            EmbeddingError::PerSampleWeightsNeedSum { mode: Mode::Mean },
        ),
        row(
            "offsets 0, 5, 3",
            Call::Offsets(vec![0, 5, 3]),
            EmbeddingError::OffsetsDecrease {
                position: 2,
                value: 3,
                previous: 5,
            },
        ),
        row(
            "scale_grad_by_freq in max mode",
            Call::WithOptions(EmbeddingBagOptions {
                mode: Mode::Max,
                scale_grad_by_freq: true,
                ..EmbeddingBagOptions::default()
            }),
            invalid("scale_grad_by_freq", true),
        ),
        // Buffers before ids: id 1000 in every call.
        row(
            "output one short, id 1000",
            forward_into(Mode::Max, None, (2, 1000), bags - 1, bags),
            mismatch(Operand::Output, bags, bags - 1),
        ),
        row(
            "max_indices one short, id 1000",
            forward_into(Mode::Max, None, (2, 1000), bags, bags - 1),
            mismatch(Operand::MaxIndices, bags, bags - 1),
        ),
        row(
            "id 1000",
            forward_into(Mode::Max, None, (2, 1000), bags, bags),
            bad_id(2, 1000, ROWS),
        ),
    ]
}

#[test]
fn bad_calls_change_nothing() {
    run_table(&layer_errors(), Call::run);
}

/// A frozen layer takes a step and does not move.
#[test]
fn frozen_layers_do_not_move() {
    let (ids, offsets) = batch();
    let options = EmbeddingBagOptions {
        mode: Mode::Sum,
        ..EmbeddingBagOptions::default()
    };
    let mut frozen = EmbeddingBag::from_pretrained(table(1), DIM, true, options).unwrap();
    let bags = frozen.offsets(&offsets, ids.len()).unwrap();
    let g = vec![1.0f32; 5 * DIM];
    frozen
        .sparse_step(&g, &ids, &bags, None, &mut Sgd::new(1.0))
        .unwrap();
    assert_eq!(bits(frozen.table().weight()), bits(&table(1)));
}

/// A 10 MiB table takes the grouped dense sweep; it must give the bits of
/// the sparse (coalesced) gradient, which takes neither that sweep nor the
/// in-cache scatter, for every mode with a dense backward.
#[test]
fn large_table_dense_backward_equals_the_sparse_one() {
    let (rows, dim) = (20_000, 128);
    let table = SplitMix(2).values(rows * dim);
    let ids: Vec<u32> = (0..4_096u32)
        .map(|p| (p * 7919 + p / 3) % rows as u32)
        .collect();
    let bags = Bags::fixed(256, 16).unwrap();
    let g = SplitMix(4).values(256 * dim);
    let weights: Vec<f32> = (0..ids.len()).map(|p| 0.5 + (p % 5) as f32).collect();
    for (mode, w) in [
        (Mode::Sum, None),
        (Mode::Sum, Some(&weights[..])),
        (Mode::Mean, None),
    ] {
        let options = EmbeddingBagOptions {
            mode,
            padding_idx: Some(i64::from(ids[3])),
            ..EmbeddingBagOptions::default()
        };
        let bag = EmbeddingBag::from_pretrained(table.clone(), dim, false, options).unwrap();
        let sparse = bag.backward_sparse(&g, &ids, &bags, w, None).unwrap();
        for pool in pools() {
            let bag = bag.clone().with_parallelism(Parallelism::Rayon);
            let mut dense = vec![f32::NAN; rows * dim];
            pool.install(|| bag.backward_dense_into(&g, &ids, &bags, w, None, &mut dense))
                .unwrap();
            assert_eq!(bits(&dense), bits(&sparse.to_dense().unwrap()), "{mode}");
        }
    }
}

#[test]
fn a_bag_layer_can_wrap_and_give_back_an_embedding() {
    let emb = embedding_kernels::Embedding::from_pretrained(table(1), DIM, false).unwrap();
    let mut bag = EmbeddingBag::from_embedding(emb, Mode::Max, false).unwrap();
    let out = bag
        .forward(&[1u32, 2], &Bags::fixed(1, 2).unwrap(), None)
        .unwrap();
    assert!(out.max_indices.is_some());
    let emb = bag.into_table();
    assert_eq!(bits(emb.weight()), bits(&table(1)));
    let options = embedding_kernels::EmbeddingOptions {
        scale_grad_by_freq: true,
        ..embedding_kernels::EmbeddingOptions::default()
    };
    let emb =
        embedding_kernels::Embedding::from_pretrained_with_options(table(1), DIM, false, options)
            .unwrap();
    assert!(EmbeddingBag::from_embedding(emb, Mode::Max, false).is_err());
}
