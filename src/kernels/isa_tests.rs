//! Every public kernel on every instruction set: the same call under each
//! [`Isa`] (forced on this thread, with `Parallelism::Serial` so that every
//! task runs here) gives the same bits. The integration tests check the
//! detected instruction set against the reference; this checks that the
//! others agree with it, widths around every vector edge included.

use crate::simd::Isa;
use crate::{Parallelism, Sgd};

/// A deterministic stream of values in [-1, 1), with some `-0.0`s.
fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            match state >> 60 {
                0 => -0.0,
                _ => ((state >> 40) % 2001) as f32 / 1000.0 - 1.0,
            }
        })
        .collect()
}

/// Ids below `rows`, with repeats.
fn ids(n: usize, rows: usize, seed: u64) -> Vec<u32> {
    let mut state = seed ^ 0x9e37_79b9;
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
            ((state >> 33) % rows as u64) as u32
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every output `run` makes, on each instruction set, must have the bits of
/// the first's.
fn same_on_every_isa(what: &str, run: impl Fn() -> Vec<Vec<f32>>) {
    let isas = Isa::all();
    let first = isas[0].force(&run);
    for &isa in &isas[1..] {
        let other = isa.force(&run);
        assert_eq!(first.len(), other.len());
        for (k, (a, b)) in first.iter().zip(&other).enumerate() {
            assert_eq!(bits(a), bits(b), "{what}: output {k} on {isa:?}");
        }
    }
}

const DIMS: [usize; 16] = [1, 3, 7, 8, 9, 15, 16, 17, 24, 31, 33, 47, 64, 130, 257, 385];

#[test]
fn lookups_and_scatters_agree_on_every_isa() {
    let serial = Parallelism::Serial;
    for (k, &dim) in DIMS.iter().enumerate() {
        let (rows, n) = (40, 90);
        let table = values(rows * dim, k as u64);
        let grad = values(n * dim, 100 + k as u64);
        let ids = ids(n, rows, k as u64);
        let positions = values(6 * dim, 200 + k as u64);
        same_on_every_isa(&format!("dim {dim}"), || {
            let mut out = vec![f32::NAN; n * dim];
            crate::gather_with(serial, &table, dim, &ids, &mut out).unwrap();
            let mut scaled = vec![f32::NAN; n * dim];
            crate::gather_scaled_with(serial, &table, dim, &ids, 0.3, &mut scaled).unwrap();
            let mut acc = table.clone();
            crate::scatter_add_with(serial, &grad, dim, &ids, &mut acc).unwrap();
            let mut acc_scaled = table.clone();
            crate::scatter_add_scaled_with(serial, &grad, dim, &ids, 1.7, &mut acc_scaled).unwrap();
            let mut fused = vec![f32::NAN; n * dim];
            crate::embed_positions_with(
                serial,
                &table,
                &positions,
                dim,
                &ids,
                6,
                Some(0.5),
                &mut fused,
            )
            .unwrap();
            let (mut g_table, mut g_positions) = (table.clone(), positions.clone());
            crate::embed_positions_backward_with(
                serial,
                &grad,
                dim,
                &ids,
                6,
                None,
                &mut g_table,
                &mut g_positions,
            )
            .unwrap();
            vec![out, scaled, acc, acc_scaled, fused, g_table, g_positions]
        });
    }
}

#[test]
fn grouped_backwards_agree_on_every_isa() {
    let serial = Parallelism::Serial;
    // Small tables (summed in the caches) at every width, and one table past
    // `STREAM_MIN_BYTES`, swept with streaming stores.
    let cases = DIMS
        .iter()
        .map(|&dim| (40, dim, 90))
        .chain([(70_000, 32, 5_000)]);
    for (k, (rows, dim, n)) in cases.enumerate() {
        let grad = values(n * dim, 300 + k as u64);
        let ids = ids(n, rows, 7 + k as u64);
        let weight = values(rows * dim, 400 + k as u64);
        same_on_every_isa(&format!("rows {rows} dim {dim}"), || {
            let mut dense = vec![f32::NAN; rows * dim];
            crate::dense_backward_with(serial, &grad, dim, &ids, Some(3), true, &mut dense)
                .unwrap();
            let sparse =
                crate::sparse_backward_with(serial, &grad, dim, &ids, rows, None, false).unwrap();
            let mut emb = crate::Embedding::from_pretrained(weight.clone(), dim, false)
                .unwrap()
                .with_parallelism(serial);
            emb.sparse_step(&grad, &ids, &mut Sgd::new(0.25)).unwrap();
            vec![dense, sparse.values().to_vec(), emb.into_weight().unwrap()]
        });
    }
}

#[test]
fn bag_backwards_agree_on_every_isa() {
    let serial = Parallelism::Serial;
    for (k, &dim) in DIMS.iter().enumerate() {
        let (rows, n) = (40, 96);
        let ids = ids(n, rows, 11 + k as u64);
        let bags = crate::Bags::fixed(n / 6, 6).unwrap();
        let grad_bags = values(bags.len() * dim, 500 + k as u64);
        let weights = values(n, 600 + k as u64);
        same_on_every_isa(&format!("dim {dim}"), || {
            let mut outs = Vec::new();
            for (mode, w) in [
                (crate::Mode::Sum, Some(&weights[..])),
                (crate::Mode::Mean, None),
            ] {
                let pooling = crate::Pooling {
                    mode,
                    per_sample_weights: w,
                    padding_idx: Some(5),
                    ..crate::Pooling::default()
                };
                let mut dense = vec![f32::NAN; rows * dim];
                crate::bag_backward_with(
                    serial, &grad_bags, dim, &ids, &bags, &pooling, &mut dense,
                )
                .unwrap();
                let sparse = crate::bag_sparse_backward_with(
                    serial, &grad_bags, dim, &ids, &bags, &pooling, rows,
                )
                .unwrap();
                outs.extend([dense, sparse.values().to_vec()]);
            }
            outs
        });
    }
}

#[test]
fn every_format_agrees_on_every_isa() {
    use crate::formats::{Format, PackedTable, RowWise, TableRef, to_bf16, to_f16};
    use crate::{Bags, Mode, Pooling};
    let serial = Parallelism::Serial;
    for (k, &dim) in DIMS.iter().enumerate() {
        let (rows, n) = (40, 96);
        let table = values(rows * dim, 700 + k as u64);
        let ids = ids(n, rows, 13 + k as u64);
        let bags = Bags::fixed(n / 6, 6).unwrap();
        let weights = values(n, 800 + k as u64);
        let (f16s, bf16s) = (to_f16(&table).unwrap(), to_bf16(&table).unwrap());
        let packs = [RowWise::Int8, RowWise::Int4, RowWise::Int2]
            .map(|format| (format, format.prepack(&table, dim).unwrap()));
        let mut tables = vec![
            TableRef::f16(&f16s, dim).unwrap(),
            TableRef::bf16(&bf16s, dim).unwrap(),
        ];
        for (format, bytes) in &packs {
            tables.push(PackedTable::new(*format, dim, bytes).unwrap().into());
        }
        for table in tables {
            let format: Format = table.format();
            same_on_every_isa(&format!("{format} dim {dim}"), || {
                let mut looked_up = vec![f32::NAN; n * dim];
                crate::table_gather_with(serial, table, &ids, &mut looked_up).unwrap();
                let mut outs = vec![looked_up];
                for (mode, w, padding_idx) in [
                    (Mode::Sum, Some(&weights[..]), None),
                    (Mode::Sum, None, Some(5)),
                    (Mode::Mean, None, Some(5)),
                    (Mode::Max, None, None),
                ] {
                    let pooling = Pooling {
                        mode,
                        per_sample_weights: w,
                        padding_idx,
                        ..Pooling::default()
                    };
                    let mut out = vec![f32::NAN; bags.len() * dim];
                    let mut at = vec![-2i64; if mode == Mode::Max { out.len() } else { 0 }];
                    crate::table_bag_forward_with(
                        serial, table, &ids, &bags, &pooling, &mut out, &mut at,
                    )
                    .unwrap();
                    outs.push(out);
                    outs.push(at.iter().map(|&i| i as f32).collect());
                }
                outs
            });
        }
    }
}

/// Gathers from tables of 512 KiB or more (read with hints: on a 48 KiB L1
/// into L1, but for rows of 768 into L2 where whole rows are hinted, as
/// `tuning::gather_hints_in_l1` decides; rows
/// of one or two vectors through their own loop with the width a constant,
/// into L2) equal the plain loop of `reference::loops`, on each instruction
/// set (one thread, where the forced set holds) and on the pool, for the
/// copy, the scaled copy and the fresh output of the allocating lookup
/// (written as arrays of 16 and 8 values and then value by value: 25
/// columns take all three).
#[test]
fn gathers_past_the_hint_threshold_equal_the_plain_loop() {
    use crate::index::ValidIds;
    use crate::kernels::tuning::PREFETCH_MIN_TABLE_BYTES;
    for (k, dim) in [1usize, 8, 16, 24, 25, 32, 48, 64, 128, 768]
        .into_iter()
        .enumerate()
    {
        let rows = PREFETCH_MIN_TABLE_BYTES / (dim * 4) + 5;
        let table = values(rows * dim, 900 + k as u64);
        // Calls of fewer ids than the hint distance (32 rows of 16 or 32
        // columns), and one whose last piece is (1 030 rows of 32 columns:
        // pieces of 128 rows, the last of 6).
        for (j, n) in [3_000usize, 1, 3, 31, 1_030].into_iter().enumerate() {
            let ids = ids(n, rows, 31 + (k * 8 + j) as u64);
            let mut want = vec![f32::NAN; ids.len() * dim];
            crate::reference::loops::gather(&table, dim, &ids, &mut want).unwrap();
            let mut want_scaled = vec![f32::NAN; ids.len() * dim];
            crate::reference::loops::gather_scaled(&table, dim, &ids, 0.3, &mut want_scaled)
                .unwrap();
            let valid = ValidIds::new(&ids, rows).unwrap();
            let runs = Isa::all()
                .into_iter()
                .map(|isa| (Some(isa), Parallelism::Serial))
                .chain([(None, Parallelism::Rayon)]);
            for (isa, par) in runs {
                let what = format!("dim {dim}, {n} ids, {isa:?} {par:?}");
                let run = || {
                    let mut out = vec![f32::NAN; ids.len() * dim];
                    crate::gather_with(par, &table, dim, &ids, &mut out).unwrap();
                    let mut scaled = vec![f32::NAN; ids.len() * dim];
                    crate::gather_scaled_with(par, &table, dim, &ids, 0.3, &mut scaled).unwrap();
                    // NaN in the spare capacity the lookup writes: a value
                    // it skipped would show.
                    let mut fresh = vec![f32::NAN; ids.len() * dim];
                    fresh.clear();
                    super::gather::gather_fresh(par, &table, dim, valid.by_row(), &mut fresh)
                        .unwrap();
                    (out, scaled, fresh)
                };
                let (out, scaled, fresh) = match isa {
                    Some(isa) => isa.force(run),
                    None => run(),
                };
                assert_eq!(bits(&out), bits(&want), "gather {what}");
                assert_eq!(bits(&scaled), bits(&want_scaled), "gather_scaled {what}");
                assert_eq!(bits(&fresh), bits(&want), "fresh {what}");
            }
        }
    }
}

/// `a` and `b` hold the same values under the crate's rule for NaNs: the
/// same bits wherever either is not NaN, and NaN where either is.
fn same_but_nan_payloads(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits())
}

