//! Test helpers shared by the integration tests: local rayon pools, bit
//! comparisons, a deterministic value generator and id patterns, the runner
//! of the error tables and the finite-difference (gradient check) harness.

#![allow(dead_code)]

use embedding_kernels::{EmbeddingError, Operand};
use rayon::{ThreadPool, ThreadPoolBuilder};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

/// Local pools of 1, 2, 3 and 8 threads (never the global pool).
pub fn pools() -> &'static [ThreadPool] {
    static POOLS: OnceLock<Vec<ThreadPool>> = OnceLock::new();
    POOLS.get_or_init(|| {
        [1, 2, 3, 8]
            .iter()
            .map(|&n| ThreadPoolBuilder::new().num_threads(n).build().unwrap())
            .collect()
    })
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A small deterministic generator, so big tables cost nothing to shrink.
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Values of very different magnitudes (so summation order shows in the
    /// bits), with the odd `-0.0`.
    pub fn value(&mut self) -> f32 {
        let r = self.next();
        if r.is_multiple_of(97) {
            return -0.0;
        }
        let mantissa = (r >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        let exponent = ((r >> 8) % 24) as i32 - 12;
        mantissa * 2f32.powi(exponent)
    }

    pub fn values(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.value()).collect()
    }

    /// A value in `[-1, 1)`.
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// A value of any magnitude from 2^-12 to 2^12 (and now and then `-0.0`),
    /// so that the order of a sum shows in its bits.
    pub fn wild(&mut self) -> f32 {
        let r = self.next();
        if r.is_multiple_of(89) {
            return -0.0;
        }
        let exponent = ((r >> 8) % 25) as i32 - 12;
        self.unit() * 2f32.powi(exponent)
    }

    pub fn wilds(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.wild()).collect()
    }

    pub fn units(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit()).collect()
    }
}

/// How the ids of a case are drawn.
#[derive(Clone, Copy, Debug)]
pub enum Pattern {
    /// Uniform over all rows.
    Uniform,
    /// Only from a handful of rows.
    FewDistinct,
    /// 90 % one row, the rest uniform.
    Hot,
}

pub fn draw_ids(rows: usize, n: usize, pattern: Pattern, seed: u64) -> Vec<u64> {
    let mut rng = SplitMix(seed ^ 0xA5A5);
    let rows = rows as u64;
    let few: Vec<u64> = (0..3).map(|_| rng.next() % rows).collect();
    let hot = rng.next() % rows;
    (0..n)
        .map(|_| match pattern {
            Pattern::Uniform => rng.next() % rows,
            Pattern::FewDistinct => few[(rng.next() % 3) as usize],
            Pattern::Hot if !rng.next().is_multiple_of(10) => hot,
            Pattern::Hot => rng.next() % rows,
        })
        .collect()
}

pub fn convert<I: TryFrom<u64>>(ids: &[u64]) -> Vec<I> {
    ids.iter()
        .map(|&id| I::try_from(id).ok().expect("test ids fit every type"))
        .collect()
}

/// Ids written as `i128`, converted to `I`, or `None` if one does not fit
/// (a negative id and an unsigned type, say).
pub fn ids_as<I: TryFrom<i128>>(ids: &[i128]) -> Option<Vec<I>> {
    ids.iter().map(|&id| I::try_from(id).ok()).collect()
}

// ---------------------------------------------------------------------------
// Error tables
// ---------------------------------------------------------------------------

/// One row of an error table: what the row is about, the call's arguments,
/// and the error every entry point must return for them (an
/// [`EmbeddingError`] unless the table says otherwise).
pub struct Row<A, W = EmbeddingError> {
    pub name: String,
    pub args: A,
    pub want: W,
}

/// A [`Row`].
pub fn row<A, W>(name: impl Into<String>, args: A, want: W) -> Row<A, W> {
    Row {
        name: name.into(),
        args,
        want,
    }
}

/// [`EmbeddingError::LengthMismatch`], for one-line table rows.
pub fn mismatch(operand: Operand, expected: usize, got: usize) -> EmbeddingError {
    EmbeddingError::LengthMismatch {
        operand,
        expected,
        got,
    }
}

/// [`EmbeddingError::NotMultipleOfDim`].
pub fn not_whole_rows(operand: Operand, len: usize, dim: usize) -> EmbeddingError {
    EmbeddingError::NotMultipleOfDim { operand, len, dim }
}

/// [`EmbeddingError::ZeroDimWithData`].
pub fn zero_dim(operand: Operand, len: usize) -> EmbeddingError {
    EmbeddingError::ZeroDimWithData { operand, len }
}

/// [`EmbeddingError::IndexOutOfRange`].
pub fn bad_id(position: usize, index: i128, num_embeddings: usize) -> EmbeddingError {
    EmbeddingError::IndexOutOfRange {
        position,
        index,
        num_embeddings,
    }
}

/// [`EmbeddingError::InvalidArgument`] for `name` given `value` (printed
/// as the crate prints it). Its `requirement` is prose, free to change, so
/// [`assert_error`] does not compare it.
pub fn invalid(name: &'static str, value: impl ToString) -> EmbeddingError {
    EmbeddingError::InvalidArgument {
        name,
        value: value.to_string(),
        requirement: "",
    }
}

