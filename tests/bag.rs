//! The bag kernels (`kernels::bag`, PyTorch's `nn.EmbeddingBag`) against the
//! bag-matrix reference (`reference::bag_forward`, `reference::bag_backward`)
//! on every id type and every offset type, serially and split (`Rayon`, and
//! the default `Auto`) on local pools of 1, 2, 3 and 8 threads:
//!
//! * sum (with and without `per_sample_weights`) and max: the reference's
//!   bits, and for max the reference's winning ids;
//! * mean: the bits of the kernel's own sum divided by the bag's count, and
//!   within [`mean_bound`] of the reference's `Σ x·(1/n)`;
//! * the sum and mean backward, with and without `scale_grad_by_freq`,
//!   dense (into a NaN-filled buffer, so every row must be written) and
//!   coalesced sparse: the bits of zeros plus `reference::bag_backward`, and
//!   the distinct kept ids; max's backward: the bits of a plain loop over the
//!   bags in order;
//! * every error, exactly, with NaN canaries in every buffer; empty and
//!   all-padding bags; max's NaN and tie rules and its winners in bags of
//!   more than 2^24 ids (past what an `f32` counts exactly); a
//!   finite-difference check of every backward; `Auto` past its threshold.
//!
//! The values span 24 binades (see `common::SplitMix`), so a sum taken in
//! another order shows in the bits.
//!
//! **Why no `per_sample_weight` is 0 here.** The reference multiplies by the
//! bag matrix, and its matrix product skips zero coefficients (as the Netlib
//! `SGEMM` does, so that a one-hot row copies bits); the kernel adds `x × 0`.
//! The two agree in value but not in every bit: for `x < 0`, `x × 0` is `-0.0`,
//! so a bag whose weights are all 0 is `-0.0` in the kernel and `+0.0` (an
//! "empty" bag) in the reference, and `inf × 0` is NaN where the reference
//! skips the term. The comparison is only exact for non-zero weights.

use embedding_kernels::formats::Format;
use embedding_kernels::{
    Bags, Mode, Pooling, bag_backward_with, bag_forward, bag_forward_with, bag_max_backward,
    bag_sparse_backward_with,
};
use embedding_kernels::{EmbeddingBag, EmbeddingBagOptions, QuantizedEmbeddingBag};
use embedding_kernels::{EmbeddingError, Index, Operand, Parallelism, reference};
use proptest::prelude::*;

use crate::common::{
    Pattern, Row, SplitMix, around_prefetch_size, assert_gradient, bad_id, bits, convert, draw_ids,
    ids_as, mismatch, not_whole_rows, numeric_gradient, pools, row, run_table, weighted_sum,
    zero_dim,
};

/// What a max-index buffer holds before a call: no winner is ever this id.
const INDEX_CANARY: i64 = i64::MIN + 7;

/// How a case cuts its ids into bags.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// Offsets drawn at random: bags of every size, empty ones included.
    Random,
    /// Offsets drawn from three cut points: mostly empty bags.
    Clustered,
    /// One offset, 0: a single bag.
    Single,
    /// One offset per id: many bags of one.
    Ones,
    /// A 2-D input, `[bags, size]` (`Bags::fixed`).
    Fixed,
}

/// The bags of a case, before they are typed and checked.
#[derive(Clone, Debug)]
enum Layout {
    Offsets {
        offsets: Vec<u64>,
        include_last_offset: bool,
    },
    Fixed {
        bags: usize,
        size: usize,
    },
}

#[derive(Clone, Debug)]
struct Case {
    rows: usize,
    dim: usize,
    ids: Vec<u64>,
    layout: Layout,
    padding_idx: Option<usize>,
    seed: u64,
}

type Range = std::ops::RangeInclusive<usize>;

/// The widths with a special role: 1, around one vector of eight (7, 8, 9),
/// around the forward's column blocks (64, 65, 72: a block of 64 and a tail
/// of one value or one vector; 127, 128, 129, 136: 128 columns, the widest
/// AVX block, less or more), 31, 32, 33, and the grouped backward's 16-float cache lines
/// (16, 48).
const DIMS: [usize; 16] = [
    1, 7, 8, 9, 16, 31, 32, 33, 48, 64, 65, 72, 127, 128, 129, 136,
];

