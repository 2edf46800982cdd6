//! The candle inference layers over packed tables against the obvious
//! composition: the table dequantized (`OwnedTable::to_f32`), then candle's
//! own ops on the `f32` result (`candle_nn::Embedding`, or `index_select`
//! and a reduction per bag).

use candle_core::{DType, Device, Tensor};
use candle_nn::Module;
use embedding_kernels::Mode;
use embedding_kernels::candle::{
    Embedding, EmbeddingBag, QuantizedEmbedding, QuantizedEmbeddingBag,
};
use embedding_kernels::formats::{Format, OwnedTable};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const CPU: Device = Device::Cpu;

/// A packed `[rows, dim]` table of random values and its dequantized copy
/// as a candle tensor.
fn packed(rng: &mut ChaCha8Rng, rows: usize, dim: usize, format: Format) -> (OwnedTable, Tensor) {
    let values: Vec<f32> = (0..rows * dim)
        .map(|_| rng.random_range(-4.0f32..4.0))
        .collect();
    let table = OwnedTable::from_f32(&values, dim, format).unwrap();
    let plain = Tensor::from_vec(table.to_f32().unwrap(), (rows, dim), &CPU).unwrap();
    (table, plain)
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

/// A lookup is a copy of the decoded rows: the same bits as candle_nn on
/// the dequantized table, for every format, id dtype and ids shape.
#[test]
fn lookup_equals_candle_nn_on_the_dequantized_table() {
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    for case in 0..72 {
        let format = Format::ALL[case % Format::ALL.len()];
        let rows = rng.random_range(1..=60);
        // Odd widths, so a 4- or 2-bit row ends inside a byte.
        let dim = rng.random_range(1..=19);
        let (table, plain) = packed(&mut rng, rows, dim, format);
        let (b, t) = (rng.random_range(0..=4), rng.random_range(1..=6));
        let ids: Vec<i64> = (0..b * t)
            .map(|_| rng.random_range(0..rows as i64))
            .collect();
        let ids = Tensor::new(ids.as_slice(), &CPU)
            .unwrap()
            .reshape((b, t))
            .unwrap();
        let id_dtype = [DType::U32, DType::I64, DType::I32, DType::U8][case % 4];
        let ids = ids.to_dtype(id_dtype).unwrap();

        let ours = QuantizedEmbedding::from_table(table).forward(&ids).unwrap();
        let candle_ids = ids.to_dtype(DType::I64).unwrap();
        let theirs = candle_nn::Embedding::new(plain, dim)
            .forward(&candle_ids)
            .unwrap();
        assert_eq!(ours.dims(), [b, t, dim], "case {case}");
        assert_eq!(ours.dtype(), DType::F32);
        assert_eq!(bits(&ours), bits(&theirs), "case {case}: {format:?}");
    }
}

/// candle's composition of one bag: the rows (padding left out), weighted,
/// then summed, averaged or maxed; zeros when the bag is empty.
fn candle_bag(
    plain: &Tensor,
    ids: &[i64],
    weights: Option<&[f32]>,
    mode: Mode,
    padding_idx: Option<usize>,
) -> Tensor {
    let dim = plain.dim(1).unwrap();
    let kept: Vec<usize> = (0..ids.len())
        .filter(|&p| Some(ids[p] as usize) != padding_idx)
        .collect();
    if kept.is_empty() {
        return Tensor::zeros(dim, DType::F32, &CPU).unwrap();
    }
    let bag_ids: Vec<i64> = kept.iter().map(|&p| ids[p]).collect();
    let rows = plain
        .index_select(&Tensor::new(bag_ids.as_slice(), &CPU).unwrap(), 0)
        .unwrap();
    let rows = match weights {
        Some(w) => {
            let w: Vec<f32> = kept.iter().map(|&p| w[p]).collect();
            let w = Tensor::new(w.as_slice(), &CPU)
                .unwrap()
                .unsqueeze(1)
                .unwrap();
            rows.broadcast_mul(&w).unwrap()
        }
        None => rows,
    };
    match mode {
        Mode::Sum => rows.sum(0),
        Mode::Mean => rows.mean(0),
        Mode::Max => rows.max(0),
    }
    .unwrap()
}

/// The largest difference between two tensors of one shape.
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

/// Bags of every mode over every format, with empty bags, `padding_idx`,
/// per-sample weights and `include_last_offset`, against candle's
/// composition on the dequantized table. Max takes the same values, so it
/// is compared bit for bit; sums and means add in another order, so they
/// are compared within a bound.
#[test]
fn bags_equal_candle_composition_on_the_dequantized_table() {
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    let mut worst = 0f32;
    for case in 0..90 {
        let format = Format::ALL[case % Format::ALL.len()];
        let mode = [Mode::Sum, Mode::Mean, Mode::Max][(case / 6) % 3];
        let rows = rng.random_range(4..=40);
        let dim = rng.random_range(1..=17);
        let (table, plain) = packed(&mut rng, rows, dim, format);
        let num_bags = rng.random_range(1..=6);
        let mut starts = vec![0usize];
        let mut ids: Vec<i64> = Vec::new();
        for _ in 0..num_bags {
            let len = rng.random_range(0..=7);
            ids.extend((0..len).map(|_| rng.random_range(0..rows as i64)));
            starts.push(ids.len());
        }
        let padding_idx = (case % 4 == 1).then(|| rng.random_range(0..rows));
        let weights: Option<Vec<f32>> = (mode == Mode::Sum && case % 3 == 0).then(|| {
            (0..ids.len())
                .map(|_| rng.random_range(-2.0..2.0))
                .collect()
        });
        let include_last = case % 2 == 0;
        let offsets: Vec<u32> = match include_last {
            true => starts.iter().map(|&s| s as u32).collect(),
            false => starts[..num_bags].iter().map(|&s| s as u32).collect(),
        };

        let layer = QuantizedEmbeddingBag::from_table(table, mode, padding_idx).unwrap();
        let psw = weights
            .as_ref()
            .map(|w| Tensor::new(w.as_slice(), &CPU).unwrap());
        let ours = layer
            .forward_offsets(
                &Tensor::new(ids.as_slice(), &CPU).unwrap(),
                &Tensor::new(offsets.as_slice(), &CPU).unwrap(),
                include_last,
                psw.as_ref(),
            )
            .unwrap();
        let theirs: Vec<Tensor> = starts
            .windows(2)
            .map(|w| {
                let bag_weights = weights.as_ref().map(|v| &v[w[0]..w[1]]);
                candle_bag(&plain, &ids[w[0]..w[1]], bag_weights, mode, padding_idx)
            })
            .collect();
        let theirs = Tensor::stack(&theirs, 0).unwrap();
        assert_eq!(ours.dims(), [num_bags, dim], "case {case}");
        if mode == Mode::Max {
            assert_eq!(bits(&ours), bits(&theirs), "case {case}: {format:?}");
        } else {
            // At most 7 terms of |x| <= 4 (times |w| <= 2): a few ulps of 56.
            let diff = max_diff(&ours, &theirs);
            assert!(diff <= 1e-4, "case {case}: {format:?} {mode:?}: {diff}");
            worst = worst.max(diff);
        }
    }
    eprintln!("largest difference of a sum or mean: {worst:e}");
}

/// Fixed-length bags through `Module::forward` equal the same bags cut by
/// offsets.
#[test]
fn fixed_bags_equal_offsets() {
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    for mode in [Mode::Sum, Mode::Mean, Mode::Max] {
        let (table, _) = packed(&mut rng, 30, 9, Format::Int4);
        let layer = QuantizedEmbeddingBag::from_table(table, mode, None).unwrap();
        let ids: Vec<u32> = (0..12).map(|_| rng.random_range(0..30)).collect();
        let flat = Tensor::new(ids.as_slice(), &CPU).unwrap();
        let fixed = layer.forward(&flat.reshape((3, 4)).unwrap()).unwrap();
        let offsets = Tensor::new(&[0u32, 4, 8], &CPU).unwrap();
        let cut = layer.forward_offsets(&flat, &offsets, false, None).unwrap();
        assert_eq!(bits(&fixed), bits(&cut), "{mode:?}");
    }
}

/// `from_float` packs the candle layer's table as `OwnedTable::from_f32`
/// packs the same values, whatever the float dtype of the candle table.
#[test]
fn from_float_packs_the_candle_table() {
    let mut rng = ChaCha8Rng::seed_from_u64(24);
    let values: Vec<f32> = (0..20 * 6).map(|_| rng.random_range(-1.0..1.0)).collect();
    let weight = Tensor::from_vec(values, (20, 6), &CPU).unwrap();
    let ids = Tensor::new(&[[19u32, 0, 7], [3, 3, 11]], &CPU).unwrap();
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let weight = weight.to_dtype(dtype).unwrap();
        let widened: Vec<f32> = weight
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for format in Format::ALL {
            let direct = OwnedTable::from_f32(&widened, 6, format).unwrap();
            let want = QuantizedEmbedding::from_table(direct.try_clone().unwrap())
                .forward(&ids)
                .unwrap();
            let emb = Embedding::from_tensor(weight.clone()).unwrap();
            let got = QuantizedEmbedding::from_float(&emb, format).unwrap();
            assert_eq!(bits(&got.forward(&ids).unwrap()), bits(&want));
            assert_eq!(got.layer().format(), format);
            if dtype == DType::F32 {
                let bag = EmbeddingBag::from_tensor(weight.clone(), Mode::Mean)
                    .unwrap()
                    .with_padding_idx(Some(3));
                let qbag = QuantizedEmbeddingBag::from_float(&bag, format).unwrap();
                assert_eq!(qbag.layer().mode(), Mode::Mean);
                assert_eq!(qbag.layer().padding_idx(), Some(3));
                assert_eq!(
                    qbag.layer().table().to_le_bytes().unwrap(),
                    direct.to_le_bytes().unwrap()
                );
            }
        }
    }
}

