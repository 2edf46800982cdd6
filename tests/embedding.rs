//! The layer (`Embedding`) against the one-hot reference and against
//! finite differences: every backward path, every option, every pool size.

use crate::common::{
    Pattern, Row, SplitMix, assert_close, assert_error, bad_id, bits, convert, draw_ids, invalid,
    mismatch, not_whole_rows, numeric_gradient, pools, row, run_table, values, weighted_sum,
};
use embedding_kernels::{
    Adagrad, Embedding, EmbeddingError, EmbeddingOptions, Gradient, Operand, Parallelism,
    RowWiseAdagrad, Sgd, SparseGrad, reference,
};
use embedding_kernels::{dense_backward_with, sparse_backward_with, sparse_step_with};
use proptest::prelude::*;

/// A case: a table, a batch of ids and options.
#[derive(Clone, Debug)]
struct Case {
    rows: usize,
    dim: usize,
    ids: Vec<u64>,
    padding: Option<usize>,
    by_freq: bool,
    seed: u64,
}

fn case(
    rows: std::ops::RangeInclusive<usize>,
    dim: std::ops::RangeInclusive<usize>,
    n: std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = Case> {
    let pattern = prop_oneof![
        Just(Pattern::Uniform),
        Just(Pattern::FewDistinct),
        Just(Pattern::Hot)
    ];
    (
        rows,
        dim,
        n,
        pattern,
        any::<u64>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(rows, dim, n, pattern, seed, pad, by_freq)| {
            let ids = draw_ids(rows, n, pattern, seed);
            // Half the cases pad with an id the batch uses, if it has one.
            let padding = pad.then(|| ids.first().map_or(0, |&i| i as usize));
            Case {
                rows,
                dim,
                ids,
                padding,
                by_freq,
                seed,
            }
        })
}

/// The ranges, and larger tables that split into many tasks (and
/// hot rows into column blocks).
fn small_case() -> impl Strategy<Value = Case> {
    case(1..=300, 1..=70, 0..=600)
}
fn large_case() -> impl Strategy<Value = Case> {
    case(500..=4_000, 16..=140, 1_000..=4_000)
}

/// The dense gradient through the one-hot reference: positions of the
/// padding row dropped, `grad += one_hot(ids)ᵀ · grad_output` into zeros, and
/// with `by_freq` each row divided by its count.
fn reference_dense(c: &Case, grad_output: &[f32]) -> Vec<f32> {
    let (mut ids, mut g) = (Vec::new(), Vec::new());
    for (p, &id) in c.ids.iter().enumerate() {
        if Some(id as usize) != c.padding {
            ids.push(id);
            g.extend_from_slice(&grad_output[p * c.dim..(p + 1) * c.dim]);
        }
    }
    let mut grad = vec![0.0; c.rows * c.dim];
    reference::scatter_add(&g, c.dim, &ids, &mut grad).unwrap();
    if c.by_freq {
        let mut counts = vec![0usize; c.rows];
        ids.iter().for_each(|&i| counts[i as usize] += 1);
        for (r, &count) in counts.iter().enumerate() {
            if count > 0 {
                let row = &mut grad[r * c.dim..(r + 1) * c.dim];
                row.iter_mut().for_each(|x| *x /= count as f32);
            }
        }
    }
    grad
}

fn layer(c: &Case, weight: Vec<f32>) -> Embedding {
    let options = EmbeddingOptions {
        padding_idx: c.padding.map(|p| p as i64),
        scale_grad_by_freq: c.by_freq,
        ..EmbeddingOptions::default()
    };
    Embedding::from_pretrained_with_options(weight, c.dim, false, options).unwrap()
}

/// Dense, sparse (densified) and the reference agree bit for bit, on every
/// path, and the sparse gradient lists exactly the touched, non-padding rows.
fn check_gradients<I: embedding_kernels::Index + TryFrom<u64>>(
    c: &Case,
) -> Result<(), TestCaseError> {
    let mut rng = SplitMix(c.seed);
    let grad_output = rng.values(c.ids.len() * c.dim);
    let ids: Vec<I> = convert(&c.ids);
    let want = bits(&reference_dense(c, &grad_output));
    let mut touched: Vec<usize> = c
        .ids
        .iter()
        .map(|&i| i as usize)
        .filter(|&i| Some(i) != c.padding)
        .collect();
    touched.sort_unstable();
    touched.dedup();
    let run = |par: Parallelism| -> Result<(), TestCaseError> {
        // Dense into a NaN-filled buffer: every row must be written.
        let mut dense = vec![f32::NAN; c.rows * c.dim];
        dense_backward_with(
            par,
            &grad_output,
            c.dim,
            &ids,
            c.padding,
            c.by_freq,
            &mut dense,
        )
        .unwrap();
        prop_assert_eq!(bits(&dense), want.clone(), "dense, {:?}", par);
        let sparse =
            sparse_backward_with(par, &grad_output, c.dim, &ids, c.rows, c.padding, c.by_freq)
                .unwrap();
        prop_assert_eq!(sparse.indices(), &touched[..]);
        prop_assert_eq!(
            bits(&sparse.to_dense().unwrap()),
            want.clone(),
            "sparse, {:?}",
            par
        );
        Ok(())
    };
    run(Parallelism::Serial)?;
    for pool in pools() {
        pool.install(|| run(Parallelism::Rayon))?;
        pool.install(|| run(Parallelism::Auto))?;
    }
    // The layer's own entry points.
    let emb = layer(c, vec![0.5; c.rows * c.dim]);
    let dense = emb.backward_dense(&grad_output, &ids).unwrap();
    prop_assert_eq!(bits(&dense), want.clone());
    match emb.backward(&grad_output, &ids).unwrap() {
        Gradient::Dense(g) => prop_assert_eq!(bits(&g), want),
        Gradient::Sparse(_) => prop_assert!(false, "sparse gradient from a dense layer"),
    }
    Ok(())
}

/// Row-by-row scalar versions of the three update rules, written from the
/// formulas (PyTorch's SGD and Adagrad, FBGEMM's row-wise Adagrad).
fn naive_update(rule: &str, w: &mut [f32], g: &[f32], state: &mut [f32], lr: f32, step: u64) {
    match rule {
        "sgd" => w.iter_mut().zip(g).for_each(|(w, g)| *w -= lr * g),
        "adagrad" => {
            let clr = lr / (1.0 + (step - 1) as f32 * 0.01);
            for ((w, &g), s) in w.iter_mut().zip(g).zip(state) {
                *s += g * g;
                *w += -clr * (g / (s.sqrt() + 1e-10));
            }
        }
        "rowwise" => {
            let mean = g.iter().map(|x| x * x).sum::<f32>() / g.len() as f32;
            state[0] += mean;
            let k = lr / (state[0].sqrt() + 1e-8);
            w.iter_mut().zip(g).for_each(|(w, g)| *w -= k * g);
        }
        _ => unreachable!(),
    }
}

/// Two fused steps of each optimiser equal: the same steps through a
/// materialised sparse gradient (`apply_sparse`), and the naive rule applied
/// to the reference gradient, bit for bit, on every pool. The padding row
/// and untouched rows keep their bits.
fn check_updates(c: &Case) -> Result<(), TestCaseError> {
    let mut rng = SplitMix(c.seed ^ 0x0F0F);
    let weight = rng.values(c.rows * c.dim);
    let batches = [
        rng.values(c.ids.len() * c.dim),
        rng.values(c.ids.len() * c.dim),
    ];
    let ids: Vec<i64> = convert(&c.ids);
    // Each batch's dense gradient through the one-hot reference, once for
    // the three rules.
    let grads: Vec<Vec<f32>> = batches.iter().map(|g| reference_dense(c, g)).collect();
    for rule in ["sgd", "adagrad", "rowwise"] {
        // The naive expectation.
        let mut want = weight.clone();
        let width = match rule {
            "sgd" => 0,
            "adagrad" => c.dim,
            _ => 1,
        };
        let mut state = vec![0.0; c.rows * width];
        for (step, grad) in grads.iter().enumerate() {
            let mut touched = vec![false; c.rows];
            c.ids.iter().for_each(|&i| touched[i as usize] = true);
            for r in (0..c.rows).filter(|&r| touched[r] && Some(r) != c.padding) {
                naive_update(
                    rule,
                    &mut want[r * c.dim..(r + 1) * c.dim],
                    &grad[r * c.dim..(r + 1) * c.dim],
                    &mut state[r * width..(r + 1) * width],
                    0.05,
                    step as u64 + 1,
                );
            }
        }
        let want = bits(&want);
        // Three ways to the same step: the layer's fused step, the layer
        // applying its own sparse gradient, and the free fused step on a
        // plain table.
        let run = |par: Parallelism, way: &str| -> Vec<f32> {
            let mut emb = layer(c, weight.clone()).with_parallelism(par);
            let mut table = weight.clone();
            let mut sgd = Sgd::new(0.05);
            let mut adagrad = Adagrad::new(0.05);
            adagrad.lr_decay = 0.01;
            let mut rowwise = RowWiseAdagrad::new(0.05);
            for g in &batches {
                let sparse = emb.backward_sparse(g, &ids).unwrap();
                let (t, d, pad, freq) = (&mut table[..], c.dim, c.padding, c.by_freq);
                let result = match (rule, way) {
                    ("sgd", "fused") => emb.sparse_step(g, &ids, &mut sgd),
                    ("sgd", "apply") => emb.apply_sparse(&sparse, &mut sgd),
                    ("sgd", _) => sparse_step_with(par, t, d, g, &ids, pad, freq, &mut sgd),
                    ("adagrad", "fused") => emb.sparse_step(g, &ids, &mut adagrad),
                    ("adagrad", "apply") => emb.apply_sparse(&sparse, &mut adagrad),
                    ("adagrad", _) => sparse_step_with(par, t, d, g, &ids, pad, freq, &mut adagrad),
                    (_, "fused") => emb.sparse_step(g, &ids, &mut rowwise),
                    (_, "apply") => emb.apply_sparse(&sparse, &mut rowwise),
                    (_, _) => sparse_step_with(par, t, d, g, &ids, pad, freq, &mut rowwise),
                };
                result.unwrap();
            }
            if way == "free" {
                table
            } else {
                emb.into_weight().unwrap()
            }
        };
        for way in ["fused", "apply", "free"] {
            prop_assert_eq!(
                bits(&run(Parallelism::Serial, way)),
                want.clone(),
                "{} serial",
                rule
            );
            for pool in pools() {
                let got = pool.install(|| run(Parallelism::Rayon, way));
                prop_assert_eq!(
                    bits(&got),
                    want.clone(),
                    "{} {} on {} threads",
                    rule,
                    way,
                    pool.current_num_threads()
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn gradients_equal_the_reference_u32(c in small_case()) {
        check_gradients::<u32>(&c)?;
    }

    #[test]
    fn gradients_equal_the_reference_i64(c in small_case()) {
        check_gradients::<i64>(&c)?;
    }

    #[test]
    fn gradients_equal_the_reference_usize(c in small_case()) {
        check_gradients::<usize>(&c)?;
    }

    #[test]
    fn updates_equal_the_naive_rules(c in small_case()) {
        check_updates(&c)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10))]

    #[test]
    fn large_gradients_equal_the_reference(c in large_case()) {
        check_gradients::<i32>(&c)?;
    }

    #[test]
    fn large_updates_equal_the_naive_rules(c in large_case()) {
        check_updates(&c)?;
    }
}

/// A batch where one id holds 90 % of the positions of a wide row, so the
/// hot row is summed in column blocks by several tasks.
#[test]
fn hot_rows_split_by_columns_keep_the_bits() {
    let c = Case {
        rows: 64,
        dim: 256,
        ids: draw_ids(64, 3_000, Pattern::Hot, 5),
        padding: None,
        by_freq: false,
        seed: 9,
    };
    let grad_output = SplitMix(3).values(c.ids.len() * c.dim);
    let want = bits(&reference_dense(&c, &grad_output));
    for pool in pools() {
        let got = pool.install(|| {
            let mut g = vec![f32::NAN; c.rows * c.dim];
            dense_backward_with(
                Parallelism::Rayon,
                &grad_output,
                c.dim,
                &c.ids,
                None,
                false,
                &mut g,
            )
            .unwrap();
            g
        });
        assert_eq!(bits(&got), want, "{} threads", pool.current_num_threads());
    }
}

// ---------------------------------------------------------------------------
// Finite differences
// ---------------------------------------------------------------------------

/// `L(W) = Σ R ⊙ lookup(W, ids)`, in f64. The loss is linear in `W`, so a
/// central difference with a large step is exact up to the rounding of
/// `W ± h` and of the sum, which the tolerance covers.
fn loss(weight: &[f32], dim: usize, ids: &[u64], r: &[f32]) -> f64 {
    let mut out = vec![0.0; ids.len() * dim];
    reference::gather(weight, dim, ids, &mut out).unwrap();
    weighted_sum(&out, r)
}

/// The central difference of `loss` at every entry of `weight` (step 1/4).
fn numeric(weight: &[f32], dim: usize, ids: &[u64], r: &[f32]) -> Vec<f64> {
    let entries = 0..weight.len();
    values(&numeric_gradient(weight, entries, 0.25, |w| {
        loss(w, dim, ids, r)
    }))
}

fn fd_case() -> (usize, usize, Vec<u64>, Vec<f32>, Vec<f32>) {
    let (rows, dim) = (7, 5);
    let ids = vec![3, 1, 3, 6, 3, 0, 1];
    let mut rng = SplitMix(42);
    let weight: Vec<f32> = (0..rows * dim).map(|_| rng.value() * 4.0).collect();
    let r: Vec<f32> = (0..ids.len() * dim).map(|_| rng.value() * 4.0).collect();
    (rows, dim, ids, weight, r)
}

#[test]
fn dense_and_sparse_backward_match_finite_differences() {
    let (_, dim, ids, weight, r) = fd_case();
    let numeric = numeric(&weight, dim, &ids, &r);
    let mut emb = Embedding::from_pretrained(weight, dim, false).unwrap();
    let dense = emb.backward_dense(&r, &ids).unwrap();
    assert_close("dense", &dense, &numeric, 1e-4);
    let sparse = emb.backward_sparse(&r, &ids).unwrap();
    assert_eq!(sparse.indices(), [0, 1, 3, 6]);
    assert_close("sparse", &sparse.to_dense().unwrap(), &numeric, 1e-4);
    // The forward it differentiates is the lookup itself.
    let out = emb.forward(&ids, &[ids.len()]).unwrap();
    let want: f64 = out
        .values
        .iter()
        .zip(&r)
        .map(|(&o, &r)| f64::from(o) * f64::from(r))
        .sum();
    assert!((want - loss(emb.weight(), dim, &ids, &r)).abs() < 1e-9);
}

#[test]
fn padding_row_gets_no_gradient_and_others_match_finite_differences() {
    let (_, dim, ids, weight, r) = fd_case();
    let numeric = numeric(&weight, dim, &ids, &r);
    for padding_idx in [3i64, -4] {
        // Row 3 of 7 either way.
        let options = EmbeddingOptions {
            padding_idx: Some(padding_idx),
            ..EmbeddingOptions::default()
        };
        let emb =
            Embedding::from_pretrained_with_options(weight.clone(), dim, false, options).unwrap();
        assert_eq!(emb.padding_idx(), Some(3));
        let dense = emb.backward_dense(&r, &ids).unwrap();
        assert!(numeric[3 * dim..4 * dim].iter().any(|&x| x != 0.0));
        assert!(dense[3 * dim..4 * dim].iter().all(|&x| x == 0.0));
        let mut others = numeric.clone();
        others[3 * dim..4 * dim].fill(0.0);
        assert_close("padding", &dense, &others, 1e-4);
        let sparse = emb.backward_sparse(&r, &ids).unwrap();
        assert_eq!(sparse.indices(), [0, 1, 6]);
    }
}

#[test]
fn scale_grad_by_freq_divides_the_finite_difference_by_the_count() {
    let (rows, dim, ids, weight, r) = fd_case();
    let numeric = numeric(&weight, dim, &ids, &r);
    let options = EmbeddingOptions {
        scale_grad_by_freq: true,
        ..EmbeddingOptions::default()
    };
    let emb = Embedding::from_pretrained_with_options(weight, dim, false, options).unwrap();
    let dense = emb.backward_dense(&r, &ids).unwrap();
    let counts: Vec<f64> = (0..rows)
        .map(|row| ids.iter().filter(|&&i| i as usize == row).count().max(1) as f64)
        .collect();
    let scaled: Vec<f64> = numeric
        .iter()
        .enumerate()
        .map(|(k, &x)| x / counts[k / dim])
        .collect();
    assert_eq!(counts[3], 3.0);
    assert_close("scale_grad_by_freq", &dense, &scaled, 1e-4);
}

/// With `max_norm`, the forward renormalises the rows it uses in place; the
/// gradient is the loss's gradient at the table as it then is (PyTorch's
/// renormalisation is outside autograd too).
#[test]
fn max_norm_backward_matches_finite_differences_at_the_renormalised_table() {
    let (_, dim, ids, weight, r) = fd_case();
    let options = EmbeddingOptions {
        max_norm: Some(1.0),
        ..EmbeddingOptions::default()
    };
    let mut emb =
        Embedding::from_pretrained_with_options(weight.clone(), dim, false, options).unwrap();
    emb.forward(&ids, &[ids.len()]).unwrap();
    assert_ne!(
        bits(emb.weight()),
        bits(&weight),
        "some rows must have been renormalised"
    );
    let numeric = numeric(emb.weight(), dim, &ids, &r);
    assert_close(
        "max_norm",
        &emb.backward_dense(&r, &ids).unwrap(),
        &numeric,
        1e-4,
    );
}

// ---------------------------------------------------------------------------
// max_norm
// ---------------------------------------------------------------------------

fn norm(row: &[f32], p: f64) -> f64 {
    let abs = row.iter().map(|&x| f64::from(x).abs());
    if p.is_infinite() {
        abs.fold(0.0, f64::max)
    } else {
        abs.map(|x| x.powf(p)).sum::<f64>().powf(1.0 / p)
    }
}

#[test]
fn max_norm_renormalises_each_looked_up_row_once() {
    let (rows, dim) = (6, 4);
    for p in [2.0f32, 1.0, 3.0, f32::INFINITY] {
        let weight: Vec<f32> = (0..rows * dim).map(|k| (k as f32 - 9.5) * 0.4).collect();
        let max_norm = 1.5f32;
        let options = EmbeddingOptions {
            max_norm: Some(max_norm),
            norm_type: p,
            ..EmbeddingOptions::default()
        };
        let mut emb =
            Embedding::from_pretrained_with_options(weight.clone(), dim, false, options).unwrap();
        // Row 1 three times: it must be scaled once, not three times.
        let ids = [1u32, 4, 1, 1];
        let out = emb.forward(&ids, &[2, 2]).unwrap();
        assert_eq!(out.shape, [2, 2, dim]);
        for row in 0..rows {
            let before = &weight[row * dim..(row + 1) * dim];
            let after = emb.row(row).unwrap();
            let n = norm(before, f64::from(p));
            if ids.contains(&(row as u32)) && n > f64::from(max_norm) {
                let scale = (f64::from(max_norm) / (n + 1e-7)) as f32;
                let want: Vec<f32> = before.iter().map(|x| x * scale).collect();
                assert_eq!(bits(after), bits(&want), "p {p}, row {row}");
                assert!(norm(after, f64::from(p)) <= f64::from(max_norm) * (1.0 + 1e-6));
            } else {
                assert_eq!(
                    bits(after),
                    bits(before),
                    "p {p}, row {row} must not change"
                );
            }
        }
        // The output is the renormalised rows.
        assert_eq!(bits(&out.values[..dim]), bits(emb.row(1u32).unwrap()));
    }
}

// ---------------------------------------------------------------------------
// Construction, shapes, errors
// ---------------------------------------------------------------------------

#[test]
fn seeded_initialisation_is_the_same_bits_on_every_pool() {
    let options = |seed| EmbeddingOptions {
        seed: Some(seed),
        padding_idx: Some(-1),
        ..EmbeddingOptions::default()
    };
    let (rows, dim) = (1_000, 300); // several init blocks
    let first = Embedding::with_options(rows, dim, options(7)).unwrap();
    for pool in pools() {
        let again = pool.install(|| Embedding::with_options(rows, dim, options(7)).unwrap());
        assert_eq!(bits(again.weight()), bits(first.weight()));
    }
    let other = Embedding::with_options(rows, dim, options(8)).unwrap();
    assert_ne!(bits(other.weight()), bits(first.weight()));
    // The padding row is zero, the rest N(0, 1).
    let w = first.weight();
    assert!(w[(rows - 1) * dim..].iter().all(|&x| x == 0.0));
    let body = &w[..(rows - 1) * dim];
    let n = body.len() as f64;
    let mean = body.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
    let var = body
        .iter()
        .map(|&x| (f64::from(x) - mean).powi(2))
        .sum::<f64>()
        / n;
    // 299 700 draws: the standard error of the mean is 0.0018.
    assert!(mean.abs() < 0.01, "mean {mean}");
    assert!((var - 1.0).abs() < 0.02, "variance {var}");
    // Blocks are distinct streams, not copies.
    assert_ne!(bits(&w[..1000]), bits(&w[65_536..66_536]));
}

/// The calls next to the rows of [`layer_errors`] that succeed.
#[test]
fn forward_shapes_and_rows() {
    let mut emb = Layer::Lookup.build();
    let out = emb.forward(&[3u32, 0, 1, 2, 2, 1], &[2, 3]).unwrap();
    assert_eq!(out.shape, [2, 3, 3]);
    assert_eq!(&out.values[..6], &[9.0, 10.0, 11.0, 0.0, 1.0, 2.0]);
    assert_eq!(emb.forward(&[0u32; 0], &[0, 5]).unwrap().shape, [0, 5, 3]);
    assert_eq!(emb.row(2u64).unwrap(), &[6.0, 7.0, 8.0]);
    assert!(Sgd::new(0.1).validate().is_ok());
}

#[test]
fn frozen_tables_and_padding_rows_never_change() {
    let weight: Vec<f32> = (0..20).map(|x| x as f32 * 0.1).collect();
    let g = vec![1.0f32; 12];
    let ids = [0u32, 2, 4];
    let mut frozen = Embedding::from_pretrained(weight.clone(), 4, true).unwrap();
    frozen.sparse_step(&g, &ids, &mut Sgd::new(0.5)).unwrap();
    frozen
        .sparse_step(&g, &ids, &mut RowWiseAdagrad::new(0.5))
        .unwrap();
    let dense = frozen.backward_dense(&g, &ids).unwrap();
    frozen.dense_sgd_step(&dense, &Sgd::new(0.5)).unwrap();
    assert_eq!(bits(frozen.weight()), bits(&weight));

    let options = EmbeddingOptions {
        padding_idx: Some(2),
        ..EmbeddingOptions::default()
    };
    let mut padded =
        Embedding::from_pretrained_with_options(weight.clone(), 4, false, options).unwrap();
    let sgd = Sgd::new(0.5).with_weight_decay(0.1);
    padded.sparse_step(&g, &ids, &mut sgd.clone()).unwrap();
    padded
        .sparse_step(&g, &ids, &mut Adagrad::new(0.5))
        .unwrap();
    let dense = padded.backward_dense(&g, &ids).unwrap();
    padded.dense_sgd_step(&dense, &sgd).unwrap();
    assert_eq!(bits(&padded.weight()[8..12]), bits(&weight[8..12]));
    assert_ne!(bits(&padded.weight()[..4]), bits(&weight[..4]));
    // Untouched rows 1 and 3 are unchanged by the sparse steps, and only
    // decayed by the dense step.
    let decayed: Vec<f32> = weight[4..8]
        .iter()
        .map(|&w| w - 0.5 * (0.0 + 0.1 * w))
        .collect();
    assert_eq!(bits(&padded.weight()[4..8]), bits(&decayed));
}

#[test]
fn sparse_layers_return_sparse_gradients() {
    let options = EmbeddingOptions {
        sparse: true,
        seed: Some(1),
        ..EmbeddingOptions::default()
    };
    let emb = Embedding::with_options(10, 3, options).unwrap();
    let g: Vec<f32> = (0..9).map(|x| x as f32).collect();
    match emb.backward(&g, &[7u32, 2, 7]).unwrap() {
        Gradient::Sparse(s) => {
            assert_eq!(s.indices(), [2, 7]);
            assert_eq!(s.values(), [3.0, 4.0, 5.0, 6.0, 8.0, 10.0]);
            assert_eq!(s.nnz_rows(), 2);
        }
        Gradient::Dense(_) => panic!("a sparse layer returned a dense gradient"),
    }
}

#[test]
fn dense_sgd_after_dense_backward_equals_the_sparse_step_without_decay() {
    let c = Case {
        rows: 700,
        dim: 48,
        ids: draw_ids(700, 900, Pattern::Uniform, 2),
        padding: Some(5),
        by_freq: true,
        seed: 4,
    };
    let mut rng = SplitMix(c.seed);
    let weight = rng.values(c.rows * c.dim);
    let g = rng.values(c.ids.len() * c.dim);
    let mut sparse = layer(&c, weight.clone());
    sparse.sparse_step(&g, &c.ids, &mut Sgd::new(0.3)).unwrap();
    let mut dense = layer(&c, weight);
    let grad = dense.backward_dense(&g, &c.ids).unwrap();
    dense.dense_sgd_step(&grad, &Sgd::new(0.3)).unwrap();
    assert_eq!(bits(sparse.weight()), bits(dense.weight()));
}

#[test]
fn save_and_load_round_trip_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table.safetensors");
    let options = EmbeddingOptions {
        seed: Some(3),
        ..EmbeddingOptions::default()
    };
    let emb = Embedding::with_options(50, 7, options).unwrap();
    emb.save(&path, "embeddings.word_embeddings.weight")
        .unwrap();
    let back = Embedding::load(&path, "embeddings.word_embeddings.weight", true).unwrap();
    assert_eq!(back.num_embeddings(), 50);
    assert_eq!(back.embedding_dim(), 7);
    assert!(back.is_frozen());
    assert_eq!(bits(back.weight()), bits(emb.weight()));
    assert!(Embedding::load(&path, "missing", false).is_err());
}

#[test]
fn read_only_lookups_match_forward() {
    let mut emb = Layer::ReadOnly.build();
    let ids = [5u32, 0, 5, 2];
    let mut shared = vec![f32::NAN; 16];
    emb.lookup_into(&ids, &mut shared).unwrap();
    let owned = emb.forward(&ids, &[4]).unwrap();
    assert_eq!(bits(&shared), bits(&owned.values));
}

/// Tables of 8 MiB and more take the grouped sweep (streaming stores, tasks
/// of whole rows, hot rows split by columns) instead of the in-cache
/// scatter: the same bits, on every pool, with padding and counts.
#[test]
fn large_tables_take_the_grouped_sweep_with_the_same_bits() {
    let (rows, dim) = (20_000, 128); // 10 MiB
    for (pattern, padding, by_freq) in [
        (Pattern::Uniform, None, false),
        (Pattern::Hot, Some(7), true),
        (Pattern::FewDistinct, Some(0), false),
    ] {
        let mut ids = draw_ids(rows, 3_000, pattern, 21);
        ids[5] = 7;
        ids[9] = 0;
        let c = Case {
            rows,
            dim,
            ids,
            padding,
            by_freq,
            seed: 17,
        };
        let grad_output = SplitMix(c.seed).values(c.ids.len() * dim);
        // zeros + scatter_add of the kept positions (exact, and itself
        // checked against the one-hot reference), then the counts.
        let (mut kept_ids, mut kept_g) = (Vec::new(), Vec::new());
        for (p, &id) in c.ids.iter().enumerate() {
            if Some(id as usize) != padding {
                kept_ids.push(id);
                kept_g.extend_from_slice(&grad_output[p * dim..(p + 1) * dim]);
            }
        }
        let mut want = vec![0.0f32; rows * dim];
        embedding_kernels::scatter_add(&kept_g, dim, &kept_ids, &mut want).unwrap();
        if by_freq {
            let mut counts = vec![0usize; rows];
            kept_ids.iter().for_each(|&i| counts[i as usize] += 1);
            for (r, &n) in counts.iter().enumerate() {
                if n > 1 {
                    want[r * dim..(r + 1) * dim]
                        .iter_mut()
                        .for_each(|x| *x /= n as f32);
                }
            }
        }
        let want = bits(&want);
        for pool in pools() {
            for par in [Parallelism::Serial, Parallelism::Rayon] {
                let got = pool.install(|| {
                    let mut g = vec![f32::NAN; rows * dim];
                    dense_backward_with(par, &grad_output, dim, &c.ids, padding, by_freq, &mut g)
                        .unwrap();
                    g
                });
                assert_eq!(
                    bits(&got),
                    want,
                    "{pattern:?} {par:?} {} threads",
                    pool.current_num_threads()
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Errors: one table, every entry point, nothing changed
// ---------------------------------------------------------------------------

/// The table of [`Layer::ReadOnly`].
fn read_only_weight() -> Vec<f32> {
    (0..24).map(|x| x as f32 - 7.5).collect()
}

/// The layers the error rows call.
#[derive(Clone, Copy, Debug)]
enum Layer {
    /// 4 rows × 3, the values 0..12, frozen.
    Lookup,
    /// 5 rows × 4, the values 0..20.
    Train,
    /// 2 rows × 4 of zeros.
    Small,
    /// 8 rows × 4 of 3.0 with `max_norm` 1, so a forward would change it.
    Renorm,
    /// 6 rows × 4, the values -7.5..16.5.
    ReadOnly,
    /// [`Layer::ReadOnly`] with `max_norm` 1.
    ReadOnlyRenorm,
}

impl Layer {
    fn build(self) -> Embedding {
        let max_norm = |m| EmbeddingOptions {
            max_norm: Some(m),
            ..EmbeddingOptions::default()
        };
        let counting = |n: usize, dim, frozen| {
            Embedding::from_pretrained((0..n).map(|x| x as f32).collect(), dim, frozen).unwrap()
        };
        match self {
            Layer::Lookup => counting(12, 3, true),
            Layer::Train => counting(20, 4, false),
            Layer::Small => Embedding::from_pretrained(vec![0.0; 8], 4, false).unwrap(),
            Layer::Renorm => {
                Embedding::from_pretrained_with_options(vec![3.0; 32], 4, false, max_norm(1.0))
                    .unwrap()
            }
            Layer::ReadOnly => Embedding::from_pretrained(read_only_weight(), 4, false).unwrap(),
            Layer::ReadOnlyRenorm => {
                let weight = read_only_weight();
                Embedding::from_pretrained_with_options(weight, 4, false, max_norm(1.0)).unwrap()
            }
        }
    }
}

/// An optimiser, as a row gives it to a step.
#[derive(Clone, Debug)]
enum Optimizer {
    Sgd(Sgd),
    Adagrad(Adagrad),
    RowWise(RowWiseAdagrad),
}

impl Optimizer {
    /// An Adagrad (lr 0.1) that has taken one step on [`Layer::Train`], so
    /// its state is for 5 × 4 values.
    fn adagrad_of_train() -> Optimizer {
        let mut adagrad = Adagrad::new(0.1);
        let mut emb = Layer::Train.build();
        emb.sparse_step(&[1.0; 8], &[1i64, 2], &mut adagrad)
            .unwrap();
        assert_eq!(adagrad.state().len(), 20);
        Optimizer::Adagrad(adagrad)
    }

    fn state(&self) -> Vec<u32> {
        match self {
            Optimizer::Sgd(_) => Vec::new(),
            Optimizer::Adagrad(o) => bits(o.state()),
            Optimizer::RowWise(o) => bits(o.state()),
        }
    }

    fn validate(&self) -> Result<(), EmbeddingError> {
        match self {
            Optimizer::Sgd(o) => o.validate(),
            Optimizer::Adagrad(o) => o.validate(),
            Optimizer::RowWise(o) => o.validate(),
        }
    }

    fn sparse_step(
        &mut self,
        emb: &mut Embedding,
        g: &[f32],
        ids: &[i64],
    ) -> Result<(), EmbeddingError> {
        match self {
            Optimizer::Sgd(o) => emb.sparse_step(g, ids, o),
            Optimizer::Adagrad(o) => emb.sparse_step(g, ids, o),
            Optimizer::RowWise(o) => emb.sparse_step(g, ids, o),
        }
    }

    fn apply_sparse(&mut self, emb: &mut Embedding, g: &SparseGrad) -> Result<(), EmbeddingError> {
        match self {
            Optimizer::Sgd(o) => emb.apply_sparse(g, o),
            Optimizer::Adagrad(o) => emb.apply_sparse(g, o),
            Optimizer::RowWise(o) => emb.apply_sparse(g, o),
        }
    }
}

/// One bad call, one variant per entry point.
#[derive(Clone, Debug)]
enum Call {
    Forward(Layer, Vec<u32>, Vec<usize>),
    /// The ids and the output's length (a NaN canary).
    ForwardInto(Layer, Vec<i64>, usize),
    LookupInto(Layer, Vec<u32>, usize),
    Row(Layer, i64),
    WithOptions(usize, usize, EmbeddingOptions),
    New(usize, usize),
    /// A table of this many values, and its row width.
    FromPretrained(usize, usize),
    /// The optimiser, the length of the output gradient (of ones) and the ids.
    SparseStep(Layer, Optimizer, usize, Vec<i64>),
    /// A sparse gradient of one row (0) for a table of `rows × dim`.
    ApplySparse(Layer, Optimizer, usize, usize),
    /// Indices, values' length, rows, dim.
    SparseGrad(Vec<usize>, usize, usize, usize),
    Validate(Optimizer),
}

impl Call {
    /// Makes the call and checks its error; the layer, the output and the
    /// optimiser's state are left exactly as they were.
    fn run(&self, want: &EmbeddingError) {
        let untouched = |what: &str, emb: &Embedding, before: &[u32]| {
            assert_eq!(bits(emb.weight()), before, "{what}: the table changed");
        };
        match self {
            Call::Forward(layer, ids, shape) => {
                let mut emb = layer.build();
                let before = bits(emb.weight());
                assert_error("forward", emb.forward(ids, shape), want);
                untouched("forward", &emb, &before);
            }
            Call::ForwardInto(layer, ids, out_len) => {
                let mut emb = layer.build();
                let before = bits(emb.weight());
                let mut out = vec![f32::NAN; *out_len];
                assert_error("forward_into", emb.forward_into(ids, &mut out), want);
                untouched("forward_into", &emb, &before);
                assert!(out.iter().all(|x| x.is_nan()), "output written");
            }
            Call::LookupInto(layer, ids, out_len) => {
                let emb = layer.build();
                let mut out = vec![f32::NAN; *out_len];
                assert_error("lookup_into", emb.lookup_into(ids, &mut out), want);
                assert!(out.iter().all(|x| x.is_nan()), "output written");
            }
            Call::Row(layer, id) => assert_error("row", layer.build().row(*id), want),
            Call::WithOptions(rows, dim, options) => {
                let got = Embedding::with_options(*rows, *dim, options.clone());
                assert_error("with_options", got, want);
            }
            Call::New(rows, dim) => assert_error("new", Embedding::new(*rows, *dim), want),
            Call::FromPretrained(len, dim) => {
                let got = Embedding::from_pretrained(vec![0.0; *len], *dim, false);
                assert_error("from_pretrained", got, want);
            }
            Call::SparseStep(layer, optimizer, g_len, ids) => {
                let (mut emb, mut optimizer) = (layer.build(), optimizer.clone());
                let (before, state) = (bits(emb.weight()), optimizer.state());
                let got = optimizer.sparse_step(&mut emb, &vec![1.0; *g_len], ids);
                assert_error("sparse_step", got, want);
                untouched("sparse_step", &emb, &before);
                assert_eq!(optimizer.state(), state, "optimiser state changed");
            }
            Call::ApplySparse(layer, optimizer, rows, dim) => {
                let (mut emb, mut optimizer) = (layer.build(), optimizer.clone());
                let (before, state) = (bits(emb.weight()), optimizer.state());
                let grad = SparseGrad::new(vec![0], vec![1.0; *dim], *rows, *dim).unwrap();
                assert_error(
                    "apply_sparse",
                    optimizer.apply_sparse(&mut emb, &grad),
                    want,
                );
                untouched("apply_sparse", &emb, &before);
                assert_eq!(optimizer.state(), state, "optimiser state changed");
            }
            Call::SparseGrad(indices, values, rows, dim) => {
                let got = SparseGrad::new(indices.clone(), vec![0.0; *values], *rows, *dim);
                assert_error("SparseGrad::new", got, want);
            }
            Call::Validate(optimizer) => assert_error("validate", optimizer.validate(), want),
        }
    }
}

/// Every error of the layer, its options, its optimisers and its sparse
/// gradients, each on the entry point that reports it.
fn layer_errors() -> Vec<Row<Call>> {
    use Call::*;
    use Layer::{Lookup, ReadOnly, ReadOnlyRenorm, Renorm, Small, Train};
    let options = |change: fn(&mut EmbeddingOptions)| {
        let mut options = EmbeddingOptions::default();
        change(&mut options);
        options
    };
    let mut rows = vec![
        // Shapes and ids of a lookup (4 rows × 3).
        row(
            "3 ids as 2 × 2",
            Forward(Lookup, vec![0, 1, 2], vec![2, 2]),
            EmbeddingError::IdsShape {
                shape: vec![2, 2],
                len: 3,
            },
        ),
        row(
            "a shape whose product overflows",
            Forward(Lookup, vec![0], vec![usize::MAX, 2]),
            EmbeddingError::IdsShape {
                shape: vec![usize::MAX, 2],
                len: 1,
            },
        ),
        row(
            "output 5 for 2 ids",
            ForwardInto(Lookup, vec![0, 1], 5),
            mismatch(Operand::Output, 6, 5),
        ),
        row("row -1", Row(Lookup, -1), bad_id(0, -1, 4)),
        // max_norm is not applied when an id is bad.
        row(
            "max_norm with a bad id",
            ForwardInto(Renorm, vec![0, 2, -3], 12),
            bad_id(2, -3, 8),
        ),
        row(
            "read-only lookup of id 6 of 6",
            LookupInto(ReadOnly, vec![6], 4),
            bad_id(0, 6, 6),
        ),
        row(
            "read-only lookup with max_norm",
            LookupInto(ReadOnlyRenorm, vec![5, 0, 5, 2], 16),
            invalid("max_norm", 1.0),
        ),
        // Construction.
        row(
            "padding_idx -5 of 4",
            WithOptions(4, 2, options(|o| o.padding_idx = Some(-5))),
            EmbeddingError::PaddingIdxOutOfRange {
                padding_idx: -5,
                num_embeddings: 4,
            },
        ),
        row(
            "usize::MAX rows",
            New(usize::MAX, 2),
            EmbeddingError::SizeOverflow {
                count: usize::MAX,
                dim: 2,
            },
        ),
        row(
            "7 values of dim 2",
            FromPretrained(7, 2),
            not_whole_rows(Operand::Table, 7, 2),
        ),
        // Steps on 5 rows × 4: nothing changes, no state is made.
        row(
            "step with id 5 of 5",
            SparseStep(Train, Optimizer::Adagrad(Adagrad::new(0.1)), 8, vec![1, 5]),
            bad_id(1, 5, 5),
        ),
        row(
            "step with 7 gradient values for 8",
            SparseStep(Train, Optimizer::Adagrad(Adagrad::new(0.1)), 7, vec![1, 2]),
            mismatch(Operand::GradOutput, 8, 7),
        ),
        row(
            "step with lr -0.1",
            SparseStep(Train, Optimizer::Sgd(Sgd::new(-0.1)), 8, vec![1, 2]),
            invalid("lr", -0.1),
        ),
        // State made for one table refuses another.
        row(
            "Adagrad state of 5 × 4 on 2 × 4",
            SparseStep(Small, Optimizer::adagrad_of_train(), 8, vec![1, 0]),
            mismatch(Operand::OptimizerState, 8, 20),
        ),
        // A sparse gradient for another shape.
        row(
            "a 3 × 4 gradient on 5 × 4",
            ApplySparse(Train, Optimizer::Sgd(Sgd::new(0.1)), 3, 4),
            mismatch(Operand::GradTable, 5, 3),
        ),
        row(
            "sparse rows 2, 2",
            SparseGrad(vec![2, 2], 8, 3, 4),
            bad_id(1, 2, 3),
        ),
        row(
            "sparse row 3 of 3",
            SparseGrad(vec![3], 4, 3, 4),
            bad_id(0, 3, 3),
        ),
        row(
            "3 sparse values for 4",
            SparseGrad(vec![0], 3, 3, 4),
            mismatch(Operand::GradTable, 4, 3),
        ),
        // Optimisers check themselves before any step.
        row(
            "weight_decay -1",
            Validate(Optimizer::Sgd(Sgd::new(0.1).with_weight_decay(-1.0))),
            invalid("weight_decay", -1.0),
        ),
        row(
            "Adagrad eps NaN",
            Validate(Optimizer::Adagrad({
                let mut adagrad = Adagrad::new(0.1);
                adagrad.eps = f32::NAN;
                adagrad
            })),
            invalid("eps", f32::NAN),
        ),
        row(
            "initial_accumulator_value -0.5",
            Validate(Optimizer::RowWise({
                let mut rowwise = RowWiseAdagrad::new(0.1);
                rowwise.initial_accumulator_value = -0.5;
                rowwise
            })),
            invalid("initial_accumulator_value", -0.5),
        ),
    ];
    for max_norm in [0.0, -1.0, f32::NAN] {
        rows.push(row(
            format!("max_norm {max_norm}"),
            WithOptions(
                4,
                2,
                EmbeddingOptions {
                    max_norm: Some(max_norm),
                    ..EmbeddingOptions::default()
                },
            ),
            invalid("max_norm", max_norm),
        ));
    }
    rows
}

#[test]
fn every_layer_error_is_precise_and_changes_nothing() {
    run_table(&layer_errors(), Call::run);
}

/// The free fused step refuses each bad argument in its documented order,
/// with the table, the optimiser's state and its step count as they were.
#[test]
fn free_sparse_step_refuses_and_changes_nothing() {
    let (rows, dim) = (6, 4);
    let table: Vec<f32> = (0..rows * dim).map(|x| x as f32 * 0.25).collect();
    let grad = vec![1.0f32; 3 * dim];
    // An Adagrad whose state was made by a first step on this table.
    let fresh = || {
        let mut adagrad = Adagrad::new(0.1);
        let mut t = table.clone();
        sparse_step_with(
            Parallelism::Serial,
            &mut t,
            dim,
            &grad[..dim],
            &[0i64],
            None,
            false,
            &mut adagrad,
        )
        .unwrap();
        adagrad
    };
    let mut bad_lr = Adagrad::new(0.1);
    bad_lr.lr = f32::NAN;
    type Call = (
        &'static str,
        usize,
        usize,
        Vec<i64>,
        Option<usize>,
        Option<Adagrad>,
        EmbeddingError,
    );
    let cases: Vec<Call> = vec![
        (
            "table of part rows",
            rows * dim - 1,
            3 * dim,
            vec![0, 1, 2],
            None,
            None,
            not_whole_rows(Operand::Table, rows * dim - 1, dim),
        ),
        (
            "short gradient",
            rows * dim,
            3 * dim - 1,
            vec![0, 1, 2],
            None,
            None,
            mismatch(Operand::GradOutput, 3 * dim, 3 * dim - 1),
        ),
        (
            "padding past the table",
            rows * dim,
            3 * dim,
            vec![0, 1, 2],
            Some(rows),
            None,
            EmbeddingError::PaddingIdxOutOfRange {
                padding_idx: rows as i64,
                num_embeddings: rows,
            },
        ),
        (
            "negative id",
            rows * dim,
            3 * dim,
            vec![0, -1, 2],
            None,
            None,
            bad_id(1, -1, rows),
        ),
        (
            "id past the table",
            rows * dim,
            3 * dim,
            vec![0, 1, 6],
            None,
            None,
            bad_id(2, 6, rows),
        ),
        (
            "NaN learning rate",
            rows * dim,
            3 * dim,
            vec![0, 1, 2],
            None,
            Some(bad_lr),
            invalid("lr", f32::NAN),
        ),
    ];
    for (what, table_len, grad_len, ids, padding, optimizer, want) in cases {
        let mut t = table[..table_len].to_vec();
        let mut adagrad = optimizer.unwrap_or_else(fresh);
        let (state, steps) = (bits(adagrad.state()), adagrad.steps());
        let got = sparse_step_with(
            Parallelism::Serial,
            &mut t,
            dim,
            &grad[..grad_len],
            &ids,
            padding,
            false,
            &mut adagrad,
        );
        assert_error(what, got, &want);
        assert_eq!(
            bits(&t),
            bits(&table[..table_len]),
            "{what}: the table changed"
        );
        assert_eq!(bits(adagrad.state()), state, "{what}: the state changed");
        assert_eq!(adagrad.steps(), steps, "{what}: a step was counted");
    }
    // A state made for another table's shape.
    let mut adagrad = fresh();
    let mut wider = vec![0.0f32; rows * 8];
    let got = sparse_step_with(
        Parallelism::Serial,
        &mut wider,
        8,
        &[1.0; 8],
        &[0i64],
        None,
        false,
        &mut adagrad,
    );
    assert_error(
        "state of another shape",
        got,
        &mismatch(Operand::OptimizerState, rows * 8, rows * dim),
    );
    assert!(wider.iter().all(|&x| x == 0.0), "the wider table changed");
}

/// `apply_sparse` applies a coalesced gradient's rows as they are: a `-0.0`
/// gradient value stays `-0.0` (summing the one row from `+0.0` made it
/// `+0.0`, so `-0.0 - 2 × -0.0` gave `-0.0` where the rule gives `+0.0`;
/// found by the `layers` fuzz target, seed `apply-sparse-negative-zero-grad`).
#[test]
fn apply_sparse_takes_the_gradient_as_given() {
    let weight = vec![-0.0f32, 1.0, -0.0, 2.0];
    let grad = SparseGrad::new(vec![0, 1], vec![-0.0, 0.5, -0.0, 0.0], 2, 2).unwrap();
    let lr = 2.0f32;
    for par in [Parallelism::Serial, Parallelism::Rayon] {
        let mut emb = Embedding::from_pretrained(weight.clone(), 2, false)
            .unwrap()
            .with_parallelism(par);
        emb.apply_sparse(&grad, &mut Sgd::new(lr)).unwrap();
        let want: Vec<u32> = weight
            .iter()
            .zip(grad.values())
            .map(|(&w, &g)| (w - lr * g).to_bits())
            .collect();
        assert_eq!(bits(emb.weight()), want, "{par:?}");
        assert_eq!(emb.weight()[0].to_bits(), 0.0f32.to_bits(), "{par:?}");
    }
}

/// Row-wise Adagrad over accumulators the caller holds (`RowWiseAdagradOn`,
/// what the Python package passes a NumPy array to) takes the same steps as
/// `RowWiseAdagrad` holding its own, bit for bit, with weight decay, padding
/// and counts; a state of the wrong length is refused with nothing changed.
#[test]
fn row_wise_adagrad_on_a_callers_state_equals_row_wise_adagrad() {
    let (rows, dim) = (7, 5);
    let ids: Vec<i64> = vec![3, 1, 3, 6, 0, 3, 2];
    let grad = SplitMix(43).values(ids.len() * dim);
    let start = SplitMix(44).values(rows * dim);
    let mut own = RowWiseAdagrad::new(0.07);
    own.weight_decay = 0.01;
    own.initial_accumulator_value = 0.25;
    let (mut a, mut b) = (start.clone(), start.clone());
    let mut state = vec![0.25f32; rows];
    for step in 0..3 {
        let mut on = embedding_kernels::RowWiseAdagradOn::new(0.07, &mut state);
        on.weight_decay = 0.01;
        let par = [Parallelism::Serial, Parallelism::Rayon][step % 2];
        sparse_step_with(par, &mut a, dim, &grad, &ids, Some(2), true, &mut own).unwrap();
        sparse_step_with(par, &mut b, dim, &grad, &ids, Some(2), true, &mut on).unwrap();
        assert_eq!(bits(&a), bits(&b), "weights after step {}", step + 1);
        assert_eq!(
            bits(own.state()),
            bits(&state),
            "state after step {}",
            step + 1
        );
    }
    assert_ne!(bits(&a), bits(&start), "the steps changed the table");

    let mut short = vec![0.0f32; rows - 1];
    let mut on = embedding_kernels::RowWiseAdagradOn::new(0.07, &mut short);
    let before = b.clone();
    let err = sparse_step_with(
        Parallelism::Serial,
        &mut b,
        dim,
        &grad,
        &ids,
        None,
        false,
        &mut on,
    );
    assert_eq!(
        err.unwrap_err(),
        mismatch(Operand::OptimizerState, rows, rows - 1)
    );
    assert_eq!(bits(&b), bits(&before), "a refused step writes nothing");
}

/// Adagrad over a state the caller holds (`AdagradOn`, what the Python
/// package passes a NumPy array to) takes the same steps as `Adagrad`
/// holding its own, bit for bit, with `lr_decay`, `weight_decay`, padding
/// and counts; a state of the wrong length is refused with nothing changed.
#[test]
fn adagrad_on_a_callers_state_equals_adagrad() {
    let (rows, dim) = (7, 5);
    let ids: Vec<i64> = vec![3, 1, 3, 6, 0, 3, 2];
    let grad = SplitMix(41).values(ids.len() * dim);
    let start = SplitMix(42).values(rows * dim);
    let mut own = Adagrad::new(0.07);
    own.lr_decay = 0.1;
    own.weight_decay = 0.01;
    own.initial_accumulator_value = 0.25;
    let (mut a, mut b) = (start.clone(), start.clone());
    let mut state = vec![0.25f32; rows * dim];
    for step in 0..3u64 {
        let mut on = embedding_kernels::AdagradOn::new(0.07, &mut state, step);
        on.lr_decay = 0.1;
        on.weight_decay = 0.01;
        for par in [Parallelism::Serial, Parallelism::Rayon] {
            // Both sides step once per `step`: the serial and the split run
            // take turns.
            if (step % 2 == 0) == (par == Parallelism::Serial) {
                sparse_step_with(par, &mut a, dim, &grad, &ids, Some(2), true, &mut own).unwrap();
                sparse_step_with(par, &mut b, dim, &grad, &ids, Some(2), true, &mut on).unwrap();
            }
        }
        assert_eq!(on.steps(), step + 1);
        assert_eq!(bits(&a), bits(&b), "weights after step {}", step + 1);
        assert_eq!(
            bits(own.state()),
            bits(&state),
            "state after step {}",
            step + 1
        );
    }
    assert_ne!(bits(&a), bits(&start), "the steps changed the table");

    let mut short = vec![0.0f32; rows * dim - 1];
    let mut on = embedding_kernels::AdagradOn::new(0.07, &mut short, 0);
    let before = b.clone();
    let err = sparse_step_with(
        Parallelism::Serial,
        &mut b,
        dim,
        &grad,
        &ids,
        None,
        false,
        &mut on,
    )
    .unwrap_err();
    assert_eq!(
        err,
        mismatch(Operand::OptimizerState, rows * dim, rows * dim - 1)
    );
    assert_eq!(on.steps(), 0);
    assert_eq!(bits(&b), bits(&before));
}
