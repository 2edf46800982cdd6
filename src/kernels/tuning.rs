//! Every size the kernels tune by, in one place and in one unit: bytes.
//! (Counts of rows appear only where a distance is naturally a row count,
//! and say so.) Each constant carries the measurement that chose it. Two
//! modules below the kernels keep their own: `parallel.rs` when a small call
//! is shared, `index.rs` when the id check is split.
//!
//! Words used here and across the kernels, one meaning each: a **task** is
//! one piece of a call handed to a thread; a **column block** is a range of
//! columns summed in registers; a **line** is 64 bytes of memory
//! ([`LINE_BYTES`]); a **position** is an id's place in the batch (as in
//! the errors' `position`), while the table of a transformer's position
//! vectors is the **position table**.

pub(crate) use crate::memory::LINE_BYTES;
use crate::parallel::Plan;

/// One cache line, in `f32`s: column blocks that threads own are whole
/// lines, so two threads never write one line.
pub(crate) const LINE_FLOATS: usize = LINE_BYTES / core::mem::size_of::<f32>();

/// Below this many bytes of output a gather, bag forward or grouped backward
/// under [`Parallelism::Auto`](crate::Parallelism::Auto) stays on the
/// calling thread. Waking a sleeping rayon pool from outside it costs 15 to
/// 40 µs on the development machine, and in the `threshold` group of
/// `benches/kernels.rs` the split first wins at 2 MiB (48 vs 54 µs).
pub(crate) const PARALLEL_MIN_BYTES: usize = 2 << 20;

/// The same for `scatter_add`, in bytes of output gradient. Its column
/// blocks make every thread read every id, which only pays once the table
/// rows come from DRAM: in the `threshold` group (a cache-resident table)
/// one thread still wins at 4 MiB, while the report's minilm (12 MiB) and
/// larger workloads gain from the split.
pub(crate) const SCATTER_PARALLEL_MIN_BYTES: usize = 8 << 20;

/// The least of a gather or bag forward task's share of the output: large
/// enough that scheduling is noise, small enough that two threads finish
/// close together on a call of a few hundred KiB.
pub(crate) const TASK_BYTES: usize = 16 << 10;

/// About how many tasks a large gather or bag forward is cut into, with up
/// to 8 threads (8 tasks a thread beyond): tasks of [`TASK_BYTES`] would be
/// thousands (3 277 for gpt2's gather), and each one costs its hand-off and
/// warms its first rows again, while with 8 tasks a thread the threads end
/// within an eighth of a thread's share of each other. The crate's gather
/// into a held buffer, two threads, tasks of 16 KiB against a sixty-fourth
/// of the output (2026-11-26, the Zen 5 host, medians of 0.3 s, rounds 1-4
/// of one process, a test program): minilm 247-260 → 230-236 µs, gpt2
/// 2 294-2 358 → 2 166-2 225, recsys 1 741-1 796 → 1 664-1 722, narrow
/// 831-858 → 818-846; a thirty-second and a hundred-and-twenty-eighth
/// measured within ±3 % of a sixty-fourth.
pub(crate) const TASKS_PER_CALL: usize = 64;

/// Tasks a thread of the current pool gets at least, when there are more
/// than `TASKS_PER_CALL / 8` threads.
const TASKS_PER_THREAD: usize = 8;

/// How many tasks a gather, lookup or bag forward shared between its caller
/// and one pool thread ([`Parallelism::Auto`](crate::Parallelism::Auto)
/// below the pool's threshold, calls in a loop) is cut into ([`task_bytes`]).
/// The two threads claim tasks
/// from the two ends of one list, each claim an atomic exchange on a line
/// the other thread wrote last, so a task's cost is its hand-off as well as
/// its rows: a sixty-fourth of tiny's 1 MiB gather is 16 KiB, about a
/// microsecond of copying. Shared, the caller and one thread end within a
/// task of each other, so a few tasks a thread balance the call. A test
/// program of the shared gather on tiny's shape (the caller and one rayon
/// thread, the crate's claiming, 2026-11-26, the Intel host, medians of
/// 0.4 s, five rounds): 64 tasks 32.5-37.6 µs, 32 tasks 29.5-36.8,
/// 16 tasks 26.3-36.1, 8 tasks 25.5-36.7 (the last round was slow for
/// all). The report's warm loop, the two counts A/B in one build, three
/// runs each: tiny's `gather` 28.4-35.0 µs with 64 tasks,
/// 27.2-33.4 with 16; its `Embedding::forward` 22.6-25.4 against 20.8-22.5
/// (docs/benchmarks.md, "Fewer tasks for shared calls"). A shared bag
/// forward's tasks are cut from its output (a row a bag), so tiny's bags of
/// 16 already made 4 tasks; the rule is the same for it, unmeasured.
pub(crate) const SHARED_TASKS: usize = 16;

