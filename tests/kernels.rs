//! Every kernel, id type and thread count against the one-hot reference, bit
//! for bit, plus the error paths with NaN canaries.

use embedding_kernels::reference::loops;
use embedding_kernels::{
    Embedding, EmbeddingError, Index, Operand, Parallelism, gather, gather_scaled,
    gather_scaled_with, gather_with, reference, scatter_add, scatter_add_with,
};
use proptest::prelude::*;

use crate::common::{
    Pattern, Row, SplitMix, around_prefetch_size, bad_id, bits, convert, draw_ids, ids_as,
    mismatch, not_whole_rows, pools, row, run_table, zero_dim,
};

#[derive(Clone, Debug)]
struct Case {
    rows: usize,
    dim: usize,
    ids: Vec<u64>,
    seed: u64,
}

fn case(
    rows: RangeInclusiveUsize,
    dim: RangeInclusiveUsize,
    n: RangeInclusiveUsize,
) -> impl Strategy<Value = Case> {
    let pattern = prop_oneof![
        Just(Pattern::Uniform),
        Just(Pattern::FewDistinct),
        Just(Pattern::Hot)
    ];
    (rows, dim, n, pattern, any::<u64>()).prop_map(|(rows, dim, n, pattern, seed)| Case {
        rows,
        dim,
        ids: draw_ids(rows, n, pattern, seed),
        seed,
    })
}

type RangeInclusiveUsize = std::ops::RangeInclusive<usize>;

/// The ranges: every SIMD tail, up to 600 ids.
fn small_case() -> impl Strategy<Value = Case> {
    case(1..=300, 1..=70, 0..=600)
}

/// Larger calls: more tasks per pool, and (with `dim` 32 and up) more column
/// blocks in the parallel scatter.
fn large_case() -> impl Strategy<Value = Case> {
    case(1..=300, 16..=140, 1_200..=4_000)
}

/// Runs `f` serially and on every pool, and checks each result bitwise
/// against `want`.
fn on_every_path(
    want: &[u32],
    run: impl Fn(Parallelism) -> Vec<f32> + Sync,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(&bits(&run(Parallelism::Serial)), want, "serial");
    for pool in pools() {
        let got = pool.install(|| run(Parallelism::Rayon));
        prop_assert_eq!(&bits(&got), want, "{} threads", pool.current_num_threads());
    }
    Ok(())
}

fn check_gather<I: Index + TryFrom<u64>>(c: &Case) -> Result<(), TestCaseError> {
    let mut rng = SplitMix(c.seed);
    let table = rng.values(c.rows * c.dim);
    let ids: Vec<I> = convert(&c.ids);
    let n = ids.len() * c.dim;
    let mut want = vec![f32::NAN; n];
    reference::gather(&table, c.dim, &ids, &mut want).unwrap();
    on_every_path(&bits(&want), |par| {
        let mut out = vec![f32::NAN; n];
        gather_with(par, &table, c.dim, &ids, &mut out).unwrap();
        out
    })?;
    let mut plain = vec![f32::NAN; n];
    gather(&table, c.dim, &ids, &mut plain).unwrap();
    loops::gather(&table, c.dim, &ids, &mut want).unwrap();
    prop_assert_eq!(bits(&plain), bits(&want));
    Ok(())
}

fn check_gather_scaled<I: Index + TryFrom<u64>>(c: &Case) -> Result<(), TestCaseError> {
    let mut rng = SplitMix(c.seed);
    let table = rng.values(c.rows * c.dim);
    let scale = rng.value() * 64.0;
    let ids: Vec<I> = convert(&c.ids);
    let n = ids.len() * c.dim;
    let mut want = vec![f32::NAN; n];
    reference::gather_scaled(&table, c.dim, &ids, scale, &mut want).unwrap();
    on_every_path(&bits(&want), |par| {
        let mut out = vec![f32::NAN; n];
        gather_scaled_with(par, &table, c.dim, &ids, scale, &mut out).unwrap();
        out
    })?;
    let mut plain = vec![f32::NAN; n];
    gather_scaled(&table, c.dim, &ids, scale, &mut plain).unwrap();
    prop_assert_eq!(bits(&plain), bits(&want));
    loops::gather_scaled(&table, c.dim, &ids, scale, &mut plain).unwrap();
    prop_assert_eq!(bits(&plain), bits(&want));
    Ok(())
}

