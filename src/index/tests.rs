//! The id check, its narrowing and the kernels run on narrowed and wide ids.

use super::*;

#[test]
fn negative_ids_map_above_every_row_count() {
    for key in [(-1i32).key(), i32::MIN.key(), (-1i64).key(), i64::MIN.key()] {
        assert_eq!(key, u64::MAX);
    }
    assert_eq!(7i32.key(), 7);
    assert_eq!(i32::MAX.key(), i32::MAX as u64);
    assert_eq!(i64::MAX.key(), i64::MAX as u64);
    assert_eq!(u64::MAX.key(), u64::MAX);
}

#[test]
fn negative_ids_are_refused_by_the_largest_row_count() {
    let err = ValidIds::new(&[0i64, -2], usize::MAX).unwrap_err();
    assert_eq!(
        err,
        EmbeddingError::IndexOutOfRange {
            position: 1,
            index: -2,
            num_embeddings: usize::MAX
        }
    );
    assert!(ValidIds::new(&[i32::MIN], usize::MAX).is_err());
    // A large unsigned id is an id like any other.
    if usize::BITS == 64 {
        let big = 1u64 << 63;
        assert_eq!(
            ValidIds::new(&[big], usize::MAX).unwrap().row(0) as u64,
            big
        );
    }
}

#[test]
fn first_bad_id_is_reported_even_past_a_block() {
    let mut ids = vec![3u32; 3 * CHECK_BLOCK];
    ids[CHECK_BLOCK + 5] = 10;
    ids[2 * CHECK_BLOCK] = 11;
    let err = ValidIds::new(&ids, 10).unwrap_err();
    assert_eq!(
        err,
        EmbeddingError::IndexOutOfRange {
            position: CHECK_BLOCK + 5,
            index: 10,
            num_embeddings: 10
        }
    );
}

#[test]
fn a_split_scan_reports_the_first_bad_id_of_all_its_tasks() {
    let task = CHECK_TASK_BLOCKS * CHECK_BLOCK;
    let len = 3 * task + 77;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build();
    let pool = pool.expect("a pool of two threads");
    // Each list of planted positions: the first must be reported,
    // whichever task holds it and whichever task finishes first.
    let plantings: [&[usize]; 7] = [
        &[0],
        &[task - 1, task],
        &[task, 2 * task + 3],
        &[2 * task + 5, task + 9],
        &[len - 1],
        &[task + CHECK_BLOCK - 1, len - 1, 0],
        &[],
    ];
    for par in [Parallelism::Auto, Parallelism::Rayon, Parallelism::Serial] {
        for planted in plantings {
            let mut ids = vec![5i64; len];
            for (k, &at) in planted.iter().enumerate() {
                ids[at] = 100 + k as i64;
            }
            let want =
                first_bad(&ids, 100).map(|(position, index)| EmbeddingError::IndexOutOfRange {
                    position,
                    index,
                    num_embeddings: 100,
                });
            let got = pool.install(|| ValidIds::new_with(par, &ids, 100)).err();
            assert_eq!(got, want, "{par:?} {planted:?}");
            // The block itself, not only the error found from it (an
            // early block would still lead to the right id).
            let rows = <i64 as sealed::Sealed>::as_rows(&ids);
            let serial = first_bad_block(Parallelism::Serial, rows, 100);
            let (split, block) = pool.install(|| {
                let split = check_splits(par, &ids);
                (split, first_bad_block(par, rows, 100))
            });
            assert_eq!(block, serial, "{par:?} {planted:?}");
            assert_eq!(split, par != Parallelism::Serial, "{par:?}");
        }
    }
}

/// The first bad id of `ids` by a plain loop, as the scan must find it.
fn first_bad<I: Index>(ids: &[I], rows: usize) -> Option<(usize, i128)> {
    let at = ids
        .iter()
        .position(|&id| id.to_i128() < 0 || id.to_i128() >= rows as i128)?;
    Some((at, ids[at].to_i128()))
}

/// Plants `bad` values at positions around the SIMD widths and the block
/// edges, one or two at a time, and checks the scan of every instruction
/// set reports the first of them.
fn scan_finds_the_first_bad_id<I: Index>(good: I, bad: &[I], rows: usize) {
    let len = 2 * CHECK_BLOCK + 37;
    let spots = [
        0,
        1,
        3,
        4,
        7,
        8,
        15,
        31,
        CHECK_BLOCK - 1,
        CHECK_BLOCK,
        len - 1,
    ];
    for isa in Isa::all() {
        isa.force(|| {
            let ids = vec![good; len];
            assert!(ValidIds::new(&ids, rows).is_ok(), "{isa:?}");
            assert!(ValidIds::new(&ids[..0], 0).is_ok(), "{isa:?}");
            for &b in bad {
                for &first in &spots {
                    for second in [None, Some(first + 1), Some(len - 1)] {
                        let mut ids = ids.clone();
                        ids[first] = b;
                        if let Some(s) = second.filter(|&s| s < len) {
                            ids[s] = b;
                        }
                        let want = first_bad(&ids, rows).map(|(position, index)| {
                            EmbeddingError::IndexOutOfRange {
                                position,
                                index,
                                num_embeddings: rows,
                            }
                        });
                        let got = ValidIds::new(&ids, rows).err();
                        assert_eq!(got, want, "{isa:?} {b:?} at {first}");
                    }
                }
            }
        });
    }
}