/// The bytes of a task of a gather or bag forward that reads or writes
/// `bytes` in all and runs as `plan` says: a [`SHARED_TASKS`]th of them for
/// a call shared between its caller and one pool thread, else a
/// [`TASKS_PER_CALL`]th (or less, with more than 8 threads in the pool);
/// at least [`TASK_BYTES`].
pub(crate) fn task_bytes(plan: Plan, bytes: usize) -> usize {
    let tasks = if plan.is_shared() {
        SHARED_TASKS
    } else {
        TASKS_PER_CALL.max(TASKS_PER_THREAD * crate::executor::threads())
    };
    (bytes / tasks).max(TASK_BYTES)
}

/// The least rows a bag forward's task pools when its bags are long, as
/// bytes of `f32`s: what a [`TASK_BYTES`] share of the output pools at bags
/// of 16 ids (the report's).
const BAG_TASK_MIN_WORK: usize = 16 * TASK_BYTES;

/// How many bags a bag forward's task takes, for `bags` bags of `dim`
/// values pooling `work` bytes of rows (counted as `f32`s) and run as
/// `plan` says: the output's cut ([`task_bytes`] of the output, in whole
/// bags), but no more bags than pool a task's share of the work (at least
/// [`BAG_TASK_MIN_WORK`]). For bags of up to 16 ids the output's cut is the
/// smaller; longer bags get the tasks their rows need. Cut by the output
/// alone, 64 bags of 256 ids of 64 values (16 KiB out, 4 MiB of rows) made
/// one task, so ran on one thread: 57 µs through Python on the Zen 5 host,
/// against 34 µs for PyTorch's bag (docs/benchmarks.md, "Long bags").
pub(crate) fn bags_per_task(plan: Plan, bags: usize, dim: usize, work: usize) -> usize {
    let row_out = dim.saturating_mul(core::mem::size_of::<f32>()).max(1);
    let by_output = task_bytes(plan, bags.saturating_mul(row_out)) / row_out;
    let share = task_bytes(plan, work).max(BAG_TASK_MIN_WORK);
    // bags × share / work, without overflow.
    let wide = |x: usize| u128::try_from(x).unwrap_or(u128::MAX);
    let by_work = wide(bags).saturating_mul(wide(share)) / wide(work.max(1));
    let by_work = usize::try_from(by_work).unwrap_or(usize::MAX);
    by_output.min(by_work).max(1)
}

/// A grouped-backward task's share of the work, in bytes of gradient read
/// or written.
pub(crate) const GROUP_TASK_BYTES: usize = 128 << 10;

/// A dense sweep task's share, in bytes of table written: larger than
/// [`GROUP_TASK_BYTES`], since most of a sweep is zeros and a task's fixed
/// cost (its plan entry, its slice, rayon's hand-off) would otherwise be
/// paid about 4 000 times over recsys's 488 MiB.
pub(crate) const SWEEP_TASK_BYTES: usize = 1 << 20;

/// From this many bytes of gradient table on, the dense backward writes with
/// streaming stores, and below it the gradient is summed in place
/// (`InCache` in `grouped/dense.rs`). Below, the table fits the caches that a streaming
/// store would bypass, and plain stores are faster: on `tiny` (256 KiB)
/// streaming took about twice as long as a memset and a scatter.
pub(crate) const STREAM_MIN_BYTES: usize = 8 << 20;

/// From this many bytes of output on, [`gather`](crate::gather) split
/// across threads writes with streaming stores where they pay
/// ([`gather_streams_pay`]): half the last-level cache
/// of the development machine (32 MiB), beyond which a plain store's line
/// would be evicted before anyone read it anyway.
pub(crate) const GATHER_STREAM_MIN_BYTES: usize = 16 << 20;

/// The narrowest rows [`gather`](crate::gather) streams: 256 values (1
/// KiB). On the Zen 4 host of 2026-11-29 (two threads, 32 MiB outputs,
/// plain against streaming stores in one process), rows of 128 values
/// (recsys's) took 1.19-1.35x the time with streaming stores from a table
/// in huge pages and 1.29-1.79x from 4 KiB pages, rows of 256 values
/// 0.89-1.01x, 384 values 0.81-0.90x, and gpt2's 768 values 0.70-0.83x
/// (docs/benchmarks.md, "Streaming stores for wide rows only"). Rows of 16
/// values (narrow's) lost too.
pub(crate) const GATHER_STREAM_MIN_DIM: usize = 256;

