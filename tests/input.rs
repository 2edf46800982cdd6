//! The input layer (`InputEmbedding`): token embeddings times a scale plus
//! position embeddings, against the unfused composition, `Embedding`'s own
//! backward and finite differences.
//!
//! ```text
//! forward:  Embedding::forward (a clone, so max_norm renormalises it too),
//!           then out *= scale, then out[b, t, :] += positions[t, :]
//! backward: tokens:    Embedding::backward_dense(grad_output * scale), the
//!                      product rounded per value (and, without options, the
//!                      one-hot reference scatter_add of the same)
//!           positions: grad[t, :] = 0 + g[0, t, :] + g[1, t, :] + …, a plain loop
//! ```
//!
//! Every comparison is bitwise: the layer promises the bits of that
//! composition on every pool and `Parallelism`. Table and gradient values
//! span 24 binades, so a sum taken in another order shows in the bits.

use crate::common::{
    Pattern, Row, SplitMix, assert_close, assert_error, bad_id, bits, central_differences, convert,
    draw_ids, ids_as, invalid, mismatch, pools, row, run_table, values, weighted_sum,
};
use embedding_kernels::positions::sinusoidal_positions;
use embedding_kernels::{
    Embedding, EmbeddingError, EmbeddingOptions, Index, InputEmbedding, Operand, Parallelism,
    Positions, Sgd, reference,
};

const PARALLELISMS: [Parallelism; 3] = [Parallelism::Serial, Parallelism::Rayon, Parallelism::Auto];

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Which position table a case uses.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Fixed,
    Learned,
}

