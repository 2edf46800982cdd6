//! The lookup and the bags on tables of every format (`f16`, `bf16`,
//! row-wise 8/4/2-bit), against their oracles: a half table pools and looks
//! up exactly as its widened `f32` table does; a packed table looks up as
//! `dequantize` reads it back and sums as `reference::packed_bag_sum`
//! (FBGEMM's rule, PyTorch's bits); every format refuses what the `f32`
//! kernels refuse, with the same error, and writes nothing. Every result is
//! compared across pools of 1, 2, 3 and 8 threads, serial and split.

use crate::common;

use crate::common::{SplitMix, pools};
use embedding_kernels::formats::{self, PackedTable, RowWise, TableRef};
use embedding_kernels::{
    Bags, EmbeddingError, Mode, Parallelism, Pooling, bag_forward, gather, gather_half_with,
    reference, table_bag_forward, table_bag_forward_strided_with, table_bag_forward_with,
    table_gather, table_gather_with,
};

/// A value no bag here computes (a signalling NaN): what an output holds
/// where nothing wrote it.
const UNWRITTEN: u32 = 0x7fa5_5a5a;

const PACKED: [RowWise; 3] = [RowWise::Int8, RowWise::Int4, RowWise::Int2];
// 392 and 648: with sixteen lanes, a sum's block of 24 vectors and a tail
// of 8 columns, or blocks of 24 and 16 and that tail.
const DIMS: [usize; 15] = [1, 2, 3, 7, 8, 9, 16, 31, 64, 65, 130, 136, 264, 392, 648];

fn unpack(format: RowWise, packed: &[u8], dim: usize) -> Vec<f32> {
    let rows = PackedTable::new(format, dim, packed).unwrap().rows();
    let mut out = vec![f32::NAN; rows * dim];
    format.dequantize(packed, dim, &mut out).unwrap();
    out
}

/// Runs `f` on every pool, serial and split, checks that all give the same
/// bits, and returns them.
fn on_every_pool<T: PartialEq + std::fmt::Debug + Send>(
    what: &str,
    f: impl Fn(Parallelism) -> T + Sync,
) -> T {
    let mut results = Vec::new();
    for pool in pools() {
        for par in [Parallelism::Serial, Parallelism::Rayon] {
            results.push(pool.install(|| f(par)));
        }
    }
    assert!(
        results.windows(2).all(|w| w[0] == w[1]),
        "{what}: same on every pool"
    );
    results.swap_remove(0)
}

/// The lookup of every format reads each row back as its oracle does: a
/// half row widened, a packed row as `dequantize` (so `fma(q, scale,
/// bias)`), an `f32` row as `gather`; ids of two types.
#[test]
fn lookups_read_rows_back_as_their_oracles() {
    let mut rng = SplitMix(31);
    for dim in DIMS {
        let rows = 50;
        let table = rng.wilds(rows * dim);
        let n = 300;
        let ids: Vec<i64> = (0..n).map(|_| (rng.next() % rows as u64) as i64).collect();
        let ids32: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
        let (f16s, bf16s) = (
            formats::to_f16(&table).unwrap(),
            formats::to_bf16(&table).unwrap(),
        );
        let mut cases: Vec<(TableRef<'_>, Vec<f32>)> = vec![
            (TableRef::f32(&table, dim).unwrap(), table.clone()),
            (
                TableRef::f16(&f16s, dim).unwrap(),
                formats::f16_to_f32(&f16s).unwrap(),
            ),
            (
                TableRef::bf16(&bf16s, dim).unwrap(),
                formats::bf16_to_f32(&bf16s).unwrap(),
            ),
        ];
        let packs: Vec<(RowWise, Vec<u8>)> = PACKED
            .iter()
            .map(|&f| (f, f.prepack(&table, dim).unwrap()))
            .collect();
        for (format, bytes) in &packs {
            let packed = PackedTable::new(*format, dim, bytes).unwrap();
            cases.push((packed.into(), unpack(*format, bytes, dim)));
        }
        for (table, back) in cases {
            let what = format!("{} dim {dim}", table.format());
            let mut want = vec![0.0; n * dim];
            gather(&back, dim, &ids, &mut want).unwrap();
            let got = on_every_pool(&what, |par| {
                let mut out = vec![f32::NAN; n * dim];
                table_gather_with(par, table, &ids, &mut out).unwrap();
                common::bits(&out)
            });
            assert_eq!(got, common::bits(&want), "{what}");
            let mut out32 = vec![f32::NAN; n * dim];
            table_gather(table, &ids32, &mut out32).unwrap();
            assert_eq!(common::bits(&out32), got, "{what}: u32 ids");
        }
    }
}