/// Whether [`gather`](crate::gather)'s streaming stores pay on this CPU:
/// only on AMD's family 25 (Zen 3 and Zen 4, as `/proc/cpuinfo` names it),
/// where they made gpt2's gather 1.19-1.39x faster on the Zen 4 host that
/// chose the threshold (2026-11-24) and 1.20-1.43x on the one of
/// 2026-11-29. Elsewhere plain stores: on AMD's family
/// 26 (Zen 5) plain stores took gpt2's gather (48 MiB out) to 0.62-0.91x the
/// time in eleven processes, and recsys's (32 MiB) to 0.56-1.16x; on an
/// Intel family 6 host (Xeon, model 207, a 300 MiB L3) streaming took
/// recsys's two-thread gather from 1.8-2.1 to 2.2-3.9 ms into a buffer that
/// is 16-byte aligned (a `Vec<f32>` of its size, so each 512-byte row spans
/// nine lines, two of them shared with its neighbours), and streaming only
/// rows' whole lines was no faster than plain stores (docs/benchmarks.md,
/// "Streaming stores on Zen 5" and "An Intel host"). Other CPUs are
/// unmeasured and take plain stores, which are never far behind, as do
/// systems without `/proc/cpuinfo`.
pub(crate) fn gather_streams_pay() -> bool {
    this_cpu() == Some(("AuthenticAMD", 25))
}

/// Whether [`gather`](crate::gather)'s AVX-512 rows are copied with their
/// stores aligned to lines (`Avx512::copy_by_lines`: a masked copy at each
/// end of a row of 512 bytes or more, whole lines between) rather than 64
/// bytes at a time from each row's start: on Intel, where it took the
/// gather into a `Vec` to 0.93-0.94x the time on gpt2, 0.95x on minilm and
/// 0.99x on recsys (docs/benchmarks.md, "Stores within lines, hints on row
/// heads"). On the Zen 5 host the masked copies cost more than the split
/// stores they save, into a line-aligned output or a `Vec`: recsys's gather
/// took 1.39-1.40x the time with them on two threads and 1.89-1.93x on one,
/// with the hints a row as they are now (`prefetch::RowLines`), and 1.00-1.15x
/// with the hints counted row by row (docs/benchmarks.md, "Masked row ends
/// and a hint count a call").
/// Other CPUs are unmeasured and take the plain copy.
pub(crate) fn gather_line_stores_pay() -> bool {
    this_cpu().is_some_and(|(vendor, _)| vendor == "GenuineIntel")
}

/// The vendor and family of this machine's first processor, read from
/// `/proc/cpuinfo` once for every rule that asks; `None` where it cannot be
/// read.
fn this_cpu() -> Option<(&'static str, u32)> {
    static CPU: std::sync::OnceLock<Option<(String, u32)>> = std::sync::OnceLock::new();
    CPU.get_or_init(|| {
        let entry = first_processor()?;
        cpu_family(&entry).map(|(vendor, family)| (vendor.to_owned(), family))
    })
    .as_ref()
    .map(|(vendor, family)| (vendor.as_str(), *family))
}

/// The first processor's entry of `/proc/cpuinfo`, read up to the blank
/// line that ends it (the file has one per logical CPU, which the kernel
/// writes out when it is read).
fn first_processor() -> Option<String> {
    use std::io::BufRead;
    let file = std::fs::File::open("/proc/cpuinfo").ok()?;
    let mut entry = String::new();
    for line in std::io::BufReader::new(file).lines() {
        let line = line.ok()?;
        if line.trim().is_empty() && !entry.is_empty() {
            break;
        }
        entry.push_str(&line);
        entry.push('\n');
    }
    Some(entry)
}

/// The vendor and family of the first processor `cpuinfo` (text in the
/// form of Linux's `/proc/cpuinfo`) describes: the first `vendor_id` and
/// `cpu family` lines.
fn cpu_family(cpuinfo: &str) -> Option<(&str, u32)> {
    let field = |name: &str| {
        cpuinfo.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim())
        })
    };
    Some((field("vendor_id")?, field("cpu family")?.parse().ok()?))
}

/// How far ahead the backward kernels and the packed lookup prefetch random
/// rows, in bytes of rows: enough misses in flight to cover a DRAM round
/// trip, few enough that the line buffers do not overflow. Chosen on
/// recsys's bag sum (512-byte rows, a Zen 3 host): 32 rows ahead took 2.3
/// ms against 3.2 ms at 8 rows (two threads).
const PREFETCH_BYTES: usize = 16 << 10;

/// How far ahead [`gather`](crate::gather) (and the lookups that share its
/// loop) prefetch, in bytes of rows. A gather writes as many bytes as it
/// reads, and its writes need line buffers too: on the Zen 5 host, recsys's
/// gather (512-byte rows) took 0.88-0.95x the time at 8 rows ahead (4 KiB)
/// against 32 (16 KiB), minilm's (1.5 KiB rows) 0.88-0.97x at 3 or 4 rows
/// against 10, and gpt2's was the same at 4 rows as at 5 (test program, two
/// threads, warm; docs/benchmarks.md, "Further ahead for short rows").
const GATHER_AHEAD_BYTES: usize = 4 << 10;

/// The prefetch distance of [`gather`](crate::gather), in rows, for rows of
/// `row_floats` `f32`s: about [`GATHER_AHEAD_BYTES`] ahead, between 4 and
/// 32 rows. Saturates like [`prefetch_ahead`].
#[inline]
pub(crate) fn gather_ahead(row_floats: usize) -> usize {
    rows_in(GATHER_AHEAD_BYTES, f32_row_bytes(row_floats), 4, 32)
}

