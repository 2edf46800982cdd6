//! The benchmark report: every kernel of every workload, against a plain
//! scalar loop, the candle peer and a memcpy of the same bytes.
//!
//! ```text
//! cargo run --release --example report                      # everything
//! cargo run --release --example report -- --workloads recsys --kernels gather
//! cargo run --release --example report -- --json | python3 -m json.tool
//! cargo run --release --example report -- --workloads minilm,gpt2,recsys \
//!     --kernels gather --impls simd_rayon --no-layer --no-formats   # the candle_layer rows
//! cargo run --release --example report -- --markdown docs/report
//! ```
//!
//! The last one also writes `docs/report/report.md` (the tables in
//! markdown, each headed by the date, machine and command) and
//! `docs/report/roofline.svg` (each operation's speed as a share of the
//! same-run memcpy, per workload), both from the run's own measurements
//! (see `markdown.rs`).
//!
//! How a row is measured (all of it in [`measure`], the one timing loop):
//!
//! 1. The kernel, a one-thread memcpy and a pool-wide memcpy of
//!    `num_ids × dim` floats are three *cases*, run round-robin (the first
//!    case rotates every repetition), so the row's roofline comes from the
//!    same seconds of the same, shared, machine as the row itself.
//! 2. Each case is warmed up, then repeated until the row's time budget is
//!    spent (at least [`MIN_REPS`] times) or `--reps` times; the report
//!    gives the median.
//! 3. Only the call itself is timed. Untimed set-up inside a case (zeroing
//!    the gradient before a `scatter_add`, dropping candle's last result)
//!    runs before the clock starts.
//! 4. Before timing, every implementation's result is compared with the
//!    scalar loop's; a difference is printed as a warning.
//!
//! Each workload's data is built once, used for every row, and dropped
//! before the next workload is built (the recsys table alone is 512 MB).

mod candle_layer;
mod command;
#[path = "../../benches/common/mod.rs"]
mod common;
mod formats;
mod layer;
mod markdown;
mod warm_loop;

use candle_core::Tensor;
use clap::{Parser, ValueEnum};
use common::candle_peer::Candle;
use common::{Buffer, Data, WORKLOADS, Workload, table_buffer};
use embedding_kernels::formats::Format;
use embedding_kernels::reference::loops;
use embedding_kernels::{Parallelism, gather_scaled_with, gather_with, scatter_add_with};
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;
use rayon::{ThreadPool, ThreadPoolBuilder};
use serde::Serialize;
use std::borrow::Cow;
use std::error::Error;
use std::hint::black_box;
use std::io::{self, IsTerminal, Write};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Warm-up calls of every case before the timed repetitions.
const WARMUP_REPS: usize = 2;
/// The fewest timed repetitions a row gets under a time budget.
const MIN_REPS: usize = 5;
/// The most timed repetitions a row gets under a time budget.
const MAX_REPS: usize = 100_000;
/// Floats per task when the pool zeroes a gradient (untimed set-up).
const ZERO_CHUNK: usize = 1 << 16;

const BYTES_RULE: &str = "bytes moved (counted): gather, gather_scaled = read ids*dim*4 + write \
ids*dim*4; scatter_add = read grad_output ids*dim*4 + read and write each distinct touched row \
(distinct*dim*4*2); memcpy of L = ids*dim floats = 2*L*4. GB/s = 1e9 bytes/s.";

/// Benchmark report for the embedding kernels: median time, GB/s, share of
/// a same-size memcpy and speed-up over the scalar loop.
#[derive(Parser, Debug)]
#[command(name = "report")]
struct Args {
    /// Workloads to run, comma-separated [default: all]
    /// (tiny, minilm, gpt2, recsys, narrow).
    #[arg(long, value_delimiter = ',', value_parser = parse_workload)]
    workloads: Vec<Workload>,

    /// Kernels to run, comma-separated [default: all].
    #[arg(long, value_delimiter = ',', value_enum)]
    kernels: Vec<Kernel>,

    /// Implementations to run, comma-separated [default: all].
    #[arg(long, value_delimiter = ',', value_enum)]
    impls: Vec<Impl>,

    /// Threads of the local rayon pool used by simd_rayon, the parallel
    /// memcpy and the candle peer [default: available parallelism].
    #[arg(long)]
    threads: Option<NonZeroUsize>,

    /// Timed repetitions per row, instead of the time budget.
    #[arg(long)]
    reps: Option<NonZeroUsize>,

    /// Time budget per row in milliseconds (warm-up excluded; every row
    /// still gets at least 5 repetitions).
    #[arg(long, default_value_t = 500)]
    budget_ms: u64,

    /// Skip the candle peer, and the candle_layer rows.
    #[arg(long)]
    no_peer: bool,

    /// Ops of the candle_layer rows (this crate's candle Embedding against
    /// candle_nn::Embedding and the kernels), comma-separated
    /// [default: all].
    #[arg(long, value_delimiter = ',', value_enum)]
    candle_ops: Vec<candle_layer::CandleOp>,

    /// Skip the candle_layer rows.
    #[arg(long)]
    no_candle_layer: bool,

    /// Layer ops to run, comma-separated [default: all].
    #[arg(long, value_delimiter = ',', value_enum)]
    layer_ops: Vec<layer::LayerOp>,

    /// Skip the layer rows.
    #[arg(long)]
    no_layer: bool,

    /// Table formats of the format rows, comma-separated
    /// [default: f32,f16,bf16,int8,int4] (also int2).
    #[arg(long, value_delimiter = ',', value_parser = parse_format)]
    formats: Vec<Format>,

    /// Ops of the format rows, comma-separated [default: all].
    #[arg(long, value_delimiter = ',', value_enum)]
    format_ops: Vec<formats::FormatOp>,

    /// Skip the format rows.
    #[arg(long)]
    no_formats: bool,

    /// Keep the caches between the cold format rows' calls (`lookup`,
    /// `bag_sum`) instead of evicting them with a read of twice the
    /// last-level caches before each call.
    #[arg(long)]
    keep_caches: bool,

    /// Allocate tables and gradients as plain `vec!`s instead of in
    /// transparent huge pages (`embedding_kernels::memory::zeroed_table`).
    #[arg(long)]
    no_huge_pages: bool,

    /// Only the warm-loop comparison with PyTorch (each side's median of
    /// calls back to back, the two alternating, `--rounds` rounds) over
    /// `--workloads`; needs `--python` with torch.
    #[arg(long = "loop")]
    warm_loop: bool,

