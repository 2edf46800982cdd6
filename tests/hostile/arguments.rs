//! Argument semantics: negative and huge ids of every type, frozen layers
//! that must refuse exactly what unfrozen ones refuse, accessors and oracle
//! functions that must answer rather than index out of bounds, and layers
//! of width 0, whose every entry point must agree on which ids exist.

use embedding_kernels::formats::Format;
use embedding_kernels::reference;
use embedding_kernels::{
    Adagrad, Bags, Embedding, EmbeddingBag, EmbeddingBagOptions, EmbeddingError, EmbeddingOptions,
    Gradient, Index, Mode, Operand, Pooling, QuantizedEmbedding, QuantizedEmbeddingBag,
    RowWiseAdagrad, Sgd, SparseGrad, SparseOptimizer, bag_sparse_backward, gather, sparse_backward,
};

fn out_of_range(position: usize, index: i128, num_embeddings: usize) -> EmbeddingError {
    EmbeddingError::IndexOutOfRange {
        position,
        index,
        num_embeddings,
    }
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|x| x.to_bits()).collect()
}

fn sum(per_sample_weights: Option<&[f32]>) -> Pooling<'_> {
    Pooling {
        mode: Mode::Sum,
        per_sample_weights,
        padding_idx: None,
        scale_grad_by_freq: false,
    }
}

// ---- class 3: negative ids, whatever the table's size -------------------

/// `[0, bad]` into both sparse kernels that take `num_embeddings` as a
/// number: with `usize::MAX` rows, a negative id's two's complement would
/// be a row.
fn refused_by_the_largest_table<I: Index>(zero: I, bad: I, value: i128) {
    let want = out_of_range(1, value, usize::MAX);
    let got = sparse_backward(&[1.0, 2.0], 1, &[zero, bad], usize::MAX, None, false);
    assert_eq!(got, Err(want.clone()), "sparse_backward, {bad:?}");
    let bags = Bags::from_offsets(&[0u32], 2, false).unwrap();
    let got = bag_sparse_backward(&[1.0], 1, &[zero, bad], &bags, &sum(None), usize::MAX);
    assert_eq!(got, Err(want), "bag_sparse_backward, {bad:?}");
}

#[test]
fn negative_ids_are_out_of_range_for_every_row_count() {
    refused_by_the_largest_table(0i64, -2, -2);
    refused_by_the_largest_table(0i64, -1, -1);
    refused_by_the_largest_table(0i64, i64::MIN, i128::from(i64::MIN));
    refused_by_the_largest_table(0i32, -1, -1);
    refused_by_the_largest_table(0i32, i32::MIN, i128::from(i32::MIN));
    // The largest unsigned ids are not below usize::MAX either.
    refused_by_the_largest_table(0u64, u64::MAX, i128::from(u64::MAX));
    refused_by_the_largest_table(0usize, usize::MAX, usize::MAX as i128);
}

#[test]
fn large_unsigned_ids_are_rows_of_a_large_enough_table() {
    // 2^63 is a valid row of a table of usize::MAX rows: the sparse
    // gradient costs O(ids), whatever the table's size.
    let big = 1u64 << 63;
    let grad = sparse_backward(&[1.5], 1, &[big], usize::MAX, None, false).unwrap();
    assert_eq!(grad.indices(), [big as usize]);
    assert_eq!(grad.values(), [1.5]);
    let grad = sparse_backward(&[1.5], 1, &[u32::MAX], usize::MAX, None, false).unwrap();
    assert_eq!(grad.indices(), [u32::MAX as usize]);
}