/// Whether [`gather`](crate::gather) hints rows of `row_floats` `f32`s
/// into L1 rather than L2: where the L1 data cache is roomy
/// ([`roomy_l1`](crate::simd::prefetch::roomy_l1), 48 KiB or more) and the
/// rows hinted ahead ([`gather_ahead`] of them) span at most
/// [`GATHER_L1_AHEAD_BYTES`]. On the Zen 5 host, hints into L1 took minilm's
/// gather (4 rows of 1.5 KiB ahead) and recsys's (8 of 512 bytes) to
/// 0.87-0.89x the time, gpt2's (4 of 3 KiB) to 1.05-1.06x (docs/benchmarks.md,
/// "Wide rows into L1 on a roomy L1"). Rows of one or two vectors take the
/// gather's narrow loop, which hints into L2 whatever this says.
///
/// The rows ahead count by the part of each that is hinted
/// ([`gather_hinted_floats`]): on Intel, whose gathers hint only the first
/// line of a row, every width goes into L1 on a roomy L1.
#[inline]
pub(crate) fn gather_hints_in_l1(row_floats: usize) -> bool {
    hints_in_l1(
        row_floats,
        RowHeads::here().in_gathers(),
        crate::simd::prefetch::roomy_l1(),
    )
}

/// [`gather_hints_in_l1`] where the gather hints row heads (`heads`) or
/// not, on an L1 that is roomy (`roomy`) or not.
fn hints_in_l1(row_floats: usize, heads: bool, roomy: bool) -> bool {
    let hinted = f32_row_bytes(hinted_floats(row_floats, heads));
    let ahead = gather_ahead(row_floats).saturating_mul(hinted);
    ahead <= GATHER_L1_AHEAD_BYTES && roomy
}

/// How much of each row read ahead a gather hints, in `f32`s, for rows of
/// `row_floats`: the whole row, or on Intel its first
/// [`GATHER_HEAD_BYTES`], whose loads the core's own prefetchers then
/// follow along the row. On the Intel host (family 6 model 207, a roomy
/// L1), gpt2's gather (3 KiB rows, two threads, a test program, medians of
/// 40 rounds) took 2 465-2 533 µs with the first 512 bytes of each row
/// hinted into L1 against 2 805-2 877 with the whole row into L2 (what the
/// rule by bytes chose) and 2 868 with the whole row into L1; minilm's (1.5
/// KiB) 670 against 686 (whole rows into L1). Hinting only the first line
/// then took recsys's gather (512-byte rows, warm, four runs) to 0.93-0.98x
/// the time of hinting its eight, and gpt2's and minilm's to 0.96-0.99x:
/// a software prefetch on this core waits for one of L1's fill buffers,
/// which the loads need (docs/benchmarks.md, "Table formats"). Other vendors are unmeasured
/// and hint whole rows; so are Intel cores with an L1 of less than 48 KiB,
/// which hint the heads into L2.
#[inline]
pub(crate) fn gather_hinted_floats(row_floats: usize) -> usize {
    hinted_floats(row_floats, RowHeads::here().in_gathers())
}

/// [`gather_hinted_floats`] where the gather hints row heads (`heads`) or
/// whole rows.
fn hinted_floats(row_floats: usize, heads: bool) -> usize {
    if heads {
        row_floats.min(GATHER_HEAD_BYTES / core::mem::size_of::<f32>())
    } else {
        row_floats
    }
}

/// The part of a row that a gather hints where it hints only the start of
/// each ([`gather_hinted_floats`]): 64 bytes, the line or two they span.
const GATHER_HEAD_BYTES: usize = 64;

/// Which reads hint only the start of each row (a gather) or of each block
/// of a row (a bag: `simd::prefetch::BagHints::Head`) and leave the rest to
/// the core's own prefetchers. Each choice hints heads wherever the one
/// before it does, and in one more kind of read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum RowHeads {
    /// Whole rows and whole blocks everywhere.
    Whole,
    /// The gathers' rows.
    Gather,
    /// Those, and the bags of `f32` rows.
    F32,
    /// Those, and the bags of half rows (`f16`, bf16): every plain row.
    Plain,
    /// Those, and the bags of packed rows.
    Packed,
}

impl RowHeads {
    /// The choice of this machine, asked once: [`RowHeads::choose`] from
    /// `EMBEDDING_KERNELS_ROW_HEADS` and the CPU's vendor.
    pub(crate) fn here() -> RowHeads {
        static HEADS: std::sync::OnceLock<RowHeads> = std::sync::OnceLock::new();
        *HEADS.get_or_init(|| {
            let set = std::env::var("EMBEDDING_KERNELS_ROW_HEADS").ok();
            RowHeads::choose(set.as_deref(), this_cpu().map(|(vendor, _)| vendor))
        })
    }