fn check_scatter_add<I: Index + TryFrom<u64>>(c: &Case) -> Result<(), TestCaseError> {
    let mut rng = SplitMix(c.seed);
    // Start from a non-zero gradient: the kernels accumulate.
    let start = rng.values(c.rows * c.dim);
    let grad_output = rng.values(c.ids.len() * c.dim);
    let ids: Vec<I> = convert(&c.ids);
    let mut want = start.clone();
    reference::scatter_add(&grad_output, c.dim, &ids, &mut want).unwrap();
    on_every_path(&bits(&want), |par| {
        let mut grad = start.clone();
        scatter_add_with(par, &grad_output, c.dim, &ids, &mut grad).unwrap();
        grad
    })?;
    let mut plain = start.clone();
    scatter_add(&grad_output, c.dim, &ids, &mut plain).unwrap();
    prop_assert_eq!(bits(&plain), bits(&want));
    let mut plain = start;
    loops::scatter_add(&grad_output, c.dim, &ids, &mut plain).unwrap();
    prop_assert_eq!(bits(&plain), bits(&want));
    Ok(())
}

/// Plants one bad id (and maybe more after it) and checks that every
/// implementation names the first one and writes nothing.
fn check_bad_id<I: Index + TryFrom<u64>>(
    c: &Case,
    position: usize,
    bad: I,
    later_bad: bool,
) -> Result<(), TestCaseError> {
    let mut rng = SplitMix(c.seed);
    let table = rng.values(c.rows * c.dim);
    let mut ids: Vec<I> = convert(&c.ids);
    if ids.is_empty() {
        return Ok(());
    }
    let position = position % ids.len();
    ids[position] = bad;
    if later_bad && position + 1 < ids.len() {
        let last = ids.len() - 1;
        ids[last] = bad;
    }
    let want = EmbeddingError::IndexOutOfRange {
        position,
        index: bad.to_i128(),
        num_embeddings: c.rows,
    };
    let n = ids.len() * c.dim;
    let canary = vec![f32::NAN; n];
    let grad_output = rng.values(n);
    let grad_start = rng.values(c.rows * c.dim);

    let mut out = canary.clone();
    prop_assert_eq!(
        reference::gather(&table, c.dim, &ids, &mut out),
        Err(want.clone())
    );
    prop_assert_eq!(
        reference::gather_scaled(&table, c.dim, &ids, 2.0, &mut out),
        Err(want.clone())
    );
    prop_assert_eq!(
        loops::gather(&table, c.dim, &ids, &mut out),
        Err(want.clone())
    );
    let mut grad = grad_start.clone();
    prop_assert_eq!(
        reference::scatter_add(&grad_output, c.dim, &ids, &mut grad),
        Err(want.clone())
    );
    prop_assert_eq!(
        loops::scatter_add(&grad_output, c.dim, &ids, &mut grad),
        Err(want.clone())
    );
    for pool in pools() {
        pool.install(|| -> Result<(), TestCaseError> {
            for par in [Parallelism::Serial, Parallelism::Rayon, Parallelism::Auto] {
                prop_assert_eq!(
                    gather_with(par, &table, c.dim, &ids, &mut out),
                    Err(want.clone())
                );
                prop_assert_eq!(
                    gather_scaled_with(par, &table, c.dim, &ids, 2.0, &mut out),
                    Err(want.clone())
                );
                prop_assert_eq!(
                    scatter_add_with(par, &grad_output, c.dim, &ids, &mut grad),
                    Err(want.clone())
                );
            }
            Ok(())
        })?;
    }
    prop_assert_eq!(bits(&out), bits(&canary), "output written on error");
    prop_assert_eq!(bits(&grad), bits(&grad_start), "gradient written on error");
    Ok(())
}

