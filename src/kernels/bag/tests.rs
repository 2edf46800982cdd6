//! The bag forward on every instruction set against the reference.

use super::forward::{CallIds, forward_into};
use super::*;
use crate::kernels::row_format::{F32Rows, RowFormat};
use crate::simd::Isa;

fn mix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let z = (*state ^ (*state >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^ (z >> 31)
}

/// A value no bag of these tests computes: a signalling NaN, which no
/// arithmetic returns (sums, means and decoded rows give quiet NaNs at
/// most), and no table here holds (their NaNs are `f32::NAN`, which a max
/// passes on as it is). An output prefilled with it shows which values a
/// forward left unwritten.
const UNWRITTEN: u32 = 0x7fa5_5a5a;

/// An output of `len` values, each [`UNWRITTEN`].
fn unwritten(len: usize) -> Vec<f32> {
    vec![f32::from_bits(UNWRITTEN); len]
}

/// [`forward_into`] `out` (prefilled here with [`UNWRITTEN`]) and `at`
/// with the ids checked, then into a second output prefilled so with the
/// tasks checking them ([`CallIds::InTasks`]): every value of both must be
/// written, and the second must hold the bits of `out` and `at`. Both
/// calls take the loops of the layers' fresh outputs (`MaybeUninit<f32>`
/// slots), so this is what those need of the kernel; the caller compares
/// `out` and `at` with the reference.
#[allow(clippy::too_many_arguments)]
fn forward_both<T: RowFormat>(
    isa: Isa,
    par: Parallelism,
    table: T,
    ids: ValidIds<'_, u64>,
    bags: &Bags,
    pooling: &Pooling<'_>,
    out: &mut [f32],
    at: &mut [i64],
) {
    out.fill(f32::from_bits(UNWRITTEN));
    let checked = CallIds::Checked(ids);
    let dim = table.dim();
    let all = forward_into(isa, par, table, checked, bags, pooling, out, dim, at);
    assert!(all, "a task stopped on checked ids ({isa:?} {par:?})");
    let bits: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
    assert!(
        !bits.contains(&UNWRITTEN),
        "a value left unwritten (checked {isa:?} {par:?})"
    );
    let in_tasks = CallIds::InTasks {
        ids: UncheckedIds::of(ids.as_slice()),
        num_embeddings: ids.num_embeddings(),
    };
    let mut fresh = unwritten(out.len());
    let mut fresh_at = vec![-9; at.len()];
    let all = forward_into(
        isa,
        par,
        table,
        in_tasks,
        bags,
        pooling,
        &mut fresh,
        dim,
        &mut fresh_at,
    );
    assert!(all, "a task stopped on good ids (in tasks {isa:?} {par:?})");
    let fresh: Vec<u32> = fresh.iter().map(|v| v.to_bits()).collect();
    assert_eq!(
        fresh, bits,
        "the output differs with the ids checked in tasks ({isa:?} {par:?})"
    );
    assert_eq!(
        fresh_at, at,
        "the winners differ with the ids checked in tasks ({isa:?} {par:?})"
    );
    // Rows `dim + 3` values apart (a column block of a wider output): the
    // same rows, and the values between them left as they were.
    let stride = dim + 3;
    let rows = bags.len();
    let mut apart = unwritten(if rows == 0 {
        0
    } else {
        (rows - 1) * stride + dim
    });
    let mut apart_at = vec![-9; at.len()];
    let all = forward_into(
        isa,
        par,
        table,
        in_tasks,
        bags,
        pooling,
        &mut apart,
        stride,
        &mut apart_at,
    );
    assert!(
        all,
        "a task stopped on good ids (rows apart {isa:?} {par:?})"
    );
    for (k, row) in apart.chunks(stride).enumerate() {
        let got: Vec<u32> = row[..dim].iter().map(|v| v.to_bits()).collect();
        assert_eq!(
            got,
            bits[k * dim..(k + 1) * dim],
            "bag {k}, rows apart ({isa:?} {par:?})"
        );
        assert!(
            row[dim..].iter().all(|v| v.to_bits() == UNWRITTEN),
            "a value between rows written ({isa:?} {par:?})"
        );
    }
    assert_eq!(
        apart_at, at,
        "the winners differ with rows apart ({isa:?} {par:?})"
    );
}

/// Bags that hold no id, alone or before one that does, give zeros (and
/// -1 winners) on every instruction set and thread count: a task whose bags
/// are all empty ends at position 0, which the prefetch's clamp must not
/// step below.
#[test]
fn empty_bags_give_zeros_on_every_path() {
    let table: Vec<f32> = (0..4 * 384).map(|i| i as f32 - 700.0).collect();
    let ids = [3usize, 1];
    for (offsets, num_ids) in [(&[0usize, 0, 0][..], 0), (&[0, 0, 0, 0][..], 2)] {
        let bags = Bags::from_offsets(offsets, num_ids, false).unwrap();
        let valid = ValidIds::new(&ids[..num_ids], 4).unwrap();
        for dim in [1, 8, 64, 128, 384] {
            for mode in [Mode::Sum, Mode::Mean, Mode::Max] {
                let pooling = Pooling {
                    mode,
                    ..Pooling::default()
                };
                let mut want = vec![f32::NAN; bags.len() * dim];
                let mut want_at = vec![7; if mode == Mode::Max { want.len() } else { 0 }];
                let table = &table[..4 * dim];
                let ids = &ids[..num_ids];
                crate::reference::bag_forward(
                    table,
                    dim,
                    ids,
                    &bags,
                    &pooling,
                    &mut want,
                    &mut want_at,
                )
                .unwrap();
                for isa in Isa::all() {
                    for par in [Parallelism::Serial, Parallelism::Rayon] {
                        let mut out = vec![f32::NAN; want.len()];
                        let mut at = vec![7; want_at.len()];
                        forward_both(
                            isa,
                            par,
                            F32Rows { table, dim },
                            valid,
                            &bags,
                            &pooling,
                            &mut out,
                            &mut at,
                        );
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        let what = format!("{offsets:?} dim {dim} {mode:?} {par:?} {isa:?}");
                        assert_eq!(bits(&out), bits(&want), "{what}");
                        assert_eq!(at, want_at, "{what}");
                    }
                }
            }
        }
    }
}

/// The sums on every instruction set give the same bits, and the sum those
/// of the bag-matrix reference, for widths around every block edge and the
/// padded tail, with and without weights and padding, on one thread and on
/// the pool; the maxima are the reference's, values and winners.
#[test]
fn every_isa_gives_the_reference_bits() {
    let mut seed = 7;
    let dims = [
        1, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 40, 56, 63, 64, 65, 72, 96, 120, 127, 128, 129,
        136, 200, 255, 256, 257, 384, 385, 640, 768, 777,
    ];
    for (case, &dim) in dims.iter().enumerate() {
        let rows = 1 + mix(&mut seed) as usize % 50;
        let n = mix(&mut seed) as usize % 200;
        let table: Vec<f32> = (0..rows * dim)
            .map(|_| match mix(&mut seed) % 16 {
                0 => -0.0,
                _ => (mix(&mut seed) % 2001) as f32 / 1000.0 - 1.0,
            })
            .collect();
        let ids: Vec<usize> = (0..n).map(|_| mix(&mut seed) as usize % rows).collect();
        // No weight is 0: the reference's product skips zero
        // coefficients, where the kernel adds `0 × x` (a `+0.0` that can
        // turn a `-0.0` sum into `+0.0`).
        let weights: Vec<f32> = (0..n)
            .map(|_| [-3.0, -1.5, -1.0, 0.25, 1.0, 2.0, 3.0][mix(&mut seed) as usize % 7])
            .collect();
        let mut offsets = vec![0];
        while let Some(&last) = offsets.last() {
            let next = last + mix(&mut seed) as usize % 20;
            if next >= n {
                break;
            }
            offsets.push(next);
        }
        let bags = Bags::from_offsets(&offsets, n, false).unwrap();
        let valid = ValidIds::new(&ids, rows).unwrap();
        for (mode, weighted, padded) in [
            (Mode::Sum, false, false),
            (Mode::Sum, true, false),
            (Mode::Sum, true, true),
            (Mode::Mean, false, true),
        ] {
            let pooling = Pooling {
                mode,
                per_sample_weights: weighted.then_some(&weights[..]),
                padding_idx: padded.then_some(case % rows),
                ..Pooling::default()
            };
            let what =
                format!("dim {dim} rows {rows} n {n} {mode:?} weighted {weighted} padded {padded}");
            let mut want = vec![f32::NAN; bags.len() * dim];
            crate::reference::bag_forward(&table, dim, &ids, &bags, &pooling, &mut want, &mut [])
                .unwrap();
            let mut outs = Vec::new();
            for isa in Isa::all() {
                for par in [Parallelism::Serial, Parallelism::Rayon] {
                    let mut out = vec![f32::NAN; bags.len() * dim];
                    forward_both(
                        isa,
                        par,
                        F32Rows { table: &table, dim },
                        valid,
                        &bags,
                        &pooling,
                        &mut out,
                        &mut [],
                    );
                    outs.push(out);
                }
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for out in &outs[1..] {
                assert_eq!(bits(out), bits(&outs[0]), "{what}");
            }
            if mode == Mode::Sum {
                assert_eq!(bits(&outs[0]), bits(&want), "{what}");
            }
        }
        // Max, with ties and NaNs in the table: both paths pick the
        // reference's winners.
        let ties: Vec<f32> = table
            .iter()
            .map(|&x| match mix(&mut seed) % 32 {
                0 => f32::NAN,
                1..=8 => 0.5,
                _ => x,
            })
            .collect();
        for padded in [false, true] {
            let pooling = Pooling {
                mode: Mode::Max,
                padding_idx: padded.then_some(case % rows),
                ..Pooling::default()
            };
            let size = bags.len() * dim;
            let (mut want, mut want_at) = (vec![f32::NAN; size], vec![-2; size]);
            crate::reference::bag_forward(
                &ties,
                dim,
                &ids,
                &bags,
                &pooling,
                &mut want,
                &mut want_at,
            )
            .unwrap();
            for isa in Isa::all() {
                for par in [Parallelism::Serial, Parallelism::Rayon] {
                    let (mut out, mut at) = (vec![f32::NAN; size], vec![-2; size]);
                    forward_both(
                        isa,
                        par,
                        F32Rows { table: &ties, dim },
                        valid,
                        &bags,
                        &pooling,
                        &mut out,
                        &mut at,
                    );
                    let what = format!("max dim {dim} rows {rows} n {n} padded {padded} {isa:?}");
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&out), bits(&want), "{what}");
                    assert_eq!(at, want_at, "{what}");
                }
            }
        }
    }
}

