//! Checks the bag forward (`kernels::bag::bag_forward`, plain and
//! `bag_forward_with(Serial | Rayon | Auto)`, on 1 to 4 threads) against
//! `reference::bag_forward` in every mode: the same `Ok` or error, the same
//! bits for sum (with and without per-sample weights) and max, the
//! reference's winning ids for max, mean within a derived bound of the
//! reference, and every buffer untouched on an error. After a successful
//! forward it also checks that mode's backward, with the same threading:
//! sum and mean (dense into a NaN-filled table, and coalesced sparse) against
//! zeros plus `reference::bag_backward`, max against a plain loop over the
//! bags.
//!
//! # From bytes to a call
//!
//! The first [`BAG_BYTES`] bytes (zeros past the end of a short input) are
//! the bag header, [`Spec`]: the mode, how the ids are cut into bags
//! (random offsets, offsets from three cut points so that most bags are
//! empty, one bag, bags of one id, a 2-D `[bags, size]` input, no offsets),
//! the offsets' type, `include_last_offset` (whose end may leave ids past
//! the last bag), a planted offsets fault (a first offset other than 0, a
//! negative one, one past the end, a huge one, one below its predecessor,
//! or no offsets with `include_last_offset`), per-sample weights (also where
//! they are an error), `padding_idx` (an id of the batch, the last row, or
//! one out of range), `scale_grad_by_freq`, a length fault of the bag's own
//! buffers, quiet NaNs planted in the table for max, and a seed. The rest of
//! the bytes go to the shared decoder of `fuzz/src/lib.rs` (the ids of any
//! type with planted edge ids, the table with ±0, ±inf, subnormals and
//! `f32::MAX`, the pool, the entry point, shape faults).
//!
//! The offsets themselves, the per-sample weights and the backward's
//! gradient come from a SplitMix64 stream seeded by the header's seed, so a
//! short input reaches every shape; the header steers the kind of shape and
//! the faults directly. Offsets are built as `i128` and cast to their type
//! the way a caller's `as` would (a `-1` becomes `u32::MAX`), and an
//! independent restatement of the offsets rules ([`expected_bags`]) must
//! agree with `Bags::from_offsets`: the kernel and the reference both take
//! the checked `Bags`, so only this makes the offsets part differential.
//!
//! # What is compared, and why mean is special
//!
//! The shared harness runs the call under test and the reference on two
//! copies of the pre-filled output (any bits: NaN canaries included) and
//! compares them bit for bit. The bag output is a prefix of that buffer
//! (`bags × dim` values, which fit unless a shape fault shortened it, which
//! then is an `Output` length error), the rest stays as it was.
//!
//! * Sum and max are exact: the kernel adds in position order from `-0.0`
//!   as the reference's matrix product does. Per-sample weights are never 0
//!   or NaN: the reference skips zero coefficients (the kernel adds `x × 0`,
//!   which differs in the sign of a zero and makes NaN of `inf × 0`), and a
//!   NaN weight meeting a NaN value would make the payload depend on the
//!   operand order. The table holds no NaN of the decoder's (their payloads
//!   would meet in sums); max gets quiet NaNs of its own, which only ever
//!   are compared and copied.
//! * Mean: the kernel divides the sum by the count, the reference
//!   multiplies each value by `1/n`. The reference side of the comparison is
//!   therefore the reference's *sum* divided by the count (the kernel's
//!   sum has the same bits, so the kernel's mean must equal it exactly), and
//!   the reference's own mean must lie within `(n+2)·ε·Σ|x|/n` of that
//!   (plus `(n+1)·2^-149` for subnormal results), the bound derived in
//!   `tests/bag.rs`. Bags holding an infinity must agree exactly (both
//!   infinite of one sign, or both NaN); bags whose finite values sum past
//!   `2^127` are not compared (one side may overflow where the other does
//!   not).
//! * `max_indices` are compared with the reference's inside the call under
//!   test, and must keep their canary on an error and outside max mode.
//! * The `Scalar` entry point of the shared decoder (there is no scalar bag
//!   kernel) stands for the plain `bag_forward` with an empty `max_indices`
//!   outside max mode (the contract: ignored, may be empty).
//! * Backward with `scale_grad_by_freq` uses gradients and weights without
//!   subnormal products: a negative sum that underflows to `-0.0` when
//!   divided by its count is written as `-0.0` by the kernel, while the
//!   reference adds it to a zero and gets `+0.0`.
//!
//! # Running
//!
//! ```text
//! cargo fuzz run -s none --no-trace-compares bag -- -len_control=0
//! ```
#![no_main]

