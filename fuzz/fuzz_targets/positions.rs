//! Hostile calls on the position embeddings: `positions::sinusoidal_positions`
//! with arbitrary `max_len` and `dim`, huge ones included, and an
//! [`InputEmbedding`] with sinusoidal, fixed or learned positions, then a
//! list of forward, backward and fused SGD calls with hostile `[batch,
//! seq_len]` shapes, ids of every id type and wrong buffer lengths.
//!
//! # What is checked
//!
//! * Nothing panics or aborts; a table that cannot be sized or allocated is
//!   an error.
//! * The sinusoidal table equals, bit for bit, the documented formula
//!   computed in `f64` and rounded once: `sin(pos / 10000^(2i / dim))` in
//!   column `2i`, the cosine in `2i + 1`.
//! * Every `InputEmbedding` call agrees with a scalar oracle of the module
//!   notes: `Ok` exactly for the calls it can serve, then
//!   `tokens[id] * scale + positions[t]` (both tables renormalised first
//!   when they have `max_norm`), the token gradient `Σ g * scale` per row
//!   (÷ count with `scale_grad_by_freq`, the padding row zero), the learned
//!   position gradient `Σ_b g[b, t]`, and the SGD steps on the rows touched;
//!   on an error both tables and every output buffer are unchanged.
//! * `Parallelism::Serial` on one thread, `Rayon` on two and `Rayon` or
//!   `Auto` on three give the same bits and errors.
#![no_main]

// The bag half of the oracle belongs to the `layers` target.
#[allow(dead_code)]
#[path = "layers/oracle.rs"]
mod oracle;

use embedding_kernels::positions::sinusoidal_positions;
use embedding_kernels::{
    Embedding, EmbeddingError, EmbeddingOptions, InputEmbedding, Mode, Parallelism, Positions, Sgd,
};
use embedding_kernels_fuzz::{Bytes, Id, SplitMix64, nan_blind, pool};
use libfuzzer_sys::fuzz_target;
use oracle::{Hyper, Model, Opt};

/// The most calls of one case.
const MAX_CALLS: usize = 6;

/// What output buffers hold before a call.
const CANARY: f32 = f32::from_bits(0x7fc0_0bad);

/// Table sizes (values) from which the fuzzer's memory would not hold the
/// table: beyond them an `Ok` is a finding, below them the values are
/// checked.
const HUGE: u128 = 1 << 40;

/// The longest gradient a case allocates (values).
const MAX_GRAD: usize = 1 << 24;

/// Sizes of a sinusoidal table, past every limit.
const HUGE_SIZES: [(usize, usize); 10] = [
    (usize::MAX, 2),
    (2, usize::MAX),
    (0, usize::MAX),
    (usize::MAX, 0),
    (1 << 40, 1 << 10),
    (1 << 31, 1 << 31),
    (0, 1 << 40),
    (1 << 20, 0),
    (1 << 62, 1),
    (1, 1 << 62),
];

/// Scales of the token embeddings; more come as raw bits.
const SCALES: [f32; 8] = [
    1.0,
    2.0,
    0.5,
    0.0,
    -1.0,
    f32::INFINITY,
    f32::NAN,
    22.627_417,
];

/// Non-NaN values at the edges of `f32`.
const SPECIALS: [f32; 8] = [
    0.0,
    -0.0,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::MAX,
    f32::from_bits(1),
    1e30,
    -1e-30,
];

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// The documented sinusoidal value at `pos`, `col` for width `dim`.
fn sinusoid(pos: usize, col: usize, dim: usize) -> f32 {
    let pair = (col - col % 2) as f64;
    let angle = pos as f64 / 10000f64.powf(pair / dim as f64);
    let value = if col.is_multiple_of(2) {
        angle.sin()
    } else {
        angle.cos()
    };
    value as f32
}

/// Checks one sinusoidal table size.
fn check_sinusoidal(max_len: usize, dim: usize) {
    let size = (max_len as u128) * (dim as u128);
    let got = sinusoidal_positions(max_len, dim);
    match &got {
        Err(e) => assert!(
            size >= HUGE,
            "an error for a {max_len} × {dim} table it can make: {e:?}"
        ),
        Ok(table) => {
            assert!(size < HUGE, "Ok for a {max_len} × {dim} table");
            assert_eq!(table.len() as u128, size, "a table of the wrong size");
            for (i, &x) in table.iter().enumerate() {
                let want = sinusoid(i / dim, i % dim, dim);
                assert_eq!(
                    x.to_bits(),
                    want.to_bits(),
                    "{max_len} × {dim}: value {i} is {x:?}, the formula gives {want:?}"
                );
            }
        }
    }
    if size > 0 && usize::try_from(size).is_err() {
        assert!(
            matches!(got, Err(EmbeddingError::SizeOverflow { .. })),
            "{max_len} × {dim} overflows: {got:?}"
        );
    }
}