    /// Ops of `--loop`, comma-separated [default: all]
    /// (gather, forward, bag_sum, bag_mean, sparse_step, and the bag sum
    /// over reduced-precision tables: bag_sum_f16, bag_sum_bf16,
    /// bag_sum_int8, bag_sum_int4).
    #[arg(long, value_delimiter = ',', value_parser = parse_loop_op)]
    loop_ops: Vec<&'static str>,

    /// Rounds of `--loop`.
    #[arg(long, default_value_t = 3)]
    rounds: usize,

    /// `--loop` with rayon's default global pool, whose threads take each
    /// call while the calling thread waits, instead of a global pool that
    /// counts the calling thread as one of its threads
    /// (`ThreadPoolBuilder::use_current_thread`, as the README advises for
    /// a loop on one thread).
    #[arg(long)]
    caller_waits: bool,

    /// The Python that runs PyTorch's side of `--loop`.
    #[arg(long, default_value = "python3")]
    python: String,

    /// Print one JSON document to stdout (the table goes to stderr).
    #[arg(long)]
    json: bool,

    /// After measuring, also write DIR/report.md (the tables in markdown,
    /// each headed by the date, machine and command) and DIR/roofline.svg
    /// (each operation's speed as a share of the same-run memcpy), e.g.
    /// `--markdown docs/report`.
    #[arg(long, value_name = "DIR")]
    markdown: Option<PathBuf>,
}

fn parse_format(name: &str) -> Result<Format, String> {
    Format::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = Format::ALL.iter().map(|f| f.name()).collect();
        format!("unknown format `{name}` (one of: {})", names.join(", "))
    })
}

fn parse_loop_op(name: &str) -> Result<&'static str, String> {
    let ops = warm_loop::OPS;
    ops.iter()
        .find(|&&op| op == name)
        .copied()
        .ok_or_else(|| format!("unknown loop op `{name}` (one of: {})", ops.join(", ")))
}