fn case(rows: Range, dim: Range, n: Range, max_offsets: usize) -> impl Strategy<Value = Case> {
    let pattern = prop_oneof![
        Just(Pattern::Uniform),
        Just(Pattern::FewDistinct),
        Just(Pattern::Hot)
    ];
    let (low, high) = (*dim.start(), *dim.end());
    let special: Vec<usize> = DIMS.iter().copied().filter(|d| dim.contains(d)).collect();
    let dim = prop_oneof![
        3 => low..=high,
        1 => proptest::sample::select(special),
    ];
    let shape = prop_oneof![
        4 => Just(Shape::Random),
        2 => Just(Shape::Clustered),
        1 => Just(Shape::Single),
        1 => Just(Shape::Ones),
        2 => Just(Shape::Fixed),
    ];
    (
        rows,
        dim,
        n,
        pattern,
        shape,
        any::<bool>(),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(
            move |(rows, dim, n, pattern, shape, include_last_offset, padded, seed)| {
                let mut ids = draw_ids(rows, n, pattern, seed);
                let mut rng = SplitMix(seed ^ 0x0FF5E7);
                let layout = layout(&mut rng, &mut ids, shape, include_last_offset, max_offsets);
                // An id of the batch (with `Hot`, most likely the hot one).
                let padding_idx = match ids.len() {
                    0 => None,
                    len if padded => Some(ids[(rng.next() % len as u64) as usize] as usize),
                    _ => None,
                };
                Case {
                    rows,
                    dim,
                    ids,
                    layout,
                    padding_idx,
                    seed,
                }
            },
        )
}

/// Bags over `ids` of the given shape; `Fixed` drops the ids that do not
/// fill a whole bag.
fn layout(
    rng: &mut SplitMix,
    ids: &mut Vec<u64>,
    shape: Shape,
    include_last_offset: bool,
    max_offsets: usize,
) -> Layout {
    let n = ids.len() as u64;
    let mut offsets = match shape {
        Shape::Fixed => {
            let size = if rng.next().is_multiple_of(16) {
                0
            } else {
                1 + (rng.next() % 12) as usize
            };
            let bags = match size {
                0 => (rng.next() % 6) as usize,
                _ => ids.len() / size,
            };
            ids.truncate(bags * size);
            return Layout::Fixed { bags, size };
        }
        Shape::Single => vec![0],
        Shape::Ones => (0..n).collect(),
        Shape::Random | Shape::Clustered => {
            let count = 1 + rng.next() % max_offsets as u64;
            let cuts: Vec<u64> = (0..3).map(|_| rng.next() % (n + 1)).collect();
            let mut offsets: Vec<u64> = (1..count)
                .map(|_| match shape {
                    Shape::Random => rng.next() % (n + 1),
                    _ => cuts[(rng.next() % 3) as usize],
                })
                .collect();
            offsets.push(0);
            offsets.sort_unstable();
            offsets
        }
    };
    if include_last_offset {
        // The end of the last bag; the ids after it belong to no bag.
        let last = offsets.last().copied().unwrap_or(0);
        let end = if rng.next().is_multiple_of(2) {
            n
        } else {
            last + rng.next() % (n - last + 1)
        };
        offsets.push(end);
    }
    Layout::Offsets {
        offsets,
        include_last_offset,
    }
}

/// The ranges: every SIMD tail, up to 600 ids.
fn small_case() -> impl Strategy<Value = Case> {
    case(1..=300, 1..=70, 0..=600, 64)
}

/// Larger calls: several forward tasks per pool, and hot rows heavy enough
/// that the grouped backward splits them by columns.
fn large_case() -> impl Strategy<Value = Case> {
    case(1..=4_000, 16..=140, 1_200..=4_000, 400)
}

/// Everything one case needs, typed.
struct Data<I> {
    rows: usize,
    dim: usize,
    ids: Vec<I>,
    bags: Bags,
    padding_idx: Option<usize>,
    table: Vec<f32>,
    /// Non-zero (see the module notes).
    weights: Vec<f32>,
    grad_bags: Vec<f32>,
}

impl<I: Index + TryFrom<u64>> Data<I> {
    fn new<O: Index + TryFrom<u64>>(c: &Case) -> Data<I> {
        let bags = match &c.layout {
            Layout::Offsets {
                offsets,
                include_last_offset,
            } => {
                let offsets: Vec<O> = convert(offsets);
                Bags::from_offsets(&offsets, c.ids.len(), *include_last_offset)
                    .expect("the case's offsets are valid")
            }
            Layout::Fixed { bags, size } => Bags::fixed(*bags, *size).unwrap(),
        };
        assert_eq!(bags.num_ids(), c.ids.len());
        let mut rng = SplitMix(c.seed);
        let table = rng.values(c.rows * c.dim);
        let weights = (0..c.ids.len())
            .map(|_| {
                loop {
                    let w = rng.value();
                    if w != 0.0 {
                        break w;
                    }
                }
            })
            .collect();
        let grad_bags = rng.values(bags.len() * c.dim);
        Data {
            rows: c.rows,
            dim: c.dim,
            ids: convert(&c.ids),
            bags,
            padding_idx: c.padding_idx,
            table,
            weights,
            grad_bags,
        }
    }
}

impl<I: Index> Data<I> {
    fn pooling(&self, mode: Mode, weighted: bool) -> Pooling<'_> {
        Pooling {
            mode,
            per_sample_weights: weighted.then_some(&self.weights[..]),
            padding_idx: self.padding_idx,
            scale_grad_by_freq: false,
        }
    }

    fn out_len(&self) -> usize {
        self.bags.len() * self.dim
    }

    fn kept(&self, p: usize) -> bool {
        Some(self.ids[p].to_i128()) != self.padding_idx.map(|r| r as i128)
    }

    /// The positions of bag `b` other than `padding_idx`.
    fn kept_in(&self, b: usize) -> Vec<usize> {
        self.bags
            .bag(b)
            .unwrap()
            .filter(|&p| self.kept(p))
            .collect()
    }

    /// The distinct ids in some bag, less `padding_idx`, ascending.
    fn kept_ids(&self) -> Vec<usize> {
        let mut ids: Vec<usize> = (0..self.bags.len())
            .flat_map(|b| self.kept_in(b))
            .map(|p| self.ids[p].to_i128() as usize)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The forward, serially or on the current pool, into canaries.
    fn forward(&self, par: Parallelism, mode: Mode, weighted: bool) -> (Vec<f32>, Vec<i64>) {
        let mut out = vec![f32::NAN; self.out_len()];
        let mut max_indices = vec![INDEX_CANARY; self.out_len()];
        bag_forward_with(
            par,
            &self.table,
            self.dim,
            &self.ids,
            &self.bags,
            &self.pooling(mode, weighted),
            &mut out,
            &mut max_indices,
        )
        .unwrap();
        (out, max_indices)
    }

    fn reference_forward(&self, mode: Mode, weighted: bool) -> (Vec<f32>, Vec<i64>) {
        let pooling = self.pooling(mode, weighted);
        reference_forward(&self.table, self.dim, &self.ids, &self.bags, &pooling)
    }
}

/// One forward's output and max indices.
type Forward = (Vec<f32>, Vec<i64>);

/// The reference's forward into NaN and index canaries.
fn reference_forward<I: Index>(
    table: &[f32],
    dim: usize,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
) -> Forward {
    let n = bags.len() * dim;
    let mut out = vec![f32::NAN; n];
    let mut indices = vec![INDEX_CANARY; n];
    reference::bag_forward(table, dim, ids, bags, pooling, &mut out, &mut indices).unwrap();
    (out, indices)
}

/// `bag_forward_with` on every path of [`every_path`], each into NaN and
/// index canaries: `(path, (out, max_indices))` per run.
fn forward_on_every_path<I: Index>(
    table: &[f32],
    dim: usize,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    n: usize,
) -> Vec<(String, Forward)> {
    every_path(|par| {
        let mut out = vec![f32::NAN; n];
        let mut indices = vec![INDEX_CANARY; n];
        bag_forward_with(par, table, dim, ids, bags, pooling, &mut out, &mut indices).unwrap();
        (out, indices)
    })
}

/// Runs `run` serially, then with `Rayon` and with `Auto` on every pool,
/// labelling each result.
fn every_path<T: Send>(run: impl Fn(Parallelism) -> T + Sync) -> Vec<(String, T)> {
    let mut all = vec![("serial".to_string(), run(Parallelism::Serial))];
    for pool in pools() {
        let threads = pool.current_num_threads();
        for par in [Parallelism::Rayon, Parallelism::Auto] {
            let got = pool.install(|| run(par));
            all.push((format!("{par:?} on {threads} threads"), got));
        }
    }
    all
}

/// How far apart the kernel's mean `fl(fl(Σx) / n)` and the reference's
/// `fl(Σ fl(x · fl(1/n)))` may be, for `n` values whose magnitudes sum to
/// `abs_sum`. With `u = ε/2` and the sums taken left to right from `-0.0`
/// (the first addition is exact, `n - 1` round):
///
/// * kernel: `|fl(Σx) - Σx| ≤ (n-1)·u·Σ|x|`, and the division adds one
///   relative `u`: within `n·u·Σ|x|/n` of `Σx/n`;
/// * reference: `fl(1/n)` and each product add `2u` relative to each term,
///   the sum `(n-1)·u·Σ|x|/n`: within `(n+1)·u·Σ|x|/n`.
///
/// Together `(2n+1)·u·Σ|x|/n = (n+½)·ε·Σ|x|/n`, to first order in `u`; the
/// bound allows `(n+2)·ε·Σ|x|/n`, which covers the `O(n²u²)` terms for any
/// `n` below about `2^22`. The test values never underflow (the smallest is
/// `2^-36`, a product at least `2^-48`), so no absolute term is needed.
fn mean_bound(n: usize, abs_sum: f64) -> f64 {
    (n as f64 + 2.0) * f64::from(f32::EPSILON) * abs_sum / n as f64
}

/// Forward: sum, weighted sum and max bit for bit against the reference, and
/// mean as the kernel's own sum over the count, near the reference's mean;
/// `max_indices` untouched outside max mode.
fn check_forward<I, O>(c: &Case) -> Result<(), TestCaseError>
where
    I: Index + TryFrom<u64>,
    O: Index + TryFrom<u64>,
{
    let d = Data::<I>::new::<O>(c);
    let untouched = vec![INDEX_CANARY; d.out_len()];
    let mut sum = Vec::new();
    for (mode, weighted) in [(Mode::Sum, false), (Mode::Sum, true), (Mode::Max, false)] {
        let (want, want_indices) = d.reference_forward(mode, weighted);
        let want_indices = if mode == Mode::Max {
            want_indices
        } else {
            untouched.clone()
        };
        for (path, (out, indices)) in every_path(|par| d.forward(par, mode, weighted)) {
            prop_assert_eq!(
                bits(&out),
                bits(&want),
                "{} weighted {} {}",
                mode,
                weighted,
                path
            );
            prop_assert_eq!(&indices, &want_indices, "{} {}", mode, path);
        }
        let mut out = vec![f32::NAN; d.out_len()];
        let mut indices = vec![INDEX_CANARY; d.out_len()];
        let pooling = d.pooling(mode, weighted);
        bag_forward(
            &d.table,
            d.dim,
            &d.ids,
            &d.bags,
            &pooling,
            &mut out,
            &mut indices,
        )
        .unwrap();
        prop_assert_eq!(bits(&out), bits(&want), "plain {}", mode);
        prop_assert_eq!(&indices, &want_indices, "plain {}", mode);
        if mode == Mode::Sum && !weighted {
            sum = out;
        }
    }

    // Mean: exactly the sum over the count, and near the reference.
    let mut exact = vec![0.0f32; d.out_len()];
    let (reference_mean, _) = d.reference_forward(Mode::Mean, false);
    for b in 0..d.bags.len() {
        let kept = d.kept_in(b);
        for j in 0..d.dim {
            let at = b * d.dim + j;
            if kept.is_empty() {
                continue; // +0.0
            }
            exact[at] = sum[at] / kept.len() as f32;
            let abs_sum: f64 = kept
                .iter()
                .map(|&p| f64::from(d.table[d.ids[p].to_i128() as usize * d.dim + j]).abs())
                .sum();
            let bound = mean_bound(kept.len(), abs_sum);
            let error = (f64::from(exact[at]) - f64::from(reference_mean[at])).abs();
            prop_assert!(
                error <= bound,
                "mean of bag {} column {}: {} vs the reference's {} ({} ids, bound {:e})",
                b,
                j,
                exact[at],
                reference_mean[at],
                kept.len(),
                bound
            );
        }
    }
    for (path, (out, indices)) in every_path(|par| d.forward(par, Mode::Mean, false)) {
        prop_assert_eq!(bits(&out), bits(&exact), "mean {}", path);
        prop_assert_eq!(&indices, &untouched, "mean {}", path);
    }
    Ok(())
}

/// The dense gradient of max mode as a plain loop: zeros, then each bag's
/// gradient added to the rows that won, bag by bag, column by column.
fn max_backward_loop(grad_bags: &[f32], dim: usize, max_indices: &[i64], rows: usize) -> Vec<f32> {
    let mut grad = vec![0.0f32; rows * dim];
    for (k, (&g, &i)) in grad_bags.iter().zip(max_indices).enumerate() {
        if i >= 0 {
            grad[i as usize * dim + k % dim] += g;
        }
    }
    grad
}

/// Backward: dense (every row written) and sparse sum, weighted sum and
/// mean against zeros plus the reference; max against a plain loop.
fn check_backward<I, O>(c: &Case) -> Result<(), TestCaseError>
where
    I: Index + TryFrom<u64>,
    O: Index + TryFrom<u64>,
{
    let d = Data::<I>::new::<O>(c);
    let table_len = d.rows * d.dim;
    let kept_ids = d.kept_ids();
    let modes = [(Mode::Sum, false), (Mode::Sum, true), (Mode::Mean, false)];
    for ((mode, weighted), scale_grad_by_freq) in
        modes.into_iter().flat_map(|m| [(m, false), (m, true)])
    {
        let pooling = Pooling {
            scale_grad_by_freq,
            ..d.pooling(mode, weighted)
        };
        let mut want = vec![0.0f32; table_len];
        reference::bag_backward(&d.grad_bags, d.dim, &d.ids, &d.bags, &pooling, &mut want).unwrap();
        let want = bits(&want);
        let dense = every_path(|par| {
            let mut grad = vec![f32::NAN; table_len];
            bag_backward_with(
                par,
                &d.grad_bags,
                d.dim,
                &d.ids,
                &d.bags,
                &pooling,
                &mut grad,
            )
            .unwrap();
            grad
        });
        for (path, grad) in dense {
            prop_assert_eq!(
                &bits(&grad),
                &want,
                "dense {} weighted {} by freq {} {}",
                mode,
                weighted,
                scale_grad_by_freq,
                path
            );
        }
        let sparse = every_path(|par| {
            bag_sparse_backward_with(par, &d.grad_bags, d.dim, &d.ids, &d.bags, &pooling, d.rows)
                .unwrap()
        });
        for (path, grad) in sparse {
            prop_assert_eq!(grad.indices(), &kept_ids[..], "sparse {} {}", mode, path);
            prop_assert_eq!(grad.num_embeddings(), d.rows);
            prop_assert_eq!(grad.embedding_dim(), d.dim);
            let dense = grad.to_dense().unwrap();
            prop_assert_eq!(
                &bits(&dense),
                &want,
                "sparse {} weighted {} by freq {} {}",
                mode,
                weighted,
                scale_grad_by_freq,
                path
            );
        }
    }

    let (_, max_indices) = d.reference_forward(Mode::Max, false);
    let want = bits(&max_backward_loop(
        &d.grad_bags,
        d.dim,
        &max_indices,
        d.rows,
    ));
    for pool in pools() {
        let mut grad = vec![f32::NAN; table_len];
        pool.install(|| bag_max_backward(&d.grad_bags, d.dim, &max_indices, &mut grad))
            .unwrap();
        prop_assert_eq!(
            &bits(&grad),
            &want,
            "max on {} threads",
            pool.current_num_threads()
        );
    }
    Ok(())
}

/// The bad values an id of type `I` can hold, for a table of `rows` rows.
fn bad_ids<I: Index + TryFrom<i128>>(rows: usize) -> Vec<I> {
    let rows = rows as i128;
    [
        rows,
        rows + 7,
        -1,
        -rows,
        i128::from(i32::MIN),
        i128::from(i64::MIN),
        i128::from(u32::MAX),
        i128::from(u64::MAX),
        1 << 32,
    ]
    .into_iter()
    .filter_map(|v| I::try_from(v).ok())
    .collect()
}

/// A bad id planted at `position` (maybe again at the end, and maybe past
/// the last bag): every forward, backward and the reference report the
/// first one, and no buffer changes.
fn check_bad_id<I, O>(c: &Case, position: usize, pick: usize) -> Result<(), TestCaseError>
where
    I: Index + TryFrom<u64> + TryFrom<i128>,
    O: Index + TryFrom<u64>,
{
    let mut d = Data::<I>::new::<O>(c);
    if d.ids.is_empty() {
        return Ok(());
    }
    let candidates = bad_ids::<I>(d.rows);
    let bad = candidates[pick % candidates.len()];
    let position = position % d.ids.len();
    d.ids[position] = bad;
    if pick.is_multiple_of(2) {
        let last = d.ids.len() - 1;
        d.ids[last] = bad;
    }
    let want = Err(EmbeddingError::IndexOutOfRange {
        position,
        index: bad.to_i128(),
        num_embeddings: d.rows,
    });
    let len = d.out_len();
    for (mode, weighted) in [
        (Mode::Sum, false),
        (Mode::Sum, true),
        (Mode::Mean, false),
        (Mode::Max, false),
    ] {
        let pooling = d.pooling(mode, weighted);
        let mut out = vec![f32::NAN; len];
        let mut indices = vec![INDEX_CANARY; len];
        let mut grad = vec![f32::NAN; d.rows * d.dim];
        let got = reference::bag_forward(
            &d.table,
            d.dim,
            &d.ids,
            &d.bags,
            &pooling,
            &mut out,
            &mut indices,
        );
        prop_assert_eq!(&got, &want, "reference {}", mode);
        let got = bag_forward(
            &d.table,
            d.dim,
            &d.ids,
            &d.bags,
            &pooling,
            &mut out,
            &mut indices,
        );
        prop_assert_eq!(&got, &want, "plain {}", mode);
        let results = every_path(|par| {
            let mut out = vec![f32::NAN; len];
            let mut indices = vec![INDEX_CANARY; len];
            let mut grad = vec![f32::NAN; d.rows * d.dim];
            let forward = bag_forward_with(
                par,
                &d.table,
                d.dim,
                &d.ids,
                &d.bags,
                &pooling,
                &mut out,
                &mut indices,
            );
            let backward = (mode != Mode::Max).then(|| {
                (
                    bag_backward_with(
                        par,
                        &d.grad_bags,
                        d.dim,
                        &d.ids,
                        &d.bags,
                        &pooling,
                        &mut grad,
                    ),
                    bag_sparse_backward_with(
                        par,
                        &d.grad_bags,
                        d.dim,
                        &d.ids,
                        &d.bags,
                        &pooling,
                        d.rows,
                    )
                    .map(|_| ()),
                )
            });
            // The layers' allocating forwards, whose tasks check the ids.
            let options = EmbeddingBagOptions {
                mode,
                padding_idx: d.padding_idx.map(|p| p as i64),
                ..EmbeddingBagOptions::default()
            };
            let weights = pooling.per_sample_weights;
            let mut layer = EmbeddingBag::from_pretrained(d.table.clone(), d.dim, true, options)
                .unwrap()
                .with_parallelism(par);
            let quantized = QuantizedEmbeddingBag::from_float(&layer, Format::F16).unwrap();
            let layers = [
                layer.forward(&d.ids, &d.bags, weights).map(|_| ()),
                quantized.forward(&d.ids, &d.bags, weights).map(|_| ()),
            ];
            (forward, backward, out, indices, grad, layers)
        });
        for (path, (forward, backward, out, indices, grad, layers)) in results {
            prop_assert_eq!(&forward, &want, "{} {}", mode, path);
            prop_assert_eq!(&layers[0], &want, "layer {} {}", mode, path);
            prop_assert_eq!(&layers[1], &want, "f16 layer {} {}", mode, path);
            if let Some((dense, sparse)) = backward {
                prop_assert_eq!(&dense, &want, "dense backward {} {}", mode, path);
                prop_assert_eq!(&sparse, &want, "sparse backward {} {}", mode, path);
            }
            prop_assert!(out.iter().all(|x| x.is_nan()), "output written: {}", path);
            prop_assert!(
                indices.iter().all(|&i| i == INDEX_CANARY),
                "indices written: {}",
                path
            );
            prop_assert!(
                grad.iter().all(|x| x.is_nan()),
                "gradient written: {}",
                path
            );
        }
        if mode != Mode::Max {
            let got =
                reference::bag_backward(&d.grad_bags, d.dim, &d.ids, &d.bags, &pooling, &mut grad);
            prop_assert_eq!(&got, &want, "reference backward {}", mode);
        }
        prop_assert!(out.iter().all(|x| x.is_nan()), "output written");
        prop_assert!(
            indices.iter().all(|&i| i == INDEX_CANARY),
            "indices written"
        );
        prop_assert!(grad.iter().all(|x| x.is_nan()), "gradient written");
    }
    Ok(())
}

macro_rules! per_type_pair {
    ($($name:ident: $ids:ident, $offsets:ident;)*) => {$(
        /// Ids of the first type, offsets of the second.
        mod $name {
            use super::*;

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(20))]

                #[test]
                fn forward_equals_reference(c in small_case()) {
                    check_forward::<$ids, $offsets>(&c)?;
                }

                #[test]
                fn backward_equals_reference(c in small_case()) {
                    check_backward::<$ids, $offsets>(&c)?;
                }
            }

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(12))]

                #[test]
                fn first_bad_id_is_reported_and_nothing_written(
                    c in small_case(),
                    position in any::<usize>(),
                    pick in any::<usize>(),
                ) {
                    check_bad_id::<$ids, $offsets>(&c, position, pick)?;
                }
            }
        }
    )*};
}