/// The raw copy of half rows: the rows' bits, NaN payloads and all.
#[test]
fn half_rows_copy_bit_for_bit() {
    let mut rng = SplitMix(32);
    for dim in [1, 5, 8, 33, 384] {
        let rows = 20;
        let mut table = formats::to_f16(&rng.wilds(rows * dim)).unwrap();
        table[0] = half::f16::from_bits(0x7e01); // a NaN with a payload
        let bf = formats::to_bf16(&rng.wilds(rows * dim)).unwrap();
        let ids: Vec<u32> = (0..200)
            .map(|_| (rng.next() % rows as u64) as u32)
            .collect();
        let got = on_every_pool("f16", |par| {
            let mut out = vec![half::f16::ZERO; ids.len() * dim];
            gather_half_with(par, &table, dim, &ids, &mut out).unwrap();
            out.iter().map(|h| h.to_bits()).collect::<Vec<_>>()
        });
        let want: Vec<u16> = ids
            .iter()
            .flat_map(|&i| &table[i as usize * dim..(i as usize + 1) * dim])
            .map(|h| h.to_bits())
            .collect();
        assert_eq!(got, want, "f16 dim {dim}");
        let got = on_every_pool("bf16", |par| {
            let mut out = vec![half::bf16::ZERO; ids.len() * dim];
            gather_half_with(par, &bf, dim, &ids, &mut out).unwrap();
            out.iter().map(|h| h.to_bits()).collect::<Vec<_>>()
        });
        let want: Vec<u16> = ids
            .iter()
            .flat_map(|&i| &bf[i as usize * dim..(i as usize + 1) * dim])
            .map(|h| h.to_bits())
            .collect();
        assert_eq!(got, want, "bf16 dim {dim}");
    }
}

/// Half tables pool exactly as their widened `f32` tables: the same sums
/// (plain and weighted), means, maxima and winners, with padding.
#[test]
fn half_bags_are_the_bags_of_the_widened_table() {
    let mut rng = SplitMix(33);
    for dim in DIMS {
        let rows = 30;
        let table = rng.wilds(rows * dim);
        let n = 120;
        let ids: Vec<u32> = (0..n).map(|_| (rng.next() % rows as u64) as u32).collect();
        let weights = rng.units(n);
        let offsets: Vec<usize> = (0..n).step_by(7).chain([n, n]).collect();
        let bags = Bags::from_offsets(&offsets, n, false).unwrap();
        let (f16s, bf16s) = (
            formats::to_f16(&table).unwrap(),
            formats::to_bf16(&table).unwrap(),
        );
        let cases = [
            (
                TableRef::f16(&f16s, dim).unwrap(),
                formats::f16_to_f32(&f16s).unwrap(),
            ),
            (
                TableRef::bf16(&bf16s, dim).unwrap(),
                formats::bf16_to_f32(&bf16s).unwrap(),
            ),
        ];
        for (table, wide) in cases {
            for (mode, w, padding_idx) in [
                (Mode::Sum, None, None),
                (Mode::Sum, Some(&weights[..]), Some(3)),
                (Mode::Mean, None, Some(3)),
                (Mode::Max, None, Some(3)),
            ] {
                let pooling = Pooling {
                    mode,
                    per_sample_weights: w,
                    padding_idx,
                    ..Pooling::default()
                };
                let what = format!("{} dim {dim} {pooling:?}", table.format());
                let at_len = if mode == Mode::Max {
                    bags.len() * dim
                } else {
                    0
                };
                let (mut want, mut want_at) = (vec![0.0; bags.len() * dim], vec![0i64; at_len]);
                bag_forward(&wide, dim, &ids, &bags, &pooling, &mut want, &mut want_at).unwrap();
                let got = on_every_pool(&what, |par| {
                    let mut out = vec![f32::NAN; bags.len() * dim];
                    let mut at = vec![-2i64; at_len];
                    table_bag_forward_with(par, table, &ids, &bags, &pooling, &mut out, &mut at)
                        .unwrap();
                    (common::bits(&out), at)
                });
                assert_eq!(got, (common::bits(&want), want_at), "{what}");
            }
        }
    }
}