    /// The choice where `EMBEDDING_KERNELS_ROW_HEADS` is `set` and the CPU
    /// is `vendor`'s: the setting where it is one of [`RowHeads::parse`]'s
    /// names, so that one build can measure the choices against each other
    /// (docs/benchmarks.md, "How to measure"); otherwise
    /// [`RowHeads::F32`] on an Intel CPU (`GenuineIntel` in
    /// `/proc/cpuinfo`), where a software prefetch waits for one of L1's
    /// fill buffers, which the loads need, and [`RowHeads::Whole`]
    /// elsewhere. A value that names no choice is ignored.
    ///
    /// On the Intel host (family 6 model 207), bags of half rows hinted one
    /// line a block took 1.0-1.3x the time of whole blocks from memory and
    /// 0.9-1.1x warm, where `f32` rows took 0.70-0.90x (docs/benchmarks.md,
    /// "Half rows keep whole blocks"); packed rows were up to 1.7x slower.
    pub(crate) fn choose(set: Option<&str>, vendor: Option<&str>) -> RowHeads {
        match set.and_then(RowHeads::parse) {
            Some(heads) => heads,
            None if vendor == Some("GenuineIntel") => RowHeads::F32,
            None => RowHeads::Whole,
        }
    }

    /// The choice a name gives: `none` ([`RowHeads::Whole`]), `gather`,
    /// `f32`, `plain` or `packed`, in lower case.
    pub(crate) fn parse(name: &str) -> Option<RowHeads> {
        Some(match name {
            "none" => RowHeads::Whole,
            "gather" => RowHeads::Gather,
            "f32" => RowHeads::F32,
            "plain" => RowHeads::Plain,
            "packed" => RowHeads::Packed,
            _ => return None,
        })
    }

    /// Whether the gathers hint only each row's start.
    pub(crate) fn in_gathers(self) -> bool {
        self >= RowHeads::Gather
    }

    /// Whether a bag hints only each block's start, for rows of the kind
    /// `RowFormat::PACKED` and `RowFormat::HALF` name: packed, half, or
    /// else `f32`.
    pub(crate) fn in_bags(self, packed: bool, half: bool) -> bool {
        if packed {
            self >= RowHeads::Packed
        } else if half {
            self >= RowHeads::Plain
        } else {
            self >= RowHeads::F32
        }
    }
}

/// The most bytes of rows a gather hints ahead into L1: a sixth of a
/// 48 KiB L1 (see [`gather_hints_in_l1`]).
const GATHER_L1_AHEAD_BYTES: usize = 8 << 10;

/// The widest row a bag hints whole, into L2, in its pass over the row's
/// first column block, and not at all in the passes over its other blocks
/// (`Rows::blocks`), where each pass hints its own block otherwise: fewer
/// instructions a block. With eight lanes, warm, on a Zen 4 host: minilm's
/// 8-bit rows (392 bytes) 0.95x the time, the 4-bit rows of minilm and gpt2
/// (196, 388 bytes) 0.96x and 0.97x. Wider rows keep a block's hints a pass:
/// hinted whole, gpt2's `f16` and bf16 rows (1 536 bytes) took 1.20-1.22x the
/// time, minilm's (768) 1.05x, gpt2's 8-bit rows (776) 0.98x
/// (docs/benchmarks.md, "Whole rows hinted once").
pub(crate) const WHOLE_ROW_HINT_MAX_BYTES: usize = 512;

/// Tables smaller than this are read without prefetch hints (by the
/// lookups): they sit in a core's L2 (512 KiB on Zen 3, 1 MiB on Zen 4) or
/// at worst L3, and the hints (one per line of every row) only add
/// instructions. On tiny (a 256 KiB table, 256-byte rows) a one-thread
/// gather took 12.4 µs without them against 16.6 µs with, in a warm loop,
/// and no longer in the report's round-robin (25.9-27.4 against 29.1-29.2
/// µs); on narrow's 6.4 MB table the hints make the gather 2-3x faster.
pub(crate) const PREFETCH_MIN_TABLE_BYTES: usize = 512 << 10;

/// How many positions ahead a bag prefetches its rows at least (a count of
/// rows, for rows of any width), into L2, or into L1 where the whole row is
/// one line or the L1 data cache is roomy, one line a block on Intel
/// (`simd::prefetch::BagHints`).
/// Measured on gpt2 (768 columns) with a test program (medians of paired
/// warm and cold rounds, two threads): 16 ahead took 0.76-0.85x the time of
/// the rule by bytes above (5 rows of `f32`, 10 of `f16`), and 24 or 32
/// ahead were no faster than 16. Into L1 instead (on Zen 4), 16 ahead was
/// 1.3-1.5x slower than the rule by bytes; on narrow's 64-byte rows it was
/// 0.86-0.92x the time into L2 (docs/benchmarks.md, "Prefetch").
const BAG_AHEAD_ROWS: usize = 16;