per_type_pair! {
    u32_ids_i64_offsets: u32, i64;
    i32_ids_u32_offsets: i32, u32;
    u64_ids_i32_offsets: u64, i32;
    i64_ids_usize_offsets: i64, usize;
    usize_ids_u64_offsets: usize, u64;
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4))]

    /// Up to 4 000 ids, rows and 400 offsets, `dim` up to 140: several
    /// forward tasks per pool, hot rows split by columns in the backward.
    /// The type pair rotates with `pair`.
    #[test]
    fn large_calls_equal_reference_on_every_pool(c in large_case(), pair in 0..5u8) {
        match pair {
            0 => { check_forward::<u32, i64>(&c)?; check_backward::<u32, i64>(&c)?; }
            1 => { check_forward::<i32, u32>(&c)?; check_backward::<i32, u32>(&c)?; }
            2 => { check_forward::<u64, i32>(&c)?; check_backward::<u64, i32>(&c)?; }
            3 => { check_forward::<i64, usize>(&c)?; check_backward::<i64, usize>(&c)?; }
            _ => { check_forward::<usize, u64>(&c)?; check_backward::<usize, u64>(&c)?; }
        }
    }

    /// A bad id in a large call: several tasks, most tables large enough
    /// that the bags hint rows ahead, so the layers' tasks check windows
    /// that reach into the next task's bags.
    #[test]
    fn large_calls_report_the_first_bad_id(
        c in large_case(),
        position in any::<usize>(),
        pick in any::<usize>(),
        pair in 0..5u8,
    ) {
        match pair {
            0 => check_bad_id::<u32, i64>(&c, position, pick)?,
            1 => check_bad_id::<i32, u32>(&c, position, pick)?,
            2 => check_bad_id::<u64, i32>(&c, position, pick)?,
            3 => check_bad_id::<i64, usize>(&c, position, pick)?,
            _ => check_bad_id::<usize, u64>(&c, position, pick)?,
        }
    }
}

