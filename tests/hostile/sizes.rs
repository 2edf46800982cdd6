//! Sizes: products past `usize` are `SizeOverflow`, buffers no machine
//! grants are `AllocationFailed` with the exact byte count, and every
//! argument check comes before the allocation it guards.
//!
//! "No machine grants" is 2^48 bytes (256 TiB): more than the 47 bits of
//! user address space of x86-64 and aarch64 Linux, so the request fails
//! whatever the overcommit setting.

use embedding_kernels::formats::{Format, OwnedTable};
use embedding_kernels::memory::{AlignedTable, zeroed_table};
use embedding_kernels::positions::sinusoidal_positions;
use embedding_kernels::reference::{matmul, one_hot};
use embedding_kernels::{
    Bags, Embedding, EmbeddingBag, EmbeddingBagOptions, EmbeddingError, EmbeddingOptions,
    InputEmbedding, Mode, QuantizedEmbedding, QuantizedEmbeddingBag, SparseGrad,
};

/// 2^46 floats: 2^48 bytes.
const HUGE_FLOATS: usize = 1 << 46;
const HUGE_BYTES: u128 = 1 << 48;

fn refused(what: &'static str, bytes: u128) -> EmbeddingError {
    EmbeddingError::AllocationFailed { what, bytes }
}

fn overflow(count: usize, dim: usize) -> EmbeddingError {
    EmbeddingError::SizeOverflow { count, dim }
}

#[test]
fn layer_tables_past_usize_or_past_any_memory_are_errors() {
    assert_eq!(
        Embedding::new(usize::MAX, 2).unwrap_err(),
        overflow(usize::MAX, 2)
    );
    assert_eq!(
        Embedding::new(1 << 44, 4).unwrap_err(),
        refused("table", HUGE_BYTES)
    );
    assert_eq!(
        EmbeddingBag::new(usize::MAX, 2).unwrap_err(),
        overflow(usize::MAX, 2)
    );
    assert_eq!(
        EmbeddingBag::new(1 << 44, 4).unwrap_err(),
        refused("table", HUGE_BYTES)
    );
    // Options are checked before the table is allocated.
    let options = EmbeddingOptions {
        padding_idx: Some(1 << 45),
        ..EmbeddingOptions::default()
    };
    assert!(matches!(
        Embedding::with_options(1 << 44, 4, options),
        Err(EmbeddingError::PaddingIdxOutOfRange { .. })
    ));
}

#[test]
fn position_tables_past_usize_or_past_any_memory_are_errors() {
    assert_eq!(
        sinusoidal_positions(usize::MAX, 2).unwrap_err(),
        overflow(usize::MAX, 2)
    );
    assert_eq!(
        sinusoidal_positions(1 << 44, 4).unwrap_err(),
        refused("positions", HUGE_BYTES)
    );
    assert_eq!(
        sinusoidal_positions(1, usize::MAX).unwrap_err(),
        refused("positions", usize::MAX as u128 * 4)
    );
    // No values: nothing asked for, whatever the other size.
    assert_eq!(sinusoidal_positions(0, usize::MAX), Ok(Vec::new()));
    assert_eq!(sinusoidal_positions(usize::MAX, 0), Ok(Vec::new()));

    let tokens = || Embedding::new(3, 4).unwrap();
    assert_eq!(
        InputEmbedding::sinusoidal(tokens(), 1 << 44, false).unwrap_err(),
        refused("positions", HUGE_BYTES)
    );
    assert_eq!(
        InputEmbedding::learned(tokens(), 1 << 44, 7, false).unwrap_err(),
        refused("table", HUGE_BYTES)
    );
    assert_eq!(
        InputEmbedding::learned(tokens(), usize::MAX, 7, false).unwrap_err(),
        overflow(usize::MAX, 4)
    );
}

#[test]
fn zeroed_and_aligned_tables_report_the_bytes_asked_for() {
    assert_eq!(
        zeroed_table(HUGE_FLOATS).unwrap_err(),
        refused("table", HUGE_BYTES)
    );
    assert_eq!(
        zeroed_table(usize::MAX).unwrap_err(),
        refused("table", usize::MAX as u128 * 4)
    );
    assert_eq!(
        AlignedTable::zeroed(HUGE_FLOATS).unwrap_err(),
        refused("table", HUGE_BYTES)
    );
    assert_eq!(
        AlignedTable::zeroed(usize::MAX).unwrap_err(),
        refused("table", usize::MAX as u128 * 4)
    );
    assert_eq!(zeroed_table(5).unwrap(), vec![0.0; 5]);
}