/// The case's floats.
struct Floats(SplitMix64, bool);

impl Floats {
    fn many(&mut self, len: usize) -> Vec<f32> {
        (0..len)
            .map(|_| {
                let w = self.0.next_u64();
                if self.1 && (w >> 8).is_multiple_of(8) {
                    SPECIALS[((w >> 16) % SPECIALS.len() as u64) as usize]
                } else {
                    ((w & 127) as i32 - 64) as f32 / 8.0
                }
            })
            .collect()
    }
}

/// Table options from the bytes: padding, max_norm, norm_type,
/// scale_grad_by_freq, frozen.
fn options(b: &mut Bytes<'_>, rows: usize) -> (EmbeddingOptions, bool) {
    let padding_idx = match b.below(6) {
        0..=2 => None,
        3 => Some(-1),
        4 => Some(rows as i64),
        _ => Some(i64::from(b.byte()) % (rows as i64).max(1)),
    };
    let max_norm = match b.below(4) {
        0 | 1 => None,
        2 => Some(b.pick(&[1.0, 0.5, 0.0, -1.0, f32::NAN, f32::INFINITY])),
        _ => Some(f32::from_bits(b.u64() as u32)),
    };
    let options = EmbeddingOptions {
        padding_idx,
        max_norm,
        norm_type: b.pick(&[2.0, 1.0, 0.0, f32::INFINITY, 3.0, -1.0, f32::NAN]),
        scale_grad_by_freq: b.flag(),
        ..EmbeddingOptions::default()
    };
    (options, b.below(3) == 0)
}

/// A table's model, if the documented checks accept its options.
fn model(weight: &[f32], dim: usize, o: &EmbeddingOptions, frozen: bool) -> Option<Model> {
    let rows = weight.len().checked_div(dim).unwrap_or(0);
    let padding = oracle::padding_row(o.padding_idx, rows)?;
    if o.max_norm.is_some_and(|m| m.is_nan() || m <= 0.0) || o.norm_type.is_nan() {
        return None;
    }
    Some(Model {
        weight: weight.to_vec(),
        rows,
        dim,
        padding,
        max_norm: o.max_norm,
        norm_type: o.norm_type,
        scale_grad_by_freq: o.scale_grad_by_freq,
        frozen,
        mode: Mode::Sum,
        adagrad: Vec::new(),
        adagrad_steps: 0,
        rowwise: Vec::new(),
    })
}

/// The oracle of an `InputEmbedding`: its token table, its positions (a
/// model too, frozen when fixed) and its scale.
struct Oracle {
    tokens: Model,
    positions: Model,
    learned: bool,
    scale: Option<f32>,
}

/// What a call returned, as bits.
#[derive(Debug, PartialEq)]
struct Outcome {
    result: Result<(), EmbeddingError>,
    values: Vec<u32>,
    positions: Option<Vec<u32>>,
    shape: Vec<usize>,
}

impl Outcome {
    fn err(result: Result<(), EmbeddingError>) -> Outcome {
        Outcome {
            result,
            values: Vec::new(),
            positions: None,
            shape: Vec::new(),
        }
    }
}

fn run(data: &[u8]) {
    let mut b = Bytes::new(data);
    if b.below(4) == 0 {
        let (max_len, dim) = if b.flag() {
            b.pick(&HUGE_SIZES)
        } else {
            (b.below(41) as usize, b.below(18) as usize)
        };
        check_sinusoidal(max_len, dim);
        return;
    }
    match b.below(5) {
        0 => run_typed::<u32>(&mut b),
        1 => run_typed::<i32>(&mut b),
        2 => run_typed::<u64>(&mut b),
        3 => run_typed::<i64>(&mut b),
        _ => run_typed::<usize>(&mut b),
    }
}