/// Every forward entry point (serial, split, plain) and the reference
/// return `want`, and neither `out` nor `max_indices` changes.
// The arguments are the forward's own, plus what must come out.
#[allow(clippy::too_many_arguments)]
fn forward_fails<I: Index>(
    table: &[f32],
    dim: usize,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    out_len: usize,
    indices_len: usize,
    want: &EmbeddingError,
) {
    let check = |what: &str, got: Result<(), EmbeddingError>, out: &[f32], indices: &[i64]| {
        assert_eq!(got.as_ref(), Err(want), "{what}");
        assert!(out.iter().all(|x| x.is_nan()), "{what}: output written");
        assert!(
            indices.iter().all(|&i| i == INDEX_CANARY),
            "{what}: max_indices written"
        );
    };
    let mut out = vec![f32::NAN; out_len];
    let mut indices = vec![INDEX_CANARY; indices_len];
    let got = reference::bag_forward(table, dim, ids, bags, pooling, &mut out, &mut indices);
    check("reference", got, &out, &indices);
    let got = bag_forward(table, dim, ids, bags, pooling, &mut out, &mut indices);
    check("plain", got, &out, &indices);
    let results = every_path(|par| {
        let mut out = vec![f32::NAN; out_len];
        let mut indices = vec![INDEX_CANARY; indices_len];
        let got = bag_forward_with(par, table, dim, ids, bags, pooling, &mut out, &mut indices);
        (got, out, indices)
    });
    for (path, (got, out, indices)) in results {
        check(&path, got, &out, &indices);
    }
}

/// The dense backward on every path, the sparse one (for `num_embeddings`
/// rows, unless `None`) and the reference return `want`, and the gradient
/// does not change.
// The arguments are the backward's own, plus what must come out.
#[allow(clippy::too_many_arguments)]
fn backward_fails<I: Index>(
    grad_bags: &[f32],
    dim: usize,
    ids: &[I],
    bags: &Bags,
    pooling: &Pooling<'_>,
    grad_len: usize,
    num_embeddings: Option<usize>,
    want: &EmbeddingError,
) {
    let mut grad = vec![f32::NAN; grad_len];
    let got = reference::bag_backward(grad_bags, dim, ids, bags, pooling, &mut grad);
    assert_eq!(got.as_ref(), Err(want), "reference");
    assert!(
        grad.iter().all(|x| x.is_nan()),
        "reference: gradient written"
    );
    let results = every_path(|par| {
        let mut grad = vec![f32::NAN; grad_len];
        let dense = bag_backward_with(par, grad_bags, dim, ids, bags, pooling, &mut grad);
        let sparse = num_embeddings.map(|rows| {
            bag_sparse_backward_with(par, grad_bags, dim, ids, bags, pooling, rows).map(|_| ())
        });
        (dense, sparse, grad)
    });
    for (path, (dense, sparse, grad)) in results {
        assert_eq!(dense.as_ref(), Err(want), "dense {path}");
        if let Some(sparse) = sparse {
            assert_eq!(sparse.as_ref(), Err(want), "sparse {path}");
        }
        assert!(grad.iter().all(|x| x.is_nan()), "{path}: gradient written");
    }
}

/// Which entry points a row of [`bag_errors`] calls.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Calls {
    /// The forwards ([`forward_fails`]).
    Forward,
    /// The dense and sparse backwards ([`backward_fails`]).
    Backward,
    /// The dense backward only (a wrong `grad_table` length, which the
    /// sparse backward does not take).
    DenseBackward,
    /// The forwards and both backwards.
    Both,
}

/// One bad bag call: [`small`] is a valid one, and each row changes what it
/// is about. The ids are run on every id type that holds them.
struct BagCall {
    calls: Calls,
    /// How many values the table holds (from `SplitMix(5)`).
    table_len: usize,
    dim: usize,
    ids: Vec<i128>,
    bags: Bags,
    mode: Mode,
    /// How many per-sample weights there are, if any.
    weights: Option<usize>,
    padding_idx: Option<usize>,
    out_len: usize,
    indices_len: usize,
    grad_bags_len: usize,
    /// The dense gradient's length.
    grad_len: usize,
    /// The sparse backward's rows.
    num_embeddings: usize,
}

/// Rows 5 × dim 3; ids 0, 1 | (empty) | 2, 3, 4, 1; sum mode.
fn small(calls: Calls) -> BagCall {
    BagCall {
        calls,
        table_len: 15,
        dim: 3,
        ids: vec![0, 1, 2, 3, 4, 1],
        bags: Bags::from_offsets(&[0u32, 2, 2], 6, false).unwrap(),
        mode: Mode::Sum,
        weights: None,
        padding_idx: None,
        out_len: 9,
        indices_len: 9,
        grad_bags_len: 9,
        grad_len: 15,
        num_embeddings: 5,
    }
}

/// Rows 2 × dim 4, bags of `offsets` over `ids`, no gradient rows to spare.
fn two_rows(calls: Calls, mode: Mode, ids: Vec<i128>, bags: Bags) -> BagCall {
    let out_len = bags.len() * 4;
    BagCall {
        calls,
        table_len: 8,
        dim: 4,
        ids,
        bags,
        mode,
        out_len,
        indices_len: out_len,
        grad_bags_len: out_len,
        grad_len: 8,
        num_embeddings: 2,
        ..small(calls)
    }
}

impl BagCall {
    /// This call, changed by `change`.
    fn with(mut self, change: impl FnOnce(&mut Self)) -> Self {
        change(&mut self);
        self
    }
}

/// The first `len` of six non-zero weights, then ones.
fn weights(len: usize) -> Vec<f32> {
    let six = [0.5, -2.0, 1.5, 3.0, -0.25, 4.0];
    (0..len)
        .map(|k| six.get(k).copied().unwrap_or(1.0))
        .collect()
}

fn call_fails_as<I: Index + TryFrom<i128>>(c: &BagCall, want: &EmbeddingError) -> bool {
    let Some(ids) = ids_as::<I>(&c.ids) else {
        return false;
    };
    let table = SplitMix(5).values(c.table_len);
    let grad_bags = SplitMix(6).values(c.grad_bags_len);
    let weights = c.weights.map(weights);
    let pooling = Pooling {
        mode: c.mode,
        per_sample_weights: weights.as_deref(),
        padding_idx: c.padding_idx,
        scale_grad_by_freq: false,
    };
    if matches!(c.calls, Calls::Forward | Calls::Both) {
        let (out, indices) = (c.out_len, c.indices_len);
        forward_fails(&table, c.dim, &ids, &c.bags, &pooling, out, indices, want);
    }
    if c.calls != Calls::Forward {
        let sparse = (c.calls != Calls::DenseBackward).then_some(c.num_embeddings);
        let (grad_len, dim) = (c.grad_len, c.dim);
        backward_fails(
            &grad_bags, dim, &ids, &c.bags, &pooling, grad_len, sparse, want,
        );
    }
    true
}

