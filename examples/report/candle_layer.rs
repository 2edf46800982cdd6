//! The `candle_layer` rows of the report: this crate's candle `Embedding`
//! (`embedding_kernels::candle`) against `candle_nn::Embedding`, and against
//! the crate's own kernels called directly, all three measured round-robin
//! in one [`measure`] call, so that each row's three figures come from the
//! same seconds of the machine.
//!
//! | op | the two candle layers (same calls) | the kernels called directly |
//! | --- | --- | --- |
//! | `forward` | `layer.forward(ids)` | `gather_with` into a new output |
//! | `backward` | `loss.backward()` on a graph built outside the clock (`forward(ids)` under the loss) | `dense_backward_with` of `grad_output` into a new gradient |
//! | `fwd_bwd` | `forward(ids)`, the loss, `backward()` | `gather_with`, then `dense_backward_with`, each into a new buffer |
//!
//! The loss hands the output a fixed gradient (the workload's
//! `grad_output`, as the next layer of a model would) and costs nothing
//! itself (`benches/common`, `candle_module`).
//!
//! The `backward` and `fwd_bwd` rows time a fourth case, `accumulate`:
//! `table.zeros_like().add(grad)`, which candle's `backward()` runs on the
//! table's gradient whatever the layer (it accumulates every gradient into
//! a `zeros_like` of its tensor). It is the part of both layers' backward
//! that no layer can avoid.
//!
//! What is and is not in the clock:
//!
//! 1. Everything a candle user's call costs is timed: candle's checks, the
//!    op's allocation of its output, and in the backward candle's own
//!    bookkeeping around the op (a `zeros_like` plus an `add` of each
//!    gradient into it, for the output and for the table).
//! 2. The kernels allocate their outputs inside the clock too
//!    (`memory::zeroed_table`, advised for huge pages and first touched by
//!    the kernel, as the candle ops allocate theirs), and read the table
//!    from the `Var`'s own storage: same bytes, same pages. They are given
//!    `grad_output` itself.
//! 3. Results (tensors, gradient stores, graphs, vectors) are freed after
//!    the clock stops, before the next call.
//! 4. Before timing, the forward outputs and the table's gradients of the
//!    three are compared bit for bit; a difference is printed as a warning.
//!
//! Everything runs in the report's pool (`pool.install`), where the crate's
//! ops use `Parallelism::Auto` and candle's CPU ops their own threading.

use super::common::Data;
use super::common::candle_module::{Layer, Modules};
use super::{Budget, Stats, difference, measure, timed};
use candle_core::Tensor;
use candle_core::backprop::GradStore;
use clap::ValueEnum;
use rayon::ThreadPool;
use serde::Serialize;
use std::cell::RefCell;
use std::error::Error;
use std::io::{self, Write};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum CandleOp {
    Forward,
    Backward,
    FwdBwd,
}

impl CandleOp {
    pub const ALL: [CandleOp; 3] = [CandleOp::Forward, CandleOp::Backward, CandleOp::FwdBwd];

    pub fn name(self) -> &'static str {
        match self {
            CandleOp::Forward => "forward",
            CandleOp::Backward => "backward",
            CandleOp::FwdBwd => "fwd_bwd",
        }
    }
}

/// One `candle_layer` row: the three implementations' times.
#[derive(Clone, Debug, Serialize)]
pub struct CandleRow {
    pub workload: &'static str,
    pub op: &'static str,
    /// `embedding_kernels::candle::Embedding` through candle's API.
    pub ours: Stats,
    /// `candle_nn::Embedding`, the same calls.
    pub candle_nn: Stats,
    /// The crate's kernels called directly.
    pub kernel: Stats,
    /// candle's accumulation of the table's gradient (`zeros_like` +
    /// `add`), for the rows with a backward.
    pub accumulate: Option<Stats>,
    /// candle_nn's median / ours: above 1, ours is faster.
    pub speedup_vs_candle_nn: f64,
    /// Ours' median / the kernels': the candle layer's overhead (1.10 is
    /// 10 % slower than the kernels).
    pub time_vs_kernel: f64,
    /// Whether the three gave the same bits (output or table gradient).
    pub results_match: bool,
}