/// Every entry point of a 3-row layer refuses `[1, bad]` with the same
/// error: the bad id, at position 1.
fn every_layer_entry_point_refuses<I: Index>(one: I, bad: I, value: i128) {
    let want = out_of_range(1, value, 3);
    let ids = [one, bad];
    let options = EmbeddingOptions {
        seed: Some(3),
        ..EmbeddingOptions::default()
    };
    let mut emb = Embedding::with_options(3, 2, options).unwrap();
    let before = emb.weight().to_vec();
    let grad = [1.0; 4];
    let mut out = [f32::NAN; 4];
    assert_eq!(emb.forward(&ids, &[2]), Err(want.clone()));
    assert_eq!(emb.forward_into(&ids, &mut out), Err(want.clone()));
    assert_eq!(emb.lookup_into(&ids, &mut out), Err(want.clone()));
    assert_eq!(emb.row(bad), Err(out_of_range(0, value, 3)));
    assert_eq!(emb.backward_dense(&grad, &ids), Err(want.clone()));
    let mut grad_weight = [f32::NAN; 6];
    let got = emb.backward_dense_into(&grad, &ids, &mut grad_weight);
    assert_eq!(got, Err(want.clone()));
    assert_eq!(emb.backward_sparse(&grad, &ids), Err(want.clone()));
    let mut sgd = Sgd::new(0.1);
    assert_eq!(emb.sparse_step(&grad, &ids, &mut sgd), Err(want.clone()));
    assert!(out.iter().chain(&grad_weight).all(|x| x.is_nan()));
    assert_eq!(bits(emb.weight()), bits(&before));

    let quantized = QuantizedEmbedding::from_float(&emb, Format::Int8).unwrap();
    assert_eq!(quantized.forward(&ids, &[2]), Err(want.clone()));

    let table = emb.clone();
    let mut bag = EmbeddingBag::from_embedding(table, Mode::Sum, false).unwrap();
    let bags = Bags::fixed(1, 2).unwrap();
    assert_eq!(bag.forward(&ids, &bags, None).err(), Some(want.clone()));
    assert_eq!(
        bag.backward(&grad[..2], &ids, &bags, None, None),
        Err(want.clone())
    );
    let got = bag.sparse_step(&grad[..2], &ids, &bags, None, &mut sgd);
    assert_eq!(got, Err(want.clone()));
    let qbag = QuantizedEmbeddingBag::from_float(&bag, Format::F16).unwrap();
    assert_eq!(qbag.forward(&ids, &bags, None).err(), Some(want));
    assert_eq!(bits(bag.table().weight()), bits(&before));
}

#[test]
fn every_id_type_is_refused_at_min_max_and_minus_one() {
    every_layer_entry_point_refuses(1i32, -1, -1);
    every_layer_entry_point_refuses(1i32, i32::MIN, i128::from(i32::MIN));
    every_layer_entry_point_refuses(1i32, i32::MAX, i128::from(i32::MAX));
    every_layer_entry_point_refuses(1i64, -1, -1);
    every_layer_entry_point_refuses(1i64, i64::MIN, i128::from(i64::MIN));
    every_layer_entry_point_refuses(1i64, i64::MAX, i128::from(i64::MAX));
    every_layer_entry_point_refuses(1u32, u32::MAX, i128::from(u32::MAX));
    every_layer_entry_point_refuses(1u32, 3, 3);
    every_layer_entry_point_refuses(1u64, u64::MAX, i128::from(u64::MAX));
    every_layer_entry_point_refuses(1u64, 1 << 63, 1 << 63);
    every_layer_entry_point_refuses(1usize, usize::MAX, usize::MAX as i128);
}

// ---- class 4: frozen layers check first, then skip the update -----------

/// Runs `step` on a frozen and an unfrozen copy of `layer` with a copy of
/// `optimizer` each: both must return `want`, and on an error leave the
/// table and the optimiser exactly as they were. Returns the frozen call's
/// table and optimiser, which must never change.
fn frozen_and_unfrozen<L: Clone, O: Clone + core::fmt::Debug>(
    layer: &L,
    optimizer: &O,
    set_frozen: impl Fn(&mut L, bool),
    weight: impl Fn(&L) -> Vec<f32>,
    step: impl Fn(&mut L, &mut O) -> Result<(), EmbeddingError>,
    want: &Result<(), EmbeddingError>,
    what: &str,
) {
    for frozen in [true, false] {
        let (mut layer, mut opt) = (layer.clone(), optimizer.clone());
        set_frozen(&mut layer, frozen);
        let (before, opt_before) = (weight(&layer), format!("{opt:?}"));
        let got = step(&mut layer, &mut opt);
        assert_eq!(&got, want, "{what}, frozen: {frozen}");
        if got.is_err() || frozen {
            assert_eq!(bits(&weight(&layer)), bits(&before), "{what}, {frozen}");
            assert_eq!(format!("{opt:?}"), opt_before, "{what}, {frozen}");
        }
    }
}

