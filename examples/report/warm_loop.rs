//! `--loop`: the crate against PyTorch in a warm loop, the way both are
//! called in a training or serving loop.
//!
//! PyTorch runs in a child process (`benches/pytorch_peer.py --serve`,
//! started with `--python`, which needs `torch`); the crate runs here. For
//! every round, workload and op, the two sides take turns (which one goes
//! first alternates by round), each timing its own calls the same way:
//! [`WARMUP`] of untimed calls back to back, then calls back to back for
//! at least [`BUDGET`] (and [`MIN_REPS`]), the median kept. A call's result
//! is freed inside its timing, as a loop that uses it and moves on frees
//! it. The cell is PyTorch's median over ours: above 1, ours is faster;
//! the table gives the median of the rounds' ratios and the lowest round.
//!
//! | op | PyTorch | ours |
//! | --- | --- | --- |
//! | `gather` | `torch.index_select(weight, 0, ids, out=out)` | `gather` into a caller's buffer, the table a plain `Vec<f32>` |
//! | `forward` | `F.embedding(ids, weight)` | `Embedding::forward` (allocating) |
//! | `bag_sum`, `bag_mean` | `F.embedding_bag(ids, weight, offsets, mode=…)`, bags of 16 | `EmbeddingBag::forward` (allocating) |
//! | `sparse_step` | `zero_grad`, `F.embedding(…, sparse=True)`, `backward`, `SGD.step()` | `Embedding::forward`, then `sparse_step` with `Sgd` |
//! | `bag_sum_f16`, `bag_sum_bf16` | `F.embedding_bag(…, mode="sum")` over `weight.half()` / `.bfloat16()` | `QuantizedEmbeddingBag::forward` over an `f16` / `bf16` table (allocating) |
//! | `bag_sum_int8`, `bag_sum_int4` | `torch.ops.quantized.embedding_bag_byte_rowwise_offsets` / `_4bit_` over the prepacked table | `QuantizedEmbeddingBag::forward` over the same bytes (`from_float`) |
//!
//! Both sides use every core by default; `--threads N` sets both. Ours is
//! called from the main thread, and rayon's global pool is built with
//! `use_current_thread()` so that the main thread works on each call as
//! PyTorch's does (its OpenMP master thread is one of its threads);
//! `--caller-waits` keeps rayon's default, where the pool's threads take
//! the call and the main thread waits. The layers are made by their
//! public constructors (`from_pretrained`, which copies the table into
//! huge pages); `gather` reads the table as a caller holds it.

use super::common::{Data, Workload};
use super::layer::BAG_SIZE;
use super::median_sorted;
use embedding_kernels::formats::Format;
use embedding_kernels::{
    Bags, Embedding, EmbeddingBag, EmbeddingBagOptions, Mode, QuantizedEmbeddingBag, Sgd, gather,
};
use serde::{Deserialize, Serialize};
use std::error::Error;
use std::hint::black_box;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// Untimed calls back to back before the timed ones.
pub const WARMUP: Duration = Duration::from_millis(200);
/// The least time of timed calls a cell's median is taken over.
pub const BUDGET: Duration = Duration::from_millis(500);
/// The fewest timed calls of a cell.
const MIN_REPS: usize = 5;
/// The learning rate of the sparse steps (small: the table barely moves).
const LR: f32 = 1e-6;

/// The ops of the comparison, as the PyTorch side names them.
pub const OPS: [&str; 9] = [
    "gather",
    "forward",
    "bag_sum",
    "bag_mean",
    "sparse_step",
    "bag_sum_f16",
    "bag_sum_bf16",
    "bag_sum_int8",
    "bag_sum_int4",
];

/// The table format of a `bag_sum_<format>` op.
fn format_of(op: &str) -> Option<Format> {
    Format::from_name(op.strip_prefix("bag_sum_")?)
}

/// One side's median for one cell.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Timing {
    pub ms: f64,
    pub reps: usize,
}

/// One round's measurement of one (workload, op) cell.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    pub round: usize,
    pub workload: &'static str,
    pub op: &'static str,
    pub torch: Timing,
    pub ours: Timing,
    /// PyTorch's median / ours: above 1, ours is faster.
    pub ratio: f64,
}

/// What the PyTorch side said of itself.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Peer {
    pub torch: String,
    pub threads: usize,
    pub capability: String,
}

#[derive(Deserialize)]
struct Answer {
    ms: Option<f64>,
    reps: Option<usize>,
    error: Option<String>,
}

/// The PyTorch process, answering one timing request at a time.
struct Torch {
    child: Child,
    to: BufWriter<ChildStdin>,
    from: BufReader<ChildStdout>,
}

