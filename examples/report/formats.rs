//! The format rows of the report: the lookup and the bag sum on the same
//! table stored as `f32`, `f16`, `bf16`, 8-bit and 4-bit row-wise. For each
//! op, every format's call and two memcpys of the bytes each format moves
//! run round-robin, so `vs f32` compares calls made in the same seconds of
//! a shared machine.
//!
//! | op | what is timed |
//! | --- | --- |
//! | `lookup` | `table_gather` (`out[i, :]` = row `ids[i]` as `f32`) |
//! | `bag_sum` | `table_bag_forward`, sum over bags of 16 consecutive ids |
//! | `bag_sum_warm` | the same after three untimed calls of itself, as in a timing loop; its memcpy after three untimed copies |
//!
//! Bytes moved, counted: the stored rows read (`ids × row bytes` of the
//! format: `4·dim`, `2·dim`, `dim + 8`, `ceil(dim/2) + 4`) plus the `f32`
//! output written. The roofline is a memcpy of half that many bytes (it
//! reads and writes them), the faster of one thread and the pool. Every
//! table lies in memory of the same kind (huge pages unless
//! `--no-huge-pages`), the reduced ones copied there from the format's
//! bytes. `vs f32` is the row's median over the `f32` row's median of the
//! same op and workload: below 1, the format is faster.
//!
//! `lookup` and `bag_sum` are cold: before each of their calls, and before
//! each of their memcpys, an [`Evictor`] reads a buffer of twice the
//! last-level caches (every distinct one, summed), so the rows come from
//! memory as a new batch's rows of a large table would. Without it, a host
//! whose last-level cache holds the rows the workload reads (recsys's 32
//! MiB of `f32` rows in a 300 MiB L3) serves every call after the first
//! from that cache (`--keep-caches` measures that case).

use super::common::{Buffer, Data, table_buffer};
use super::{Budget, Stats, measure_all, timed};
use clap::ValueEnum;
use embedding_kernels::formats::{Format, OwnedTable, PackedTable, TableRef};
use embedding_kernels::{
    Bags, Mode, Parallelism, Pooling, table_bag_forward_with, table_gather_with,
};
use rayon::ThreadPool;
use rayon::prelude::*;
use serde::Serialize;
use std::cell::RefCell;
use std::hint::black_box;
use std::io::{self, Write};
use std::time::Duration;

/// Bytes per task of the pool-wide memcpy.
const CHUNK: usize = 1 << 18;

/// Untimed calls before each timed one of `bag_sum_warm` (as the layer
/// rows' `bag_sum_warm`).
const WARM_CALLS: usize = 3;

/// The formats the report measures by default: the ones production serves.
pub const DEFAULT_FORMATS: [Format; 5] = [
    Format::F32,
    Format::F16,
    Format::Bf16,
    Format::Int8,
    Format::Int4,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum FormatOp {
    Lookup,
    BagSum,
    BagSumWarm,
}

impl FormatOp {
    pub const ALL: [FormatOp; 3] = [FormatOp::Lookup, FormatOp::BagSum, FormatOp::BagSumWarm];

    pub fn name(self) -> &'static str {
        match self {
            FormatOp::Lookup => "lookup",
            FormatOp::BagSum => "bag_sum",
            FormatOp::BagSumWarm => "bag_sum_warm",
        }
    }
}

/// One format row.
#[derive(Clone, Debug, Serialize)]
pub struct FormatRow {
    pub workload: &'static str,
    pub op: &'static str,
    pub format: &'static str,
    #[serde(flatten)]
    pub stats: Stats,
    pub bytes: usize,
    pub gbps: f64,
    pub roofline_gbps: f64,
    pub pct_of_roofline: f64,
    /// This row's median over the `f32` row's (same op and workload).
    pub time_vs_f32: Option<f64>,
}

/// A table of one format, its bytes in a buffer of the workload's memory
/// kind.
struct Stored {
    format: Format,
    dim: usize,
    buf: Buffer,
    len: usize,
}

impl Stored {
    /// The workload's table in `format`.
    fn new(data: &Data, format: Format, huge_pages: bool) -> Stored {
        let dim = data.w.dim;
        let bytes = OwnedTable::from_f32(&data.table, dim, format)
            .expect("the workload's table packs")
            .to_le_bytes()
            .expect("the workload's table's bytes");
        let mut buf = table_buffer(bytes.len().div_ceil(4), huge_pages);
        let raw: &mut [u8] = bytemuck::cast_slice_mut(&mut buf[..]);
        raw[..bytes.len()].copy_from_slice(&bytes);
        Stored {
            format,
            dim,
            buf,
            len: bytes.len(),
        }
    }