#[test]
fn a_dense_gradient_of_a_huge_table_is_an_error() {
    let empty = |rows| SparseGrad::new(Vec::new(), Vec::new(), rows, 4).unwrap();
    assert_eq!(
        SparseGrad::new(Vec::new(), Vec::new(), usize::MAX, 2)
            .unwrap()
            .to_dense()
            .unwrap_err(),
        overflow(usize::MAX, 2)
    );
    assert_eq!(
        empty(1 << 44).to_dense().unwrap_err(),
        refused("gradient", HUGE_BYTES)
    );
    let grad = SparseGrad::new(vec![1], vec![1.0, 2.0, 3.0, 4.0], 3, 4).unwrap();
    assert_eq!(
        grad.to_dense().unwrap(),
        [0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0]
    );
}

#[test]
fn fixed_bags_past_usize_or_past_any_memory_are_errors() {
    assert_eq!(
        Bags::fixed(usize::MAX, 2).unwrap_err(),
        overflow(usize::MAX, 2)
    );
    assert!(matches!(
        Bags::fixed(1 << 60, 0),
        Err(EmbeddingError::AllocationFailed { what: "bag starts", bytes })
            if bytes == ((1u128 << 60) + 1) * 8
    ));
}

#[test]
fn layer_outputs_past_usize_or_past_any_memory_are_errors() {
    // A table of no rows may be as wide as it likes.
    let mut emb = Embedding::from_pretrained(Vec::new(), usize::MAX, false).unwrap();
    assert_eq!(
        emb.forward(&[0u32, 0], &[2]).unwrap_err(),
        overflow(2, usize::MAX)
    );
    assert_eq!(
        emb.forward_into(&[0u32, 0], &mut []).unwrap_err(),
        overflow(2, usize::MAX)
    );

    for mode in [Mode::Sum, Mode::Mean, Mode::Max] {
        let options = EmbeddingBagOptions {
            mode,
            ..EmbeddingBagOptions::default()
        };
        let mut bag =
            EmbeddingBag::from_pretrained(Vec::new(), usize::MAX, false, options.clone()).unwrap();
        let no_ids: &[u32] = &[];
        assert_eq!(
            bag.forward(no_ids, &Bags::fixed(2, 0).unwrap(), None)
                .unwrap_err(),
            overflow(2, usize::MAX),
            "{mode}"
        );
        // One empty bag of 2^46 values: a valid call whose output no
        // machine holds.
        let mut bag =
            EmbeddingBag::from_pretrained(Vec::new(), HUGE_FLOATS, false, options).unwrap();
        assert_eq!(
            bag.forward(no_ids, &Bags::fixed(1, 0).unwrap(), None)
                .unwrap_err(),
            refused("output", HUGE_BYTES),
            "{mode}"
        );
    }

    let table = OwnedTable::from_le_bytes(Format::F16, HUGE_FLOATS, &[]).unwrap();
    let quantized = QuantizedEmbeddingBag::from_table(table, Mode::Sum, None, false).unwrap();
    let no_ids: &[u32] = &[];
    assert_eq!(
        quantized
            .forward(no_ids, &Bags::fixed(1, 0).unwrap(), None)
            .unwrap_err(),
        refused("output", HUGE_BYTES)
    );
    let wide = usize::MAX / 2;
    let table = OwnedTable::from_le_bytes(Format::F16, wide, &[]).unwrap();
    let quantized = QuantizedEmbeddingBag::from_table(table, Mode::Sum, None, false).unwrap();
    assert_eq!(
        quantized
            .forward(no_ids, &Bags::fixed(3, 0).unwrap(), None)
            .unwrap_err(),
        overflow(3, wide)
    );
}

#[test]
fn every_check_comes_before_the_allocation_it_guards() {
    // Each call would allocate 2^48 bytes, but a bad id is found first (it
    // used to abort allocating the output before looking at the ids).
    let mut emb = Embedding::from_pretrained(Vec::new(), HUGE_FLOATS, false).unwrap();
    let bad = EmbeddingError::IndexOutOfRange {
        position: 0,
        index: 0,
        num_embeddings: 0,
    };
    assert_eq!(emb.forward(&[0u32], &[1]).unwrap_err(), bad);

    for mode in [Mode::Sum, Mode::Max] {
        let options = EmbeddingBagOptions {
            mode,
            ..EmbeddingBagOptions::default()
        };
        let mut bag =
            EmbeddingBag::from_pretrained(Vec::new(), HUGE_FLOATS, false, options).unwrap();
        let bags = Bags::fixed(1, 1).unwrap();
        assert_eq!(
            bag.forward(&[0u32], &bags, None).unwrap_err(),
            bad,
            "{mode}"
        );
    }

    let table = OwnedTable::from_le_bytes(Format::F16, HUGE_FLOATS, &[]).unwrap();
    let quantized = QuantizedEmbedding::from_table(table);
    assert_eq!(quantized.forward(&[0u32], &[1]).unwrap_err(), bad);

    // The bag layers' forwards leave the ids to their tasks, but report a
    // bad one before an output they could not allocate.
    for mode in [Mode::Sum, Mode::Max] {
        let table = OwnedTable::from_le_bytes(Format::F16, HUGE_FLOATS, &[]).unwrap();
        let quantized = QuantizedEmbeddingBag::from_table(table, mode, None, false).unwrap();
        let bags = Bags::fixed(1, 1).unwrap();
        let got = quantized.forward(&[0u32], &bags, None).unwrap_err();
        assert_eq!(got, bad, "{mode}");
    }

    // The one-hot oracle checks its ids before its matrix, too.
    assert_eq!(
        one_hot(&[-1i64], HUGE_FLOATS).unwrap_err(),
        EmbeddingError::IndexOutOfRange {
            position: 0,
            index: -1,
            num_embeddings: HUGE_FLOATS,
        }
    );
}