/// The last call's results, kept so that they are freed outside the clock.
#[derive(Default)]
struct Kept {
    tensor: Option<Tensor>,
    grads: Option<GradStore>,
    vecs: Vec<Vec<f32>>,
}

struct Setup<'a> {
    data: &'a Data,
    pool: &'a ThreadPool,
    modules: Modules,
    kept: Kept,
    /// A table gradient for the `accumulate` case (the last one checked).
    grad: Option<Tensor>,
}

impl Setup<'_> {
    /// One call of `op` through `layer`, timed; the previous call's results
    /// are freed first, and for `backward` the graph is built, both
    /// outside the clock.
    fn layer(&mut self, layer: Layer, op: CandleOp) -> Duration {
        self.kept = Kept::default();
        let (m, pool) = (&self.modules, self.pool);
        let kept = &mut self.kept;
        match op {
            CandleOp::Forward => {
                let mut out = None;
                let t = timed(|| out = Some(pool.install(|| m.forward(layer))));
                kept.tensor = Some(out.expect("timed").expect("the forward runs"));
                t
            }
            CandleOp::Backward => {
                let loss = pool.install(|| m.loss(layer)).expect("the forward runs");
                let mut grads = None;
                let t = timed(|| grads = Some(pool.install(|| loss.backward())));
                kept.grads = Some(grads.expect("timed").expect("the backward runs"));
                kept.tensor = Some(loss);
                t
            }
            CandleOp::FwdBwd => {
                let mut result = None;
                let t = timed(|| result = Some(pool.install(|| m.fwd_bwd(layer))));
                let (loss, grads) = result.expect("timed").expect("forward and backward run");
                kept.tensor = Some(loss);
                kept.grads = Some(grads);
                t
            }
        }
    }

    /// One call of `op` by the kernels, timed.
    fn kernel(&mut self, op: CandleOp) -> Duration {
        self.kept = Kept::default();
        let (m, d, pool) = (&self.modules, self.data, self.pool);
        let kept = &mut self.kept;
        m.with_table(|table| {
            timed(|| {
                pool.install(|| match op {
                    CandleOp::Forward => kept.vecs.push(m.kernel_forward(d, table)),
                    CandleOp::Backward => kept.vecs.push(m.kernel_backward(d)),
                    CandleOp::FwdBwd => {
                        kept.vecs.push(m.kernel_forward(d, table));
                        kept.vecs.push(m.kernel_backward(d));
                    }
                })
            })
        })
        .expect("the table is an f32 matrix")
    }

    /// candle's accumulation of the table's gradient, timed.
    fn accumulate(&mut self) -> Duration {
        self.kept = Kept::default();
        let (m, pool) = (&self.modules, self.pool);
        let grad = self.grad.as_ref().expect("a gradient from the check");
        let mut sum = None;
        let t = timed(|| sum = Some(pool.install(|| m.accumulate(grad))));
        self.kept.tensor = Some(sum.expect("timed").expect("candle adds"));
        t
    }

    /// The result `op` is judged by (the output for `forward`, the table's
    /// gradient otherwise) from each of the three, compared bit for bit.
    fn results_match(&mut self, op: CandleOp) -> Result<bool, Box<dyn Error>> {
        let mut results = Vec::new();
        for layer in [Layer::Ours, Layer::CandleNn] {
            self.layer(layer, op);
            let m = &self.modules;
            let values = match (&self.kept.tensor, &self.kept.grads, op) {
                (Some(out), _, CandleOp::Forward) => out.flatten_all()?.to_vec1::<f32>()?,
                (_, Some(grads), _) => {
                    let grad = m.table_grad(grads)?;
                    self.grad = Some(grad.clone());
                    grad.flatten_all()?.to_vec1::<f32>()?
                }
                _ => return Err("a layer call kept no result".into()),
            };
            results.push(values);
        }
        self.kernel(op);
        // The kernels' output is the first buffer kept, their gradient the
        // last.
        let kernel = match op {
            CandleOp::Forward => self.kept.vecs.first(),
            _ => self.kept.vecs.last(),
        };
        results.push(kernel.cloned().ok_or("the kernels kept no result")?);
        self.kept = Kept::default();
        Ok(results
            .windows(2)
            .all(|pair| difference(&pair[0], &pair[1]).is_none()))
    }
}