/// The packed bag kernel against the oracles, at every width (vector edges
/// and tails), on every pool: sums (with and without weights) equal
/// `reference::packed_bag_sum` bit for bit; max equals the `f32` kernel's
/// max over the read-back table, values and winners; mean is the sum over
/// the count, divided once.
#[test]
fn packed_bags_follow_the_oracles() {
    let mut rng = SplitMix(21);
    for dim in [1, 2, 3, 7, 8, 9, 16, 31, 64, 65, 130, 136, 264] {
        let rows = 30;
        let table = rng.wilds(rows * dim);
        let n = 120;
        let ids: Vec<u32> = (0..n).map(|_| (rng.next() % rows as u64) as u32).collect();
        let weights = rng.units(n);
        let offsets: Vec<usize> = (0..n).step_by(7).collect();
        let bags = Bags::from_offsets(&offsets, n, false).unwrap();
        for format in PACKED {
            let bytes = format.prepack(&table, dim).unwrap();
            let packed = PackedTable::new(format, dim, &bytes).unwrap();
            let back = unpack(format, &bytes, dim);
            let run = |pooling: &Pooling<'_>, with_at: bool| {
                let mut results = Vec::new();
                for pool in pools() {
                    for par in [Parallelism::Serial, Parallelism::Rayon] {
                        let mut out = vec![f32::NAN; bags.len() * dim];
                        let mut at = vec![-2i64; if with_at { out.len() } else { 0 }];
                        pool.install(|| {
                            table_bag_forward_with(
                                par,
                                packed.into(),
                                &ids,
                                &bags,
                                pooling,
                                &mut out,
                                &mut at,
                            )
                        })
                        .unwrap();
                        results.push((common::bits(&out), at));
                    }
                }
                assert!(
                    results.windows(2).all(|w| w[0] == w[1]),
                    "{format:?} dim {dim}: same on every pool"
                );
                results.swap_remove(0)
            };
            for w in [None, Some(&weights[..])] {
                let pooling = Pooling {
                    mode: Mode::Sum,
                    per_sample_weights: w,
                    ..Pooling::default()
                };
                let want = reference::packed_bag_sum(&packed, &ids, &bags, w).unwrap();
                let (got, _) = run(&pooling, false);
                assert_eq!(
                    got,
                    common::bits(&want),
                    "{format:?} dim {dim} sum, weights {}",
                    w.is_some()
                );
            }
            let sum = reference::packed_bag_sum(&packed, &ids, &bags, None).unwrap();
            let mean_want: Vec<f32> = (0..bags.len())
                .flat_map(|b| {
                    let count = bags.bag(b).unwrap().len() as f32;
                    sum[b * dim..(b + 1) * dim]
                        .iter()
                        .map(move |s| s / count)
                        .collect::<Vec<_>>()
                })
                .collect();
            let (mean, _) = run(
                &Pooling {
                    mode: Mode::Mean,
                    ..Pooling::default()
                },
                false,
            );
            assert_eq!(mean, common::bits(&mean_want), "{format:?} dim {dim} mean");
            let max_pooling = Pooling {
                mode: Mode::Max,
                ..Pooling::default()
            };
            let (mut want, mut want_at) =
                (vec![0.0; bags.len() * dim], vec![0i64; bags.len() * dim]);
            bag_forward(
                &back,
                dim,
                &ids,
                &bags,
                &max_pooling,
                &mut want,
                &mut want_at,
            )
            .unwrap();
            let (max, at) = run(&max_pooling, true);
            assert_eq!(max, common::bits(&want), "{format:?} dim {dim} max");
            assert_eq!(at, want_at, "{format:?} dim {dim} max winners");
        }
    }
}

