//! The inference layers over tables of every format: built from an `f32`
//! layer with `from_float`, they give the kernels' results on the converted
//! table (and, in `f32`, the `f32` layer's own bits), keep the layer's
//! mode, padding row and offsets rule, refuse `max_norm`, and check their
//! arguments as the kernels do.

use crate::common;

use crate::common::SplitMix;
use embedding_kernels::formats::{Format, OwnedTable};
use embedding_kernels::{
    Embedding, EmbeddingBag, EmbeddingBagOptions, EmbeddingError, EmbeddingOptions, Mode, Pooling,
    QuantizedEmbedding, QuantizedEmbeddingBag, table_bag_forward, table_gather,
};

fn bag_layer(rows: usize, dim: usize, options: EmbeddingBagOptions) -> EmbeddingBag {
    EmbeddingBag::with_options(
        rows,
        dim,
        EmbeddingBagOptions {
            seed: Some(7),
            ..options
        },
    )
    .unwrap()
}

/// Every format and mode: the layer's output is `table_bag_forward` on the
/// table `from_float` made, with the layer's padding row and offsets rule;
/// an `f32` layer made this way gives the `f32` layer's bits.
#[test]
fn bag_layers_pool_their_converted_table() {
    let mut rng = SplitMix(51);
    let (rows, dim) = (40, 19);
    let n = 60;
    let ids: Vec<i64> = (0..n).map(|_| (rng.next() % rows as u64) as i64).collect();
    let offsets = [0usize, 5, 5, 23, 40, 60];
    for mode in [Mode::Sum, Mode::Mean, Mode::Max] {
        let options = EmbeddingBagOptions {
            mode,
            padding_idx: Some(3),
            include_last_offset: true,
            ..EmbeddingBagOptions::default()
        };
        let mut f32_bag = bag_layer(rows, dim, options);
        let bags = f32_bag.offsets(&offsets, n).unwrap();
        assert_eq!(bags.len(), offsets.len() - 1, "include_last_offset kept");
        for format in Format::ALL {
            let layer = QuantizedEmbeddingBag::from_float(&f32_bag, format).unwrap();
            assert_eq!(
                (layer.format(), layer.mode(), layer.padding_idx()),
                (format, mode, Some(3))
            );
            assert_eq!((layer.num_embeddings(), layer.embedding_dim()), (rows, dim));
            let got = layer
                .forward(&ids, &layer.offsets(&offsets, n).unwrap(), None)
                .unwrap();
            let table = OwnedTable::from_f32(f32_bag.table().weight(), dim, format).unwrap();
            let pooling = Pooling {
                mode,
                padding_idx: Some(3),
                ..Pooling::default()
            };
            let mut want = vec![0.0; bags.len() * dim];
            let mut at = vec![0i64; if mode == Mode::Max { want.len() } else { 0 }];
            table_bag_forward(table.as_ref(), &ids, &bags, &pooling, &mut want, &mut at).unwrap();
            assert_eq!(
                common::bits(&got.values),
                common::bits(&want),
                "{format} {mode:?}"
            );
            assert_eq!(
                got.max_indices,
                (mode == Mode::Max).then_some(at),
                "{format}"
            );
            assert_eq!(got.shape, [bags.len(), dim]);
            if format == Format::F32 {
                let theirs = f32_bag.forward(&ids, &bags, None).unwrap();
                assert_eq!(common::bits(&got.values), common::bits(&theirs.values));
            }
        }
    }
}

/// Reduced formats stay close to the `f32` bags: an 8-bit row is within
/// half a level of its `f32` row, so a sum of 16 within 8 levels of a row's
/// range (and `f16` much closer).
#[test]
fn reduced_bags_stay_near_the_f32_bags() {
    let (rows, dim) = (100, 64);
    let mut f32_bag = bag_layer(
        rows,
        dim,
        EmbeddingBagOptions {
            mode: Mode::Sum,
            ..EmbeddingBagOptions::default()
        },
    );
    let ids: Vec<u32> = (0..160).map(|i| (i * 37 % rows) as u32).collect();
    let bags = embedding_kernels::Bags::fixed(10, 16).unwrap();
    let want = f32_bag.forward(&ids, &bags, None).unwrap().values;
    let range = {
        let w = f32_bag.table().weight();
        w.iter().copied().fold(f32::MIN, f32::max) - w.iter().copied().fold(f32::MAX, f32::min)
    };
    for (format, levels) in [
        (Format::F16, 2048.0),
        (Format::Int8, 255.0),
        (Format::Int4, 15.0),
    ] {
        let layer = QuantizedEmbeddingBag::from_float(&f32_bag, format).unwrap();
        let got = layer.forward(&ids, &bags, None).unwrap().values;
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(
            worst <= 16.0 * range / levels,
            "{format}: {worst} against range {range}"
        );
        assert!(worst > 0.0, "{format} is a reduced format");
    }
}

