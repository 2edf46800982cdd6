//! Hostile calls on the layers: an [`Embedding`] or an [`EmbeddingBag`]
//! built from arbitrary options, then a list of calls (forward, the
//! backwards, the fused optimiser steps, `apply_sparse`, the dense SGD step)
//! with hostile ids of every id type, wrong buffer lengths, bad offsets and
//! bad hyper-parameters.
//!
//! # What is checked
//!
//! * Nothing panics or aborts.
//! * Every call agrees with the scalar oracle of `layers/oracle.rs` (the
//!   README's and the module docs' semantics, written out plainly): `Ok`
//!   exactly for the calls the layer can serve, and then the same bits in
//!   every output and in the table afterwards (`max_norm` renormalises the
//!   looked-up rows first); `Err` leaves the table, the optimiser state and
//!   every output buffer bitwise as they were.
//! * Three copies of the layer, `Parallelism::Serial` on one thread,
//!   `Rayon` on a pool of 2 and `Rayon` or `Auto` on a pool of 3, give the
//!   same results, errors, tables and optimiser states after every call.
//! * A frozen layer returns for every call what an unfrozen twin returns
//!   for the same arguments (the rule: check first, then skip the
//!   update), and its table and optimiser state never change.
//!
//! # From bytes to a case
//!
//! A header picks the layer, the id type, the table (from `from_pretrained`
//! with a right or wrong length, from a seed, or with sizes that cannot be
//! allocated), the options (`padding_idx` in and out of range and negative,
//! `max_norm` including 0, negative, NaN and inf, `norm_type` including 0,
//! ±inf, NaN and odd values, `scale_grad_by_freq`, `sparse`, `mode`,
//! `include_last_offset`, frozen), whether the optimisers start with a state
//! made for another table, the kind of float values and a seed. Then up to
//! [`MAX_CALLS`] calls follow, each an opcode and its arguments; the floats
//! of a call come from a SplitMix64 stream seeded by the header. Past the
//! end of the input every read is 0.
//!
//! Float values are never NaN on the way in (infinities are, and the NaNs
//! that arithmetic makes of them are the machine's default NaN on both
//! sides), so sums compare bit for bit.
#![no_main]

#[path = "layers/oracle.rs"]
mod oracle;

use embedding_kernels::{
    Adagrad, BagOutput, Bags, Embedding, EmbeddingBag, EmbeddingBagOptions, EmbeddingError,
    EmbeddingOptions, Gradient, Mode, Parallelism, RowWiseAdagrad, Sgd, SparseGrad,
};
use embedding_kernels_fuzz::{Bytes, Id, SplitMix64, nan_blind, pool};
use libfuzzer_sys::fuzz_target;
use oracle::{Hyper, Model, Opt, bag_contributions};
use rayon::ThreadPool;

/// The most calls of one case.
const MAX_CALLS: usize = 8;

/// The widest row of a table with values (wider ones are the huge widths of
/// empty tables).
const MAX_DIM: usize = 6;

/// The most ids of one call.
const MAX_IDS: u64 = 16;

/// What output buffers hold before a call: a NaN no call computes.
const CANARY: f32 = f32::from_bits(0x7fc0_0bad);

/// What `max_indices` holds before a call.
const INDEX_CANARY: i64 = i64::MIN + 7;

/// `max_norm` values; more come as raw bits.
const MAX_NORMS: [f32; 12] = [
    1.0,
    0.5,
    2.0,
    0.0,
    -0.0,
    -1.0,
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    1e-30,
    f32::MAX,
    f32::from_bits(1),
];

/// `norm_type` values.
const NORM_TYPES: [f32; 13] = [
    2.0,
    1.0,
    0.0,
    f32::INFINITY,
    f32::NEG_INFINITY,
    3.0,
    0.5,
    -1.0,
    -2.0,
    f32::NAN,
    1.5,
    1e30,
    -0.0,
];

/// Hyper-parameter values; more come as raw bits.
const HYPERS: [f32; 14] = [
    0.1,
    0.0,
    1.0,
    0.5,
    -0.0,
    -0.1,
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    1e-30,
    f32::MAX,
    f32::from_bits(1),
    1e30,
    2.0,
];

/// Widths for which every non-empty call overflows.
const HUGE_DIMS: [usize; 4] = [usize::MAX, usize::MAX / 2 + 1, 1 << 62, 1 << 40];

/// Non-NaN values at the edges of `f32`.
const SPECIALS: [f32; 11] = [
    0.0,
    -0.0,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::MAX,
    f32::MIN,
    f32::MIN_POSITIVE,
    f32::from_bits(1),
    1e30,
    -1e30,
    1e-30,
];

/// How a case's floats are drawn.
#[derive(Clone, Copy, Debug)]
enum Fill {
    /// `k / 8` for `k` in -64..64: sums are exact.
    Eighths,
    /// `k / 8 × 2^e` for `e` in -20..=20: sums round.
    Wide,
    /// Eighths with one value in 8 from [`SPECIALS`].
    Specials,
}

/// The case's stream of floats.
struct Floats {
    rng: SplitMix64,
    fill: Fill,
}

impl Floats {
    fn one(&mut self) -> f32 {
        let word = self.rng.next_u64();
        let eighth = ((word & 127) as i32 - 64) as f32 / 8.0;
        match self.fill {
            Fill::Eighths => eighth,
            Fill::Wide => {
                let e = ((word >> 8) % 41) as i32 - 20;
                eighth * f32::from_bits(((127 + e) as u32) << 23)
            }
            Fill::Specials if (word >> 8).is_multiple_of(8) => {
                SPECIALS[((word >> 16) % SPECIALS.len() as u64) as usize]
            }
            Fill::Specials => eighth,
        }
    }

    fn many(&mut self, len: usize) -> Vec<f32> {
        (0..len).map(|_| self.one()).collect()
    }
}

/// The most values of an output a call can be expected to allocate: past
/// it (the huge widths) a call that would return that many must fail.
const MAX_OUTPUT: usize = 1 << 28;