fn invalid(name: &'static str, value: f32) -> EmbeddingError {
    EmbeddingError::InvalidArgument {
        name,
        value: value.to_string(),
        requirement: "finite and not negative",
    }
}

/// Every bad argument of the sparse steps, on a layer of 3 rows × 2.
fn sparse_steps_agree<O: SparseOptimizer + Clone + core::fmt::Debug>(
    optimizer: &O,
    want_optimizer: &Result<(), EmbeddingError>,
) {
    let weight = vec![0.5, -1.0, 2.0, 0.25, -3.0, 1.0];
    let emb = Embedding::from_pretrained(weight, 2, false).unwrap();
    let set = |l: &mut Embedding, f: bool| l.set_frozen(f);
    let get = |l: &Embedding| l.weight().to_vec();
    let grad = [1.0, 2.0, 3.0, 4.0];

    let step = |l: &mut Embedding, o: &mut O| l.sparse_step(&grad, &[0u32, 2], o);
    frozen_and_unfrozen(&emb, optimizer, set, get, step, want_optimizer, "step");
    let bad_id = Err(out_of_range(1, -1, 3));
    let step = |l: &mut Embedding, o: &mut O| l.sparse_step(&grad, &[0i64, -1], o);
    frozen_and_unfrozen(&emb, optimizer, set, get, step, &bad_id, "id");
    let short = Err(EmbeddingError::LengthMismatch {
        operand: Operand::GradOutput,
        expected: 4,
        got: 3,
    });
    let step = |l: &mut Embedding, o: &mut O| l.sparse_step(&grad[..3], &[0u32, 2], o);
    frozen_and_unfrozen(&emb, optimizer, set, get, step, &short, "grad");

    let sparse = SparseGrad::new(vec![1], vec![1.0, 1.0], 3, 2).unwrap();
    let step = |l: &mut Embedding, o: &mut O| l.apply_sparse(&sparse, o);
    frozen_and_unfrozen(&emb, optimizer, set, get, step, want_optimizer, "apply");
    let other = SparseGrad::new(vec![1], vec![1.0, 1.0], 4, 2).unwrap();
    let wrong_shape = Err(EmbeddingError::LengthMismatch {
        operand: Operand::GradTable,
        expected: 3,
        got: 4,
    });
    let step = |l: &mut Embedding, o: &mut O| l.apply_sparse(&other, o);
    frozen_and_unfrozen(&emb, optimizer, set, get, step, &wrong_shape, "apply shape");

    let bag = EmbeddingBag::from_embedding(emb.clone(), Mode::Mean, false).unwrap();
    let set = |l: &mut EmbeddingBag, f: bool| {
        let mut table = l.clone().into_table();
        table.set_frozen(f);
        *l = EmbeddingBag::from_embedding(table, Mode::Mean, false).unwrap();
    };
    let get = |l: &EmbeddingBag| l.table().weight().to_vec();
    let bags = Bags::from_offsets(&[0u32, 1], 3, false).unwrap();
    let step =
        |l: &mut EmbeddingBag, o: &mut O| l.sparse_step(&grad, &[0u32, 1, 2], &bags, None, o);
    frozen_and_unfrozen(&bag, optimizer, set, get, step, want_optimizer, "bag step");
    let step =
        |l: &mut EmbeddingBag, o: &mut O| l.sparse_step(&grad, &[0u32, 1, 3], &bags, None, o);
    let bad_id = Err(out_of_range(2, 3, 3));
    frozen_and_unfrozen(&bag, optimizer, set, get, step, &bad_id, "bag id");
    let weights = [1.0; 3];
    let need_sum = Err(EmbeddingError::PerSampleWeightsNeedSum { mode: Mode::Mean });
    let step = |l: &mut EmbeddingBag, o: &mut O| {
        l.sparse_step(&grad, &[0u32, 1, 2], &bags, Some(&weights), o)
    };
    frozen_and_unfrozen(&bag, optimizer, set, get, step, &need_sum, "bag weights");
}