    /// The table lent to the kernels (little-endian bytes, as this machine
    /// holds them).
    fn table(&self) -> TableRef<'_> {
        let raw: &[u8] = &bytemuck::cast_slice(&self.buf[..])[..self.len];
        let dim = self.dim;
        let table = match self.format {
            Format::F32 => TableRef::f32(bytemuck::cast_slice(raw), dim),
            Format::F16 => TableRef::f16(bytemuck::cast_slice(raw), dim),
            Format::Bf16 => TableRef::bf16(bytemuck::cast_slice(raw), dim),
            packed => {
                PackedTable::new(packed.row_wise().expect("row-wise"), dim, raw).map(TableRef::from)
            }
        };
        table.expect("whole rows")
    }
}

/// The last-level cache's size when `/sys` does not give it.
const UNKNOWN_CACHE_BYTES: usize = 64 << 20;

/// The most bytes of last-level caches counted: a many-core host's dozens
/// of caches would ask for a buffer of gigabytes, read before every cold
/// call, where a pool of a few threads fills a few of them.
const MAX_CACHE_BYTES: usize = 1 << 30;

/// A buffer of twice the last-level cache, read one word a line to push
/// everything else out of the caches.
pub struct Evictor {
    buf: Vec<u64>,
}

impl Evictor {
    /// Sized from the highest-level caches in `/sys` (Linux), else from
    /// [`UNKNOWN_CACHE_BYTES`].
    pub fn new() -> Evictor {
        let bytes = 2 * last_level_cache_bytes().unwrap_or(UNKNOWN_CACHE_BYTES);
        // Ones, not zeros: every page is written, so none maps to the
        // shared zero page.
        Evictor {
            buf: vec![1; bytes / 8],
        }
    }

    /// The bytes read by each [`Evictor::evict`].
    pub fn bytes(&self) -> usize {
        self.buf.len() * 8
    }

    /// Reads one word of every 64-byte line of the buffer, on the pool.
    fn evict(&self, pool: &ThreadPool) {
        let sum: u64 = pool.install(|| {
            self.buf
                .par_chunks(CHUNK / 8)
                .map(|c| c.iter().step_by(8).fold(0u64, |a, &w| a.wrapping_add(w)))
                .reduce(|| 0, u64::wrapping_add)
        });
        black_box(sum);
    }
}

/// The bytes of the highest-level caches of all the CPUs, each distinct
/// cache counted once (two CCDs of an AMD socket, or two sockets, have one
/// each), from `/sys/devices/system/cpu/cpu*/cache/index*/` (`level`,
/// `size` as `"307200K"` or `"32M"`, and `shared_cpu_list`, which names the
/// CPUs that share a cache and so tells one cache from another; where it is
/// missing, the caches of a level count as one), at most
/// [`MAX_CACHE_BYTES`].
fn last_level_cache_bytes() -> Option<usize> {
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok();
    let mut caches = std::collections::BTreeMap::new();
    for cpu in std::fs::read_dir("/sys/devices/system/cpu").ok()?.flatten() {
        let name = cpu.file_name().to_string_lossy().into_owned();
        let numbered = name.strip_prefix("cpu").map(str::parse::<u32>);
        if !matches!(numbered, Some(Ok(_))) {
            continue;
        }
        let Ok(indexes) = std::fs::read_dir(cpu.path().join("cache")) else {
            continue;
        };
        let top = indexes
            .flatten()
            .filter_map(|e| {
                let level: u32 = read(e.path().join("level"))?.trim().parse().ok()?;
                let size = parse_cache_size(read(e.path().join("size"))?.trim())?;
                let shared = read(e.path().join("shared_cpu_list"))
                    .map_or_else(String::new, |s| s.trim().to_string());
                Some((level, size, shared))
            })
            .max();
        if let Some((level, size, shared)) = top {
            caches.insert((level, shared), size);
        }
    }
    let top = caches.keys().map(|(level, _)| *level).max()?;
    let bytes: usize = caches
        .iter()
        .filter(|((level, _), _)| *level == top)
        .map(|(_, size)| size)
        .sum();
    Some(bytes.min(MAX_CACHE_BYTES)).filter(|&b| b > 0)
}