/// Measures the chosen candle ops on one workload.
pub fn run(
    data: &Data,
    ops: &[CandleOp],
    budget: &Budget,
    pool: &ThreadPool,
) -> Result<Vec<CandleRow>, Box<dyn Error>> {
    if ops.is_empty() {
        return Ok(Vec::new());
    }
    let s = RefCell::new(Setup {
        data,
        pool,
        modules: Modules::new(data)?,
        kept: Kept::default(),
        grad: None,
    });
    let mut rows = Vec::new();
    for &op in ops {
        let results_match = s.borrow_mut().results_match(op)?;
        if !results_match {
            eprintln!(
                "WARNING: {} candle_layer {}: the three results differ",
                data.w.name,
                op.name()
            );
        }
        let mut ours = || s.borrow_mut().layer(Layer::Ours, op);
        let mut theirs = || s.borrow_mut().layer(Layer::CandleNn, op);
        let mut kernel = || s.borrow_mut().kernel(op);
        let (ours, theirs, kernel, accumulate) = if op == CandleOp::Forward {
            let [a, b, c] = measure(budget, [&mut ours, &mut theirs, &mut kernel]);
            (a, b, c, None)
        } else {
            let mut accumulate = || s.borrow_mut().accumulate();
            let [a, b, c, d] = measure(
                budget,
                [&mut ours, &mut theirs, &mut kernel, &mut accumulate],
            );
            (a, b, c, Some(Stats::of(&d)))
        };
        let (ours, candle_nn, kernel) = (Stats::of(&ours), Stats::of(&theirs), Stats::of(&kernel));
        rows.push(CandleRow {
            workload: data.w.name,
            op: op.name(),
            ours,
            candle_nn,
            kernel,
            accumulate,
            speedup_vs_candle_nn: candle_nn.median_us / ours.median_us,
            time_vs_kernel: ours.median_us / kernel.median_us,
            results_match,
        });
    }
    let mut s = s.borrow_mut();
    s.kept = Kept::default();
    s.grad = None;
    Ok(rows)
}

/// The header of the candle table.
pub fn header(out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "{:<8} {:<9} {:>10} {:>13} {:>10} {:>13} {:>10} {:>9} {:>5}",
        "workload",
        "candle op",
        "ours µs",
        "candle_nn µs",
        "kernel µs",
        "accumulate µs",
        "vs candle",
        "/kernel",
        "reps"
    )
}

/// The candle rows, as text.
pub fn block(out: &mut dyn Write, rows: &[CandleRow]) -> io::Result<()> {
    for r in rows {
        let flag = if r.results_match {
            ""
        } else {
            "  RESULTS DIFFER"
        };
        let accumulate = r
            .accumulate
            .map_or("-".to_string(), |a| format!("{:.1}", a.median_us));
        writeln!(
            out,
            "{:<8} {:<9} {:>10.1} {:>13.1} {:>10.1} {:>13} {:>9.2}x {:>8.2}x {:>5}{flag}",
            r.workload,
            r.op,
            r.ours.median_us,
            r.candle_nn.median_us,
            r.kernel.median_us,
            accumulate,
            r.speedup_vs_candle_nn,
            r.time_vs_kernel,
            r.ours.reps
        )?;
    }
    Ok(())
}

/// What the candle columns mean.
pub const LEGEND: &str =
    "candle ops: ours = embedding_kernels::candle::Embedding, candle_nn = candle_nn::Embedding,
  both through candle's API over one Var table; kernel = gather_with / dense_backward_with called
  directly on that table's storage, each into a new buffer. forward: layer.forward(ids);
  backward: loss.backward() on a graph built outside the clock, the loss handing the output a fixed
  gradient (kernel: dense_backward_with of it); fwd_bwd: forward, loss, backward. accumulate:
  table.zeros_like().add(grad), what candle's backward() does with the table's gradient whatever the
  layer, so part of both layers' times. Allocations are timed, freeing is not.
  vs candle = candle_nn median / ours (above 1: ours is faster);
  /kernel = ours median / kernel median (the candle layer's overhead)";