/// Runs a row of [`bag_errors`] on every id type that holds its ids.
fn bag_call_fails(c: &BagCall, want: &EmbeddingError) {
    let ran = [
        call_fails_as::<u32>(c, want),
        call_fails_as::<i32>(c, want),
        call_fails_as::<u64>(c, want),
        call_fails_as::<i64>(c, want),
        call_fails_as::<usize>(c, want),
    ];
    assert!(ran.contains(&true), "no id type holds {:?}", c.ids);
}

/// Every error of a bag call but the ids' (the property tests plant those),
/// each at its place in the order: the reference, which checks with its
/// own code, and every kernel path must agree.
fn bag_errors() -> Vec<Row<BagCall>> {
    use Calls::{Backward, Both, DenseBackward, Forward};
    use EmbeddingError::{MaxNeedsIndices, PaddingIdxOutOfRange, PerSampleWeightsNeedSum};
    use Mode::{Max, Mean, Sum};
    let mut rows = Vec::new();
    let mut add = |name: String, call: BagCall, want| rows.push(row(name, call, want));
    // per_sample_weights only with sum, checked before max's own
    // MaxNeedsIndices too.
    for mode in [Mean, Max] {
        let call = small(Both).with(|c| (c.mode, c.weights) = (mode, Some(6)));
        add(
            format!("weights, {mode}"),
            call,
            PerSampleWeightsNeedSum { mode },
        );
    }
    // The ids against the bags, which were made for 7.
    for (mode, calls) in [(Sum, Both), (Max, Forward)] {
        let seven = Bags::from_offsets(&[0i64, 2, 2], 7, false).unwrap();
        let call = small(calls).with(|c| (c.mode, c.bags) = (mode, seven));
        add(
            format!("6 ids for 7, {mode}"),
            call,
            mismatch(Operand::Ids, 7, 6),
        );
    }
    for (weights, len) in [(5, 8), (7, 10), (0, 0)] {
        // Per-sample weights: one per id.
        let call = small(Both).with(|c| (c.weights, c.indices_len) = (Some(weights), 0));
        let want = mismatch(Operand::PerSampleWeights, 6, weights);
        add(format!("{weights} weights for 6 ids"), call, want);
        // Output: bags × dim = 9.
        for mode in [Sum, Max] {
            let call = small(Forward).with(|c| (c.mode, c.out_len) = (mode, len));
            add(
                format!("output {len}, {mode}"),
                call,
                mismatch(Operand::Output, 9, len),
            );
        }
        // max_indices: as long as the output in max mode.
        let call = small(Forward).with(|c| (c.mode, c.indices_len) = (Max, len));
        add(
            format!("max_indices {len}"),
            call,
            mismatch(Operand::MaxIndices, 9, len),
        );
        // The backward's grad_bags: bags × dim.
        let call = small(Backward).with(|c| c.grad_bags_len = len);
        add(
            format!("grad_bags {len}"),
            call,
            mismatch(Operand::GradOutput, 9, len),
        );
    }
    // The tables: the forward's, the dense backward's gradient.
    let call = small(Forward).with(|c| c.table_len = 14);
    add(
        "table 14".into(),
        call,
        not_whole_rows(Operand::Table, 14, 3),
    );
    let call = small(Forward).with(|c| (c.dim, c.out_len, c.indices_len) = (0, 0, 0));
    add("table at dim 0".into(), call, zero_dim(Operand::Table, 15));
    let call = small(DenseBackward).with(|c| c.grad_len = 14);
    add(
        "grad_table 14".into(),
        call,
        not_whole_rows(Operand::GradTable, 14, 3),
    );
    // Max's backward takes the forward's winners instead.
    let call = small(Backward).with(|c| c.mode = Max);
    add("max backward".into(), call, MaxNeedsIndices);
    // padding_idx must be a row (reported as an i64, saturated).
    for (padding_idx, reported) in [(5usize, 5i64), (6, 6), (usize::MAX, i64::MAX)] {
        for mode in [Sum, Mean, Max] {
            let calls = if mode == Max { Forward } else { Both };
            let call = small(calls).with(|c| (c.mode, c.padding_idx) = (mode, Some(padding_idx)));
            let want = PaddingIdxOutOfRange {
                padding_idx: reported,
                num_embeddings: 5,
            };
            add(format!("padding_idx {padding_idx}, {mode}"), call, want);
        }
    }
    for mode in [Sum, Mean, Max] {
        // dim 0: no values, no rows, so every id is out of range.
        let bags = Bags::from_offsets(&[0u32], 1, false).unwrap();
        let call = two_rows(Forward, mode, vec![0], bags)
            .with(|c| (c.table_len, c.dim, c.out_len, c.indices_len) = (0, 0, 0, 0));
        add(format!("dim 0 and an id, {mode}"), call, bad_id(0, 0, 0));
        // No bags: nothing to write, but every id is still checked.
        let bags = Bags::from_offsets(&[] as &[i64], 2, false).unwrap();
        let call = two_rows(Forward, mode, vec![1, 2], bags);
        add(format!("no bags, {mode}"), call, bad_id(1, 2, 2));
        // Ids past the last offset belong to no bag, yet are checked.
        let bags = Bags::from_offsets(&[0i32, 1], 3, true).unwrap();
        let calls = if mode == Max { Forward } else { Both };
        let call = two_rows(calls, mode, vec![1, 0, -1], bags);
        add(
            format!("an id past the last bag, {mode}"),
            call,
            bad_id(2, -1, 2),
        );
    }
    rows
}

#[test]
fn every_bag_error_in_order_and_nothing_written() {
    run_table(&bag_errors(), bag_call_fails);
}

/// The calls next to the error rows that must succeed.
#[test]
fn calls_next_to_the_errors_succeed() {
    let table = SplitMix(5).values(15);
    let (ids, bags) = ([0i64, 1, 2, 3, 4, 1], small(Calls::Both).bags);
    // Sum takes per-sample weights (the test of the values is the property
    // test).
    let weights = weights(6);
    let pooling = Pooling {
        mode: Mode::Sum,
        per_sample_weights: Some(&weights),
        ..Pooling::default()
    };
    let mut out = [f32::NAN; 9];
    bag_forward(&table, 3, &ids, &bags, &pooling, &mut out, &mut []).unwrap();
    // max_indices is ignored (and untouched) outside max mode.
    let sum = Pooling::default();
    for len in [0, 8, 10] {
        let mut out = [f32::NAN; 9];
        let mut indices = vec![INDEX_CANARY; len];
        bag_forward(&table, 3, &ids, &bags, &sum, &mut out, &mut indices).unwrap();
        assert!(indices.iter().all(|&i| i == INDEX_CANARY));
    }
    for mode in [Mode::Sum, Mode::Mean, Mode::Max] {
        let pooling = Pooling { mode, ..sum };
        // dim 0: bags without ids are fine.
        let bags = Bags::from_offsets(&[0u32, 0], 0, false).unwrap();
        bag_forward(&[], 0, &[] as &[u32], &bags, &pooling, &mut [], &mut []).unwrap();
        // No bags and valid ids: nothing to write.
        let no_bags = Bags::from_offsets(&[] as &[i64], 2, false).unwrap();
        assert!(no_bags.is_empty());
        let table = [1.0f32; 8];
        bag_forward(&table, 4, &[1u64, 0], &no_bags, &pooling, &mut [], &mut []).unwrap();
    }
}

/// `Bags::from_offsets` over offsets of type `O`, or `None` if one of the
/// values does not fit `O`.
fn offsets_as<O: Index + TryFrom<i128>>(
    values: &[i128],
    num_ids: usize,
    include_last_offset: bool,
) -> Option<Result<Bags, EmbeddingError>> {
    let offsets: Vec<O> = ids_as(values)?;
    Some(Bags::from_offsets(&offsets, num_ids, include_last_offset))
}

