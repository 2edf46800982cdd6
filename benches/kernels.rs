//! Criterion benchmarks of the embedding kernels.
//!
//! ```text
//! cargo bench --bench kernels                     # everything (~10 min on 2 vCPUs)
//! cargo bench --bench kernels -- tiny             # one workload, every group
//! cargo bench --bench kernels -- 'scatter_add/'   # one group
//! cargo bench --bench kernels -- threshold        # the PARALLEL_MIN_BYTES sweep
//! ```
//!
//! Groups `gather`, `gather_scaled` and `scatter_add` hold one benchmark per
//! (implementation, workload), named `<group>/<implementation>/<workload>`:
//!
//! * `memcpy`: `copy_from_slice` of `num_ids × dim` f32s, the roofline
//!   yardstick (no kernel can move its bytes faster than a plain copy);
//! * `reference`: the one-hot oracle, `tiny` only (its one-hot matrix is
//!   `num_ids × num_embeddings` f32s: 16 MB for tiny, 262 GB for recsys);
//! * `scalar`: the plain loops of `reference::loops`;
//! * `simd_1t`: the crate's kernels with `Parallelism::Serial`;
//! * `simd_rayon`: the crate's kernels with `Parallelism::Rayon`, on rayon's
//!   default global pool (one thread per CPU);
//! * `candle`: candle-core's `index_select` / `index_add` on CPU tensors.
//!
//! Group `threshold` sweeps the output size from 4 KiB to 4 MiB for
//! `simd_1t` against `simd_rayon` (called from outside the pool, and from a
//! pool worker), to show where handing work to rayon starts to pay, which
//! is what `Parallelism::Auto`'s threshold (`PARALLEL_MIN_BYTES`, 2 MiB)
//! encodes.
//!
//! # Bytes counted for `Throughput::Bytes`
//!
//! The compulsory traffic of the operation, the same formula for every
//! implementation of it, so the GB/s of two rows compare directly:
//!
//! * `gather`, `gather_scaled`: `num_ids × dim × 4` read from the table plus
//!   `num_ids × dim × 4` written to the output. Repeated ids count every time
//!   they are read.
//! * `scatter_add`: `num_ids × dim × 4` read from `grad_output` plus, for each
//!   *distinct* id, its gradient row read and written back once
//!   (`distinct × dim × 4 × 2`). An implementation that re-reads a hot row
//!   per occurrence does more traffic than is counted.
//! * `memcpy`: `len × 4` read plus `len × 4` written, `len = num_ids × dim`.
//!
//! Index bytes (8 per id) are not counted anywhere.

#[path = "common/mod.rs"]
mod common;