/// A length of `len` values, or (one time in four) a wrong one; a short
/// wrong one for lengths past [`MAX_OUTPUT`], which no buffer here holds.
fn length(b: &mut Bytes<'_>, len: Option<usize>) -> usize {
    let len = len.filter(|&len| len <= MAX_OUTPUT);
    match (b.below(4), len) {
        (3, Some(len)) => [len + 1, len.saturating_sub(1), 0, len + 7][b.below(4) as usize],
        (_, None) => b.below(8) as usize,
        (_, Some(len)) => len,
    }
}

/// An id relative to `rows`, chosen by the bytes: mostly a valid row.
fn id<I: Id>(b: &mut Bytes<'_>, rows: usize) -> I {
    let rows = rows as i128;
    let valid = |r: u8| if rows == 0 { 0 } else { i128::from(r) % rows };
    I::wrap(match b.below(16) {
        0 => rows,
        1 => rows + 1 + i128::from(b.byte()),
        2 => -1,
        3 => -rows,
        4 => I::MIN,
        5 => I::MAX,
        6 => i128::from(i64::MIN),
        7 => i128::from(u64::MAX),
        8 => 1 << 32,
        9 => rows - 1,
        _ => valid(b.byte()),
    })
}

/// Up to [`MAX_IDS`] ids.
fn ids<I: Id>(b: &mut Bytes<'_>, rows: usize) -> Vec<I> {
    let n = b.below(MAX_IDS + 1) as usize;
    (0..n).map(|_| id(b, rows)).collect()
}

fn hyper(b: &mut Bytes<'_>) -> Hyper {
    let value = |b: &mut Bytes<'_>| {
        if b.below(8) == 7 {
            f32::from_bits(b.u64() as u32)
        } else {
            b.pick(&HYPERS)
        }
    };
    // Mostly PyTorch's defaults, so that most steps are valid.
    let defaults = b.below(3) == 0;
    Hyper {
        lr: value(b),
        weight_decay: if defaults { 0.0 } else { value(b) },
        eps: if defaults { 1e-10 } else { value(b) },
        lr_decay: if defaults { 0.0 } else { value(b) },
        initial: if defaults { 0.0 } else { value(b) },
    }
}

/// The three optimisers of one copy of the layer.
#[derive(Clone, Debug)]
struct Optimizers {
    adagrad: Adagrad,
    rowwise: RowWiseAdagrad,
}

impl Optimizers {
    /// Fresh optimisers, or (`stale`) ones that already stepped a table of
    /// another shape.
    fn new(stale: bool, rows: usize, dim: usize) -> Optimizers {
        let mut opts = Optimizers {
            adagrad: Adagrad::new(0.1),
            rowwise: RowWiseAdagrad::new(0.1),
        };
        if stale {
            let (rows, dim) = (rows % 8 + 1, dim % 8 + 1);
            let mut other = Embedding::from_pretrained(vec![0.5; rows * dim], dim, false)
                .expect("a plain table");
            let grad = vec![1.0; dim];
            other
                .sparse_step(&grad, &[0u32], &mut opts.adagrad)
                .expect("a plain step");
            other
                .sparse_step(&grad, &[0u32], &mut opts.rowwise)
                .expect("a plain step");
        }
        opts
    }

    /// Sets the hyper-parameters of the next step.
    fn set(&mut self, h: Hyper) {
        let a = &mut self.adagrad;
        (a.lr, a.weight_decay, a.eps, a.lr_decay) = (h.lr, h.weight_decay, h.eps, h.lr_decay);
        a.initial_accumulator_value = h.initial;
        let r = &mut self.rowwise;
        (r.lr, r.weight_decay, r.eps) = (h.lr, h.weight_decay, h.eps);
        r.initial_accumulator_value = h.initial;
    }

    /// Everything a step may change, as bits.
    fn snapshot(&self) -> (Vec<u32>, u64, Vec<u32>) {
        (
            bits(self.adagrad.state()),
            self.adagrad.steps(),
            bits(self.rowwise.state()),
        )
    }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// What a call returned, as bits, comparable across copies.
#[derive(Clone, Debug, PartialEq)]
struct Outcome {
    result: Result<(), EmbeddingError>,
    /// The output values (or a gradient), as bits.
    values: Vec<u32>,
    /// Max mode's winners, or a sparse gradient's rows.
    indices: Vec<i64>,
    /// A shape the call returned.
    shape: Vec<usize>,
}

impl Outcome {
    /// The outcome with every NaN made one NaN (see [`nan_blind`]).
    fn nan_blind(&self) -> Outcome {
        Outcome {
            values: nan_blind(&self.values),
            ..self.clone()
        }
    }

    fn err(result: Result<(), EmbeddingError>) -> Outcome {
        Outcome {
            result,
            values: Vec::new(),
            indices: Vec::new(),
            shape: Vec::new(),
        }
    }