/// A value in `[-1, 1)`, for the finite-difference and training cases.
fn unit(rng: &mut SplitMix) -> f32 {
    (rng.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

fn units(rng: &mut SplitMix, n: usize) -> Vec<f32> {
    (0..n).map(|_| unit(rng)).collect()
}

/// A token table of `rows × dim` wild values with `options`.
fn token_table(rows: usize, dim: usize, options: EmbeddingOptions, seed: u64) -> Embedding {
    let weight = SplitMix(seed).values(rows * dim);
    Embedding::from_pretrained_with_options(weight, dim, false, options).unwrap()
}

/// A position table of `max_len × dim` wild values, fixed or learned (with
/// `options`).
fn position_table(
    kind: Kind,
    max_len: usize,
    dim: usize,
    options: EmbeddingOptions,
    seed: u64,
) -> Positions {
    let weight = SplitMix(seed ^ 0x5EED).values(max_len * dim);
    match kind {
        Kind::Fixed => Positions::Fixed(weight),
        Kind::Learned => Positions::Learned(
            Embedding::from_pretrained_with_options(weight, dim, false, options).unwrap(),
        ),
    }
}

/// The unfused forward: the token layer's own forward (on a clone, which
/// also renormalises), times `scale`, plus the position rows; a learned
/// table with `max_norm` is looked up at `arange(seq_len)` the same way.
/// Returns the output and both tables after the call.
fn unfused<I: Index>(
    layer: &InputEmbedding,
    ids: &[I],
    batch: usize,
    seq_len: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let dim = layer.embedding_dim();
    let mut tokens = layer.tokens().clone();
    let mut out = tokens.forward(ids, &[batch, seq_len]).unwrap().values;
    let (positions, table_after) = match layer.positions() {
        Positions::Fixed(table) => (table.clone(), table.clone()),
        Positions::Learned(table) => {
            let mut table = table.clone();
            let arange: Vec<usize> = (0..seq_len).collect();
            let rows = table.forward(&arange, &[seq_len]).unwrap().values;
            (rows, table.weight().to_vec())
        }
    };
    for (i, row) in out.chunks_exact_mut(dim).enumerate() {
        let t = i % seq_len;
        for (o, &p) in row.iter_mut().zip(&positions[t * dim..(t + 1) * dim]) {
            if let Some(s) = layer.scale() {
                *o *= s;
            }
            *o += p;
        }
    }
    (out, tokens.weight().to_vec(), table_after)
}

/// Every value times `scale`, each product rounded (nothing for `None`).
fn scaled(grad_output: &[f32], scale: Option<f32>) -> Vec<f32> {
    match scale {
        None => grad_output.to_vec(),
        Some(s) => grad_output.iter().map(|&g| g * s).collect(),
    }
}

/// `grad[t, :] = 0 + g[0, t, :] + g[1, t, :] + …` in a `max_len × dim`
/// table, the padding row (if any) zero: the position gradient by hand.
fn position_gradient(
    grad_output: &[f32],
    dim: usize,
    seq_len: usize,
    max_len: usize,
    padding: Option<usize>,
) -> Vec<f32> {
    let mut grad = vec![0.0f32; max_len * dim];
    let sequences = grad_output.len().checked_div(seq_len * dim).unwrap_or(0);
    for b in 0..sequences {
        for t in 0..seq_len {
            for c in 0..dim {
                grad[t * dim + c] += grad_output[(b * seq_len + t) * dim + c];
            }
        }
    }
    if let Some(p) = padding {
        grad[p * dim..(p + 1) * dim].fill(0.0);
    }
    grad
}

/// Runs `f` on every local pool with every `Parallelism`.
fn on_every_pool(layer: &InputEmbedding, mut f: impl FnMut(&str, InputEmbedding) + Send) {
    for pool in pools() {
        for par in PARALLELISMS {
            let what = format!("{} threads, {par:?}", pool.current_num_threads());
            let layer = layer.clone().with_parallelism(par);
            pool.install(|| f(&what, layer));
        }
    }
}

// ---------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------

fn check_forward<I: Index + TryFrom<u64>>(
    layer: &InputEmbedding,
    ids: &[u64],
    batch: usize,
    seq_len: usize,
) {
    let ids: Vec<I> = convert(ids);
    let (want, want_tokens, want_positions) = unfused(layer, &ids, batch, seq_len);
    on_every_pool(layer, |what, layer| {
        // Each call on a fresh copy: with max_norm, a second call may
        // renormalise the rows again by an ulp (as `Embedding::forward` does).
        let mut fresh = layer.clone();
        let got = fresh.forward(&ids, batch, seq_len).unwrap();
        assert_eq!(got.shape, [batch, seq_len, layer.embedding_dim()], "{what}");
        assert_eq!(bits(&got.values), bits(&want), "{what}");
        // Into a buffer of NaN canaries: every value is written.
        let mut into = layer.clone();
        let mut out = vec![f32::NAN; want.len()];
        into.forward_into(&ids, batch, seq_len, &mut out).unwrap();
        assert_eq!(bits(&out), bits(&want), "{what}");
        for after in [fresh, into] {
            assert_eq!(bits(after.tokens().weight()), bits(&want_tokens), "{what}");
            assert_eq!(
                bits(after.positions().weight()),
                bits(&want_positions),
                "{what}"
            );
        }
    });
}

#[test]
fn forward_equals_the_unfused_composition_on_every_pool() {
    let (rows, max_len) = (50, 16);
    let mut seed = 0;
    for dim in [1, 7, 8, 9, 16, 33, 70] {
        for (batch, seq_len) in [(1, 1), (3, 5), (4, 16), (2, 0), (0, 0), (0, 4)] {
            for kind in [Kind::Fixed, Kind::Learned] {
                for scale in [None, Some((dim as f32).sqrt()), Some(-0.75)] {
                    seed += 1;
                    let tokens = token_table(rows, dim, EmbeddingOptions::default(), seed);
                    let positions =
                        position_table(kind, max_len, dim, EmbeddingOptions::default(), seed);
                    let layer = InputEmbedding::new(tokens, positions, scale).unwrap();
                    let pattern = [Pattern::Uniform, Pattern::Hot][seed as usize % 2];
                    let ids = draw_ids(rows, batch * seq_len, pattern, seed);
                    check_forward::<u32>(&layer, &ids, batch, seq_len);
                    check_forward::<i64>(&layer, &ids, batch, seq_len);
                }
            }
        }
    }
}

#[test]
fn forward_past_the_parallel_threshold_keeps_the_bits() {
    // 8 × 256 × 256 floats: 2 MiB of output, where `Auto` starts to split.
    let (rows, dim, batch, seq_len) = (1000, 256, 8, 256);
    for kind in [Kind::Fixed, Kind::Learned] {
        let tokens = token_table(rows, dim, EmbeddingOptions::default(), 3);
        let positions = position_table(kind, seq_len, dim, EmbeddingOptions::default(), 3);
        let layer = InputEmbedding::new(tokens, positions, Some(16.0)).unwrap();
        let ids = draw_ids(rows, batch * seq_len, Pattern::Uniform, 4);
        check_forward::<u64>(&layer, &ids, batch, seq_len);
    }
}

#[test]
fn max_norm_renormalises_both_tables_as_their_own_forward_does() {
    let (rows, dim, max_len, batch, seq_len) = (30, 12, 10, 3, 6);
    let tokens = token_table(
        rows,
        dim,
        EmbeddingOptions {
            max_norm: Some(1.0),
            ..EmbeddingOptions::default()
        },
        11,
    );
    for norm_type in [2.0, 1.0, f32::INFINITY] {
        let options = EmbeddingOptions {
            max_norm: Some(0.5),
            norm_type,
            ..EmbeddingOptions::default()
        };
        let positions = position_table(Kind::Learned, max_len, dim, options, 12);
        let before = positions.weight().to_vec();
        let layer = InputEmbedding::new(tokens.clone(), positions, Some(2.0)).unwrap();
        let ids = draw_ids(rows, batch * seq_len, Pattern::FewDistinct, 13);
        check_forward::<usize>(&layer, &ids, batch, seq_len);
        // The oracle did change the tables: rows 0..seq_len of the
        // positions, and never the rows past them.
        let (_, after_tokens, after) = unfused(&layer, &ids, batch, seq_len);
        assert_ne!(
            bits(&after[..seq_len * dim]),
            bits(&before[..seq_len * dim])
        );
        assert_eq!(
            bits(&after[seq_len * dim..]),
            bits(&before[seq_len * dim..])
        );
        assert_ne!(bits(&after_tokens), bits(tokens.weight()));
    }
}

// ---------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------

/// A backward case: a layer with the given token options, a batch and its
/// gradient.
struct Backward {
    layer: InputEmbedding,
    ids: Vec<u64>,
    batch: usize,
    seq_len: usize,
    grad_output: Vec<f32>,
}

fn check_backward<I: Index + TryFrom<u64>>(c: &Backward) {
    let ids: Vec<I> = convert(&c.ids);
    let dim = c.layer.embedding_dim();
    let scaled = scaled(&c.grad_output, c.layer.scale());
    let want_tokens = c.layer.tokens().backward_dense(&scaled, &ids).unwrap();
    let tokens = c.layer.tokens();
    if tokens.padding_idx().is_none() && !tokens.scale_grad_by_freq() {
        // No options: also the one-hot reference, from zeros.
        let mut reference = vec![0.0; tokens.weight().len()];
        reference::scatter_add(&scaled, dim, &ids, &mut reference).unwrap();
        assert_eq!(bits(&want_tokens), bits(&reference));
    }
    let want_positions = match c.layer.positions() {
        Positions::Fixed(_) => None,
        Positions::Learned(table) => Some(position_gradient(
            &c.grad_output,
            dim,
            c.seq_len,
            c.layer.max_len(),
            table.padding_idx(),
        )),
    };
    on_every_pool(&c.layer, |what, layer| {
        let got = layer
            .backward(&c.grad_output, &ids, c.batch, c.seq_len)
            .unwrap();
        assert_eq!(bits(&got.tokens), bits(&want_tokens), "{what}");
        assert_eq!(
            got.positions.as_deref().map(bits),
            want_positions.as_deref().map(bits),
            "{what}"
        );
    });
}

#[test]
fn token_gradient_is_backward_dense_of_the_scaled_gradient_on_every_pool() {
    let (rows, max_len) = (40, 12);
    let mut seed = 100;
    for dim in [1, 8, 9, 33] {
        for (batch, seq_len) in [(1, 1), (4, 7), (3, 12)] {
            for kind in [Kind::Fixed, Kind::Learned] {
                for scale in [None, Some((dim as f32).sqrt())] {
                    for (padding, by_freq) in [(false, false), (true, false), (true, true)] {
                        seed += 1;
                        let pattern =
                            [Pattern::Uniform, Pattern::FewDistinct, Pattern::Hot][seed % 3];
                        let ids = draw_ids(rows, batch * seq_len, pattern, seed as u64);
                        let options = EmbeddingOptions {
                            // An id the batch uses, so its gradient is dropped.
                            padding_idx: padding.then_some(ids[0] as i64),
                            scale_grad_by_freq: by_freq,
                            ..EmbeddingOptions::default()
                        };
                        let tokens = token_table(rows, dim, options, seed as u64);
                        let positions = position_table(
                            kind,
                            max_len,
                            dim,
                            EmbeddingOptions::default(),
                            seed as u64,
                        );
                        let c = Backward {
                            layer: InputEmbedding::new(tokens, positions, scale).unwrap(),
                            grad_output: SplitMix(seed as u64).values(ids.len() * dim),
                            ids,
                            batch,
                            seq_len,
                        };
                        check_backward::<u32>(&c);
                        check_backward::<i64>(&c);
                    }
                }
            }
        }
    }
}

#[test]
fn backward_past_the_parallel_threshold_keeps_the_bits() {
    // 16 × 512 × 256 floats: 8 MiB of gradient, where `Auto` starts to split;
    // a 90 %-hot batch with scale_grad_by_freq.
    let (rows, dim, batch, seq_len) = (500, 256, 16, 512);
    let ids = draw_ids(rows, batch * seq_len, Pattern::Hot, 21);
    let options = EmbeddingOptions {
        scale_grad_by_freq: true,
        ..EmbeddingOptions::default()
    };
    let tokens = token_table(rows, dim, options, 21);
    let positions = position_table(Kind::Learned, seq_len, dim, EmbeddingOptions::default(), 21);
    let c = Backward {
        layer: InputEmbedding::new(tokens, positions, Some(16.0)).unwrap(),
        grad_output: SplitMix(22).values(ids.len() * dim),
        ids,
        batch,
        seq_len,
    };
    check_backward::<u64>(&c);
}

#[test]
fn padded_positions_give_the_padding_row_nothing_even_when_not_finite() {
    let (rows, dim, max_len, batch, seq_len) = (10, 9, 6, 3, 4);
    let ids: Vec<u32> = vec![4, 0, 0, 7, 1, 4, 0, 0, 0, 0, 0, 0];
    let options = EmbeddingOptions {
        padding_idx: Some(0),
        scale_grad_by_freq: true,
        ..EmbeddingOptions::default()
    };
    let tokens = token_table(rows, dim, options, 5);
    let positions = position_table(Kind::Learned, max_len, dim, EmbeddingOptions::default(), 5);
    let layer = InputEmbedding::new(tokens, positions, Some(3.0)).unwrap();
    let mut grad_output = SplitMix(6).values(ids.len() * dim);
    grad_output[dim] = f32::NAN; // (0, 1): a padded position
    grad_output[2 * dim + 3] = f32::INFINITY; // (0, 2): padded
    let grads = layer.backward(&grad_output, &ids, batch, seq_len).unwrap();
    assert!(grads.tokens[..dim].iter().all(|x| x.to_bits() == 0));
    let want = layer
        .tokens()
        .backward_dense(&scaled(&grad_output, Some(3.0)), &ids)
        .unwrap();
    assert_eq!(bits(&grads.tokens), bits(&want));
    assert!(grads.tokens.iter().all(|x| x.is_finite()));
    // Padding concerns the token table only: the positions see everything.
    let positions = grads.positions.unwrap();
    assert!(positions[dim].is_nan());
    assert_eq!(positions[2 * dim + 3], f32::INFINITY);
}

#[test]
fn learned_position_options_act_as_a_lookup_of_arange() {
    let (rows, dim, max_len, batch, seq_len) = (10, 5, 8, 4, 6);
    let options = EmbeddingOptions {
        padding_idx: Some(2),
        scale_grad_by_freq: true, // every position occurs once: no effect
        ..EmbeddingOptions::default()
    };
    let positions = position_table(Kind::Learned, max_len, dim, options, 8);
    let tokens = token_table(rows, dim, EmbeddingOptions::default(), 8);
    let layer = InputEmbedding::new(tokens, positions, None).unwrap();
    let ids = draw_ids(rows, batch * seq_len, Pattern::Uniform, 9);
    let grad_output = SplitMix(10).values(ids.len() * dim);
    let grads = layer.backward(&grad_output, &ids, batch, seq_len).unwrap();
    let want = position_gradient(&grad_output, dim, seq_len, max_len, Some(2));
    let got = grads.positions.unwrap();
    assert_eq!(bits(&got), bits(&want));
    assert!(got[2 * dim..3 * dim].iter().all(|x| x.to_bits() == 0));
    assert!(got[seq_len * dim..].iter().all(|x| x.to_bits() == 0));
    // The same gradient as the position layer's own backward at arange(T),
    // fed the batch's sum.
    let Positions::Learned(table) = layer.positions() else {
        unreachable!()
    };
    let summed = position_gradient(&grad_output, dim, seq_len, seq_len, None);
    let arange: Vec<usize> = (0..seq_len).collect();
    assert_eq!(
        bits(&table.backward_dense(&summed, &arange).unwrap()),
        bits(&want)
    );
}

// ---------------------------------------------------------------------------
// Finite differences
// ---------------------------------------------------------------------------

/// `L = Σ R ⊙ forward(ids)`, in f64.
fn loss(layer: &mut InputEmbedding, ids: &[u32], batch: usize, seq_len: usize, r: &[f32]) -> f64 {
    weighted_sum(&layer.forward(ids, batch, seq_len).unwrap().values, r)
}

#[test]
fn both_gradients_match_finite_differences() {
    // The loss is linear in both tables, so a central difference with a
    // large step is exact up to the rounding of the forward's values
    // (all of size about 1 here), which the tolerance covers.
    let h = 1.0f32;
    let (rows, dim, max_len, batch, seq_len) = (7, 5, 6, 3, 4);
    let ids: Vec<u32> = vec![3, 1, 3, 6, 3, 0, 1, 1, 6, 6, 2, 3];
    for scale in [None, Some((dim as f32).sqrt()), Some(-0.5)] {
        let mut rng = SplitMix(31);
        let tokens = Embedding::from_pretrained(units(&mut rng, rows * dim), dim, false).unwrap();
        let positions =
            Embedding::from_pretrained(units(&mut rng, max_len * dim), dim, false).unwrap();
        let mut layer = InputEmbedding::new(tokens, Positions::Learned(positions), scale).unwrap();
        let r = units(&mut rng, ids.len() * dim);
        let grads = layer.backward(&r, &ids, batch, seq_len).unwrap();

        let loss = |layer: &mut InputEmbedding| loss(layer, &ids, batch, seq_len, &r);
        let numeric_tokens = values(&central_differences(
            &mut layer,
            |l| l.token_weight_mut(),
            0..rows * dim,
            h,
            loss,
        ));
        let numeric_positions = values(&central_differences(
            &mut layer,
            |l| l.position_weight_mut(),
            0..max_len * dim,
            h,
            loss,
        ));
        // Rows 4 and 5 are past the sequence (zero), row 5 of the tokens is
        // never looked up (zero): the check sees both kinds of zero rows.
        assert!(numeric_positions[seq_len * dim..].iter().all(|&x| x == 0.0));
        assert!(numeric_tokens[5 * dim..6 * dim].iter().all(|&x| x == 0.0));
        let what = format!("scale {scale:?}");
        assert_close(
            &format!("tokens, {what}"),
            &grads.tokens,
            &numeric_tokens,
            1e-4,
        );
        assert_close(
            &format!("positions, {what}"),
            grads.positions.as_deref().unwrap(),
            &numeric_positions,
            1e-4,
        );
    }
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// A layer whose tables would both change on any forward (both have
/// `max_norm` below every row's norm), so "untouched" means something.
fn touchy_layer() -> InputEmbedding {
    let dim = 6;
    let options = EmbeddingOptions {
        max_norm: Some(1e-3),
        ..EmbeddingOptions::default()
    };
    let tokens = token_table(9, dim, options.clone(), 41);
    let positions = position_table(Kind::Learned, 5, dim, options, 41);
    InputEmbedding::new(tokens, positions, Some(2.0)).unwrap()
}

/// Both tables' bits.
fn tables(layer: &InputEmbedding) -> (Vec<u32>, Vec<u32>) {
    (
        bits(layer.tokens().weight()),
        bits(layer.positions().weight()),
    )
}

/// Every entry point fails with `want` and changes nothing.
fn assert_fails<I: Index>(
    layer: &InputEmbedding,
    ids: &[I],
    batch: usize,
    seq_len: usize,
    want: &EmbeddingError,
) {
    let dim = layer.embedding_dim();
    let before = tables(layer);
    let mut l = layer.clone();
    assert_eq!(l.forward(ids, batch, seq_len).unwrap_err(), *want);
    let mut out = vec![f32::NAN; ids.len() * dim];
    assert_eq!(
        l.forward_into(ids, batch, seq_len, &mut out).unwrap_err(),
        *want
    );
    assert!(out.iter().all(|x| x.is_nan()));
    let grad_output = vec![1.0; ids.len() * dim];
    assert_eq!(
        l.backward(&grad_output, ids, batch, seq_len).unwrap_err(),
        *want
    );
    assert_eq!(
        l.sparse_sgd_step(&grad_output, ids, batch, seq_len, &Sgd::new(0.1))
            .unwrap_err(),
        *want
    );
    assert_eq!(tables(&l), before);
}

/// A layer call: the ids, `batch` and `seq_len`.
type InputCall = (Vec<i128>, usize, usize);

/// [`assert_fails`] on every id type that holds the row's ids.
fn input_call_fails((ids, batch, seq_len): &InputCall, want: &EmbeddingError) {
    let layer = touchy_layer();
    let (batch, seq_len) = (*batch, *seq_len);
    let mut ran = 0;
    if let Some(ids) = ids_as::<u32>(ids) {
        assert_fails(&layer, &ids, batch, seq_len, want);
        ran += 1;
    }
    if let Some(ids) = ids_as::<i64>(ids) {
        assert_fails(&layer, &ids, batch, seq_len, want);
        ran += 1;
    }
    if let Some(ids) = ids_as::<u64>(ids) {
        assert_fails(&layer, &ids, batch, seq_len, want);
        ran += 1;
    }
    assert!(ran > 0, "no id type holds {ids:?}");
}

/// The layer's errors in order: the shape the caller gave, then the
/// sequence length against the position table (9 tokens × 5 positions),
/// then the ids.
fn input_errors() -> Vec<Row<InputCall>> {
    let shape = |batch, seq_len, len| EmbeddingError::IdsShape {
        shape: vec![batch, seq_len],
        len,
    };
    let too_long = EmbeddingError::SequenceTooLong {
        seq_len: 6,
        max_len: 5,
    };
    let six: Vec<i128> = (1..=6).collect();
    let mut rows = Vec::new();
    for (batch, seq_len) in [(2, 4), (4, 2), (1, 0), (0, 3), (usize::MAX, 2)] {
        let name = format!("6 ids as {batch} × {seq_len}");
        rows.push(row(
            name,
            (six.clone(), batch, seq_len),
            shape(batch, seq_len, 6),
        ));
    }
    // The shape is checked before the ids.
    rows.push(row(
        "shape before ids",
        (vec![1, -1, 2], 2, 2),
        shape(2, 2, 3),
    ));
    // Too long, even with no sequences, and before any id is looked at.
    rows.push(row("seq_len 6", (vec![0; 12], 2, 6), too_long.clone()));
    rows.push(row("seq_len 6, no ids", (vec![], 0, 6), too_long.clone()));
    rows.push(row("seq_len 6 before ids", (vec![99; 6], 1, 6), too_long));
    for position in [0, 4, 7] {
        let mut ids = vec![3; 8];
        ids[position] = -1;
        rows.push(row(
            format!("-1 at {position}"),
            (ids, 2, 4),
            bad_id(position, -1, 9),
        ));
        let max = i128::from(u64::MAX);
        let mut ids = vec![8; 8];
        ids[position] = max;
        let name = format!("u64::MAX at {position}");
        rows.push(row(name, (ids, 4, 2), bad_id(position, max, 9)));
        let mut ids = vec![0; 8];
        ids[position] = 9; // the first invalid id
        ids[7 - position] = 10; // a later bad id is not the one reported
        let first = position.min(7 - position);
        let want = bad_id(first, ids[first], 9);
        rows.push(row(
            format!("9 at {position}, 10 at {}", 7 - position),
            (ids, 2, 4),
            want,
        ));
    }
    rows
}

#[test]
fn shape_sequence_and_id_errors_change_nothing() {
    run_table(&input_errors(), input_call_fails);
    // A sequence of exactly max_len fits.
    let mut l = touchy_layer();
    assert!(l.forward(&[0u32; 10], 2, 5).is_ok());
}

/// A call with a buffer of the wrong length or a bad learning rate, on
/// [`touchy_layer`], with the ids, `batch` and `seq_len` of an
/// [`InputCall`].
enum BufferCall {
    /// `forward_into`, with an output of this length (a NaN canary).
    ForwardInto(InputCall, usize),
    /// `backward`, with a gradient of this length.
    Backward(InputCall, usize),
    /// `sparse_sgd_step`, with a gradient of this length and this rate.
    SparseSgdStep(InputCall, usize, f32),
}

impl BufferCall {
    /// Fails with `want` on every id type that holds the ids, and changes
    /// neither table nor the output.
    fn run(&self, want: &EmbeddingError) {
        let mut ran = 0;
        if let Some(ids) = self.ids_as::<u32>() {
            self.run_as(&ids, want);
            ran += 1;
        }
        if let Some(ids) = self.ids_as::<i64>() {
            self.run_as(&ids, want);
            ran += 1;
        }
        if let Some(ids) = self.ids_as::<u64>() {
            self.run_as(&ids, want);
            ran += 1;
        }
        assert!(ran > 0, "no id type holds the ids");
    }

    fn ids_as<I: TryFrom<i128>>(&self) -> Option<Vec<I>> {
        let (BufferCall::ForwardInto((ids, ..), _)
        | BufferCall::Backward((ids, ..), _)
        | BufferCall::SparseSgdStep((ids, ..), ..)) = self;
        ids_as(ids)
    }

    fn run_as<I: Index>(&self, ids: &[I], want: &EmbeddingError) {
        let mut layer = touchy_layer();
        let before = tables(&layer);
        match self {
            BufferCall::ForwardInto((_, batch, seq_len), out_len) => {
                let mut out = vec![f32::NAN; *out_len];
                let got = layer.forward_into(ids, *batch, *seq_len, &mut out);
                assert_error("forward_into", got, want);
                assert!(out.iter().all(|x| x.is_nan()), "output written");
            }
            BufferCall::Backward((_, batch, seq_len), grad_len) => {
                let grad_output = vec![1.0; *grad_len];
                let got = layer.backward(&grad_output, ids, *batch, *seq_len);
                assert_error("backward", got.map(drop), want);
            }
            BufferCall::SparseSgdStep((_, batch, seq_len), grad_len, lr) => {
                let grad_output = vec![1.0; *grad_len];
                let sgd = Sgd::new(*lr);
                let got = layer.sparse_sgd_step(&grad_output, ids, *batch, *seq_len, &sgd);
                assert_error("sparse_sgd_step", got, want);
            }
        }
        assert_eq!(tables(&layer), before, "a table changed");
    }
}

/// Buffer lengths are checked before the ids (id 99 of 9 is in every
/// batch with a bad buffer), and the learning rate with everything else
/// right.
fn buffer_errors() -> Vec<Row<BufferCall>> {
    use BufferCall::{Backward, ForwardInto, SparseSgdStep};
    let n = 4 * touchy_layer().embedding_dim();
    let with_99 = || (vec![0, 1, 99, 2], 2, 2);
    let grad_short = mismatch(Operand::GradOutput, n, n - 1);
    let mut rows = vec![
        row(
            "output one too long, id 99",
            ForwardInto(with_99(), n + 1),
            mismatch(Operand::Output, n, n + 1),
        ),
        row(
            "backward, gradient one short, id 99",
            Backward(with_99(), n - 1),
            grad_short.clone(),
        ),
        row(
            "step, gradient one short, id 99",
            SparseSgdStep(with_99(), n - 1, 0.1),
            grad_short,
        ),
    ];
    for lr in [-1.0, f32::NAN] {
        let call = SparseSgdStep((vec![0, 1, 2, 3], 2, 2), n, lr);
        rows.push(row(format!("lr {lr}"), call, invalid("lr", lr)));
    }
    rows
}

#[test]
fn buffer_lengths_are_checked_before_the_ids() {
    run_table(&buffer_errors(), BufferCall::run);
}

#[test]
fn constructors_check_the_tables() {
    let tokens = token_table(9, 4, EmbeddingOptions::default(), 1);
    let err =
        InputEmbedding::new(tokens.clone(), Positions::Fixed(vec![0.0; 10]), None).unwrap_err();
    assert_eq!(
        err,
        EmbeddingError::NotMultipleOfDim {
            operand: Operand::Positions,
            len: 10,
            dim: 4
        }
    );
    let wide = Embedding::from_pretrained(vec![0.0; 12], 6, false).unwrap();
    let err = InputEmbedding::new(tokens.clone(), Positions::Learned(wide), None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "embedding_dim = 6 for the positions and 4 for the tokens is invalid: \
         it must be the same for both tables"
    );
    let empty = Embedding::from_pretrained(Vec::new(), 0, false).unwrap();
    for positions in [
        Positions::Fixed(Vec::new()),
        Positions::Learned(empty.clone()),
    ] {
        let err = InputEmbedding::new(empty.clone(), positions, None).unwrap_err();
        assert!(
            matches!(
                err,
                EmbeddingError::InvalidArgument {
                    name: "embedding_dim",
                    ..
                }
            ),
            "{err}"
        );
    }
    assert_eq!(
        InputEmbedding::sinusoidal(tokens.clone(), usize::MAX, true).unwrap_err(),
        EmbeddingError::SizeOverflow {
            count: usize::MAX,
            dim: 4
        }
    );
    assert!(matches!(
        InputEmbedding::learned(tokens, usize::MAX, 0, true).unwrap_err(),
        EmbeddingError::SizeOverflow { .. }
    ));
}

// ---------------------------------------------------------------------------
// Constructors and training
// ---------------------------------------------------------------------------

#[test]
fn constructors_build_the_tables_they_promise() {
    let (dim, max_len) = (10, 32);
    let tokens = token_table(20, dim, EmbeddingOptions::default(), 2);

    let layer = InputEmbedding::sinusoidal(tokens.clone(), max_len, true).unwrap();
    assert!(!layer.positions().is_learned());
    assert_eq!(
        bits(layer.positions().weight()),
        bits(&sinusoidal_positions(max_len, dim).unwrap())
    );
    assert_eq!(layer.scale(), Some(10f32.sqrt()));
    assert_eq!(layer.scale(), Some(10f64.sqrt() as f32)); // math.sqrt(d), as f32
    assert_eq!((layer.max_len(), layer.embedding_dim()), (max_len, dim));
    assert_eq!(layer.parallelism(), Parallelism::Auto);
    let layer = layer.with_scale(None).with_parallelism(Parallelism::Serial);
    assert_eq!(layer.scale(), None);
    assert_eq!(layer.parallelism(), Parallelism::Serial);

    let layer = InputEmbedding::learned(tokens.clone(), max_len, 77, false).unwrap();
    assert!(layer.positions().is_learned());
    assert_eq!(layer.scale(), None);
    let options = EmbeddingOptions {
        seed: Some(77),
        ..EmbeddingOptions::default()
    };
    let want = Embedding::with_options(max_len, dim, options).unwrap();
    assert_eq!(bits(layer.positions().weight()), bits(want.weight()));
    let (got_tokens, positions) = layer.into_parts();
    assert_eq!(bits(got_tokens.weight()), bits(tokens.weight()));
    assert!(matches!(positions, Positions::Learned(p) if p.num_embeddings() == max_len));
}

#[test]
fn sparse_sgd_step_is_a_dense_step_with_the_backward_gradients() {
    let (rows, dim, max_len, batch, seq_len) = (25, 9, 8, 3, 7);
    let ids = draw_ids(rows, batch * seq_len, Pattern::FewDistinct, 51);
    let sgd = Sgd::new(0.125);
    for kind in [Kind::Fixed, Kind::Learned] {
        for (padding, by_freq) in [(None, false), (Some(ids[1] as i64), true)] {
            let options = EmbeddingOptions {
                padding_idx: padding,
                scale_grad_by_freq: by_freq,
                ..EmbeddingOptions::default()
            };
            let position_options = EmbeddingOptions {
                padding_idx: padding.map(|_| 3),
                ..EmbeddingOptions::default()
            };
            let tokens = token_table(rows, dim, options, 52);
            let positions = position_table(kind, max_len, dim, position_options, 52);
            let layer = InputEmbedding::new(tokens, positions, Some(3.0)).unwrap();
            let grad_output = SplitMix(53).values(ids.len() * dim);

            let grads = layer.backward(&grad_output, &ids, batch, seq_len).unwrap();
            let mut want_tokens = layer.tokens().weight().to_vec();
            sgd.step_dense(&mut want_tokens, &grads.tokens).unwrap();
            let mut want_positions = layer.positions().weight().to_vec();
            if let Some(g) = &grads.positions {
                sgd.step_dense(&mut want_positions, g).unwrap();
            }
            on_every_pool(&layer, |what, mut layer| {
                layer
                    .sparse_sgd_step(&grad_output, &ids, batch, seq_len, &sgd)
                    .unwrap();
                assert_eq!(bits(layer.tokens().weight()), bits(&want_tokens), "{what}");
                assert_eq!(
                    bits(layer.positions().weight()),
                    bits(&want_positions),
                    "{what}"
                );
            });
        }
    }
}

#[test]
fn frozen_tables_do_not_move() {
    let (rows, dim, max_len) = (6, 4, 4);
    let ids = [1u32, 2, 3, 1];
    let grad_output = vec![1.0; ids.len() * dim];
    let tokens = Embedding::from_pretrained(vec![0.5; rows * dim], dim, true).unwrap();
    let positions = Embedding::from_pretrained(vec![0.25; max_len * dim], dim, true).unwrap();
    let mut layer = InputEmbedding::new(tokens, Positions::Learned(positions), None).unwrap();
    let before = tables(&layer);
    layer
        .sparse_sgd_step(&grad_output, &ids, 2, 2, &Sgd::new(1.0))
        .unwrap();
    assert_eq!(tables(&layer), before);
    // Gradients are still computed for frozen tables, as in PyTorch.
    let grads = layer.backward(&grad_output, &ids, 2, 2).unwrap();
    assert_eq!(grads.tokens[dim], 2.0);
}

#[test]
fn sgd_steps_train_both_tables() {
    // loss = ½ ‖forward(ids) − target‖², grad_output = forward − target.
    let (rows, dim, max_len, batch, seq_len) = (12, 8, 6, 4, 6);
    let mut rng = SplitMix(61);
    let tokens = Embedding::from_pretrained(units(&mut rng, rows * dim), dim, false).unwrap();
    let mut layer = InputEmbedding::learned(tokens, max_len, 62, true).unwrap();
    let ids = draw_ids(rows, batch * seq_len, Pattern::Uniform, 63);
    let target = units(&mut rng, ids.len() * dim);
    let first_positions = layer.positions().weight().to_vec();
    let sgd = Sgd::new(0.01);
    let mut losses = Vec::new();
    for _ in 0..40 {
        let out = layer.forward(&ids, batch, seq_len).unwrap().values;
        let grad: Vec<f32> = out.iter().zip(&target).map(|(&o, &t)| o - t).collect();
        losses.push(
            grad.iter()
                .map(|&g| 0.5 * f64::from(g).powi(2))
                .sum::<f64>(),
        );
        layer
            .sparse_sgd_step(&grad, &ids, batch, seq_len, &sgd)
            .unwrap();
    }
    assert!(
        losses.windows(2).all(|w| w[1] < w[0]),
        "the loss must fall at every step: {losses:?}"
    );
    assert!(losses[39] < 0.5 * losses[0], "{losses:?}");
    assert_ne!(bits(layer.positions().weight()), bits(&first_positions));
}