#[test]
fn frozen_layers_refuse_what_unfrozen_layers_refuse() {
    sparse_steps_agree(&Sgd::new(0.1), &Ok(()));
    sparse_steps_agree(&Sgd::new(f32::NAN), &Err(invalid("lr", f32::NAN)));
    sparse_steps_agree(&Sgd::new(-1.0), &Err(invalid("lr", -1.0)));
    let decay = Sgd::new(0.1).with_weight_decay(f32::INFINITY);
    sparse_steps_agree(&decay, &Err(invalid("weight_decay", f32::INFINITY)));

    sparse_steps_agree(&Adagrad::new(0.1), &Ok(()));
    let mut eps = Adagrad::new(0.1);
    eps.eps = -1e-10;
    sparse_steps_agree(&eps, &Err(invalid("eps", -1e-10)));
    let mut decay = Adagrad::new(0.1);
    decay.lr_decay = f32::NAN;
    sparse_steps_agree(&decay, &Err(invalid("lr_decay", f32::NAN)));

    sparse_steps_agree(&RowWiseAdagrad::new(0.1), &Ok(()));
    let mut init = RowWiseAdagrad::new(0.1);
    init.initial_accumulator_value = -1.0;
    let want = Err(invalid("initial_accumulator_value", -1.0));
    sparse_steps_agree(&init, &want);
}

#[test]
fn frozen_layers_refuse_an_optimiser_state_made_for_another_table() {
    // A step on a 4-row table makes a state of 4 × 2 (Adagrad) or 4
    // (row-wise) accumulators, wrong for the 3-row layers above.
    let mut other = Embedding::from_pretrained(vec![0.0; 8], 2, false).unwrap();
    let mut adagrad = Adagrad::new(0.1);
    other.sparse_step(&[1.0; 2], &[3u32], &mut adagrad).unwrap();
    let want = Err(EmbeddingError::LengthMismatch {
        operand: Operand::OptimizerState,
        expected: 6,
        got: 8,
    });
    sparse_steps_agree(&adagrad, &want);
    let mut rowwise = RowWiseAdagrad::new(0.1);
    other.sparse_step(&[1.0; 2], &[3u32], &mut rowwise).unwrap();
    let want = Err(EmbeddingError::LengthMismatch {
        operand: Operand::OptimizerState,
        expected: 3,
        got: 4,
    });
    sparse_steps_agree(&rowwise, &want);
}

#[test]
fn a_frozen_step_leaves_the_optimiser_unmade_and_uncounted() {
    let mut emb = Embedding::from_pretrained(vec![1.0; 6], 2, true).unwrap();
    let mut adagrad = Adagrad::new(0.1);
    emb.sparse_step(&[1.0; 2], &[1u32], &mut adagrad).unwrap();
    assert!(adagrad.state().is_empty());
    assert_eq!(adagrad.steps(), 0);
    assert_eq!(emb.weight(), [1.0; 6]);
    // The same on the dense step, which checked first already.
    let got = emb.dense_sgd_step(&[1.0; 6], &Sgd::new(-1.0));
    assert_eq!(got, Err(invalid("lr", -1.0)));
}

// ---- class 5: accessors and the oracle answer instead of panicking ------

#[test]
fn accessors_answer_none_past_the_end() {
    let bags = Bags::from_offsets(&[0i64, 2], 5, false).unwrap();
    assert_eq!(bags.len(), 2);
    assert_eq!(bags.bag(0), Some(0..2));
    assert_eq!(bags.bag(1), Some(2..5));
    assert_eq!(bags.bag(2), None);
    assert_eq!(bags.bag(usize::MAX), None);
    assert_eq!(bags.iter().collect::<Vec<_>>(), [0..2, 2..5]);
    let none = Bags::from_offsets::<u32>(&[], 0, false).unwrap();
    assert_eq!((none.len(), none.bag(0)), (0, None));

    let grad = SparseGrad::new(vec![1, 4], vec![1.0, 2.0, 3.0, 4.0], 5, 2).unwrap();
    assert_eq!(grad.row(1), Some(&[3.0, 4.0][..]));
    assert_eq!(grad.row(2), None);
    assert_eq!(grad.row(usize::MAX), None);
    let narrow = SparseGrad::new(vec![1, 4], vec![], 5, 0).unwrap();
    assert_eq!(narrow.row(1), Some(&[][..]));
    assert_eq!(narrow.row(2), None);
}

