//! Every size the kernels tune by, in one place and in one unit: bytes.
//! (Counts of rows appear only where a distance is naturally a row count,
//! and say so.) Each constant says why it was chosen, with a pointer to
//! docs/design.md where the reason is a measurement. Two modules below the
//! kernels keep their own: `parallel.rs` when a small call is shared,
//! `index/` when the id check is split.
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
/// calling thread. Waking a sleeping rayon pool from outside it costs more
/// than a smaller call gains from the split; in the `threshold` group of
/// `benches/kernels.rs` the split first wins at 2 MiB (docs/design.md,
/// "Threads").
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
/// within an eighth of a thread's share of each other. A sixty-fourth of
/// the output was faster than tasks of 16 KiB on the report's gathers, and
/// a thirty-second or a hundred-and-twenty-eighth no better than it
/// (docs/design.md, "Threads").
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
/// its rows: a sixty-fourth of tiny's 1 MiB gather is 16 KiB, so little
/// copying that the hand-off counts. Shared, the caller and one thread end
/// within a task of each other, so a few tasks a thread balance the call:
/// sixteen were faster than 64 on tiny's shared gather and
/// `Embedding::forward`, and eight no faster than sixteen (docs/design.md,
/// "Threads"). A shared bag forward's tasks are cut from its output (a row
/// a bag); the rule is the same for it, unmeasured.
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
/// one task, so ran on one thread, behind PyTorch's bag.
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
/// streaming took longer than a memset and a scatter (docs/design.md, "The
/// grouped backward").
pub(crate) const STREAM_MIN_BYTES: usize = 8 << 20;

/// How far ahead the backward kernels and the packed lookup prefetch random
/// rows, in bytes of rows: enough misses in flight to cover a DRAM round
/// trip, few enough that the line buffers do not overflow: 32 of recsys's
/// 512-byte rows ahead beat 8 on its bag sum (docs/design.md, "The grouped
/// backward").
const PREFETCH_BYTES: usize = 16 << 10;

/// How far ahead [`gather`](crate::gather) (and the lookups that share its
/// loop) prefetch, in bytes of rows. A gather writes as many bytes as it
/// reads, and its writes need line buffers too: 4 KiB ahead beat 16 KiB on
/// recsys's and minilm's gathers and matched it on gpt2's (docs/design.md,
/// "Gather and prefetch").
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
/// [`GATHER_L1_AHEAD_BYTES`]: on a 48 KiB L1 hints into L1 paid for rows of
/// up to 2 KiB and lost for wider ones (docs/design.md, "Gather and
/// prefetch"). Rows of one or two vectors take the gather's narrow loop,
/// which hints into L2 whatever this says.
#[inline]
pub(crate) fn gather_hints_in_l1(row_floats: usize) -> bool {
    hints_in_l1(row_floats, crate::simd::prefetch::roomy_l1())
}

/// [`gather_hints_in_l1`] on an L1 that is roomy (`roomy`) or not.
fn hints_in_l1(row_floats: usize, roomy: bool) -> bool {
    let ahead = gather_ahead(row_floats).saturating_mul(f32_row_bytes(row_floats));
    ahead <= GATHER_L1_AHEAD_BYTES && roomy
}

/// The most bytes of rows a gather hints ahead into L1: a sixth of a
/// 48 KiB L1 (see [`gather_hints_in_l1`]).
const GATHER_L1_AHEAD_BYTES: usize = 8 << 10;

/// The widest row a bag hints whole, into L2, in its pass over the row's
/// first column block, and not at all in the passes over its other blocks
/// (`Rows::blocks`), where each pass hints its own block otherwise: fewer
/// instructions a block. Rows of 196-392 bytes took less time so; wider
/// ones keep a block's hints a pass, as hinted whole gpt2's 1 536-byte half
/// rows took longer (docs/design.md, "Gather and prefetch").
pub(crate) const WHOLE_ROW_HINT_MAX_BYTES: usize = 512;

/// Tables smaller than this are read without prefetch hints (by the
/// lookups): they sit in a core's L2 (512 KiB or more on current cores) or
/// at worst L3, and the hints (one per line of every row) only add
/// instructions: tiny's 256 KiB gather is faster without them, where
/// narrow's 6.4 MB table, which fits L3 but not L2, still needs them
/// (docs/design.md, "Gather and prefetch").
pub(crate) const PREFETCH_MIN_TABLE_BYTES: usize = 512 << 10;