use arbitrary::Unstructured;
use embedding_kernels::{
    Bags, Mode, Pooling, bag_backward_with, bag_forward, bag_forward_with, bag_max_backward,
    bag_sparse_backward_with,
};
use embedding_kernels::{EmbeddingError, Parallelism, reference};
use embedding_kernels_fuzz::{
    Agreement, Call, Case, Id, Padding, SplitMix64, Target, Values, Writes, assert_same_bits, run,
};
use libfuzzer_sys::fuzz_target;
use std::sync::Mutex;

/// The bytes of the bag header at the front of an input.
const BAG_BYTES: usize = 16;

/// The most bags a case makes (the reference's bag matrix is
/// `bags × ids`, up to 3000 ids).
const MAX_BAGS: usize = 512;

/// What `max_indices` holds before a call; no winner is ever this.
const INDEX_CANARY: i64 = i64::MIN + 7;

/// Quiet NaNs planted in the table for max: both signs, with payloads.
const QUIET_NANS: [u32; 5] = [
    0x7fc0_0000,
    0xffc0_0000,
    0x7fc0_1234,
    0xffd0_beef,
    0x7fff_ffff,
];

/// Non-zero, non-NaN weights at the edges of `f32`.
const SPECIAL_WEIGHTS: [f32; 8] = [
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::MAX,
    f32::MIN_POSITIVE,
    f32::from_bits(1),
    -f32::from_bits(1),
    1e30,
    -1.0,
];

/// How the ids are cut into bags.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// Offsets drawn from `0..=ids`, sorted.
    Random,
    /// Offsets drawn from three cut points: mostly empty bags.
    Clustered,
    /// One offset: one bag.
    Single,
    /// An offset per id (up to [`MAX_BAGS`]): bags of one.
    Ones,
    /// `Bags::fixed`: a 2-D input (size 0 sometimes).
    Fixed,
    /// No offsets: no bags, or `NoOffsets` with `include_last_offset`.
    Empty,
}

/// An offsets fault planted at a position the header picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OffsetFault {
    None,
    FirstNotZero,
    Negative,
    PastEnd,
    Huge,
    Decrease,
}

/// A length fault of the bag call's own buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LengthFault {
    None,
    /// `per_sample_weights` not one per id.
    Weights,
    /// The output not `bags × dim`.
    Output,
    /// `max_indices` not `bags × dim`.
    MaxIndices,
    /// The bags made for another number of ids than are passed.
    Ids,
}

/// The bag header of an input.
#[derive(Clone, Copy, Debug)]
struct Spec {
    mode: Mode,
    cut: Cut,
    /// How many offsets `Random` and `Clustered` draw; the size of `Fixed`.
    count: usize,
    include_last_offset: bool,
    offset_type: u8,
    offset_fault: OffsetFault,
    fault_at: u8,
    length_fault: LengthFault,
    weighted: bool,
    padding: Padding,
    scale_grad_by_freq: bool,
    nans: u8,
    seed: u64,
}

fn below(u: &mut Unstructured<'_>, n: u8) -> u8 {
    u.int_in_range(0..=n - 1).unwrap_or(0)
}

fn byte(u: &mut Unstructured<'_>) -> u8 {
    u.arbitrary().unwrap_or(0)
}