#[test]
fn scan_finds_the_first_bad_id_of_every_type_on_every_isa() {
    let rows = 1000;
    scan_finds_the_first_bad_id(999u32, &[1000, 1001, u32::MAX], rows);
    scan_finds_the_first_bad_id(999i32, &[1000, -1, i32::MIN, i32::MAX], rows);
    scan_finds_the_first_bad_id(999u64, &[1000, 1 << 32, u64::MAX], rows);
    let big = [1000, -1, 1 << 32, -(1 << 32), i64::MIN, i64::MAX];
    scan_finds_the_first_bad_id(999i64, &big, rows);
    scan_finds_the_first_bad_id(999usize, &[1000, usize::MAX], rows);
    // Row counts past 2^31, 2^32 and 2^63: only the negative ids are
    // bad (a negative id read as its row type is 2^31 or 2^63 and more).
    scan_finds_the_first_bad_id(i64::MAX, &[-1, i64::MIN], usize::MAX);
    scan_finds_the_first_bad_id(i32::MAX, &[-1, i32::MIN], usize::MAX);
    scan_finds_the_first_bad_id(i32::MAX, &[-1, i32::MIN], 1 << 31);
    scan_finds_the_first_bad_id(i32::MAX - 1, &[i32::MAX, -1], i32::MAX as usize);
    scan_finds_the_first_bad_id(u32::MAX - 1, &[u32::MAX], u32::MAX as usize);
    if usize::BITS == 64 {
        // Every u32 is a row of 2^32 rows: the scan has no bound.
        scan_finds_the_first_bad_id(u32::MAX, &[], 1 << 32);
        scan_finds_the_first_bad_id(usize::MAX - 1, &[usize::MAX], usize::MAX);
    }
}

/// A task's window check of `ids` against `rows` accepts exactly the
/// ids that are rows, whatever their type.
fn window_check_agrees<I: Index>(ids: &[I], rows: usize) {
    for start in 0..ids.len() {
        for end in start..=ids.len() {
            let got = IdsWindow::check(UncheckedIds::of(ids), start..end, rows);
            let want = ids[start..end].iter().all(|&id| {
                let v = id.to_i128();
                v >= 0 && v < rows as i128
            });
            assert_eq!(got.is_some(), want, "{ids:?}[{start}..{end}] of {rows}");
            if let Some(window) = got {
                for (p, id) in ids.iter().enumerate().take(end).skip(start) {
                    assert_eq!(window.row(p) as i128, id.to_i128());
                }
            }
        }
    }
    assert!(IdsWindow::check(UncheckedIds::of(ids), 0..ids.len() + 1, rows).is_none());
}

#[test]
fn a_window_check_accepts_exactly_the_rows_of_every_type() {
    for rows in [
        0,
        1,
        5,
        i32::MAX as usize,
        1 << 31,
        u32::MAX as usize,
        usize::MAX,
    ] {
        window_check_agrees(&[0i32, 4, -1, 5, i32::MAX, i32::MIN], rows);
        window_check_agrees(&[0u32, 4, 5, u32::MAX, 1 << 31], rows);
        window_check_agrees(&[0i64, 4, -1, 5, i64::MAX, i64::MIN, 1 << 32], rows);
        window_check_agrees(&[0u64, 4, 5, u64::MAX, 1 << 63], rows);
        window_check_agrees(&[0usize, 4, 5, usize::MAX], rows);
    }
}

#[test]
fn every_type_reports_the_value_its_caller_wrote() {
    fn reported<I: Index>(id: I) -> i128 {
        match ValidIds::new(&[id], 4) {
            Err(EmbeddingError::IndexOutOfRange { index, .. }) => index,
            other => panic!("{id:?}: {other:?}"),
        }
    }
    assert_eq!(reported(-1i32), -1);
    assert_eq!(reported(i32::MIN), i32::MIN as i128);
    assert_eq!(reported(u32::MAX), u32::MAX as i128);
    assert_eq!(reported(-7i64), -7);
    assert_eq!(reported(i64::MIN), i64::MIN as i128);
    assert_eq!(reported(u64::MAX), u64::MAX as i128);
    assert_eq!(reported(usize::MAX), usize::MAX as i128);
    assert_eq!(reported(4usize), 4);
}