/// How many positions ahead a bag of short plain rows prefetches at most,
/// and the bytes of rows that many positions may span: 32 rows of at most
/// 512 bytes. On the Zen 5 host, recsys's rows (128 columns) took 0.69-0.88x
/// the time at 32 ahead in `f16` and `bf16` (one process of ten 1.05x),
/// 0.89-0.97x in `f32`; gpt2, minilm and narrow were no faster, and packed
/// rows (int8, int4) 0-5 % slower (docs/benchmarks.md, "Further ahead for short rows").
const BAG_AHEAD_MAX_ROWS: usize = 32;

/// The bytes of plain rows a bag looks ahead, at most: 32 rows of 512 bytes
/// (see [`BAG_AHEAD_MAX_ROWS`]).
const BAG_AHEAD_BYTES: usize = 16 << 10;

/// The bytes of packed rows a bag looks ahead, at most, when the rows are
/// decoded sixteen lanes at a time from a table past
/// [`BAG_FAR_TABLE_BYTES`]: 60 of recsys's 8-bit rows (136 bytes), 64 of
/// its 4-bit ones (68 bytes, [`BAG_AHEAD_PACKED_MAX_ROWS`]). On the Zen 5
/// host, with the caches evicted before each call (test program, two
/// threads, tables in huge pages), recsys's 8-bit bag sum took 0.42-0.44 ms
/// at 64 rows ahead against 0.45-0.81 at 16, its 4-bit one 0.39-0.41
/// against 0.43-0.77; warm, 0.97x and 1.03x the time. With eight lanes the
/// 8-bit sum was slower at 60 ahead (1.09-1.17x the time, cold) where the
/// 4-bit one was faster (0.86x), so eight lanes keep 16 (docs/benchmarks.md,
/// "A bag's rows looked up once, and further ahead for packed rows from
/// memory").
const BAG_AHEAD_PACKED_BYTES: usize = 8 << 10;

/// The most positions a bag of packed rows looks ahead
/// ([`BAG_AHEAD_PACKED_BYTES`]).
const BAG_AHEAD_PACKED_MAX_ROWS: usize = 64;

/// Tables from which a bag of packed rows, decoded sixteen lanes at a time,
/// looks [`BAG_AHEAD_PACKED_BYTES`] ahead: past the 32 MiB of L3 a Zen core
/// shares, so their rows mostly come from memory. Smaller tables keep 16
/// rows: minilm's 4-bit bag sum (6 MB) took 1.04x the time at 41 rows,
/// narrow's 8-bit one (2.4 MB) 1.09x at 64, in a warm loop.
const BAG_FAR_TABLE_BYTES: usize = 32 << 20;

/// How many positions ahead a bag prefetches rows of `row_bytes` bytes from
/// a table of `table_bytes`, decoded `lanes` at a time: for plain rows
/// (`f32` and halves) as many rows as fit in [`BAG_AHEAD_BYTES`], between
/// [`BAG_AHEAD_ROWS`] and [`BAG_AHEAD_MAX_ROWS`]; for packed rows (codes
/// decoded with a scale and a bias) [`BAG_AHEAD_ROWS`], but
/// [`BAG_AHEAD_PACKED_BYTES`] of them, up to [`BAG_AHEAD_PACKED_MAX_ROWS`],
/// where sixteen lanes decode them quickly from a table too large for the
/// caches. A short row is pooled quickly, so the same time ahead is more
/// rows of it.
#[inline]
pub(crate) fn bag_ahead(row_bytes: usize, packed: bool, table_bytes: usize, lanes: usize) -> usize {
    if !packed {
        rows_in(
            BAG_AHEAD_BYTES,
            row_bytes,
            BAG_AHEAD_ROWS,
            BAG_AHEAD_MAX_ROWS,
        )
    } else if lanes >= 16 && table_bytes > BAG_FAR_TABLE_BYTES {
        rows_in(
            BAG_AHEAD_PACKED_BYTES,
            row_bytes,
            BAG_AHEAD_ROWS,
            BAG_AHEAD_PACKED_MAX_ROWS,
        )
    } else {
        BAG_AHEAD_ROWS
    }
}

/// The prefetch distance, in rows, for rows of `row_floats` `f32`s: between
/// 4 and 32 rows, about [`PREFETCH_BYTES`] ahead. Saturates, so even an
/// absurd width (a call with nothing to do) gives a distance.
#[inline]
pub(crate) fn prefetch_ahead(row_floats: usize) -> usize {
    rows_in(PREFETCH_BYTES, f32_row_bytes(row_floats), 4, 32)
}

/// The bytes of a row of `row_floats` `f32`s, saturating.
#[inline]
fn f32_row_bytes(row_floats: usize) -> usize {
    row_floats.saturating_mul(core::mem::size_of::<f32>())
}