/// Every bad input is a candle error, and the message says what was wrong.
#[test]
fn bad_inputs_are_errors() {
    let mut rng = ChaCha8Rng::seed_from_u64(25);
    let (table, _) = packed(&mut rng, 5, 4, Format::Int8);
    let emb = QuantizedEmbedding::from_table(table.try_clone().unwrap());
    let err = emb
        .forward(&Tensor::new(&[0i64, 4, 5], &CPU).unwrap())
        .unwrap_err();
    assert!(err.to_string().contains("id 5 at position 2"), "{err}");
    let err = emb
        .forward(&Tensor::new(&[-1i32], &CPU).unwrap())
        .unwrap_err();
    assert!(err.to_string().contains("-1"), "{err}");
    assert!(emb.forward(&Tensor::new(&[1f32], &CPU).unwrap()).is_err());

    let bag =
        QuantizedEmbeddingBag::from_table(table.try_clone().unwrap(), Mode::Mean, None).unwrap();
    let ids = Tensor::new(&[0u32, 1, 2], &CPU).unwrap();
    // Offsets that go down, or start past the ids.
    for offsets in [&[0u32, 2, 1][..], &[4u32][..]] {
        let offsets = Tensor::new(offsets, &CPU).unwrap();
        assert!(bag.forward_offsets(&ids, &offsets, false, None).is_err());
    }
    // Weights with a mean, weights of the wrong length or dtype.
    let offsets = Tensor::new(&[0u32], &CPU).unwrap();
    let w = Tensor::new(&[1f32, 1., 1.], &CPU).unwrap();
    assert!(
        bag.forward_offsets(&ids, &offsets, false, Some(&w))
            .is_err()
    );
    let sum =
        QuantizedEmbeddingBag::from_table(table.try_clone().unwrap(), Mode::Sum, None).unwrap();
    let short = Tensor::new(&[1f32, 1.], &CPU).unwrap();
    assert!(
        sum.forward_offsets(&ids, &offsets, false, Some(&short))
            .is_err()
    );
    let wide = Tensor::new(&[1f64, 1., 1.], &CPU).unwrap();
    assert!(
        sum.forward_offsets(&ids, &offsets, false, Some(&wide))
            .is_err()
    );
    // Ids of the wrong rank.
    assert!(sum.forward(&ids).is_err());
    assert!(
        bag.forward_offsets(&ids.reshape((1, 3)).unwrap(), &offsets, false, None)
            .is_err()
    );
    // A padding row past the table.
    assert!(QuantizedEmbeddingBag::from_table(table, Mode::Sum, Some(5)).is_err());
    // A table that is not a float matrix.
    let ints = Tensor::new(&[[1u32, 2], [3, 4]], &CPU).unwrap();
    assert!(Embedding::from_tensor(ints).is_err());
    let nan = Tensor::new(&[[1f32, f32::NAN]], &CPU).unwrap();
    let emb = Embedding::from_tensor(nan).unwrap();
    assert!(QuantizedEmbedding::from_float(&emb, Format::Int8).is_err());
}