/// `"307200K"` → 314 572 800, `"32M"` → 33 554 432, `"512"` → 512.
fn parse_cache_size(s: &str) -> Option<usize> {
    let (digits, unit) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1 << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    digits.parse::<usize>().ok()?.checked_mul(unit)
}

/// Everything the format rows of one workload share.
struct Setup<'a> {
    data: &'a Data,
    pool: &'a ThreadPool,
    evictor: Option<&'a Evictor>,
    bags: Bags,
    out: Vec<f32>,
    src: Vec<u8>,
    dst: Vec<u8>,
}

impl Setup<'_> {
    /// Evicts the caches (untimed), when the rows evict them.
    fn evict(&self) {
        if let Some(e) = self.evictor {
            e.evict(self.pool);
        }
    }

    /// A memcpy of `bytes` bytes, on one thread or the pool; with `warm`,
    /// timed after [`WARM_CALLS`] untimed copies, else after the caches
    /// are evicted.
    fn memcpy(&mut self, bytes: usize, pooled: bool, warm: bool) -> Duration {
        if !warm {
            self.evict();
        }
        let (src, dst, pool) = (&self.src[..bytes], &mut self.dst[..bytes], self.pool);
        let mut copy = || {
            if pooled {
                pool.install(|| {
                    dst.par_chunks_mut(CHUNK)
                        .zip(src.par_chunks(CHUNK))
                        .for_each(|(d, s)| d.copy_from_slice(s))
                });
            } else {
                dst.copy_from_slice(src);
            }
            black_box(&mut *dst);
        };
        if warm {
            (0..WARM_CALLS).for_each(|_| copy());
        }
        timed(copy)
    }

    /// One call of `op` on `table`, timed; `lookup` and `bag_sum` after the
    /// caches are evicted.
    fn op(&mut self, op: FormatOp, table: TableRef<'_>) -> Duration {
        if op != FormatOp::BagSumWarm {
            self.evict();
        }
        let ids = &self.data.ids[..];
        let (bags, pool) = (&self.bags, self.pool);
        let par = Parallelism::Auto;
        match op {
            FormatOp::Lookup => {
                let out = &mut self.out[..];
                timed(|| pool.install(|| table_gather_with(par, table, ids, out).unwrap()))
            }
            FormatOp::BagSum | FormatOp::BagSumWarm => {
                let out = &mut self.out[..bags.len() * table.dim()];
                let pooling = Pooling {
                    mode: Mode::Sum,
                    ..Pooling::default()
                };
                let mut call = || {
                    pool.install(|| {
                        table_bag_forward_with(par, table, ids, bags, &pooling, out, &mut [])
                            .unwrap()
                    })
                };
                if op == FormatOp::BagSumWarm {
                    (0..WARM_CALLS).for_each(|_| call());
                }
                timed(call)
            }
        }
    }
}