impl Torch {
    fn start(python: &str, threads: Option<usize>) -> Result<(Torch, Peer), Box<dyn Error>> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/pytorch_peer.py");
        let mut cmd = Command::new(python);
        cmd.arg(script).arg("--serve");
        if let Some(n) = threads {
            cmd.arg("--threads").arg(n.to_string());
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("--loop runs `{python} {script}` (PyTorch's side): {e}"))?;
        let to = BufWriter::new(
            child
                .stdin
                .take()
                .ok_or("no stdin of the PyTorch process")?,
        );
        let from = BufReader::new(
            child
                .stdout
                .take()
                .ok_or("no stdout of the PyTorch process")?,
        );
        let mut torch = Torch { child, to, from };
        let peer = serde_json::from_str(&torch.line()?).map_err(|e| {
            format!("the PyTorch process did not start (is torch installed for `{python}`?): {e}")
        })?;
        Ok((torch, peer))
    }

    fn line(&mut self) -> Result<String, Box<dyn Error>> {
        let mut line = String::new();
        if self.from.read_line(&mut line)? == 0 {
            return Err("the PyTorch process ended early (its error is above)".into());
        }
        Ok(line)
    }

    fn time(&mut self, workload: &str, op: &str) -> Result<Timing, Box<dyn Error>> {
        let request = serde_json::json!({
            "workload": workload,
            "op": op,
            "warmup_s": WARMUP.as_secs_f64(),
            "budget_s": BUDGET.as_secs_f64(),
        });
        writeln!(self.to, "{request}")?;
        self.to.flush()?;
        let answer: Answer = serde_json::from_str(&self.line()?)?;
        match (answer.ms, answer.reps, answer.error) {
            (Some(ms), Some(reps), None) => Ok(Timing { ms, reps }),
            (_, _, error) => Err(format!(
                "PyTorch's {workload} {op}: {}",
                error.unwrap_or_else(|| "no timing in its answer".into())
            )
            .into()),
        }
    }
}