use common::candle_peer::Candle;
use common::{Data, WORKLOADS, Workload};
use criterion::measurement::WallTime;
use criterion::{
    Bencher, BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use embedding_kernels::reference::loops;
use embedding_kernels::{
    EmbeddingError, Parallelism, gather_scaled_with, gather_with, reference, scatter_add_with,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Bytes per value.
const F32: usize = core::mem::size_of::<f32>();

type Group<'a> = BenchmarkGroup<'a, WallTime>;

/// A forward kernel run on a workload: `(data, scale, out)`. `scale` is
/// ignored by plain gathers.
type Forward = fn(&Data, f32, &mut [f32]) -> Result<(), EmbeddingError>;

/// A backward kernel run on a workload: `(data, grad_table)`.
type Backward = fn(&Data, &mut [f32]) -> Result<(), EmbeddingError>;

const GATHER: [(&str, Forward); 4] = [
    ("reference", |d, _, out| {
        reference::gather(&d.table, d.w.dim, &d.ids, out)
    }),
    ("scalar", |d, _, out| {
        loops::gather(&d.table, d.w.dim, &d.ids, out)
    }),
    ("simd_1t", |d, _, out| {
        gather_with(Parallelism::Serial, &d.table, d.w.dim, &d.ids, out)
    }),
    ("simd_rayon", |d, _, out| {
        gather_with(Parallelism::Rayon, &d.table, d.w.dim, &d.ids, out)
    }),
];

const GATHER_SCALED: [(&str, Forward); 4] = [
    ("reference", |d, s, out| {
        reference::gather_scaled(&d.table, d.w.dim, &d.ids, s, out)
    }),
    ("scalar", |d, s, out| {
        loops::gather_scaled(&d.table, d.w.dim, &d.ids, s, out)
    }),
    ("simd_1t", |d, s, out| {
        gather_scaled_with(Parallelism::Serial, &d.table, d.w.dim, &d.ids, s, out)
    }),
    ("simd_rayon", |d, s, out| {
        gather_scaled_with(Parallelism::Rayon, &d.table, d.w.dim, &d.ids, s, out)
    }),
];

const SCATTER_ADD: [(&str, Backward); 4] = [
    ("reference", |d, grad| {
        reference::scatter_add(&d.grad_output, d.w.dim, &d.ids, grad)
    }),
    ("scalar", |d, grad| {
        loops::scatter_add(&d.grad_output, d.w.dim, &d.ids, grad)
    }),
    ("simd_1t", |d, grad| {
        scatter_add_with(Parallelism::Serial, &d.grad_output, d.w.dim, &d.ids, grad)
    }),
    ("simd_rayon", |d, grad| {
        scatter_add_with(Parallelism::Rayon, &d.grad_output, d.w.dim, &d.ids, grad)
    }),
];

/// Whether an implementation runs on a workload: the one-hot reference only
/// on `tiny`.
fn runs_on(imp: &str, w: &Workload) -> bool {
    imp != "reference" || w.name == "tiny"
}

/// Bytes a gather (or scaled gather) moves: rows read plus rows written.
fn gather_bytes(num_ids: usize, dim: usize) -> u64 {
    (2 * num_ids * dim * F32) as u64
}

/// Bytes a scatter-add moves: `grad_output` read, plus each distinct touched
/// row of the gradient table read and written once.
fn scatter_bytes(num_ids: usize, distinct: usize, dim: usize) -> u64 {
    (num_ids * dim * F32 + distinct * dim * F32 * 2) as u64
}

/// The `memcpy` row: copy `num_ids × dim` f32s (from `grad_output`, which
/// has exactly that length) into a buffer of the same size.
fn memcpy_row(g: &mut Group<'_>, d: &Data) {
    let src = &d.grad_output;
    let mut dst = vec![0.0f32; src.len()];
    g.throughput(Throughput::Bytes((2 * src.len() * F32) as u64));
    g.bench_function(BenchmarkId::new("memcpy", d.w.name), |b| {
        b.iter(|| black_box(&mut dst[..]).copy_from_slice(black_box(&src[..])))
    });
}

/// The candle peer of one workload, built on first use so that a filtered
/// run does not copy tables it will not time. The copies are dropped with it.
struct LazyCandle<'d> {
    data: &'d Data,
    peer: Option<Candle>,
}

impl<'d> LazyCandle<'d> {
    fn new(data: &'d Data) -> Self {
        LazyCandle { data, peer: None }
    }

    fn get(&mut self) -> &Candle {
        let data = self.data;
        self.peer
            .get_or_insert_with(|| Candle::new(data).expect("candle tensors"))
    }
}

/// `gather` or `gather_scaled` over every workload.
fn forward(c: &mut Criterion, all: &[Data], name: &str, imps: &[(&str, Forward)]) {
    let scaled = name == "gather_scaled";
    let mut g = c.benchmark_group(name);
    for d in all {
        let w = d.w;
        // sqrt(d_model), the transformer input scale.
        let scale = (w.dim as f32).sqrt();
        memcpy_row(&mut g, d);

        g.throughput(Throughput::Bytes(gather_bytes(w.num_ids, w.dim)));
        let mut out = vec![0.0f32; w.num_ids * w.dim];
        for &(imp, f) in imps.iter().filter(|(imp, _)| runs_on(imp, &w)) {
            g.bench_function(BenchmarkId::new(imp, w.name), |b| {
                b.iter(|| f(black_box(d), black_box(scale), black_box(&mut out[..])).expect(imp))
            });
        }

        // candle allocates a fresh output tensor per call (tensors are
        // immutable); its allocation and its drop are inside the timed
        // region, as they are for a candle user. The scaled form is two
        // passes: index_select, then affine.
        let mut peer = LazyCandle::new(d);
        g.bench_function(BenchmarkId::new("candle", w.name), |b| {
            let p = peer.get();
            if scaled {
                b.iter(|| p.gather_scaled(f64::from(scale)).expect("candle"))
            } else {
                b.iter(|| p.gather().expect("candle"))
            }
        });
    }
    g.finish();
}

/// `scatter_add` over every workload.
fn backward(c: &mut Criterion, all: &[Data]) {
    let mut g = c.benchmark_group("scatter_add");
    for d in all {
        let w = d.w;
        memcpy_row(&mut g, d);

        g.throughput(Throughput::Bytes(scatter_bytes(
            w.num_ids,
            d.distinct_ids(),
            w.dim,
        )));
        // Every implementation accumulates into this one gradient table, call
        // after call, without re-zeroing: zeroing 512 MB (recsys) outside the
        // timed region on every iteration is not possible cheaply, and
        // zeroing inside it would swamp the kernel. The values grow (a random
        // walk of sums of values in [-1, 1), far from overflow and never
        // subnormal), which does not change the speed of an f32 add. The
        // first calls fault the touched pages in; the warm-up absorbs that.
        let mut grad = vec![0.0f32; w.num_embeddings * w.dim];
        for &(imp, f) in SCATTER_ADD.iter().filter(|(imp, _)| runs_on(imp, &w)) {
            g.bench_function(BenchmarkId::new(imp, w.name), |b| {
                b.iter(|| f(black_box(d), black_box(&mut grad[..])).expect(imp))
            });
        }
        drop(grad);

        // candle's index_add returns a new tensor: every call allocates and
        // copies the whole zero table (num_embeddings × dim, 512 MB for
        // recsys) before adding, and frees it after, all timed. That is the
        // real cost of the peer's API, but the bytes counted above are the
        // same as for the other rows, so its GB/s understates its traffic.
        let mut peer = LazyCandle::new(d);
        g.bench_function(BenchmarkId::new("candle", w.name), |b| {
            let p = peer.get();
            b.iter(|| p.scatter_add().expect("candle"))
        });
    }
    g.finish();
}

/// The three operation groups over the five workloads. All workload data is
/// built once here (about 0.8 GB, mostly the recsys table) and dropped when
/// the groups are done; per-group buffers (outputs, gradient tables, candle
/// copies) live only while their workload is measured.
fn workloads(c: &mut Criterion) {
    eprintln!(
        "rayon pool: {} threads; building workload data...",
        rayon::current_num_threads()
    );
    let start = Instant::now();
    let all: Vec<Data> = WORKLOADS.iter().map(|w| w.data(true)).collect();
    eprintln!("workload data built in {:.1?}", start.elapsed());

    forward(c, &all, "gather", &GATHER);
    forward(c, &all, "gather_scaled", &GATHER_SCALED);
    backward(c, &all);
}

/// Which thread runs a benchmark's timing loop.
#[derive(Clone, Copy)]
enum Caller {
    /// The benchmark's own thread, outside any rayon pool: a parallel call
    /// injects its work into the global pool and sleeps until it is done
    /// (rayon's "cold" path), as a plain training loop would.
    Outside,
    /// A worker of the global pool (the loop runs inside `rayon::scope`): a
    /// parallel call forks within the pool (the "hot" path), as it would
    /// from inside a caller's own `par_iter` or `pool.install`.
    InPool,
}

/// Times `routine` on the thread `caller` names.
fn time_on(b: &mut Bencher<'_>, caller: Caller, mut routine: impl FnMut() + Send) {
    match caller {
        Caller::Outside => b.iter(&mut routine),
        Caller::InPool => rayon::scope(|_| b.iter(&mut routine)),
    }
}

/// Where rayon starts to pay, to check `PARALLEL_MIN_BYTES` (2 MiB): gather
/// and scatter_add at dim 64 with 16 to 16 384 ids (4 KiB to 4 MiB of output
/// or `grad_output`) from a 1000-row table (256 KiB, cache resident), with
///
/// * `simd_1t`: `Parallelism::Serial`;
/// * `simd_rayon`: `Parallelism::Rayon` called from outside the pool;
/// * `simd_rayon_in_pool`: `Parallelism::Rayon` called from a pool worker.
///
/// `Parallelism::Rayon` splits at every size, so the sweep shows from which
/// size on splitting wins; `Auto` should switch there (scatter_add splits by
/// column blocks, which dim 64 allows). Ids are named
/// `threshold/<op>_<implementation>/<output size>`.
fn threshold(c: &mut Criterion) {
    const DIM: usize = 64;
    const ROWS: usize = 1000;
    let mut rng = StdRng::seed_from_u64(0x0074_17e5);
    let table: Vec<f32> = (0..ROWS * DIM)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let mut grad = vec![0.0f32; ROWS * DIM];
    let cases: Vec<(Vec<i64>, Vec<f32>)> = (4..=14)
        .map(|k| {
            let n = 1usize << k; // 16..16 384 ids
            let ids = (0..n).map(|_| rng.random_range(0..ROWS as i64)).collect();
            let grad_output = (0..n * DIM)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect();
            (ids, grad_output)
        })
        .collect();
    let imps = [
        ("simd_1t", Parallelism::Serial, Caller::Outside),
        ("simd_rayon", Parallelism::Rayon, Caller::Outside),
        ("simd_rayon_in_pool", Parallelism::Rayon, Caller::InPool),
    ];
    let size = |n: usize| format!("{}KiB", n * DIM * F32 / 1024);

    let mut g = c.benchmark_group("threshold");
    // Calls of 0.1 to 60 µs: shorter runs still take thousands of samples.
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_millis(1500));

    for (ids, _) in &cases {
        let n = ids.len();
        let mut out = vec![0.0f32; n * DIM];
        g.throughput(Throughput::Bytes(gather_bytes(n, DIM)));
        for (imp, par, caller) in imps {
            g.bench_function(BenchmarkId::new(format!("gather_{imp}"), size(n)), |b| {
                time_on(b, caller, || {
                    gather_with(
                        par,
                        black_box(&table),
                        DIM,
                        black_box(ids),
                        black_box(&mut out[..]),
                    )
                    .expect(imp)
                })
            });
        }
    }

    for (ids, grad_output) in &cases {
        let n = ids.len();
        let mut seen = [false; ROWS];
        let distinct = ids
            .iter()
            .filter(|&&id| !std::mem::replace(&mut seen[id as usize], true))
            .count();
        // Accumulates into `grad` call after call, as in `scatter_add`.
        g.throughput(Throughput::Bytes(scatter_bytes(n, distinct, DIM)));
        for (imp, par, caller) in imps {
            g.bench_function(
                BenchmarkId::new(format!("scatter_add_{imp}"), size(n)),
                |b| {
                    time_on(b, caller, || {
                        scatter_add_with(
                            par,
                            black_box(grad_output),
                            DIM,
                            black_box(ids),
                            black_box(&mut grad[..]),
                        )
                        .expect(imp)
                    })
                },
            );
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    // Ten samples, a 1 s warm-up and 3 s of measurement per benchmark
    // (0.5 s + 1.5 s in `threshold`) keep a full run near 10 minutes on a
    // 2-vCPU machine.
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = workloads, threshold
}
criterion_main!(benches);