impl Spec {
    /// An all-zero header: sum over a handful of random bags, `u32`
    /// offsets, no fault, no weights, no padding.
    fn decode(bytes: &[u8]) -> Spec {
        let u = &mut Unstructured::new(bytes);
        let mode = [Mode::Sum, Mode::Mean, Mode::Max][usize::from(below(u, 3))];
        let cut = match below(u, 8) {
            0..=2 => Cut::Random,
            3 => Cut::Clustered,
            4 => Cut::Single,
            5 => Cut::Ones,
            6 => Cut::Fixed,
            _ => Cut::Empty,
        };
        let count = match byte(u) {
            c @ 0xf0.. => 1 + usize::from(c - 0xf0) * 32,
            c => 1 + usize::from(c % 64),
        };
        let include_last_offset = below(u, 2) == 1;
        let offset_type = below(u, 5);
        let offset_fault = match below(u, 16) {
            0..=9 => OffsetFault::None,
            10 => OffsetFault::FirstNotZero,
            11 => OffsetFault::Negative,
            12 => OffsetFault::PastEnd,
            13 => OffsetFault::Huge,
            _ => OffsetFault::Decrease,
        };
        let fault_at = byte(u);
        let length_fault = match below(u, 16) {
            0..=10 => LengthFault::None,
            11 | 12 => LengthFault::Weights,
            13 => LengthFault::Output,
            14 => LengthFault::MaxIndices,
            _ => LengthFault::Ids,
        };
        // Weights for sum most of the time they are asked for; for mean and
        // max only when asked outright (an error).
        let weighted = match below(u, 8) {
            0..=2 => false,
            3..=6 => mode == Mode::Sum,
            _ => true,
        };
        let padding = match below(u, 8) {
            0..=3 => Padding::None,
            4 | 5 => Padding::IdAt(byte(u)),
            6 => Padding::Last,
            _ => Padding::Bad(below(u, 2) == 1),
        };
        let scale_grad_by_freq = below(u, 2) == 1;
        let nans = below(u, 5);
        let seed = u64::from(u.arbitrary::<u32>().unwrap_or(0));
        Spec {
            mode,
            cut,
            count,
            include_last_offset,
            offset_type,
            offset_fault,
            fault_at,
            length_fault,
            weighted,
            padding,
            scale_grad_by_freq,
            nans,
            seed,
        }
    }
}

/// The header of the input being run: the shared harness calls
/// [`Target::call`] on a pool thread and knows nothing of it.
static SPEC: Mutex<Option<Spec>> = Mutex::new(None);

/// What this target draws from the shared SplitMix64 stream besides plain
/// numbers: offsets, weights and gradients.
trait Draws {
    fn wrong(&mut self, len: usize) -> usize;
    fn tame(&mut self) -> f32;
    fn value(&mut self, specials: &[f32]) -> f32;
}

impl Draws for SplitMix64 {
    /// `len` moved by a nonzero amount of at most 16 either way.
    fn wrong(&mut self, len: usize) -> usize {
        let delta = self.below(32) as isize - 16;
        len.saturating_add_signed(if delta == 0 { 1 } else { delta })
    }

    /// A non-zero `k/8 × 2^e`, `e` in -20..=20: products of two of them
    /// and their sums never reach the subnormals.
    fn tame(&mut self) -> f32 {
        let r = self.next_u64();
        let k = (r % 255) as i32 - 127;
        let k = if k == 0 { 1 } else { k };
        let e = ((r >> 8) % 41) as i32 - 20;
        k as f32 / 8.0 * f32::from_bits(((127 + e) as u32) << 23)
    }

    /// Tame values, with one in eight from `specials`.
    fn value(&mut self, specials: &[f32]) -> f32 {
        if specials.is_empty() || self.below(8) != 0 {
            self.tame()
        } else {
            specials[self.below(specials.len() as u64) as usize]
        }
    }
}

/// The bags `Bags::from_offsets` must make of `offsets` (as the values the
/// caller passed), restated from its documentation: each offset in turn must
/// be within `0..=num_ids`, the first must be 0, and none may be below the
/// one before it; the first offset that breaks a rule is reported.
fn expected_bags(
    offsets: &[i128],
    num_ids: usize,
    include_last_offset: bool,
) -> Result<Vec<(usize, usize)>, EmbeddingError> {
    if include_last_offset && offsets.is_empty() {
        return Err(EmbeddingError::NoOffsets);
    }
    for (position, &value) in offsets.iter().enumerate() {
        if value < 0 || value > num_ids as i128 {
            return Err(EmbeddingError::OffsetOutOfRange {
                position,
                value,
                num_ids,
            });
        }
        if position == 0 && value != 0 {
            return Err(EmbeddingError::OffsetsStart { first: value });
        }
        if position > 0 && value < offsets[position - 1] {
            return Err(EmbeddingError::OffsetsDecrease {
                position,
                value,
                previous: offsets[position - 1],
            });
        }
    }
    let starts = offsets.iter().map(|&o| o as usize);
    let ends = offsets[1.min(offsets.len())..]
        .iter()
        .map(|&o| o as usize)
        .chain((!include_last_offset).then_some(num_ids));
    Ok(starts.zip(ends).collect())
}

