//! Criterion benchmarks of the candle backend: this crate's candle
//! `Embedding` (`embedding_kernels::candle`, feature `candle`) against
//! `candle_nn::Embedding`, both driven through candle's API over one `Var`
//! table, and against the crate's kernels called directly on that table's
//! storage (the report's `candle_layer` rows, `examples/report/candle_layer.rs`).
//!
//! ```text
//! cargo bench --bench candle_layer                      # everything (about 5 min on 2 vCPUs, estimated)
//! cargo bench --bench candle_layer -- minilm            # one workload
//! cargo bench --bench candle_layer -- 'candle_forward/' # one group
//! ```
//!
//! Benchmarks are named `<group>/<implementation>/<workload>`:
//!
//! | group | `ours`, `candle_nn` (the same calls) | `kernel` |
//! | --- | --- | --- |
//! | `candle_forward` | `layer.forward(ids)` | `gather_with` into a new output |
//! | `candle_backward` | `loss.backward()`, the graph (`forward(ids)` under the loss) built outside the clock | `dense_backward_with` of `grad_output` into a new gradient |
//! | `candle_fwd_bwd` | `forward(ids)`, the loss, `backward()` | `gather_with`, then `dense_backward_with`, each into a new buffer |
//!
//! The loss hands the output a fixed gradient, the workload's
//! `grad_output`, as the next layer of a model would, and costs nothing
//! itself (`benches/common`, `candle_module`).
//!
//! Details:
//!
//! * Allocations are timed (candle's ops return new tensors; the kernels
//!   are given new `memory::zeroed_table`s, in huge pages as the candle
//!   ops' outputs are, which they touch first), and every result is
//!   dropped after the clock stops.
//! * The `candle_backward` and `candle_fwd_bwd` rows of the two layers
//!   include candle's bookkeeping around the op: a `zeros_like` and an
//!   `add` of each gradient into it, for the output and for the table
//!   (`candle_nn`'s `index_add` starts from the table's `zeros_like`
//!   instead).
//! * Ids are the workload's `i64` ids as a flat `[num_ids]` tensor; the
//!   layers' calls run from the benchmark's thread, so what splits goes to
//!   rayon's global pool, as from a plain training loop.
//! * Before a workload's first benchmark, the three implementations'
//!   forward outputs and table gradients are checked equal bit for bit.
//! * Sampling is flat (ten samples of a fixed number of calls), because
//!   `candle_nn`'s backward takes tenths of a second on the larger tables.
//!
//! # Bytes counted for `Throughput::Bytes`
//!
//! With `N = num_ids`, `D = dim`, `E = num_embeddings` and 4 bytes per
//! f32, as in `benches/layer.rs`: forward `2·N·D·4` (rows read, output
//! written), backward `N·D·4 + E·D·4` (the upstream gradient read, the
//! whole table gradient written once), `fwd_bwd` both. candle's extra
//! passes are not counted: rows that compute the same result count the
//! same bytes, so their GB/s compare directly.
//!
//! # Memory
//!
//! One workload at a time: its data (the table and ids), the `Var` copy of
//! the table, and what a call allocates (on recsys, 488 MiB per gradient,
//! and up to three of them alive at once inside candle's backward).

#[path = "common/mod.rs"]
mod common;

use common::candle_module::{Layer, Modules};
use common::{Data, WORKLOADS, Workload};
use criterion::{
    BatchSize, Bencher, BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group,
    criterion_main,
};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Bytes per value.
const F32: usize = core::mem::size_of::<f32>();

/// One workload's data and modules.
struct Workspace {
    data: Data,
    modules: Modules,
}

impl Workspace {
    /// Builds the data and the modules, then checks that the three
    /// implementations agree before anything is timed.
    fn new(w: Workload) -> Workspace {
        let start = Instant::now();
        let mut data = w.data(false);
        let modules = Modules::new(&data).expect("candle takes the workload");
        // The modules hold their own copy; the kernels read that one.
        drop(std::mem::take(&mut data.table));
        let ws = Workspace { data, modules };
        ws.check();
        eprintln!(
            "{}: data built and checked in {:.1?}",
            w.name,
            start.elapsed()
        );
        ws
    }

    /// The forward outputs and the table gradients of `ours`, `candle_nn`
    /// and the kernels, compared bit for bit.
    fn check(&self) {
        let m = &self.modules;
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        let flat = |t: &candle_core::Tensor| bits(t.flatten_all().unwrap().to_vec1().unwrap());
        let kernel_out = m
            .with_table(|table| m.kernel_forward(&self.data, table))
            .unwrap();
        let kernel_grad = bits(m.kernel_backward(&self.data));
        let kernel_out = bits(kernel_out);
        for layer in [Layer::Ours, Layer::CandleNn] {
            let out = m.forward(layer).unwrap();
            assert!(flat(&out) == kernel_out, "{layer:?}: forward differs");
            let (_loss, grads) = m.fwd_bwd(layer).unwrap();
            let grad = m.table_grad(&grads).unwrap();
            assert!(flat(grad) == kernel_grad, "{layer:?}: gradient differs");
        }
    }
}