macro_rules! per_id_type {
    ($($t:ident),*) => {$(
        mod $t {
            use super::*;

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(48))]

                #[test]
                fn gather_equals_reference(c in small_case()) {
                    check_gather::<$t>(&c)?;
                }

                #[test]
                fn gather_scaled_equals_reference(c in small_case()) {
                    check_gather_scaled::<$t>(&c)?;
                }

                #[test]
                fn scatter_add_equals_reference(c in small_case()) {
                    check_scatter_add::<$t>(&c)?;
                }

                #[test]
                fn first_invalid_id_is_reported_and_nothing_written(
                    c in small_case(),
                    position in any::<usize>(),
                    past_end in 0u64..3,
                    later_bad in any::<bool>(),
                ) {
                    check_bad_id::<$t>(&c, position, convert::<$t>(&[c.rows as u64 + past_end])[0], later_bad)?;
                    // MIN + MAX is -1 for a signed type (and MAX again for an unsigned one).
                    check_bad_id::<$t>(&c, position, $t::MIN.wrapping_add($t::MAX), later_bad)?;
                    check_bad_id::<$t>(&c, position, $t::MAX, later_bad)?;
                    if $t::MIN != 0 {
                        check_bad_id::<$t>(&c, position, $t::MIN, later_bad)?;
                    }
                }
            }

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(12))]

                #[test]
                fn large_calls_equal_reference_on_every_pool(c in large_case()) {
                    check_gather::<$t>(&c)?;
                    check_gather_scaled::<$t>(&c)?;
                    check_scatter_add::<$t>(&c)?;
                }
            }
        }
    )*};
}

per_id_type!(u32, i32, u64, i64, usize);

/// One bad kernel call, one variant per entry point. The ids are run on
/// every id type that holds them; the table and the output gradient are
/// `SplitMix(3)` values.
#[derive(Debug)]
enum Call {
    /// `gather`, `gather_scaled` and the reference `gather`.
    Gather {
        table_len: usize,
        dim: usize,
        ids: Vec<i128>,
        out_len: usize,
    },
    /// `scatter_add` and the reference `scatter_add`.
    Scatter {
        grad_output_len: usize,
        dim: usize,
        ids: Vec<i128>,
        grad_len: usize,
    },
}

fn gather_call(table_len: usize, dim: usize, ids: &[i128], out_len: usize) -> Call {
    let ids = ids.to_vec();
    Call::Gather {
        table_len,
        dim,
        ids,
        out_len,
    }
}

fn scatter_call(grad_output_len: usize, dim: usize, ids: &[i128], grad_len: usize) -> Call {
    let ids = ids.to_vec();
    Call::Scatter {
        grad_output_len,
        dim,
        ids,
        grad_len,
    }
}

impl Call {
    /// Every entry point fails with `want` on every id type that holds the
    /// ids, and the output (or gradient) keeps its NaN canary.
    fn run(&self, want: &EmbeddingError) {
        let ran = [
            self.run_as::<u32>(want),
            self.run_as::<i32>(want),
            self.run_as::<u64>(want),
            self.run_as::<i64>(want),
            self.run_as::<usize>(want),
        ];
        assert!(ran.contains(&true), "no id type holds the ids of {self:?}");
    }