/// A bag case over a table just past the hint threshold for rows of
/// `row_bytes`: the table's values, its ids, bags of 16 with a few shorter
/// ones (0 among them), and weights; the call's last bags, within `ahead`
/// positions of its end, take the general loop.
struct HintedCase {
    rows: usize,
    /// On a line, so that narrow rows (16 columns) take the one-hint path
    /// (`PlainRows::rows_are_lines`, `BagHints::Line`).
    table: crate::memory::AlignedTable,
    /// The same values from 16 bytes past a line (`shifted[4..]`).
    shifted: crate::memory::AlignedTable,
    ids: Vec<usize>,
    bags: Bags,
    weights: Vec<f32>,
}

impl HintedCase {
    fn new(dim: usize, row_bytes: usize, seed: &mut u64) -> HintedCase {
        let rows = crate::kernels::tuning::PREFETCH_MIN_TABLE_BYTES / row_bytes + 3;
        let values: Vec<f32> = (0..rows * dim)
            .map(|_| (mix(seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        let table = crate::memory::AlignedTable::from_slice(&values).unwrap();
        let padded: Vec<f32> = [0.0; 4].iter().chain(&values).copied().collect();
        let shifted = crate::memory::AlignedTable::from_slice(&padded).unwrap();
        let mut offsets = vec![0];
        for b in 0..100 {
            offsets.push(offsets[b] + if b % 7 == 3 { b % 5 } else { 16 });
        }
        let n = offsets.pop().unwrap();
        let weights = (0..n)
            .map(|_| [-1.5, -1.0, 0.25, 1.0, 3.0][mix(seed) as usize % 5])
            .collect();
        HintedCase {
            rows,
            table,
            shifted,
            ids: (0..n).map(|_| mix(seed) as usize % rows).collect(),
            bags: Bags::from_offsets(&offsets, n, false).unwrap(),
            weights,
        }
    }

    /// The bag-matrix reference over `values` (this case's table, or the
    /// same rounded to a half type).
    fn reference(&self, values: &[f32], dim: usize, pooling: &Pooling<'_>) -> (Vec<f32>, Vec<i64>) {
        let size = self.bags.len() * dim;
        let at_len = if pooling.mode == Mode::Max { size } else { 0 };
        let (mut want, mut at) = (vec![f32::NAN; size], vec![-2; at_len]);
        let (ids, bags) = (&self.ids, &self.bags);
        crate::reference::bag_forward(values, dim, ids, bags, pooling, &mut want, &mut at).unwrap();
        (want, at)
    }
}

/// The index and the two values of the first output whose bits differ.
fn first_difference(out: &[f32], want: &[f32]) -> Option<(usize, f32, f32)> {
    let k = out
        .iter()
        .zip(want)
        .position(|(a, b)| a.to_bits() != b.to_bits())?;
    Some((k, out[k], want[k]))
}

/// Values copied to a buffer at the first element that starts a line.
struct OnALine<T> {
    buffer: Vec<T>,
    from: usize,
    len: usize,
}

impl<T> OnALine<T> {
    fn values(&self) -> &[T] {
        &self.buffer[self.from..self.from + self.len]
    }
}

fn on_a_line<T: Copy + Default>(values: &[T]) -> OnALine<T> {
    let mut buffer = vec![T::default(); values.len() + 64];
    let from = buffer.as_ptr().align_offset(64);
    buffer[from..from + values.len()].copy_from_slice(values);
    OnALine {
        buffer,
        from,
        len: values.len(),
    }
}

/// Tables of 512 KiB or more are read with hints, and their bags take the
/// fast loop of `Rows::blocks`: with the row's length a constant where the
/// row is one column block (8, 16, 32, 64, 128, 256 columns, and a sum's
/// 384 with sixteen lanes, as the lanes make it), a variable one otherwise;
/// `f32` rows of 16 columns from a line (one hint a row) and from 16 bytes
/// past one (two). Both give the reference's bits on
/// every instruction set and thread count, for every format: `f32` sums
/// (plain and weighted) and maxima against the bag-matrix reference, a half
/// table's sums against the same over its values as `f32`s (exact), a
/// packed table's against FBGEMM's rule.
#[test]
fn tables_read_with_hints_give_the_reference_bits() {
    use crate::formats::{PackedTable, RowWise, to_bf16, to_f16};
    use crate::kernels::row_format::{Packed, PlainRows};
    let mut seed = 11;
    for dim in [8usize, 16, 24, 32, 64, 128, 256, 384] {
        let pars = [Parallelism::Serial, Parallelism::Rayon];
        let c = HintedCase::new(dim, dim * 4, &mut seed);
        let valid = ValidIds::new(&c.ids, c.rows).unwrap();
        for (mode, weighted) in [(Mode::Sum, false), (Mode::Sum, true), (Mode::Max, false)] {
            let pooling = Pooling {
                mode,
                per_sample_weights: weighted.then_some(&c.weights[..]),
                ..Pooling::default()
            };
            let (want, want_at) = c.reference(&c.table, dim, &pooling);
            for (placed, values) in [("on a line", &c.table[..]), ("shifted", &c.shifted[4..])] {
                let table = F32Rows { table: values, dim };
                for isa in Isa::all() {
                    for par in pars {
                        let what = format!(
                            "f32 dim {dim} {placed} {mode:?} weighted {weighted} {isa:?} {par:?}"
                        );
                        let size = (want.len(), want_at.len());
                        let (mut out, mut at) = (vec![f32::NAN; size.0], vec![-2; size.1]);
                        forward_both(isa, par, table, valid, &c.bags, &pooling, &mut out, &mut at);
                        assert_eq!(first_difference(&out, &want), None, "{what}");
                        assert_eq!(at, want_at, "{what}");
                    }
                }
            }
        }
        let c = HintedCase::new(dim, dim * 2, &mut seed);
        let valid = ValidIds::new(&c.ids, c.rows).unwrap();
        let pooling = Pooling {
            mode: Mode::Sum,
            ..Pooling::default()
        };
        let (f16s, bf16s) = (to_f16(&c.table).unwrap(), to_bf16(&c.table).unwrap());
        // Both from a line, so that rows of 32 halves take the one-hint path.
        let (f16s, bf16s) = (on_a_line(&f16s), on_a_line(&bf16s));
        let (f16s, bf16s) = (f16s.values(), bf16s.values());
        let (want_f16, _) = c.reference(
            &f16s.iter().map(|h| h.to_f32()).collect::<Vec<_>>(),
            dim,
            &pooling,
        );
        let (want_bf16, _) = c.reference(
            &bf16s.iter().map(|h| h.to_f32()).collect::<Vec<_>>(),
            dim,
            &pooling,
        );
        for isa in Isa::all() {
            for par in pars {
                let what = format!("dim {dim} {isa:?} {par:?}");
                let (bags, pooling) = (&c.bags, &pooling);
                let mut out = vec![f32::NAN; want_f16.len()];
                let f16_rows = PlainRows { table: f16s, dim };
                forward_both(isa, par, f16_rows, valid, bags, pooling, &mut out, &mut []);
                assert_eq!(first_difference(&out, &want_f16), None, "f16 {what}");
                let bf16_rows = PlainRows { table: bf16s, dim };
                forward_both(isa, par, bf16_rows, valid, bags, pooling, &mut out, &mut []);
                assert_eq!(first_difference(&out, &want_bf16), None, "bf16 {what}");
            }
        }
        for format in [RowWise::Int8, RowWise::Int4, RowWise::Int2] {
            let c = HintedCase::new(dim, format.row_bytes(dim).unwrap(), &mut seed);
            let valid = ValidIds::new(&c.ids, c.rows).unwrap();
            let bytes = format.prepack(&c.table, dim).unwrap();
            let packed = PackedTable::new(format, dim, &bytes).unwrap();
            for weighted in [false, true] {
                let w = weighted.then_some(&c.weights[..]);
                let want = crate::reference::packed_bag_sum(&packed, &c.ids, &c.bags, w).unwrap();
                let pooling = Pooling {
                    mode: Mode::Sum,
                    per_sample_weights: w,
                    ..Pooling::default()
                };
                let (ids, bags, pooling) = (valid, &c.bags, &pooling);
                for isa in Isa::all() {
                    for par in pars {
                        let mut out = vec![f32::NAN; want.len()];
                        let o = &mut out[..];
                        match format {
                            RowWise::Int8 => {
                                let rows = Packed::<8>::new(&packed);
                                forward_both(isa, par, rows, ids, bags, pooling, o, &mut [])
                            }
                            RowWise::Int4 => {
                                let rows = Packed::<4>::new(&packed);
                                forward_both(isa, par, rows, ids, bags, pooling, o, &mut [])
                            }
                            RowWise::Int2 => {
                                let rows = Packed::<2>::new(&packed);
                                forward_both(isa, par, rows, ids, bags, pooling, o, &mut [])
                            }
                        }
                        let what =
                            format!("{format:?} dim {dim} weighted {weighted} {isa:?} {par:?}");
                        assert_eq!(first_difference(&out, &want), None, "{what}");
                    }
                }
            }
        }
    }
}

/// With the ids left to the forward's tasks ([`CallIds::InTasks`]), a bad
/// id anywhere (a task's first or last position, among the rows the task
/// before hints ahead, in the last bag, past the last bag) gives the error
/// of the whole check, the first bad id's, and an empty output, on one
/// thread and on two, on every instruction set, for `f32` and 8-bit rows,
/// with padding and weights; a task that meets one writes none of its bags;
/// and good ids give the checked forward's bits, those past the last bag
/// included.
#[test]
fn ids_checked_in_tasks_give_the_first_bad_one() {
    use crate::formats::{PackedTable, RowWise};
    use crate::kernels::row_format::Packed;
    // A table past `PREFETCH_MIN_TABLE_BYTES`, so the bags hint ahead, and
    // 4 096 bags of 16 columns: 256 KiB of output, 16 tasks of 256 bags.
    let (rows, dim, bags_n) = (40_000usize, 16usize, 4096usize);
    let mut seed = 11;
    let table: Vec<f32> = (0..rows * dim)
        .map(|_| (mix(&mut seed) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let mut offsets = vec![0usize];
    for _ in 0..bags_n {
        let last = offsets[offsets.len() - 1];
        offsets.push(last + mix(&mut seed) as usize % 24);
    }
    // Ten ids past the last offset, which belong to no bag.
    let n = offsets[bags_n] + 10;
    let ids: Vec<i64> = (0..n)
        .map(|_| (mix(&mut seed) % rows as u64) as i64)
        .collect();
    let weights: Vec<f32> = (0..n).map(|k| [0.5, -2.0, 3.0][k % 3]).collect();
    let bags = Bags::from_offsets(&offsets, n, true).unwrap();
    let case = InTasksCase {
        rows,
        ids,
        bags,
        offsets,
        weights,
    };
    case.check(F32Rows { table: &table, dim });
    let bytes = RowWise::Int8.prepack(&table, dim).unwrap();
    let packed = PackedTable::new(RowWise::Int8, dim, &bytes).unwrap();
    case.check(Packed::<8>::new(&packed));
}

/// The ids, bags and weights of [`ids_checked_in_tasks_give_the_first_bad_one`].
struct InTasksCase {
    rows: usize,
    ids: Vec<i64>,
    bags: Bags,
    offsets: Vec<usize>,
    weights: Vec<f32>,
}

impl InTasksCase {
    fn check<T: RowFormat>(&self, table: T) {
        let (rows, n, dim) = (self.rows, self.ids.len(), table.dim());
        let (bags, offsets) = (&self.bags, &self.offsets);
        let bags_n = bags.len();
        let limit = offsets[bags_n];
        let second_task = offsets[256];
        let positions = [
            0,
            1,
            second_task - 1,
            second_task,
            second_task + 2,
            offsets[bags_n - 1],
            limit - 1,
            limit,
            n - 1,
        ];
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let poolings = [
            (Mode::Sum, None, None),
            (Mode::Sum, Some(&self.weights[..]), Some(3)),
            (Mode::Mean, None, Some(5)),
            (Mode::Max, None, None),
        ];
        for (mode, per_sample_weights, padding_idx) in poolings {
            let pooling = Pooling {
                mode,
                per_sample_weights,
                padding_idx,
                ..Pooling::default()
            };
            let len = if mode == Mode::Max { bags_n * dim } else { 0 };
            for isa in Isa::all() {
                for par in [Parallelism::Serial, Parallelism::Rayon] {
                    let what = format!("{} {mode:?} {isa:?} {par:?}", core::any::type_name::<T>());
                    let fresh = |ids: &[i64], values: &mut Vec<f32>, at: &mut [i64]| {
                        let call_ids = CallIds::InTasks {
                            ids: UncheckedIds::of(ids),
                            num_embeddings: rows,
                        };
                        pool.install(|| {
                            forward::forward_fresh(
                                isa, par, table, call_ids, bags, &pooling, values, at,
                            )
                        })
                    };
                    let valid = ValidIds::new(&self.ids, rows).unwrap();
                    let mut want = vec![f32::NAN; bags_n * dim];
                    let mut want_at = vec![0; len];
                    let checked = CallIds::Checked(valid);
                    pool.install(|| {
                        forward_into(
                            isa,
                            par,
                            table,
                            checked,
                            bags,
                            &pooling,
                            &mut want,
                            dim,
                            &mut want_at,
                        )
                    });
                    let mut values = Vec::new();
                    let mut at = vec![0; len];
                    fresh(&self.ids, &mut values, &mut at).unwrap();
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&values), bits(&want), "{what}");
                    assert_eq!(at, want_at, "{what}");
                    for (k, &position) in positions.iter().enumerate() {
                        let mut ids = self.ids.clone();
                        let bad = [-1, rows as i64, i64::MAX][k % 3];
                        ids[position] = bad;
                        // A later bad id does not hide this one.
                        if position + 300 < n {
                            ids[position + 300] = -7;
                        }
                        let want = EmbeddingError::IndexOutOfRange {
                            position,
                            index: i128::from(bad),
                            num_embeddings: rows,
                        };
                        let mut values = vec![1.0; 3];
                        let got = fresh(&ids, &mut values, &mut at);
                        let what = format!("{what} bad {bad} at {position}");
                        assert_eq!(got, Err(want), "{what}");
                        assert!(values.is_empty(), "{what}");
                        if position < limit {
                            self.stopped_task_writes_nothing(table, &ids, position, &pooling);
                        }
                    }
                }
            }
        }
    }

    /// `forward_into` with the ids left to the tasks and a bad id at
    /// `position`, in a bag: it returns `false`, and the task whose bags
    /// hold the position wrote none of them.
    fn stopped_task_writes_nothing<T: RowFormat>(
        &self,
        table: T,
        ids: &[i64],
        position: usize,
        pooling: &Pooling<'_>,
    ) {
        let (dim, bags) = (table.dim(), &self.bags);
        let mut out = unwritten(bags.len() * dim);
        let mut at = vec![
            0;
            if pooling.mode == Mode::Max {
                out.len()
            } else {
                0
            }
        ];
        let call_ids = CallIds::InTasks {
            ids: UncheckedIds::of(ids),
            num_embeddings: self.rows,
        };
        let isa = Isa::detect();
        let par = Parallelism::Rayon;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let all = pool.install(|| {
            let dim = table.dim();
            forward_into(
                isa, par, table, call_ids, bags, pooling, &mut out, dim, &mut at,
            )
        });
        assert!(!all, "bad id at {position}");
        // The bag of the position (the last whose start is at or before
        // it), and the run of bags its task wrote.
        let bag = self.offsets[..bags.len()].partition_point(|&s| s <= position) - 1;
        let work = ids.len() * dim * 4;
        let plan = || par.plan(work, crate::kernels::tuning::PARALLEL_MIN_BYTES);
        let per_task =
            pool.install(|| crate::kernels::tuning::bags_per_task(plan(), bags.len(), dim, work));
        let first = bag / per_task * per_task;
        let end = (first + per_task).min(bags.len());
        let run = &out[first * dim..end * dim];
        assert!(
            run.iter().all(|v| v.to_bits() == UNWRITTEN),
            "bags {first}..{end} written around a bad id at {position} (bag {bag})"
        );
    }
}