/// How many rows of `row_bytes` fit in `bytes`, kept between `min` and
/// `max` (a row of 0 bytes counts as one byte).
#[inline]
fn rows_in(bytes: usize, row_bytes: usize, min: usize, max: usize) -> usize {
    (bytes / row_bytes.max(1)).clamp(min, max)
}

/// Bits of the row sorted per pass of the grouping's radix sort (a count,
/// not bytes): 2^11 buckets of counts stay in L1, and a million rows take
/// two passes.
pub(crate) const RADIX_BITS: u32 = 11;

/// The most spare index vectors one thread keeps between calls
/// (`kernels/spare.rs`; a count).
pub(crate) const SPARE_VECTORS: usize = 8;

/// The most bytes of spare index vectors one thread keeps between calls.
pub(crate) const SPARE_BYTES: usize = 32 << 20;

#[cfg(test)]
mod tests {
    use super::{
        BAG_AHEAD_PACKED_BYTES, BAG_AHEAD_PACKED_MAX_ROWS, BAG_AHEAD_ROWS, BAG_FAR_TABLE_BYTES,
        RowHeads, bag_ahead, cpu_family, gather_hinted_floats, gather_hints_in_l1, hinted_floats,
        hints_in_l1,
    };
    use crate::simd::prefetch::roomy_l1;

    /// A bag forward's tasks follow the output for bags of up to 16 ids
    /// and the rows pooled for longer ones: a call of a few long bags is
    /// cut into several tasks, and no task is cut below a bag.
    #[test]
    fn long_bags_make_tasks_by_their_rows() {
        use super::{BAG_TASK_MIN_WORK, PARALLEL_MIN_BYTES, bags_per_task, task_bytes};
        use crate::parallel::Parallelism;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        pool.install(|| {
            for dim in [16, 64, 384] {
                for (bags, len) in [
                    (256, 1),
                    (256, 16),
                    (4096, 16),
                    (64, 256),
                    (8, 512),
                    (1, 100_000),
                ] {
                    let work = bags * len * dim * 4;
                    let plan = Parallelism::Rayon.plan(work, PARALLEL_MIN_BYTES);
                    let per_task = bags_per_task(plan, bags, dim, work);
                    let by_output = task_bytes(plan, bags * dim * 4) / (dim * 4);
                    let what = format!("{bags} bags of {len}, dim {dim}");
                    assert!(per_task >= 1, "{what}");
                    if len <= 16 {
                        assert!(per_task >= by_output.min(bags) - 1, "{what}: {per_task}");
                    }
                    assert!(per_task <= by_output.max(1), "{what}: {per_task}");
                    if len >= 256 && bags > 1 && work >= 2 * BAG_TASK_MIN_WORK {
                        // Several tasks, for the two threads to share.
                        assert!(bags.div_ceil(per_task) >= 2, "{what}: {per_task}");
                    }
                }
            }
        });
    }

    /// Packed rows look further ahead than [`BAG_AHEAD_ROWS`] only when
    /// sixteen lanes decode them from a table past [`BAG_FAR_TABLE_BYTES`],
    /// and then no further than their bytes and the cap allow; plain rows
    /// depend on neither the lanes nor the table's size.
    #[test]
    fn packed_rows_look_further_ahead_only_from_large_tables_on_sixteen_lanes() {
        let far_table = BAG_FAR_TABLE_BYTES + 1;
        for row_bytes in [12, 24, 68, 136, 196, 392, 776, 4096] {
            let plain = bag_ahead(row_bytes, false, far_table, 16);
            assert_eq!(
                plain,
                bag_ahead(row_bytes, false, 1 << 20, 8),
                "{row_bytes}"
            );
            assert_eq!(bag_ahead(row_bytes, true, far_table, 8), BAG_AHEAD_ROWS);
            let cached = bag_ahead(row_bytes, true, BAG_FAR_TABLE_BYTES, 16);
            assert_eq!(cached, BAG_AHEAD_ROWS, "{row_bytes}");
            let far = bag_ahead(row_bytes, true, far_table, 16);
            assert!((BAG_AHEAD_ROWS..=BAG_AHEAD_PACKED_MAX_ROWS).contains(&far));
            let fits = far * row_bytes <= BAG_AHEAD_PACKED_BYTES;
            assert!(far == BAG_AHEAD_ROWS || fits, "{row_bytes}: {far} rows");
        }
        // recsys's 8-bit rows (136 bytes) and 4-bit ones (68) go further;
        // gpt2's 8-bit rows (776 bytes) do not.
        assert!(bag_ahead(136, true, far_table, 16) > BAG_AHEAD_ROWS);
        assert_eq!(
            bag_ahead(68, true, far_table, 16),
            BAG_AHEAD_PACKED_MAX_ROWS
        );
        assert_eq!(bag_ahead(776, true, far_table, 16), BAG_AHEAD_ROWS);
    }