/// The offsets of a case as `i128`, before they are cast to their type.
fn draw_offsets(spec: &Spec, n: usize, rng: &mut SplitMix64) -> Vec<i128> {
    let n64 = n as u64;
    let mut offsets: Vec<u64> = match spec.cut {
        Cut::Random | Cut::Clustered => {
            let cuts: Vec<u64> = (0..3).map(|_| rng.below(n64 + 1)).collect();
            let mut offsets: Vec<u64> = (1..spec.count)
                .map(|_| match spec.cut {
                    Cut::Random => rng.below(n64 + 1),
                    _ => cuts[rng.below(3) as usize],
                })
                .collect();
            offsets.push(0);
            offsets.sort_unstable();
            offsets
        }
        Cut::Single => vec![0],
        Cut::Ones => (0..n64.min(MAX_BAGS as u64)).collect(),
        Cut::Empty | Cut::Fixed => Vec::new(),
    };
    if spec.include_last_offset && !matches!(spec.cut, Cut::Empty) {
        let last = offsets.last().copied().unwrap_or(0);
        let end = if rng.below(2) == 0 {
            n64
        } else {
            last + rng.below(n64 - last + 1)
        };
        offsets.push(end);
    }
    let mut offsets: Vec<i128> = offsets.into_iter().map(i128::from).collect();
    let n = n as i128;
    let at = |offsets: &Vec<i128>| usize::from(spec.fault_at) % offsets.len().max(1);
    match spec.offset_fault {
        OffsetFault::None => {}
        _ if offsets.is_empty() => offsets.push(1 + rng.below(3) as i128),
        OffsetFault::FirstNotZero => offsets[0] = 1 + rng.below(n.max(1) as u64) as i128,
        OffsetFault::Negative => {
            let k = at(&offsets);
            offsets[k] = -1 - rng.below(3) as i128;
        }
        OffsetFault::PastEnd => {
            let k = at(&offsets);
            offsets[k] = n + 1 + rng.below(3) as i128;
        }
        OffsetFault::Huge => {
            let k = at(&offsets);
            let huge = [
                i128::from(i64::MIN),
                i128::from(u64::MAX),
                1 << 32,
                i128::from(i32::MAX),
                -n,
            ];
            offsets[k] = huge[rng.below(huge.len() as u64) as usize];
        }
        OffsetFault::Decrease => {
            if offsets.len() < 2 {
                offsets.extend([n.min(1), 0]);
            } else {
                let k = 1 + usize::from(spec.fault_at) % (offsets.len() - 1);
                offsets[k] = offsets[k - 1] - 1;
            }
        }
    }
    offsets
}

/// Casts `values` to `O` as a caller's `as` would and makes the bags,
/// checking the result against [`expected_bags`].
fn bags_from<O: Id>(
    values: &[i128],
    num_ids: usize,
    include_last_offset: bool,
) -> Result<Bags, EmbeddingError> {
    let offsets: Vec<O> = values.iter().map(|&v| O::wrap(v)).collect();
    let passed: Vec<i128> = offsets.iter().map(|o| o.to_i128()).collect();
    let got = Bags::from_offsets(&offsets, num_ids, include_last_offset);
    let want = expected_bags(&passed, num_ids, include_last_offset);
    let ranges = got
        .as_ref()
        .map(|b| b.iter().map(|bag| (bag.start, bag.end)).collect::<Vec<_>>())
        .map_err(Clone::clone);
    assert_eq!(
        ranges,
        want,
        "Bags::from_offsets({} offsets {passed:?}, {num_ids}, {include_last_offset})",
        O::NAME
    );
    if let Ok(bags) = &got {
        assert_eq!(bags.num_ids(), num_ids);
    }
    got
}

/// One call's bag arguments, made the same way for the call under test
/// and for the reference.
struct Prepared<'a, I> {
    case: &'a Case<I>,
    spec: Spec,
    ids: &'a [I],
    bags: Bags,
    /// The case's table, with quiet NaNs planted for max.
    table: Vec<f32>,
    weights: Option<Vec<f32>>,
    padding_idx: Option<usize>,
    /// `None` when `bags × dim` overflows (then the whole buffer is passed).
    out_len: Option<usize>,
    indices_len: usize,
    /// For the backward's gradient.
    rng: SplitMix64,
}