    fn run_as<I: Index + TryFrom<i128>>(&self, want: &EmbeddingError) -> bool {
        let want = Err(want.clone());
        match self {
            Call::Gather {
                table_len,
                dim,
                ids,
                out_len,
            } => {
                let Some(ids) = ids_as::<I>(ids) else {
                    return false;
                };
                let (table, dim) = (SplitMix(3).values(*table_len), *dim);
                let mut out = vec![f32::NAN; *out_len];
                assert_eq!(gather(&table, dim, &ids, &mut out), want, "gather");
                let got = gather_scaled(&table, dim, &ids, 3.0, &mut out);
                assert_eq!(got, want, "gather_scaled");
                let got = reference::gather(&table, dim, &ids, &mut out);
                assert_eq!(got, want, "reference::gather");
                assert!(out.iter().all(|x| x.is_nan()), "canary overwritten");
            }
            Call::Scatter {
                grad_output_len,
                dim,
                ids,
                grad_len,
            } => {
                let Some(ids) = ids_as::<I>(ids) else {
                    return false;
                };
                let (grad_output, dim) = (SplitMix(3).values(*grad_output_len), *dim);
                let mut grad = vec![f32::NAN; *grad_len];
                let got = scatter_add(&grad_output, dim, &ids, &mut grad);
                assert_eq!(got, want, "scatter_add");
                let got = reference::scatter_add(&grad_output, dim, &ids, &mut grad);
                assert_eq!(got, want, "reference::scatter_add");
                assert!(grad.iter().all(|x| x.is_nan()), "gradient written");
            }
        }
        true
    }
}

/// Every shape error of the kernels and the ids at their edges, each in its
/// place in the order (shapes before ids).
fn kernel_errors() -> Vec<Row<Call>> {
    let (min_i64, max_i64) = (i128::from(i64::MIN), i128::from(i64::MAX));
    let (max_u64, min_i32) = (i128::from(u64::MAX), i128::from(i32::MIN));
    vec![
        // 5 rows × 3: the largest valid id is 4.
        row("id 5 of 5", gather_call(15, 3, &[5], 3), bad_id(0, 5, 5)),
        // Extreme ids are reported with their signed value.
        row(
            "i64::MIN",
            gather_call(8, 2, &[0, min_i64], 4),
            bad_id(1, min_i64, 4),
        ),
        row("-1", gather_call(8, 2, &[0, -1], 4), bad_id(1, -1, 4)),
        row(
            "i64::MAX",
            gather_call(8, 2, &[0, max_i64], 4),
            bad_id(1, max_i64, 4),
        ),
        row(
            "u64::MAX",
            gather_call(8, 2, &[max_u64], 2),
            bad_id(0, max_u64, 4),
        ),
        row(
            "i32::MIN",
            gather_call(8, 2, &[min_i32], 2),
            bad_id(0, min_i32, 4),
        ),
        // dim 0: no values and no row width make no rows, so no id is valid.
        row("dim 0, an id", gather_call(0, 0, &[0], 0), bad_id(0, 0, 0)),
        row(
            "dim 0 with data",
            gather_call(2, 0, &[0], 0),
            zero_dim(Operand::Table, 2),
        ),
        row("no rows of 4", gather_call(0, 4, &[0], 4), bad_id(0, 0, 0)),
        // Shapes.
        row(
            "table 12 of dim 5",
            gather_call(12, 5, &[0], 5),
            not_whole_rows(Operand::Table, 12, 5),
        ),
        row(
            "output 7 for 2 ids of 4",
            gather_call(12, 4, &[0, 1], 7),
            mismatch(Operand::Output, 8, 7),
        ),
        row(
            "2 ids × usize::MAX",
            gather_call(0, usize::MAX, &[0, 0], 0),
            EmbeddingError::SizeOverflow {
                count: 2,
                dim: usize::MAX,
            },
        ),
        // A bad id behind a bad shape: the shape is reported.
        row(
            "output 3 and id 9",
            gather_call(12, 4, &[9], 3),
            mismatch(Operand::Output, 4, 3),
        ),
        // The scatter's gradient and output gradient.
        row(
            "grad_table 9 of dim 4",
            scatter_call(8, 4, &[0, 1], 9),
            not_whole_rows(Operand::GradTable, 9, 4),
        ),
        row(
            "grad_output 8 for 1 id of 4",
            scatter_call(8, 4, &[0], 12),
            mismatch(Operand::GradOutput, 4, 8),
        ),
        row(
            "grad_table 3 at dim 0",
            scatter_call(8, 0, &[], 3),
            zero_dim(Operand::GradTable, 3),
        ),
    ]
}