/// One workload's [`Workspace`], built on the first benchmark the filter
/// selects.
struct Lazy {
    w: Workload,
    ws: Option<Workspace>,
}

impl Lazy {
    fn get(&mut self) -> &Workspace {
        let w = self.w;
        self.ws.get_or_insert_with(|| Workspace::new(w))
    }
}

/// Times `routine` (its allocations included) and drops each result after
/// the clock stops.
fn iter_free_untimed<O>(b: &mut Bencher<'_>, mut routine: impl FnMut() -> O) {
    b.iter_custom(|iters| {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            let start = Instant::now();
            let result = black_box(routine());
            total += start.elapsed();
            drop(result);
        }
        total
    })
}

/// The layers' names in benchmark ids.
fn name(layer: Layer) -> &'static str {
    match layer {
        Layer::Ours => "ours",
        Layer::CandleNn => "candle_nn",
    }
}

fn forward(c: &mut Criterion, lazy: &mut Lazy) {
    let w = lazy.w;
    let mut g = c.benchmark_group("candle_forward");
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Bytes((2 * w.num_ids * w.dim * F32) as u64));
    for layer in [Layer::Ours, Layer::CandleNn] {
        g.bench_function(BenchmarkId::new(name(layer), w.name), |b| {
            let m = &lazy.get().modules;
            iter_free_untimed(b, || m.forward(layer).expect("forward"))
        });
    }
    g.bench_function(BenchmarkId::new("kernel", w.name), |b| {
        let Workspace { data, modules } = lazy.get();
        modules
            .with_table(|table| iter_free_untimed(b, || modules.kernel_forward(data, table)))
            .expect("an f32 table")
    });
    g.finish();
}

fn backward(c: &mut Criterion, lazy: &mut Lazy) {
    let w = lazy.w;
    let mut g = c.benchmark_group("candle_backward");
    g.sampling_mode(SamplingMode::Flat);
    let bytes = (w.num_ids + w.num_embeddings) * w.dim * F32;
    g.throughput(Throughput::Bytes(bytes as u64));
    for layer in [Layer::Ours, Layer::CandleNn] {
        g.bench_function(BenchmarkId::new(name(layer), w.name), |b| {
            let m = &lazy.get().modules;
            // The graph is built in the untimed set-up; criterion drops the
            // gradients (and the graph) outside the clock.
            b.iter_batched(
                || m.loss(layer).expect("forward"),
                |loss| (loss.backward().expect("backward"), loss),
                BatchSize::PerIteration,
            )
        });
    }
    g.bench_function(BenchmarkId::new("kernel", w.name), |b| {
        let Workspace { data, modules } = lazy.get();
        iter_free_untimed(b, || modules.kernel_backward(data))
    });
    g.finish();
}

fn fwd_bwd(c: &mut Criterion, lazy: &mut Lazy) {
    let w = lazy.w;
    let mut g = c.benchmark_group("candle_fwd_bwd");
    g.sampling_mode(SamplingMode::Flat);
    let bytes = (3 * w.num_ids + w.num_embeddings) * w.dim * F32;
    g.throughput(Throughput::Bytes(bytes as u64));
    for layer in [Layer::Ours, Layer::CandleNn] {
        g.bench_function(BenchmarkId::new(name(layer), w.name), |b| {
            let m = &lazy.get().modules;
            iter_free_untimed(b, || m.fwd_bwd(layer).expect("forward and backward"))
        });
    }
    g.bench_function(BenchmarkId::new("kernel", w.name), |b| {
        let Workspace { data, modules } = lazy.get();
        modules
            .with_table(|table| {
                iter_free_untimed(b, || {
                    (
                        modules.kernel_forward(data, table),
                        modules.kernel_backward(data),
                    )
                })
            })
            .expect("an f32 table")
    });
    g.finish();
}

/// The three groups, workload by workload; a workload's data lives from the
/// first benchmark that needs it to the end of its last group.
fn candle_layer(c: &mut Criterion) {
    eprintln!("rayon pool: {} threads", rayon::current_num_threads());
    for w in WORKLOADS {
        let mut lazy = Lazy { w, ws: None };
        forward(c, &mut lazy);
        backward(c, &mut lazy);
        fwd_bwd(c, &mut lazy);
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = candle_layer
}
criterion_main!(benches);