impl<'a, I: Id> Prepared<'a, I> {
    /// # Errors
    /// The offsets error of the case, if it has one.
    fn new(case: &'a Case<I>, spec: Spec, buf_len: usize) -> Result<Self, EmbeddingError> {
        let mut rng = SplitMix64(spec.seed);
        let dim = case.dim;
        let rows = case.table.len().checked_div(dim).unwrap_or(0);
        let mut ids = &case.ids[..];
        let n = ids.len();
        // A wrong id count: the bags are made for one id more.
        let num_ids = n + usize::from(spec.length_fault == LengthFault::Ids);
        let bags = if let Cut::Fixed = spec.cut {
            let size = (spec.count - 1) % 9;
            let count = match size {
                0 => usize::from(spec.fault_at % 4),
                _ => (n / size).min(MAX_BAGS),
            };
            if spec.length_fault != LengthFault::Ids {
                ids = &ids[..count * size];
            }
            Bags::fixed(count, size)?
        } else {
            let values = draw_offsets(&spec, n, &mut rng);
            let include_last_offset = spec.include_last_offset;
            match spec.offset_type {
                0 => bags_from::<u32>(&values, num_ids, include_last_offset),
                1 => bags_from::<i32>(&values, num_ids, include_last_offset),
                2 => bags_from::<u64>(&values, num_ids, include_last_offset),
                3 => bags_from::<i64>(&values, num_ids, include_last_offset),
                _ => bags_from::<usize>(&values, num_ids, include_last_offset),
            }?
        };
        let mut table = case.table.clone();
        if spec.mode == Mode::Max && !table.is_empty() {
            for _ in 0..spec.nans {
                let at = rng.below(table.len() as u64) as usize;
                let nan = QUIET_NANS[rng.below(QUIET_NANS.len() as u64) as usize];
                table[at] = f32::from_bits(nan);
            }
        }
        let weights = spec.weighted.then(|| {
            let len = match spec.length_fault {
                LengthFault::Weights => rng.wrong(ids.len()),
                _ => ids.len(),
            };
            // With scale_grad_by_freq the backward needs tame products.
            let specials = if spec.scale_grad_by_freq {
                &[][..]
            } else {
                &SPECIAL_WEIGHTS[..]
            };
            (0..len).map(|_| rng.value(specials)).collect()
        });
        let padding_idx = spec.padding.row(rows, ids);
        let out_len = bags
            .len()
            .checked_mul(dim)
            .map(|len| match spec.length_fault {
                LengthFault::Output => rng.wrong(len),
                _ => len,
            });
        let indices_len = match (out_len, spec.length_fault) {
            (Some(len), LengthFault::MaxIndices) => rng.wrong(len),
            (Some(len), _) => len,
            (None, _) => 0,
        }
        .min(buf_len + 16);
        Ok(Prepared {
            case,
            spec,
            ids,
            bags,
            table,
            weights,
            padding_idx,
            out_len,
            indices_len,
            rng,
        })
    }

