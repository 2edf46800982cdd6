//! The transformer input path (`positions`): the sinusoidal table, and the
//! fused token + position kernels against their unfused composition.
//!
//! The oracle is the composition of the crate's one-hot reference with plain
//! loops, so nothing here trusts the kernels under test:
//!
//! ```text
//! forward:  reference::gather (or gather_scaled), then out[b, t, :] += positions[t, :]
//! backward: g' = g * scale for every value, reference::scatter_add(g') into grad_table,
//!           then grad_positions[t, :] += g[b, t, :] for b = 0, 1, … (plain loops)
//! ```
//!
//! The kernels promise the same bits as that composition, on every thread
//! count, so every comparison is bitwise. Values span 24 binades, so a sum
//! taken in another order shows in the bits.

use embedding_kernels::positions::sinusoidal_positions;
use embedding_kernels::{EmbeddingError, Index, Operand, Parallelism, reference};
use embedding_kernels::{
    embed_positions, embed_positions_backward, embed_positions_backward_with, embed_positions_with,
};
use embedding_kernels::{scatter_add_scaled, scatter_add_scaled_with};
use proptest::prelude::*;

use crate::common::{
    Row, SplitMix as Rng, assert_gradient, bad_id, bits, central_differences, convert as to_ids,
    mismatch, not_whole_rows, pools, row, run_table, weighted_sum, zero_dim,
};
use std::fmt::Debug;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Runs `run` on the calling thread with `Serial`, then on every pool with
/// `Rayon` (always split) and `Auto`, and checks each result against `want`.
fn on_every_path<T: PartialEq + Debug + Send>(
    want: &T,
    run: impl Fn(Parallelism) -> T + Sync,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(&run(Parallelism::Serial), want, "Serial");
    for pool in pools() {
        for par in [Parallelism::Rayon, Parallelism::Auto] {
            let got = pool.install(|| run(par));
            prop_assert_eq!(
                &got,
                want,
                "{:?} on {} threads",
                par,
                pool.current_num_threads()
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The oracle: the crate's reference, composed with plain loops
// ---------------------------------------------------------------------------

/// `reference::gather` (or `gather_scaled`), then `out[b, t, :] +=
/// positions[t, :]`.
fn forward_oracle<I: Index>(
    table: &[f32],
    positions: &[f32],
    dim: usize,
    ids: &[I],
    seq_len: usize,
    scale: Option<f32>,
) -> Vec<f32> {
    let mut out = vec![f32::NAN; ids.len() * dim];
    match scale {
        None => reference::gather(table, dim, ids, &mut out),
        Some(s) => reference::gather_scaled(table, dim, ids, s, &mut out),
    }
    .expect("the oracle's call is valid");
    for (i, row) in out.chunks_exact_mut(dim).enumerate() {
        let t = i % seq_len;
        for (o, p) in row.iter_mut().zip(&positions[t * dim..(t + 1) * dim]) {
            *o += *p;
        }
    }
    out
}

/// Every value of `grad_output` times `scale` (when there is one), then
/// `reference::scatter_add`.
fn scatter_oracle<I: Index>(
    grad_output: &[f32],
    dim: usize,
    ids: &[I],
    scale: Option<f32>,
    grad_table: &mut [f32],
) {
    let scaled: Vec<f32> = match scale {
        None => grad_output.to_vec(),
        Some(s) => grad_output.iter().map(|g| g * s).collect(),
    };
    reference::scatter_add(&scaled, dim, ids, grad_table).expect("the oracle's call is valid");
}

/// `grad_positions[t, :] += grad_output[b, t, :]` for b = 0, 1, … in turn.
fn position_grad_oracle(
    grad_output: &[f32],
    dim: usize,
    seq_len: usize,
    grad_positions: &mut [f32],
) {
    let batch = grad_output.len() / (seq_len * dim);
    for b in 0..batch {
        for t in 0..seq_len {
            for j in 0..dim {
                grad_positions[t * dim + j] += grad_output[(b * seq_len + t) * dim + j];
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Property tests
// ---------------------------------------------------------------------------

/// How the ids of a case are drawn.
#[derive(Clone, Copy, Debug)]
enum Pattern {
    Uniform,
    /// Three distinct rows only.
    FewDistinct,
    /// 90 % one row.
    Hot,
}

#[derive(Clone, Debug)]
struct Case {
    rows: usize,
    dim: usize,
    seq_len: usize,
    /// Rows of the position table: `seq_len` plus a few unused ones.
    max_len: usize,
    ids: Vec<u64>,
    scale: Option<f32>,
    seed: u64,
}

fn draw_ids(rows: usize, n: usize, pattern: Pattern, rng: &mut Rng) -> Vec<u64> {
    let rows = rows as u64;
    let few = [rng.next() % rows, rng.next() % rows, rng.next() % rows];
    let hot = rng.next() % rows;
    (0..n)
        .map(|_| match pattern {
            Pattern::Uniform => rng.next() % rows,
            Pattern::FewDistinct => few[(rng.next() % 3) as usize],
            Pattern::Hot => {
                if rng.next().is_multiple_of(10) {
                    rng.next() % rows
                } else {
                    hot
                }
            }
        })
        .collect()
}

/// Dims 1..=70 (every SIMD tail), sequences of 1..=40, batches of 0..=8.
fn case() -> impl Strategy<Value = Case> {
    let pattern = prop_oneof![
        Just(Pattern::Uniform),
        Just(Pattern::FewDistinct),
        Just(Pattern::Hot)
    ];
    (
        1..=300usize,
        1..=70usize,
        1..=40usize,
        0..=5usize,
        0..=8usize,
        pattern,
        0..3u8,
        any::<u64>(),
    )
        .prop_map(
            |(rows, dim, seq_len, spare, batch, pattern, scale_kind, seed)| {
                let mut rng = Rng(seed);
                let ids = draw_ids(rows, batch * seq_len, pattern, &mut rng);
                let scale = match scale_kind {
                    0 => None,
                    1 => Some((dim as f32).sqrt()),
                    _ => Some(rng.wild() * 64.0),
                };
                Case {
                    rows,
                    dim,
                    seq_len,
                    max_len: seq_len + spare,
                    ids,
                    scale,
                    seed,
                }
            },
        )
}

fn check_forward<I: Index + TryFrom<u64>>(c: &Case) -> Result<(), TestCaseError> {
    let mut rng = Rng(c.seed ^ 0xF0F0);
    let table = rng.wilds(c.rows * c.dim);
    let positions = rng.wilds(c.max_len * c.dim);
    let ids: Vec<I> = to_ids(&c.ids);
    let n = ids.len() * c.dim;
    let want = bits(&forward_oracle(
        &table, &positions, c.dim, &ids, c.seq_len, c.scale,
    ));
    on_every_path(&want, |par| {
        let mut out = vec![f32::NAN; n];
        embed_positions_with(
            par, &table, &positions, c.dim, &ids, c.seq_len, c.scale, &mut out,
        )
        .unwrap();
        bits(&out)
    })?;
    let mut out = vec![f32::NAN; n];
    embed_positions(
        &table, &positions, c.dim, &ids, c.seq_len, c.scale, &mut out,
    )
    .unwrap();
    prop_assert_eq!(bits(&out), want, "plain");
    Ok(())
}

fn check_backward<I: Index + TryFrom<u64>>(c: &Case) -> Result<(), TestCaseError> {
    let mut rng = Rng(c.seed ^ 0x0F0F);
    let grad_output = rng.wilds(c.ids.len() * c.dim);
    // Both gradients start non-zero: the kernel accumulates.
    let table_start = rng.wilds(c.rows * c.dim);
    let positions_start = rng.wilds(c.max_len * c.dim);
    let ids: Vec<I> = to_ids(&c.ids);

    let mut want_table = table_start.clone();
    scatter_oracle(&grad_output, c.dim, &ids, c.scale, &mut want_table);
    let mut want_positions = positions_start.clone();
    position_grad_oracle(&grad_output, c.dim, c.seq_len, &mut want_positions);
    let want = (bits(&want_table), bits(&want_positions));

    let run = |par: Option<Parallelism>| {
        let mut grad_table = table_start.clone();
        let mut grad_positions = positions_start.clone();
        match par {
            Some(par) => embed_positions_backward_with(
                par,
                &grad_output,
                c.dim,
                &ids,
                c.seq_len,
                c.scale,
                &mut grad_table,
                &mut grad_positions,
            ),
            None => embed_positions_backward(
                &grad_output,
                c.dim,
                &ids,
                c.seq_len,
                c.scale,
                &mut grad_table,
                &mut grad_positions,
            ),
        }
        .unwrap();
        (bits(&grad_table), bits(&grad_positions))
    };
    on_every_path(&want, |par| run(Some(par)))?;
    prop_assert_eq!(run(None), want, "plain");
    Ok(())
}

fn check_scatter_add_scaled<I: Index + TryFrom<u64>>(c: &Case) -> Result<(), TestCaseError> {
    let mut rng = Rng(c.seed ^ 0x5A5A);
    let grad_output = rng.wilds(c.ids.len() * c.dim);
    let start = rng.wilds(c.rows * c.dim);
    let scale = c.scale.unwrap_or(0.75);
    let ids: Vec<I> = to_ids(&c.ids);
    let mut want = start.clone();
    scatter_oracle(&grad_output, c.dim, &ids, Some(scale), &mut want);
    let want = bits(&want);
    on_every_path(&want, |par| {
        let mut grad = start.clone();
        scatter_add_scaled_with(par, &grad_output, c.dim, &ids, scale, &mut grad).unwrap();
        bits(&grad)
    })?;
    let mut grad = start;
    scatter_add_scaled(&grad_output, c.dim, &ids, scale, &mut grad).unwrap();
    prop_assert_eq!(bits(&grad), want, "plain");
    Ok(())
}

/// Plants `bad` at `position` (and maybe at the end too), and checks that
/// every entry point names the first one and leaves its NaN canaries alone.
fn check_bad_id<I: Index + TryFrom<u64>>(
    c: &Case,
    position: usize,
    bad: I,
    later_bad: bool,
) -> Result<(), TestCaseError> {
    let mut ids: Vec<I> = to_ids(&c.ids);
    if ids.is_empty() {
        return Ok(());
    }
    let position = position % ids.len();
    ids[position] = bad;
    if later_bad {
        let last = ids.len() - 1;
        ids[last] = bad;
    }
    let want = Err(EmbeddingError::IndexOutOfRange {
        position,
        index: bad.to_i128(),
        num_embeddings: c.rows,
    });
    let mut rng = Rng(c.seed);
    let table = rng.wilds(c.rows * c.dim);
    let positions = rng.wilds(c.max_len * c.dim);
    let grad_output = rng.wilds(ids.len() * c.dim);
    let mut out = vec![f32::NAN; ids.len() * c.dim];
    let mut grad_table = vec![f32::NAN; c.rows * c.dim];
    let mut grad_positions = vec![f32::NAN; c.max_len * c.dim];
    let (dim, seq_len, scale) = (c.dim, c.seq_len, c.scale);

    prop_assert_eq!(
        embed_positions(&table, &positions, dim, &ids, seq_len, scale, &mut out),
        want.clone()
    );
    prop_assert_eq!(
        embed_positions_backward(
            &grad_output,
            dim,
            &ids,
            seq_len,
            scale,
            &mut grad_table,
            &mut grad_positions
        ),
        want.clone()
    );
    prop_assert_eq!(
        scatter_add_scaled(&grad_output, dim, &ids, 2.0, &mut grad_table),
        want.clone()
    );
    for pool in pools() {
        for par in [Parallelism::Serial, Parallelism::Rayon, Parallelism::Auto] {
            let (forward, backward, scaled) = pool.install(|| {
                (
                    embed_positions_with(
                        par, &table, &positions, dim, &ids, seq_len, scale, &mut out,
                    ),
                    embed_positions_backward_with(
                        par,
                        &grad_output,
                        dim,
                        &ids,
                        seq_len,
                        scale,
                        &mut grad_table,
                        &mut grad_positions,
                    ),
                    scatter_add_scaled_with(par, &grad_output, dim, &ids, 2.0, &mut grad_table),
                )
            });
            prop_assert_eq!(forward, want.clone());
            prop_assert_eq!(backward, want.clone());
            prop_assert_eq!(scaled, want.clone());
        }
    }
    prop_assert!(out.iter().all(|v| v.is_nan()), "output written on error");
    prop_assert!(grad_table.iter().all(|v| v.is_nan()), "grad_table written");
    prop_assert!(
        grad_positions.iter().all(|v| v.is_nan()),
        "grad_positions written"
    );
    Ok(())
}

macro_rules! per_id_type {
    ($($t:ident),*) => {$(
        mod $t {
            use super::*;

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(40))]

                #[test]
                fn forward_equals_gather_then_position_add(c in case()) {
                    check_forward::<$t>(&c)?;
                }

                #[test]
                fn backward_equals_scaled_scatter_and_position_sums(c in case()) {
                    check_backward::<$t>(&c)?;
                }

                #[test]
                fn scatter_add_scaled_equals_scale_then_scatter(c in case()) {
                    check_scatter_add_scaled::<$t>(&c)?;
                }

                #[test]
                fn first_bad_id_is_reported_and_nothing_written(
                    c in case(),
                    position in any::<usize>(),
                    past_end in 0u64..3,
                    later_bad in any::<bool>(),
                ) {
                    let just_out = to_ids::<$t>(&[c.rows as u64 + past_end])[0];
                    check_bad_id::<$t>(&c, position, just_out, later_bad)?;
                    // MIN + MAX: -1 for a signed type, MAX for an unsigned one.
                    check_bad_id::<$t>(&c, position, $t::MIN.wrapping_add($t::MAX), later_bad)?;
                    check_bad_id::<$t>(&c, position, $t::MAX, later_bad)?;
                    if $t::MIN != 0 {
                        check_bad_id::<$t>(&c, position, $t::MIN, later_bad)?;
                    }
                }
            }
        }
    )*};
}

per_id_type!(u32, i32, u64, i64, usize);

// ---------------------------------------------------------------------------
// Large calls: past the `Auto` thresholds, many tasks, several column blocks
// ---------------------------------------------------------------------------

/// Output of 8 MiB (past both the forward's 2 MiB and the backward's 8 MiB
/// `Auto` thresholds), rows of 256 floats (several column blocks), a
/// sinusoidal position table, and a `grad_positions` buffer at three
/// offsets, so its column borders fall on other cache-line offsets than the
/// table's.
#[test]
fn large_calls_equal_the_composition_on_every_pool() {
    let (rows, dim, seq_len, batch) = (97u64, 256, 512, 16);
    let max_len = seq_len + 3;
    let mut rng = Rng(99);
    let table = rng.wilds(rows as usize * dim);
    let positions = sinusoidal_positions(max_len, dim).unwrap();
    let ids: Vec<i64> = (0..batch * seq_len)
        .map(|_| (rng.next() % rows) as i64)
        .collect();
    let n = ids.len() * dim;
    assert!(
        n * 4 >= 8 << 20,
        "the call must be past the Auto thresholds"
    );
    let scale = Some((dim as f32).sqrt());

    let want = bits(&forward_oracle(
        &table, &positions, dim, &ids, seq_len, scale,
    ));
    for pool in pools() {
        for par in [Parallelism::Rayon, Parallelism::Auto] {
            let mut out = vec![f32::NAN; n];
            pool.install(|| {
                embed_positions_with(par, &table, &positions, dim, &ids, seq_len, scale, &mut out)
            })
            .unwrap();
            let threads = pool.current_num_threads();
            assert!(bits(&out) == want, "forward, {par:?} on {threads} threads");
        }
    }

    let grad_output = rng.wilds(n);
    let table_start = rng.wilds(rows as usize * dim);
    let positions_start = rng.wilds(max_len * dim);
    let mut want_table = table_start.clone();
    scatter_oracle(&grad_output, dim, &ids, scale, &mut want_table);
    let mut want_positions = positions_start.clone();
    position_grad_oracle(&grad_output, dim, seq_len, &mut want_positions);
    for offset in [0, 1, 3] {
        for pool in pools() {
            for par in [Parallelism::Rayon, Parallelism::Auto] {
                let mut grad_table = table_start.clone();
                let mut buffer = vec![f32::NAN; offset];
                buffer.extend_from_slice(&positions_start);
                pool.install(|| {
                    embed_positions_backward_with(
                        par,
                        &grad_output,
                        dim,
                        &ids,
                        seq_len,
                        scale,
                        &mut grad_table,
                        &mut buffer[offset..],
                    )
                })
                .unwrap();
                let threads = pool.current_num_threads();
                let what = format!("offset {offset}, {par:?} on {threads} threads");
                assert!(bits(&grad_table) == bits(&want_table), "grad_table, {what}");
                assert!(
                    bits(&buffer[offset..]) == bits(&want_positions),
                    "grad_positions, {what}"
                );
                assert!(buffer[..offset].iter().all(|v| v.is_nan()), "{what}");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Errors: every variant, the check order, NaN canaries
// ---------------------------------------------------------------------------

/// Every forward entry point returns `want` and leaves `out` alone.
fn forward_fails(
    table: &[f32],
    positions: &[f32],
    dim: usize,
    ids: &[u32],
    seq_len: usize,
    out_len: usize,
    want: EmbeddingError,
) {
    let mut out = vec![f32::NAN; out_len];
    for scale in [None, Some(3.0)] {
        assert_eq!(
            embed_positions(table, positions, dim, ids, seq_len, scale, &mut out),
            Err(want.clone())
        );
        for par in [Parallelism::Serial, Parallelism::Rayon, Parallelism::Auto] {
            assert_eq!(
                embed_positions_with(par, table, positions, dim, ids, seq_len, scale, &mut out),
                Err(want.clone())
            );
        }
    }
    assert!(out.iter().all(|v| v.is_nan()), "output written on error");
}

/// Every backward entry point returns `want` and leaves both gradients
/// alone.
fn backward_fails(
    grad_output_len: usize,
    dim: usize,
    ids: &[u32],
    seq_len: usize,
    grad_table_len: usize,
    grad_positions_len: usize,
    want: EmbeddingError,
) {
    let grad_output = vec![1.0f32; grad_output_len];
    let mut grad_table = vec![f32::NAN; grad_table_len];
    let mut grad_positions = vec![f32::NAN; grad_positions_len];
    for scale in [None, Some(3.0)] {
        assert_eq!(
            embed_positions_backward(
                &grad_output,
                dim,
                ids,
                seq_len,
                scale,
                &mut grad_table,
                &mut grad_positions
            ),
            Err(want.clone())
        );
        for par in [Parallelism::Serial, Parallelism::Rayon, Parallelism::Auto] {
            assert_eq!(
                embed_positions_backward_with(
                    par,
                    &grad_output,
                    dim,
                    ids,
                    seq_len,
                    scale,
                    &mut grad_table,
                    &mut grad_positions
                ),
                Err(want.clone())
            );
        }
    }
    assert!(grad_table.iter().all(|v| v.is_nan()), "grad_table written");
    assert!(
        grad_positions.iter().all(|v| v.is_nan()),
        "grad_positions written"
    );
}

/// One positions call: the lengths of its buffers (for the forward: the
/// table, the positions, the output; for the backward: `grad_output`,
/// `grad_table`, `grad_positions`), `dim`, the ids and `seq_len`.
struct PositionsCall {
    lens: [usize; 3],
    dim: usize,
    ids: Vec<u32>,
    seq_len: usize,
}

fn call(lens: [usize; 3], dim: usize, ids: &[u32], seq_len: usize) -> PositionsCall {
    PositionsCall {
        lens,
        dim,
        ids: ids.to_vec(),
        seq_len,
    }
}

/// Dim 4, a table of 5 rows, positions of 4 (max_len 4), 2 sequences of 3.
const IDS: [u32; 6] = [0, 1, 2, 3, 4, 0];
const TABLE: usize = 5 * 4;
const POSITIONS: usize = 4 * 4;
const OUT: usize = 6 * 4;

/// The forward's errors in the documented order: each row makes its error
/// and, where it can, a later one too, which must not be the one reported.
fn forward_errors() -> Vec<Row<PositionsCall>> {
    use EmbeddingError::{IdsShape, SequenceTooLong};
    use Operand::{Output, Positions, Table};
    let too_long = |seq_len, max_len| SequenceTooLong { seq_len, max_len };
    let shape = |shape: [usize; 2], len| IdsShape {
        shape: shape.to_vec(),
        len,
    };
    let bad_ids = [0u32, 9, 2, 3, 4, 0];
    vec![
        // The table first: not whole rows, even with the positions wrong too.
        row(
            "table 7",
            call([7, 5, OUT], 4, &IDS, 3),
            not_whole_rows(Table, 7, 4),
        ),
        row(
            "table at dim 0",
            call([1, 0, 0], 0, &[], 0),
            zero_dim(Table, 1),
        ),
        // Then the positions, even with the ids not whole sequences.
        row(
            "positions 5",
            call([TABLE, 5, OUT], 4, &IDS[..5], 3),
            not_whole_rows(Positions, 5, 4),
        ),
        row(
            "positions at dim 0",
            call([0, 2, 0], 0, &[], 0),
            zero_dim(Positions, 2),
        ),
        // Then the ids as whole sequences, even with seq_len too long as well.
        row(
            "5 ids of 3",
            call([TABLE, POSITIONS, OUT], 4, &IDS[..5], 3),
            shape([1, 3], 5),
        ),
        row(
            "5 ids of 6",
            call([TABLE, POSITIONS, OUT], 4, &IDS[..5], 6),
            shape([0, 6], 5),
        ),
        row(
            "2 ids of 0",
            call([TABLE, POSITIONS, OUT], 4, &IDS[..2], 0),
            shape([0, 0], 2),
        ),
        // Then the sequence length, even with the output wrong too ...
        row(
            "seq_len 6",
            call([TABLE, POSITIONS, OUT - 1], 4, &IDS, 6),
            too_long(6, 4),
        ),
        // ... also for an empty batch: the call still asks for 6 positions.
        row(
            "seq_len 6, no ids",
            call([TABLE, POSITIONS, 0], 4, &[], 6),
            too_long(6, 4),
        ),
        // dim 0: no positions at all, so any sequence is too long.
        row(
            "seq_len 1 at dim 0",
            call([0, 0, 0], 0, &[0], 1),
            too_long(1, 0),
        ),
        // Then the output, even with a bad id too.
        row(
            "output",
            call([TABLE, POSITIONS, OUT + 1], 4, &bad_ids, 3),
            mismatch(Output, OUT, OUT + 1),
        ),
        // And last the ids.
        row(
            "id 9",
            call([TABLE, POSITIONS, OUT], 4, &bad_ids, 3),
            bad_id(1, 9, 5),
        ),
    ]
}

/// The backward's errors in order, as [`forward_errors`].
fn backward_errors() -> Vec<Row<PositionsCall>> {
    use EmbeddingError::{IdsShape, SequenceTooLong};
    use Operand::{GradOutput, GradPositions, GradTable};
    let shape = |shape: [usize; 2], len| IdsShape {
        shape: shape.to_vec(),
        len,
    };
    vec![
        row(
            "grad_table 7",
            call([OUT, 7, 5], 4, &IDS, 3),
            not_whole_rows(GradTable, 7, 4),
        ),
        row(
            "grad_table at dim 0",
            call([0, 3, 0], 0, &[], 0),
            zero_dim(GradTable, 3),
        ),
        row(
            "grad_positions 5",
            call([OUT, TABLE, 5], 4, &IDS[..5], 3),
            not_whole_rows(GradPositions, 5, 4),
        ),
        row(
            "grad_positions at dim 0",
            call([0, 0, 2], 0, &[], 0),
            zero_dim(GradPositions, 2),
        ),
        row(
            "5 ids of 3",
            call([OUT, TABLE, POSITIONS], 4, &IDS[..5], 3),
            shape([1, 3], 5),
        ),
        row(
            "1 id of 0",
            call([OUT, TABLE, POSITIONS], 4, &IDS[..1], 0),
            shape([0, 0], 1),
        ),
        // grad_positions needs at least seq_len rows.
        row(
            "seq_len 6",
            call([OUT - 1, TABLE, POSITIONS], 4, &IDS, 6),
            SequenceTooLong {
                seq_len: 6,
                max_len: 4,
            },
        ),
        row(
            "grad_output",
            call([OUT + 1, TABLE, POSITIONS], 4, &[0, 9, 2, 3, 4, 0], 3),
            mismatch(GradOutput, OUT, OUT + 1),
        ),
        row(
            "id 5",
            call([OUT, TABLE, POSITIONS], 4, &[0, 1, 2, 3, 4, 5], 3),
            bad_id(5, 5, 5),
        ),
    ]
}

#[test]
fn forward_shape_errors_in_order() {
    run_table(&forward_errors(), |c, want| {
        let table = vec![0.5f32; c.lens[0]];
        let positions = vec![0.25f32; c.lens[1]];
        forward_fails(
            &table,
            &positions,
            c.dim,
            &c.ids,
            c.seq_len,
            c.lens[2],
            want.clone(),
        );
    });
}

#[test]
fn backward_shape_errors_in_order() {
    run_table(&backward_errors(), |c, want| {
        let [grad_output, grad_table, grad_positions] = c.lens;
        backward_fails(
            grad_output,
            c.dim,
            &c.ids,
            c.seq_len,
            grad_table,
            grad_positions,
            want.clone(),
        );
    });
}

/// `scatter_add_scaled`'s errors: a gradient of 2 rows × 4, `grad_output`'s
/// length, `dim` and the ids.
fn scatter_add_scaled_errors() -> Vec<Row<(usize, usize, [i64; 2])>> {
    vec![
        row("id 2", (8, 4, [0, 2]), bad_id(1, 2, 2)),
        row(
            "grad_output 7",
            (7, 4, [0, 1]),
            mismatch(Operand::GradOutput, 8, 7),
        ),
        row(
            "grad_table at dim 3",
            (8, 3, [0, 1]),
            not_whole_rows(Operand::GradTable, 8, 3),
        ),
    ]
}

#[test]
fn scatter_add_scaled_errors_leave_the_gradient_alone() {
    run_table(&scatter_add_scaled_errors(), |(len, dim, ids), want| {
        let grad_output = vec![1.0; *len];
        let mut grad = vec![f32::NAN; 8];
        let got = scatter_add_scaled(&grad_output, *dim, ids, 2.0, &mut grad);
        assert_eq!(got.as_ref(), Err(want));
        for par in [Parallelism::Serial, Parallelism::Rayon, Parallelism::Auto] {
            let got = scatter_add_scaled_with(par, &grad_output, *dim, ids, 2.0, &mut grad);
            assert_eq!(got.as_ref(), Err(want), "{par:?}");
        }
        assert!(grad.iter().all(|v| v.is_nan()));
    });
}

#[test]
fn empty_calls_succeed_and_write_nothing() {
    let table = [1.0f32; 8];
    let positions = [2.0f32; 4];
    let mut out: [f32; 0] = [];
    for seq_len in [0, 1, 2] {
        assert_eq!(
            embed_positions(
                &table,
                &positions,
                2,
                &[] as &[u32],
                seq_len,
                None,
                &mut out
            ),
            Ok(())
        );
        let mut grad_table = [f32::NAN; 8];
        let mut grad_positions = [f32::NAN; 4];
        assert_eq!(
            embed_positions_backward(
                &[],
                2,
                &[] as &[u32],
                seq_len,
                Some(2.0),
                &mut grad_table,
                &mut grad_positions
            ),
            Ok(())
        );
        assert!(grad_table.iter().chain(&grad_positions).all(|v| v.is_nan()));
    }
    // dim 0 with nothing at all is fine too.
    assert_eq!(
        embed_positions(&[], &[], 0, &[] as &[u32], 0, None, &mut out),
        Ok(())
    );
}

/// Position rows past `seq_len` are neither read nor written.
#[test]
fn rows_past_seq_len_are_left_alone() {
    let (dim, seq_len) = (3, 2);
    let table = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let mut positions = vec![0.5f32; seq_len * dim];
    positions.extend([f32::NAN; 3 * 3]); // rows 2..5: poison
    let ids = [1u32, 0, 0, 1];
    let mut out = [0.0f32; 12];
    embed_positions(&table, &positions, dim, &ids, seq_len, None, &mut out).unwrap();
    assert_eq!(
        out,
        [4.5, 5.5, 6.5, 1.5, 2.5, 3.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5]
    );
    let mut grad_table = [0.0f32; 6];
    let mut grad_positions = vec![f32::NAN; 5 * dim];
    grad_positions[..seq_len * dim].fill(0.0);
    embed_positions_backward(
        &[1.0; 12],
        dim,
        &ids,
        seq_len,
        None,
        &mut grad_table,
        &mut grad_positions,
    )
    .unwrap();
    assert_eq!(grad_table, [2.0; 6]);
    assert_eq!(&grad_positions[..seq_len * dim], &[2.0; 6]);
    assert!(grad_positions[seq_len * dim..].iter().all(|v| v.is_nan()));
}

// ---------------------------------------------------------------------------
// Finite differences: the backward is the derivative of the forward
// ---------------------------------------------------------------------------

/// `L = Σ R ⊙ out`, in f64, with `out` from the kernel under test.
fn loss(
    table: &[f32],
    positions: &[f32],
    dim: usize,
    ids: &[u32],
    seq_len: usize,
    scale: Option<f32>,
    r: &[f32],
) -> f64 {
    let mut out = vec![0.0; ids.len() * dim];
    embed_positions(table, positions, dim, ids, seq_len, scale, &mut out).unwrap();
    weighted_sum(&out, r)
}

/// The bound on `|central difference - backward|` for one entry, from the
/// error analysis of [`backward_matches_central_differences`]: `uses` is
/// the values of `R` the entry's derivative sums, `s` the factor they are
/// multiplied by (the scale, or 1 for a position), `m` a bound on the
/// magnitude of every rounded intermediate, `r_abs` the sum of `|R|` over
/// the whole output.
fn tolerance(uses: &[f32], s: f64, m: f64, h: f64, n: usize, r_abs: f64) -> f64 {
    const U32: f64 = 1.0 / (1u64 << 24) as f64;
    const U64: f64 = 1.0 / (1u64 << 53) as f64;
    let sum_abs: f64 = uses.iter().map(|&r| (r as f64).abs()).sum();
    // The difference quotient: three rounded f32 operations per perturbed
    // output.
    let difference = sum_abs * 3.0 * U32 * m / h;
    // The f64 sums of the two losses.
    let losses = n as f64 * U64 * r_abs * m / h;
    // The backward's f32 sum of the scaled values.
    let backward = (uses.len() + 1) as f64 * U32 * sum_abs * s;
    2.0 * (difference + losses + backward)
}

/// For `L = Σ R ⊙ out`, `∂L/∂table[r, j] = scale · Σ_{i: ids[i] = r} R[i, j]`
/// and `∂L/∂positions[t, j] = Σ_b R[b, t, j]`. The backward, fed
/// `grad_output = R`, must give these, and so must a central difference of
/// the forward.
///
/// The loss is linear in both tables, so the central difference
/// `(L(x + h) - L(x - h)) / 2h` is the derivative exactly in real
/// arithmetic, for any `h`; only rounding separates it from the backward's
/// value, and a large `h` (1.0 here) keeps that small. With `u = 2^-24`:
///
/// * each perturbed output is at most three rounded f32 operations (`x ± h`,
///   `· s`, `+ p`), each off by at most `u · M`, where `M` bounds their
///   magnitudes, so the quotient is off by at most `Σ|R_i| · 3uM / h` over
///   the outputs `i` the entry reaches;
/// * each loss is an f64 sum of `n` terms, off by at most
///   `n · 2^-53 · Σ|R| · M`, which the quotient divides by `2h`, twice;
/// * the backward sums `k` rounded products (`R_i · s`) in f32, which is off
///   by at most `(k + 1) · u · Σ|R_i · s|`.
///
/// The tolerance is twice the sum of the three bounds. An entry no id
/// reaches must get exactly 0 from both.
#[test]
fn backward_matches_central_differences() {
    let h = 1.0f32;
    let mut rng = Rng(2024);
    for round in 0..24 {
        let rows = 1 + (rng.next() % 12) as usize;
        let dim = 1 + (rng.next() % 40) as usize;
        let seq_len = 1 + (rng.next() % 9) as usize;
        let batch = 1 + (rng.next() % 6) as usize;
        let max_len = seq_len + (rng.next() % 3) as usize;
        let scale = if round % 2 == 0 {
            None
        } else {
            Some((dim as f32).sqrt())
        };
        let s = scale.unwrap_or(1.0) as f64;
        // Table and R in [-1, 1), positions in [-1, 1].
        let table = rng.units(rows * dim);
        let positions = sinusoidal_positions(max_len, dim).unwrap();
        let ids: Vec<u32> = (0..batch * seq_len)
            .map(|_| (rng.next() % rows as u64) as u32)
            .collect();
        let r = rng.units(ids.len() * dim);
        let n = r.len();
        let r_abs: f64 = r.iter().map(|&v| (v as f64).abs()).sum();
        // |x ± h| ≤ 1 + h, |(x ± h) · s| ≤ (1 + h) · s, |out| ≤ that + 1.
        let m = (1.0 + h as f64) * s.max(1.0) + 1.0;

        let mut grad_table = vec![0.0f32; rows * dim];
        let mut grad_positions = vec![0.0f32; max_len * dim];
        embed_positions_backward(
            &r,
            dim,
            &ids,
            seq_len,
            scale,
            &mut grad_table,
            &mut grad_positions,
        )
        .unwrap();
        // Both tables, so one harness perturbs either.
        let mut tables = (table, positions);
        let loss = |(table, positions): &mut (Vec<f32>, Vec<f32>)| {
            loss(table, positions, dim, &ids, seq_len, scale, &r)
        };

        // A table entry (possibly one that no id uses).
        let row = (rng.next() % rows as u64) as usize;
        let j = (rng.next() % dim as u64) as usize;
        let uses: Vec<f32> = (0..ids.len())
            .filter(|&i| ids[i] as usize == row)
            .map(|i| r[i * dim + j])
            .collect();
        let fd = central_differences(&mut tables, |t| &mut t.0[..], [row * dim + j], h, loss);
        let tol = tolerance(&uses, s, m, h as f64, n, r_abs);
        let what = format!("round {round}: table[{row}, {j}]");
        assert_gradient(&what, &grad_table, &fd, |_, _, _| tol);
        if uses.is_empty() {
            let got = grad_table[row * dim + j];
            assert_eq!(
                (fd[0].1, got),
                (0.0, 0.0),
                "round {round}: unused row {row}"
            );
        }

        // A position entry.
        let t = (rng.next() % seq_len as u64) as usize;
        let j = (rng.next() % dim as u64) as usize;
        let uses: Vec<f32> = (0..batch).map(|b| r[(b * seq_len + t) * dim + j]).collect();
        let fd = central_differences(&mut tables, |t| &mut t.1[..], [t * dim + j], h, loss);
        let tol = tolerance(&uses, 1.0, m, h as f64, n, r_abs);
        let what = format!("round {round}: positions[{t}, {j}]");
        assert_gradient(&what, &grad_positions, &fd, |_, _, _| tol);
        // Rows past seq_len get no gradient.
        assert!(grad_positions[seq_len * dim..].iter().all(|&g| g == 0.0));
    }
}

// ---------------------------------------------------------------------------
// The sinusoidal table
// ---------------------------------------------------------------------------

/// Values computed by hand, in 40-digit arithmetic, and written as the
/// nearest `f64`: `(pos, col, dim, PE[pos, col])`.
const HAND_COMPUTED: [(usize, usize, usize, f64); 12] = [
    // dim 4, pos 1: sin(1), cos(1), sin(1/100), cos(1/100).
    (1, 0, 4, 0.8414709848078965),
    (1, 1, 4, 0.5403023058681398),
    (1, 2, 4, 0.009999833334166664),
    (1, 3, 4, 0.9999500004166653),
    // dim 3 (odd): sin(5), cos(5), then a lone sine of 5 / 10000^(2/3).
    (5, 0, 3, -0.9589242746631385),
    (5, 1, 3, 0.28366218546322625),
    (5, 2, 3, 0.01077196511803483),
    // dim 512, pos 100, columns 256 and 257: 100 / 10000^(1/2) = 1.
    (100, 256, 512, 0.8414709848078965),
    (100, 257, 512, 0.5403023058681398),
    // dim 10, pos 7, column 5: cos(7 / 10000^(4/10)).
    (7, 5, 10, 0.9845813313431686),
    // dim 6, pos 1000: cos(1000), sin(1000 / 10000^(4/6)).
    (1000, 1, 6, 0.5623790762907029),
    (1000, 4, 6, 0.8344632077604135),
];

#[test]
fn sinusoidal_matches_hand_computed_values() {
    for (pos, col, dim, exact) in HAND_COMPUTED {
        let pe = sinusoidal_positions(pos + 1, dim).unwrap();
        // Rounded once from f64: the f32 nearest the exact value.
        assert_eq!(
            pe[pos * dim + col],
            exact as f32,
            "PE[{pos}, {col}] for dim {dim}"
        );
    }
}

#[test]
fn sinusoidal_row_zero_is_zero_one_and_shapes_hold() {
    for dim in 0..=70 {
        for max_len in [0, 1, 7] {
            let pe = sinusoidal_positions(max_len, dim).unwrap();
            assert_eq!(pe.len(), max_len * dim);
            if max_len > 0 {
                let want: Vec<f32> = (0..dim)
                    .map(|c: usize| if c.is_multiple_of(2) { 0.0 } else { 1.0 })
                    .collect();
                // Bits: +0.0, not -0.0.
                assert_eq!(bits(&pe[..dim]), bits(&want), "dim {dim}");
            }
        }
    }
}

#[test]
fn sinusoidal_values_lie_in_the_unit_interval() {
    for dim in [1, 2, 3, 7, 8, 9, 64, 65] {
        let pe = sinusoidal_positions(2048, dim).unwrap();
        assert!(pe.iter().all(|v| (-1.0..=1.0).contains(v)), "dim {dim}");
    }
}

/// The last column of an odd `dim` is a sine: it pairs with no cosine.
#[test]
fn sinusoidal_odd_dim_ends_in_a_sine() {
    let (max_len, dim) = (50, 5);
    let pe = sinusoidal_positions(max_len, dim).unwrap();
    for pos in 0..max_len {
        let angle = pos as f64 / 10000f64.powf(4.0 / 5.0);
        assert_eq!(pe[pos * dim + 4], angle.sin() as f32, "pos {pos}");
    }
}

#[test]
fn sinusoidal_size_overflow_is_an_error() {
    assert_eq!(
        sinusoidal_positions(usize::MAX, 2),
        Err(EmbeddingError::SizeOverflow {
            count: usize::MAX,
            dim: 2,
        })
    );
    assert_eq!(sinusoidal_positions(3, 2).unwrap().len(), 6);
}