/// How many positions ahead a bag prefetches its rows at least (a count of
/// rows, for rows of any width), into L2, or into L1 where the whole row is
/// one line or the L1 data cache is roomy (`simd::prefetch::BagHints`).
/// On gpt2 (768 columns), 16 ahead into L2 took less time than the rule by
/// bytes above (5 rows of `f32`, 10 of `f16`), and 24 or 32 ahead were no
/// faster than 16. Into L1 instead, on a 32 KiB L1, 16 ahead was slower
/// than the rule by bytes; on narrow's 64-byte rows, a line each, whose
/// misses fit L1's miss buffers, L1 beat L2 (docs/design.md, "Bags").
const BAG_AHEAD_ROWS: usize = 16;

/// How many positions ahead a bag of short plain rows prefetches at most,
/// and the bytes of rows that many positions may span: 32 rows of at most
/// 512 bytes: a short row is pooled quickly, so the same time ahead is
/// more rows of it. recsys's half and `f32` rows (128 columns) took less
/// time at 32 ahead; the other workloads were no faster, and packed rows,
/// whose decoding sets their pace, a little slower (docs/design.md,
/// "Bags").
const BAG_AHEAD_MAX_ROWS: usize = 32;

/// The bytes of plain rows a bag looks ahead, at most: 32 rows of 512 bytes
/// (see [`BAG_AHEAD_MAX_ROWS`]).
const BAG_AHEAD_BYTES: usize = 16 << 10;

/// The bytes of packed rows a bag looks ahead, at most, when the rows are
/// decoded sixteen lanes at a time from a table past
/// [`BAG_FAR_TABLE_BYTES`]: 60 of recsys's 8-bit rows (136 bytes), 64 of
/// its 4-bit ones (68 bytes, [`BAG_AHEAD_PACKED_MAX_ROWS`]). From memory,
/// recsys's 8- and 4-bit bag sums were faster at 64 rows ahead than at 16,
/// and the same warm; with eight lanes the 8-bit sum was slower at 60
/// ahead, so eight lanes keep 16 (docs/design.md, "Bags").
const BAG_AHEAD_PACKED_BYTES: usize = 8 << 10;

/// The most positions a bag of packed rows looks ahead
/// ([`BAG_AHEAD_PACKED_BYTES`]).
const BAG_AHEAD_PACKED_MAX_ROWS: usize = 64;

/// Tables from which a bag of packed rows, decoded sixteen lanes at a time,
/// looks [`BAG_AHEAD_PACKED_BYTES`] ahead: past the 32 MiB of L3 that a
/// core of a current server CPU shares, so their rows mostly come from
/// memory. Smaller tables keep 16 rows: their rows come from the caches,
/// and looking further ahead made minilm's 4-bit and narrow's 8-bit bag
/// sums slower in a warm loop (docs/design.md, "Bags").
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
        bag_ahead, gather_hints_in_l1, hints_in_l1,
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

    /// The gathers of the report's widths hint into L1 on a roomy L1 but
    /// where the rows ahead span more than 8 KiB (gpt2's 4 rows of 3 KiB),
    /// and never elsewhere.
    #[test]
    fn gathers_hint_into_l1_on_a_roomy_l1_within_8_kib_ahead() {
        assert!(hints_in_l1(128, true), "recsys: 8 rows of 512 B");
        assert!(hints_in_l1(384, true), "minilm: 4 rows of 1.5 KiB");
        assert!(hints_in_l1(512, true), "4 rows of 2 KiB");
        assert!(!hints_in_l1(513, true), "just over 2 KiB");
        assert!(!hints_in_l1(768, true), "gpt2: 4 rows of 3 KiB");
        assert!(!hints_in_l1(usize::MAX, true), "saturates");
        for floats in [1, 128, 384, 768, usize::MAX] {
            assert!(!hints_in_l1(floats, false), "{floats}: a small L1");
        }
        assert_eq!(gather_hints_in_l1(768), hints_in_l1(768, roomy_l1()));
    }
}