    fn pooling(&self) -> Pooling<'_> {
        Pooling {
            mode: self.spec.mode,
            per_sample_weights: self.weights.as_deref(),
            padding_idx: self.padding_idx,
            scale_grad_by_freq: self.spec.scale_grad_by_freq,
        }
    }

    /// The part of `buf` that is the output.
    fn out<'b>(&self, buf: &'b mut [f32]) -> &'b mut [f32] {
        let len = self.out_len.map_or(buf.len(), |len| len.min(buf.len()));
        &mut buf[..len]
    }

    /// What is said about the case when a check fails.
    fn summary(&self) -> String {
        format!(
            "{:?}\n{} bags over {} ids, padding_idx {:?}, weights {:?}\n{}",
            self.spec,
            self.bags.len(),
            self.ids.len(),
            self.padding_idx,
            self.weights.as_ref().map(Vec::len),
            self.case.summary()
        )
    }

    /// The positions of bag `b` other than `padding_idx`.
    fn kept(&self, b: usize) -> impl Iterator<Item = usize> + '_ {
        let padding = self.padding_idx.map(|p| p as i128);
        self.bags
            .bag(b)
            .expect("b < bags.len()")
            .filter(move |&p| Some(self.ids[p].to_i128()) != padding)
    }

    /// The call under test, then (on success) its `max_indices` against
    /// the reference's and its backward.
    fn kernel(mut self, call: Call, buf: &mut [f32]) -> Result<(), EmbeddingError> {
        let mut indices = vec![INDEX_CANARY; self.indices_len];
        let pooling = self.pooling();
        let (table, dim, ids, bags) = (&self.table[..], self.case.dim, self.ids, &self.bags);
        let is_max = self.spec.mode == Mode::Max;
        let out = self.out(buf);
        let result = match call {
            Call::Plain => bag_forward(table, dim, ids, bags, &pooling, out, &mut indices),
            Call::With(par) => {
                bag_forward_with(par, table, dim, ids, bags, &pooling, out, &mut indices)
            }
            Call::Scalar if is_max => {
                bag_forward(table, dim, ids, bags, &pooling, out, &mut indices)
            }
            Call::Scalar => bag_forward(table, dim, ids, bags, &pooling, out, &mut []),
            Call::Reference => unreachable!("the reference has its own path"),
        };
        if result.is_err() || !is_max {
            assert!(
                indices.iter().all(|&i| i == INDEX_CANARY),
                "max_indices written ({result:?})\n{}",
                self.summary()
            );
        }
        if result.is_ok() {
            let out = out.to_vec();
            let par = match call {
                Call::With(par) => par,
                Call::Plain => Parallelism::Auto,
                _ => Parallelism::Serial,
            };
            if is_max {
                self.check_max(&out, &indices);
            } else {
                self.check_backward(par);
            }
        }
        result
    }

    /// Max: the reference's winners, and the backward as a plain loop.
    fn check_max(&mut self, out: &[f32], indices: &[i64]) {
        let mut want_out = vec![0.0; out.len()];
        let mut want = vec![INDEX_CANARY; indices.len()];
        let pooling = self.pooling();
        let dim = self.case.dim;
        reference::bag_forward(
            &self.table,
            dim,
            self.ids,
            &self.bags,
            &pooling,
            &mut want_out,
            &mut want,
        )
        .unwrap_or_else(|e| {
            panic!(
                "the reference fails ({e}) where the kernel did not\n{}",
                self.summary()
            )
        });
        assert_eq!(indices, want, "max_indices differ\n{}", self.summary());
        let grad_bags: Vec<f32> = (0..out.len()).map(|_| self.rng.value(&[-0.0])).collect();
        let mut want = vec![0.0f32; self.table.len()];
        for (k, (&g, &i)) in grad_bags.iter().zip(indices).enumerate() {
            if i >= 0 {
                want[i as usize * dim + k % dim] += g;
            }
        }
        let mut got = vec![f32::NAN; self.table.len()];
        bag_max_backward(&grad_bags, dim, indices, &mut got)
            .unwrap_or_else(|e| panic!("bag_max_backward: {e}\n{}", self.summary()));
        assert_same_bits("bag_max_backward", &got, "the loop", &want, self.case);
    }

    /// Sum and mean: the dense and the sparse backward against zeros plus
    /// the reference, and the sparse gradient's rows.
    fn check_backward(&mut self, par: Parallelism) {
        let dim = self.case.dim;
        if dim == 0 {
            return;
        }
        let specials = if self.spec.scale_grad_by_freq {
            &[][..]
        } else {
            &[f32::INFINITY, -0.0, 0.0, f32::from_bits(1), f32::MAX][..]
        };
        let grad_bags: Vec<f32> = (0..self.bags.len() * dim)
            .map(|_| self.rng.value(specials))
            .collect();
        let pooling = self.pooling();
        let (ids, bags) = (self.ids, &self.bags);
        let rows = self.table.len() / dim;
        let mut want = vec![0.0f32; self.table.len()];
        reference::bag_backward(&grad_bags, dim, ids, bags, &pooling, &mut want)
            .unwrap_or_else(|e| panic!("reference::bag_backward: {e}\n{}", self.summary()));
        let mut got = vec![f32::NAN; self.table.len()];
        bag_backward_with(par, &grad_bags, dim, ids, bags, &pooling, &mut got)
            .unwrap_or_else(|e| panic!("bag_backward_with: {e}\n{}", self.summary()));
        assert_same_bits("bag_backward_with", &got, "the reference", &want, self.case);
        let sparse = bag_sparse_backward_with(par, &grad_bags, dim, ids, bags, &pooling, rows)
            .unwrap_or_else(|e| panic!("bag_sparse_backward_with: {e}\n{}", self.summary()));
        let mut kept: Vec<usize> = (0..bags.len())
            .flat_map(|b| self.kept(b))
            .map(|p| ids[p].to_i128() as usize)
            .collect();
        kept.sort_unstable();
        kept.dedup();
        assert_eq!(sparse.indices(), kept, "sparse rows\n{}", self.summary());
        assert_same_bits(
            "the sparse gradient",
            &sparse.to_dense().unwrap(),
            "the reference",
            &want,
            self.case,
        );
    }

    /// The reference: `reference::bag_forward`, but for mean its sum over
    /// the count (checked against its own mean).
    fn reference(self, buf: &mut [f32]) -> Result<(), EmbeddingError> {
        let mut indices = vec![INDEX_CANARY; self.indices_len];
        let pooling = self.pooling();
        let (table, dim, ids, bags) = (&self.table[..], self.case.dim, self.ids, &self.bags);
        let out = self.out(buf);
        if self.spec.mode != Mode::Mean {
            return reference::bag_forward(table, dim, ids, bags, &pooling, out, &mut indices);
        }
        let mut mean = out.to_vec();
        reference::bag_forward(table, dim, ids, bags, &pooling, &mut mean, &mut indices)?;
        let mut sum = out.to_vec();
        let sum_pooling = Pooling {
            mode: Mode::Sum,
            ..pooling
        };
        reference::bag_forward(table, dim, ids, bags, &sum_pooling, &mut sum, &mut indices)
            .unwrap_or_else(|e| panic!("sum fails ({e}) where mean did not\n{}", self.summary()));
        for b in 0..bags.len() {
            let kept: Vec<usize> = self.kept(b).collect();
            for j in 0..dim {
                let at = b * dim + j;
                let exact = match kept.len() {
                    0 => 0.0,
                    n => sum[at] / n as f32,
                };
                let values: Vec<f32> = kept
                    .iter()
                    .map(|&p| table[ids[p].to_i128() as usize * dim + j])
                    .collect();
                if let Err(why) = mean_agrees(mean[at], exact, &values) {
                    panic!(
                        "reference mean of bag {b} column {j}: {why}\n{}",
                        self.summary()
                    );
                }
                out[at] = exact;
            }
        }
        Ok(())
    }
}