fn parse_workload(name: &str) -> Result<Workload, String> {
    Workload::by_name(name).ok_or_else(|| {
        let names: Vec<&str> = WORKLOADS.iter().map(|w| w.name).collect();
        format!("unknown workload `{name}` (one of: {})", names.join(", "))
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
enum Kernel {
    Gather,
    GatherScaled,
    ScatterAdd,
}

impl Kernel {
    const ALL: [Kernel; 3] = [Kernel::Gather, Kernel::GatherScaled, Kernel::ScatterAdd];

    fn name(self) -> &'static str {
        match self {
            Kernel::Gather => "gather",
            Kernel::GatherScaled => "gather_scaled",
            Kernel::ScatterAdd => "scatter_add",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Impl {
    /// `embedding_kernels::reference::loops`, the plain loop.
    Scalar,
    /// The crate's kernel with `Parallelism::Serial`.
    #[value(name = "simd_1t")]
    Simd1t,
    /// The crate's kernel with `Parallelism::Rayon`, in the local pool.
    #[value(name = "simd_rayon")]
    SimdRayon,
    /// candle-core's `index_select` / `index_add`.
    Candle,
}

impl Impl {
    const ALL: [Impl; 4] = [Impl::Scalar, Impl::Simd1t, Impl::SimdRayon, Impl::Candle];

    fn name(self) -> &'static str {
        match self {
            Impl::Scalar => "scalar",
            Impl::Simd1t => "simd_1t",
            Impl::SimdRayon => "simd_rayon",
            Impl::Candle => "candle",
        }
    }
}

// ---------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------

/// How long (or how often) each row is repeated.
struct Budget {
    per_row: Duration,
    reps: Option<usize>,
}

/// Times `f` alone: the only clock reads in the report.
#[inline(never)]
fn timed<R>(f: impl FnOnce() -> R) -> Duration {
    let start = Instant::now();
    black_box(f());
    start.elapsed()
}

/// The one measuring function, used by every row. Each case does its own
/// untimed set-up and returns the time of its timed part (see [`timed`]).
/// The cases are warmed up, then run round-robin, the first case rotating
/// each repetition, until the budget is spent; every case gets the same
/// number of repetitions. Returns each case's times.
fn measure<const N: usize>(
    budget: &Budget,
    mut cases: [&mut dyn FnMut() -> Duration; N],
) -> [Vec<Duration>; N] {
    let mut samples = measure_all(budget, &mut cases).into_iter();
    std::array::from_fn(|_| samples.next().unwrap_or_default())
}

/// [`measure`] over any number of cases (the format rows take one case a
/// format and two memcpys each).
fn measure_all<C: FnMut() -> Duration>(budget: &Budget, cases: &mut [C]) -> Vec<Vec<Duration>> {
    let n = cases.len();
    for _ in 0..WARMUP_REPS {
        for case in cases.iter_mut() {
            case();
        }
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); n];
    let start = Instant::now();
    for rep in 0.. {
        for k in 0..n {
            let i = (rep + k) % n;
            samples[i].push(cases[i]());
        }
        let done = rep + 1;
        let enough = match budget.reps {
            Some(reps) => done >= reps,
            None => done >= MAX_REPS || (done >= MIN_REPS && start.elapsed() >= budget.per_row),
        };
        if enough {
            break;
        }
    }
    samples
}

/// Median, min and max of one case's times, in microseconds.
#[derive(Clone, Copy, Debug, Serialize)]
struct Stats {
    median_us: f64,
    min_us: f64,
    max_us: f64,
    reps: usize,
}

/// The median of sorted values: the mean of the middle two for an even
/// count, NaN for none.
fn median_sorted(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

impl Stats {
    fn of(samples: &[Duration]) -> Stats {
        let mut us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        us.sort_by(f64::total_cmp);
        let n = us.len();
        Stats {
            median_us: median_sorted(&us),
            min_us: us[0],
            max_us: us[n - 1],
            reps: n,
        }
    }

    fn gbps(&self, bytes: usize) -> f64 {
        bytes as f64 / (self.median_us * 1e3)
    }
}

// ---------------------------------------------------------------------------
// The calls being measured
// ---------------------------------------------------------------------------

/// Everything a call reads.
struct Inputs<'a> {
    data: &'a Data,
    scale: f32,
    peer: Option<&'a Candle>,
    pool: &'a ThreadPool,
}

/// Everything a call writes.
struct Outputs {
    out: Vec<f32>,
    grad: Buffer,
    candle: Option<Tensor>,
}

impl Outputs {
    /// Untimed set-up before one call: a zeroed gradient for `scatter_add`
    /// (candle makes its own), and candle's previous result freed.
    fn prepare(&mut self, kernel: Kernel, imp: Impl, pool: &ThreadPool) {
        drop(self.candle.take());
        if kernel == Kernel::ScatterAdd && imp != Impl::Candle {
            let grad = &mut self.grad;
            pool.install(|| grad.par_chunks_mut(ZERO_CHUNK).for_each(|c| c.fill(0.0)));
        }
    }

    /// The result of the last call.
    fn result(&self, kernel: Kernel, imp: Impl) -> candle_core::Result<Cow<'_, [f32]>> {
        Ok(match (&self.candle, imp, kernel) {
            (Some(t), Impl::Candle, _) => Cow::Owned(t.flatten_all()?.to_vec1()?),
            (_, _, Kernel::ScatterAdd) => Cow::Borrowed(&self.grad),
            _ => Cow::Borrowed(&self.out),
        })
    }
}

/// One call of `kernel` by `imp`: the timed region.
fn call(kernel: Kernel, imp: Impl, inp: &Inputs, outs: &mut Outputs) {
    let d = inp.data;
    let dim = d.w.dim;
    let table = black_box(&d.table[..]);
    let ids = black_box(&d.ids[..]);
    let grad_output = black_box(&d.grad_output[..]);
    let (out, grad) = (&mut outs.out[..], &mut outs.grad[..]);
    let mut simd = |par| match kernel {
        Kernel::Gather => gather_with(par, table, dim, ids, out),
        Kernel::GatherScaled => gather_scaled_with(par, table, dim, ids, inp.scale, out),
        Kernel::ScatterAdd => scatter_add_with(par, grad_output, dim, ids, grad),
    };
    let checked = match imp {
        Impl::Scalar => match kernel {
            Kernel::Gather => loops::gather(table, dim, ids, out),
            Kernel::GatherScaled => loops::gather_scaled(table, dim, ids, inp.scale, out),
            Kernel::ScatterAdd => loops::scatter_add(grad_output, dim, ids, grad),
        },
        Impl::Simd1t => simd(Parallelism::Serial),
        Impl::SimdRayon => inp.pool.install(|| simd(Parallelism::Rayon)),
        Impl::Candle => {
            let peer = inp.peer.expect("candle rows run only with the peer built");
            let result = inp.pool.install(|| match kernel {
                Kernel::Gather => peer.gather(),
                Kernel::GatherScaled => peer.gather_scaled(f64::from(inp.scale)),
                Kernel::ScatterAdd => peer.scatter_add(),
            });
            outs.candle = Some(result.expect("candle accepts the workload"));
            Ok(())
        }
    };
    checked.expect("workload ids are in range");
}

/// `Some(max |a - b|)` when `got` differs from `want` in any bit, else
/// `None`.
fn difference(got: &[f32], want: &[f32]) -> Option<f64> {
    if got.len() != want.len() {
        return Some(f64::INFINITY);
    }
    let mut differs = false;
    let mut max = 0.0f64;
    for (a, b) in got.iter().zip(want) {
        if a.to_bits() != b.to_bits() {
            differs = true;
            let diff = (f64::from(*a) - f64::from(*b)).abs();
            max = if diff.is_nan() {
                f64::NAN
            } else {
                max.max(diff)
            };
        }
    }
    differs.then_some(max)
}

// ---------------------------------------------------------------------------
// Rows
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, Serialize)]
struct Row {
    workload: &'static str,
    kernel: &'static str,
    #[serde(rename = "impl")]
    implementation: &'static str,
    #[serde(flatten)]
    stats: Stats,
    bytes: usize,
    gbps: f64,
    /// The faster memcpy of the same bytes, measured interleaved with this
    /// row (for the memcpy rows: over the whole workload).
    roofline_gbps: f64,
    pct_of_roofline: f64,
    speedup_vs_scalar: Option<f64>,
    /// Whether the last call's result equals the scalar loop's bit for bit
    /// (`None` for the memcpy rows).
    matches_scalar: Option<bool>,
    /// The largest absolute difference from the scalar loop's result (0 when
    /// equal, `None` for the memcpy rows).
    max_abs_diff_vs_scalar: Option<f64>,
}

impl Row {
    /// A row with its rates worked out; no speed-up or comparison yet.
    fn new(
        workload: &'static str,
        kernel: &'static str,
        implementation: &'static str,
        stats: Stats,
        bytes: usize,
        roofline_gbps: f64,
    ) -> Row {
        Row {
            workload,
            kernel,
            implementation,
            stats,
            bytes,
            gbps: stats.gbps(bytes),
            roofline_gbps,
            pct_of_roofline: 100.0 * stats.gbps(bytes) / roofline_gbps,
            speedup_vs_scalar: None,
            matches_scalar: None,
            max_abs_diff_vs_scalar: None,
        }
    }
}

/// What to measure, chosen on the command line.
struct Plan {
    kernels: Vec<Kernel>,
    impls: Vec<Impl>,
    layer_ops: Vec<layer::LayerOp>,
    formats: Vec<Format>,
    format_ops: Vec<formats::FormatOp>,
    candle_ops: Vec<candle_layer::CandleOp>,
    budget: Budget,
    huge_pages: bool,
    /// Evicts the caches before the cold format rows' calls (none under
    /// `--keep-caches`, or without format rows).
    evictor: Option<formats::Evictor>,
}

/// The rows of one workload.
struct Measured {
    rows: Vec<Row>,
    layer_rows: Vec<layer::LayerRow>,
    format_rows: Vec<formats::FormatRow>,
    candle_layer_rows: Vec<candle_layer::CandleRow>,
    distinct: usize,
}