    fn ok(values: &[f32], indices: Vec<i64>, shape: Vec<usize>) -> Outcome {
        Outcome {
            result: Ok(()),
            values: bits(values),
            indices,
            shape,
        }
    }
}

/// Wraps a call's result: its values on success, the error otherwise.
fn outcome<T>(
    result: Result<T, EmbeddingError>,
    values: impl FnOnce(T) -> (Vec<f32>, Vec<i64>, Vec<usize>),
) -> Outcome {
    match result {
        Ok(t) => {
            let (v, i, s) = values(t);
            Outcome::ok(&v, i, s)
        }
        Err(e) => Outcome::err(Err(e)),
    }
}

/// A buffer call's outcome: on success its buffers, on an error the proof
/// that they kept their canaries.
fn buffer_outcome(
    result: Result<(), EmbeddingError>,
    out: &[f32],
    indices: &[i64],
    what: &str,
) -> Outcome {
    if result.is_err() {
        assert!(
            out.iter().all(|x| x.to_bits() == CANARY.to_bits()),
            "{what}: an error changed the output buffer: {result:?}"
        );
        assert!(
            indices.iter().all(|&i| i == INDEX_CANARY),
            "{what}: an error changed max_indices: {result:?}"
        );
        return Outcome::err(result);
    }
    Outcome::ok(out, indices.to_vec(), Vec::new())
}

/// A sparse gradient as an outcome: its rows and its dense values.
fn sparse_values(g: SparseGrad) -> (Vec<f32>, Vec<i64>, Vec<usize>) {
    let rows = g.indices().iter().map(|&r| r as i64).collect();
    (
        g.to_dense().expect("the dense gradient of a small table"),
        rows,
        vec![g.num_embeddings(), g.embedding_dim()],
    )
}

/// One copy of the layer under test and the pool it runs in.
struct Copy<L> {
    layer: L,
    opts: Optimizers,
    pool: &'static ThreadPool,
}

/// The layers' common face, for the harness.
trait Layer: Clone {
    fn weight(&self) -> &[f32];
    fn with_parallelism(self, par: Parallelism) -> Self;
    fn set_frozen(&mut self, frozen: bool);
}

impl Layer for Embedding {
    fn weight(&self) -> &[f32] {
        Embedding::weight(self)
    }
    fn with_parallelism(self, par: Parallelism) -> Self {
        Embedding::with_parallelism(self, par)
    }
    fn set_frozen(&mut self, frozen: bool) {
        Embedding::set_frozen(self, frozen);
    }
}

impl Layer for EmbeddingBag {
    fn weight(&self) -> &[f32] {
        self.table().weight()
    }
    fn with_parallelism(self, par: Parallelism) -> Self {
        EmbeddingBag::with_parallelism(self, par)
    }
    fn set_frozen(&mut self, frozen: bool) {
        let mut table = self.clone().into_table();
        table.set_frozen(frozen);
        *self = EmbeddingBag::from_embedding(table, self.mode(), self.include_last_offset())
            .expect("the options were accepted once");
    }
}

/// The layer under test in three copies (and an unfrozen twin when it is
/// frozen), with the oracle's model beside it.
struct World<L> {
    copies: Vec<Copy<L>>,
    twin: Option<Copy<L>>,
    model: Model,
}

impl<L: Layer> World<L> {
    fn new(layer: L, model: Model, third: Parallelism, stale: bool) -> World<L> {
        let (rows, dim) = (model.rows, model.dim);
        let copy = |layer: &L, par, threads| Copy {
            layer: layer.clone().with_parallelism(par),
            opts: Optimizers::new(stale, rows, dim),
            pool: pool(threads),
        };
        let copies = vec![
            copy(&layer, Parallelism::Serial, 1),
            copy(&layer, Parallelism::Rayon, 2),
            copy(&layer, third, 3),
        ];
        let twin = model.frozen.then(|| {
            let mut twin = copy(&layer, Parallelism::Serial, 1);
            twin.layer.set_frozen(false);
            twin
        });
        // The model starts with the optimisers' states (a stale one too).
        let mut model = model;
        let opts = &copies[0].opts;
        model.adagrad = opts.adagrad.state().to_vec();
        model.adagrad_steps = opts.adagrad.steps();
        model.rowwise = opts.rowwise.state().to_vec();
        World {
            copies,
            twin,
            model,
        }
    }