/// `Bags::from_offsets` on every offset type that holds `values`.
fn offsets_every_type(
    values: &[i128],
    num_ids: usize,
    include_last_offset: bool,
) -> Vec<Result<Bags, EmbeddingError>> {
    [
        offsets_as::<u32>(values, num_ids, include_last_offset),
        offsets_as::<i32>(values, num_ids, include_last_offset),
        offsets_as::<u64>(values, num_ids, include_last_offset),
        offsets_as::<i64>(values, num_ids, include_last_offset),
        offsets_as::<usize>(values, num_ids, include_last_offset),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Offsets (for 4 ids) and `include_last_offset`.
type OffsetsCall = (Vec<i128>, bool);

fn offsets_errors() -> Vec<Row<OffsetsCall>> {
    use EmbeddingError::{NoOffsets, OffsetsStart};
    let (min, max) = (i128::from(i64::MIN), i128::from(u64::MAX));
    let range = |position, value| EmbeddingError::OffsetOutOfRange {
        position,
        value,
        num_ids: 4,
    };
    let decrease = |position, value, previous| EmbeddingError::OffsetsDecrease {
        position,
        value,
        previous,
    };
    vec![
        row(
            "starts at 1",
            (vec![1, 2], false),
            OffsetsStart { first: 1 },
        ),
        row("starts at 3", (vec![3], true), OffsetsStart { first: 3 }),
        row(
            "starts at the end",
            (vec![4, 4], true),
            OffsetsStart { first: 4 },
        ),
        // A first offset out of range is reported as out of range.
        row("starts at -1", (vec![-1], false), range(0, -1)),
        row("starts past the end", (vec![5, 6], false), range(0, 5)),
        row("a later -1", (vec![0, -1], false), range(1, -1)),
        row("i64::MIN", (vec![0, 2, min], true), range(2, min)),
        row("a later 5", (vec![0, 2, 5], false), range(2, 5)),
        row("u64::MAX", (vec![0, 1, max], true), range(2, max)),
        row("2^32", (vec![0, 1 << 32], false), range(1, 1 << 32)),
        row("3 then 2", (vec![0, 3, 2], false), decrease(2, 2, 3)),
        row("back to 0", (vec![0, 4, 4, 0], true), decrease(3, 0, 4)),
        // The first problem wins.
        row(
            "decrease, then 9",
            (vec![0, 3, 2, 9], false),
            decrease(2, 2, 3),
        ),
        row("9, then a decrease", (vec![0, 9, 2], false), range(1, 9)),
        row(
            "start, then a decrease",
            (vec![2, 1], false),
            OffsetsStart { first: 2 },
        ),
        row("no end offset", (vec![], true), NoOffsets),
    ]
}

/// `Bags::from_offsets` on every offset type that holds the row's offsets
/// returns `want`, and so does a max forward taking its result, as a layer
/// would, without writing.
fn offsets_fail((values, include_last_offset): &OffsetsCall, want: &EmbeddingError) {
    let table = SplitMix(3).values(5 * 3);
    let ids = [0u32, 4, 2, 2];
    let all = offsets_every_type(values, 4, *include_last_offset);
    assert!(!all.is_empty(), "{values:?} fits no offset type");
    for got in all {
        let mut out = [f32::NAN; 6];
        let mut indices = [INDEX_CANARY; 6];
        let pooling = Pooling {
            mode: Mode::Max,
            ..Pooling::default()
        };
        let got = got
            .and_then(|bags| bag_forward(&table, 3, &ids, &bags, &pooling, &mut out, &mut indices));
        assert_eq!(got.as_ref(), Err(want), "{values:?} {include_last_offset}");
        assert!(out.iter().all(|x| x.is_nan()));
        assert!(indices.iter().all(|&i| i == INDEX_CANARY));
    }
}

#[test]
fn every_offsets_error_names_the_offset_and_nothing_is_written() {
    run_table(&offsets_errors(), offsets_fail);
}

#[test]
fn valid_offsets_make_the_bags_pytorch_makes() {
    let ranges = |bags: &Bags| {
        bags.iter()
            .map(|bag| (bag.start, bag.end))
            .collect::<Vec<_>>()
    };
    // Offsets, include_last_offset, the bags as (start, end).
    type Case = (Vec<i128>, bool, Vec<(usize, usize)>);
    let cases: Vec<Case> = vec![
        (vec![], false, vec![]),
        (vec![0], true, vec![]),
        (vec![0], false, vec![(0, 4)]),
        (vec![0, 4], true, vec![(0, 4)]),
        (vec![0, 4], false, vec![(0, 4), (4, 4)]),
        (vec![0, 2], true, vec![(0, 2)]),
        (vec![0, 0, 0], false, vec![(0, 0), (0, 0), (0, 4)]),
        (
            vec![0, 1, 2, 3],
            false,
            vec![(0, 1), (1, 2), (2, 3), (3, 4)],
        ),
        (
            vec![0, 1, 1, 3, 3],
            true,
            vec![(0, 1), (1, 1), (1, 3), (3, 3)],
        ),
    ];
    for (values, include_last_offset, want) in cases {
        for bags in offsets_every_type(&values, 4, include_last_offset) {
            let bags = bags.unwrap();
            assert_eq!(ranges(&bags), want, "{values:?} {include_last_offset}");
            assert_eq!(bags.num_ids(), 4);
            assert_eq!(bags.is_empty(), want.is_empty());
        }
    }
    let fixed = Bags::fixed(3, 2).unwrap();
    assert_eq!(ranges(&fixed), [(0, 2), (2, 4), (4, 6)]);
    assert_eq!(fixed.num_ids(), 6);
    assert_eq!(ranges(&Bags::fixed(2, 0).unwrap()), [(0, 0), (0, 0)]);
    assert_eq!(
        Bags::fixed(usize::MAX, 2),
        Err(EmbeddingError::SizeOverflow {
            count: usize::MAX,
            dim: 2
        })
    );
}

/// A `bag_max_backward` call: `grad_bags`' length, `dim`, `max_indices`'
/// length, `grad_table`'s length.
type MaxBackwardCall = (usize, usize, usize, usize);

/// `bag_max_backward`'s own length checks.
fn max_backward_errors() -> Vec<Row<MaxBackwardCall>> {
    use Operand::{GradOutput, GradTable, MaxIndices};
    vec![
        row("5 max_indices", (6, 3, 5, 15), mismatch(MaxIndices, 6, 5)),
        row("grad_bags 5", (5, 3, 5, 15), mismatch(GradOutput, 3, 5)),
        row(
            "grad_table 14",
            (6, 3, 6, 14),
            not_whole_rows(GradTable, 14, 3),
        ),
        row(
            "grad_bags at dim 0",
            (6, 0, 6, 0),
            mismatch(GradOutput, 0, 6),
        ),
        row("grad_table at dim 0", (0, 0, 0, 3), zero_dim(GradTable, 3)),
    ]
}

#[test]
fn max_backward_lengths_name_the_operand() {
    let grad_bags = [1.0f32; 6];
    let indices = [0i64, 1, 2, 3, 4, 0];
    run_table(&max_backward_errors(), |&(g, dim, i, grad_len), want| {
        let mut grad = vec![f32::NAN; grad_len];
        let got = bag_max_backward(&grad_bags[..g], dim, &indices[..i], &mut grad);
        assert_eq!(got.as_ref(), Err(want));
        assert!(grad.iter().all(|x| x.is_nan()));
    });
}

#[test]
fn max_backward_rejects_indices_that_are_no_row() {
    let (rows, dim) = (5usize, 3);
    let grad_bags = SplitMix(9).values(4 * dim);
    for bad in [-2, rows as i64, rows as i64 + 1, i64::MIN, i64::MAX] {
        for position in 0..grad_bags.len() {
            let mut indices: Vec<i64> = (0..grad_bags.len() as i64).map(|k| k % 6 - 1).collect();
            indices[position] = bad;
            // A later bad index does not hide the first.
            if position + 1 < indices.len() {
                indices[grad_bags.len() - 1] = -3;
            }
            let mut grad = vec![f32::NAN; rows * dim];
            let want = EmbeddingError::IndexOutOfRange {
                position,
                index: i128::from(bad),
                num_embeddings: rows,
            };
            assert_eq!(
                bag_max_backward(&grad_bags, dim, &indices, &mut grad),
                Err(want)
            );
            assert!(grad.iter().all(|x| x.is_nan()), "gradient written");
        }
    }
    // -1 (an empty bag's index) adds nothing: all +0.0.
    let mut grad = vec![f32::NAN; rows * dim];
    bag_max_backward(&grad_bags, dim, &[-1; 12], &mut grad).unwrap();
    assert!(grad.iter().all(|x| x.to_bits() == 0));
}

/// A table for the empty-bag and padding cases, all negative, so that a
/// sum that started from `-0.0` and added nothing would show `-0.0`.
fn negative_table(rows: usize, dim: usize) -> Vec<f32> {
    let mut rng = SplitMix(21);
    (0..rows * dim)
        .map(|_| -(rng.value().abs() + 1.0))
        .collect()
}

#[test]
fn empty_and_all_padding_bags_are_positive_zeros() {
    let rows = 6;
    // Bags: [] [0 3 5] [] [] [5 5] [2] [5] (with padding 5: the last two
    // kept bags hold only padding).
    let ids = [0u32, 3, 5, 5, 5, 2, 5];
    let bags = Bags::from_offsets(&[0i64, 0, 3, 3, 3, 5, 6], ids.len(), false).unwrap();
    let empty = [0, 2, 3];
    let padding_only = [4, 6];
    for dim in [1, 5, 8, 33, 65] {
        let table = negative_table(rows, dim);
        let weights = [2.0f32, -1.0, 3.0, 0.5, -0.5, 4.0, 1.0];
        for padding_idx in [None, Some(5)] {
            for (mode, weighted) in [
                (Mode::Sum, false),
                (Mode::Sum, true),
                (Mode::Mean, false),
                (Mode::Max, false),
            ] {
                let pooling = Pooling {
                    mode,
                    per_sample_weights: weighted.then_some(&weights[..]),
                    padding_idx,
                    scale_grad_by_freq: false,
                };
                let n = bags.len() * dim;
                let (want, want_indices) = reference_forward(&table, dim, &ids, &bags, &pooling);
                let runs = forward_on_every_path(&table, dim, &ids, &bags, &pooling, n);
                for (path, (out, indices)) in runs {
                    let what = format!("dim {dim} {mode} {padding_idx:?} {path}");
                    let zero_bags = empty
                        .iter()
                        .chain(padding_idx.map_or(&[][..], |_| &padding_only[..]));
                    for &b in zero_bags {
                        let row = &out[b * dim..(b + 1) * dim];
                        assert!(
                            row.iter().all(|x| x.to_bits() == 0),
                            "{what}: bag {b} {row:?}"
                        );
                        if mode == Mode::Max {
                            assert!(indices[b * dim..(b + 1) * dim].iter().all(|&i| i == -1));
                        }
                    }
                    if mode != Mode::Max {
                        assert!(indices.iter().all(|&i| i == INDEX_CANARY), "{what}");
                    }
                    if mode != Mode::Mean {
                        assert_eq!(bits(&out), bits(&want), "{what}");
                    }
                    if mode == Mode::Max {
                        assert_eq!(indices, want_indices, "{what}");
                    }
                }
            }
        }
    }
}

#[test]
fn padding_is_left_out_of_the_bag_and_of_the_count() {
    // Eighths: every sum and mean below is exact.
    let (rows, dim) = (4, 9);
    let table: Vec<f32> = (0..rows * dim).map(|k| (k as f32 - 17.0) / 8.0).collect();
    let ids = [3i64, 1, 3, 2, 3];
    let bags = Bags::fixed(1, 5).unwrap();
    let row = |r: usize| &table[r * dim..(r + 1) * dim];
    for (mode, want) in [
        (
            Mode::Sum,
            (0..dim).map(|j| row(1)[j] + row(2)[j]).collect::<Vec<_>>(),
        ),
        (
            Mode::Mean,
            (0..dim).map(|j| (row(1)[j] + row(2)[j]) / 2.0).collect(),
        ),
        (Mode::Max, row(2).to_vec()),
    ] {
        let pooling = Pooling {
            mode,
            per_sample_weights: None,
            padding_idx: Some(3),
            scale_grad_by_freq: false,
        };
        let mut out = vec![f32::NAN; dim];
        let mut indices = vec![INDEX_CANARY; dim];
        bag_forward(&table, dim, &ids, &bags, &pooling, &mut out, &mut indices).unwrap();
        assert_eq!(out, want, "{mode}");
        if mode == Mode::Max {
            assert_eq!(indices, vec![2; dim]);
        } else {
            // The gradient: nothing for the padding row; mean's 1/2 each.
            let grad_bags: Vec<f32> = (0..dim).map(|j| j as f32 + 1.0).collect();
            let mut grad = vec![f32::NAN; rows * dim];
            bag_backward_with(
                Parallelism::Serial,
                &grad_bags,
                dim,
                &ids,
                &bags,
                &pooling,
                &mut grad,
            )
            .unwrap();
            let factor = if mode == Mode::Mean { 0.5 } else { 1.0 };
            for r in 0..rows {
                let want: Vec<f32> = grad_bags
                    .iter()
                    .map(|&g| if r == 1 || r == 2 { g * factor } else { 0.0 })
                    .collect();
                assert_eq!(
                    bits(&grad[r * dim..(r + 1) * dim]),
                    bits(&want),
                    "{mode} row {r}"
                );
            }
        }
    }
}

/// Max keeps, per column, the first strictly largest value: a NaN in the
/// first kept row stays, a later NaN never wins, ties (`-0.0` and `+0.0`
/// included) keep the earlier id, and the padding row never takes part.
#[test]
fn max_nan_and_tie_rules() {
    // Column blocks of the max (8, 4, 2, 1 vectors with AVX, then the
    // padded tail): 45 = 32 + 8 + a tail of 5; 48 = 32 + 16; 136 = 64 + 64
    // + 8; 264 = 4 × 64 + 8. NaN columns in each block.
    for dim in [45, 48, 136, 264] {
        let nan_cols = [3, 31, 33, dim - 5, dim - 1];
        let nan = f32::from_bits(0x7fc0_1234);
        let fill = |v: f32| vec![v; dim];
        let mut first_nan = fill(1.0);
        for &j in &nan_cols {
            first_nan[j] = nan;
        }
        let table: Vec<f32> = [
            first_nan,               // 0: NaN in some columns, 1 elsewhere
            fill(5.0),               // 1
            fill(5.0),               // 2: ties with 1
            fill(-0.0),              // 3
            fill(0.0),               // 4: ties with 3
            fill(f32::NEG_INFINITY), // 5
            fill(100.0),             // 6: the padding row
        ]
        .concat();
        let ids = [
            0u64, 1, // NaN first: NaN where it is, 5 (row 1) elsewhere
            1, 0, // NaN later: never wins
            1, 2, // tie: row 1
            2, 1, // tie: row 2
            3, 4, // -0.0 then +0.0: -0.0, row 3
            4, 3, // +0.0, row 4
            5, // -inf alone
            5, 3, // -0.0 beats -inf
            6, 0, 1, // padding skipped: row 0's NaN is the first kept
            1, 6, // padding skipped: 5
        ];
        let bags =
            Bags::from_offsets(&[0u32, 2, 4, 6, 8, 10, 12, 13, 15, 18], ids.len(), false).unwrap();
        let pooling = Pooling {
            mode: Mode::Max,
            per_sample_weights: None,
            padding_idx: Some(6),
            scale_grad_by_freq: false,
        };
        let n = bags.len() * dim;
        let mut want = Vec::new();
        let mut want_indices = Vec::new();
        let row = |r: usize| table[r * dim..(r + 1) * dim].to_vec();
        let whole = |r: usize| (row(r), vec![r as i64; dim]);
        let nan_first = {
            let (mut v, mut i) = whole(1);
            for &j in &nan_cols {
                (v[j], i[j]) = (nan, 0);
            }
            (v, i)
        };
        for (v, i) in [
            nan_first.clone(),
            whole(1),
            whole(1),
            whole(2),
            whole(3),
            whole(4),
            whole(5),
            whole(3),
            nan_first,
            whole(1),
        ] {
            want.extend(v);
            want_indices.extend(i);
        }
        let (reference_out, reference_indices) =
            reference_forward(&table, dim, &ids, &bags, &pooling);
        assert_eq!(bits(&reference_out), bits(&want), "reference");
        assert_eq!(reference_indices, want_indices, "reference");
        let runs = forward_on_every_path(&table, dim, &ids, &bags, &pooling, n);
        for (path, (out, indices)) in runs {
            assert_eq!(bits(&out), bits(&want), "{path}");
            assert_eq!(indices, want_indices, "{path}");
        }
    }
}

/// `Σ R ⊙ forward(table)` in f64, the forward run serially.
fn loss(
    table: &[f32],
    dim: usize,
    ids: &[i64],
    bags: &Bags,
    pooling: &Pooling<'_>,
    r: &[f32],
) -> f64 {
    let mut out = vec![f32::NAN; bags.len() * dim];
    let mut indices = vec![0; out.len()];
    bag_forward_with(
        Parallelism::Serial,
        table,
        dim,
        ids,
        bags,
        pooling,
        &mut out,
        &mut indices,
    )
    .unwrap();
    weighted_sum(&out, r)
}

/// The loss `Σ R ⊙ out` is linear in the table for sum, weighted sum and
/// mean (and piecewise linear for max), so a central difference has no
/// truncation error: it is the gradient up to the rounding of the forward.
/// Values are eighths, so sums are exact and only mean's division rounds.
#[test]
fn backward_matches_finite_differences() {
    let (rows, dim) = (7, 5);
    let ids = [3i64, 1, 3, 6, 0, 2, 2, 5, 1, 4, 3, 6];
    // Bags [3 1 3] [] [6 0 2 2] [5 1 4]; ids 10 and 11 are past the end.
    let bags = Bags::from_offsets(&[0i64, 3, 3, 7, 10], ids.len(), true).unwrap();
    let mut rng = SplitMix(77);
    let mut eighth = |nonzero: bool| loop {
        let v = (rng.next() % 33) as f32 / 8.0 - 2.0;
        if !nonzero || v != 0.0 {
            break v;
        }
    };
    let table: Vec<f32> = (0..rows * dim).map(|_| eighth(false)).collect();
    let weights: Vec<f32> = (0..ids.len()).map(|_| eighth(true)).collect();
    let r: Vec<f32> = (0..bags.len() * dim).map(|_| eighth(false)).collect();
    for padding_idx in [None, Some(6), Some(3)] {
        for (mode, weighted) in [(Mode::Sum, false), (Mode::Sum, true), (Mode::Mean, false)] {
            let pooling = Pooling {
                mode,
                per_sample_weights: weighted.then_some(&weights[..]),
                padding_idx,
                scale_grad_by_freq: false,
            };
            let mut grad = vec![f32::NAN; rows * dim];
            bag_backward_with(
                Parallelism::Serial,
                &r,
                dim,
                &ids,
                &bags,
                &pooling,
                &mut grad,
            )
            .unwrap();
            let numeric = numeric_gradient(&table, 0..rows * dim, 0.5, |t| {
                loss(t, dim, &ids, &bags, &pooling, &r)
            });
            let what = format!("{mode} weighted {weighted} padding {padding_idx:?}");
            assert_gradient(&what, &grad, &numeric, |_, g, _| 1e-5 * (1.0 + g.abs()));
        }
    }
    // Max: distinct values per column, gaps of 1/8 against a step of 1/64,
    // so no perturbation changes a winner (a row twice in a bag ties with
    // itself): the difference is the gradient exactly.
    let mut table = vec![0.0f32; rows * dim];
    for j in 0..dim {
        for r in 0..rows {
            table[r * dim + j] = ((r * 3 + j * 5) % rows) as f32 / 8.0;
        }
    }
    for padding_idx in [None, Some(2)] {
        let pooling = Pooling {
            mode: Mode::Max,
            per_sample_weights: None,
            padding_idx,
            scale_grad_by_freq: false,
        };
        let mut out = vec![f32::NAN; bags.len() * dim];
        let mut indices = vec![INDEX_CANARY; out.len()];
        bag_forward(&table, dim, &ids, &bags, &pooling, &mut out, &mut indices).unwrap();
        let mut grad = vec![f32::NAN; rows * dim];
        bag_max_backward(&r, dim, &indices, &mut grad).unwrap();
        let numeric = numeric_gradient(&table, 0..rows * dim, 1.0 / 64.0, |t| {
            loss(t, dim, &ids, &bags, &pooling, &r)
        });
        let what = format!("max padding {padding_idx:?}");
        assert_gradient(&what, &grad, &numeric, |_, _, _| 0.0);
    }
}

/// Past `Auto`'s threshold (2 MiB of table and of gathered rows; 2 MiB of
/// gradient) the plain kernels split across the pool. The one-hot reference
/// would need a 8 400 × 8 200 matrix here, so this compares with the serial
/// run, which the property tests pin to the reference.
#[test]
fn auto_past_its_threshold_equals_serial() {
    let (rows, dim, n) = (8_200, 64, 8_400);
    let ids: Vec<i64> = convert(&draw_ids(rows, n, Pattern::Hot, 31));
    let mut rng = SplitMix(31);
    assert!(rows * dim * 4 >= 2 << 20 && n * dim * 4 >= 2 << 20);
    let table = rng.values(rows * dim);
    let weights: Vec<f32> = rng.values(n).into_iter().map(|w| w + 1.0).collect();
    // Bags of 0 to 3 ids, ending past the last offset.
    let mut offsets = vec![0u32];
    while (*offsets.last().unwrap() as usize) < n - 10 {
        offsets.push(offsets.last().unwrap() + (rng.next() % 4) as u32);
    }
    let bags = Bags::from_offsets(&offsets, n, true).unwrap();
    let grad_bags = rng.values(bags.len() * dim);
    let padding_idx = Some(ids[0] as usize);
    for (mode, weighted) in [(Mode::Sum, true), (Mode::Mean, false), (Mode::Max, false)] {
        let pooling = Pooling {
            mode,
            per_sample_weights: weighted.then_some(&weights[..]),
            padding_idx,
            scale_grad_by_freq: mode == Mode::Mean,
        };
        let forward = |par| {
            let mut out = vec![f32::NAN; bags.len() * dim];
            let mut indices = vec![INDEX_CANARY; out.len()];
            bag_forward_with(
                par,
                &table,
                dim,
                &ids,
                &bags,
                &pooling,
                &mut out,
                &mut indices,
            )
            .unwrap();
            (bits(&out), indices)
        };
        let want = forward(Parallelism::Serial);
        for pool in pools() {
            let got = pool.install(|| forward(Parallelism::Auto));
            assert!(
                got == want,
                "{mode} forward on {} threads",
                pool.current_num_threads()
            );
        }
        if mode == Mode::Max {
            continue;
        }
        let backward = |par| {
            let mut grad = vec![f32::NAN; rows * dim];
            bag_backward_with(par, &grad_bags, dim, &ids, &bags, &pooling, &mut grad).unwrap();
            let sparse =
                bag_sparse_backward_with(par, &grad_bags, dim, &ids, &bags, &pooling, rows)
                    .unwrap();
            assert_eq!(bits(&sparse.to_dense().unwrap()), bits(&grad));
            bits(&grad)
        };
        let want = backward(Parallelism::Serial);
        for pool in pools() {
            let got = pool.install(|| backward(Parallelism::Auto));
            assert!(
                got == want,
                "{mode} backward on {} threads",
                pool.current_num_threads()
            );
        }
    }
}

/// The sparse backward allocates no table, so a huge `dim` passes its
/// checks when no id is in a bag; it must then return an empty gradient
/// (the prefetch distance saturates instead of overflowing).
#[test]
fn sparse_backward_with_a_huge_dim_and_nothing_to_group() {
    let bags = Bags::from_offsets(&[0u32], 1, true).unwrap();
    let pooling = Pooling::default();
    for dim in [1 << 62, usize::MAX / 3] {
        let grad =
            bag_sparse_backward_with(Parallelism::Serial, &[], dim, &[0u32], &bags, &pooling, 1)
                .unwrap();
        assert_eq!(grad.nnz_rows(), 0);
    }
}

/// Bags longer than 2^24 ids, where positions are no longer exact as `f32`
/// values (the kernel keeps them as bits): the winners must still be right,
/// both the first kept row (here after a padding id, at position 1) and a
/// row past position 2^24.
#[test]
fn max_of_a_bag_longer_than_2_pow_24_ids() {
    let n = (1 << 24) + 2;
    let late = (1 << 24) + 1;
    let ids: Vec<u32> = (0..n)
        .map(|p| match p {
            0 => 2,
            p if p == late => 1,
            _ => 0,
        })
        .collect();
    // Row 0 wins column 0 from position 1, row 1 column 1 from position
    // 2^24 + 1; row 2 is the padding row and would win both.
    let table = [5.0f32, 1.0, 3.0, 7.0, 100.0, 100.0];
    let bags = Bags::fixed(1, n).unwrap();
    let pooling = Pooling {
        mode: Mode::Max,
        padding_idx: Some(2),
        ..Pooling::default()
    };
    let mut out = [f32::NAN; 2];
    let mut indices = [INDEX_CANARY; 2];
    bag_forward_with(
        Parallelism::Serial,
        &table,
        2,
        &ids,
        &bags,
        &pooling,
        &mut out,
        &mut indices,
    )
    .unwrap();
    assert_eq!(out, [5.0, 7.0]);
    assert_eq!(indices, [0, 1]);
}

/// Tables from 512 KiB up are read with prefetch hints, smaller ones
/// without: sum (plain, weighted, with a padding row) and max give the
/// reference's bits on both sides, serial and on every pool.
#[test]
fn tables_on_both_sides_of_the_prefetch_size_equal_reference() {
    for (rows, dim, table, ids) in around_prefetch_size(31) {
        let weights: Vec<f32> = (0..ids.len()).map(|k| 0.5 + (k % 7) as f32).collect();
        let bags = Bags::fixed(ids.len() / 12, 12).unwrap();
        let n = bags.len() * dim;
        for (mode, weighted, padding_idx) in [
            (Mode::Sum, false, None),
            (Mode::Sum, true, None),
            (Mode::Sum, false, Some(ids[5] as usize)),
            (Mode::Max, false, None),
        ] {
            let pooling = Pooling {
                mode,
                per_sample_weights: weighted.then_some(&weights[..]),
                padding_idx,
                scale_grad_by_freq: false,
            };
            let want = reference_forward(&table, dim, &ids, &bags, &pooling);
            for (path, (out, indices)) in
                forward_on_every_path(&table, dim, &ids, &bags, &pooling, n)
            {
                let what = format!("{rows} × {dim}, {mode:?} {weighted} {padding_idx:?}, {path}");
                assert_eq!(bits(&out), bits(&want.0), "{what}");
                if mode == Mode::Max {
                    assert_eq!(indices, want.1, "{what}");
                }
            }
        }
    }
}