#[test]
fn the_bag_matrix_checks_bags_and_weights_before_indexing() {
    // Bags over 4 ids, and only 3 given.
    let bags = Bags::from_offsets(&[0u32, 2], 4, false).unwrap();
    let ids = [0u32, 1, 2];
    let want = EmbeddingError::LengthMismatch {
        operand: Operand::Ids,
        expected: 4,
        got: 3,
    };
    assert_eq!(reference::bag_matrix(&ids, &bags, &sum(None)), Err(want));

    let ids = [0u32, 1, 2, 1];
    let few = [1.0; 3];
    let want = EmbeddingError::LengthMismatch {
        operand: Operand::PerSampleWeights,
        expected: 4,
        got: 3,
    };
    assert_eq!(
        reference::bag_matrix(&ids, &bags, &sum(Some(&few))),
        Err(want.clone())
    );
    // The oracle's bag calls give the same answer, the kernel's too.
    let table = [0.0; 6];
    let (mut out, mut max) = ([0.0; 4], []);
    let got = reference::bag_forward(&table, 2, &ids, &bags, &sum(Some(&few)), &mut out, &mut max);
    assert_eq!(got, Err(want.clone()));
    let got = embedding_kernels::bag_forward(
        &table,
        2,
        &ids,
        &bags,
        &sum(Some(&few)),
        &mut out,
        &mut max,
    );
    assert_eq!(got, Err(want));

    let mean_weights = Pooling {
        mode: Mode::Mean,
        ..sum(Some(&[1.0; 4]))
    };
    assert_eq!(
        reference::bag_matrix(&ids, &bags, &mean_weights),
        Err(EmbeddingError::PerSampleWeightsNeedSum { mode: Mode::Mean })
    );
    let max = Pooling {
        mode: Mode::Max,
        ..sum(None)
    };
    assert!(matches!(
        reference::bag_matrix(&ids, &bags, &max),
        Err(EmbeddingError::InvalidArgument { name: "mode", .. })
    ));
    let m = reference::bag_matrix(&ids, &bags, &sum(Some(&[2.0; 4]))).unwrap();
    assert_eq!(m, [2.0, 2.0, 0.0, 0.0, 0.0, 0.0, 2.0, 2.0]);
}

// ---- class 6: one answer per call, width 0 included ---------------------

/// Every entry point of a layer of 5 rows × 0 accepts ids `0..5` (as
/// `nn.Embedding(5, 0)` does) and refuses 5.
#[test]
fn a_layer_of_width_zero_knows_its_rows_in_every_entry_point() {
    let options = EmbeddingOptions {
        padding_idx: Some(-1),
        ..EmbeddingOptions::default()
    };
    let mut emb = Embedding::with_options(5, 0, options).unwrap();
    assert_eq!((emb.num_embeddings(), emb.padding_idx()), (5, Some(4)));
    let good = [0u32, 4, 4];
    let bad = [0u32, 5];
    let want = out_of_range(1, 5, 5);

    assert_eq!(emb.forward(&good, &[3]).unwrap().shape, [3, 0]);
    assert_eq!(emb.forward(&bad, &[2]), Err(want.clone()));
    assert_eq!(emb.forward_into(&good, &mut []), Ok(()));
    assert_eq!(emb.forward_into(&bad, &mut []), Err(want.clone()));
    assert_eq!(emb.lookup_into(&good, &mut []), Ok(()));
    assert_eq!(emb.lookup_into(&bad, &mut []), Err(want.clone()));
    assert_eq!(emb.row(4u32), Ok(&[][..]));
    assert_eq!(emb.row(5u32), Err(out_of_range(0, 5, 5)));
    assert_eq!(emb.backward_dense(&[], &good), Ok(vec![]));
    assert_eq!(emb.backward_dense(&[], &bad), Err(want.clone()));
    assert_eq!(emb.backward_dense_into(&[], &good, &mut []), Ok(()));
    assert_eq!(
        emb.backward_dense_into(&[], &bad, &mut []),
        Err(want.clone())
    );
    let sparse = emb.backward_sparse(&[], &good).unwrap();
    assert_eq!(sparse.indices(), [0]); // the padding row has no gradient
    assert_eq!(emb.backward_sparse(&[], &bad), Err(want.clone()));
    assert_eq!(emb.backward(&[], &good), Ok(Gradient::Dense(vec![])));
    let mut adagrad = Adagrad::new(0.1);
    assert_eq!(emb.sparse_step(&[], &good, &mut adagrad), Ok(()));
    assert_eq!(emb.sparse_step(&[], &bad, &mut adagrad), Err(want.clone()));
    assert_eq!(emb.apply_sparse(&sparse, &mut adagrad), Ok(()));
    assert_eq!(emb.dense_sgd_step(&[], &Sgd::new(0.1)), Ok(()));

    for format in [Format::F32, Format::F16, Format::Bf16, Format::Int8] {
        let quantized = QuantizedEmbedding::from_float(&emb, format).unwrap();
        assert_eq!(quantized.num_embeddings(), 5, "{format:?}");
        let got = quantized.forward(&good, &[3]).map(|e| e.shape);
        assert_eq!(got, Ok(vec![3, 0]), "{format:?}");
        let got = quantized.forward(&bad, &[2]);
        assert_eq!(got, Err(want.clone()), "{format:?}");
    }

    // The flat-table kernels count rows by len / dim: none here.
    let got = gather(&[], 0, &[0u32], &mut []);
    assert_eq!(got, Err(out_of_range(0, 0, 0)));
}