#[test]
fn signed_values_are_reported_signed() {
    let err = ValidIds::new(&[0i64, -1], 4).unwrap_err();
    assert_eq!(
        err,
        EmbeddingError::IndexOutOfRange {
            position: 1,
            index: -1,
            num_embeddings: 4
        }
    );
    let err = ValidIds::new(&[u64::MAX], 4).unwrap_err();
    assert!(
        matches!(err, EmbeddingError::IndexOutOfRange { index, .. } if index == u64::MAX as i128)
    );
}

/// `u64` ids of a table of at most 2^32 rows read as `u32`s, every
/// other half: each position, each window and each slice gives the
/// caller's rows; a table one row larger keeps them `u64`s.
#[test]
#[cfg(target_pointer_width = "64")]
fn u64_ids_narrow_to_their_low_halves_up_to_2_pow_32_rows() {
    let ids: Vec<i64> = vec![0, 5, 3, 9, 4_294_967_295, 7];
    let rows = |v: &ValidIds<'_, u32>| v.rows().collect::<Vec<_>>();
    let want: Vec<usize> = ids.iter().map(|&id| id as usize).collect();
    for num_embeddings in [4_294_967_296usize, 10_000_000_000] {
        let small = num_embeddings == 1 << 32;
        let checked = ValidIds::new(&ids, num_embeddings).unwrap();
        match checked.by_row() {
            ByRow::U32(narrow) => {
                assert!(small, "{num_embeddings} rows narrowed");
                assert_eq!((narrow.shift, narrow.len()), (1, ids.len()));
                assert_eq!(narrow.ids.len(), 2 * ids.len());
                assert_eq!(rows(&narrow), want);
                for (k, &row) in want.iter().enumerate() {
                    assert_eq!(narrow.row(k), row);
                }
                for (from, to) in [(0, 6), (1, 4), (5, 6), (3, 3), (6, 6)] {
                    let part = narrow.slice(from..to);
                    assert_eq!(rows(&part), want[from..to], "{from}..{to}");
                    assert_eq!(part.len(), to - from);
                }
                let window = IdsWindow {
                    ids: checked,
                    base: 2,
                };
                let ByRow::U32(window) = window.by_row() else {
                    panic!("a narrowed window of u64s");
                };
                assert_eq!(window.row(4), want[2]);
                assert_eq!(rows(&window.slice(3..5)), want[1..3]);
            }
            ByRow::U64(wide) => {
                assert!(!small, "{num_embeddings} rows not narrowed");
                assert_eq!(wide.rows().collect::<Vec<_>>(), want);
            }
        }
    }
    let empty = ValidIds::new(&[] as &[u64], 10).unwrap().by_row();
    assert!(matches!(empty, ByRow::U32(v) if v.is_empty() && v.rows().len() == 0));
}

/// A position past the narrowed ids is refused, as a slice refuses one.
#[test]
#[should_panic]
fn a_position_past_narrowed_ids_panics() {
    let ids = [1u64, 2, 3];
    let ByRow::U32(narrow) = ValidIds::new(&ids, 4).unwrap().by_row() else {
        panic!("not narrowed");
    };
    narrow.row(3);
}

/// The kernels of a table too large to narrow its ids (its `u64`
/// bodies, on the portable lanes alone) give the bits of the narrowed
/// ones: a gather and a bag sum, with ids checked against a row count
/// past 2^32 that the table (of a few rows) stands in for.
#[test]
#[cfg(target_pointer_width = "64")]
fn kernels_on_wide_ids_give_the_bits_of_narrowed_ones() {
    use crate::Parallelism;
    use crate::bags::Bags;
    use crate::pooling::{Mode, Pooling};
    let (rows, dim) = (7, 37);
    let table: Vec<f32> = (0..rows * dim).map(|k| (k as f32).sin() * 3.0).collect();
    let ids: Vec<i64> = vec![6, 0, 3, 3, 5, 1, 2, 6, 4];
    let bags = Bags::from_offsets(&[0i64, 2, 2, 5], ids.len(), false).unwrap();
    let pooling = Pooling {
        mode: Mode::Sum,
        ..Pooling::default()
    };
    let run = |num_embeddings: usize| {
        let checked = ValidIds::new(&ids, num_embeddings).unwrap().by_row();
        let mut gathered = vec![f32::NAN; ids.len() * dim];
        crate::kernels::gather_valid(Parallelism::Serial, &table, dim, checked, &mut gathered);
        let mut pooled = vec![f32::NAN; bags.len() * dim];
        crate::kernels::forward_valid(
            Parallelism::Serial,
            &table,
            dim,
            checked,
            &bags,
            &pooling,
            &mut pooled,
            &mut [],
        );
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        (
            matches!(checked, ByRow::U32(_)),
            bits(gathered),
            bits(pooled),
        )
    };
    let (narrowed, gathered, pooled) = run(rows);
    let (wide_narrowed, wide_gathered, wide_pooled) = run(10_000_000_000);
    assert!(narrowed && !wide_narrowed);
    assert_eq!(wide_gathered, gathered);
    assert_eq!(wide_pooled, pooled);
}