fn run_typed<I: Id>(b: &mut Bytes<'_>) {
    let mut floats = Floats(SplitMix64(b.u64()), b.flag());
    let rows = b.below(9) as usize;
    let dim = match b.below(8) {
        0 => 0,
        1 => b.pick(&[usize::MAX, 1 << 40]),
        k => k as usize,
    };
    let small = dim <= 8;
    let weight = floats.many(if small { rows * dim } else { 0 });
    let (token_options, token_frozen) = options(b, rows);
    let Some(mut tokens_model) = model(&weight, dim, &token_options, token_frozen) else {
        return;
    };
    let Ok(mut tokens) =
        Embedding::from_pretrained_with_options(weight, dim, token_frozen, token_options)
    else {
        panic!("from_pretrained refused a table and options it can serve");
    };
    tokens.set_frozen(token_frozen);
    tokens_model.frozen = token_frozen;
    let max_len = match b.below(8) {
        0 => b.pick(&[usize::MAX, 1 << 40, usize::MAX / 4]),
        k => (k as usize - 1) * 2 + b.below(2) as usize,
    };
    let scale_by_sqrt = b.flag();
    let sqrt = scale_by_sqrt.then(|| (dim as f32).sqrt());
    let fits = (max_len as u128) * (dim as u128) < 1 << 20;
    let (built, positions, learned, valid) = match b.below(4) {
        0 => {
            let built = InputEmbedding::sinusoidal(tokens, max_len, scale_by_sqrt);
            let table: Vec<f32> = if fits && dim > 0 {
                (0..max_len * dim)
                    .map(|i| sinusoid(i / dim, i % dim, dim))
                    .collect()
            } else {
                Vec::new()
            };
            (built, table, false, dim > 0 && fits)
        }
        1 => {
            let built = InputEmbedding::learned(tokens, max_len, b.u64(), scale_by_sqrt);
            let table = match &built {
                Ok(input) => input.positions().weight().to_vec(),
                Err(_) => Vec::new(),
            };
            (built, table, true, dim > 0 && fits)
        }
        2 => {
            let len = if fits { max_len * dim } else { 0 };
            let len = if b.below(4) == 0 { len + 1 } else { len };
            let table = floats.many(len);
            let built = InputEmbedding::new(tokens, Positions::Fixed(table.clone()), sqrt);
            let whole = dim > 0 && table.len().is_multiple_of(dim);
            (built, table, false, whole)
        }
        _ => {
            let pos_dim = if b.below(6) == 0 {
                dim.wrapping_add(1)
            } else {
                dim
            };
            let max_len = max_len.min(12);
            let table = floats.many(if pos_dim <= 8 { max_len * pos_dim } else { 0 });
            let (o, frozen) = options(b, max_len);
            let Some(mut m) = model(&table, pos_dim, &o, frozen) else {
                return;
            };
            m.frozen = frozen;
            let pos = Embedding::from_pretrained_with_options(table.clone(), pos_dim, frozen, o)
                .expect("a table and options it can serve");
            let built = InputEmbedding::new(tokens, Positions::Learned(pos), sqrt);
            if let Ok(input) = &built {
                assert_eq!(input.max_len(), m.rows, "max_len is not the table's rows");
            }
            let o = Oracle {
                tokens: tokens_model.clone(),
                positions: m,
                learned: true,
                scale: sqrt,
            };
            let valid = dim > 0 && pos_dim == dim;
            return calls::<I>(b, &mut floats, built, valid, o);
        }
    };
    let usable = if valid { &positions[..] } else { &[] };
    let mut pos_model =
        model(usable, dim, &EmbeddingOptions::default(), !learned).expect("plain options");
    pos_model.frozen = !learned;
    let o = Oracle {
        tokens: tokens_model,
        positions: pos_model,
        learned,
        scale: sqrt,
    };
    calls::<I>(b, &mut floats, built, valid, o);
}