/// Every format refuses what the `f32` kernels refuse, with the same error,
/// and writes nothing: ids past the table or negative, weights with mean, a
/// padding row past the table, outputs of the wrong length; a half table
/// that is not whole rows is the `f32` table's shape error.
#[test]
fn every_format_refuses_what_f32_refuses() {
    let (rows, dim) = (4, 6);
    let table: Vec<f32> = (0..rows * dim).map(|x| x as f32).collect();
    let (f16s, bf16s) = (
        formats::to_f16(&table).unwrap(),
        formats::to_bf16(&table).unwrap(),
    );
    let packs: Vec<(RowWise, Vec<u8>)> = PACKED
        .iter()
        .map(|&f| (f, f.prepack(&table, dim).unwrap()))
        .collect();
    let mut tables = vec![
        TableRef::f32(&table, dim).unwrap(),
        TableRef::f16(&f16s, dim).unwrap(),
        TableRef::bf16(&bf16s, dim).unwrap(),
    ];
    for (format, bytes) in &packs {
        tables.push(PackedTable::new(*format, dim, bytes).unwrap().into());
    }
    let weights = [1.0f32; 3];
    let bags = Bags::from_offsets(&[0usize, 1], 3, false).unwrap();
    let bag_cases: Vec<(&str, Vec<i64>, Pooling<'_>, usize)> = vec![
        ("id past the table", vec![0, 4, 1], Pooling::default(), 2),
        ("negative id", vec![0, -1, 1], Pooling::default(), 2),
        (
            "weights with mean",
            vec![0, 1, 2],
            Pooling {
                per_sample_weights: Some(&weights),
                ..Pooling::default()
            },
            2,
        ),
        (
            "padding past the table",
            vec![0, 1, 2],
            Pooling {
                padding_idx: Some(9),
                ..Pooling::default()
            },
            2,
        ),
        ("output too short", vec![0, 1, 2], Pooling::default(), 1),
    ];
    let lookup_cases: Vec<(&str, Vec<i64>, usize)> = vec![
        ("id past the table", vec![0, 2, 4], 3),
        ("negative id", vec![-1], 1),
        ("output too long", vec![0, 1], 3),
    ];
    for table_ref in tables {
        let format = table_ref.format();
        for (name, ids, pooling, out_bags) in &bag_cases {
            let mut ours = vec![f32::NAN; out_bags * dim];
            let mut theirs = ours.clone();
            let got =
                table_bag_forward(table_ref, ids, &bags, pooling, &mut ours, &mut []).unwrap_err();
            let want =
                bag_forward(&table, dim, ids, &bags, pooling, &mut theirs, &mut []).unwrap_err();
            assert_eq!(got, want, "{format} bags: {name}");
            assert!(
                ours.iter().all(|x| x.is_nan()),
                "{format} {name}: nothing written"
            );
        }
        for (name, ids, out_rows) in &lookup_cases {
            let mut ours = vec![f32::NAN; out_rows * dim];
            let mut theirs = ours.clone();
            let got = table_gather(table_ref, ids, &mut ours).unwrap_err();
            let want = gather(&table, dim, ids, &mut theirs).unwrap_err();
            assert_eq!(got, want, "{format} lookup: {name}");
            assert!(
                ours.iter().all(|x| x.is_nan()),
                "{format} {name}: nothing written"
            );
        }
    }
    let mut out = [0.0f32; 4];
    for (len, dim) in [(7, 3), (2, 0)] {
        let want = gather(&table[..len], dim, &[0i64], &mut out).unwrap_err();
        assert_eq!(TableRef::f16(&f16s[..len], dim).unwrap_err(), want);
        assert_eq!(TableRef::bf16(&bf16s[..len], dim).unwrap_err(), want);
        assert_eq!(TableRef::f32(&table[..len], dim).unwrap_err(), want);
    }
}