/// Measures every (kernel, impl) row and every layer row of one workload.
fn run_workload(
    w: Workload,
    plan: &Plan,
    pool: &ThreadPool,
    pb: &ProgressBar,
) -> Result<Measured, Box<dyn Error>> {
    let (kernels, impls, budget, huge_pages) = (
        &plan.kernels[..],
        &plan.impls[..],
        &plan.budget,
        plan.huge_pages,
    );
    pb.set_message(format!("{}: building data", w.name));
    let data = w.data(huge_pages);
    let distinct = data.distinct_ids();
    let peer = if impls.contains(&Impl::Candle) {
        Some(Candle::new(&data)?)
    } else {
        None
    };
    let inp = Inputs {
        data: &data,
        scale: (w.dim as f32).sqrt(),
        peer: peer.as_ref(),
        pool,
    };
    // With tables in huge pages, the lookups are also timed on a copy of the
    // table in a plain `Vec` (4 KiB pages, 16-byte aligned), as a caller
    // holds one: the `_4k` rows.
    let reads_table = |k: &Kernel| matches!(k, Kernel::Gather | Kernel::GatherScaled);
    let plain = (huge_pages && kernels.iter().any(reads_table)).then(|| Data {
        w,
        table: Buffer::Plain(data.table.to_vec()),
        ids: data.ids.clone(),
        grad_output: Vec::new(),
    });
    let inp_plain = plain.as_ref().map(|data| Inputs { data, ..inp });
    let len = w.num_ids * w.dim;
    let mut outs = Outputs {
        out: vec![0.0; len],
        grad: table_buffer(w.num_embeddings * w.dim, huge_pages),
        candle: None,
    };
    // The roofline: a memcpy of the same number of floats, from the gradient
    // (same size as an output) into buffers of its own.
    let src = &data.grad_output[..];
    let (mut dst_1t, mut dst_par) = (vec![0.0f32; len], vec![0.0f32; len]);
    let part = len.div_ceil(pool.current_num_threads()).max(1);
    let mut memcpy_1t = || {
        timed(|| {
            dst_1t.copy_from_slice(black_box(src));
            black_box(&mut dst_1t);
        })
    };
    let mut memcpy_par = || {
        timed(|| {
            pool.install(|| {
                dst_par
                    .par_chunks_mut(part)
                    .zip(black_box(src).par_chunks(part))
                    .for_each(|(d, s)| d.copy_from_slice(s))
            });
            black_box(&mut dst_par);
        })
    };
    let (mut all_1t, mut all_par) = (Vec::new(), Vec::new());

    let mut rows = Vec::new();
    for &kernel in kernels {
        let bytes = match kernel {
            Kernel::ScatterAdd => w.scatter_add_bytes(distinct),
            Kernel::Gather | Kernel::GatherScaled => w.gather_bytes(),
        };
        // The scalar loop's result, every other one is compared with.
        outs.prepare(kernel, Impl::Scalar, pool);
        call(kernel, Impl::Scalar, &inp, &mut outs);
        let want = outs.result(kernel, Impl::Scalar)?.into_owned();
        let first = rows.len();
        for &imp in impls {
            pb.set_message(format!("{} {} {}", w.name, kernel.name(), imp.name()));
            let plain_name = match imp {
                Impl::Simd1t => Some("simd_1t_4k"),
                Impl::SimdRayon => Some("simd_rayon_4k"),
                _ => None,
            };
            let mut tables = vec![(&inp, imp.name())];
            if let (true, Some(name), Some(plain)) =
                (reads_table(&kernel), plain_name, inp_plain.as_ref())
            {
                tables.push((plain, name));
            }
            for (inp, name) in tables {
                let mut run = || {
                    outs.prepare(kernel, imp, pool);
                    timed(|| call(kernel, imp, inp, &mut outs))
                };
                let [t, t_1t, t_par] = measure(budget, [&mut run, &mut memcpy_1t, &mut memcpy_par]);
                let stats = Stats::of(&t);
                let roof_us = Stats::of(&t_1t).median_us.min(Stats::of(&t_par).median_us);
                all_1t.extend(t_1t);
                all_par.extend(t_par);
                let diff = difference(&outs.result(kernel, imp)?, &want);
                let roofline_gbps = w.memcpy_bytes() as f64 / (roof_us * 1e3);
                rows.push(Row {
                    matches_scalar: Some(diff.is_none()),
                    max_abs_diff_vs_scalar: Some(diff.unwrap_or(0.0)),
                    ..Row::new(w.name, kernel.name(), name, stats, bytes, roofline_gbps)
                });
            }
            pb.inc(1);
        }
        let scalar_us = rows[first..]
            .iter()
            .find(|r| r.implementation == Impl::Scalar.name())
            .map(|r| r.stats.median_us);
        for row in &mut rows[first..] {
            row.speedup_vs_scalar = scalar_us.map(|s| s / row.stats.median_us);
        }
    }

    // The memcpy rows, over every sample the workload took.
    if !all_1t.is_empty() {
        let bytes = w.memcpy_bytes();
        let (s_1t, s_par) = (Stats::of(&all_1t), Stats::of(&all_par));
        let roofline_gbps = s_1t.gbps(bytes).max(s_par.gbps(bytes));
        for (name, stats) in [("1t", s_1t), ("rayon", s_par)] {
            rows.push(Row::new(
                w.name,
                "memcpy",
                name,
                stats,
                bytes,
                roofline_gbps,
            ));
        }
    }
    drop(outs);
    if !plan.layer_ops.is_empty() {
        pb.set_message(format!("{}: layer ops", w.name));
    }
    let layer_rows = layer::run(&data, &plan.layer_ops, budget, huge_pages, pool);
    pb.inc(layer_rows.len() as u64);
    if !plan.formats.is_empty() && !plan.format_ops.is_empty() {
        pb.set_message(format!("{}: formats", w.name));
    }
    let (fmts, fops) = (&plan.formats[..], &plan.format_ops[..]);
    let evictor = plan.evictor.as_ref();
    let format_rows = formats::run(&data, fmts, fops, budget, huge_pages, evictor, pool);
    pb.inc(format_rows.len() as u64);
    if !plan.candle_ops.is_empty() {
        pb.set_message(format!("{}: candle layers", w.name));
    }
    let candle_layer_rows = candle_layer::run(&data, &plan.candle_ops, budget, pool)?;
    pb.inc(candle_layer_rows.len() as u64);
    Ok(Measured {
        rows,
        layer_rows,
        format_rows,
        candle_layer_rows,
        distinct,
    })
}

// ---------------------------------------------------------------------------
// Targets
// ---------------------------------------------------------------------------

#[derive(Debug, Serialize)]
struct Target {
    goal: &'static str,
    /// `None` when the row was not measured in this run.
    value: Option<f64>,
    threshold: f64,
    unit: &'static str,
    /// The goal is `value <= threshold` (else `value >= threshold`).
    at_most: bool,
    met: Option<bool>,
}