impl Drop for Torch {
    fn drop(&mut self) {
        // It holds a workload's tensors and waits for the next request.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The crate's side of one workload.
struct Ours<'a> {
    data: &'a Data,
    out: Vec<f32>,
    layer: Embedding,
    trained: Embedding,
    sum: EmbeddingBag,
    mean: EmbeddingBag,
    /// The sum layer over the tables of the `bag_sum_<format>` ops asked for.
    formats: Vec<(Format, QuantizedEmbeddingBag)>,
    bags: Bags,
}

impl<'a> Ours<'a> {
    fn new(data: &'a Data, ops: &[&str]) -> Result<Ours<'a>, Box<dyn Error>> {
        let (dim, n) = (data.w.dim, data.w.num_ids);
        let table = || data.table.to_vec();
        let bag = |mode| {
            let options = EmbeddingBagOptions {
                mode,
                ..EmbeddingBagOptions::default()
            };
            EmbeddingBag::from_pretrained(table(), dim, true, options)
        };
        let sum = bag(Mode::Sum)?;
        let formats = ops
            .iter()
            .filter_map(|op| format_of(op))
            .map(|f| Ok((f, QuantizedEmbeddingBag::from_float(&sum, f)?)))
            .collect::<Result<_, Box<dyn Error>>>()?;
        Ok(Ours {
            data,
            out: vec![0.0; n * dim],
            layer: Embedding::from_pretrained(table(), dim, true)?,
            trained: Embedding::from_pretrained(table(), dim, false)?,
            sum,
            mean: bag(Mode::Mean)?,
            formats,
            bags: Bags::fixed(n / BAG_SIZE, BAG_SIZE)?,
        })
    }

    /// One call of `op`, its result dropped.
    fn call(&mut self, op: &str) -> Result<(), Box<dyn Error>> {
        let (ids, dim) = (&self.data.ids[..], self.data.w.dim);
        match op {
            "gather" => gather(&self.data.table, dim, ids, &mut self.out)?,
            "forward" => drop(black_box(self.layer.forward(ids, &[ids.len()])?)),
            "bag_sum" => drop(black_box(self.sum.forward(ids, &self.bags, None)?)),
            "bag_mean" => drop(black_box(self.mean.forward(ids, &self.bags, None)?)),
            "sparse_step" => {
                drop(black_box(self.trained.forward(ids, &[ids.len()])?));
                let g = &self.data.grad_output[..];
                self.trained.sparse_step(g, ids, &mut Sgd::new(LR))?;
            }
            _ => {
                let layer = format_of(op)
                    .and_then(|f| self.formats.iter().find(|(g, _)| *g == f))
                    .map(|(_, layer)| layer)
                    .ok_or_else(|| format!("unknown loop op `{op}`"))?;
                drop(black_box(layer.forward(ids, &self.bags, None)?));
            }
        }
        black_box(&mut self.out);
        Ok(())
    }

    /// [`WARMUP`] of untimed calls, then the median of at least [`BUDGET`].
    fn time(&mut self, op: &str) -> Result<Timing, Box<dyn Error>> {
        let start = Instant::now();
        while start.elapsed() < WARMUP {
            self.call(op)?;
        }
        let mut samples = Vec::new();
        let start = Instant::now();
        while samples.len() < MIN_REPS || start.elapsed() < BUDGET {
            let t = Instant::now();
            self.call(op)?;
            samples.push(t.elapsed());
        }
        let reps = samples.len();
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        Ok(Timing {
            ms: median_sorted(&ms),
            reps,
        })
    }
}

/// Everything `--loop` measured.
#[derive(Debug, Serialize)]
pub struct LoopReport {
    pub peer: Peer,
    pub threads: usize,
    pub rounds: usize,
    pub cells: Vec<Cell>,
}

/// Runs the comparison: `rounds` rounds over `workloads` × [`OPS`].
/// `progress` is told of every finished cell.
/// The global rayon pool of `--loop`.
pub struct Pool {
    /// Its threads; `None` for rayon's default (every core).
    pub threads: Option<usize>,
    /// Whether the calling (main) thread is one of them.
    pub caller_works: bool,
}

pub fn run(
    workloads: &[Workload],
    ops: &[&'static str],
    rounds: usize,
    python: &str,
    pool: Pool,
    mut progress: impl FnMut(&Cell),
) -> Result<LoopReport, Box<dyn Error>> {
    let mut builder = rayon::ThreadPoolBuilder::new();
    if let Some(n) = pool.threads {
        builder = builder.num_threads(n);
    }
    if pool.caller_works {
        builder = builder.use_current_thread();
    }
    builder.build_global()?;
    let threads = pool.threads;
    let (mut torch, peer) = Torch::start(python, threads)?;
    let mut cells = Vec::new();
    for round in 1..=rounds {
        for w in workloads {
            let data = w.data(false);
            let mut ours = Ours::new(&data, ops)?;
            for &op in ops {
                let (torch_t, ours_t) = if round % 2 == 1 {
                    let t = torch.time(w.name, op)?;
                    (t, ours.time(op)?)
                } else {
                    let o = ours.time(op)?;
                    (torch.time(w.name, op)?, o)
                };
                let cell = Cell {
                    round,
                    workload: w.name,
                    op,
                    torch: torch_t,
                    ours: ours_t,
                    ratio: torch_t.ms / ours_t.ms,
                };
                progress(&cell);
                cells.push(cell);
            }
        }
    }
    Ok(LoopReport {
        peer,
        threads: rayon::current_num_threads(),
        rounds,
        cells,
    })
}

/// The median of `values`.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    median_sorted(&values)
}

/// The ratio table in markdown: a row per op, a column per workload, each
/// cell the median of the rounds' ratios and, in brackets, the lowest; then
/// the medians of both sides' times.
pub fn markdown(report: &LoopReport, workloads: &[Workload], ops: &[&str]) -> String {
    let cells = |w: &str, op: &str| -> Vec<&Cell> {
        let of_cell = |c: &&Cell| c.workload == w && c.op == op;
        report.cells.iter().filter(of_cell).collect()
    };
    let mut s = String::new();
    let names: Vec<&str> = workloads.iter().map(|w| w.name).collect();
    s += &format!(
        "| PyTorch / ours, median of {} rounds (lowest round) | {} |\n| --- |{}\n",
        report.rounds,
        names.join(" | "),
        " ---: |".repeat(names.len())
    );
    for op in ops {
        s += &format!("| `{op}` |");
        for w in &names {
            let ratios: Vec<f64> = cells(w, op).iter().map(|c| c.ratio).collect();
            let low = ratios.iter().copied().fold(f64::INFINITY, f64::min);
            s += &format!(" {:.2} ({:.2}) |", median(ratios), low);
        }
        s += "\n";
    }
    s += &format!(
        "\n| ms, PyTorch / ours (medians of the rounds) | {} |\n| --- |{}\n",
        names.join(" | "),
        " ---: |".repeat(names.len())
    );
    for op in ops {
        s += &format!("| `{op}` |");
        for w in &names {
            let t = median(cells(w, op).iter().map(|c| c.torch.ms).collect());
            let o = median(cells(w, op).iter().map(|c| c.ours.ms).collect());
            s += &format!(" {} / {} |", ms(t), ms(o));
        }
        s += "\n";
    }
    s
}

/// A time in ms with three significant digits at least.
fn ms(v: f64) -> String {
    if v < 0.1 {
        format!("{v:.4}")
    } else if v < 1.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.2}")
    }
}