/// The strided entry point's checks come before anything is written: a
/// stride below the rows' width, an output of the wrong length and a bad id
/// each leave `out` as it was; a good call writes each bag's row where
/// `table_bag_forward_with` puts it, `stride` apart.
#[test]
fn rows_apart_are_checked_first_and_land_apart() {
    let (rows, dim, stride) = (6, 4, 7);
    let values: Vec<f32> = (0..rows * dim).map(|i| i as f32 * 0.5 - 3.0).collect();
    let table = TableRef::f32(&values, dim).unwrap();
    let bags = Bags::from_offsets(&[0usize, 2, 2, 5], 5, true).unwrap();
    let ids = [1usize, 5, 0, 3, 3];
    for mode in [Mode::Sum, Mode::Mean, Mode::Max] {
        let pooling = Pooling {
            mode,
            ..Pooling::default()
        };
        let indices_len = if mode == Mode::Max { 3 * dim } else { 0 };
        let (mut want, mut want_at) = (vec![0.0; 3 * dim], vec![0; indices_len]);
        let par = Parallelism::Serial;
        table_bag_forward_with(par, table, &ids, &bags, &pooling, &mut want, &mut want_at).unwrap();
        let fresh = || vec![f32::from_bits(UNWRITTEN); 2 * stride + dim];
        let untouched = |out: &[f32]| out.iter().all(|v| v.to_bits() == UNWRITTEN);
        let mut at = vec![-9; indices_len];

        let mut out = fresh();
        let narrow = table_bag_forward_strided_with(
            par,
            table,
            &ids,
            &bags,
            &pooling,
            &mut out,
            dim - 1,
            &mut at,
        );
        assert!(matches!(
            narrow,
            Err(EmbeddingError::InvalidArgument {
                name: "out_stride",
                ..
            })
        ));
        assert!(untouched(&out));
        let mut short = vec![f32::from_bits(UNWRITTEN); 2 * stride + dim - 1];
        let wrong = table_bag_forward_strided_with(
            par, table, &ids, &bags, &pooling, &mut short, stride, &mut at,
        );
        assert!(
            matches!(wrong, Err(EmbeddingError::LengthMismatch { .. })),
            "{wrong:?}"
        );
        assert!(untouched(&short));
        let bad = [1usize, 5, 0, 3, 6];
        let bad = table_bag_forward_strided_with(
            par, table, &bad, &bags, &pooling, &mut out, stride, &mut at,
        );
        assert!(
            matches!(
                bad,
                Err(EmbeddingError::IndexOutOfRange { position: 4, .. })
            ),
            "{bad:?}"
        );
        assert!(untouched(&out));

        table_bag_forward_strided_with(
            par, table, &ids, &bags, &pooling, &mut out, stride, &mut at,
        )
        .unwrap();
        for b in 0..3 {
            let row = &out[b * stride..];
            let got: Vec<u32> = row[..dim].iter().map(|v| v.to_bits()).collect();
            let expected: Vec<u32> = want[b * dim..(b + 1) * dim]
                .iter()
                .map(|v| v.to_bits())
                .collect();
            assert_eq!(got, expected, "{mode:?} bag {b}");
            if b < 2 {
                assert!(
                    untouched(&row[dim..stride]),
                    "{mode:?}: a value between rows written"
                );
            }
        }
        assert_eq!(at, want_at);
    }
}