/// Whether the reference's mean `mean` (`Σ x·(1/n)`) agrees with `exact`
/// (`fl(Σx) / n`) for the kept `values` of one bag column; see the notes.
fn mean_agrees(mean: f32, exact: f32, values: &[f32]) -> Result<(), String> {
    let n = values.len();
    if n == 0 {
        return match (mean.to_bits(), exact.to_bits()) {
            (0, 0) => Ok(()),
            _ => Err(format!(
                "an empty bag gives {mean:?} and {exact:?}, not +0.0"
            )),
        };
    }
    let finite: f64 = values
        .iter()
        .filter(|x| x.is_finite())
        .map(|&x| f64::from(x).abs())
        .sum();
    if finite >= 2f64.powi(127) {
        return Ok(());
    }
    if values.iter().any(|x| x.is_infinite()) {
        let same = mean.to_bits() == exact.to_bits() || mean.is_nan() && exact.is_nan();
        return match same {
            true => Ok(()),
            false => Err(format!("{mean:?} vs {exact:?} with an infinity among {n}")),
        };
    }
    let n = n as f64;
    let bound = (n + 2.0) * f64::from(f32::EPSILON) * finite / n + (n + 1.0) * 2f64.powi(-149);
    let error = (f64::from(mean) - f64::from(exact)).abs();
    match error <= bound {
        true => Ok(()),
        false => Err(format!(
            "{mean:?} vs {exact:?}: {error:e} > {bound:e} ({n} values)"
        )),
    }
}

struct Bag;

impl Target for Bag {
    const TABLE: Values = Values::NoNan;
    const PER_ID: Values = Values::AnyBits;
    const WRITES: Writes = Writes::PerId;
    const AGREEMENT: Agreement = Agreement::Exact;

    fn call<I: Id>(case: &Case<I>, call: Call, buf: &mut [f32]) -> Result<(), EmbeddingError> {
        let spec = SPEC
            .lock()
            .unwrap()
            .expect("the header is decoded before the run");
        let prepared = Prepared::new(case, spec, buf.len())?;
        match call {
            Call::Reference => prepared.reference(buf),
            _ => prepared.kernel(call, buf),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let (head, rest) = data.split_at(data.len().min(BAG_BYTES));
    let mut header = [0u8; BAG_BYTES];
    header[..head.len()].copy_from_slice(head);
    *SPEC.lock().unwrap() = Some(Spec::decode(&header));
    run::<Bag>(rest);
});