#[test]
fn the_max_norm_path_takes_any_width() {
    // `max_norm` renormalises the looked-up rows; with no ids and a table
    // of no rows of width near `usize::MAX`, its `ids × dim × 4` bytes used
    // to overflow (a panic with overflow checks on).
    let options = EmbeddingOptions {
        max_norm: Some(1.0),
        ..EmbeddingOptions::default()
    };
    let mut emb =
        Embedding::from_pretrained_with_options(Vec::new(), usize::MAX, false, options).unwrap();
    let no_ids: &[u32] = &[];
    let out = emb.forward(no_ids, &[0]).unwrap();
    assert_eq!(
        (out.values.len(), &out.shape[..]),
        (0, &[0, usize::MAX][..])
    );
    emb.forward_into(no_ids, &mut []).unwrap();

    let options = EmbeddingBagOptions {
        max_norm: Some(1.0),
        ..EmbeddingBagOptions::default()
    };
    let mut bag = EmbeddingBag::from_pretrained(Vec::new(), usize::MAX, false, options).unwrap();
    let out = bag
        .forward(no_ids, &Bags::fixed(0, 0).unwrap(), None)
        .unwrap();
    assert!(out.values.is_empty());

    // And it still renormalises: a row of norm 5 comes back of norm 1.
    let options = EmbeddingOptions {
        max_norm: Some(1.0),
        ..EmbeddingOptions::default()
    };
    let mut emb =
        Embedding::from_pretrained_with_options(vec![3.0, 4.0], 2, false, options).unwrap();
    let out = emb.forward(&[0u32], &[1]).unwrap();
    let norm = out.values.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-6, "norm {norm}");
}

#[test]
fn the_reference_refuses_matrices_it_cannot_hold() {
    assert_eq!(
        one_hot(&[0u32, 0], usize::MAX).unwrap_err(),
        overflow(2, usize::MAX)
    );
    assert_eq!(
        one_hot(&[0u32], HUGE_FLOATS).unwrap_err(),
        refused("one-hot matrix", HUGE_BYTES)
    );
    // An m × 0 by 0 × n product is an m × n matrix of zeros.
    assert_eq!(
        matmul(&[], &[], HUGE_FLOATS, 0, 1).unwrap_err(),
        refused("matrix product", HUGE_BYTES)
    );
    assert_eq!(
        matmul(&[], &[], usize::MAX, 0, 2).unwrap_err(),
        overflow(usize::MAX, 2)
    );
    assert_eq!(matmul(&[], &[], 2, 0, 1).unwrap(), [-0.0, -0.0]);
}

#[test]
fn try_clone_copies_the_table() {
    let emb = Embedding::with_options(
        5,
        3,
        EmbeddingOptions {
            seed: Some(9),
            ..EmbeddingOptions::default()
        },
    )
    .unwrap();
    let copy = emb.try_clone().unwrap();
    assert_eq!(copy.weight(), emb.weight());
    assert_ne!(copy.weight().as_ptr(), emb.weight().as_ptr());

    let bag = EmbeddingBag::from_embedding(emb, Mode::Sum, false).unwrap();
    assert_eq!(
        bag.try_clone().unwrap().table().weight(),
        bag.table().weight()
    );

    let table = OwnedTable::from_f32(&[1.0, 2.0, 3.0, 4.0], 2, Format::Int8).unwrap();
    assert_eq!(table.try_clone().unwrap(), table);

    let aligned = AlignedTable::from_slice(&[1.0, -2.0]).unwrap();
    assert_eq!(&aligned.try_clone().unwrap()[..], &[1.0, -2.0]);
}