    /// Runs `call` on every copy, checks them against each other and
    /// against `expected` (the oracle's outcome, which has already updated
    /// the model; `None` when the oracle allows either an error or its
    /// `Some` value), and the table against the model.
    fn check(
        &mut self,
        what: &str,
        expected: Expected,
        call: impl Fn(&mut L, &mut Optimizers) -> Outcome + Sync,
    ) where
        L: Send,
    {
        let before = bits(self.copies[0].layer.weight());
        let opts_before = self.copies[0].opts.snapshot();
        let mut outcomes = Vec::new();
        for c in self.copies.iter_mut() {
            outcomes.push(c.pool.install(|| call(&mut c.layer, &mut c.opts)));
        }
        let serial = &self.copies[0];
        for (k, c) in self.copies.iter().enumerate().skip(1) {
            assert_eq!(
                outcomes[k], outcomes[0],
                "{what}: copy {k} disagrees with the serial one"
            );
            assert_eq!(
                bits(c.layer.weight()),
                bits(serial.layer.weight()),
                "{what}: copy {k}'s table disagrees with the serial one's"
            );
            assert_eq!(
                c.opts.snapshot(),
                serial.opts.snapshot(),
                "{what}: copy {k}'s optimiser state disagrees with the serial one's"
            );
        }
        let got = outcomes.swap_remove(0);
        if let Some(twin) = &mut self.twin {
            let unfrozen = twin.pool.install(|| call(&mut twin.layer, &mut twin.opts));
            assert_eq!(
                got.result, unfrozen.result,
                "{what}: the frozen layer and its unfrozen twin disagree"
            );
        }
        let serial = &self.copies[0];
        let must_fail = matches!(expected, Expected::Err);
        if got.result.is_err() {
            assert_eq!(
                bits(serial.layer.weight()),
                before,
                "{what}: an error changed the table: {:?}",
                got.result
            );
            assert_eq!(
                serial.opts.snapshot(),
                opts_before,
                "{what}: an error changed the optimiser state: {:?}",
                got.result
            );
        }
        match expected {
            Expected::Err => assert!(
                got.result.is_err(),
                "{what}: Ok for a call the layer cannot serve"
            ),
            Expected::Ok(want) => {
                assert_eq!(got.result, Ok(()), "{what}: an error for a valid call");
                assert_eq!(
                    got.nan_blind(),
                    want.nan_blind(),
                    "{what}: the values disagree with the oracle"
                );
            }
            Expected::Either(want) => {
                if got.result.is_ok() {
                    assert_eq!(
                        got.nan_blind(),
                        want.nan_blind(),
                        "{what}: the values disagree with the oracle"
                    );
                }
            }
        }
        if got.result.is_ok() || must_fail {
            let table = nan_blind(&bits(serial.layer.weight()));
            let model = nan_blind(&bits(&self.model.weight));
            if let Some(i) = (0..table.len()).find(|&i| table.get(i) != model.get(i)) {
                panic!(
                    "{what}: the table disagrees with the oracle's at {i}: {:?} vs {:?}",
                    f32::from_bits(table[i]),
                    self.model.weight[i]
                );
            }
            assert_eq!(table.len(), model.len(), "{what}: the table changed size");
            let opts = &serial.opts;
            if self.model.frozen || got.result.is_ok() {
                let m = &self.model;
                let (adagrad, steps, rowwise) = opts.snapshot();
                assert_eq!(
                    (nan_blind(&adagrad), steps, nan_blind(&rowwise)),
                    (
                        nan_blind(&bits(&m.adagrad)),
                        m.adagrad_steps,
                        nan_blind(&bits(&m.rowwise))
                    ),
                    "{what}: the optimiser state disagrees with the oracle's"
                );
            }
        }
    }
}

/// What the oracle expects of a call.
enum Expected {
    Err,
    Ok(Outcome),
    /// An error, or this.
    Either(Outcome),
}

/// The oracle's expectation from whether the call is valid and, if so, its
/// outcome (computed only then, since it may update the model).
fn expect(valid: bool, outcome: impl FnOnce() -> Outcome) -> Expected {
    if valid {
        Expected::Ok(outcome())
    } else {
        Expected::Err
    }
}

/// The options and table of a case.
struct Setup {
    rows: usize,
    dim: usize,
    /// The table for `from_pretrained` (maybe of a wrong length), or `None`
    /// for a seeded table.
    weight: Option<Vec<f32>>,
    padding_idx: Option<i64>,
    max_norm: Option<f32>,
    norm_type: f32,
    scale_grad_by_freq: bool,
    sparse: bool,
    frozen: bool,
    mode: Mode,
    include_last_offset: bool,
    seed: u64,
    stale: bool,
    third: Parallelism,
}

impl Setup {
    fn decode(b: &mut Bytes<'_>, floats: &mut Floats) -> Setup {
        let (mut rows, mut dim) = (b.below(9) as usize, b.below(MAX_DIM as u64 + 1) as usize);
        let seeded = b.below(4) == 3;
        let mut weight = Some(floats.many(rows * dim));
        match b.below(16) {
            // A width that overflows every call, over an empty table.
            0 => {
                (rows, dim) = (0, b.pick(&HUGE_DIMS));
                weight = Some(Vec::new());
            }
            // A table of the wrong length.
            1 => weight = Some(floats.many(length(b, Some(rows * dim)))),
            // A table too large to allocate: the constructor must fail.
            2 => {
                rows = b.pick(&[usize::MAX, 1 << 40, 1 << 50, usize::MAX / 4]);
                dim = 1 + b.below(1024) as usize;
                weight = None;
            }
            _ if seeded => weight = None,
            _ => {}
        }
        let padding_idx = match b.below(8) {
            0..=2 => None,
            3 => Some(-1),
            4 => Some(-(rows as i64)),
            5 => Some(b.pick(&[rows as i64, -(rows as i64) - 1, i64::MIN, i64::MAX])),
            _ => Some(b.byte() as i64 % (rows as i64).max(1)),
        };
        let max_norm = match b.below(4) {
            0 | 1 => None,
            2 => Some(b.pick(&MAX_NORMS)),
            _ => Some(f32::from_bits(b.u64() as u32)),
        };
        let norm_type = b.pick(&NORM_TYPES);
        Setup {
            rows,
            dim,
            weight,
            padding_idx,
            max_norm,
            norm_type,
            scale_grad_by_freq: b.flag(),
            sparse: b.flag(),
            frozen: b.below(3) == 0,
            mode: b.pick(&[Mode::Sum, Mode::Mean, Mode::Max]),
            include_last_offset: b.flag(),
            seed: b.u64(),
            stale: b.below(4) == 0,
            third: b.pick(&[Parallelism::Rayon, Parallelism::Auto]),
        }
    }

    /// Whether the documented checks accept these options, and the padding
    /// row they name.
    fn valid(&self, rows: usize, bag: bool) -> Option<Option<usize>> {
        let padding = oracle::padding_row(self.padding_idx, rows)?;
        let max_norm_ok = self.max_norm.is_none_or(|m| m > 0.0);
        let pair_ok = !(bag && self.mode == Mode::Max && self.scale_grad_by_freq);
        (max_norm_ok && !self.norm_type.is_nan() && pair_ok).then_some(padding)
    }

    /// The embedding options.
    fn options(&self) -> EmbeddingOptions {
        EmbeddingOptions {
            padding_idx: self.padding_idx,
            max_norm: self.max_norm,
            norm_type: self.norm_type,
            scale_grad_by_freq: self.scale_grad_by_freq,
            sparse: self.sparse,
            seed: Some(self.seed),
        }
    }

    fn bag_options(&self) -> EmbeddingBagOptions {
        EmbeddingBagOptions {
            mode: self.mode,
            padding_idx: self.padding_idx,
            max_norm: self.max_norm,
            norm_type: self.norm_type,
            scale_grad_by_freq: self.scale_grad_by_freq,
            sparse: self.sparse,
            include_last_offset: self.include_last_offset,
            seed: Some(self.seed),
        }
    }

    /// The rows the table has, if its length fits the width.
    fn table_rows(&self) -> Option<usize> {
        match &self.weight {
            None => Some(self.rows),
            Some(w) if self.dim == 0 => w.is_empty().then_some(0),
            Some(w) => (w.len() % self.dim == 0).then_some(w.len() / self.dim),
        }
    }