/// `got` is the error `want`: equal in every field, except the
/// `requirement` of an [`EmbeddingError::InvalidArgument`] (see
/// [`invalid`]).
pub fn assert_error<T: std::fmt::Debug>(
    what: &str,
    got: Result<T, EmbeddingError>,
    want: &EmbeddingError,
) {
    let err = match got {
        Ok(value) => panic!("{what}: Ok({value:?}), expected {want:?}"),
        Err(err) => err,
    };
    match (&err, want) {
        (
            EmbeddingError::InvalidArgument { name, value, .. },
            EmbeddingError::InvalidArgument {
                name: want_name,
                value: want_value,
                ..
            },
        ) => assert!(
            name == want_name && value == want_value,
            "{what}: {err:?}, expected {want:?}"
        ),
        _ => assert_eq!(&err, want, "{what}"),
    }
}

/// Runs `check(args, want)` for every row, all of them even when one fails,
/// then fails naming every row that failed (each row's own message is
/// printed as it fails). `check` makes the calls and asserts; a row that
/// makes no call would pass, so every `check` must assert on a result.
pub fn run_table<A, W>(rows: &[Row<A, W>], check: impl Fn(&A, &W)) {
    assert!(!rows.is_empty(), "an empty table checks nothing");
    let mut names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    assert_eq!(names.len(), before, "two rows share a name");
    let failed: Vec<&str> = rows
        .iter()
        .filter(|r| catch_unwind(AssertUnwindSafe(|| check(&r.args, &r.want))).is_err())
        .map(|r| r.name.as_str())
        .collect();
    assert!(failed.is_empty(), "rows failed: {failed:?}");
}

// ---------------------------------------------------------------------------
// Finite differences
// ---------------------------------------------------------------------------

/// `Σ R ⊙ out`, in f64: the loss every gradient check differentiates. Its
/// gradient with respect to `out` is `R`, so a backward fed
/// `grad_output = R` must return its gradient with respect to a table.
pub fn weighted_sum(out: &[f32], r: &[f32]) -> f64 {
    assert_eq!(out.len(), r.len(), "one weight per output");
    out.iter()
        .zip(r)
        .map(|(&o, &r)| f64::from(o) * f64::from(r))
        .sum()
}

/// The central differences `(L(x + h) - L(x - h)) / 2h` of `loss` at the
/// given `entries` of the parameter `param(state)`, as `(entry, value)`.
/// Each entry is set to `x + h`, then `x - h` (both from `x`), then back to
/// `x`, so `state` ends as it began.
pub fn central_differences<S: ?Sized>(
    state: &mut S,
    param: impl Fn(&mut S) -> &mut [f32],
    entries: impl IntoIterator<Item = usize>,
    h: f32,
    mut loss: impl FnMut(&mut S) -> f64,
) -> Vec<(usize, f64)> {
    entries
        .into_iter()
        .map(|k| {
            let x = param(state)[k];
            param(state)[k] = x + h;
            let up = loss(state);
            param(state)[k] = x - h;
            let down = loss(state);
            param(state)[k] = x;
            (k, (up - down) / (2.0 * f64::from(h)))
        })
        .collect()
}

/// [`central_differences`] of `loss` with respect to a plain vector `x`,
/// at the given entries.
pub fn numeric_gradient(
    x: &[f32],
    entries: impl IntoIterator<Item = usize>,
    h: f32,
    mut loss: impl FnMut(&[f32]) -> f64,
) -> Vec<(usize, f64)> {
    let mut x = x.to_vec();
    central_differences(&mut x, |x| &mut x[..], entries, h, |x| loss(x))
}

/// Every numeric derivative against the backward's value at its entry:
/// `|backward - numeric| <= tolerance(entry, backward, numeric)` (a
/// tolerance of 0 asks for equality).
pub fn assert_gradient(
    what: &str,
    backward: &[f32],
    numeric: &[(usize, f64)],
    tolerance: impl Fn(usize, f64, f64) -> f64,
) {
    assert!(!numeric.is_empty(), "{what}: no entry checked");
    for &(k, fd) in numeric {
        let g = f64::from(backward[k]);
        let tol = tolerance(k, g, fd);
        assert!(
            (fd - g).abs() <= tol,
            "{what}: entry {k}: backward {g}, numeric {fd}, tolerance {tol}"
        );
    }
}

/// [`assert_gradient`] at every entry, within `rel · (1 + |numeric|)`.
pub fn assert_close(what: &str, backward: &[f32], numeric: &[f64], rel: f64) {
    assert_eq!(backward.len(), numeric.len(), "{what}: lengths");
    let numeric: Vec<(usize, f64)> = numeric.iter().copied().enumerate().collect();
    assert_gradient(what, backward, &numeric, |_, _, fd| rel * (1.0 + fd.abs()));
}

/// The values of `(entry, value)` pairs, in order.
pub fn values(pairs: &[(usize, f64)]) -> Vec<f64> {
    pairs.iter().map(|&(_, v)| v).collect()
}

/// A table and 3 000 ids on each side of the 512 KiB from which the
/// lookups and bags prefetch rows: 2 047 × 64 floats (one row short),
/// 2 048 × 64 (exactly 512 KiB) and 4 099 × 37 (past it, with rows that are
/// no whole number of cache lines). Yields `(rows, dim, table, ids)`.
pub fn around_prefetch_size(seed: u64) -> Vec<(usize, usize, Vec<f32>, Vec<i64>)> {
    let mut rng = SplitMix(seed);
    [(2_047u64, 64), (2_048, 64), (4_099, 37)]
        .into_iter()
        .map(|(rows, dim)| {
            let table = rng.values(rows as usize * dim);
            let ids = (0..3_000).map(|_| (rng.next() % rows) as i64).collect();
            (rows as usize, dim, table, ids)
        })
        .collect()
}