#[test]
fn every_kernel_error_is_precise_and_writes_nothing() {
    run_table(&kernel_errors(), Call::run);
}

/// The calls next to the rows of [`kernel_errors`] that succeed.
#[test]
fn calls_next_to_the_errors_succeed() {
    // The largest valid id.
    let table: Vec<f32> = (0..15).map(|x| x as f32).collect();
    let mut out = [f32::NAN; 3];
    gather(&table, 3, &[4u32], &mut out).unwrap();
    assert_eq!(out, [12.0, 13.0, 14.0]);
    // dim 0 and no ids.
    let mut empty: [f32; 0] = [];
    assert_eq!(gather(&[], 0, &[] as &[u32], &mut empty), Ok(()));
    assert_eq!(scatter_add(&[], 0, &[] as &[u32], &mut empty), Ok(()));
    // No ids: nothing to write, and nothing written.
    let table = [1.0f32; 8];
    assert_eq!(gather(&table, 4, &[] as &[i64], &mut empty), Ok(()));
    let mut grad = [f32::NAN; 8];
    assert_eq!(scatter_add(&[], 4, &[] as &[i64], &mut grad), Ok(()));
    assert!(grad.iter().all(|x| x.is_nan()));
}

#[test]
fn error_messages_read_well() {
    let err = EmbeddingError::IndexOutOfRange {
        position: 3,
        index: -1,
        num_embeddings: 10,
    };
    assert_eq!(
        err.to_string(),
        "id -1 at position 3 is out of range for a table of 10 rows"
    );
    let err = EmbeddingError::LengthMismatch {
        operand: Operand::Output,
        expected: 8,
        got: 7,
    };
    assert_eq!(
        err.to_string(),
        "the output holds 7 values but 8 were expected"
    );
}

/// A hot id holding 90 % of a large call, with a wide row, takes the
/// column-split path; it must still equal the sequential sum bit for bit.
#[test]
fn hot_id_with_wide_rows_equals_reference_on_every_pool() {
    let (rows, dim, n) = (50u64, 256, 6_000);
    let mut rng = SplitMix(7);
    let ids: Vec<u32> = (0..n)
        .map(|_| {
            if rng.next().is_multiple_of(10) {
                (rng.next() % rows) as u32
            } else {
                17
            }
        })
        .collect();
    let grad_output = rng.values(n * dim);
    let start = rng.values(rows as usize * dim);
    let mut want = start.clone();
    reference::scatter_add(&grad_output, dim, &ids, &mut want).unwrap();
    for pool in pools() {
        for par in [Parallelism::Rayon, Parallelism::Auto] {
            let mut grad = start.clone();
            pool.install(|| scatter_add_with(par, &grad_output, dim, &ids, &mut grad))
                .unwrap();
            let threads = pool.current_num_threads();
            assert_eq!(bits(&grad), bits(&want), "{par:?} on {threads} threads");
        }
    }
}

/// Outputs of several MiB (past the `Auto` threshold, many tasks per
/// thread), at several alignments, on every pool.
#[test]
fn large_outputs_equal_reference() {
    let (rows, dim, n) = (97u64, 67, 32_000);
    let mut rng = SplitMix(11);
    let table = rng.values(rows as usize * dim);
    let ids: Vec<i64> = (0..n).map(|_| (rng.next() % rows) as i64).collect();
    assert!(
        n * dim * 4 >= 8 << 20,
        "the case must be past the streaming threshold"
    );
    let mut want = vec![0.0; n * dim];
    reference::gather_scaled(&table, dim, &ids, 0.75, &mut want).unwrap();
    for offset in [0, 1, 3] {
        for pool in pools() {
            let mut buf = vec![f32::NAN; n * dim + offset];
            pool.install(|| gather_scaled(&table, dim, &ids, 0.75, &mut buf[offset..]))
                .unwrap();
            assert_eq!(bits(&buf[offset..]), bits(&want), "offset {offset}");
            assert!(
                buf[..offset].iter().all(|x| x.is_nan()),
                "wrote before the output"
            );
        }
    }
    let mut got = vec![f32::NAN; n * dim];
    gather_with(Parallelism::Serial, &table, dim, &ids, &mut got).unwrap();
    let mut copy = vec![0.0; n * dim];
    reference::gather(&table, dim, &ids, &mut copy).unwrap();
    assert_eq!(bits(&got), bits(&copy));
}