/// Checks the constructor's result, then runs the calls.
fn calls<I: Id>(
    b: &mut Bytes<'_>,
    floats: &mut Floats,
    built: Result<InputEmbedding, EmbeddingError>,
    valid: bool,
    mut o: Oracle,
) {
    let input = match built {
        Ok(input) => {
            assert!(valid, "Ok for tables it cannot serve");
            input
        }
        Err(e) => {
            assert!(!valid, "an error for tables it can serve: {e:?}");
            return;
        }
    };
    assert_eq!(
        bits(input.positions().weight()),
        bits(&o.positions.weight),
        "the position table is not the documented one"
    );
    let input = if b.below(4) == 0 {
        let scale = if b.flag() {
            Some(f32::from_bits(b.u64() as u32))
        } else {
            Some(b.pick(&SCALES))
        };
        o.scale = scale;
        input.with_scale(scale)
    } else {
        input
    };
    let third = b.pick(&[Parallelism::Rayon, Parallelism::Auto]);
    let mut copies = [
        (input.clone().with_parallelism(Parallelism::Serial), pool(1)),
        (input.clone().with_parallelism(Parallelism::Rayon), pool(2)),
        (input.with_parallelism(third), pool(3)),
    ];
    let dim = o.tokens.dim;
    let max_len = o.positions.rows;
    for _ in 0..MAX_CALLS {
        if b.is_empty() {
            break;
        }
        let seq_len = match b.below(8) {
            0 => b.pick(&[usize::MAX, max_len + 1, 1 << 32]),
            k => (k as usize - 1).min(max_len),
        };
        let batch = match b.below(8) {
            0 => b.pick(&[usize::MAX, 1 << 40, 0]),
            k => k as usize - 1,
        };
        let n = match batch.checked_mul(seq_len) {
            Some(n) if n <= 16 && b.below(6) != 0 => n,
            _ => b.below(17) as usize,
        };
        let ids: Vec<I> = (0..n)
            .map(|_| {
                let rows = o.tokens.rows as i128;
                I::wrap(match b.below(12) {
                    0 => rows,
                    1 => -1,
                    2 => I::MIN,
                    3 => i128::from(u64::MAX),
                    _ => i128::from(b.byte()) % rows.max(1),
                })
            })
            .collect();
        let keys: Vec<i128> = ids.iter().map(|i| i.to_i128()).collect();
        let rows = o.tokens.rows_of(&keys);
        let per_id = n.checked_mul(dim);
        let shape_ok = batch.checked_mul(seq_len) == Some(n) && seq_len <= max_len;
        let op = b.below(4);
        // A gradient the fuzzer's memory holds: a wrong length past that.
        let len = match (b.below(5), per_id.filter(|&len| len <= MAX_GRAD)) {
            (0, _) | (_, None) => b.below(9) as usize,
            (_, Some(len)) => len,
        };
        let sgd = Sgd::new(b.pick(&[0.5, 0.0, -1.0, f32::NAN, f32::INFINITY, 1e-30]))
            .with_weight_decay(b.pick(&[0.0, 0.0, 0.25, -0.5]));
        let grad = floats.many(if op >= 2 { len } else { 0 });
        let buffer_ok = if op == 0 {
            per_id.is_some()
        } else {
            per_id == Some(len)
        };
        let valid = shape_ok && buffer_ok && rows.is_some();
        let valid = valid && (op != 3 || sgd.validate().is_ok());
        let before = (
            bits(copies[0].0.tokens().weight()),
            bits(copies[0].0.positions().weight()),
        );
        let mut outcomes = Vec::new();
        for (input, pool) in copies.iter_mut() {
            let got = pool.install(|| match op {
                0 => match input.forward(&ids, batch, seq_len) {
                    Ok(e) => Outcome {
                        result: Ok(()),
                        values: bits(&e.values),
                        positions: None,
                        shape: e.shape,
                    },
                    Err(e) => Outcome::err(Err(e)),
                },
                1 => {
                    let mut out = vec![CANARY; len];
                    let result = input.forward_into(&ids, batch, seq_len, &mut out);
                    if result.is_err() {
                        assert!(
                            out.iter().all(|x| x.to_bits() == CANARY.to_bits()),
                            "forward_into: an error changed the output: {result:?}"
                        );
                    }
                    Outcome {
                        values: if result.is_ok() {
                            bits(&out)
                        } else {
                            Vec::new()
                        },
                        result,
                        positions: None,
                        shape: Vec::new(),
                    }
                }
                2 => match input.backward(&grad, &ids, batch, seq_len) {
                    Ok(g) => Outcome {
                        result: Ok(()),
                        values: bits(&g.tokens),
                        positions: g.positions.as_deref().map(bits),
                        shape: Vec::new(),
                    },
                    Err(e) => Outcome::err(Err(e)),
                },
                _ => Outcome::err(input.sparse_sgd_step(&grad, &ids, batch, seq_len, &sgd)),
            });
            outcomes.push(got);
        }
        for k in 1..copies.len() {
            assert_eq!(
                outcomes[k], outcomes[0],
                "copy {k} disagrees with the serial one"
            );
            let (input, serial) = (&copies[k].0, &copies[0].0);
            assert_eq!(
                (
                    bits(input.tokens().weight()),
                    bits(input.positions().weight())
                ),
                (
                    bits(serial.tokens().weight()),
                    bits(serial.positions().weight())
                ),
                "copy {k}'s tables disagree with the serial one's"
            );
        }
        let got = outcomes.swap_remove(0);
        let serial = &copies[0].0;
        if got.result.is_err() {
            assert!(!valid, "op {op}: an error for a valid call: {got:?}");
            assert_eq!(
                bits(serial.tokens().weight()),
                before.0,
                "an error changed the tokens"
            );
            assert_eq!(
                bits(serial.positions().weight()),
                before.1,
                "an error changed the positions"
            );
            continue;
        }
        assert!(valid, "op {op}: Ok for a call it cannot serve");
        let rows = rows.expect("valid ids");
        let want = expected(&mut o, op, &rows, &grad, seq_len, &sgd);
        if let Some(want) = want {
            assert_eq!(
                nan_blind(&got.values),
                nan_blind(&bits(&want.0)),
                "op {op}: the values disagree with the oracle"
            );
            assert_eq!(
                got.positions.as_deref().map(nan_blind),
                want.1.as_deref().map(|w| nan_blind(&bits(w))),
                "op {op}: the position gradient disagrees with the oracle"
            );
        }
        if op == 0 {
            assert_eq!(got.shape, [batch, seq_len, dim], "forward: the shape");
        }
        assert_eq!(
            nan_blind(&bits(serial.tokens().weight())),
            nan_blind(&bits(&o.tokens.weight)),
            "op {op}: the token table disagrees with the oracle's"
        );
        assert_eq!(
            nan_blind(&bits(serial.positions().weight())),
            nan_blind(&bits(&o.positions.weight)),
            "op {op}: the position table disagrees with the oracle's"
        );
    }
}

