//! Every kernel, id type and thread count against the one-hot reference, bit
//! for bit, plus the error paths with NaN canaries.

use embedding_kernels::reference::loops;
use embedding_kernels::{
    gather, gather_scaled, gather_scaled_with, gather_with, reference, scatter_add,
    scatter_add_with, EmbeddingError, Index, Operand, Parallelism,
};
use proptest::prelude::*;

mod common;
use common::{bits, convert, draw_ids, pools, Pattern, SplitMix};

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

/// Both the kernel and the reference give `want`, and `out` keeps its canary.
fn gather_fails_with<I: Index>(
    table: &[f32],
    dim: usize,
    ids: &[I],
    out_len: usize,
    want: EmbeddingError,
) {
    let mut out = vec![f32::NAN; out_len];
    assert_eq!(gather(table, dim, ids, &mut out), Err(want.clone()));
    assert_eq!(
        gather_scaled(table, dim, ids, 3.0, &mut out),
        Err(want.clone())
    );
    assert_eq!(reference::gather(table, dim, ids, &mut out), Err(want));
    assert!(out.iter().all(|x| x.is_nan()), "canary overwritten");
}

#[test]
fn largest_valid_id_works_and_the_next_one_fails() {
    let (rows, dim) = (5, 3);
    let table: Vec<f32> = (0..rows * dim).map(|x| x as f32).collect();
    let mut out = [f32::NAN; 3];
    gather(&table, dim, &[4u32], &mut out).unwrap();
    assert_eq!(out, [12.0, 13.0, 14.0]);
    let err = EmbeddingError::IndexOutOfRange {
        position: 0,
        index: 5,
        num_embeddings: 5,
    };
    gather_fails_with(&table, dim, &[5u32], 3, err);
}

#[test]
fn extreme_ids_are_reported_with_their_signed_value() {
    let table = vec![1.0f32; 8];
    for (ids, index) in [
        (vec![0i64, i64::MIN], i64::MIN as i128),
        (vec![0i64, -1], -1),
        (vec![0i64, i64::MAX], i64::MAX as i128),
    ] {
        let want = EmbeddingError::IndexOutOfRange {
            position: 1,
            index,
            num_embeddings: 4,
        };
        gather_fails_with(&table, 2, &ids, 4, want);
    }
    let want = EmbeddingError::IndexOutOfRange {
        position: 0,
        index: u64::MAX as i128,
        num_embeddings: 4,
    };
    gather_fails_with(&table, 2, &[u64::MAX], 2, want);
    let want = EmbeddingError::IndexOutOfRange {
        position: 0,
        index: i32::MIN as i128,
        num_embeddings: 4,
    };
    gather_fails_with(&table, 2, &[i32::MIN], 2, want);
}

#[test]
fn dim_zero_edges() {
    // No values and no row width: no rows, so no id is valid.
    let mut empty: [f32; 0] = [];
    assert_eq!(gather(&[], 0, &[] as &[u32], &mut empty), Ok(()));
    assert_eq!(scatter_add(&[], 0, &[] as &[u32], &mut empty), Ok(()));
    gather_fails_with(
        &[],
        0,
        &[0u32],
        0,
        EmbeddingError::IndexOutOfRange {
            position: 0,
            index: 0,
            num_embeddings: 0,
        },
    );
    gather_fails_with(
        &[1.0, 2.0],
        0,
        &[0u32],
        0,
        EmbeddingError::ZeroDimWithData {
            operand: Operand::Table,
            len: 2,
        },
    );
}

#[test]
fn zero_rows_and_no_ids() {
    gather_fails_with(
        &[],
        4,
        &[0i64],
        4,
        EmbeddingError::IndexOutOfRange {
            position: 0,
            index: 0,
            num_embeddings: 0,
        },
    );
    let table = [1.0f32; 8];
    let mut out: [f32; 0] = [];
    assert_eq!(gather(&table, 4, &[] as &[i64], &mut out), Ok(()));
    let mut grad = [f32::NAN; 8];
    assert_eq!(scatter_add(&[], 4, &[] as &[i64], &mut grad), Ok(()));
    assert!(grad.iter().all(|x| x.is_nan()));
}

#[test]
fn shape_errors_name_what_was_wrong() {
    let table = [0.0f32; 12];
    gather_fails_with(
        &table,
        5,
        &[0u32],
        5,
        EmbeddingError::NotMultipleOfDim {
            operand: Operand::Table,
            len: 12,
            dim: 5,
        },
    );
    gather_fails_with(
        &table,
        4,
        &[0u32, 1],
        7,
        EmbeddingError::LengthMismatch {
            operand: Operand::Output,
            expected: 8,
            got: 7,
        },
    );
    gather_fails_with(
        &[],
        usize::MAX,
        &[0u32, 0],
        0,
        EmbeddingError::SizeOverflow {
            count: 2,
            dim: usize::MAX,
        },
    );
    // A bad id behind a bad shape: the shape is reported (the order is fixed).
    gather_fails_with(
        &table,
        4,
        &[9u32],
        3,
        EmbeddingError::LengthMismatch {
            operand: Operand::Output,
            expected: 4,
            got: 3,
        },
    );
}

#[test]
fn scatter_shape_errors_leave_the_gradient_alone() {
    let grad_output = [1.0f32; 8];
    for (grad_len, dim, ids, want) in [
        (
            9,
            4,
            vec![0u32, 1],
            EmbeddingError::NotMultipleOfDim {
                operand: Operand::GradTable,
                len: 9,
                dim: 4,
            },
        ),
        (
            12,
            4,
            vec![0u32],
            EmbeddingError::LengthMismatch {
                operand: Operand::GradOutput,
                expected: 4,
                got: 8,
            },
        ),
        (
            3,
            0,
            vec![],
            EmbeddingError::ZeroDimWithData {
                operand: Operand::GradTable,
                len: 3,
            },
        ),
    ] {
        let mut grad = vec![f32::NAN; grad_len];
        assert_eq!(
            scatter_add(&grad_output, dim, &ids, &mut grad),
            Err(want.clone())
        );
        assert_eq!(
            reference::scatter_add(&grad_output, dim, &ids, &mut grad),
            Err(want)
        );
        assert!(grad.iter().all(|x| x.is_nan()));
    }
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