/// Tables from 512 KiB up are read with prefetch hints, smaller ones
/// without: both loops, serial and on every pool, give the reference's
/// bits, through the free functions and the allocating layer forward.
#[test]
fn tables_on_both_sides_of_the_prefetch_size_equal_reference() {
    for (rows, dim, table, ids) in around_prefetch_size(29) {
        let n = ids.len() * dim;
        let mut want = vec![0.0; n];
        reference::gather(&table, dim, &ids, &mut want).unwrap();
        let mut want_scaled = vec![0.0; n];
        reference::gather_scaled(&table, dim, &ids, 1.5, &mut want_scaled).unwrap();
        let mut layer = Embedding::from_pretrained(table.clone(), dim, true).unwrap();
        for par in [Parallelism::Serial, Parallelism::Rayon] {
            for pool in pools() {
                let mut got = vec![f32::NAN; n];
                pool.install(|| gather_with(par, &table, dim, &ids, &mut got))
                    .unwrap();
                assert_eq!(bits(&got), bits(&want), "{rows} × {dim}, {par:?}");
                pool.install(|| gather_scaled_with(par, &table, dim, &ids, 1.5, &mut got))
                    .unwrap();
                assert_eq!(bits(&got), bits(&want_scaled), "{rows} × {dim}, {par:?}");
                layer = layer.with_parallelism(par);
                let out = pool.install(|| layer.forward(&ids, &[ids.len()])).unwrap();
                assert_eq!(bits(&out.values), bits(&want), "{rows} × {dim}, {par:?}");
            }
        }
    }
}

/// A gather whose output and rows pass the sizes from which a split call
/// streams its stores (on CPUs where they pay; a unit test of `gather.rs`
/// runs the streaming stores on any CPU) equals the scalar loop, for
/// outputs 0, 1 and 4 floats into a buffer (rows on and off 32-byte lines:
/// the 32-byte and the 16-byte streaming stores) and rows that end
/// mid-register, on every pool size.
#[test]
fn large_outputs_written_with_streaming_stores_equal_reference() {
    let out_floats = (16 << 20) / 4 + 1000;
    for dim in [7, 128, 129] {
        let rows = 3000;
        let table: Vec<f32> = (0..rows * dim)
            .map(|i| (i % 9973) as f32 - 4000.5)
            .collect();
        let n = out_floats / dim + 1;
        let ids: Vec<u32> = (0..n as u32)
            .map(|i| i.wrapping_mul(2_654_435_761) % rows as u32)
            .collect();
        // The scalar loop: the one-hot reference's matrix would not fit.
        let mut want = vec![0.0; n * dim];
        reference::loops::gather(&table, dim, &ids, &mut want).unwrap();
        for pool in pools() {
            for offset in [0, 1, 4] {
                let mut buf = vec![f32::NAN; n * dim + offset];
                let got = &mut buf[offset..];
                pool.install(|| gather_with(Parallelism::Rayon, &table, dim, &ids, got))
                    .unwrap();
                assert!(bits(got) == bits(&want), "dim {dim}, offset {offset}");
                assert!(
                    buf[..offset].iter().all(|x| x.is_nan()),
                    "nothing before the output"
                );
            }
        }
    }
}