/// `max_norm` would write the table: refused, with the argument named.
#[test]
fn max_norm_is_refused() {
    let emb = Embedding::with_options(
        10,
        4,
        EmbeddingOptions {
            max_norm: Some(1.0),
            seed: Some(1),
            ..EmbeddingOptions::default()
        },
    )
    .unwrap();
    let err = QuantizedEmbedding::from_float(&emb, Format::Int8).unwrap_err();
    assert!(matches!(
        err,
        EmbeddingError::InvalidArgument {
            name: "max_norm",
            ..
        }
    ));
    let bag = EmbeddingBag::from_embedding(emb, Mode::Sum, false).unwrap();
    let err = QuantizedEmbeddingBag::from_float(&bag, Format::F16).unwrap_err();
    assert!(matches!(
        err,
        EmbeddingError::InvalidArgument {
            name: "max_norm",
            ..
        }
    ));
}

/// The lookup layer: `table_gather` on the converted table, shaped as the
/// batch; its errors leave the output alone.
#[test]
fn lookup_layers_read_their_converted_table() {
    let (rows, dim) = (30, 12);
    let emb = Embedding::with_options(
        rows,
        dim,
        EmbeddingOptions {
            seed: Some(3),
            ..EmbeddingOptions::default()
        },
    )
    .unwrap();
    let ids: Vec<i32> = vec![4, 0, 29, 4, 17, 8];
    for format in Format::ALL {
        let layer = QuantizedEmbedding::from_float(&emb, format).unwrap();
        let got = layer.forward(&ids, &[2, 3]).unwrap();
        assert_eq!(got.shape, vec![2, 3, dim]);
        let table = OwnedTable::from_f32(emb.weight(), dim, format).unwrap();
        let mut want = vec![0.0; ids.len() * dim];
        table_gather(table.as_ref(), &ids, &mut want).unwrap();
        assert_eq!(common::bits(&got.values), common::bits(&want), "{format}");
        assert_eq!(
            layer.forward(&ids, &[4, 2]).unwrap_err(),
            EmbeddingError::IdsShape {
                shape: vec![4, 2],
                len: 6
            }
        );
        let mut out = vec![f32::NAN; 2 * dim];
        let err = layer.forward_into(&[1i32, 30], &mut out).unwrap_err();
        assert!(
            matches!(err, EmbeddingError::IndexOutOfRange { position: 1, .. }),
            "{err:?}"
        );
        assert!(out.iter().all(|x| x.is_nan()), "{format}: nothing written");
    }
}

/// A layer over a table in hand checks its padding row.
#[test]
fn from_table_checks_the_padding_row() {
    let table = OwnedTable::from_f32(&[0.5; 12], 3, Format::Int4).unwrap();
    let err =
        QuantizedEmbeddingBag::from_table(table.clone(), Mode::Sum, Some(4), false).unwrap_err();
    assert_eq!(
        err,
        EmbeddingError::PaddingIdxOutOfRange {
            padding_idx: 4,
            num_embeddings: 4
        }
    );
    let layer = QuantizedEmbeddingBag::from_table(table, Mode::Sum, Some(3), false).unwrap();
    let out = layer
        .forward(&[3i64, 3], &layer.offsets(&[0usize], 2).unwrap(), None)
        .unwrap();
    assert_eq!(out.values, vec![0.0; 3], "a bag of padding only is zeros");
}

/// A layer saved and loaded keeps its table to the byte and its results to
/// the bit, in every format.
#[test]
fn layers_round_trip_through_safetensors() {
    let dir = std::env::temp_dir().join(format!("ek-quantized-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f32_bag = bag_layer(
        25,
        10,
        EmbeddingBagOptions {
            mode: Mode::Max,
            ..EmbeddingBagOptions::default()
        },
    );
    let ids: Vec<u32> = (0..30).map(|i| i * 7 % 25).collect();
    let bags = embedding_kernels::Bags::fixed(5, 6).unwrap();
    for format in Format::ALL {
        let path = dir.join(format!("{format}.safetensors"));
        let layer = QuantizedEmbeddingBag::from_float(&f32_bag, format).unwrap();
        layer.save(&path, "weight").unwrap();
        let back = QuantizedEmbeddingBag::load(&path, "weight", Mode::Max, None, false).unwrap();
        assert_eq!(back.table(), layer.table(), "{format}");
        assert_eq!(
            back.forward(&ids, &bags, None).unwrap(),
            layer.forward(&ids, &bags, None).unwrap()
        );
        let lookup = QuantizedEmbedding::load(&path, "weight").unwrap();
        assert_eq!(lookup.table(), layer.table());
        let err = QuantizedEmbeddingBag::load(&path, "weight", Mode::Sum, Some(25), false);
        assert!(
            matches!(err, Err(embedding_kernels::io::FileError::Table { .. })),
            "{format}: padding past the table"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