/// NaNs of every kind, where a table or a gradient may hold them: quiet and
/// signalling, both signs, with payloads.
const NAN_BITS: [u32; 6] = [
    0x7fc0_0000,
    0xffc0_0000,
    0x7fc0_1234,
    0xffa5_5a5a,
    0x7f80_0001,
    0xff80_4321,
];

/// `values` with one value in seven a NaN of [`NAN_BITS`].
fn with_nans(mut values: Vec<f32>, seed: usize) -> Vec<f32> {
    for (k, v) in values.iter_mut().enumerate() {
        if (k + seed).is_multiple_of(7) {
            *v = f32::from_bits(NAN_BITS[(k / 7 + seed) % NAN_BITS.len()]);
        }
    }
    values
}

/// The crate's rule for NaNs: where NaNs meet, or where one is computed,
/// the result is NaN on every instruction set and in the reference, its
/// sign and payload unspecified; every other value keeps its bits. Tables,
/// gradients, weights and scales full of NaNs of every kind, through each
/// kernel that computes with them, on each instruction set, against the
/// one-hot reference (the mean against the other instruction sets: the
/// reference rounds it otherwise).
#[test]
fn nans_meet_as_nans_on_every_isa_and_in_the_reference() {
    use crate::reference;
    use crate::{Bags, Mode, Pooling};
    let serial = Parallelism::Serial;
    for (k, &dim) in DIMS.iter().enumerate() {
        let (rows, n) = (12, 60);
        let table = with_nans(values(rows * dim, 1000 + k as u64), k);
        let grad = with_nans(values(n * dim, 1100 + k as u64), k + 3);
        // No weight is zero: the reference's product skips a zero
        // coefficient, where the kernel adds `0 × NaN` (its docs).
        let weights: Vec<f32> = values(n, 1200 + k as u64)
            .into_iter()
            .map(|w| if w == 0.0 { 0.5 } else { w })
            .collect();
        let weights = with_nans(weights, k + 1);
        let ids = ids(n, rows, 41 + k as u64);
        let positions = with_nans(values(6 * dim, 1300 + k as u64), k + 2);
        let bags = Bags::fixed(n / 6, 6).unwrap();
        let nan_scale = f32::from_bits(0x7fc0_4242);
        let run = || {
            let mut outs = Vec::new();
            for scale in [0.3, nan_scale] {
                let mut scaled = vec![0.0; n * dim];
                crate::gather_scaled_with(serial, &table, dim, &ids, scale, &mut scaled).unwrap();
                let mut fused = vec![0.0; n * dim];
                crate::embed_positions_with(
                    serial,
                    &table,
                    &positions,
                    dim,
                    &ids,
                    6,
                    Some(scale),
                    &mut fused,
                )
                .unwrap();
                outs.extend([scaled, fused]);
            }
            let mut acc = table.clone();
            crate::scatter_add_with(serial, &grad, dim, &ids, &mut acc).unwrap();
            outs.push(acc);
            for (mode, w) in [
                (Mode::Sum, None),
                (Mode::Sum, Some(&weights[..])),
                (Mode::Max, None),
                (Mode::Mean, None),
            ] {
                let pooling = Pooling {
                    mode,
                    per_sample_weights: w,
                    ..Pooling::default()
                };
                let mut out = vec![0.0; bags.len() * dim];
                let mut at = vec![0i64; if mode == Mode::Max { out.len() } else { 0 }];
                crate::bag_forward_with(
                    serial, &table, dim, &ids, &bags, &pooling, &mut out, &mut at,
                )
                .unwrap();
                outs.push(out);
                outs.push(at.iter().map(|&i| i as f32).collect());
            }
            outs
        };
        let isas = Isa::all();
        let first = isas[0].force(run);
        for &isa in &isas[1..] {
            let other = isa.force(run);
            for (j, (a, b)) in first.iter().zip(&other).enumerate() {
                assert!(
                    same_but_nan_payloads(a, b),
                    "dim {dim}: output {j} on {isa:?}"
                );
            }
        }
        // The reference, for all but the mean (the last two outputs).
        let mut want = Vec::new();
        for scale in [0.3, nan_scale] {
            let mut scaled = vec![0.0; n * dim];
            reference::gather_scaled(&table, dim, &ids, scale, &mut scaled).unwrap();
            // The fused kernel: the scaled row plus its position's row.
            let mut fused = scaled.clone();
            for (p, row) in fused.chunks_exact_mut(dim).enumerate() {
                let at = (p % 6) * dim;
                for (x, q) in row.iter_mut().zip(&positions[at..at + dim]) {
                    *x += q;
                }
            }
            want.extend([scaled, fused]);
        }
        let mut acc = table.clone();
        reference::scatter_add(&grad, dim, &ids, &mut acc).unwrap();
        want.push(acc);
        for (mode, w) in [
            (Mode::Sum, None),
            (Mode::Sum, Some(&weights[..])),
            (Mode::Max, None),
        ] {
            let pooling = Pooling {
                mode,
                per_sample_weights: w,
                ..Pooling::default()
            };
            let mut out = vec![0.0; bags.len() * dim];
            let mut at = vec![0i64; if mode == Mode::Max { out.len() } else { 0 }];
            reference::bag_forward(&table, dim, &ids, &bags, &pooling, &mut out, &mut at).unwrap();
            want.push(out);
            want.push(at.iter().map(|&i| i as f32).collect());
        }
        for (j, (got, want)) in first.iter().zip(&want).enumerate() {
            let diff = got
                .iter()
                .zip(want)
                .position(|(x, y)| !((x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits()));
            assert!(
                same_but_nan_payloads(got, want),
                "dim {dim}: output {j} against the reference, first at {diff:?}: {:?} against {:?}",
                diff.map(|d| got[d]),
                diff.map(|d| want[d])
            );
        }
        assert!(first[0].iter().any(|x| x.is_nan()), "dim {dim}: no NaN met");
    }
}

/// Half tables holding NaNs of every kind pool as their widened `f32`
/// tables do, under the same rule, on every instruction set.
#[test]
fn half_tables_with_nans_pool_as_their_widened_tables() {
    use crate::formats::TableRef;
    use crate::{Bags, Mode, Pooling};
    use half::{bf16, f16};
    let serial = Parallelism::Serial;
    let half_nans = [0x7e00u16, 0xfe00, 0x7e42, 0xfd5a, 0x7c01, 0xfc21];
    for (k, &dim) in DIMS.iter().enumerate() {
        let (rows, n) = (12, 48);
        let base = values(rows * dim, 1400 + k as u64);
        let halves: Vec<u16> = base
            .iter()
            .enumerate()
            .map(|(j, &x)| match (j + k) % 5 {
                0 => half_nans[(j / 5) % half_nans.len()],
                _ => f16::from_f32(x).to_bits(),
            })
            .collect();
        let f16s: Vec<f16> = halves.iter().map(|&b| f16::from_bits(b)).collect();
        let bf16s: Vec<bf16> = halves.iter().map(|&b| bf16::from_bits(b)).collect();
        let ids = ids(n, rows, 51 + k as u64);
        let bags = Bags::fixed(n / 6, 6).unwrap();
        for (name, table, widened) in [
            (
                "f16",
                TableRef::f16(&f16s, dim).unwrap(),
                f16s.iter().map(|h| h.to_f32()).collect::<Vec<_>>(),
            ),
            (
                "bf16",
                TableRef::bf16(&bf16s, dim).unwrap(),
                bf16s.iter().map(|h| h.to_f32()).collect::<Vec<_>>(),
            ),
        ] {
            for mode in [Mode::Sum, Mode::Max] {
                let pooling = Pooling {
                    mode,
                    ..Pooling::default()
                };
                let len = bags.len() * dim;
                let slots = if mode == Mode::Max { len } else { 0 };
                let mut want = vec![0.0; len];
                let mut want_at = vec![0i64; slots];
                crate::reference::bag_forward(
                    &widened,
                    dim,
                    &ids,
                    &bags,
                    &pooling,
                    &mut want,
                    &mut want_at,
                )
                .unwrap();
                for isa in Isa::all() {
                    let mut out = vec![0.0; len];
                    let mut at = vec![0i64; slots];
                    isa.force(|| {
                        crate::table_bag_forward_with(
                            serial, table, &ids, &bags, &pooling, &mut out, &mut at,
                        )
                    })
                    .unwrap();
                    let what = format!("{name} {mode:?} dim {dim} on {isa:?}");
                    assert!(same_but_nan_payloads(&out, &want), "{what}");
                    assert_eq!(at, want_at, "{what}");
                }
            }
        }
    }
}