    /// The model of a layer built from these options and its table.
    fn model(&self, rows: usize, padding: Option<usize>, weight: &[f32]) -> Model {
        Model {
            weight: weight.to_vec(),
            rows,
            dim: self.dim,
            padding,
            max_norm: self.max_norm,
            norm_type: self.norm_type,
            scale_grad_by_freq: self.scale_grad_by_freq,
            frozen: self.frozen,
            mode: self.mode,
            adagrad: Vec::new(),
            adagrad_steps: 0,
            rowwise: Vec::new(),
        }
    }
}

/// Builds the layer with `build` twice, on one thread and on three, and
/// checks the result against the documented checks; returns the layer and
/// its model when it was built.
fn construct<L: Layer + Send>(
    setup: &Setup,
    bag: bool,
    build: impl Fn() -> Result<L, EmbeddingError> + Sync,
) -> Option<(L, Model)> {
    let one = pool(1).install(&build);
    let three = pool(3).install(&build);
    let fits = setup.table_rows();
    let valid = fits.and_then(|rows| setup.valid(rows, bag).map(|p| (rows, p)));
    let small = setup.weight.is_some()
        || setup
            .rows
            .checked_mul(setup.dim)
            .is_some_and(|n| n < 1 << 20);
    match (one, three) {
        (Ok(layer), Ok(other)) => {
            let (rows, padding) = valid.expect("Ok for options or a table it cannot serve");
            assert!(small, "Ok for a table too large to allocate");
            assert_eq!(
                bits(layer.weight()),
                bits(other.weight()),
                "the table depends on the thread count"
            );
            if let Some(w) = &setup.weight {
                assert_eq!(
                    bits(layer.weight()),
                    bits(w),
                    "from_pretrained changed the table"
                );
            }
            if setup.weight.is_none()
                && let Some(p) = padding
            {
                let row = &layer.weight()[p * setup.dim..(p + 1) * setup.dim];
                assert!(
                    row.iter().all(|&x| x.to_bits() == 0),
                    "the padding row is not zero"
                );
            }
            let model = setup.model(rows, padding, layer.weight());
            Some((layer, model))
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "the error depends on the thread count");
            assert!(
                valid.is_none() || !small,
                "an error for options and a table it can serve: {a:?}"
            );
            None
        }
        (a, b) => panic!(
            "the constructor's result depends on the thread count: {:?} vs {:?}",
            a.err(),
            b.err()
        ),
    }
}

/// Decodes a case and runs it.
fn run(data: &[u8]) {
    let mut b = Bytes::new(data);
    let bag = b.flag();
    let id_type = b.below(5);
    let fill = b.pick(&[Fill::Eighths, Fill::Wide, Fill::Specials]);
    let mut floats = Floats {
        rng: SplitMix64(b.u64()),
        fill,
    };
    let setup = Setup::decode(&mut b, &mut floats);
    match id_type {
        0 => run_typed::<u32>(&mut b, &mut floats, &setup, bag),
        1 => run_typed::<i32>(&mut b, &mut floats, &setup, bag),
        2 => run_typed::<u64>(&mut b, &mut floats, &setup, bag),
        3 => run_typed::<i64>(&mut b, &mut floats, &setup, bag),
        _ => run_typed::<usize>(&mut b, &mut floats, &setup, bag),
    }
}

fn run_typed<I: Id>(b: &mut Bytes<'_>, floats: &mut Floats, setup: &Setup, bag: bool) {
    if bag {
        let built = construct(setup, true, || match &setup.weight {
            Some(w) => EmbeddingBag::from_pretrained(
                w.clone(),
                setup.dim,
                setup.frozen,
                setup.bag_options(),
            ),
            None => EmbeddingBag::with_options(setup.rows, setup.dim, setup.bag_options()).map(
                |mut l| {
                    l.set_frozen(setup.frozen);
                    l
                },
            ),
        });
        if let Some((layer, model)) = built {
            let mut world = World::new(layer, model, setup.third, setup.stale);
            for _ in 0..MAX_CALLS {
                if b.is_empty() {
                    break;
                }
                bags::call::<I>(b, floats, &mut world);
            }
        }
    } else {
        let built = construct(setup, false, || {
            let mut layer = match &setup.weight {
                Some(w) => Embedding::from_pretrained_with_options(
                    w.clone(),
                    setup.dim,
                    setup.frozen,
                    setup.options(),
                )?,
                None => Embedding::with_options(setup.rows, setup.dim, setup.options())?,
            };
            layer.set_frozen(setup.frozen);
            Ok(layer)
        });
        if let Some((layer, model)) = built {
            let mut world = World::new(layer, model, setup.third, setup.stale);
            for _ in 0..MAX_CALLS {
                if b.is_empty() {
                    break;
                }
                embedding::call::<I>(b, floats, &mut world);
            }
        }
    }
}

/// The calls of an [`Embedding`].
mod embedding {
    use super::*;

    /// A shape for `n` ids: `[n]`, two factors, or a wrong or overflowing one.
    fn shape(b: &mut Bytes<'_>, n: usize) -> Vec<usize> {
        match b.below(6) {
            0 => vec![n + 1],
            1 => vec![usize::MAX, 2],
            2 => vec![2, n / 2 + 1, 0],
            3 => vec![1, n, 1],
            _ if n.is_multiple_of(2) && n > 0 => vec![2, n / 2],
            _ => vec![n],
        }
    }

    /// Per-position gradient rows of an embedding backward.
    fn contributions(rows: &[usize], grad: &[f32], dim: usize) -> Vec<(usize, Vec<f32>)> {
        rows.iter()
            .enumerate()
            .map(|(p, &r)| (r, grad[p * dim..(p + 1) * dim].to_vec()))
            .collect()
    }

    fn dense_outcome(g: Vec<f32>, shape: Vec<usize>) -> Outcome {
        Outcome::ok(&g, Vec::new(), shape)
    }

    /// The oracle's sparse gradient of `contributions`.
    fn sparse_outcome(model: &Model, c: &[(usize, Vec<f32>)]) -> Outcome {
        let dense = model.dense_grad(c);
        let rows = model.touched(c).iter().map(|&r| r as i64).collect();
        Outcome::ok(&dense, rows, vec![model.rows, model.dim])
    }