impl Target {
    /// The measured value in its unit (`percent` written after a `%`
    /// value) and whether it meets the goal; `None` if not measured.
    fn shown(&self, percent: &str) -> Option<(String, bool)> {
        let (v, met) = (self.value?, self.met?);
        let text = match self.unit {
            "%" => format!("{v:.1}{percent}"),
            "ms" => format!("{v:.2} ms"),
            _ => format!("{v:.2}x"),
        };
        Some((text, met))
    }
}

/// The issues' goals, checked (not asserted) against the simd_rayon rows,
/// the layer, format and candle_layer rows.
fn targets(
    rows: &[Row],
    layer_rows: &[layer::LayerRow],
    format_rows: &[formats::FormatRow],
    candle_rows: &[candle_layer::CandleRow],
) -> Vec<Target> {
    let find_impl = |workload: &str, kernel: Kernel, implementation: &str| {
        rows.iter().find(|r| {
            r.workload == workload
                && r.kernel == kernel.name()
                && r.implementation == implementation
        })
    };
    let find = |workload: &str, kernel: Kernel| find_impl(workload, kernel, Impl::SimdRayon.name());
    let op = |workload: &str, op: layer::LayerOp| {
        layer_rows
            .iter()
            .find(|r| r.workload == workload && r.op == op.name())
    };
    let vs_f32 = |workload: &str, format: Format| {
        format_rows
            .iter()
            .find(|r| {
                r.workload == workload
                    && r.op == formats::FormatOp::BagSum.name()
                    && r.format == format.name()
            })
            .and_then(|r| r.time_vs_f32)
    };
    use candle_layer::CandleOp;
    let candle = |workload: &str, op: CandleOp| {
        candle_rows
            .iter()
            .find(|r| r.workload == workload && r.op == op.name())
    };
    let vs_candle_nn = |workload: &str, op| candle(workload, op).map(|r| r.speedup_vs_candle_nn);
    // The largest overhead over issue 15's three workloads, of those measured.
    let worst_vs_kernel = |op| {
        ["minilm", "gpt2", "recsys"]
            .iter()
            .filter_map(|w| candle(w, op))
            .map(|r| r.time_vs_kernel)
            .reduce(f64::max)
    };
    let goals: [(&str, Option<f64>, f64, &str, bool); 29] = [
        (
            "recsys gather (simd_rayon) >= 50% of memcpy roofline",
            find("recsys", Kernel::Gather).map(|r| r.pct_of_roofline),
            50.0,
            "%",
            false,
        ),
        (
            "recsys gather (simd_rayon), table in huge pages, >= 85% of memcpy roofline",
            find("recsys", Kernel::Gather).map(|r| r.pct_of_roofline),
            85.0,
            "%",
            false,
        ),
        (
            "recsys gather (simd_rayon_4k), table a plain Vec, >= 70% of memcpy roofline",
            find_impl("recsys", Kernel::Gather, "simd_rayon_4k").map(|r| r.pct_of_roofline),
            70.0,
            "%",
            false,
        ),
        (
            "recsys scatter_add into a zeroed gradient (simd_rayon) >= 40% of memcpy roofline",
            find("recsys", Kernel::ScatterAdd).map(|r| r.pct_of_roofline),
            40.0,
            "%",
            false,
        ),
        (
            "minilm scatter_add simd_rayon >= 1.5x scalar",
            find("minilm", Kernel::ScatterAdd).and_then(|r| r.speedup_vs_scalar),
            1.5,
            "x",
            false,
        ),
        (
            "recsys dense_backward time <= 1.5x a same-run memset of the gradient",
            op("recsys", layer::LayerOp::DenseBackward).map(|r| 1.0 / r.speedup_vs_baseline),
            1.5,
            "x",
            true,
        ),
        (
            "recsys sparse_sgd >= 5x faster than dense backward + dense SGD step",
            op("recsys", layer::LayerOp::SparseSgd).map(|r| r.speedup_vs_baseline),
            5.0,
            "x",
            false,
        ),
        (
            "gpt2 token_position <= 30.7 ms (1/3 of PyTorch 2.15's 92 ms quoted by the issue)",
            op("gpt2", layer::LayerOp::TokenPosition).map(|r| r.stats.median_us / 1e3),
            92.0 / 3.0,
            "ms",
            true,
        ),
        (
            "recsys bag_sum >= 80% of a same-run memcpy of the rows it reads",
            op("recsys", layer::LayerOp::BagSum).map(|r| 100.0 * r.speedup_vs_baseline),
            80.0,
            "%",
            false,
        ),
        (
            "recsys bag_sum_warm <= 2.1 ms (PyTorch 2.15 quoted by the issue, checked warm)",
            op("recsys", layer::LayerOp::BagSumWarm).map(|r| r.stats.median_us / 1e3),
            2.1,
            "ms",
            true,
        ),
        (
            "minilm bag_sum_warm <= 0.33 ms (PyTorch 2.15, quoted)",
            op("minilm", layer::LayerOp::BagSumWarm).map(|r| r.stats.median_us / 1e3),
            0.33,
            "ms",
            true,
        ),
        (
            "gpt2 bag_sum_warm <= 2.6 ms (PyTorch 2.15, quoted)",
            op("gpt2", layer::LayerOp::BagSumWarm).map(|r| r.stats.median_us / 1e3),
            2.6,
            "ms",
            true,
        ),
        (
            "recsys bag_max <= 6.0 ms (1/10 of PyTorch 2.15's 60 ms, quoted)",
            op("recsys", layer::LayerOp::BagMax).map(|r| r.stats.median_us / 1e3),
            6.0,
            "ms",
            true,
        ),
        (
            "minilm bag_max <= 1.34 ms (1/10 of PyTorch 2.15's 13.4 ms, quoted)",
            op("minilm", layer::LayerOp::BagMax).map(|r| r.stats.median_us / 1e3),
            1.34,
            "ms",
            true,
        ),
        (
            "recsys bag_sum_fwd_bwd <= 51.2 ms (1/5 of PyTorch 2.15's 256 ms, quoted)",
            op("recsys", layer::LayerOp::BagSumFwdBwd).map(|r| r.stats.median_us / 1e3),
            51.2,
            "ms",
            true,
        ),
        (
            "recsys bag_sum on int8 rows <= 0.40x the f32 bag_sum's time",
            vs_f32("recsys", Format::Int8),
            0.40,
            "x",
            true,
        ),
        (
            "recsys bag_sum on f16 rows <= 0.55x the f32 bag_sum's time",
            vs_f32("recsys", Format::F16),
            0.55,
            "x",
            true,
        ),
        (
            "recsys bag_sum on bf16 rows <= 0.55x the f32 bag_sum's time",
            vs_f32("recsys", Format::Bf16),
            0.55,
            "x",
            true,
        ),
        (
            "recsys bag_sum on int4 rows <= 0.35x the f32 bag_sum's time",
            vs_f32("recsys", Format::Int4),
            0.35,
            "x",
            true,
        ),
        (
            "minilm bag_sum_fwd_bwd <= 9.8 ms (1/5 of PyTorch 2.15's 49 ms, quoted)",
            op("minilm", layer::LayerOp::BagSumFwdBwd).map(|r| r.stats.median_us / 1e3),
            9.8,
            "ms",
            true,
        ),
        (
            "minilm candle Embedding forward >= 3x candle_nn::Embedding's speed",
            vs_candle_nn("minilm", CandleOp::Forward),
            3.0,
            "x",
            false,
        ),
        (
            "gpt2 candle Embedding forward >= 3x candle_nn::Embedding's speed",
            vs_candle_nn("gpt2", CandleOp::Forward),
            3.0,
            "x",
            false,
        ),
        (
            "recsys candle Embedding forward >= 3x candle_nn::Embedding's speed",
            vs_candle_nn("recsys", CandleOp::Forward),
            3.0,
            "x",
            false,
        ),
        (
            "minilm candle Embedding backward >= 20x candle_nn::Embedding's speed",
            vs_candle_nn("minilm", CandleOp::Backward),
            20.0,
            "x",
            false,
        ),
        (
            "gpt2 candle Embedding backward >= 20x candle_nn::Embedding's speed",
            vs_candle_nn("gpt2", CandleOp::Backward),
            20.0,
            "x",
            false,
        ),
        (
            "recsys candle Embedding backward >= 20x candle_nn::Embedding's speed",
            vs_candle_nn("recsys", CandleOp::Backward),
            20.0,
            "x",
            false,
        ),
        (
            "candle Embedding forward <= 1.10x the kernel's time (worst of minilm/gpt2/recsys)",
            worst_vs_kernel(CandleOp::Forward),
            1.10,
            "x",
            true,
        ),
        (
            "candle Embedding backward <= 1.10x the kernel's time (worst of the three)",
            worst_vs_kernel(CandleOp::Backward),
            1.10,
            "x",
            true,
        ),
        (
            "candle Embedding fwd_bwd <= 1.10x the kernels' time (worst of the three)",
            worst_vs_kernel(CandleOp::FwdBwd),
            1.10,
            "x",
            true,
        ),
    ];
    goals
        .into_iter()
        .map(|(goal, value, threshold, unit, at_most)| Target {
            goal,
            value,
            threshold,
            unit,
            at_most,
            met: value.map(|v| {
                if at_most {
                    v <= threshold
                } else {
                    v >= threshold
                }
            }),
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

#[derive(Debug, Serialize)]
struct Machine {
    cpu: String,
    available_parallelism: usize,
    pool_threads: usize,
    simd: String,
    /// Whether tables and gradients were allocated in transparent huge pages.
    huge_pages: bool,
    release_build: bool,
    loadavg_at_start: Option<String>,
    loadavg_at_end: Option<String>,
}

#[derive(Debug, Serialize)]
struct WorkloadInfo {
    name: &'static str,
    num_embeddings: usize,
    dim: usize,
    num_ids: usize,
    distinct_ids: usize,
}

#[derive(Debug, Serialize)]
struct Report {
    command: String,
    machine: Machine,
    budget_ms_per_row: Option<u64>,
    reps_per_row: Option<usize>,
    bytes_rule: &'static str,
    workloads: Vec<WorkloadInfo>,
    rows: Vec<Row>,
    layer_rows: Vec<layer::LayerRow>,
    format_rows: Vec<formats::FormatRow>,
    /// Bytes read to evict the caches before each cold format call (none
    /// under `--keep-caches`).
    format_eviction_bytes: Option<usize>,
    candle_layer_rows: Vec<candle_layer::CandleRow>,
    targets: Vec<Target>,
    wall_seconds: f64,
}

fn machine(pool_threads: usize, huge_pages: bool) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
        .map_or_else(|| "unknown".to_string(), |(_, m)| m.trim().to_string());
    // The kernels choose their registers at run time: the widest the CPU
    // has, or the lower level `EMBEDDING_KERNELS_ISA` names.
    let simd = match embedding_kernels::instruction_set() {
        "avx512" => "512-bit AVX-512F registers (sixteen lanes), chosen at run time",
        "avx2" => "256-bit AVX registers with AVX2, FMA and F16C, chosen at run time",
        _ if cfg!(target_feature = "sse2") => "f32x8 as 2x128-bit SSE2 (portable lanes)",
        _ => "f32x8 as the build targets",
    };
    let simd = match std::env::var("EMBEDDING_KERNELS_ISA") {
        Ok(cap) => format!("{simd} (EMBEDDING_KERNELS_ISA={cap})"),
        Err(_) => simd.to_string(),
    };
    Machine {
        cpu,
        available_parallelism: std::thread::available_parallelism().map_or(1, |n| n.get()),
        pool_threads,
        simd,
        huge_pages,
        release_build: !cfg!(debug_assertions),
        loadavg_at_start: loadavg(),
        loadavg_at_end: None,
    }
}

/// The 1, 5 and 15 minute load averages, where the system tells them.
fn loadavg() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(
        text.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// `--loop`: the warm-loop comparison alone, its table on stdout (and in
/// DIR/warm_loop.md with `--markdown DIR`).
fn run_loop(args: &Args, workloads: &[Workload]) -> Result<(), Box<dyn Error>> {
    let ops = or_all(&args.loop_ops, &warm_loop::OPS);
    let threads = args.threads.map(NonZeroUsize::get);
    if let Some(dir) = &args.markdown {
        std::fs::create_dir_all(dir)?;
    }
    let command = command::line();
    let cpu = machine(1, false).cpu;
    eprintln!(
        "{:5} {:8} {:12} {:>10} {:>10} {:>7}",
        "round", "workload", "op", "torch ms", "ours ms", "ratio"
    );
    let pool = warm_loop::Pool {
        threads,
        caller_works: !args.caller_waits,
    };
    let report = warm_loop::run(workloads, &ops, args.rounds, &args.python, pool, |c| {
        eprintln!(
            "{:5} {:8} {:12} {:10.4} {:10.4} {:7.2}",
            c.round, c.workload, c.op, c.torch.ms, c.ours.ms, c.ratio
        )
    })?;
    let p = &report.peer;
    let head = format!(
        "Warm loop, {}, `{command}`: {cpu}, {} threads ({}); PyTorch {} ({} threads, {}).\n\n",
        markdown::utc_now(),
        report.threads,
        if args.caller_waits {
            "rayon's default global pool: the calling thread waits"
        } else {
            "the calling thread one of them"
        },
        p.torch,
        p.threads,
        p.capability
    );
    let table = warm_loop::markdown(&report, workloads, &ops);
    println!("{head}{table}");
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    if let Some(dir) = &args.markdown {
        let path = dir.join("warm_loop.md");
        std::fs::write(
            &path,
            format!("# Warm loop against PyTorch\n\n{head}{table}"),
        )?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn header(out: &mut dyn Write, cmd: &str, m: &Machine, budget: &Budget) -> io::Result<()> {
    writeln!(out, "embedding-kernels benchmark report")?;
    writeln!(out, "command : {cmd}")?;
    writeln!(
        out,
        "machine : {} | {} CPUs available | rayon pool of {} threads (local pool)",
        m.cpu, m.available_parallelism, m.pool_threads
    )?;
    writeln!(out, "simd    : {}", m.simd)?;
    writeln!(
        out,
        "memory  : {}",
        if m.huge_pages {
            "tables and gradients in transparent huge pages (memory::zeroed_table; --no-huge-pages for plain vec!)"
        } else {
            "tables and gradients in plain vec! allocations (4 KiB pages)"
        }
    )?;
    if !m.release_build {
        writeln!(
            out,
            "WARNING : debug build, the numbers mean nothing (use --release)"
        )?;
    }
    if let Some(load) = &m.loadavg_at_start {
        writeln!(
            out,
            "load    : {load} (1/5/15 min, at start; the machine is shared)"
        )?;
    }
    let reps = match budget.reps {
        Some(r) => format!("{r} timed repetitions per row"),
        None => format!(
            "repetitions per row for ~{} ms (at least {MIN_REPS})",
            budget.per_row.as_millis()
        ),
    };
    writeln!(
        out,
        "timing  : median; {WARMUP_REPS} warm-up calls, then {reps}, round-robin with the memcpys"
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<8} {:<13} {:<13} {:>11} {:>7} {:>9} {:>7} {:>9} {:>6}",
        "workload",
        "kernel",
        "impl",
        "median µs",
        "GB/s",
        "roof GB/s",
        "% roof",
        "vs scalar",
        "reps"
    )?;
    Ok(())
}

fn workload_block(
    out: &mut dyn Write,
    w: &Workload,
    distinct: usize,
    rows: &[Row],
) -> io::Result<()> {
    let mb = |bytes: usize| bytes as f64 / (1 << 20) as f64;
    writeln!(
        out,
        "-- {}: {} x {} table ({:.0} MB), {} ids ({} distinct), output {:.1} MB",
        w.name,
        w.num_embeddings,
        w.dim,
        mb(w.num_embeddings * w.dim * 4),
        w.num_ids,
        distinct,
        mb(w.out_bytes())
    )?;
    for r in rows {
        let speedup = r
            .speedup_vs_scalar
            .map_or("-".to_string(), |s| format!("{s:.2}x"));
        let flag = match (r.matches_scalar, r.max_abs_diff_vs_scalar) {
            (Some(false), Some(d)) => format!("  DIFFERS from scalar (max |diff| {d:e})"),
            _ => String::new(),
        };
        writeln!(
            out,
            "{:<8} {:<13} {:<13} {:>11.1} {:>7.2} {:>9.2} {:>6.1}% {:>9} {:>6}{flag}",
            r.workload,
            r.kernel,
            r.implementation,
            r.stats.median_us,
            r.gbps,
            r.roofline_gbps,
            r.pct_of_roofline,
            speedup,
            r.stats.reps
        )?;
    }
    Ok(())
}

fn footer(out: &mut dyn Write, report: &Report) -> io::Result<()> {
    let threads = report.machine.pool_threads;
    writeln!(
        out,
        "
bytes moved, counted (not measured):
  gather, gather_scaled: read ids*dim*4 + write ids*dim*4
  scatter_add: read grad_output ids*dim*4 + read and write each distinct touched row (distinct*dim*4*2)
  memcpy of L = ids*dim floats: 2*L*4.  GB/s = 1e9 bytes/s
roof GB/s: the faster median of a memcpy of ids*dim floats on 1 thread and split over {threads} threads,
  measured round-robin with that row; the memcpy rows pool all of a workload's memcpy samples
vs scalar: scalar median / row median. scalar = reference::loops, simd_1t = Parallelism::Serial,
  simd_rayon = Parallelism::Rayon in the local pool, _4k = the same on a copy of the table in a
  plain Vec (4 KiB pages), candle = candle-core index_select / index_add
scatter_add: the gradient is zeroed before every repetition, outside the timed region; candle's
  index_add returns a new tensor, so its time includes allocating and copying the whole zeroed table
gather_scaled for candle is index_select then affine (two passes); bytes use the one-pass rule"
    )?;
    let diffs = report
        .rows
        .iter()
        .filter(|r| r.matches_scalar == Some(false))
        .count();
    if diffs > 0 {
        writeln!(
            out,
            "WARNING: {diffs} row(s) differ from the scalar loop's result (marked above)"
        )?;
    }
    if !report.layer_rows.is_empty() {
        writeln!(out)?;
        layer::header(out)?;
        layer::block(out, &report.layer_rows)?;
        writeln!(out)?;
        writeln!(out, "{}", layer::LEGEND)?;
    }
    if !report.format_rows.is_empty() {
        writeln!(out)?;
        formats::header(out)?;
        formats::block(out, &report.format_rows)?;
        writeln!(out)?;
        writeln!(out, "{}", formats::LEGEND)?;
        if formats::has_cold_rows(&report.format_rows) {
            writeln!(
                out,
                "{}",
                formats::caches_line(report.format_eviction_bytes)
            )?;
        }
    }
    if !report.candle_layer_rows.is_empty() {
        writeln!(out)?;
        candle_layer::header(out)?;
        candle_layer::block(out, &report.candle_layer_rows)?;
        writeln!(out)?;
        writeln!(out, "{}", candle_layer::LEGEND)?;
    }
    writeln!(out)?;
    writeln!(out, "targets (checked, not asserted):")?;
    for t in &report.targets {
        let (value, verdict) = match t.shown("%") {
            Some((v, met)) => (v, if met { "met" } else { "NOT MET" }),
            None => ("-".to_string(), "not measured in this run"),
        };
        writeln!(out, "  {:<82} {:>7}  {verdict}", t.goal, value)?;
    }
    writeln!(out)?;
    write!(out, "wall time: {:.1} s", report.wall_seconds)?;
    match &report.machine.loadavg_at_end {
        Some(load) => writeln!(out, "; load at end: {load}")?,
        None => writeln!(out)?,
    }
    Ok(())
}

/// The chosen items, or all of them when none were chosen.
fn or_all<T: Clone>(chosen: &[T], all: &[T]) -> Vec<T> {
    match chosen {
        [] => all.to_vec(),
        _ => chosen.to_vec(),
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let started = Instant::now();
    let args = Args::parse();
    let workloads: Vec<Workload> = or_all(&args.workloads, &WORKLOADS);
    if args.warm_loop {
        return run_loop(&args, &workloads);
    }
    let kernels: Vec<Kernel> = or_all(&args.kernels, &Kernel::ALL);
    let mut impls: Vec<Impl> = or_all(&args.impls, &Impl::ALL);
    if args.no_peer {
        impls.retain(|&i| i != Impl::Candle);
    }
    let threads = args
        .threads
        .or_else(|| std::thread::available_parallelism().ok())
        .map_or(1, NonZeroUsize::get);
    let pool = ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("report-{i}"))
        .build()?;
    let layer_ops = if args.no_layer {
        Vec::new()
    } else {
        or_all(&args.layer_ops, &layer::LayerOp::ALL)
    };
    let (formats, format_ops) = if args.no_formats {
        (Vec::new(), Vec::new())
    } else {
        (
            or_all(&args.formats, &formats::DEFAULT_FORMATS),
            or_all(&args.format_ops, &formats::FormatOp::ALL),
        )
    };
    // The candle_layer rows are candle's too: --no-peer skips them.
    let candle_ops = if args.no_candle_layer || args.no_peer {
        Vec::new()
    } else {
        or_all(&args.candle_ops, &candle_layer::CandleOp::ALL)
    };
    let cold_format_rows = format_ops
        .iter()
        .any(|&op| op != formats::FormatOp::BagSumWarm);
    let evictor =
        (!args.keep_caches && !formats.is_empty() && cold_format_rows).then(formats::Evictor::new);
    let plan = Plan {
        kernels,
        impls,
        layer_ops,
        formats,
        format_ops,
        candle_ops,
        budget: Budget {
            per_row: Duration::from_millis(args.budget_ms),
            reps: args.reps.map(NonZeroUsize::get),
        },
        huge_pages: !args.no_huge_pages,
        evictor,
    };
    let (huge_pages, budget) = (plan.huge_pages, &plan.budget);

    // The table goes to stdout, or to stderr when stdout carries the JSON.
    let mut human: Box<dyn Write> = if args.json {
        Box::new(io::stderr())
    } else {
        Box::new(io::stdout())
    };
    let pb = if args.json || !io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        let per_workload = plan.kernels.len() * plan.impls.len()
            + plan.layer_ops.len()
            + plan.formats.len() * plan.format_ops.len()
            + plan.candle_ops.len();
        let pb = ProgressBar::new((workloads.len() * per_workload) as u64);
        pb.set_style(ProgressStyle::with_template(
            "{bar:30} {pos}/{len} rows [{elapsed}] {msg}",
        )?);
        pb.enable_steady_tick(Duration::from_millis(200));
        pb
    };

    if let Some(dir) = &args.markdown {
        // Fail before measuring, not after, when the folder cannot be made.
        std::fs::create_dir_all(dir)?;
    }
    let command = command::line();
    let mut machine = machine(threads, huge_pages);
    pb.suspend(|| header(&mut human, &command, &machine, budget))?;
    let mut rows = Vec::new();
    let mut layer_rows = Vec::new();
    let mut format_rows = Vec::new();
    let mut candle_layer_rows = Vec::new();
    let mut infos = Vec::new();
    for w in &workloads {
        let m = run_workload(*w, &plan, &pool, &pb)?;
        let distinct = m.distinct;
        pb.suspend(|| workload_block(&mut human, w, distinct, &m.rows))?;
        rows.extend(m.rows);
        layer_rows.extend(m.layer_rows);
        format_rows.extend(m.format_rows);
        candle_layer_rows.extend(m.candle_layer_rows);
        infos.push(WorkloadInfo {
            name: w.name,
            num_embeddings: w.num_embeddings,
            dim: w.dim,
            num_ids: w.num_ids,
            distinct_ids: distinct,
        });
    }
    pb.finish_and_clear();
    machine.loadavg_at_end = loadavg();

    let report = Report {
        command,
        machine,
        budget_ms_per_row: budget.reps.is_none().then_some(args.budget_ms),
        reps_per_row: budget.reps,
        bytes_rule: BYTES_RULE,
        workloads: infos,
        targets: targets(&rows, &layer_rows, &format_rows, &candle_layer_rows),
        rows,
        layer_rows,
        format_rows,
        format_eviction_bytes: plan.evictor.as_ref().map(formats::Evictor::bytes),
        candle_layer_rows,
        wall_seconds: started.elapsed().as_secs_f64(),
    };
    footer(&mut human, &report)?;
    human.flush()?;
    if args.json {
        let stdout = io::stdout();
        let mut lock = stdout.lock();
        serde_json::to_writer_pretty(&mut lock, &report)?;
        writeln!(lock)?;
    }
    if let Some(dir) = &args.markdown {
        let [md, svg] = markdown::write(dir, &report)?;
        eprintln!("wrote {} and {}", md.display(), svg.display());
    }
    Ok(())
}