/// The oracle's values for a valid call (and its effect on the model).
fn expected(
    o: &mut Oracle,
    op: u64,
    rows: &[usize],
    grad: &[f32],
    seq_len: usize,
    sgd: &Sgd,
) -> Option<(Vec<f32>, Option<Vec<f32>>)> {
    let dim = o.tokens.dim;
    let scaled = |g: f32| o.scale.map_or(g, |s| g * s);
    match op {
        0 | 1 => {
            o.tokens.renorm(rows);
            if o.learned {
                o.positions.renorm(&(0..seq_len).collect::<Vec<_>>());
            }
            let mut out = Vec::with_capacity(rows.len() * dim);
            for (i, &r) in rows.iter().enumerate() {
                let t = i % seq_len.max(1);
                for j in 0..dim {
                    let x = o
                        .scale
                        .map_or(o.tokens.row(r)[j], |s| o.tokens.row(r)[j] * s);
                    out.push(x + o.positions.row(t)[j]);
                }
            }
            Some((out, None))
        }
        2 => {
            let c: Vec<(usize, Vec<f32>)> = rows
                .iter()
                .enumerate()
                .map(|(p, &r)| {
                    (
                        r,
                        grad[p * dim..(p + 1) * dim]
                            .iter()
                            .map(|&g| scaled(g))
                            .collect(),
                    )
                })
                .collect();
            let tokens = o.tokens.dense_grad(&c);
            let positions = o
                .learned
                .then(|| position_grad(&o.positions, grad, seq_len));
            Some((tokens, positions))
        }
        _ => {
            let h = Hyper {
                lr: sgd.lr,
                weight_decay: sgd.weight_decay,
                eps: 0.0,
                lr_decay: 0.0,
                initial: 0.0,
            };
            if o.learned {
                let g = position_grad(&o.positions, grad, seq_len);
                let touched: Vec<usize> = (0..seq_len)
                    .filter(|&t| Some(t) != o.positions.padding)
                    .collect();
                o.positions.step(Opt::Sgd, h, &touched, |t| {
                    g[t * dim..(t + 1) * dim].to_vec()
                });
            }
            let c: Vec<(usize, Vec<f32>)> = rows
                .iter()
                .enumerate()
                .map(|(p, &r)| {
                    (
                        r,
                        grad[p * dim..(p + 1) * dim]
                            .iter()
                            .map(|&g| scaled(g))
                            .collect(),
                    )
                })
                .collect();
            let dense = o.tokens.dense_grad(&c);
            let touched = o.tokens.touched(&c);
            o.tokens.step(Opt::Sgd, h, &touched, |r| {
                dense[r * dim..(r + 1) * dim].to_vec()
            });
            None
        }
    }
}

/// The learned position gradient: row `t` the sum over the batch of
/// `grad[b, t]` from `+0.0`, in order; the padding row and the rows from
/// `seq_len` on zero.
fn position_grad(positions: &Model, grad: &[f32], seq_len: usize) -> Vec<f32> {
    let dim = positions.dim;
    let mut g = vec![0.0f32; positions.rows * dim];
    if seq_len > 0 {
        for (i, row) in grad.chunks_exact(dim).enumerate() {
            let t = i % seq_len;
            for (s, &x) in g[t * dim..(t + 1) * dim].iter_mut().zip(row) {
                *s += x;
            }
        }
    }
    if let Some(p) = positions.padding {
        g[p * dim..(p + 1) * dim].fill(0.0);
    }
    g
}

fuzz_target!(|data: &[u8]| run(data));