    /// Decodes one call and checks it.
    pub fn call<I: Id>(b: &mut Bytes<'_>, floats: &mut Floats, w: &mut World<Embedding>) {
        let (rows, dim) = (w.model.rows, w.model.dim);
        let ids: Vec<I> = ids(b, rows);
        let n = ids.len();
        let keys: Vec<i128> = ids.iter().map(|i| i.to_i128()).collect();
        let valid_rows = w.model.rows_of(&keys);
        let per_id = n.checked_mul(dim);
        let op = b.below(10);
        let grad = match op {
            3..=6 => floats.many(length(b, per_id)),
            _ => Vec::new(),
        };
        let grad_ok = Some(grad.len()) == per_id;
        match op {
            0 => {
                let shape = shape(b, n);
                let holds = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) == Some(n);
                let model = &mut w.model;
                let expected = expect(holds && per_id.is_some() && valid_rows.is_some(), || {
                    let r = valid_rows.unwrap();
                    model.renorm(&r);
                    let mut s = shape.clone();
                    s.push(dim);
                    Outcome::ok(&model.gather(&r), Vec::new(), s)
                });
                w.check("forward", expected, |l, _| {
                    outcome(l.forward(&ids, &shape), |e| (e.values, Vec::new(), e.shape))
                });
            }
            1 | 2 => {
                let len = length(b, per_id);
                let lookup = op == 2;
                let model = &mut w.model;
                let usable = !(lookup && model.max_norm.is_some());
                let valid = usable && Some(len) == per_id && valid_rows.is_some();
                let expected = expect(valid, || {
                    let r = valid_rows.unwrap();
                    model.renorm(&r);
                    Outcome::ok(&model.gather(&r), Vec::new(), Vec::new())
                });
                let what = if lookup {
                    "lookup_into"
                } else {
                    "forward_into"
                };
                w.check(what, expected, |l, _| {
                    let mut out = vec![CANARY; len];
                    let result = if lookup {
                        l.lookup_into(&ids, &mut out)
                    } else {
                        l.forward_into(&ids, &mut out)
                    };
                    buffer_outcome(result, &out, &[], what)
                });
            }
            3..=5 => {
                let model = &w.model;
                let valid = grad_ok && valid_rows.is_some();
                let c = || contributions(valid_rows.as_ref().unwrap(), &grad, dim);
                let sparse = match op {
                    3 => w.copies[0].layer.is_sparse(),
                    4 => false,
                    _ => true,
                };
                let grad_len = if op == 4 {
                    length(b, rows.checked_mul(dim))
                } else {
                    0
                };
                let valid = valid && (op != 4 || grad_len == rows * dim);
                let expected = expect(valid, || {
                    if sparse {
                        sparse_outcome(model, &c())
                    } else {
                        dense_outcome(model.dense_grad(&c()), Vec::new())
                    }
                });
                w.check("backward", expected, |l, _| match op {
                    3 => outcome(l.backward(&grad, &ids), |g| match g {
                        Gradient::Dense(d) => (d, Vec::new(), Vec::new()),
                        Gradient::Sparse(s) => sparse_values(s),
                    }),
                    4 => {
                        let mut out = vec![CANARY; grad_len];
                        let result = l.backward_dense_into(&grad, &ids, &mut out);
                        buffer_outcome(result, &out, &[], "backward_dense_into")
                    }
                    _ => outcome(l.backward_sparse(&grad, &ids), sparse_values),
                });
            }
            6 => {
                let opt = b.pick(&[Opt::Sgd, Opt::Adagrad, Opt::RowWise]);
                let h = hyper(b);
                let model = &mut w.model;
                let valid =
                    grad_ok && valid_rows.is_some() && h.valid(opt) && model.state_fits(opt);
                let expected = expect(valid, || {
                    let c = contributions(valid_rows.as_ref().unwrap(), &grad, dim);
                    let dense = model.dense_grad(&c);
                    let touched = model.touched(&c);
                    model.step(opt, h, &touched, |r| dense[r * dim..(r + 1) * dim].to_vec());
                    Outcome::ok(&[], Vec::new(), Vec::new())
                });
                w.check("sparse_step", expected, |l, o| {
                    o.set(h);
                    Outcome::err(match opt {
                        Opt::Sgd => {
                            let mut sgd = Sgd::new(h.lr).with_weight_decay(h.weight_decay);
                            l.sparse_step(&grad, &ids, &mut sgd)
                        }
                        Opt::Adagrad => l.sparse_step(&grad, &ids, &mut o.adagrad),
                        Opt::RowWise => l.sparse_step(&grad, &ids, &mut o.rowwise),
                    })
                });
            }
            7 => {
                // A coalesced gradient over the valid rows of the ids, maybe
                // made for another table shape.
                if dim > MAX_DIM {
                    return;
                }
                let (g_rows, g_dim) = match b.below(6) {
                    0 => (rows + 1, dim),
                    1 => (rows, dim + 1),
                    _ => (rows, dim),
                };
                let mut touched: Vec<usize> = keys
                    .iter()
                    .filter(|&&k| (0..g_rows as i128).contains(&k))
                    .map(|&k| k as usize)
                    .collect();
                touched.sort_unstable();
                touched.dedup();
                let values = floats.many(touched.len() * g_dim);
                let Ok(sparse) = SparseGrad::new(touched.clone(), values.clone(), g_rows, g_dim)
                else {
                    panic!("SparseGrad::new refused coalesced rows");
                };
                let opt = b.pick(&[Opt::Sgd, Opt::Adagrad, Opt::RowWise]);
                let h = hyper(b);
                let model = &mut w.model;
                let fits = g_rows == rows && g_dim == dim;
                let valid = fits && h.valid(opt) && model.state_fits(opt);
                let expected = expect(valid, || {
                    let kept: Vec<usize> = touched
                        .iter()
                        .copied()
                        .filter(|&r| Some(r) != model.padding)
                        .collect();
                    model.step(opt, h, &kept, |r| {
                        let k = touched.binary_search(&r).expect("a touched row");
                        values[k * dim..(k + 1) * dim].to_vec()
                    });
                    Outcome::ok(&[], Vec::new(), Vec::new())
                });
                w.check("apply_sparse", expected, |l, o| {
                    o.set(h);
                    Outcome::err(match opt {
                        Opt::Sgd => {
                            let mut sgd = Sgd::new(h.lr).with_weight_decay(h.weight_decay);
                            l.apply_sparse(&sparse, &mut sgd)
                        }
                        Opt::Adagrad => l.apply_sparse(&sparse, &mut o.adagrad),
                        Opt::RowWise => l.apply_sparse(&sparse, &mut o.rowwise),
                    })
                });
            }
            8 => {
                let grad = floats.many(length(b, rows.checked_mul(dim)));
                let h = hyper(b);
                let model = &mut w.model;
                let valid = grad.len() == rows * dim && h.valid(Opt::Sgd);
                let expected = expect(valid, || {
                    let all: Vec<usize> = (0..rows).filter(|&r| Some(r) != model.padding).collect();
                    model.step(Opt::Sgd, h, &all, |r| grad[r * dim..(r + 1) * dim].to_vec());
                    Outcome::ok(&[], Vec::new(), Vec::new())
                });
                w.check("dense_sgd_step", expected, |l, _| {
                    let sgd = Sgd::new(h.lr).with_weight_decay(h.weight_decay);
                    Outcome::err(l.dense_sgd_step(&grad, &sgd))
                });
            }
            _ => {
                let one = id::<I>(b, rows);
                let model = &w.model;
                let key = one.to_i128();
                let expected = expect(model.valid(key), || {
                    Outcome::ok(model.row(key as usize), Vec::new(), Vec::new())
                });
                w.check("row", expected, |l, _| {
                    outcome(l.row(one), |r| (r.to_vec(), Vec::new(), Vec::new()))
                });
            }
        }
    }
}