    /// The vendor and family come from the first processor's lines, as
    /// Linux writes them (a tab before the colon); text without them, or
    /// with a family that is not a number, names none.
    #[test]
    fn cpu_families_read_as_linux_writes_them() {
        let zen5 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n\n\
                    processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\n";
        assert_eq!(cpu_family(zen5), Some(("AuthenticAMD", 26)));
        let intel = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n";
        assert_eq!(cpu_family(intel), Some(("GenuineIntel", 6)));
        let mixed = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n\n\
                     processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\n";
        assert_eq!(cpu_family(mixed), Some(("GenuineIntel", 6)));
        assert_eq!(cpu_family(""), None);
        assert_eq!(cpu_family("vendor_id\t: AuthenticAMD\n"), None);
        assert_eq!(
            cpu_family("vendor_id : AuthenticAMD\ncpu family : x\n"),
            None
        );
    }

    /// On x86-64 Linux the first processor's entry reads as a vendor and a
    /// family.
    #[test]
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    fn this_machine_names_its_first_processor() {
        let entry = super::first_processor().expect("/proc/cpuinfo");
        let (vendor, _family) = cpu_family(&entry).expect("a vendor and a family");
        assert!(!vendor.is_empty());
    }

    /// Each name reads as its choice and nothing else does; each choice
    /// hints heads where the one before it does, in gathers first, then bags
    /// of `f32`, half and packed rows; a name set wins over the vendor, and
    /// without one Intel hints the heads of `f32` rows and others none.
    #[test]
    fn row_heads_read_by_name_and_widen_in_order() {
        let names = ["none", "gather", "f32", "plain", "packed"];
        let all: Vec<RowHeads> = names.iter().map(|n| RowHeads::parse(n).unwrap()).collect();
        for bad in ["", "None", "f16", "plain ", "all"] {
            assert_eq!(RowHeads::parse(bad), None, "{bad:?}");
        }
        let kinds = |h: RowHeads| {
            [
                h.in_gathers(),
                h.in_bags(false, false),
                h.in_bags(false, true),
                h.in_bags(true, false),
            ]
        };
        for (k, &heads) in all.iter().enumerate() {
            let on = kinds(heads);
            let expected: Vec<bool> = (0..4).map(|kind| kind < k).collect();
            assert_eq!(on.to_vec(), expected, "{}", names[k]);
        }
        let intel = Some("GenuineIntel");
        assert_eq!(RowHeads::choose(None, intel), RowHeads::F32);
        assert_eq!(RowHeads::choose(Some("bogus"), intel), RowHeads::F32);
        assert_eq!(RowHeads::choose(Some("none"), intel), RowHeads::Whole);
        for vendor in [Some("AuthenticAMD"), None] {
            assert_eq!(RowHeads::choose(None, vendor), RowHeads::Whole);
            assert_eq!(RowHeads::choose(Some("PLAIN"), vendor), RowHeads::Whole);
            assert_eq!(RowHeads::choose(Some("f32"), vendor), RowHeads::F32);
        }
    }

    /// The gathers of the report's widths hint into L1 on a roomy L1 but
    /// where the hinted rows ahead span more than 8 KiB (gpt2's 4 rows of 3
    /// KiB, hinted whole), and never elsewhere; where only each row's first
    /// line is hinted, 4 to 32 rows ahead span at most 2 KiB.
    #[test]
    fn gathers_hint_into_l1_on_a_roomy_l1_within_8_kib_ahead() {
        for heads in [false, true] {
            assert!(hints_in_l1(128, heads, true), "recsys: 8 rows of 512 B");
            assert!(hints_in_l1(384, heads, true), "minilm: 4 rows of 1.5 KiB");
            assert!(hints_in_l1(512, heads, true), "4 rows of 2 KiB");
            assert_eq!(hints_in_l1(513, heads, true), heads, "just over 2 KiB");
            assert_eq!(
                hints_in_l1(768, heads, true),
                heads,
                "gpt2: 4 rows of 3 KiB"
            );
            assert_eq!(hints_in_l1(usize::MAX, heads, true), heads, "saturates");
            for floats in [1, 128, 384, 768, usize::MAX] {
                assert!(!hints_in_l1(floats, heads, false), "{floats}: a small L1");
            }
        }
        assert_eq!(
            gather_hints_in_l1(768),
            hints_in_l1(768, RowHeads::here().in_gathers(), roomy_l1())
        );
    }

    /// A gather hints rows of up to a line whole, and longer ones whole or
    /// their first line.
    #[test]
    fn gathers_hint_whole_rows_or_their_first_line() {
        for floats in [0, 1, 15, 16] {
            assert_eq!(hinted_floats(floats, false), floats);
            assert_eq!(hinted_floats(floats, true), floats);
        }
        for floats in [17, 128, 384, 768, usize::MAX] {
            assert_eq!(hinted_floats(floats, false), floats);
            assert_eq!(hinted_floats(floats, true), 16, "{floats}");
        }
        assert_eq!(
            gather_hinted_floats(768),
            hinted_floats(768, RowHeads::here().in_gathers())
        );
    }
}