/// Measures the chosen ops on the chosen formats of one workload.
pub fn run(
    data: &Data,
    formats: &[Format],
    ops: &[FormatOp],
    budget: &Budget,
    huge_pages: bool,
    evictor: Option<&Evictor>,
    pool: &ThreadPool,
) -> Vec<FormatRow> {
    let w = data.w;
    if formats.is_empty() || ops.is_empty() {
        return Vec::new();
    }
    let bag_size = super::layer::BAG_SIZE;
    let bags = Bags::fixed(w.num_ids / bag_size, bag_size).expect("bags fit");
    let most = w.num_ids * w.dim * 4 * 2;
    let s = RefCell::new(Setup {
        data,
        pool,
        evictor,
        bags,
        out: vec![0.0; w.num_ids * w.dim],
        src: vec![1u8; most],
        dst: vec![0u8; most],
    });
    let s = &s;
    let stored: Vec<Stored> = formats
        .iter()
        .map(|&format| Stored::new(data, format, huge_pages))
        .collect();
    let tables: Vec<TableRef<'_>> = stored.iter().map(Stored::table).collect();
    // One budget for each format, spent on all of them round-robin.
    let budget = Budget {
        per_row: budget.per_row * formats.len() as u32,
        reps: budget.reps,
    };
    let mut rows: Vec<FormatRow> = Vec::new();
    for &op in ops {
        let out_rows = match op {
            FormatOp::Lookup => w.num_ids,
            FormatOp::BagSum | FormatOp::BagSumWarm => w.num_ids / bag_size,
        };
        let bytes: Vec<usize> = formats
            .iter()
            .map(|f| w.num_ids * f.row_bytes(w.dim).expect("a row fits") + out_rows * w.dim * 4)
            .collect();
        let warm = op == FormatOp::BagSumWarm;
        // Three cases a format: the op, a one-thread memcpy and a pool-wide
        // memcpy of half its bytes.
        let mut cases: Vec<Box<dyn FnMut() -> Duration + '_>> = Vec::new();
        for (&table, &b) in tables.iter().zip(&bytes) {
            let copied = b / 2;
            cases.push(Box::new(move || s.borrow_mut().op(op, table)));
            cases.push(Box::new(move || s.borrow_mut().memcpy(copied, false, warm)));
            cases.push(Box::new(move || s.borrow_mut().memcpy(copied, true, warm)));
        }
        let samples = measure_all(&budget, &mut cases);
        let stats: Vec<Stats> = samples.iter().map(|t| Stats::of(t)).collect();
        let f32_us = formats
            .iter()
            .position(|&f| f == Format::F32)
            .map(|i| stats[3 * i].median_us);
        for (i, (&format, &bytes)) in formats.iter().zip(&bytes).enumerate() {
            let [t, a, b] = [stats[3 * i], stats[3 * i + 1], stats[3 * i + 2]];
            let roof_us = a.median_us.min(b.median_us);
            let roofline_gbps = bytes as f64 / (roof_us * 1e3);
            rows.push(FormatRow {
                workload: w.name,
                op: op.name(),
                format: format.name(),
                stats: t,
                bytes,
                gbps: t.gbps(bytes),
                roofline_gbps,
                pct_of_roofline: 100.0 * t.gbps(bytes) / roofline_gbps,
                time_vs_f32: f32_us
                    .filter(|_| format != Format::F32)
                    .map(|f| t.median_us / f),
            });
        }
    }
    // Format by format, as printed.
    rows.sort_by_key(|r| formats.iter().position(|f| f.name() == r.format));
    rows
}

/// The header of the format table.
pub fn header(out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "{:<8} {:<13} {:<6} {:>11} {:>7} {:>9} {:>7} {:>7} {:>6}",
        "workload",
        "format op",
        "format",
        "median µs",
        "GB/s",
        "roof GB/s",
        "% roof",
        "vs f32",
        "reps"
    )
}

/// The format rows, as text.
pub fn block(out: &mut dyn Write, rows: &[FormatRow]) -> io::Result<()> {
    for r in rows {
        let vs = r
            .time_vs_f32
            .map_or("-".to_string(), |v| format!("{v:.2}x"));
        writeln!(
            out,
            "{:<8} {:<13} {:<6} {:>11.1} {:>7.2} {:>9.2} {:>6.1}% {:>7} {:>6}",
            r.workload,
            r.op,
            r.format,
            r.stats.median_us,
            r.gbps,
            r.roofline_gbps,
            r.pct_of_roofline,
            vs,
            r.stats.reps
        )?;
    }
    Ok(())
}

/// What the format columns mean.
pub const LEGEND: &str = "format rows: the same table stored in each format; lookup = table_gather (rows out as f32),
  bag_sum = table_bag_forward over bags of 16 consecutive ids, bag_sum_warm = after three untimed calls.
  bytes = ids * stored row bytes (f32 4*dim, f16/bf16 2*dim, int8 dim+8, int4 ceil(dim/2)+4) + the f32
  output; roof GB/s = the faster memcpy of bytes/2 (1 thread or the pool), round-robin with the row;
  vs f32 = row median / the f32 row's median (below 1: faster than f32)";

/// How the cold rows were measured, after [`LEGEND`].
/// `evicted` is [`Evictor::bytes`], or `None` under `--keep-caches`; only
/// for a run with cold rows ([`has_cold_rows`]).
pub fn caches_line(evicted: Option<usize>) -> String {
    match evicted {
        Some(bytes) => format!(
            "  lookup, bag_sum and their memcpys: caches evicted before each call (a read of {} MiB,\n  twice the last-level caches; --keep-caches to skip)",
            bytes >> 20
        ),
        None => "  lookup, bag_sum: caches kept between calls (--keep-caches)".to_string(),
    }
}

/// Whether any of `rows` is a cold one (`lookup`, `bag_sum`), whose caches
/// [`caches_line`] describes.
pub fn has_cold_rows(rows: &[FormatRow]) -> bool {
    rows.iter().any(|r| r.op != FormatOp::BagSumWarm.name())
}