/// The calls of an [`EmbeddingBag`].
mod bags {
    use super::*;
    use core::ops::Range;

    /// Bags over `n` ids: from offsets (sorted cuts, or a planted fault),
    /// or `Bags::fixed`; `None` if the crate refused them (the `bag` target
    /// checks the offsets rules).
    fn bags(b: &mut Bytes<'_>, l: &EmbeddingBag, n: usize) -> Option<Bags> {
        let num_ids = match b.below(8) {
            0 => n + 1,
            1 => n.saturating_sub(1),
            _ => n,
        };
        if b.below(4) == 0 {
            let (count, size) = match b.below(8) {
                0 => (b.pick(&[usize::MAX, 1 << 40, usize::MAX / 2]), 0),
                1 => (b.below(5) as usize, b.below(5) as usize),
                _ if n == 0 => (b.below(4) as usize, 0),
                _ => {
                    let size = b.pick(&[1, 2, 4, n]).min(n);
                    (n / size, size)
                }
            };
            return Bags::fixed(count, size).ok();
        }
        let count = b.below(6) as usize;
        let mut offsets: Vec<i64> = (0..count)
            .map(|_| b.below(num_ids as u64 + 1) as i64)
            .collect();
        offsets.sort_unstable();
        if let Some(first) = offsets.first_mut() {
            *first = 0;
        }
        if b.below(8) == 0 && !offsets.is_empty() {
            let at = b.below(offsets.len() as u64) as usize;
            offsets[at] = b.pick(&[-1, num_ids as i64 + 1, i64::MAX, 1]);
        }
        if b.flag() {
            let wide: Vec<u32> = offsets.iter().map(|&o| o as u32).collect();
            l.offsets(&wide, num_ids).ok()
        } else {
            l.offsets(&offsets, num_ids).ok()
        }
    }

    fn ranges(bags: &Bags) -> Vec<Range<usize>> {
        bags.iter().collect()
    }