#[test]
fn a_bag_layer_of_width_zero_knows_its_rows_in_every_entry_point() {
    let bags = Bags::from_offsets(&[0u32, 1], 3, false).unwrap();
    let good = [0u32, 4, 2];
    let bad = [0u32, 4, 5];
    let want = out_of_range(2, 5, 5);
    for mode in [Mode::Sum, Mode::Mean, Mode::Max] {
        let options = EmbeddingBagOptions {
            mode,
            sparse: true,
            ..EmbeddingBagOptions::default()
        };
        let mut bag = EmbeddingBag::with_options(5, 0, options).unwrap();
        let out = bag.forward(&good, &bags, None).unwrap();
        assert_eq!(out.shape, [2, 0]);
        let indices = out.max_indices.as_deref();
        assert_eq!(bag.forward(&bad, &bags, None).err(), Some(want.clone()));
        let got = bag.forward_into(&bad, &bags, None, &mut [], &mut []);
        assert_eq!(got, Err(want.clone()), "{mode}");

        let got = bag.backward(&[], &good, &bags, None, indices);
        assert!(matches!(got, Ok(Gradient::Sparse(_))), "{mode}: {got:?}");
        let got = bag.backward(&[], &bad, &bags, None, indices);
        assert_eq!(got, Err(want.clone()), "{mode}");
        let got = bag.backward_dense_into(&[], &good, &bags, None, indices, &mut []);
        assert_eq!(got, Ok(()), "{mode}");
        let got = bag.backward_dense_into(&[], &bad, &bags, None, indices, &mut []);
        assert_eq!(got, Err(want.clone()), "{mode}");
        let got = bag.backward_sparse(&[], &bad, &bags, None, indices);
        assert_eq!(got, Err(want.clone()), "{mode}");
        let got = bag.sparse_step(&[], &bad, &bags, None, &mut Sgd::new(0.1));
        assert_eq!(got, Err(want.clone()), "{mode}");
        let got = bag.sparse_step(&[], &good, &bags, None, &mut Sgd::new(0.1));
        let ok = if mode == Mode::Max {
            Err(EmbeddingError::MaxNeedsIndices)
        } else {
            Ok(())
        };
        assert_eq!(got, ok, "{mode}");

        let qbag = QuantizedEmbeddingBag::from_float(&bag, Format::Int8).unwrap();
        assert_eq!(qbag.num_embeddings(), 5);
        assert_eq!(
            qbag.forward(&good, &bags, None).map(|o| o.shape),
            Ok([2, 0])
        );
        assert_eq!(qbag.forward(&bad, &bags, None).err(), Some(want.clone()));
    }
    // The kernel that takes num_embeddings as a number honours it too.
    let got = bag_sparse_backward(&[], 0, &good, &bags, &sum(None), 5);
    assert_eq!(got.map(|g| g.indices().to_vec()), Ok(vec![0, 2, 4]));
}