    /// Decodes one call and checks it.
    pub fn call<I: Id>(b: &mut Bytes<'_>, floats: &mut Floats, w: &mut World<EmbeddingBag>) {
        let (rows, dim, mode) = (w.model.rows, w.model.dim, w.model.mode);
        let ids: Vec<I> = ids(b, rows);
        let n = ids.len();
        let keys: Vec<i128> = ids.iter().map(|i| i.to_i128()).collect();
        let valid_rows = w.model.rows_of(&keys);
        let Some(bags) = bags(b, &w.copies[0].layer, n) else {
            return;
        };
        let spans = ranges(&bags);
        let out_len = bags.len().checked_mul(dim);
        let weights = match b.below(4) {
            0 => Some(floats.many(length(b, Some(n)))),
            _ => None,
        };
        let psw = weights.as_deref();
        // The forward's arguments, as the documentation lists them.
        let args_ok = bags.num_ids() == n
            && weights
                .as_ref()
                .is_none_or(|w| mode == Mode::Sum && w.len() == n)
            && valid_rows.is_some();
        let op = b.below(5);
        match op {
            0 | 1 => {
                let into = op == 1;
                let len = if into { length(b, out_len) } else { 0 };
                let idx_len = if into && mode == Mode::Max {
                    length(b, out_len)
                } else {
                    0
                };
                let model = &mut w.model;
                let lengths_ok = !into
                    || (Some(len) == out_len && (mode != Mode::Max || Some(idx_len) == out_len));
                let sized = out_len.is_some_and(|len| len <= MAX_OUTPUT);
                let expected = expect(args_ok && sized && lengths_ok, || {
                    let r = valid_rows.clone().unwrap();
                    model.renorm(&r);
                    let (mut values, mut winners) = (Vec::new(), Vec::new());
                    for span in &spans {
                        let (v, i) = oracle::pool(model, span.clone(), &r, psw);
                        values.extend(v);
                        winners.extend(i);
                    }
                    let shape = if into {
                        Vec::new()
                    } else {
                        vec![bags.len(), dim]
                    };
                    if into && mode != Mode::Max {
                        winners.clear();
                    }
                    Outcome::ok(&values, winners, shape)
                });
                w.check("bag forward", expected, |l, _| {
                    if into {
                        let mut out = vec![CANARY; len];
                        let mut idx = vec![INDEX_CANARY; idx_len];
                        let result = l.forward_into(&ids, &bags, psw, &mut out, &mut idx);
                        buffer_outcome(result, &out, &idx, "bag forward_into")
                    } else {
                        outcome(l.forward(&ids, &bags, psw), |o: BagOutput| {
                            (
                                o.values,
                                o.max_indices.unwrap_or_default(),
                                o.shape.to_vec(),
                            )
                        })
                    }
                });
            }
            2 | 3 => {
                let grad = floats.many(length(b, out_len));
                let grad_ok = Some(grad.len()) == out_len;
                let dense_into = op == 3;
                let grad_len = if dense_into {
                    length(b, rows.checked_mul(dim))
                } else {
                    0
                };
                let sparse = !dense_into && w.copies[0].layer.table().is_sparse();
                let target_ok = !dense_into || grad_len == rows * dim;
                // Max mode's winners: the forward's own, or planted ones.
                let max_indices: Option<Vec<i64>> = match (mode, b.below(4)) {
                    (Mode::Max, 0) => None,
                    (Mode::Max, _) => Some({
                        let len = length(b, out_len);
                        (0..len)
                            .map(|_| match b.below(8) {
                                0 => rows as i64,
                                1 => b.pick(&[-2, i64::MIN, i64::MAX]),
                                2 => -1,
                                _ => (b.byte() as usize % rows.max(1)) as i64,
                            })
                            .map(|i| {
                                if Some(i as usize) == w.model.padding {
                                    -1
                                } else {
                                    i
                                }
                            })
                            .collect()
                    }),
                    (_, k) => (k == 0).then(|| vec![0; length(b, out_len)]),
                };
                let model = &w.model;
                let expected = if mode == Mode::Max {
                    let idx_ok = max_indices.as_ref().is_some_and(|m| {
                        Some(m.len()) == out_len
                            && m.iter().all(|&i| (-1..rows as i64).contains(&i))
                    });
                    let outcome = || {
                        let idx = max_indices.as_ref().unwrap();
                        let mut dense = vec![0.0f32; rows * dim];
                        for (k, &i) in idx.iter().enumerate() {
                            if i >= 0 {
                                dense[i as usize * dim + k % dim.max(1)] += grad[k];
                            }
                        }
                        let mut won: Vec<i64> = idx.iter().copied().filter(|&i| i >= 0).collect();
                        won.sort_unstable();
                        won.dedup();
                        let shape = if sparse { vec![rows, dim] } else { Vec::new() };
                        Outcome::ok(&dense, if sparse { won } else { Vec::new() }, shape)
                    };
                    let valid = grad_ok && target_ok && idx_ok;
                    match (valid, args_ok) {
                        (false, _) => Expected::Err,
                        (true, true) => Expected::Ok(outcome()),
                        // Max mode's backward needs only the winners: the
                        // ids and weights may or may not be checked.
                        (true, false) => Expected::Either(outcome()),
                    }
                } else {
                    expect(args_ok && grad_ok && target_ok, || {
                        let r = valid_rows.clone().unwrap();
                        let c = bag_contributions(model, &spans, &r, psw, &grad);
                        let dense = model.dense_grad(&c);
                        if sparse {
                            let touched = model.touched(&c).iter().map(|&r| r as i64).collect();
                            Outcome::ok(&dense, touched, vec![rows, dim])
                        } else {
                            Outcome::ok(&dense, Vec::new(), Vec::new())
                        }
                    })
                };
                let idx = max_indices.as_deref();
                w.check("bag backward", expected, |l, _| {
                    if dense_into {
                        let mut out = vec![CANARY; grad_len];
                        let result = l.backward_dense_into(&grad, &ids, &bags, psw, idx, &mut out);
                        buffer_outcome(result, &out, &[], "bag backward_dense_into")
                    } else {
                        outcome(l.backward(&grad, &ids, &bags, psw, idx), |g| match g {
                            Gradient::Dense(d) => (d, Vec::new(), Vec::new()),
                            Gradient::Sparse(s) => sparse_values(s),
                        })
                    }
                });
            }
            _ => {
                let grad = floats.many(length(b, out_len));
                let grad_ok = Some(grad.len()) == out_len;
                let opt = b.pick(&[Opt::Sgd, Opt::Adagrad, Opt::RowWise]);
                let h = hyper(b);
                let model = &mut w.model;
                let valid = mode != Mode::Max
                    && args_ok
                    && grad_ok
                    && h.valid(opt)
                    && model.state_fits(opt);
                let expected = expect(valid, || {
                    let r = valid_rows.clone().unwrap();
                    let c = bag_contributions(model, &spans, &r, psw, &grad);
                    let dense = model.dense_grad(&c);
                    let touched = model.touched(&c);
                    model.step(opt, h, &touched, |r| dense[r * dim..(r + 1) * dim].to_vec());
                    Outcome::ok(&[], Vec::new(), Vec::new())
                });
                w.check("bag sparse_step", expected, |l, o| {
                    o.set(h);
                    Outcome::err(match opt {
                        Opt::Sgd => {
                            let mut sgd = Sgd::new(h.lr).with_weight_decay(h.weight_decay);
                            l.sparse_step(&grad, &ids, &bags, psw, &mut sgd)
                        }
                        Opt::Adagrad => l.sparse_step(&grad, &ids, &bags, psw, &mut o.adagrad),
                        Opt::RowWise => l.sparse_step(&grad, &ids, &bags, psw, &mut o.rowwise),
                    })
                });
            }
        }
    }
}

fuzz_target!(|data: &[u8]| run(data));