#[test]
fn max_bag_backward_checks_in_one_order_in_every_entry_point() {
    // A bad grad_output, a bad id and no max_indices at once: every
    // backward entry point names grad_output first, then the id, then the
    // missing indices.
    let options = EmbeddingBagOptions {
        mode: Mode::Max,
        seed: Some(1),
        ..EmbeddingBagOptions::default()
    };
    let dense = EmbeddingBag::with_options(4, 2, options.clone()).unwrap();
    let sparse = EmbeddingBag::with_options(
        4,
        2,
        EmbeddingBagOptions {
            sparse: true,
            ..options
        },
    )
    .unwrap();
    let bags = Bags::fixed(1, 2).unwrap();
    let short = EmbeddingError::LengthMismatch {
        operand: Operand::GradOutput,
        expected: 2,
        got: 1,
    };
    let cases: [(&[f32], [i64; 2], EmbeddingError); 3] = [
        (&[1.0], [0, 9], short),
        (&[1.0, 1.0], [0, 9], out_of_range(1, 9, 4)),
        (&[1.0, 1.0], [0, 1], EmbeddingError::MaxNeedsIndices),
    ];
    for (grad, ids, want) in cases {
        let want = Err(want);
        let dense_grad = dense.backward(grad, &ids, &bags, None, None).map(drop);
        assert_eq!(dense_grad, want, "backward");
        let got = dense.backward_dense_into(grad, &ids, &bags, None, None, &mut [0.0; 8]);
        assert_eq!(got, want, "backward_dense_into");
        let got = dense
            .backward_sparse(grad, &ids, &bags, None, None)
            .map(drop);
        assert_eq!(got, want, "backward_sparse");
        let got = sparse.backward(grad, &ids, &bags, None, None).map(drop);
        assert_eq!(got, want, "sparse backward");
    }
}

#[test]
fn the_reference_products_refuse_slices_their_shapes_do_not_fit() {
    use embedding_kernels::reference::{matmul, matmul_tn_acc};
    let mismatch = |operand, expected, got| EmbeddingError::LengthMismatch {
        operand,
        expected,
        got,
    };
    let (a, b) = ([1.0f32; 6], [2.0f32; 6]);
    // A 2 × 3 by 3 × 2 product, with each slice one value short in turn.
    assert_eq!(matmul(&a, &b, 2, 3, 2).unwrap(), [6.0; 4]);
    assert_eq!(
        matmul(&a[..5], &b, 2, 3, 2).unwrap_err(),
        mismatch(Operand::MatrixA, 6, 5)
    );
    assert_eq!(
        matmul(&a, &b[..5], 2, 3, 2).unwrap_err(),
        mismatch(Operand::MatrixB, 6, 5)
    );
    assert_eq!(
        matmul(&a, &b, usize::MAX, 3, 2).unwrap_err(),
        EmbeddingError::SizeOverflow {
            count: usize::MAX,
            dim: 3
        }
    );
    // Cᵀ-accumulate: A 2 × 3, B 2 × 3, C 3 × 3; a refused call leaves C alone.
    let mut c = [0.5f32; 9];
    assert_eq!(
        matmul_tn_acc(&a, &b, &mut c[..8], 2, 3, 3).unwrap_err(),
        mismatch(Operand::MatrixC, 9, 8)
    );
    assert_eq!(
        matmul_tn_acc(&a[..5], &b, &mut c, 2, 3, 3).unwrap_err(),
        mismatch(Operand::MatrixA, 6, 5)
    );
    assert_eq!(
        matmul_tn_acc(&a, &b[..5], &mut c, 2, 3, 3).unwrap_err(),
        mismatch(Operand::MatrixB, 6, 5)
    );
    assert_eq!(c, [0.5; 9]);
    matmul_tn_acc(&a, &b, &mut c, 2, 3, 3).unwrap();
    assert_eq!(c, [4.5; 9]);
}
